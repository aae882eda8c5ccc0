// A projection whose only use splits its last dim (fused QKV, gate/up) becomes one GEMM
// per piece on row slices of the weight: an alias of a plain weight, a row range of a
// layer view inside a loop. The fused result is never held. With split_gemms=false,
// one GEMM and a split kernel (the graph's exact arithmetic).
// RUN: mdsl-opt %s -p mdsl-lower-to-sched | filecheck %s
// RUN: mdsl-opt %s -p 'mdsl-lower-to-sched{split_gemms=false}' | filecheck %s --check-prefix=FUSED

!x = !mdsl.graph.tensor<[2, 4, 8], fp32>
!gu = !mdsl.graph.tensor<[2, 4, 12], fp32>
!h = !mdsl.graph.tensor<[2, 4, 6], fp32>
mdsl.graph.model @m config {} {
  mdsl.graph.param @w : !mdsl.graph.tensor<[12, 8], fp32>
  mdsl.graph.param @blocks.w : !mdsl.graph.tensor<[2, 12, 8], fp32>
  mdsl.graph.func @block(%x: !x, %bw: !mdsl.graph.tensor<[12, 8], fp32>) -> !x attributes {kind = "block"} {
    %gu = mdsl.graph.matmul %x, %bw {transpose = "NT"} : (!x, !mdsl.graph.tensor<[12, 8], fp32>) -> !gu
    %g, %u = mdsl.graph.split %gu {sizes = #mdsl.graph.dims<[6, 6]>} : (!gu) -> (!h, !h)
    %y = mdsl.graph.swiglu %g, %u : (!h, !h) -> !h
    %z = mdsl.graph.concat %y, %y {dim = -1 : i64} : (!h, !h) -> !gu
    %o, %p = mdsl.graph.split %z {sizes = #mdsl.graph.dims<[8, 4]>} : (!gu) -> (!x, !mdsl.graph.tensor<[2, 4, 4], fp32>)
    mdsl.graph.return %o : !x
  }
  mdsl.graph.func @forward(%x: !x) -> (!h, !x) attributes {kind = "forward"} {
    %w = mdsl.graph.param_ref @w : !mdsl.graph.tensor<[12, 8], fp32>
    %sw = mdsl.graph.param_ref @blocks.w : !mdsl.graph.tensor<[2, 12, 8], fp32>
    %qkv = mdsl.graph.matmul %x, %w {transpose = "NT"} : (!x, !mdsl.graph.tensor<[12, 8], fp32>) -> !gu
    %q, %k = mdsl.graph.split %qkv {sizes = #mdsl.graph.dims<[6, 6]>} : (!gu) -> (!h, !h)
    %s = mdsl.graph.stack @block count #mdsl.graph.expr<2> (%x : !x) layers(%sw : !mdsl.graph.tensor<[2, 12, 8], fp32>) -> !x
    mdsl.graph.return %k, %s : !h, !x
  }
}

// CHECK-DAG:  %w_rows0 = mdsl.sched.buffer params offset 0 bytes 192 alias_of %w : !mdsl.sched.buffer<[6, 8], fp32> from !mdsl.sched.buffer<[12, 8], fp32>
// CHECK-DAG:  %w_rows6 = mdsl.sched.buffer params offset 192 bytes 192 alias_of %w : !mdsl.sched.buffer<[6, 8], fp32> from !mdsl.sched.buffer<[12, 8], fp32>
// CHECK-NOT:  %qkv =
// CHECK:      mdsl.sched.gemm %x, %w_rows0 -> %q {transb = true}
// CHECK-NEXT: mdsl.sched.gemm %x, %w_rows6 -> %k {transb = true}
// CHECK:      mdsl.sched.layer_loop
// CHECK-NEXT:   %[[LW:.*]] = mdsl.sched.layer_view %blocks.w[%[[L:.*]]] : !mdsl.sched.buffer<[2, 12, 8], fp32> -> !mdsl.sched.buffer<[12, 8], fp32>
// CHECK-NEXT:   %[[G:.*]] = mdsl.sched.layer_view %blocks.w[%[[L]]] {rows = array<i64: 0, 6>} : !mdsl.sched.buffer<[2, 12, 8], fp32> -> !mdsl.sched.buffer<[6, 8], fp32>
// CHECK-NEXT:   mdsl.sched.gemm %{{.*}}, %[[G]] -> %g {transb = true}
// CHECK-NEXT:   %[[U:.*]] = mdsl.sched.layer_view %blocks.w[%[[L]]] {rows = array<i64: 6, 6>}
// CHECK-NEXT:   mdsl.sched.gemm %{{.*}}, %[[U]] -> %u {transb = true}
// CHECK-NEXT:   mdsl.sched.launch "swiglu"(%g, %u) -> (%y)
// A split whose input is not a projection stays a split kernel:
// CHECK-NEXT:   mdsl.sched.launch "concat"(%y, %y) -> (%z)
// CHECK-NEXT:   mdsl.sched.launch "split"(%z) -> (%o, %p)

// FUSED:      mdsl.sched.gemm %x, %w -> %qkv {transb = true}
// FUSED-NEXT: mdsl.sched.launch "split"(%qkv) -> (%q, %k)
