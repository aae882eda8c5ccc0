// Kernel choices (@kernel, spec 7.5.3; kernel-choice.mlir round-trips the valid ones) that the
// verifier refuses, one a chunk: a name that is no kernel of the primitive, a choice without an
// implementation, a non-boolean fallback, and a choice on an op that runs no primitive.
// RUN: mdsl-opt %s --split-input-file --print-diagnostics --parsing-diagnostics | filecheck %s --check-prefix=ERR

!q = !mdsl.sched.buffer<[2, 4, 16, 16], bf16>
!kv = !mdsl.sched.buffer<[2, 2, 16, 16], bf16>
!lse = !mdsl.sched.buffer<[2, 4, 16], fp32>
mdsl.sched.program @p arenas(params = 0, activations = 65536, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  %q = mdsl.sched.buffer activations offset 0 bytes 4096 : !q
  %k = mdsl.sched.buffer activations offset 4096 bytes 2048 : !kv
  %v = mdsl.sched.buffer activations offset 6144 bytes 2048 : !kv
  %o = mdsl.sched.buffer activations offset 8192 bytes 4096 : !q
  %lse = mdsl.sched.buffer activations offset 12288 bytes 512 : !lse
  mdsl.sched.attention %q, %k, %v -> %o, %lse {implementation = "cudnn_fmha_v2"} : !q, !kv, !kv -> !q, !lse
}
// ERR: error[{{E[0-9]+}}]: 'mdsl.sched.attention' op implementation 'cudnn_fmha_v2' is no kernel of flash_attention (its kernels: cudnn_sdpa, flash_attention)

// -----

mdsl.sched.program @p arenas(params = 0, activations = 1024, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  %y = mdsl.sched.buffer activations offset 0 bytes 512 : !mdsl.sched.buffer<[256], bf16>
  mdsl.sched.launch "silu"(%y) -> (%y) {inplace, implementation = "cublaslt"} : (!mdsl.sched.buffer<[256], bf16>) -> (!mdsl.sched.buffer<[256], bf16>)
}
// ERR: error[{{E[0-9]+}}]: 'mdsl.sched.launch' op implementation 'cublaslt' is no kernel of silu (its kernels: silu)

// -----

mdsl.sched.program @p arenas(params = 0, activations = 1024, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  %y = mdsl.sched.buffer activations offset 0 bytes 512 : !mdsl.sched.buffer<[256], bf16>
  mdsl.sched.launch "silu"(%y) -> (%y) {inplace, fallback = false} : (!mdsl.sched.buffer<[256], bf16>) -> (!mdsl.sched.buffer<[256], bf16>)
}
// ERR: error[{{E[0-9]+}}]: 'mdsl.sched.launch' op a kernel choice (fallback) needs an 'implementation' string

// -----

mdsl.sched.program @p arenas(params = 0, activations = 1024, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  %y = mdsl.sched.buffer activations offset 0 bytes 512 : !mdsl.sched.buffer<[256], bf16>
  mdsl.sched.launch "silu"(%y) -> (%y) {inplace, implementation = "silu", fallback = 0 : i64} : (!mdsl.sched.buffer<[256], bf16>) -> (!mdsl.sched.buffer<[256], bf16>)
}
// ERR: error[{{E[0-9]+}}]: 'mdsl.sched.launch' op fallback must be a boolean (true or false)

// -----

mdsl.sched.program @p arenas(params = 0, activations = 1024, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  %a = mdsl.sched.buffer activations offset 0 bytes 512 : !mdsl.sched.buffer<[256], bf16>
  %b = mdsl.sched.buffer activations offset 512 bytes 512 : !mdsl.sched.buffer<[256], bf16>
  mdsl.sched.copy %a -> %b {implementation = "copy"} : !mdsl.sched.buffer<[256], bf16> -> !mdsl.sched.buffer<[256], bf16>
}
// ERR: error[{{E[0-9]+}}]: 'mdsl.sched.copy' op mdsl.sched.copy runs no primitive and takes no kernel choice (implementation)
