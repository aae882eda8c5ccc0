// A kernel choice (@kernel, spec 7.5.3, recorded by mdsl-lower-to-sched): `implementation` names
// one of the registry's kernels of the op's primitive, `fallback = false` makes it binding,
// `workspace_bytes` sizes its workspace. They round-trip on launch, gemm, attention and
// attention_backward; what the verifier refuses is kernel-choice-invalid.mlir.
// RUN: %roundtrip %s | filecheck %s
// RUN: mdsl-opt %s --print-op-generic | mdsl-opt | filecheck %s

!x = !mdsl.sched.buffer<[2, 16, 64], bf16>
!w = !mdsl.sched.buffer<[128, 64], bf16>
!y = !mdsl.sched.buffer<[2, 16, 128], bf16>
!q = !mdsl.sched.buffer<[2, 4, 16, 16], bf16>
!kv = !mdsl.sched.buffer<[2, 2, 16, 16], bf16>
!lse = !mdsl.sched.buffer<[2, 4, 16], fp32>

// CHECK: mdsl.sched.program @p
mdsl.sched.program @p arenas(params = 16384, activations = 65536, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  %x = mdsl.sched.buffer activations offset 0 bytes 4096 : !x
  %w = mdsl.sched.buffer params offset 0 bytes 16384 : !w
  %y = mdsl.sched.buffer activations offset 4096 bytes 8192 : !y
  %q = mdsl.sched.buffer activations offset 12288 bytes 4096 : !q
  %k = mdsl.sched.buffer activations offset 16384 bytes 2048 : !kv
  %v = mdsl.sched.buffer activations offset 18432 bytes 2048 : !kv
  %o = mdsl.sched.buffer activations offset 20480 bytes 4096 : !q
  %lse = mdsl.sched.buffer activations offset 24576 bytes 512 : !lse
  %dq = mdsl.sched.buffer activations offset 25088 bytes 4096 : !q
  %dk = mdsl.sched.buffer activations offset 29184 bytes 2048 : !kv
  %dv = mdsl.sched.buffer activations offset 31232 bytes 2048 : !kv
  // CHECK: mdsl.sched.gemm %x, %w -> %y {transb = true, implementation = "cublaslt"} :
  mdsl.sched.gemm %x, %w -> %y {transb = true, implementation = "cublaslt"} : !x, !w -> !y
  // CHECK-NEXT: mdsl.sched.attention %q, %k, %v -> %o, %lse {implementation = "cudnn_sdpa", fallback = false, workspace_bytes = 1048576 : i64} :
  mdsl.sched.attention %q, %k, %v -> %o, %lse {implementation = "cudnn_sdpa", fallback = false, workspace_bytes = 1048576 : i64} : !q, !kv, !kv -> !q, !lse
  // CHECK-NEXT: mdsl.sched.attention_backward %q, %k, %v, %o, %o, %lse -> %dq, %dk, %dv {implementation = "flash_attention"} :
  mdsl.sched.attention_backward %q, %k, %v, %o, %o, %lse -> %dq, %dk, %dv {implementation = "flash_attention"} : !q, !kv, !kv, !q, !q, !lse -> !q, !kv, !kv
  // CHECK-NEXT: mdsl.sched.launch "flash_attention_backward"(%o, %q, %k, %v, %o, %lse) -> (%dq, %dk, %dv) {implementation = "cudnn_sdpa", fallback = false} :
  mdsl.sched.launch "flash_attention_backward"(%o, %q, %k, %v, %o, %lse) -> (%dq, %dk, %dv) {implementation = "cudnn_sdpa", fallback = false} : (!q, !q, !kv, !kv, !q, !lse) -> (!q, !kv, !kv)
  // CHECK-NEXT: mdsl.sched.launch "silu"(%y) -> (%y) {inplace, implementation = "silu", fallback = true} :
  mdsl.sched.launch "silu"(%y) -> (%y) {inplace, implementation = "silu", fallback = true} : (!y) -> (!y)
}
