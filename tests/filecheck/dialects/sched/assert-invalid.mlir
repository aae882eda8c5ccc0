// Verifier rules of mdsl.sched.assert: each chunk breaks one rule.
// RUN: mdsl-opt %s --split-input-file --print-diagnostics --parsing-diagnostics | filecheck %s

mdsl.sched.program @p arenas(params = 0, activations = 64, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  %h = mdsl.sched.buffer activations offset 0 bytes 16 : !mdsl.sched.buffer<[2, 4], bf16>
  mdsl.sched.assert "no_zero"(%h) {message = "", tensor = "h"} : !mdsl.sched.buffer<[2, 4], bf16>
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.sched.assert' op check must be one of no_nan, no_inf, finite, ge, gt, le, lt, got 'no_zero'

// -----

mdsl.sched.program @p arenas(params = 0, activations = 64, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  %h = mdsl.sched.buffer activations offset 0 bytes 16 : !mdsl.sched.buffer<[2, 4], bf16>
  mdsl.sched.assert "ge"(%h) {message = "", tensor = "h"} : !mdsl.sched.buffer<[2, 4], bf16>
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.sched.assert' op check 'ge' needs a bound

// -----

mdsl.sched.program @p arenas(params = 0, activations = 64, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  %h = mdsl.sched.buffer activations offset 0 bytes 16 : !mdsl.sched.buffer<[2, 4], bf16>
  mdsl.sched.assert "no_nan"(%h) {message = "", tensor = "h", bound = 1.0 : f64} : !mdsl.sched.buffer<[2, 4], bf16>
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.sched.assert' op check 'no_nan' takes no bound

// -----

mdsl.sched.program @p arenas(params = 0, activations = 64, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  %i = mdsl.sched.buffer activations offset 0 bytes 32 : !mdsl.sched.buffer<[2, 4], int32>
  mdsl.sched.assert "no_nan"(%i) {message = "", tensor = "i"} : !mdsl.sched.buffer<[2, 4], int32>
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.sched.assert' op an assertion checks a float buffer, not int32

// -----

mdsl.sched.program @p arenas(params = 0, activations = 64, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  %h = mdsl.sched.buffer activations offset 0 bytes 16 : !mdsl.sched.buffer<[2, 4], bf16>
  mdsl.sched.assert "no_nan"(%h) {message = "", tensor = ""} : !mdsl.sched.buffer<[2, 4], bf16>
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.sched.assert' op the checked tensor must be named
