// mdsl.graph.backward_start stands only in a gradient function (one with forward_ops).
// RUN: mdsl-opt %s --print-diagnostics | filecheck %s
!x = !mdsl.graph.tensor<[4], fp32>
mdsl.graph.model @m {
  mdsl.graph.func @f(%x: !x) -> !x {
    mdsl.graph.backward_start
    mdsl.graph.return %x : !x
  }
}
// CHECK: stands in a function that is no gradient function
