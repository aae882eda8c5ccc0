// A dequantize of a weight stored in fp8 that GEMMs read as their B is each GEMM's scale
// operand: the GEMM widens the weight a tile at a time and no widened weight is held, in the
// forward x @ W^T, the backward dy @ W and the per-piece GEMMs of a split projection (row
// slices of the values and of the scales). A reader that is no GEMM (here an add) gets the
// dequantize launch, made where it reads it.
// RUN: mdsl-opt %s -p mdsl-lower-to-sched | filecheck %s

!x = !mdsl.graph.tensor<[2, 4, 8], fp32>
!y = !mdsl.graph.tensor<[2, 4, 12], fp32>
!h = !mdsl.graph.tensor<[2, 4, 6], fp32>
!w = !mdsl.graph.tensor<[12, 8], fp32>
!q = !mdsl.graph.tensor<[12, 8], fp8_e4m3>
!s = !mdsl.graph.tensor<[12], fp32>
mdsl.graph.model @m config {} {
  mdsl.graph.param @w : !q
  mdsl.graph.param @w.scale : !s
  mdsl.graph.func @forward(%x: !x, %dy: !y) -> (!y, !x, !h, !w) attributes {kind = "forward"} {
    %q = mdsl.graph.param_ref @w : !q
    %s = mdsl.graph.param_ref @w.scale : !s
    %w = mdsl.graph.dequantize %q, %s : (!q, !s) -> !w
    %y = mdsl.graph.matmul %x, %w {transpose = "NT"} : (!x, !w) -> !y
    %dx = mdsl.graph.matmul %dy, %w : (!y, !w) -> !x
    %w2 = mdsl.graph.dequantize %q, %s : (!q, !s) -> !w
    %gu = mdsl.graph.matmul %x, %w2 {transpose = "NT"} : (!x, !w) -> !y
    %g, %u = mdsl.graph.split %gu {sizes = #mdsl.graph.dims<[6, 6]>} : (!y) -> (!h, !h)
    %w3 = mdsl.graph.dequantize %q, %s : (!q, !s) -> !w
    %twice = mdsl.graph.add %w3, %w3 : (!w, !w) -> !w
    mdsl.graph.return %y, %dx, %u, %twice : !y, !x, !h, !w
  }
}

// CHECK-NOT:  "dequantize"
// CHECK:      mdsl.sched.gemm %x, %w scale %w.scale -> %y {transb = true} : !mdsl.sched.buffer<[2, 4, 8], fp32>, !mdsl.sched.buffer<[12, 8], fp8_e4m3> scale !mdsl.sched.buffer<[12], fp32> -> !mdsl.sched.buffer<[2, 4, 12], fp32>
// CHECK-NEXT: mdsl.sched.gemm %dy, %w scale %w.scale -> %dx : !mdsl.sched.buffer<[2, 4, 12], fp32>, !mdsl.sched.buffer<[12, 8], fp8_e4m3> scale !mdsl.sched.buffer<[12], fp32> -> !mdsl.sched.buffer<[2, 4, 8], fp32>
// CHECK-NOT:  "dequantize"
// CHECK-NEXT: mdsl.sched.gemm %x, %[[Q0:.*]] scale %[[S0:.*]] -> %g {transb = true} : {{.*}}, !mdsl.sched.buffer<[6, 8], fp8_e4m3> scale !mdsl.sched.buffer<[6], fp32> -> !mdsl.sched.buffer<[2, 4, 6], fp32>
// CHECK-NEXT: mdsl.sched.gemm %x, %[[Q6:.*]] scale %[[S6:.*]] -> %u {transb = true}
// CHECK-NEXT: mdsl.sched.launch "dequantize"(%w, %w.scale) -> (%w3)
// CHECK-NEXT: mdsl.sched.launch "add"(%w3, %w3) -> (%twice)
