// Verifier rules of mdsl.sched: each chunk breaks one rule.
// RUN: mdsl-opt %s --split-input-file --print-diagnostics --parsing-diagnostics | filecheck %s

mdsl.sched.program @p arenas(params = 0, activations = 1024, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  %b = mdsl.sched.buffer activations offset 512 bytes 1024 : !mdsl.sched.buffer<[512], bf16>
}
// CHECK: invalid.mlir:4:1: error[{{E[0-9]+}}]: 'mdsl.sched.program' op buffer at offset 512 with 1024 bytes overflows arena activations (1024 bytes)

// -----

mdsl.sched.program @p arenas(params = 0, activations = 1024, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  %b = mdsl.sched.buffer activations offset 0 bytes 100 : !mdsl.sched.buffer<[64], fp32>
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.sched.buffer' op 100 bytes cannot hold [64] x fp32 (256 bytes)

// -----

mdsl.sched.program @p arenas(params = 0, activations = 1024, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  %b = mdsl.sched.buffer activations offset 0 bytes 512 : !mdsl.sched.buffer<[256], bf16>
  %v = mdsl.sched.buffer activations offset 384 bytes 256 alias_of %b : !mdsl.sched.buffer<[128], bf16> from !mdsl.sched.buffer<[256], bf16>
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.sched.buffer' op alias [384, 640) exceeds the 512 bytes of the aliased buffer

// -----

mdsl.sched.program @p arenas(params = 1024, activations = 1024, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  %b = mdsl.sched.buffer activations offset 0 bytes 512 : !mdsl.sched.buffer<[256], bf16>
  %v = mdsl.sched.buffer params offset 0 bytes 512 alias_of %b : !mdsl.sched.buffer<[256], bf16>
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.sched.buffer' op alias in arena params of a buffer in arena activations

// -----

mdsl.sched.program @p arenas(params = 0, activations = 1024, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  %b = mdsl.sched.buffer activations offset 0 bytes 512 : !mdsl.sched.buffer<[256], bf16>
  mdsl.sched.launch "scale"(%b) -> (%b) : (!mdsl.sched.buffer<[256], bf16>) -> (!mdsl.sched.buffer<[256], bf16>)
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.sched.launch' op an output is also an input; mark the launch 'inplace' if the kernel allows it

// -----

!a = !mdsl.sched.buffer<[4, 8], fp32>
!b = !mdsl.sched.buffer<[16, 3], fp32>
!c = !mdsl.sched.buffer<[4, 3], fp32>
mdsl.sched.program @p arenas(params = 0, activations = 1024, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  %a = mdsl.sched.buffer activations offset 0 bytes 128 : !a
  %b = mdsl.sched.buffer activations offset 128 bytes 192 : !b
  %c = mdsl.sched.buffer activations offset 320 bytes 48 : !c
  mdsl.sched.gemm %a, %b -> %c : !a, !b -> !c
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.sched.gemm' op inner dimensions differ: op(A) is [4, 8], op(B) is [16, 3]

// -----

!a = !mdsl.sched.buffer<[4, 8], fp32>
!b = !mdsl.sched.buffer<[8, 3], fp32>
!c = !mdsl.sched.buffer<[4, 3], fp32>
mdsl.sched.program @p arenas(params = 0, activations = 1024, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  %a = mdsl.sched.buffer activations offset 0 bytes 128 : !a
  %b = mdsl.sched.buffer activations offset 128 bytes 96 : !b
  %c = mdsl.sched.buffer activations offset 256 bytes 48 : !c
  mdsl.sched.gemm %a, %b -> %c {epilogue = "bias"} : !a, !b -> !c
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.sched.gemm' op epilogue 'bias' needs a bias operand

// -----

!q = !mdsl.sched.buffer<[1, 6, 8, 16], bf16>
!kv = !mdsl.sched.buffer<[1, 4, 8, 16], bf16>
!l = !mdsl.sched.buffer<[1, 6, 8], fp32>
mdsl.sched.program @p arenas(params = 0, activations = 8192, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  %q = mdsl.sched.buffer activations offset 0 bytes 1536 : !q
  %k = mdsl.sched.buffer activations offset 1536 bytes 1024 : !kv
  %v = mdsl.sched.buffer activations offset 2560 bytes 1024 : !kv
  %o = mdsl.sched.buffer activations offset 3584 bytes 1536 : !q
  %l = mdsl.sched.buffer activations offset 5120 bytes 192 : !l
  mdsl.sched.attention %q, %k, %v -> %o, %l : !q, !kv, !kv -> !q, !l
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.sched.attention' op query heads (6) must be a multiple of kv heads (4)

// -----

mdsl.sched.program @p arenas(params = 0, activations = 1024, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  %b = mdsl.sched.buffer activations offset 0 bytes 512 : !mdsl.sched.buffer<[256], bf16>
  mdsl.sched.collective "all_reduce" %b -> %b group "dp" : !mdsl.sched.buffer<[256], bf16> -> !mdsl.sched.buffer<[256], bf16>
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.sched.collective' op all_reduce needs a reduction 'op' (sum, max, min, avg)

// -----

mdsl.sched.program @p arenas(params = 0, activations = 1024, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  %b = mdsl.sched.buffer activations offset 0 bytes 512 : !mdsl.sched.buffer<[256], bf16>
  mdsl.sched.collective "send" %b -> %b group "pp" : !mdsl.sched.buffer<[256], bf16> -> !mdsl.sched.buffer<[256], bf16>
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.sched.collective' op send needs a 'peer' rank

// -----

mdsl.sched.program @p arenas(params = 0, activations = 1024, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  %b = mdsl.sched.buffer activations offset 0 bytes 512 : !mdsl.sched.buffer<[256], bf16>
  mdsl.sched.collective "gather_all" %b -> %b group "pp" : !mdsl.sched.buffer<[256], bf16> -> !mdsl.sched.buffer<[256], bf16>
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.sched.collective' op collective must be one of all_reduce, all_gather, reduce_scatter, all_to_all, send, recv, broadcast, got 'gather_all'

// -----

mdsl.sched.program @p arenas(params = 0, activations = 1024, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  mdsl.sched.stream @compute priority 0
  mdsl.sched.sync @compute waits @comm
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.sched.sync' op stream @comm is not declared in the program

// -----

mdsl.sched.program @p arenas(params = 0, activations = 1024, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  %b = mdsl.sched.buffer activations offset 0 bytes 512 : !mdsl.sched.buffer<[256], bf16>
  mdsl.sched.memset %b {stream = @side} : !mdsl.sched.buffer<[256], bf16>
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.sched.memset' op stream @side is not declared in the program

// -----

mdsl.sched.program @p arenas(params = 4096, activations = 0, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  %s = mdsl.sched.buffer params offset 0 bytes 1536 : !mdsl.sched.buffer<[3, 256], bf16>
  mdsl.sched.layer_loop %l = 0 to 3 {
    %w = mdsl.sched.layer_view %s[%l] : !mdsl.sched.buffer<[3, 256], bf16> -> !mdsl.sched.buffer<[3], bf16>
  }
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.sched.layer_view' op a layer view of [3, 256] bf16 is [256] bf16, got [3] bf16

// -----

mdsl.sched.program @p arenas(params = 4096, activations = 0, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  %s = mdsl.sched.buffer params offset 0 bytes 1536 : !mdsl.sched.buffer<[3, 8, 32], bf16>
  mdsl.sched.layer_loop %l = 0 to 3 {
    %w = mdsl.sched.layer_view %s[%l] {rows = array<i64: 6, 4>} : !mdsl.sched.buffer<[3, 8, 32], bf16> -> !mdsl.sched.buffer<[4, 32], bf16>
  }
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.sched.layer_view' op rows [6, 4] must be (start, count) within the [8] rows of a layer

// -----

mdsl.sched.program @p arenas(params = 4096, activations = 0, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  %s = mdsl.sched.buffer params offset 0 bytes 1536 : !mdsl.sched.buffer<[3, 8, 32], bf16>
  mdsl.sched.layer_loop %l = 0 to 3 {
    %w = mdsl.sched.layer_view %s[%l] {rows = array<i64: 2, 4>} : !mdsl.sched.buffer<[3, 8, 32], bf16> -> !mdsl.sched.buffer<[8, 32], bf16>
  }
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.sched.layer_view' op a layer view of [3, 8, 32] bf16 is [4, 32] bf16, got [8, 32] bf16

// -----

mdsl.sched.program @p arenas(params = 0, activations = 1024, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  %a = mdsl.sched.buffer activations offset 0 bytes 512 : !mdsl.sched.buffer<[256], bf16>
  %b = mdsl.sched.buffer activations offset 512 bytes 256 : !mdsl.sched.buffer<[128], bf16>
  mdsl.sched.copy %a -> %b : !mdsl.sched.buffer<[256], bf16> -> !mdsl.sched.buffer<[128], bf16>
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.sched.copy' op copy between buffers of 512 and 256 bytes

// -----

mdsl.sched.program @p arenas(params = -1, activations = 0, workspace = 0, grads = 0, optimizer = 0, external = 0) {
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.sched.program' op arena params has negative size -1

// -----

mdsl.sched.program @p arenas(params = 0, activations = 65536, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  %b = mdsl.sched.buffer activations offset -256 bytes 512 : !mdsl.sched.buffer<[256], bf16>
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.sched.buffer' op offset must be non-negative, got -256

// -----

mdsl.sched.program @p arenas(params = 0, activations = 65536, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  %b = mdsl.sched.buffer activations offset 0 bytes 8192 : !mdsl.sched.buffer<[256], bf16>
  %v = mdsl.sched.buffer activations bytes 512 alias_of %b : !mdsl.sched.buffer<[256], bf16>
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.sched.buffer' op an alias needs its byte offset into the aliased buffer

// -----

%b = mdsl.sched.buffer activations offset 0 bytes 512 : !mdsl.sched.buffer<[256], bf16>
// CHECK: error[{{E[0-9]+}}]: 'mdsl.sched.buffer' op 'mdsl.sched.buffer' expects parent op 'mdsl.sched.program'

// -----

mdsl.sched.program @p arenas(params = 0, activations = 65536, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  %b = mdsl.sched.buffer activations offset 0 bytes 8192 : !mdsl.sched.buffer<[256], bf16>
  mdsl.sched.launch "reduce"(%b) -> () : (!mdsl.sched.buffer<[256], bf16>) -> ()
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.sched.launch' op a launch writes at least one output

// -----

mdsl.sched.program @p arenas(params = 0, activations = 65536, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  %b = mdsl.sched.buffer activations offset 0 bytes 8192 : !mdsl.sched.buffer<[256], bf16>
  %c = mdsl.sched.buffer activations offset 8192 bytes 8192 : !mdsl.sched.buffer<[256], bf16>
  mdsl.sched.launch ""(%b) -> (%c) : (!mdsl.sched.buffer<[256], bf16>) -> (!mdsl.sched.buffer<[256], bf16>)
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.sched.launch' op kernel name must not be empty

// -----

mdsl.sched.program @p arenas(params = 0, activations = 65536, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  %b = mdsl.sched.buffer activations offset 0 bytes 8192 : !mdsl.sched.buffer<[256], bf16>
  %c = mdsl.sched.buffer activations offset 8192 bytes 8192 : !mdsl.sched.buffer<[256], bf16>
  mdsl.sched.launch "k"(%b) -> (%c) {grid = array<i64: 1, 0>} : (!mdsl.sched.buffer<[256], bf16>) -> (!mdsl.sched.buffer<[256], bf16>)
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.sched.launch' op grid must have 1 to 3 positive dimensions, got [1, 0]

// -----

!a = !mdsl.sched.buffer<[4, 8], fp32>
!b = !mdsl.sched.buffer<[8, 3], fp32>
!c = !mdsl.sched.buffer<[4, 3], fp32>
mdsl.sched.program @p arenas(params = 0, activations = 65536, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  %a = mdsl.sched.buffer activations offset 0 bytes 8192 : !mdsl.sched.buffer<[4, 8], fp32>
  %b = mdsl.sched.buffer activations offset 8192 bytes 8192 : !mdsl.sched.buffer<[8, 3], fp32>
  %c = mdsl.sched.buffer activations offset 16384 bytes 8192 : !mdsl.sched.buffer<[4, 3], fp32>
  mdsl.sched.gemm %a, %b -> %c {transa = true} : !a, !b -> !c
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.sched.gemm' op inner dimensions differ: op(A) is [8, 4], op(B) is [8, 3]

// -----

!a = !mdsl.sched.buffer<[4, 8], fp32>
!b = !mdsl.sched.buffer<[8, 3], fp32>
!c = !mdsl.sched.buffer<[4, 3], fp32>
mdsl.sched.program @p arenas(params = 0, activations = 65536, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  %a = mdsl.sched.buffer activations offset 0 bytes 8192 : !mdsl.sched.buffer<[4, 8], fp32>
  %b = mdsl.sched.buffer activations offset 8192 bytes 8192 : !mdsl.sched.buffer<[8, 3], fp32>
  %c = mdsl.sched.buffer activations offset 16384 bytes 8192 : !mdsl.sched.buffer<[4, 3], fp32>
  %d = mdsl.sched.buffer activations offset 24576 bytes 8192 : !mdsl.sched.buffer<[4, 4], fp32>
  mdsl.sched.gemm %a, %b -> %d : !a, !b -> !mdsl.sched.buffer<[4, 4], fp32>
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.sched.gemm' op C must be [4, 3] in its last two dims, got [4, 4]

// -----

!a = !mdsl.sched.buffer<[4, 8], fp32>
!b = !mdsl.sched.buffer<[8, 3], fp32>
!c = !mdsl.sched.buffer<[4, 3], fp32>
mdsl.sched.program @p arenas(params = 0, activations = 65536, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  %a = mdsl.sched.buffer activations offset 0 bytes 8192 : !mdsl.sched.buffer<[4, 8], fp32>
  %b = mdsl.sched.buffer activations offset 8192 bytes 8192 : !mdsl.sched.buffer<[8, 3], fp32>
  %c = mdsl.sched.buffer activations offset 16384 bytes 8192 : !mdsl.sched.buffer<[4, 3], fp32>
  %v = mdsl.sched.buffer activations offset 24576 bytes 8192 : !mdsl.sched.buffer<[8], fp32>
  mdsl.sched.gemm %v, %b -> %c : !mdsl.sched.buffer<[8], fp32>, !b -> !c
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.sched.gemm' op A must have at least 2 dims, got [8]

// -----

!a = !mdsl.sched.buffer<[4, 8], fp32>
!b = !mdsl.sched.buffer<[8, 3], fp32>
!c = !mdsl.sched.buffer<[4, 3], fp32>
mdsl.sched.program @p arenas(params = 0, activations = 65536, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  %a = mdsl.sched.buffer activations offset 0 bytes 8192 : !mdsl.sched.buffer<[2, 4, 8], fp32>
  %b = mdsl.sched.buffer activations offset 8192 bytes 8192 : !mdsl.sched.buffer<[8, 3], fp32>
  %c = mdsl.sched.buffer activations offset 16384 bytes 8192 : !mdsl.sched.buffer<[3, 4, 3], fp32>
  mdsl.sched.gemm %a, %b -> %c : !mdsl.sched.buffer<[2, 4, 8], fp32>, !b -> !mdsl.sched.buffer<[3, 4, 3], fp32>
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.sched.gemm' op batch dims differ: A [2], B [], C [3]

// -----

!a = !mdsl.sched.buffer<[4, 8], fp32>
!b = !mdsl.sched.buffer<[8, 3], fp32>
!c = !mdsl.sched.buffer<[4, 3], fp32>
mdsl.sched.program @p arenas(params = 0, activations = 65536, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  %a = mdsl.sched.buffer activations offset 0 bytes 8192 : !mdsl.sched.buffer<[4, 8], fp32>
  %b = mdsl.sched.buffer activations offset 8192 bytes 8192 : !mdsl.sched.buffer<[8, 3], fp32>
  %c = mdsl.sched.buffer activations offset 16384 bytes 8192 : !mdsl.sched.buffer<[4, 3], fp32>
  mdsl.sched.gemm %a, %b -> %c {epilogue = "swish"} : !a, !b -> !c
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.sched.gemm' op epilogue must be one of none, bias, relu, relu_bias, gelu, gelu_bias, gelu_aux, gelu_aux_bias, dgelu, dgelu_bgrad, bgrada, bgradb, got 'swish'

// -----

!a = !mdsl.sched.buffer<[4, 8], fp32>
!b = !mdsl.sched.buffer<[8, 3], fp32>
!c = !mdsl.sched.buffer<[4, 3], fp32>
mdsl.sched.program @p arenas(params = 0, activations = 65536, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  %a = mdsl.sched.buffer activations offset 0 bytes 8192 : !mdsl.sched.buffer<[4, 8], fp32>
  %b = mdsl.sched.buffer activations offset 8192 bytes 8192 : !mdsl.sched.buffer<[8, 3], fp32>
  %c = mdsl.sched.buffer activations offset 16384 bytes 8192 : !mdsl.sched.buffer<[4, 3], fp32>
  %z = mdsl.sched.buffer activations offset 24576 bytes 8192 : !mdsl.sched.buffer<[3], fp32>
  mdsl.sched.gemm %a, %b bias %z -> %c : !a, !b bias !mdsl.sched.buffer<[3], fp32> -> !c
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.sched.gemm' op epilogue 'none' takes no bias operand

// -----

!a = !mdsl.sched.buffer<[4, 8], fp32>
!b = !mdsl.sched.buffer<[8, 3], fp32>
!c = !mdsl.sched.buffer<[4, 3], fp32>
mdsl.sched.program @p arenas(params = 0, activations = 65536, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  %a = mdsl.sched.buffer activations offset 0 bytes 8192 : !mdsl.sched.buffer<[4, 8], fp32>
  %b = mdsl.sched.buffer activations offset 8192 bytes 8192 : !mdsl.sched.buffer<[8, 3], fp32>
  %c = mdsl.sched.buffer activations offset 16384 bytes 8192 : !mdsl.sched.buffer<[4, 3], fp32>
  %z = mdsl.sched.buffer activations offset 24576 bytes 8192 : !mdsl.sched.buffer<[4], fp32>
  mdsl.sched.gemm %a, %b bias %z -> %c {epilogue = "gelu_bias"} : !a, !b bias !mdsl.sched.buffer<[4], fp32> -> !c
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.sched.gemm' op bias of epilogue 'gelu_bias' has 4 elements, expected 3

// -----

!a = !mdsl.sched.buffer<[4, 8], fp32>
!b = !mdsl.sched.buffer<[8, 3], fp32>
!c = !mdsl.sched.buffer<[4, 3], fp32>
mdsl.sched.program @p arenas(params = 0, activations = 65536, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  %a = mdsl.sched.buffer activations offset 0 bytes 8192 : !mdsl.sched.buffer<[4, 8], fp32>
  %b = mdsl.sched.buffer activations offset 8192 bytes 8192 : !mdsl.sched.buffer<[8, 3], fp32>
  %c = mdsl.sched.buffer activations offset 16384 bytes 8192 : !mdsl.sched.buffer<[4, 3], fp32>
  %z = mdsl.sched.buffer activations offset 24576 bytes 8192 : !mdsl.sched.buffer<[3], fp32>
  mdsl.sched.gemm %a, %b bias %z -> %c {epilogue = "bgrada"} : !a, !b bias !mdsl.sched.buffer<[3], fp32> -> !c
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.sched.gemm' op bias of epilogue 'bgrada' has 3 elements, expected 4

// -----

!a = !mdsl.sched.buffer<[4, 8], fp32>
!b = !mdsl.sched.buffer<[8, 3], fp32>
!c = !mdsl.sched.buffer<[4, 3], fp32>
mdsl.sched.program @p arenas(params = 0, activations = 65536, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  %a = mdsl.sched.buffer activations offset 0 bytes 8192 : !mdsl.sched.buffer<[4, 8], fp32>
  %b = mdsl.sched.buffer activations offset 8192 bytes 8192 : !mdsl.sched.buffer<[8, 3], fp32>
  %c = mdsl.sched.buffer activations offset 16384 bytes 8192 : !mdsl.sched.buffer<[4, 3], fp32>
  mdsl.sched.gemm %a, %b -> %c {epilogue = "dgelu"} : !a, !b -> !c
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.sched.gemm' op epilogue 'dgelu' needs a aux operand

// -----

!a = !mdsl.sched.buffer<[4, 8], fp32>
!b = !mdsl.sched.buffer<[8, 3], fp32>
!c = !mdsl.sched.buffer<[4, 3], fp32>
mdsl.sched.program @p arenas(params = 0, activations = 65536, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  %a = mdsl.sched.buffer activations offset 0 bytes 8192 : !mdsl.sched.buffer<[4, 8], fp32>
  %b = mdsl.sched.buffer activations offset 8192 bytes 8192 : !mdsl.sched.buffer<[8, 3], fp32>
  %c = mdsl.sched.buffer activations offset 16384 bytes 8192 : !mdsl.sched.buffer<[4, 3], fp32>
  mdsl.sched.gemm %a, %b aux %a -> %c {epilogue = "gelu_aux"} : !a, !b aux !a -> !c
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.sched.gemm' op aux must have the shape of C [4, 3], got [4, 8]

// -----

!q = !mdsl.sched.buffer<[1, 4, 8, 16], bf16>
!kv = !mdsl.sched.buffer<[1, 2, 8, 16], bf16>
!l = !mdsl.sched.buffer<[1, 4, 8], fp32>
mdsl.sched.program @p arenas(params = 0, activations = 65536, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  %q = mdsl.sched.buffer activations offset 0 bytes 8192 : !mdsl.sched.buffer<[1, 4, 8, 16], bf16>
  %k = mdsl.sched.buffer activations offset 8192 bytes 8192 : !mdsl.sched.buffer<[1, 2, 8, 16], bf16>
  %v = mdsl.sched.buffer activations offset 16384 bytes 8192 : !mdsl.sched.buffer<[1, 2, 8, 16], bf16>
  %o = mdsl.sched.buffer activations offset 24576 bytes 8192 : !mdsl.sched.buffer<[1, 4, 8, 16], bf16>
  %l = mdsl.sched.buffer activations offset 32768 bytes 8192 : !mdsl.sched.buffer<[1, 4, 8], fp32>
  %k2 = mdsl.sched.buffer activations offset 40960 bytes 8192 : !mdsl.sched.buffer<[1, 2, 8, 32], bf16>
  mdsl.sched.attention %q, %k2, %v -> %o, %l : !q, !mdsl.sched.buffer<[1, 2, 8, 32], bf16>, !kv -> !q, !l
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.sched.attention' op k and v differ: [1, 2, 8, 32] vs [1, 2, 8, 16]

// -----

!q = !mdsl.sched.buffer<[1, 4, 8, 16], bf16>
!kv = !mdsl.sched.buffer<[1, 2, 8, 16], bf16>
!l = !mdsl.sched.buffer<[1, 4, 8], fp32>
mdsl.sched.program @p arenas(params = 0, activations = 65536, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  %q = mdsl.sched.buffer activations offset 0 bytes 8192 : !mdsl.sched.buffer<[1, 4, 8, 16], bf16>
  %k = mdsl.sched.buffer activations offset 8192 bytes 8192 : !mdsl.sched.buffer<[1, 2, 8, 16], bf16>
  %v = mdsl.sched.buffer activations offset 16384 bytes 8192 : !mdsl.sched.buffer<[1, 2, 8, 16], bf16>
  %o = mdsl.sched.buffer activations offset 24576 bytes 8192 : !mdsl.sched.buffer<[1, 4, 8, 16], bf16>
  %l = mdsl.sched.buffer activations offset 32768 bytes 8192 : !mdsl.sched.buffer<[1, 4, 8], fp32>
  %k2 = mdsl.sched.buffer activations offset 40960 bytes 8192 : !mdsl.sched.buffer<[1, 2, 8, 32], bf16>
  %v2 = mdsl.sched.buffer activations offset 49152 bytes 8192 : !mdsl.sched.buffer<[1, 2, 8, 32], bf16>
  mdsl.sched.attention %q, %k2, %v2 -> %o, %l : !q, !mdsl.sched.buffer<[1, 2, 8, 32], bf16>, !mdsl.sched.buffer<[1, 2, 8, 32], bf16> -> !q, !l
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.sched.attention' op q [1, 4, 8, 16] and k [1, 2, 8, 32] disagree on batch or head dim

// -----

!q = !mdsl.sched.buffer<[1, 4, 8, 16], bf16>
!kv = !mdsl.sched.buffer<[1, 2, 8, 16], bf16>
!l = !mdsl.sched.buffer<[1, 4, 8], fp32>
mdsl.sched.program @p arenas(params = 0, activations = 65536, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  %q = mdsl.sched.buffer activations offset 0 bytes 8192 : !mdsl.sched.buffer<[1, 4, 8, 16], bf16>
  %k = mdsl.sched.buffer activations offset 8192 bytes 8192 : !mdsl.sched.buffer<[1, 2, 8, 16], bf16>
  %v = mdsl.sched.buffer activations offset 16384 bytes 8192 : !mdsl.sched.buffer<[1, 2, 8, 16], bf16>
  %o = mdsl.sched.buffer activations offset 24576 bytes 8192 : !mdsl.sched.buffer<[1, 4, 8, 16], bf16>
  %l = mdsl.sched.buffer activations offset 32768 bytes 8192 : !mdsl.sched.buffer<[1, 4, 8], fp32>
  %k2 = mdsl.sched.buffer activations offset 40960 bytes 8192 : !mdsl.sched.buffer<[1, 2, 4, 16], bf16>
  %v2 = mdsl.sched.buffer activations offset 49152 bytes 8192 : !mdsl.sched.buffer<[1, 2, 4, 16], bf16>
  mdsl.sched.attention %q, %k2, %v2 -> %o, %l : !q, !mdsl.sched.buffer<[1, 2, 4, 16], bf16>, !mdsl.sched.buffer<[1, 2, 4, 16], bf16> -> !q, !l
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.sched.attention' op more queries (8) than keys (4)

// -----

!q = !mdsl.sched.buffer<[1, 4, 8, 16], bf16>
!kv = !mdsl.sched.buffer<[1, 2, 8, 16], bf16>
!l = !mdsl.sched.buffer<[1, 4, 8], fp32>
mdsl.sched.program @p arenas(params = 0, activations = 65536, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  %q = mdsl.sched.buffer activations offset 0 bytes 8192 : !mdsl.sched.buffer<[1, 4, 8, 16], bf16>
  %k = mdsl.sched.buffer activations offset 8192 bytes 8192 : !mdsl.sched.buffer<[1, 2, 8, 16], bf16>
  %v = mdsl.sched.buffer activations offset 16384 bytes 8192 : !mdsl.sched.buffer<[1, 2, 8, 16], bf16>
  %o = mdsl.sched.buffer activations offset 24576 bytes 8192 : !mdsl.sched.buffer<[1, 4, 8, 16], bf16>
  %l = mdsl.sched.buffer activations offset 32768 bytes 8192 : !mdsl.sched.buffer<[1, 4, 8], fp32>
  %l2 = mdsl.sched.buffer activations offset 40960 bytes 8192 : !mdsl.sched.buffer<[1, 4, 8], bf16>
  mdsl.sched.attention %q, %k, %v -> %o, %l2 : !q, !kv, !kv -> !q, !mdsl.sched.buffer<[1, 4, 8], bf16>
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.sched.attention' op lse must be [1, 4, 8] fp32, got [1, 4, 8] bf16

// -----

!q = !mdsl.sched.buffer<[1, 4, 8, 16], bf16>
!kv = !mdsl.sched.buffer<[1, 2, 8, 16], bf16>
!l = !mdsl.sched.buffer<[1, 4, 8], fp32>
mdsl.sched.program @p arenas(params = 0, activations = 65536, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  %q = mdsl.sched.buffer activations offset 0 bytes 8192 : !mdsl.sched.buffer<[1, 4, 8, 16], bf16>
  %k = mdsl.sched.buffer activations offset 8192 bytes 8192 : !mdsl.sched.buffer<[1, 2, 8, 16], bf16>
  %v = mdsl.sched.buffer activations offset 16384 bytes 8192 : !mdsl.sched.buffer<[1, 2, 8, 16], bf16>
  %o = mdsl.sched.buffer activations offset 24576 bytes 8192 : !mdsl.sched.buffer<[1, 4, 8, 16], bf16>
  %l = mdsl.sched.buffer activations offset 32768 bytes 8192 : !mdsl.sched.buffer<[1, 4, 8], fp32>
  mdsl.sched.attention %q, %k, %v -> %k, %l : !q, !kv, !kv -> !kv, !l
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.sched.attention' op out must have the shape of q

// -----

!q = !mdsl.sched.buffer<[1, 4, 8, 16], bf16>
!kv = !mdsl.sched.buffer<[1, 2, 8, 16], bf16>
!l = !mdsl.sched.buffer<[1, 4, 8], fp32>
mdsl.sched.program @p arenas(params = 0, activations = 65536, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  %q = mdsl.sched.buffer activations offset 0 bytes 8192 : !mdsl.sched.buffer<[1, 4, 8, 16], bf16>
  %k = mdsl.sched.buffer activations offset 8192 bytes 8192 : !mdsl.sched.buffer<[1, 2, 8, 16], bf16>
  %v = mdsl.sched.buffer activations offset 16384 bytes 8192 : !mdsl.sched.buffer<[1, 2, 8, 16], bf16>
  %o = mdsl.sched.buffer activations offset 24576 bytes 8192 : !mdsl.sched.buffer<[1, 4, 8, 16], bf16>
  %l = mdsl.sched.buffer activations offset 32768 bytes 8192 : !mdsl.sched.buffer<[1, 4, 8], fp32>
  mdsl.sched.attention %q, %k, %v -> %o, %l {window = -1 : i64} : !q, !kv, !kv -> !q, !l
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.sched.attention' op window must be >= 0 (0 means none), got -1

// -----

!q = !mdsl.sched.buffer<[1, 4, 8, 16], bf16>
!kv = !mdsl.sched.buffer<[1, 2, 8, 16], bf16>
!l = !mdsl.sched.buffer<[1, 4, 8], fp32>
mdsl.sched.program @p arenas(params = 0, activations = 65536, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  %q = mdsl.sched.buffer activations offset 0 bytes 8192 : !mdsl.sched.buffer<[1, 4, 8, 16], bf16>
  %k = mdsl.sched.buffer activations offset 8192 bytes 8192 : !mdsl.sched.buffer<[1, 2, 8, 16], bf16>
  %v = mdsl.sched.buffer activations offset 16384 bytes 8192 : !mdsl.sched.buffer<[1, 2, 8, 16], bf16>
  %o = mdsl.sched.buffer activations offset 24576 bytes 8192 : !mdsl.sched.buffer<[1, 4, 8, 16], bf16>
  %l = mdsl.sched.buffer activations offset 32768 bytes 8192 : !mdsl.sched.buffer<[1, 4, 8], fp32>
  mdsl.sched.attention %q, %k, %v -> %o, %l {scale = 0.0 : f64} : !q, !kv, !kv -> !q, !l
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.sched.attention' op scale must be positive, got 0.0

// -----

!q = !mdsl.sched.buffer<[1, 4, 8, 16], bf16>
!kv = !mdsl.sched.buffer<[1, 2, 8, 16], bf16>
!l = !mdsl.sched.buffer<[1, 4, 8], fp32>
mdsl.sched.program @p arenas(params = 0, activations = 65536, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  %q = mdsl.sched.buffer activations offset 0 bytes 8192 : !mdsl.sched.buffer<[1, 4, 8, 16], bf16>
  %k = mdsl.sched.buffer activations offset 8192 bytes 8192 : !mdsl.sched.buffer<[1, 2, 8, 16], bf16>
  %v = mdsl.sched.buffer activations offset 16384 bytes 8192 : !mdsl.sched.buffer<[1, 2, 8, 16], bf16>
  %o = mdsl.sched.buffer activations offset 24576 bytes 8192 : !mdsl.sched.buffer<[1, 4, 8, 16], bf16>
  %l = mdsl.sched.buffer activations offset 32768 bytes 8192 : !mdsl.sched.buffer<[1, 4, 8], fp32>
  mdsl.sched.attention %q, %k, %v -> %o, %l {layout = "tbhd"} : !q, !kv, !kv -> !q, !l
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.sched.attention' op layout must be one of bhtd, bthd, got 'tbhd'

// -----

!q = !mdsl.sched.buffer<[1, 4, 8, 16], bf16>
!kv = !mdsl.sched.buffer<[1, 2, 8, 16], bf16>
!l = !mdsl.sched.buffer<[1, 4, 8], fp32>
mdsl.sched.program @p arenas(params = 0, activations = 65536, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  %q = mdsl.sched.buffer activations offset 0 bytes 8192 : !mdsl.sched.buffer<[1, 4, 8, 16], bf16>
  %k = mdsl.sched.buffer activations offset 8192 bytes 8192 : !mdsl.sched.buffer<[1, 2, 8, 16], bf16>
  %v = mdsl.sched.buffer activations offset 16384 bytes 8192 : !mdsl.sched.buffer<[1, 2, 8, 16], bf16>
  %o = mdsl.sched.buffer activations offset 24576 bytes 8192 : !mdsl.sched.buffer<[1, 4, 8, 16], bf16>
  %l = mdsl.sched.buffer activations offset 32768 bytes 8192 : !mdsl.sched.buffer<[1, 4, 8], fp32>
  %x = mdsl.sched.buffer activations offset 40960 bytes 8192 : !mdsl.sched.buffer<[4, 8, 16], bf16>
  mdsl.sched.attention %q, %x, %v -> %o, %l : !q, !mdsl.sched.buffer<[4, 8, 16], bf16>, !kv -> !q, !l
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.sched.attention' op attention buffers are 4-d (bhtd), got [4, 8, 16]

// -----

!q = !mdsl.sched.buffer<[1, 4, 8, 16], bf16>
!kv = !mdsl.sched.buffer<[1, 2, 8, 16], bf16>
!l = !mdsl.sched.buffer<[1, 4, 8], fp32>
mdsl.sched.program @p arenas(params = 0, activations = 65536, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  %q = mdsl.sched.buffer activations offset 0 bytes 8192 : !mdsl.sched.buffer<[1, 4, 8, 16], bf16>
  %k = mdsl.sched.buffer activations offset 8192 bytes 8192 : !mdsl.sched.buffer<[1, 2, 8, 16], bf16>
  %v = mdsl.sched.buffer activations offset 16384 bytes 8192 : !mdsl.sched.buffer<[1, 2, 8, 16], bf16>
  %o = mdsl.sched.buffer activations offset 24576 bytes 8192 : !mdsl.sched.buffer<[1, 4, 8, 16], bf16>
  %l = mdsl.sched.buffer activations offset 32768 bytes 8192 : !mdsl.sched.buffer<[1, 4, 8], fp32>
  mdsl.sched.attention_backward %q, %k, %v, %o, %o, %l -> %q, %k, %q : !q, !kv, !kv, !q, !q, !l -> !q, !kv, !q
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.sched.attention_backward' op d_v must have the shape [1, 2, 8, 16]

// -----

mdsl.sched.program @p arenas(params = 0, activations = 65536, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  %b = mdsl.sched.buffer activations offset 0 bytes 8192 : !mdsl.sched.buffer<[256], bf16>
  %c = mdsl.sched.buffer activations offset 8192 bytes 8192 : !mdsl.sched.buffer<[256], bf16>
  mdsl.sched.copy %b -> %c {bytes = 1024 : i64} : !mdsl.sched.buffer<[256], bf16> -> !mdsl.sched.buffer<[256], bf16>
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.sched.copy' op copy of 1024 bytes between buffers of 512 and 512 bytes

// -----

mdsl.sched.program @p arenas(params = 0, activations = 65536, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  %b = mdsl.sched.buffer activations offset 0 bytes 8192 : !mdsl.sched.buffer<[256], bf16>
  mdsl.sched.copy %b -> %b : !mdsl.sched.buffer<[256], bf16> -> !mdsl.sched.buffer<[256], bf16>
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.sched.copy' op copy of a buffer onto itself

// -----

mdsl.sched.program @p arenas(params = 0, activations = 65536, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  mdsl.sched.layer_loop %l = 4 to 2 {
  }
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.sched.layer_loop' op layer range 4 to 2 needs 0 <= lower <= upper

// -----

mdsl.sched.program @p arenas(params = 0, activations = 65536, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  mdsl.sched.recompute_segment "" {
  }
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.sched.recompute_segment' op a recompute segment needs a name

// -----

mdsl.sched.program @p arenas(params = 0, activations = 65536, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  %b = mdsl.sched.buffer activations offset 0 bytes 8192 : !mdsl.sched.buffer<[256], bf16>
  %c = mdsl.sched.buffer activations offset 8192 bytes 8192 : !mdsl.sched.buffer<[256], bf16>
  mdsl.sched.collective "all_gather" %b -> %c group "dp" {op = "sum"} : !mdsl.sched.buffer<[256], bf16> -> !mdsl.sched.buffer<[256], bf16>
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.sched.collective' op all_gather takes no reduction op

// -----

mdsl.sched.program @p arenas(params = 0, activations = 65536, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  %b = mdsl.sched.buffer activations offset 0 bytes 8192 : !mdsl.sched.buffer<[256], bf16>
  %c = mdsl.sched.buffer activations offset 8192 bytes 8192 : !mdsl.sched.buffer<[256], bf16>
  mdsl.sched.collective "all_reduce" %b -> %c group "dp" {op = "prod"} : !mdsl.sched.buffer<[256], bf16> -> !mdsl.sched.buffer<[256], bf16>
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.sched.collective' op op must be one of sum, max, min, avg, got 'prod'

// -----

mdsl.sched.program @p arenas(params = 0, activations = 65536, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  %b = mdsl.sched.buffer activations offset 0 bytes 8192 : !mdsl.sched.buffer<[256], bf16>
  %c = mdsl.sched.buffer activations offset 8192 bytes 8192 : !mdsl.sched.buffer<[256], bf16>
  mdsl.sched.collective "broadcast" %b -> %c group "dp" : !mdsl.sched.buffer<[256], bf16> -> !mdsl.sched.buffer<[256], bf16>
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.sched.collective' op broadcast needs a 'root' rank

// -----

mdsl.sched.program @p arenas(params = 0, activations = 65536, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  %b = mdsl.sched.buffer activations offset 0 bytes 8192 : !mdsl.sched.buffer<[256], bf16>
  %c = mdsl.sched.buffer activations offset 8192 bytes 8192 : !mdsl.sched.buffer<[256], bf16>
  mdsl.sched.collective "all_reduce" %b -> %c group "dp" {op = "sum", root = 0 : i64} : !mdsl.sched.buffer<[256], bf16> -> !mdsl.sched.buffer<[256], bf16>
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.sched.collective' op all_reduce takes no 'root' rank

// -----

mdsl.sched.program @p arenas(params = 0, activations = 65536, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  %b = mdsl.sched.buffer activations offset 0 bytes 8192 : !mdsl.sched.buffer<[256], bf16>
  %c = mdsl.sched.buffer activations offset 8192 bytes 8192 : !mdsl.sched.buffer<[256], bf16>
  mdsl.sched.collective "recv" %b -> %c group "dp" {peer = -1 : i64} : !mdsl.sched.buffer<[256], bf16> -> !mdsl.sched.buffer<[256], bf16>
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.sched.collective' op peer rank must be non-negative, got -1

// -----

mdsl.sched.program @p arenas(params = 0, activations = 65536, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  %b = mdsl.sched.buffer activations offset 0 bytes 8192 : !mdsl.sched.buffer<[256], bf16>
  %c = mdsl.sched.buffer activations offset 8192 bytes 8192 : !mdsl.sched.buffer<[256], bf16>
  mdsl.sched.collective "all_reduce" %b -> %c group "" {op = "sum"} : !mdsl.sched.buffer<[256], bf16> -> !mdsl.sched.buffer<[256], bf16>
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.sched.collective' op a collective needs a group

// -----

mdsl.sched.program @p arenas(params = 0, activations = 65536, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  %b = mdsl.sched.buffer activations offset 0 bytes 8192 : !mdsl.sched.buffer<[256], bf16>
  %s = mdsl.sched.buffer activations offset 8192 bytes 8192 : !mdsl.sched.buffer<[128], bf16>
  %t = mdsl.sched.buffer activations offset 16384 bytes 8192 : !mdsl.sched.buffer<[96], bf16>
  mdsl.sched.collective "all_reduce" %b -> %s group "dp" {op = "sum"} : !mdsl.sched.buffer<[256], bf16> -> !mdsl.sched.buffer<[128], bf16>
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.sched.collective' op all_reduce input and output differ in size (512 vs 256 bytes)

// -----

mdsl.sched.program @p arenas(params = 0, activations = 65536, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  %b = mdsl.sched.buffer activations offset 0 bytes 8192 : !mdsl.sched.buffer<[256], bf16>
  %s = mdsl.sched.buffer activations offset 8192 bytes 8192 : !mdsl.sched.buffer<[128], bf16>
  %t = mdsl.sched.buffer activations offset 16384 bytes 8192 : !mdsl.sched.buffer<[96], bf16>
  mdsl.sched.collective "all_gather" %t -> %b group "dp" : !mdsl.sched.buffer<[96], bf16> -> !mdsl.sched.buffer<[256], bf16>
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.sched.collective' op all_gather output must be a whole multiple of its input

// -----

mdsl.sched.program @p arenas(params = 0, activations = 65536, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  %b = mdsl.sched.buffer activations offset 0 bytes 8192 : !mdsl.sched.buffer<[256], bf16>
  %s = mdsl.sched.buffer activations offset 8192 bytes 8192 : !mdsl.sched.buffer<[128], bf16>
  %t = mdsl.sched.buffer activations offset 16384 bytes 8192 : !mdsl.sched.buffer<[96], bf16>
  mdsl.sched.collective "reduce_scatter" %b -> %t group "dp" {op = "sum"} : !mdsl.sched.buffer<[256], bf16> -> !mdsl.sched.buffer<[96], bf16>
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.sched.collective' op reduce_scatter input must be a whole multiple of its output

// -----

mdsl.sched.program @p arenas(params = 0, activations = 65536, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  %b = mdsl.sched.buffer activations offset 0 bytes 8192 : !mdsl.sched.buffer<[256], bf16>
  mdsl.sched.memset %b {stream = "comm"} : !mdsl.sched.buffer<[256], bf16>
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.sched.memset' op stream must be a symbol reference like @comm

// -----

mdsl.sched.program @p arenas(params = 0, activations = 65536, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  mdsl.sched.stream @comm priority 0
  mdsl.sched.sync @comm waits @comm
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.sched.sync' op a stream cannot wait on itself

// -----

mdsl.sched.stream @comm priority 0
// CHECK: error[{{E[0-9]+}}]: 'mdsl.sched.stream' op 'mdsl.sched.stream' expects parent op 'mdsl.sched.program'

// -----

mdsl.sched.program @p arenas(params = 0, activations = 1024, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  %b = mdsl.sched.buffer scratch offset 0 bytes 512 : !mdsl.sched.buffer<[256], bf16>
}
// CHECK: invalid.mlir:{{[0-9]+}}:26: error[{{E[0-9]+}}]: expected an arena (params, activations, workspace, grads, optimizer, external)

// -----

mdsl.sched.program @p arenas(params = 1024, activations = 1024, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  %a = mdsl.sched.buffer activations offset 0 bytes 128 : !mdsl.sched.buffer<[4, 8], fp32>
  %q = mdsl.sched.buffer params offset 0 bytes 96 : !mdsl.sched.buffer<[3, 8], fp32>
  %s = mdsl.sched.buffer params offset 128 bytes 12 : !mdsl.sched.buffer<[3], fp32>
  %c = mdsl.sched.buffer activations offset 128 bytes 48 : !mdsl.sched.buffer<[4, 3], fp32>
  mdsl.sched.gemm %a, %q scale %s -> %c {transb = true} : !mdsl.sched.buffer<[4, 8], fp32>, !mdsl.sched.buffer<[3, 8], fp32> scale !mdsl.sched.buffer<[3], fp32> -> !mdsl.sched.buffer<[4, 3], fp32>
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.sched.gemm' op a scaled B holds fp8 values (fp8_e4m3, fp8_e5m2), got fp32

// -----

mdsl.sched.program @p arenas(params = 1024, activations = 1024, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  %a = mdsl.sched.buffer activations offset 0 bytes 128 : !mdsl.sched.buffer<[4, 8], fp32>
  %q = mdsl.sched.buffer params offset 0 bytes 24 : !mdsl.sched.buffer<[3, 8], fp8_e4m3>
  %s = mdsl.sched.buffer params offset 128 bytes 32 : !mdsl.sched.buffer<[8], fp32>
  %c = mdsl.sched.buffer activations offset 128 bytes 48 : !mdsl.sched.buffer<[4, 3], fp32>
  mdsl.sched.gemm %a, %q scale %s -> %c {transb = true} : !mdsl.sched.buffer<[4, 8], fp32>, !mdsl.sched.buffer<[3, 8], fp8_e4m3> scale !mdsl.sched.buffer<[8], fp32> -> !mdsl.sched.buffer<[4, 3], fp32>
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.sched.gemm' op the scale of B is fp32 [3] (one per row of B), got fp32 [8]

// -----

mdsl.sched.program @p arenas(params = 0, activations = 1024, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  %x = mdsl.sched.buffer activations offset 0 bytes 64 : !mdsl.sched.buffer<[16], fp32>
  %y = mdsl.sched.buffer activations offset 64 bytes 128 : !mdsl.sched.buffer<[32], fp32>
  mdsl.sched.collective "all_gather" %x -> %y group "tp" {size = 4 : i64} : !mdsl.sched.buffer<[16], fp32> -> !mdsl.sched.buffer<[32], fp32>
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.sched.collective' op all_gather over 4 ranks: 128 bytes whole, 64 a rank's
