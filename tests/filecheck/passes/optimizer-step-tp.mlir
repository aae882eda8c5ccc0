// Tensor parallelism: mdsl-optimizer-step{tp=2} keeps the norm of the whole model's gradient on each
// of two ranks that hold shares of the sharded parameters (@shard(column), @shard(row)): the sharded
// gradients' sum of squares (global_norm {squared}), summed over the tp group in place, then added
// to the replicated gradients' squares before the root (global_norm {plus = 1}). Without tp, or
// with no sharded parameter, it is the one global_norm over every gradient.
// RUN: mdsl-opt %s -p 'mdsl-optimizer-step{tp=2}' | filecheck %s
// RUN: mdsl-opt %s -p 'mdsl-optimizer-step' | filecheck %s --check-prefix=ONE
// RUN: not mdsl-opt %s -p 'mdsl-optimizer-step{tp=0}' 2>&1 | filecheck %s --check-prefix=BAD

mdsl.graph.model @m config {} {
  mdsl.graph.param @norm : !mdsl.graph.tensor<[8], fp32>
  mdsl.graph.param @up : !mdsl.graph.tensor<[16, 8], fp32> {annotations = [#mdsl.graph.shard<column>]}
  mdsl.graph.param @down : !mdsl.graph.tensor<[8, 16], fp32> {annotations = [#mdsl.graph.shard<row>]}
}

// CHECK:      %sharded_squares = mdsl.sched.buffer workspace
// CHECK:      mdsl.sched.launch "global_norm"(%d_up, %d_down) -> (%sharded_squares) {squared = true}
// CHECK-NEXT: mdsl.sched.collective "all_reduce" %sharded_squares -> %sharded_squares group "tp" {op = "sum", size = 2 : i64}
// CHECK-NEXT: mdsl.sched.launch "global_norm"(%d_norm, %sharded_squares) -> (%grad_norm) {plus = 1 : i64}
// CHECK-NEXT: mdsl.sched.launch "adamw"(%norm, %d_norm

// ONE-NOT:  sharded_squares
// ONE:      mdsl.sched.launch "global_norm"(%d_norm, %d_up, %d_down) -> (%grad_norm)
// ONE-NOT:  collective

// BAD: tp=0 is not a positive integer
