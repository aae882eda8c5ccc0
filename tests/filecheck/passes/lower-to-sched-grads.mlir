// mdsl-lower-to-sched{grads_arena=true} of a gradient function: the parameter gradients
// are added into the grads arena (one fp32 buffer per trainable parameter, after the
// parameters, in the model's order; @frozen @f gets none) and are no outputs. A weight
// gradient computed by a GEMM becomes that GEMM with beta = 1 on its gradient buffer; the
// per-layer gradients of the stacked @blocks.w (split + view in the unrolled forward of loop=false,
// view + concat in the backward) go to their layer's slice; @n's gradient (rmsnorm's) is
// added by an in-place add. The output o and d_x stay outputs 0 and 1.
// RUN: mdsl-opt %s -p 'mdsl-autodiff{loop=false},mdsl-lower-to-sched{func=forward_grad grads_arena=true}' | filecheck %s
// RUN: not mdsl-opt %s -p 'mdsl-lower-to-sched{grads_arena=true}' 2>&1 | filecheck %s --check-prefix=NOGRAD

!x = !mdsl.graph.tensor<[2, 4, 8], fp32>
!w = !mdsl.graph.tensor<[8, 8], fp32>
mdsl.graph.model @m config {} {
  mdsl.graph.param @f : !w {annotations = [#mdsl.graph.frozen]}
  mdsl.graph.param @blocks.w : !mdsl.graph.tensor<[2, 8, 8], fp32>
  mdsl.graph.param @n : !mdsl.graph.tensor<[8], fp32>
  mdsl.graph.func @block(%x: !x, %bw: !w) -> !x attributes {kind = "block"} {
    %h = mdsl.graph.matmul %x, %bw {transpose = "NT"} : (!x, !w) -> !x
    %y = mdsl.graph.silu %h : (!x) -> !x
    mdsl.graph.return %y : !x
  }
  mdsl.graph.func @forward(%x: !x) -> !x attributes {kind = "forward"} {
    %f = mdsl.graph.param_ref @f : !w
    %a = mdsl.graph.matmul %x, %f {transpose = "NT"} : (!x, !w) -> !x
    %sw = mdsl.graph.param_ref @blocks.w : !mdsl.graph.tensor<[2, 8, 8], fp32>
    %s = mdsl.graph.stack @block count #mdsl.graph.expr<2> (%a : !x) layers(%sw : !mdsl.graph.tensor<[2, 8, 8], fp32>) -> !x
    %n = mdsl.graph.param_ref @n : !mdsl.graph.tensor<[8], fp32>
    %o, %rstd = mdsl.graph.rmsnorm %s, %n : (!x, !mdsl.graph.tensor<[8], fp32>) -> (!x, !mdsl.graph.tensor<[2, 4], fp32>)
    mdsl.graph.return %o : !x
  }
}

// CHECK-LABEL: mdsl.sched.program @forward_grad
// CHECK-SAME:    attributes {model = "m", saved = [{{.+}}]}
// CHECK-NEXT:    %f = mdsl.sched.buffer params bytes 256 {param = "f"}
// CHECK-NEXT:    %blocks.w = mdsl.sched.buffer params bytes 512 {param = "blocks.w"}
// CHECK-NEXT:    %n = mdsl.sched.buffer params bytes 32 {param = "n"}
// CHECK-NEXT:    %d_blocks.w = mdsl.sched.buffer grads bytes 512 {grad = "blocks.w"} : !mdsl.sched.buffer<[2, 8, 8], fp32>
// CHECK-NEXT:    %d_n = mdsl.sched.buffer grads bytes 32 {grad = "n"} : !mdsl.sched.buffer<[8], fp32>
// CHECK-NEXT:    %x = mdsl.sched.buffer external bytes 256 {input = 0 : i64}
// CHECK-NEXT:    %d_o = mdsl.sched.buffer external bytes 256 {input = 1 : i64}
// CHECK-NOT:     grad = "f"
// CHECK:         %o = mdsl.sched.buffer external bytes 256 {output = 0 : i64}
// Layer 1's slice of d_blocks.w, then layer 0's (the backward runs the layers in reverse):
// CHECK-DAG:     %[[L1:.+]] = mdsl.sched.buffer grads offset 256 bytes 256 alias_of %d_blocks.w : !mdsl.sched.buffer<[1, 8, 8], fp32>
// CHECK-DAG:     %[[L1W:.+]] = mdsl.sched.buffer grads offset 0 bytes 256 alias_of %[[L1]] : !mdsl.sched.buffer<[8, 8], fp32>
// CHECK-DAG:     %[[L0:.+]] = mdsl.sched.buffer grads offset 0 bytes 256 alias_of %d_blocks.w : !mdsl.sched.buffer<[1, 8, 8], fp32>
// CHECK-DAG:     %[[L0W:.+]] = mdsl.sched.buffer grads offset 0 bytes 256 alias_of %[[L0]] : !mdsl.sched.buffer<[8, 8], fp32>
// CHECK-DAG:     {output = 1 : i64} : !mdsl.sched.buffer<[2, 4, 8], fp32>
// CHECK-NOT:     "concat"
// CHECK:         mdsl.sched.gemm %{{.+}}, %y_2d -> %[[L1W]] {transa = true, beta = 1.000000e+00 : f64}
// CHECK-NOT:     "concat"
// CHECK:         mdsl.sched.gemm %{{.+}}, %a_2d -> %[[L0W]] {transa = true, beta = 1.000000e+00 : f64}
// CHECK-NOT:     "concat"
// CHECK:         mdsl.sched.launch "add"(%d_n, %{{.+}}) -> (%d_n) {inplace}
// CHECK-NEXT:  }

// NOGRAD: error[E029]: mdsl-lower-to-sched: grads_arena=true, but @forward is no gradient function
