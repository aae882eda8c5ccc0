// mdsl-pack-sequences refuses a written-out attention (pack-sequences.mlir runs it): its causal_mask
// cannot take segment ids (mdsl-fuse's dag_attention makes it a flash_attention first).
!q = !mdsl.graph.tensor<[1, 2, 4, 8], fp32>
!s = !mdsl.graph.tensor<[1, 2, 4, 4], fp32>
builtin.module {
  mdsl.graph.model @M config {} {
    mdsl.graph.func @forward(%tokens: !mdsl.graph.tensor<[1, 4], int32>, %q: !q) -> !q attributes {kind = "forward"} {
      %s = mdsl.graph.batched_matmul %q, %q {transpose = "NT"} : (!q, !q) -> !s
      %m = mdsl.graph.causal_mask %s : (!s) -> !s
      %p = mdsl.graph.softmax %m : (!s) -> !s
      %o = mdsl.graph.batched_matmul %p, %q : (!s, !q) -> !q
      mdsl.graph.return %o : !q
    }
  }
}
