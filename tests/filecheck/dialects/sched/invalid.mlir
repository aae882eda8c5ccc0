// Verifier rules of mdsl.sched: each chunk breaks one rule.
// RUN: mdsl-opt %s --split-input-file --verify-diagnostics --parsing-diagnostics | filecheck %s

mdsl.sched.program @p arenas(params = 0, activations = 1024, workspace = 0, grads = 0, external = 0) {
  %b = mdsl.sched.buffer activations offset 512 bytes 1024 : !mdsl.sched.buffer<[512], bf16>
}
// CHECK: invalid.mlir:4:1: error: 'mdsl.sched.program' op buffer at offset 512 with 1024 bytes overflows arena activations (1024 bytes)

// -----

mdsl.sched.program @p arenas(params = 0, activations = 1024, workspace = 0, grads = 0, external = 0) {
  %b = mdsl.sched.buffer activations offset 0 bytes 100 : !mdsl.sched.buffer<[64], fp32>
}
// CHECK: error: 'mdsl.sched.buffer' op 100 bytes cannot hold [64] x fp32 (256 bytes)

// -----

mdsl.sched.program @p arenas(params = 0, activations = 1024, workspace = 0, grads = 0, external = 0) {
  %b = mdsl.sched.buffer activations offset 0 bytes 512 : !mdsl.sched.buffer<[256], bf16>
  %v = mdsl.sched.buffer activations offset 384 bytes 256 alias_of %b : !mdsl.sched.buffer<[128], bf16> from !mdsl.sched.buffer<[256], bf16>
}
// CHECK: error: 'mdsl.sched.buffer' op alias [384, 640) exceeds the 512 bytes of the aliased buffer

// -----

mdsl.sched.program @p arenas(params = 1024, activations = 1024, workspace = 0, grads = 0, external = 0) {
  %b = mdsl.sched.buffer activations offset 0 bytes 512 : !mdsl.sched.buffer<[256], bf16>
  %v = mdsl.sched.buffer params offset 0 bytes 512 alias_of %b : !mdsl.sched.buffer<[256], bf16>
}
// CHECK: error: 'mdsl.sched.buffer' op alias in arena params of a buffer in arena activations

// -----

mdsl.sched.program @p arenas(params = 0, activations = 1024, workspace = 0, grads = 0, external = 0) {
  %b = mdsl.sched.buffer activations offset 0 bytes 512 : !mdsl.sched.buffer<[256], bf16>
  mdsl.sched.launch "scale"(%b) -> (%b) : (!mdsl.sched.buffer<[256], bf16>) -> (!mdsl.sched.buffer<[256], bf16>)
}
// CHECK: error: 'mdsl.sched.launch' op an output is also an input; mark the launch 'inplace' if the kernel allows it

// -----

!a = !mdsl.sched.buffer<[4, 8], fp32>
!b = !mdsl.sched.buffer<[16, 3], fp32>
!c = !mdsl.sched.buffer<[4, 3], fp32>
mdsl.sched.program @p arenas(params = 0, activations = 1024, workspace = 0, grads = 0, external = 0) {
  %a = mdsl.sched.buffer activations offset 0 bytes 128 : !a
  %b = mdsl.sched.buffer activations offset 128 bytes 192 : !b
  %c = mdsl.sched.buffer activations offset 320 bytes 48 : !c
  mdsl.sched.gemm %a, %b -> %c : !a, !b -> !c
}
// CHECK: error: 'mdsl.sched.gemm' op inner dimensions differ: op(A) is [4, 8], op(B) is [16, 3]

// -----

!a = !mdsl.sched.buffer<[4, 8], fp32>
!b = !mdsl.sched.buffer<[8, 3], fp32>
!c = !mdsl.sched.buffer<[4, 3], fp32>
mdsl.sched.program @p arenas(params = 0, activations = 1024, workspace = 0, grads = 0, external = 0) {
  %a = mdsl.sched.buffer activations offset 0 bytes 128 : !a
  %b = mdsl.sched.buffer activations offset 128 bytes 96 : !b
  %c = mdsl.sched.buffer activations offset 256 bytes 48 : !c
  mdsl.sched.gemm %a, %b -> %c {epilogue = "bias"} : !a, !b -> !c
}
// CHECK: error: 'mdsl.sched.gemm' op epilogue 'bias' needs a bias operand

// -----

!q = !mdsl.sched.buffer<[1, 6, 8, 16], bf16>
!kv = !mdsl.sched.buffer<[1, 4, 8, 16], bf16>
!l = !mdsl.sched.buffer<[1, 6, 8], fp32>
mdsl.sched.program @p arenas(params = 0, activations = 8192, workspace = 0, grads = 0, external = 0) {
  %q = mdsl.sched.buffer activations offset 0 bytes 1536 : !q
  %k = mdsl.sched.buffer activations offset 1536 bytes 1024 : !kv
  %v = mdsl.sched.buffer activations offset 2560 bytes 1024 : !kv
  %o = mdsl.sched.buffer activations offset 3584 bytes 1536 : !q
  %l = mdsl.sched.buffer activations offset 5120 bytes 192 : !l
  mdsl.sched.attention %q, %k, %v -> %o, %l : !q, !kv, !kv -> !q, !l
}
// CHECK: error: 'mdsl.sched.attention' op query heads (6) must be a multiple of kv heads (4)

// -----

mdsl.sched.program @p arenas(params = 0, activations = 1024, workspace = 0, grads = 0, external = 0) {
  %b = mdsl.sched.buffer activations offset 0 bytes 512 : !mdsl.sched.buffer<[256], bf16>
  mdsl.sched.collective "all_reduce" %b -> %b group "dp" : !mdsl.sched.buffer<[256], bf16> -> !mdsl.sched.buffer<[256], bf16>
}
// CHECK: error: 'mdsl.sched.collective' op all_reduce needs a reduction 'op' (sum, max, min, avg)

// -----

mdsl.sched.program @p arenas(params = 0, activations = 1024, workspace = 0, grads = 0, external = 0) {
  %b = mdsl.sched.buffer activations offset 0 bytes 512 : !mdsl.sched.buffer<[256], bf16>
  mdsl.sched.collective "send" %b -> %b group "pp" : !mdsl.sched.buffer<[256], bf16> -> !mdsl.sched.buffer<[256], bf16>
}
// CHECK: error: 'mdsl.sched.collective' op send and recv (and only they) need a 'peer' rank

// -----

mdsl.sched.program @p arenas(params = 0, activations = 1024, workspace = 0, grads = 0, external = 0) {
  %b = mdsl.sched.buffer activations offset 0 bytes 512 : !mdsl.sched.buffer<[256], bf16>
  mdsl.sched.collective "gather_all" %b -> %b group "pp" : !mdsl.sched.buffer<[256], bf16> -> !mdsl.sched.buffer<[256], bf16>
}
// CHECK: error: 'mdsl.sched.collective' op collective must be one of all_reduce, all_gather, reduce_scatter, all_to_all, send, recv, broadcast, got 'gather_all'

// -----

mdsl.sched.program @p arenas(params = 0, activations = 1024, workspace = 0, grads = 0, external = 0) {
  mdsl.sched.stream @compute priority 0
  mdsl.sched.sync @compute waits @comm
}
// CHECK: error: 'mdsl.sched.sync' op stream @comm is not declared in the program

// -----

mdsl.sched.program @p arenas(params = 0, activations = 1024, workspace = 0, grads = 0, external = 0) {
  %b = mdsl.sched.buffer activations offset 0 bytes 512 : !mdsl.sched.buffer<[256], bf16>
  mdsl.sched.memset %b {stream = @side} : !mdsl.sched.buffer<[256], bf16>
}
// CHECK: error: 'mdsl.sched.memset' op stream @side is not declared in the program

// -----

mdsl.sched.program @p arenas(params = 4096, activations = 0, workspace = 0, grads = 0, external = 0) {
  %s = mdsl.sched.buffer params offset 0 bytes 1536 : !mdsl.sched.buffer<[3, 256], bf16>
  mdsl.sched.layer_loop %l = 0 to 3 {
    %w = mdsl.sched.layer_view %s[%l] : !mdsl.sched.buffer<[3, 256], bf16> -> !mdsl.sched.buffer<[3], bf16>
  }
}
// CHECK: error: 'mdsl.sched.layer_view' op a layer view of [3, 256] bf16 is [256] bf16, got [3] bf16

// -----

mdsl.sched.program @p arenas(params = 0, activations = 1024, workspace = 0, grads = 0, external = 0) {
  %a = mdsl.sched.buffer activations offset 0 bytes 512 : !mdsl.sched.buffer<[256], bf16>
  %b = mdsl.sched.buffer activations offset 512 bytes 256 : !mdsl.sched.buffer<[128], bf16>
  mdsl.sched.copy %a -> %b : !mdsl.sched.buffer<[256], bf16> -> !mdsl.sched.buffer<[128], bf16>
}
// CHECK: error: 'mdsl.sched.copy' op copy between buffers of 512 and 256 bytes

// -----

mdsl.sched.program @p arenas(params = 0, activations = 1024, workspace = 0, grads = 0, external = 0) {
  %b = mdsl.sched.buffer scratch offset 0 bytes 512 : !mdsl.sched.buffer<[256], bf16>
}
// CHECK: invalid.mlir:{{[0-9]+}}:26: error: expected an arena (params, activations, workspace, grads, external)
