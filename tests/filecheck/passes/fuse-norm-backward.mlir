// mdsl-fuse pattern residual_norm, backward half (passes/fuse_norm.py: ResidualNormBackward): in a
// block's backward, the norm's input gradient joins the residual stream's gradient, rmsnorm_backward +
// add (either operand order) -> fused_residual_rmsnorm_backward, whose d_residual is the sum (d_input,
// the same values, is unread). The final norm's backward, whose gradient no add reads, stays. Each
// variant (Inputs/fuse-norm-backward/) breaks one: d_x read by a second op, a broadcasting add of
// another shape, @nofuse on the add, a hook on rmsnorm_backward, a recompute replay; disable=
// residual_norm turns both halves off.
// RUN: mdsl-opt %s -p 'mdsl-fuse' | filecheck %s --check-prefix=FUSED
// RUN: mdsl-opt %s -p 'mdsl-fuse{disable=residual_norm}' | filecheck %s --check-prefix=OFF
// RUN: mdsl-opt %S/Inputs/fuse-norm-backward/read.mlir -p 'mdsl-fuse' | filecheck %s --check-prefix=SECOND-READER
// RUN: mdsl-opt %S/Inputs/fuse-norm-backward/shape.mlir -p 'mdsl-fuse' | filecheck %s --check-prefix=FIRST-KEPT
// RUN: mdsl-opt %S/Inputs/fuse-norm-backward/nofuse.mlir -p 'mdsl-fuse' | filecheck %s --check-prefix=FIRST-KEPT
// RUN: mdsl-opt %S/Inputs/fuse-norm-backward/hook.mlir -p 'mdsl-fuse' | filecheck %s --check-prefix=FIRST-KEPT
// RUN: mdsl-opt %S/Inputs/fuse-norm-backward/replay.mlir -p 'mdsl-fuse' | filecheck %s --check-prefix=FIRST-KEPT

!t = !mdsl.graph.tensor<[2, 8, 32], fp32>
!w = !mdsl.graph.tensor<[32], fp32>
!r = !mdsl.graph.tensor<[2, 8], fp32>
builtin.module {
  mdsl.graph.model @M config {} {
    mdsl.graph.func @block_bwd(%dn: !t, %dy1: !t, %r1: !t, %w1: !w, %rstd1: !r, %dy2: !t, %r2: !t, %w2: !w, %rstd2: !r, %dy3: !t, %r3: !t, %w3: !w, %rstd3: !r, %bias: !w) -> (!t, !t, !w, !w, !t, !w) attributes {kind = "block_backward"} {
      %dx1, %dw1 = mdsl.graph.rmsnorm_backward %dy1, %r1, %w1, %rstd1 : (!t, !t, !w, !r) -> (!t, !w)
      %g1 = mdsl.graph.add %dx1, %dn : (!t, !t) -> !t
      %dx2, %dw2 = mdsl.graph.rmsnorm_backward %dy2, %r2, %w2, %rstd2 : (!t, !t, !w, !r) -> (!t, !w)
      %g2 = mdsl.graph.add %g1, %dx2 : (!t, !t) -> !t
      %dx3, %dw3 = mdsl.graph.rmsnorm_backward %dy3, %r3, %w3, %rstd3 : (!t, !t, !w, !r) -> (!t, !w)
      mdsl.graph.return %g1, %g2, %dw1, %dw2, %dx3, %dw3 : !t, !t, !w, !w, !t, !w
    }
  }
}

// FUSED:      mdsl.graph.func @block_bwd
// FUSED-NEXT:   %g1, %{{.*}}, %dw1 = mdsl.graph.fused_residual_rmsnorm_backward %dy1, %dn, %r1, %w1, %rstd1 : (!mdsl.graph.tensor<[2, 8, 32], fp32>, !mdsl.graph.tensor<[2, 8, 32], fp32>, !mdsl.graph.tensor<[2, 8, 32], fp32>, !mdsl.graph.tensor<[32], fp32>, !mdsl.graph.tensor<[2, 8], fp32>) -> (!mdsl.graph.tensor<[2, 8, 32], fp32>, !mdsl.graph.tensor<[2, 8, 32], fp32>, !mdsl.graph.tensor<[32], fp32>)
// FUSED-NEXT:   %g2, %{{.*}}, %dw2 = mdsl.graph.fused_residual_rmsnorm_backward %dy2, %g1, %r2, %w2, %rstd2 :
// FUSED-NEXT:   %dx3, %dw3 = mdsl.graph.rmsnorm_backward %dy3, %r3, %w3, %rstd3 :
// FUSED-NEXT:   mdsl.graph.return %g1, %g2, %dw1, %dw2, %dx3, %dw3 :

// OFF:      %dx1, %dw1 = mdsl.graph.rmsnorm_backward %dy1, %r1, %w1, %rstd1 :
// OFF-NEXT: %g1 = mdsl.graph.add %dx1, %dn :
// OFF-NEXT: %dx2, %dw2 = mdsl.graph.rmsnorm_backward %dy2, %r2, %w2, %rstd2 :
// OFF-NEXT: %g2 = mdsl.graph.add %g1, %dx2 :
// OFF-NOT:  fused_residual_rmsnorm_backward

// The first norm gradient is also returned: the first pair stays, the second still fuses.
// SECOND-READER:      %dx1, %dw1 = mdsl.graph.rmsnorm_backward %dy1, %r1, %w1, %rstd1 :
// SECOND-READER-NEXT: %g1 = mdsl.graph.add %dx1, %dn :
// SECOND-READER-NEXT: %g2, %{{.*}}, %dw2 = mdsl.graph.fused_residual_rmsnorm_backward %dy2, %g1, %r2, %w2, %rstd2 :
// SECOND-READER:      mdsl.graph.return %g1, %g2, %dw1, %dw2, %dx1, %dw3 :

// FIRST-KEPT:      %dx1, %dw1 = mdsl.graph.rmsnorm_backward %dy1, %r1, %w1, %rstd1
// FIRST-KEPT-NEXT: %g1 = mdsl.graph.add %dx1,
// FIRST-KEPT-NEXT: %g2, %{{.*}}, %dw2 = mdsl.graph.fused_residual_rmsnorm_backward %dy2, %g1, %r2, %w2, %rstd2 :
