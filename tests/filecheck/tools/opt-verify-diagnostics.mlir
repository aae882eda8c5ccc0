// --verify-diagnostics checks the diagnostics against expected-* annotations as
// mlir-opt does: each chunk's errors must all be expected, each expectation met.
// RUN: mdsl-opt %s --split-input-file --verify-diagnostics
// RUN: not mdsl-opt %S/Inputs/unexpected-error.mlir --verify-diagnostics 2>&1 | filecheck %s --check-prefix=UNEXPECTED
// RUN: not mdsl-opt %S/Inputs/unmet-expectation.mlir --verify-diagnostics 2>&1 | filecheck %s --check-prefix=UNMET

!a = !mdsl.graph.tensor<[4, 8], fp32>
!b = !mdsl.graph.tensor<[16, 3], fp32>
!c = !mdsl.graph.tensor<[4, 3], fp32>
mdsl.graph.model @m {
  mdsl.graph.func @f(%a: !a, %b: !b) -> !c {
    // expected-error @+1 {{inner dimensions (NN): 8 != 16}}
    %c = mdsl.graph.matmul %a, %b : (!a, !b) -> !c
    mdsl.graph.return %c : !c
  }
}

// -----

!x = !mdsl.graph.tensor<[B, 64], fp32>
mdsl.graph.model @m {
  mdsl.graph.func @f(%x: !x) -> !x {
    %z = mdsl.graph.relu %y : (!x) -> !x // expected-error {{%y is used before its definition}}
    %y = mdsl.graph.relu %x : (!x) -> !x
    mdsl.graph.return %z : !x
  }
}

// -----

mdsl.graph.model @m {
  // expected-error @below {{unknown element type 'float'}}
  mdsl.graph.param @w : !mdsl.graph.tensor<[4], float>
}

// -----

// A chunk without errors and without annotations passes.
!x = !mdsl.graph.tensor<[B, 64], fp32>
mdsl.graph.model @m {
  mdsl.graph.func @f(%x: !x) -> !x {
    mdsl.graph.return %x : !x
  }
}

// UNEXPECTED: unexpected-error.mlir:5:5: error[E041]: unexpected error: 'mdsl.graph.matmul' op inner dimensions (NN): 8 != 16
// UNEXPECTED-NEXT: 5 |     %c = mdsl.graph.matmul %a, %b : (!a, !b) -> !mdsl.graph.tensor<[4, 3], fp32>
// UNEXPECTED: hint: add an expected-error {{[{][{]}}...{{[}][}]}} annotation on that line, or fix the input

// UNMET: unmet-expectation.mlir:6:5: error[E041]: unexpected error: 'mdsl.graph.matmul' op inner dimensions (NN): 8 != 16
// UNMET: unmet-expectation.mlir:5:5: error[E029]: expected error "inner dimensions (NT)" was not produced
// UNMET-NEXT: 5 | {{.*}} @+1 {{.*}}inner dimensions (NT)
// UNMET: unmet-expectation.mlir:11:1: error[E029]: expected warning "never" was not produced
