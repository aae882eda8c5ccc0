// ZeRO-1: mdsl-optimizer-step{dp=2 rank=R zero=1} shares the optimizer state out over two
// data-parallel ranks by parameter (the largest first, to the rank holding fewer bytes: @big to
// rank 0, @mid and @small to rank 1). Each grad buffer names its owner; rank R keeps the moments of
// its own parameters and updates those only, then every parameter is broadcast over dp from its
// owner. The global norm reads every gradient (every rank has them all, summed). A zero=1 without
// data-parallel ranks, or a rank that is not one of them, is refused.
// RUN: mdsl-opt %s -p 'mdsl-optimizer-step{dp=2 rank=0 zero=1}' | filecheck %s --check-prefix=RANK0
// RUN: mdsl-opt %s -p 'mdsl-optimizer-step{dp=2 rank=1 zero=1}' | filecheck %s --check-prefix=RANK1
// RUN: not mdsl-opt %s -p 'mdsl-optimizer-step{zero=1}' 2>&1 | filecheck %s --check-prefix=ONE
// RUN: not mdsl-opt %s -p 'mdsl-optimizer-step{dp=2 rank=2 zero=1}' 2>&1 | filecheck %s --check-prefix=RANK

mdsl.graph.model @m config {} {
  mdsl.graph.param @small : !mdsl.graph.tensor<[8], fp32>
  mdsl.graph.param @big : !mdsl.graph.tensor<[16, 8], fp32>
  mdsl.graph.param @mid : !mdsl.graph.tensor<[8, 8], fp32>
}

// RANK0:      %d_small = mdsl.sched.buffer grads {{.*}}{grad = "small", owner = 1 : i64}
// RANK0:      %d_big = mdsl.sched.buffer grads {{.*}}{grad = "big", owner = 0 : i64}
// RANK0:      %d_mid = mdsl.sched.buffer grads {{.*}}{grad = "mid", owner = 1 : i64}
// RANK0-NOT:  exp_avg.small
// RANK0:      %exp_avg.big = mdsl.sched.buffer optimizer
// RANK0-NEXT: %exp_avg_sq.big = mdsl.sched.buffer optimizer
// RANK0-NOT:  exp_avg.mid
// RANK0:      mdsl.sched.launch "global_norm"(%d_small, %d_big, %d_mid) -> (%grad_norm)
// RANK0-NEXT: mdsl.sched.launch "adamw"(%big, %d_big, %exp_avg.big, %exp_avg_sq.big, %lr, %step)
// RANK0-NEXT: mdsl.sched.collective "broadcast" %small -> %small group "dp" {root = 1 : i64, size = 2 : i64}
// RANK0-NEXT: mdsl.sched.collective "broadcast" %big -> %big group "dp" {root = 0 : i64, size = 2 : i64}
// RANK0-NEXT: mdsl.sched.collective "broadcast" %mid -> %mid group "dp" {root = 1 : i64, size = 2 : i64}
// RANK0-NEXT: mdsl.sched.memset %d_small

// RANK1:      %exp_avg.small = mdsl.sched.buffer optimizer
// RANK1:      %exp_avg.mid = mdsl.sched.buffer optimizer
// RANK1-NOT:  exp_avg.big
// RANK1:      mdsl.sched.launch "adamw"(%small, %d_small,
// RANK1-NEXT: mdsl.sched.launch "adamw"(%mid, %d_mid,
// RANK1-NEXT: mdsl.sched.collective "broadcast" %small

// ONE: error[E029]: {{.*}}mdsl-optimizer-step: zero=1 shares the optimizer state over the data-parallel ranks: dp=1 has one
// RANK: error[E029]: {{.*}}mdsl-optimizer-step: rank=2 is not one of dp=2 ranks
