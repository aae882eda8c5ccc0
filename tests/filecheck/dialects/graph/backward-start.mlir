// mdsl.graph.backward_start marks where a gradient function's backward part starts while
// mdsl-fuse rewrites either side of it: it round-trips in both forms, and it stands only in a
// function that has forward_ops (backward-start-invalid.mlir).
// RUN: %roundtrip %s | filecheck %s
// RUN: mdsl-opt %s --print-op-generic | mdsl-opt | filecheck %s

!x = !mdsl.graph.tensor<[4], fp32>
mdsl.graph.model @m {
  mdsl.graph.func @f_grad(%x: !x, %d: !x) -> !x attributes {forward_ops = 1 : i64} {
    %y = mdsl.graph.relu %x : (!x) -> !x
    mdsl.graph.backward_start
    %g = mdsl.graph.relu_backward %d, %x : (!x, !x) -> !x
    mdsl.graph.return %g : !x
  }
}
// CHECK:      %y = mdsl.graph.relu %x
// CHECK-NEXT: mdsl.graph.backward_start
// CHECK-NEXT: %g = mdsl.graph.relu_backward
