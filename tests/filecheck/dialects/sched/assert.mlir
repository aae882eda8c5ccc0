// mdsl.sched.assert: an @assert's runtime check (spec 7.7.1) of a buffer; the check (quoted, as a
// launch's kernel), the buffer, then attributes: the message, the tensor's name, a bound for the
// range checks, the annotation's condition and where it stands. It round-trips.
// RUN: mdsl-opt %s | filecheck %s
// RUN: mdsl-opt %s | mdsl-opt | filecheck %s

mdsl.sched.program @p arenas(params = 0, activations = 64, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  %h = mdsl.sched.buffer activations offset 0 bytes 16 : !mdsl.sched.buffer<[2, 4], bf16>
  mdsl.sched.assert "no_nan"(%h) {message = "NaN in h", tensor = "h", condition = "!has_nan(h)", at = "m.module:3:4"} : !mdsl.sched.buffer<[2, 4], bf16>
  mdsl.sched.assert "finite"(%h) {message = "", tensor = "h"} : !mdsl.sched.buffer<[2, 4], bf16>
  mdsl.sched.assert "le"(%h) {message = "range", tensor = "h", bound = 1.0 : f64} : !mdsl.sched.buffer<[2, 4], bf16>
}

// CHECK:      mdsl.sched.assert "no_nan"(%h) {message = "NaN in h", tensor = "h", condition = "!has_nan(h)", at = "m.module:3:4"} : !mdsl.sched.buffer<[2, 4], bf16>
// CHECK-NEXT: mdsl.sched.assert "finite"(%h) {message = "", tensor = "h"} : !mdsl.sched.buffer<[2, 4], bf16>
// CHECK-NEXT: mdsl.sched.assert "le"(%h) {message = "range", tensor = "h", bound = 1.000000e+00 : f64} : !mdsl.sched.buffer<[2, 4], bf16>
