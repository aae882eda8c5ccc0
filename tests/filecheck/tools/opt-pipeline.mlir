// mdsl-opt runs pipelines given with -p or --pass-pipeline (same syntax, an
// MLIR-style builtin.module(...) wrapper accepted); dce removes unused pure ops.
// RUN: mdsl-opt %s -p dce | filecheck %s
// RUN: mdsl-opt %s --pass-pipeline=dce | filecheck %s
// RUN: mdsl-opt %s --pass-pipeline='builtin.module(cse,dce)' | filecheck %s
// RUN: mdsl-opt %s -p cse,dce --print-between-passes | filecheck %s --check-prefix=BETWEEN

!x = !mdsl.graph.tensor<[B, 64], fp32>
mdsl.graph.model @m {
  mdsl.graph.func @f(%x: !x) -> !x {
    %unused = mdsl.graph.silu %x : (!x) -> !x
    %y = mdsl.graph.relu %x : (!x) -> !x
    mdsl.graph.return %y : !x
  }
}

// CHECK: mdsl.graph.func @f(%x: !mdsl.graph.tensor<[B, 64], fp32>)
// CHECK-NOT: mdsl.graph.silu
// CHECK: %y = mdsl.graph.relu %x
// CHECK-NEXT: mdsl.graph.return %y

// BETWEEN: IR after cse:
// BETWEEN: mdsl.graph.relu
// BETWEEN: mdsl.graph.model @m

// Spaces between passes are allowed, as in mlir-opt pipelines.
// RUN: mdsl-opt %s --pass-pipeline='builtin.module(cse, dce)' | filecheck %s
