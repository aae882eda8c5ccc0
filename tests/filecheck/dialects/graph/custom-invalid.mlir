// Verifier rules of mdsl.graph.custom: each chunk breaks one; the user primitives are those the module
// user_primitives (tests/filecheck/Inputs/user_primitives.py) registers: softplus, pair_sum.
// RUN: env PYTHONPATH=%S/../../Inputs MDSL_PRIMITIVES=user_primitives mdsl-opt %s --split-input-file --print-diagnostics | filecheck %s

!x = !mdsl.graph.tensor<[4, 8], fp32>
!y = !mdsl.graph.tensor<[4, 9], fp32>
mdsl.graph.model @m {
  mdsl.graph.func @f(%x: !x) -> !y {
    %y = mdsl.graph.custom "softplus"(%x) : (!x) -> !y
    mdsl.graph.return %y : !y
  }
}
// CHECK: custom-invalid.mlir:9:5: error[{{E[0-9]+}}]: 'mdsl.graph.custom' op softplus's output 0 is !mdsl.graph.tensor<[4, 9], fp32>, but its shape rule gives !mdsl.graph.tensor<[4, 8], fp32>

// -----

!x = !mdsl.graph.tensor<[4, 8], fp32>
mdsl.graph.model @m {
  mdsl.graph.func @f(%x: !x) -> !x {
    %y = mdsl.graph.custom "softplus"(%x, %x) : (!x, !x) -> !x
    mdsl.graph.return %y : !x
  }
}
// CHECK: custom-invalid.mlir:20:5: error[{{E[0-9]+}}]: 'mdsl.graph.custom' op softplus takes 1 tensor input(s), got 2

// -----

!x = !mdsl.graph.tensor<[4, 8], fp32>
!r = !mdsl.graph.tensor<[4], fp32>
mdsl.graph.model @m {
  mdsl.graph.func @f(%x: !x) -> !x {
    %t, %r = mdsl.graph.custom "pair_sum"(%x, %x) {mode = "cols"} : (!x, !x) -> (!x, !r)
    mdsl.graph.return %t : !x
  }
}
// CHECK: custom-invalid.mlir:32:5: error[{{E[0-9]+}}]: 'mdsl.graph.custom' op pair_sum's parameter mode: 'cols' is not one of rows, all

// -----

!x = !mdsl.graph.tensor<[4, 8], fp32>
mdsl.graph.model @m {
  mdsl.graph.func @f(%x: !x) -> !x {
    %y = mdsl.graph.custom "1softplus"(%x) : (!x) -> !x
    mdsl.graph.return %y : !x
  }
}
// CHECK: custom-invalid.mlir:43:5: error[{{E[0-9]+}}]: 'mdsl.graph.custom' op callee '1softplus' is not a primitive name (a dotted identifier)

// -----

!x = !mdsl.graph.tensor<[4, 8], fp32>
mdsl.graph.model @m {
  mdsl.graph.func @f(%x: !x) -> () {
    mdsl.graph.custom "softplus"(%x) : (!x) -> ()
    mdsl.graph.return
  }
}
// CHECK: custom-invalid.mlir:54:5: error[{{E[0-9]+}}]: 'mdsl.graph.custom' op a call of softplus has at least one result
