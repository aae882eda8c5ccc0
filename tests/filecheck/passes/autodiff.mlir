// mdsl-autodiff adds @forward_grad(inputs..., d_outputs...) -> (outputs..., d_params..., d_inputs...):
// the forward, then each op's VJP in reverse order. @w is read by two matmuls, so its
// gradient is the add of the two weight gradients; silu's gradient is silu_backward of
// the incoming gradient and the saved pre-activation.
// RUN: mdsl-opt %s -p mdsl-autodiff | filecheck %s
// RUN: mdsl-opt %s --verify-backward | filecheck %s --check-prefix=VERIFY

!x = !mdsl.graph.tensor<[B, T, d], fp32>
!w = !mdsl.graph.tensor<[d, d], fp32>
builtin.module {
  mdsl.graph.model @M config {d = 4 : i64} {
    mdsl.graph.param @w : !w
    mdsl.graph.param @v : !w
    mdsl.graph.func @forward(%x: !x) -> !x attributes {kind = "forward"} {
      %w = mdsl.graph.param_ref @w : !w
      %h = mdsl.graph.matmul %x, %w {transpose = "NT"} : (!x, !w) -> !x
      %a = mdsl.graph.silu %h : (!x) -> !x
      %g = mdsl.graph.matmul %a, %w {transpose = "NT"} : (!x, !w) -> !x
      %v = mdsl.graph.param_ref @v : !w
      %y = mdsl.graph.matmul %g, %v {transpose = "NT"} : (!x, !w) -> !x
      mdsl.graph.return %y : !x
    }
  }
}

// The forward is kept as it was.
// CHECK:      mdsl.graph.func @forward(%x: !mdsl.graph.tensor<[B, T, d], fp32>)

// Inputs, then the gradient of the one output; results: the output, d_w, d_v (the order of
// `grads`), d_x. `saved` names the forward values the backward reads: not the returned y,
// not the incoming gradient d_y.
// CHECK-LABEL: mdsl.graph.func @forward_grad(
// CHECK-SAME:    %x: !mdsl.graph.tensor<[B, T, d], fp32>, %d_y: !mdsl.graph.tensor<[B, T, d], fp32>)
// CHECK-SAME:    -> (!mdsl.graph.tensor<[B, T, d], fp32>, !mdsl.graph.tensor<[d, d], fp32>, !mdsl.graph.tensor<[d, d], fp32>, !mdsl.graph.tensor<[B, T, d], fp32>)
// CHECK-SAME:    attributes {kind = "helper", grads = ["w", "v"], input_grads = ["x"], saved = ["g", "a", "h", "x"], forward_ops = 6 : i64}

// The forward, cloned (one param_ref of @w, read twice).
// CHECK-NEXT:  %w = mdsl.graph.param_ref @w
// CHECK-NEXT:  %h = mdsl.graph.matmul %x, %w {transpose = "NT"}
// CHECK-NEXT:  %a = mdsl.graph.silu %h
// CHECK-NEXT:  %g = mdsl.graph.matmul %a, %w {transpose = "NT"}
// CHECK-NEXT:  %v = mdsl.graph.param_ref @v
// CHECK-NEXT:  %y = mdsl.graph.matmul %g, %v {transpose = "NT"}

// y = g @ v^T: d_g = d_y @ v (NN), d_v = d_y^T @ g (TN).
// CHECK-NEXT:  %[[DG:.+]] = mdsl.graph.matmul %d_y, %v :
// CHECK-NEXT:  %[[DV:.+]] = mdsl.graph.matmul %d_y, %g {transpose = "TN"} : {{.*}} -> !mdsl.graph.tensor<[d, d], fp32>
// g = a @ w^T: d_a = d_g @ w, d_w (second use) = d_g^T @ a.
// CHECK-NEXT:  %[[DA:.+]] = mdsl.graph.matmul %[[DG]], %w :
// CHECK-NEXT:  %[[DW2:.+]] = mdsl.graph.matmul %[[DG]], %a {transpose = "TN"}
// a = silu(h): d_h = silu_backward(d_a, h).
// CHECK-NEXT:  %[[DH:.+]] = mdsl.graph.silu_backward %[[DA]], %h :
// h = x @ w^T: d_x = d_h @ w, d_w (first use) = d_h^T @ x.
// CHECK-NEXT:  %[[DX:.+]] = mdsl.graph.matmul %[[DH]], %w :
// CHECK-NEXT:  %[[DW1:.+]] = mdsl.graph.matmul %[[DH]], %x {transpose = "TN"}
// The two uses of @w add up.
// CHECK-NEXT:  %[[DW:.+]] = mdsl.graph.add %[[DW2]], %[[DW1]] : (!mdsl.graph.tensor<[d, d], fp32>, !mdsl.graph.tensor<[d, d], fp32>) -> !mdsl.graph.tensor<[d, d], fp32>
// CHECK-NEXT:  mdsl.graph.return %y, %[[DW]], %[[DV]], %[[DX]] :
// CHECK-NEXT: }

// The derived gradient agrees with float64 finite differences (errors below 1e-4).
// VERIFY:      verify-backward @M (B=2, T=8; float64, epsilon 1e-06, seed 0)
// VERIFY-NEXT: tensor {{ +}}derived {{ +}}numerical {{ +}}rel. error
// VERIFY-NEXT: w {{.*}}{{e-(0[5-9]|[1-9][0-9])$}}
// VERIFY-NEXT: v {{.*}}{{e-(0[5-9]|[1-9][0-9])$}}
// VERIFY-NEXT: input x {{.*}}{{e-(0[5-9]|[1-9][0-9])$}}
// VERIFY-NEXT: max relative error {{.*}} (within the tolerance 0.001)
