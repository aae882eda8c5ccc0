// Verifier rules of the collectives: each chunk breaks one.
// RUN: mdsl-opt %s --split-input-file --print-diagnostics | filecheck %s

!x = !mdsl.graph.tensor<[4, 8], fp32>
mdsl.graph.model @m {
  mdsl.graph.func @f(%x: !x) -> !x {
    %s = mdsl.graph.all_reduce %x {group = "rows", size = 2 : i64} : (!x) -> !x
    mdsl.graph.return %s : !x
  }
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.graph.all_reduce' op group must be one of world, tp, dp, pp, ep, got 'rows'

// -----

!x = !mdsl.graph.tensor<[4, 8], fp32>
mdsl.graph.model @m {
  mdsl.graph.func @f(%x: !x) -> !x {
    %s = mdsl.graph.all_reduce %x {group = "dp", size = 0 : i64} : (!x) -> !x
    mdsl.graph.return %s : !x
  }
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.graph.all_reduce' op a group has at least one rank, got size 0

// -----

!x = !mdsl.graph.tensor<[4, 8], fp32>
mdsl.graph.model @m {
  mdsl.graph.func @f(%x: !x) -> !x {
    %g = mdsl.graph.all_gather %x {group = "tp", size = 2 : i64} : (!x) -> !x
    mdsl.graph.return %g : !x
  }
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.graph.all_gather' op result dim 0: 8 != 4

// -----

!x = !mdsl.graph.tensor<[4, 8], fp32>
!y = !mdsl.graph.tensor<[4, 4], fp32>
mdsl.graph.model @m {
  mdsl.graph.func @f(%x: !x) -> !y {
    %r = mdsl.graph.reduce_scatter %x {group = "tp", size = 2 : i64, dim = 0 : i64} : (!x) -> !y
    mdsl.graph.return %r : !y
  }
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.graph.reduce_scatter' op input dim 0: 8 != 4

