// mdsl-shard{dp=2} sums each parameter gradient of a gradient function over the dp group right
// after it is made (the backward's first-finished gradient first), and leaves alone the function's
// own results (the loss), its inputs' gradients and every other function (a written backward's
// grads included). Run twice, it reduces once. Lowered into a training step's grads arena, each
// gradient is added into its grads buffer as without the pass (the GEMMs write there, beta = 1) and
// that buffer is then all-reduced in place: the rank's accumulated gradient, no transient copy. A layout that does not divide the model is E048
// naming the dimension; tensor parallelism of a model lowered with the whole shapes is E048 too (shard-tp.mlir
// shards one rank's); the parallelisms not built yet are refused.
// RUN: mdsl-opt %s -p 'mdsl-shard{dp=2}' | filecheck %s
// RUN: mdsl-opt %s -p 'mdsl-shard{dp=2},mdsl-shard{dp=2}' | filecheck %s --check-prefix=ONCE
// RUN: mdsl-opt %s -p 'mdsl-shard{dp=2},mdsl-lower-to-sched{func=loss_grad}' | filecheck %s --check-prefix=SCHED
// RUN: mdsl-opt %s -p 'mdsl-shard{dp=2},mdsl-lower-to-sched{func=loss_grad grads_arena=true}' | filecheck %s --check-prefix=GRADS
// RUN: not mdsl-opt %s -p 'mdsl-shard{tp=3}' 2>&1 | filecheck %s --check-prefix=DIVIDES
// RUN: not mdsl-opt %s -p 'mdsl-shard{tp=2}' 2>&1 | filecheck %s --check-prefix=WHOLE
// RUN: not mdsl-opt %s -p 'mdsl-shard{pp=2}' 2>&1 | filecheck %s --check-prefix=NOTYET

!x = !mdsl.graph.tensor<[2, 8], fp32>
!w = !mdsl.graph.tensor<[8, 8], fp32>
!s = !mdsl.graph.tensor<[], fp32>
mdsl.graph.model @m config {num_heads = 4 : i64} {
  mdsl.graph.param @w1 : !w
  mdsl.graph.param @w2 : !w
  mdsl.graph.func @helper_backward(%d: !x, %w: !w) -> (!x, !w) attributes {kind = "backward", grads = ["d_in", "d_w"]} {
    %dx = mdsl.graph.matmul %d, %w : (!x, !w) -> !x
    %dw = mdsl.graph.matmul %d, %d {transpose = "TN"} : (!x, !x) -> !w
    mdsl.graph.return %dx, %dw : !x, !w
  }
  mdsl.graph.func @loss_grad(%x: !x, %seed: !s) -> (!s, !w, !w, !x) attributes {kind = "helper", grads = ["w1", "w2"], input_grads = ["x"]} {
    %w1 = mdsl.graph.param_ref @w1 : !w
    %w2 = mdsl.graph.param_ref @w2 : !w
    %h = mdsl.graph.matmul %x, %w1 {transpose = "NT"} : (!x, !w) -> !x
    %loss = mdsl.graph.reduce_sum %h {dims = array<i64: 0, 1>} : (!x) -> !s
    %dh = mdsl.graph.ones : !x
    %d_w2 = mdsl.graph.matmul %dh, %h {transpose = "TN"} : (!x, !x) -> !w
    %d_w1 = mdsl.graph.matmul %dh, %x {transpose = "TN"} : (!x, !x) -> !w
    %d_x = mdsl.graph.matmul %dh, %w1 : (!x, !w) -> !x
    mdsl.graph.return %loss, %d_w1, %d_w2, %d_x : !s, !w, !w, !x
  }
}

// CHECK-LABEL: mdsl.graph.func @helper_backward
// CHECK-NOT:     all_reduce
// CHECK:         mdsl.graph.return %dx, %dw
// CHECK-LABEL: mdsl.graph.func @loss_grad
// CHECK-SAME:    sharded = "dp=2"
// CHECK:         %d_w2 = mdsl.graph.matmul %dh, %h {transpose = "TN"}
// CHECK-NEXT:    %d_w2_1 = mdsl.graph.all_reduce %d_w2 {group = "dp", size = 2 : i64} : (!mdsl.graph.tensor<[8, 8], fp32>) -> !mdsl.graph.tensor<[8, 8], fp32>
// CHECK-NEXT:    %d_w1 = mdsl.graph.matmul %dh, %x {transpose = "TN"}
// CHECK-NEXT:    %d_w1_1 = mdsl.graph.all_reduce %d_w1 {group = "dp", size = 2 : i64}
// CHECK-NEXT:    %d_x = mdsl.graph.matmul %dh, %w1
// CHECK-NEXT:    mdsl.graph.return %loss, %d_w1_1, %d_w2_1, %d_x

// ONCE-COUNT-2: mdsl.graph.all_reduce
// ONCE-NOT:     mdsl.graph.all_reduce

// SCHED: mdsl.sched.collective "all_reduce" %d_w2 -> %d_w2_1 group "dp" {op = "sum", size = 2 : i64} : !mdsl.sched.buffer<[8, 8], fp32> -> !mdsl.sched.buffer<[8, 8], fp32>
// SCHED: mdsl.sched.collective "all_reduce" %d_w1 -> %d_w1_1 group "dp" {op = "sum", size = 2 : i64}

// GRADS:      mdsl.sched.gemm %dh, %h -> %d_w2 {transa = true, beta = 1.000000e+00 : f64}
// GRADS-NEXT: mdsl.sched.gemm %dh, %x -> %d_w1 {transa = true, beta = 1.000000e+00 : f64}
// GRADS-NEXT: mdsl.sched.gemm %dh, %w1 -> %d_x
// GRADS-NEXT: mdsl.sched.collective "all_reduce" %d_w1 -> %d_w1 group "dp" {op = "sum", size = 2 : i64}
// GRADS-NEXT: mdsl.sched.collective "all_reduce" %d_w2 -> %d_w2 group "dp" {op = "sum", size = 2 : i64}

// DIVIDES: error[E048]: mdsl-shard: tp=3 does not divide num_heads=4 of m
// DIVIDES: hint: choose a tp that divides num_heads (its divisors: 1, 2, 4)

// WHOLE: error[E048]: mdsl-shard: tp=2, but @m has the shapes of the whole model

// NOTYET: error[E029]: {{.*}}mdsl-shard: pp=2: pipeline parallelism is not implemented yet
