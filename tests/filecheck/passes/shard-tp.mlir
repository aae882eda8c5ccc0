// mdsl-shard{tp=2} on a model lowered for one of two tensor-parallel ranks (tp_shapes = 2): a
// column-parallel up projection, then a row-parallel down projection (Megatron's MLP). The forward's
// NT GEMM of the row weight makes each rank's term of the output: all_reduce(tp) follows it and the
// residual add reads the sum; the bias of the row-parallel GEMM is added after the sum, once. In
// the backward the NN GEMM of the column weight (the input gradient) is the partial one; the NN GEMM
// of the row weight (each rank's hidden units) and the TN weight gradients stay the rank's. A hook
// on the partial product moves to the sum, and a gradient function's forward_ops counts the
// all_reduce its forward gained. Run twice, it reduces once. A model of other shapes than one of
// tp ranks' is E048 (shard-tp-errors.mlir: the other errors).
// RUN: mdsl-opt %s -p 'mdsl-shard{tp=2}' | filecheck %s
// RUN: mdsl-opt %s -p 'mdsl-shard{tp=2},mdsl-shard{tp=2}' | filecheck %s --check-prefix=ONCE
// RUN: mdsl-opt %s -p 'mdsl-shard{tp=2},mdsl-lower-to-sched{func=forward}' | filecheck %s --check-prefix=SCHED
// RUN: not mdsl-opt %s -p 'mdsl-shard{tp=4}' 2>&1 | filecheck %s --check-prefix=RANKS

!x = !mdsl.graph.tensor<[2, 4, 8], fp32>
!h = !mdsl.graph.tensor<[2, 4, 16], fp32>
!up = !mdsl.graph.tensor<[16, 8], fp32>
!down = !mdsl.graph.tensor<[8, 16], fp32>
!b = !mdsl.graph.tensor<[8], fp32>
!s = !mdsl.graph.tensor<[], fp32>
mdsl.graph.model @mlp config {d_ff = 16 : i64} attributes {tp_shapes = 2 : i64} {
  mdsl.graph.param @up : !up {annotations = [#mdsl.graph.shard<column>]}
  mdsl.graph.param @down : !down {annotations = [#mdsl.graph.shard<row>]}
  mdsl.graph.param @bias : !b
  mdsl.graph.func @forward(%x: !x) -> !x attributes {kind = "forward"} {
    %up = mdsl.graph.param_ref @up : !up
    %down = mdsl.graph.param_ref @down : !down
    %bias = mdsl.graph.param_ref @bias : !b
    %h = mdsl.graph.matmul %x, %up {transpose = "NT"} : (!x, !up) -> !h
    %a = mdsl.graph.silu %h : (!h) -> !h
    %y = mdsl.graph.matmul %a, %down {transpose = "NT", annotations = [#mdsl.graph.hook<AfterDown>]} : (!h, !down) -> !x
    %yb = mdsl.graph.bias_add %y, %bias : (!x, !b) -> !x
    %out = mdsl.graph.add %x, %yb : (!x, !x) -> !x
    mdsl.graph.return %out : !x
  }
  mdsl.graph.func @loss_grad(%x: !x, %dy: !x) -> (!x, !up, !down, !x) attributes {kind = "helper", grads = ["up", "down"], input_grads = ["x"], forward_ops = 5 : i64} {
    %up = mdsl.graph.param_ref @up : !up
    %down = mdsl.graph.param_ref @down : !down
    %h = mdsl.graph.matmul %x, %up {transpose = "NT"} : (!x, !up) -> !h
    %y = mdsl.graph.matmul %h, %down {transpose = "NT"} : (!h, !down) -> !x
    %out = mdsl.graph.add %x, %y : (!x, !x) -> !x
    %dh = mdsl.graph.matmul %dy, %down : (!x, !down) -> !h
    %d_down = mdsl.graph.matmul %dy, %h {transpose = "TN"} : (!x, !h) -> !down
    %d_up = mdsl.graph.matmul %dh, %x {transpose = "TN"} : (!h, !x) -> !up
    %dx = mdsl.graph.matmul %dh, %up : (!h, !up) -> !x
    mdsl.graph.return %out, %d_up, %d_down, %dx : !x, !up, !down, !x
  }
}

// CHECK-LABEL: mdsl.graph.func @forward
// CHECK:         %h = mdsl.graph.matmul %x, %up {transpose = "NT"}
// CHECK-NEXT:    %a = mdsl.graph.silu %h
// CHECK-NEXT:    %y_partial = mdsl.graph.matmul %a, %down {transpose = "NT", sharded = "tp=2"}
// CHECK-NEXT:    %y = mdsl.graph.all_reduce %y_partial {group = "tp", size = 2 : i64, annotations = [#mdsl.graph.hook<AfterDown>]}
// CHECK-NEXT:    %yb = mdsl.graph.bias_add %y, %bias
// CHECK-NEXT:    %out = mdsl.graph.add %x, %yb
// CHECK-LABEL: mdsl.graph.func @loss_grad
// CHECK-SAME:    forward_ops = 6 : i64
// CHECK:         %y_partial = mdsl.graph.matmul %h, %down {transpose = "NT", sharded = "tp=2"}
// CHECK-NEXT:    %y = mdsl.graph.all_reduce %y_partial {group = "tp", size = 2 : i64}
// CHECK-NEXT:    %out = mdsl.graph.add %x, %y
// CHECK-NEXT:    %dh = mdsl.graph.matmul %dy, %down : (
// CHECK-NEXT:    %d_down = mdsl.graph.matmul %dy, %h {transpose = "TN"}
// CHECK-NEXT:    %d_up = mdsl.graph.matmul %dh, %x {transpose = "TN"}
// CHECK-NEXT:    %dx_partial = mdsl.graph.matmul %dh, %up {sharded = "tp=2"}
// CHECK-NEXT:    %dx = mdsl.graph.all_reduce %dx_partial {group = "tp", size = 2 : i64}
// CHECK-NEXT:    mdsl.graph.return %out, %d_up, %d_down, %dx

// ONCE-COUNT-3: mdsl.graph.all_reduce
// ONCE-NOT:     mdsl.graph.all_reduce

// SCHED: mdsl.sched.collective "all_reduce" %y_partial -> %y group "tp" {op = "sum", size = 2 : i64}

// RANKS: error[E048]: mdsl-shard: tp=4, but @mlp has the shapes of one of 2 ranks
// RANKS: hint: lower the model for one of 4 tensor-parallel ranks: modeldsl.load(..., tp=4), mdsl-run --tp 4
