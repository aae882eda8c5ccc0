// Every op of mdsl.sched in its custom form: the custom print re-parses to
// itself, the generic print re-parses to the same IR.
// RUN: %roundtrip %s | filecheck %s
// RUN: mdsl-opt %s --print-op-generic | mdsl-opt | filecheck %s

!x = !mdsl.sched.buffer<[2, 16, 64], bf16>
!w = !mdsl.sched.buffer<[128, 64], bf16>
!y = !mdsl.sched.buffer<[2, 16, 128], bf16>
!r = !mdsl.sched.buffer<[2, 16], fp32>
!v = !mdsl.sched.buffer<[64], bf16>
!q = !mdsl.sched.buffer<[2, 4, 16, 16], bf16>
!kv = !mdsl.sched.buffer<[2, 2, 16, 16], bf16>
!lse = !mdsl.sched.buffer<[2, 4, 16], fp32>
!sw = !mdsl.sched.buffer<[3, 128, 64], bf16>

// CHECK: mdsl.sched.program @train arenas(params = 65536, activations = 65536, workspace = 1024, grads = 65536, optimizer = 0, external = 4096) {
mdsl.sched.program @train arenas(params = 65536, activations = 65536, workspace = 1024, grads = 65536, optimizer = 0, external = 4096) {
  // CHECK-NEXT: mdsl.sched.stream @compute priority 0
  mdsl.sched.stream @compute priority 0
  // CHECK-NEXT: mdsl.sched.stream @comm priority -1
  mdsl.sched.stream @comm priority -1
  // CHECK-NEXT: %x = mdsl.sched.buffer external offset 0 bytes 4096 : !mdsl.sched.buffer<[2, 16, 64], bf16>
  %x = mdsl.sched.buffer external offset 0 bytes 4096 : !x
  // CHECK-NEXT: %w = mdsl.sched.buffer params offset 0 bytes 16384 : !mdsl.sched.buffer<[128, 64], bf16>
  %w = mdsl.sched.buffer params offset 0 bytes 16384 : !w
  // CHECK-NEXT: %sw = mdsl.sched.buffer params offset 16384 bytes 49152 : !mdsl.sched.buffer<[3, 128, 64], bf16>
  %sw = mdsl.sched.buffer params offset 16384 bytes 49152 : !sw
  // CHECK-NEXT: %g = mdsl.sched.buffer params bytes 128 : !mdsl.sched.buffer<[64], bf16>
  %g = mdsl.sched.buffer params bytes 128 : !v
  // CHECK-NEXT: %y = mdsl.sched.buffer activations offset 0 bytes 8192 : !mdsl.sched.buffer<[2, 16, 128], bf16>
  %y = mdsl.sched.buffer activations offset 0 bytes 8192 : !y
  // CHECK-NEXT: %half = mdsl.sched.buffer activations offset 4096 bytes 4096 alias_of %y : !mdsl.sched.buffer<[2, 16, 64], bf16> from !mdsl.sched.buffer<[2, 16, 128], bf16>
  %half = mdsl.sched.buffer activations offset 4096 bytes 4096 alias_of %y : !x from !y
  // CHECK-NEXT: %same = mdsl.sched.buffer activations offset 0 bytes 8192 alias_of %y : !mdsl.sched.buffer<[2, 16, 128], bf16>
  %same = mdsl.sched.buffer activations offset 0 bytes 8192 alias_of %y : !y
  %n = mdsl.sched.buffer activations offset 8192 bytes 4096 : !x
  %y2d = mdsl.sched.buffer activations offset 0 bytes 8192 alias_of %y : !mdsl.sched.buffer<[32, 128], bf16> from !y
  %n2d = mdsl.sched.buffer activations offset 0 bytes 4096 alias_of %n : !mdsl.sched.buffer<[32, 64], bf16> from !x
  %rstd = mdsl.sched.buffer activations offset 12288 bytes 128 : !r
  %q = mdsl.sched.buffer activations offset 12544 bytes 4096 : !q
  %k = mdsl.sched.buffer activations offset 16640 bytes 2048 : !kv
  %v = mdsl.sched.buffer activations offset 18688 bytes 2048 : !kv
  %o = mdsl.sched.buffer activations offset 20736 bytes 4096 : !q
  %lse = mdsl.sched.buffer activations offset 24832 bytes 512 : !lse
  %dq = mdsl.sched.buffer grads offset 0 bytes 4096 : !q
  %dk = mdsl.sched.buffer grads offset 4096 bytes 2048 : !kv
  %dv = mdsl.sched.buffer grads offset 6144 bytes 2048 : !kv
  %gw = mdsl.sched.buffer grads offset 8192 bytes 16384 : !w
  %gb = mdsl.sched.buffer grads offset 24576 bytes 256 : !mdsl.sched.buffer<[128], bf16>
  %ws = mdsl.sched.buffer workspace offset 0 bytes 1024 : !mdsl.sched.buffer<[512], bf16>
  %pre = mdsl.sched.buffer activations offset 25600 bytes 8192 : !y
  %wq = mdsl.sched.buffer params bytes 8192 : !mdsl.sched.buffer<[128, 64], fp8_e4m3>
  %wscale = mdsl.sched.buffer params bytes 512 : !mdsl.sched.buffer<[128], fp32>
  %xf = mdsl.sched.buffer activations bytes 8192 : !mdsl.sched.buffer<[2, 16, 64], fp32>
  %yf = mdsl.sched.buffer activations bytes 16384 : !mdsl.sched.buffer<[2, 16, 128], fp32>

  // CHECK: mdsl.sched.launch "rmsnorm_fwd"(%x, %g) -> (%n, %rstd) {eps = 1.000000e-05 : f64} : (!mdsl.sched.buffer<[2, 16, 64], bf16>, !mdsl.sched.buffer<[64], bf16>) -> (!mdsl.sched.buffer<[2, 16, 64], bf16>, !mdsl.sched.buffer<[2, 16], fp32>)
  mdsl.sched.launch "rmsnorm_fwd"(%x, %g) -> (%n, %rstd) {eps = 1.0e-05 : f64} : (!x, !v) -> (!x, !r)
  // CHECK-NEXT: mdsl.sched.launch "scale"(%n) -> (%n) {grid = array<i64: 16>, block = array<i64: 256>, inplace, stream = @compute}
  mdsl.sched.launch "scale"(%n) -> (%n) {grid = array<i64: 16>, block = array<i64: 256>, inplace, stream = @compute} : (!x) -> (!x)
  // A launch that adds its result into its output (a gradient straight into its grads buffer):
  // CHECK-NEXT: mdsl.sched.launch "embedding_backward"(%n, %n) -> (%n) {inplace, accumulate}
  mdsl.sched.launch "embedding_backward"(%n, %n) -> (%n) {inplace, accumulate} : (!x, !x) -> (!x)
  // CHECK-NEXT: mdsl.sched.launch "zero_init"() -> (%ws) : () -> (!mdsl.sched.buffer<[512], bf16>)
  mdsl.sched.launch "zero_init"() -> (%ws) : () -> (!mdsl.sched.buffer<[512], bf16>)
  // CHECK-NEXT: mdsl.sched.gemm %n, %w -> %y {transb = true} : !mdsl.sched.buffer<[2, 16, 64], bf16>, !mdsl.sched.buffer<[128, 64], bf16> -> !mdsl.sched.buffer<[2, 16, 128], bf16>
  mdsl.sched.gemm %n, %w -> %y {transb = true} : !x, !w -> !y
  // CHECK-NEXT: mdsl.sched.gemm %n, %w bias %gb -> %y {transb = true, epilogue = "gelu_bias"} : !mdsl.sched.buffer<[2, 16, 64], bf16>, !mdsl.sched.buffer<[128, 64], bf16> bias !mdsl.sched.buffer<[128], bf16> -> !mdsl.sched.buffer<[2, 16, 128], bf16>
  mdsl.sched.gemm %n, %w bias %gb -> %y {transb = true, epilogue = "gelu_bias"} : !x, !w bias !mdsl.sched.buffer<[128], bf16> -> !y
  // CHECK-NEXT: mdsl.sched.gemm %y2d, %n2d -> %gw {transa = true, alpha = 5.000000e-01 : f64, beta = 1.000000e+00 : f64}
  mdsl.sched.gemm %y2d, %n2d -> %gw {transa = true, alpha = 0.5 : f64, beta = 1.0 : f64} : !mdsl.sched.buffer<[32, 128], bf16>, !mdsl.sched.buffer<[32, 64], bf16> -> !w
  // CHECK-NEXT: mdsl.sched.gemm %n, %w bias %gb aux %pre -> %y {transb = true, epilogue = "gelu_aux_bias", stream = @compute} : !mdsl.sched.buffer<[2, 16, 64], bf16>, !mdsl.sched.buffer<[128, 64], bf16> bias !mdsl.sched.buffer<[128], bf16> aux !mdsl.sched.buffer<[2, 16, 128], bf16> -> !mdsl.sched.buffer<[2, 16, 128], bf16>
  mdsl.sched.gemm %n, %w bias %gb aux %pre -> %y {transb = true, epilogue = "gelu_aux_bias", stream = @compute} : !x, !w bias !mdsl.sched.buffer<[128], bf16> aux !y -> !y
  // CHECK-NEXT: mdsl.sched.gemm %n, %w aux %pre -> %y {transb = true, epilogue = "dgelu"} : !mdsl.sched.buffer<[2, 16, 64], bf16>, !mdsl.sched.buffer<[128, 64], bf16> aux !mdsl.sched.buffer<[2, 16, 128], bf16> -> !mdsl.sched.buffer<[2, 16, 128], bf16>
  mdsl.sched.gemm %n, %w aux %pre -> %y {transb = true, epilogue = "dgelu"} : !x, !w aux !y -> !y
  // A B stored in fp8 with a scale per row, widened a tile at a time (the forward x @ W^T, the backward dy @ W):
  // CHECK-NEXT: mdsl.sched.gemm %xf, %wq scale %wscale -> %yf {transb = true} : !mdsl.sched.buffer<[2, 16, 64], fp32>, !mdsl.sched.buffer<[128, 64], fp8_e4m3> scale !mdsl.sched.buffer<[128], fp32> -> !mdsl.sched.buffer<[2, 16, 128], fp32>
  mdsl.sched.gemm %xf, %wq scale %wscale -> %yf {transb = true} : !mdsl.sched.buffer<[2, 16, 64], fp32>, !mdsl.sched.buffer<[128, 64], fp8_e4m3> scale !mdsl.sched.buffer<[128], fp32> -> !mdsl.sched.buffer<[2, 16, 128], fp32>
  // CHECK-NEXT: mdsl.sched.gemm %yf, %wq scale %wscale -> %xf : {{.*}} scale !mdsl.sched.buffer<[128], fp32> -> !mdsl.sched.buffer<[2, 16, 64], fp32>
  mdsl.sched.gemm %yf, %wq scale %wscale -> %xf : !mdsl.sched.buffer<[2, 16, 128], fp32>, !mdsl.sched.buffer<[128, 64], fp8_e4m3> scale !mdsl.sched.buffer<[128], fp32> -> !mdsl.sched.buffer<[2, 16, 64], fp32>
  // CHECK-NEXT: mdsl.sched.gemm %n, %w bias %gb aux %pre -> %y {transb = true, epilogue = "dgelu_bgrad"} :
  mdsl.sched.gemm %n, %w bias %gb aux %pre -> %y {transb = true, epilogue = "dgelu_bgrad"} : !x, !w bias !mdsl.sched.buffer<[128], bf16> aux !y -> !y
  // CHECK-NEXT: mdsl.sched.gemm %y2d, %n2d bias %gb -> %gw {transa = true, epilogue = "bgrada"} : !mdsl.sched.buffer<[32, 128], bf16>, !mdsl.sched.buffer<[32, 64], bf16> bias !mdsl.sched.buffer<[128], bf16> -> !mdsl.sched.buffer<[128, 64], bf16>
  mdsl.sched.gemm %y2d, %n2d bias %gb -> %gw {transa = true, epilogue = "bgrada"} : !mdsl.sched.buffer<[32, 128], bf16>, !mdsl.sched.buffer<[32, 64], bf16> bias !mdsl.sched.buffer<[128], bf16> -> !w
  // CHECK-NEXT: mdsl.sched.attention %q, %k, %v -> %o, %lse {window = 8 : i64} :
  mdsl.sched.attention %q, %k, %v -> %o, %lse {window = 8 : i64} : !q, !kv, !kv -> !q, !lse
  // CHECK-NEXT: mdsl.sched.attention %q, %k, %v -> %o, %lse {causal = false, scale = 2.500000e-01 : f64} :
  mdsl.sched.attention %q, %k, %v -> %o, %lse {causal = false, scale = 0.25 : f64} : !q, !kv, !kv -> !q, !lse
  // CHECK-NEXT: mdsl.sched.attention_backward %q, %k, %v, %o, %o, %lse -> %dq, %dk, %dv :
  mdsl.sched.attention_backward %q, %k, %v, %o, %o, %lse -> %dq, %dk, %dv : !q, !kv, !kv, !q, !q, !lse -> !q, !kv, !kv
  // CHECK-NEXT: mdsl.sched.memset %gw : !mdsl.sched.buffer<[128, 64], bf16>
  mdsl.sched.memset %gw : !w
  // CHECK-NEXT: mdsl.sched.memset %gb {value = 1.000000e+00 : f64} :
  mdsl.sched.memset %gb {value = 1.0 : f64} : !mdsl.sched.buffer<[128], bf16>
  // CHECK-NEXT: mdsl.sched.copy %x -> %n : !mdsl.sched.buffer<[2, 16, 64], bf16> -> !mdsl.sched.buffer<[2, 16, 64], bf16>
  mdsl.sched.copy %x -> %n : !x -> !x
  // CHECK-NEXT: mdsl.sched.copy %x -> %y {bytes = 4096 : i64} : !mdsl.sched.buffer<[2, 16, 64], bf16> -> !mdsl.sched.buffer<[2, 16, 128], bf16>
  mdsl.sched.copy %x -> %y {bytes = 4096 : i64} : !x -> !y

  // CHECK-NEXT: mdsl.sched.layer_loop %l = 0 to 3 {
  mdsl.sched.layer_loop %l = 0 to 3 {
    // CHECK-NEXT: %wl = mdsl.sched.layer_view %sw[%l] : !mdsl.sched.buffer<[3, 128, 64], bf16> -> !mdsl.sched.buffer<[128, 64], bf16>
    %wl = mdsl.sched.layer_view %sw[%l] : !sw -> !w
    // CHECK-NEXT: %rows = mdsl.sched.layer_view %sw[%l] {rows = array<i64: 32, 64>} : !mdsl.sched.buffer<[3, 128, 64], bf16> -> !mdsl.sched.buffer<[64, 64], bf16>
    %rows = mdsl.sched.layer_view %sw[%l] {rows = array<i64: 32, 64>} : !sw -> !mdsl.sched.buffer<[64, 64], bf16>
    // CHECK-NEXT: mdsl.sched.gemm %n, %wl -> %y {transb = true}
    mdsl.sched.gemm %n, %wl -> %y {transb = true} : !x, !w -> !y
  }
  // CHECK: mdsl.sched.layer_loop %l_1 = 0 to 3 reverse {
  mdsl.sched.layer_loop %l = 0 to 3 reverse {
    // CHECK-NEXT: mdsl.sched.recompute_segment "mlp" layer(%l_1) {
    mdsl.sched.recompute_segment "mlp" layer(%l) {
      // CHECK-NEXT: mdsl.sched.launch "rmsnorm_fwd"(%x, %g) -> (%n, %rstd)
      mdsl.sched.launch "rmsnorm_fwd"(%x, %g) -> (%n, %rstd) : (!x, !v) -> (!x, !r)
    }
  }
  // CHECK: mdsl.sched.recompute_segment "embed" {
  mdsl.sched.recompute_segment "embed" {
    // CHECK-NEXT: mdsl.sched.memset %ws
    mdsl.sched.memset %ws : !mdsl.sched.buffer<[512], bf16>
  }

  // CHECK: mdsl.sched.collective "all_reduce" %gw -> %gw group "dp" {op = "sum", stream = @comm} : !mdsl.sched.buffer<[128, 64], bf16> -> !mdsl.sched.buffer<[128, 64], bf16>
  mdsl.sched.collective "all_reduce" %gw -> %gw group "dp" {op = "sum", stream = @comm} : !w -> !w
  // CHECK-NEXT: mdsl.sched.collective "all_gather" %x -> %y group "tp" {size = 2 : i64} :
  mdsl.sched.collective "all_gather" %x -> %y group "tp" {size = 2 : i64} : !x -> !y
  // CHECK-NEXT: mdsl.sched.collective "reduce_scatter" %y -> %x group "tp" {op = "avg"} :
  mdsl.sched.collective "reduce_scatter" %y -> %x group "tp" {op = "avg"} : !y -> !x
  // CHECK-NEXT: mdsl.sched.collective "all_to_all" %x -> %n group "ep" :
  mdsl.sched.collective "all_to_all" %x -> %n group "ep" : !x -> !x
  // CHECK-NEXT: mdsl.sched.collective "send" %x -> %x group "pp" {peer = 1 : i64} :
  mdsl.sched.collective "send" %x -> %x group "pp" {peer = 1 : i64} : !x -> !x
  // CHECK-NEXT: mdsl.sched.collective "recv" %n -> %n group "pp" {peer = 0 : i64} :
  mdsl.sched.collective "recv" %n -> %n group "pp" {peer = 0 : i64} : !x -> !x
  // CHECK-NEXT: mdsl.sched.collective "broadcast" %w -> %w group "dp" {root = 0 : i64} :
  mdsl.sched.collective "broadcast" %w -> %w group "dp" {root = 0 : i64} : !w -> !w
  // CHECK-NEXT: mdsl.sched.sync @compute waits @comm
  mdsl.sched.sync @compute waits @comm
}
