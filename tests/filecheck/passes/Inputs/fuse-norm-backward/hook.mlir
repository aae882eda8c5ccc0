// Variant 'hook' of the input of ../../fuse-norm-backward.mlir (the test that runs it), these lines changed:
//   -      %dx1, %dw1 = mdsl.graph.rmsnorm_backward %dy1, %r1, %w1, %rstd1 : (!t, !t, !w, !r) -> (!t, !w)
//   +      %dx1, %dw1 = mdsl.graph.rmsnorm_backward %dy1, %r1, %w1, %rstd1 {annotations = [#mdsl.graph.hook<NormGrad>]} : (!t, !t, !w, !r) -> (!t, !w)

!t = !mdsl.graph.tensor<[2, 8, 32], fp32>
!w = !mdsl.graph.tensor<[32], fp32>
!r = !mdsl.graph.tensor<[2, 8], fp32>
builtin.module {
  mdsl.graph.model @M config {} {
    mdsl.graph.func @block_bwd(%dn: !t, %dy1: !t, %r1: !t, %w1: !w, %rstd1: !r, %dy2: !t, %r2: !t, %w2: !w, %rstd2: !r, %dy3: !t, %r3: !t, %w3: !w, %rstd3: !r, %bias: !w) -> (!t, !t, !w, !w, !t, !w) attributes {kind = "block_backward"} {
      %dx1, %dw1 = mdsl.graph.rmsnorm_backward %dy1, %r1, %w1, %rstd1 {annotations = [#mdsl.graph.hook<NormGrad>]} : (!t, !t, !w, !r) -> (!t, !w)
      %g1 = mdsl.graph.add %dx1, %dn : (!t, !t) -> !t
      %dx2, %dw2 = mdsl.graph.rmsnorm_backward %dy2, %r2, %w2, %rstd2 : (!t, !t, !w, !r) -> (!t, !w)
      %g2 = mdsl.graph.add %g1, %dx2 : (!t, !t) -> !t
      %dx3, %dw3 = mdsl.graph.rmsnorm_backward %dy3, %r3, %w3, %rstd3 : (!t, !t, !w, !r) -> (!t, !w)
      mdsl.graph.return %g1, %g2, %dw1, %dw2, %dx3, %dw3 : !t, !t, !w, !w, !t, !w
    }
  }
}
