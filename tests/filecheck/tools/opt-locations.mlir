// As mlir-opt does, an op parsed without loc(...) gets the location of its text
// (lines of the whole file, also in --split-input-file chunks); an explicit
// loc(...) is kept; --mlir-print-debuginfo is --print-debuginfo.
// RUN: mdsl-opt %s --split-input-file --mlir-print-debuginfo | filecheck %s
// RUN: mdsl-opt %s --split-input-file --mlir-print-debuginfo | mdsl-opt --split-input-file --print-debuginfo | filecheck %s
// RUN: printf '' | mdsl-opt | filecheck %s --check-prefix=EMPTY

!x = !mdsl.graph.tensor<[B, 64], fp32>
mdsl.graph.model @m {
  mdsl.graph.func @f(%x: !x) -> !x {
    %y = mdsl.graph.relu %x : (!x) -> !x
    mdsl.graph.return %y : !x
  }
}

// -----

!x = !mdsl.graph.tensor<[B, 64], fp32>
mdsl.graph.model @n {
  mdsl.graph.func @f(%x: !x) -> !x {
    %y = mdsl.graph.relu %x : (!x) -> !x loc("model.module":12:5)
    %z = mdsl.graph.silu %y : (!x) -> !x
    mdsl.graph.return %z : !x
  }
}

// CHECK: mdsl.graph.relu {{.*}} loc("{{.*}}opt-locations.mlir":11:5)
// CHECK: mdsl.graph.return {{.*}} loc("{{.*}}opt-locations.mlir":12:5)
// CHECK: } loc("{{.*}}opt-locations.mlir":9:1)
// CHECK: // -----
// CHECK: mdsl.graph.relu {{.*}} loc("model.module":12:5)
// CHECK: mdsl.graph.silu {{.*}} loc("{{.*}}opt-locations.mlir":22:5)

// EMPTY: builtin.module {
// EMPTY-NEXT: }
