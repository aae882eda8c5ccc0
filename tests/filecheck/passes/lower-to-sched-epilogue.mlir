// mdsl-lower-to-sched of linear_bias_act: one mdsl.sched.gemm with the bias epilogue and its
// activation (gelu_bias, relu_bias, bias alone with alpha). In a gradient function the GELU's
// pre-activation, which the backward reads, is the GEMM's aux output (gelu_aux_bias); ReLU's
// backward reads the output, so the ReLU GEMM saves nothing. The backward's GELU gradient of the
// d_a1 GEMM is its dgelu epilogue through that aux, with the bias gradient of b1 as dgelu_bgrad;
// the other bias gradients (a reduce_sum of the gradient) are bgrada/bgradb epilogues of the
// weight-gradient GEMMs that read the same gradient, then added into the grads arena.
// RUN: mdsl-opt %s -p 'mdsl-lower-to-sched' | filecheck %s --check-prefix=FWD
// RUN: mdsl-opt %s -p 'mdsl-autodiff{loop=false},mdsl-lower-to-sched{func=forward_grad grads_arena=true}' | filecheck %s --check-prefix=GRAD

!x = !mdsl.graph.tensor<[2, 4, 8], fp32>
!h = !mdsl.graph.tensor<[2, 4, 16], fp32>
mdsl.graph.model @m config {} {
  mdsl.graph.param @w1 : !mdsl.graph.tensor<[16, 8], fp32>
  mdsl.graph.param @b1 : !mdsl.graph.tensor<[16], fp32>
  mdsl.graph.param @w2 : !mdsl.graph.tensor<[8, 16], fp32>
  mdsl.graph.param @b2 : !mdsl.graph.tensor<[8], fp32>
  mdsl.graph.func @forward(%x: !x) -> !x attributes {kind = "forward"} {
    %w1 = mdsl.graph.param_ref @w1 : !mdsl.graph.tensor<[16, 8], fp32>
    %b1 = mdsl.graph.param_ref @b1 : !mdsl.graph.tensor<[16], fp32>
    %w2 = mdsl.graph.param_ref @w2 : !mdsl.graph.tensor<[8, 16], fp32>
    %b2 = mdsl.graph.param_ref @b2 : !mdsl.graph.tensor<[8], fp32>
    %a1, %p1 = mdsl.graph.linear_bias_act %x, %w1, %b1 {activation = "gelu"} : (!x, !mdsl.graph.tensor<[16, 8], fp32>, !mdsl.graph.tensor<[16], fp32>) -> (!h, !h)
    %a2, %p2 = mdsl.graph.linear_bias_act %a1, %w2, %b2 {activation = "relu"} : (!h, !mdsl.graph.tensor<[8, 16], fp32>, !mdsl.graph.tensor<[8], fp32>) -> (!x, !x)
    %o, %p3 = mdsl.graph.linear_bias_act %a2, %w2, %b1 {transpose = "NN", alpha = 0.5 : f64} : (!x, !mdsl.graph.tensor<[8, 16], fp32>, !mdsl.graph.tensor<[16], fp32>) -> (!h, !h)
    %s = mdsl.graph.view %o {shape = [2, 4, 8, 2]} : (!h) -> !mdsl.graph.tensor<[2, 4, 8, 2], fp32>
    %r = mdsl.graph.reduce_sum %s {dims = array<i64: 3>} : (!mdsl.graph.tensor<[2, 4, 8, 2], fp32>) -> !x
    mdsl.graph.return %r : !x
  }
}

// FWD-LABEL: mdsl.sched.program @forward
// FWD:       mdsl.sched.gemm %x, %w1 bias %b1 -> %a1 {transb = true, epilogue = "gelu_bias"}
// FWD-NEXT:  mdsl.sched.gemm %a1, %w2 bias %b2 -> %a2 {transb = true, epilogue = "relu_bias"}
// FWD-NEXT:  mdsl.sched.gemm %a2, %w2 bias %b1 -> %o {alpha = 5.000000e-01 : f64, epilogue = "bias"}
// FWD-NOT:   mdsl.sched.launch "linear_bias_act"

// GRAD-LABEL: mdsl.sched.program @forward_grad
// GRAD:       mdsl.sched.gemm %x, %w1 bias %b1 aux %p1 -> %a1 {transb = true, epilogue = "gelu_aux_bias"}
// GRAD-NEXT:  mdsl.sched.gemm %a1, %w2 bias %b2 -> %a2 {transb = true, epilogue = "relu_bias"}
// GRAD-NEXT:  mdsl.sched.gemm %a2, %w2 bias %b1 -> %o {alpha = 5.000000e-01 : f64, epilogue = "bias"}
// GRAD:       mdsl.sched.gemm %a2_2d, %{{.+}} bias %[[DB1_3:.+]] -> %d_w2 {transa = true, alpha = 5.000000e-01 : f64, epilogue = "bgradb", beta = 1.000000e+00 : f64}
// GRAD-NEXT:  mdsl.sched.launch "relu_backward"(%{{.+}}, %a2)
// GRAD-NEXT:  mdsl.sched.gemm %[[G2:.+]], %w2 bias %[[DB1:.+]] aux %p1 -> %{{.+}} {epilogue = "dgelu_bgrad"}
// GRAD-NEXT:  mdsl.sched.gemm %{{.+}}, %a1_2d bias %[[DB2:.+]] -> %d_w2 {transa = true, epilogue = "bgrada", beta = 1.000000e+00 : f64}
// GRAD-NOT:   mdsl.sched.launch "reduce_sum"
// GRAD-NOT:   mdsl.sched.launch "gelu_backward"
// GRAD:       mdsl.sched.launch "add"(%d_b1, %[[DB1_3]]) -> (%d_b1) {inplace}
// GRAD-NEXT:  mdsl.sched.launch "add"(%d_b1, %[[DB1]]) -> (%d_b1) {inplace}
// GRAD-NEXT:  mdsl.sched.launch "add"(%d_b2, %[[DB2]]) -> (%d_b2) {inplace}
