// Odd IR never reaches an internal error: each case is a coded, located diagnostic.
// RUN: mdsl-opt %s --split-input-file --print-diagnostics | filecheck %s

!x = !mdsl.graph.tensor<[B, 64], fp32>
mdsl.graph.model @m {
  mdsl.graph.func @f(%x: !x) -> !x {
    %z = mdsl.graph.relu %y : (!x) -> !x
    %y = mdsl.graph.relu %x : (!x) -> !x
    mdsl.graph.return %z : !x
  }
}
// CHECK: opt-ir-robustness.mlir:7:5: error[E017]: 'mdsl.graph.relu' op %y is used before its definition
// CHECK-NEXT: 7 |     %z = mdsl.graph.relu %y : (!x) -> !x

// -----

func.func @f(%a: i600) {
  func.return
}
// CHECK: opt-ir-robustness.mlir:17:18: error[E001]: integer type 'i600' is wider than 64 bits, the widest integer modeldsl's IR holds

// -----

func.func @f(%a: i618446744073709551616) {
  func.return
}
// CHECK: opt-ir-robustness.mlir:24:18: error[E001]: integer type 'i618446744073709551616' is wider than 64 bits

// -----

!deep = !mdsl.graph.tensor<[(((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((B)))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))], fp32>
// CHECK: opt-ir-robustness.mlir:31:29: error[E001]: invalid dimension expression: dimension expression nests deeper than 100 levels

// -----

!divs = !mdsl.graph.tensor<[B floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2 floordiv 2], fp32>
// CHECK: opt-ir-robustness.mlir:36:29: error[E001]: invalid dimension expression: dimension expression has 101 divisions, more than 100

// -----

func.func @f() attributes {s = "\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\} {
  func.return
}
// CHECK: opt-ir-robustness.mlir:41:32: error[E001]: End of file reached before closing string literal.

// -----

mdsl.graph.model @m {
  mdsl.graph.func @f(%x: !mdsl.graph.tensor<[4], fp32>) -> !mdsl.graph.tensor<[4], fp32> {
    mdsl.graph.return %x : !mdsl.graph.tensor<[4], fp32>
  }
  mdsl.graph.func @g() -> !mdsl.graph.tensor<[4], fp32> {
    mdsl.graph.return %x : !mdsl.graph.tensor<[4], fp32>
  }
}
// CHECK: opt-ir-robustness.mlir:53:23: error[E001]: value %x is used but not defined where it is visible (undefined: %x)
// CHECK-NEXT: 53 |     mdsl.graph.return %x
// CHECK-NEXT: |                       ^^{{$}}
