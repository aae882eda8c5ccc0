// mdsl-shard{tp=2}: a sharded weight that another op than a GEMM reads (here a transpose) is E048.
// RUN: not mdsl-opt %s -p 'mdsl-shard{tp=2}' 2>&1 | filecheck %s

!w = !mdsl.graph.tensor<[8, 8], fp32>
!x2 = !mdsl.graph.tensor<[2, 8], fp32>
mdsl.graph.model @read config {} attributes {tp_shapes = 2 : i64} {
  mdsl.graph.param @w : !w {annotations = [#mdsl.graph.shard<column>]}
  mdsl.graph.func @forward(%x: !x2) -> !x2 attributes {kind = "forward"} {
    %w = mdsl.graph.param_ref @w : !w
    %wt = mdsl.graph.transpose %w {dim0 = 0 : i64, dim1 = 1 : i64} : (!w) -> !w
    %y = mdsl.graph.matmul %x, %wt : (!x2, !w) -> !x2
    mdsl.graph.return %y : !x2
  }
}

// CHECK: error[E048]: mdsl-shard: the column-parallel parameter w is read by mdsl.graph.transpose (operand 0)

