// -o FILE writes the output for every input kind; '-' (or no file) reads stdin,
// as IR by default and as Module DSL with -f module.
// RUN: rm -rf %t && mkdir -p %t
// RUN: mdsl-opt %s -p dce -o %t/out.mlir && filecheck %s < %t/out.mlir
// RUN: mdsl-opt %S/Inputs/tiny.module -o %t/module.mlir && filecheck %s --check-prefix=MODULE < %t/module.mlir
// RUN: cat %s | mdsl-opt - -p dce | filecheck %s
// RUN: cat %s | mdsl-opt -p dce | filecheck %s
// RUN: cat %S/Inputs/tiny.module | mdsl-opt - -f module | filecheck %s --check-prefix=MODULE
// RUN: cat %S/Inputs/tiny.module | not mdsl-opt - 2>&1 | filecheck %s --check-prefix=STDINKIND
// RUN: not mdsl-opt %s -o %t/no/such/dir/out.mlir 2>&1 | filecheck %s --check-prefix=NOWRITE

!x = !mdsl.graph.tensor<[B, 64], fp32>
mdsl.graph.model @m {
  mdsl.graph.func @f(%x: !x) -> !x {
    %unused = mdsl.graph.silu %x : (!x) -> !x
    %y = mdsl.graph.relu %x : (!x) -> !x
    mdsl.graph.return %y : !x
  }
}

// CHECK: mdsl.graph.func @f
// CHECK-NOT: mdsl.graph.silu
// CHECK: %y = mdsl.graph.relu %x

// MODULE: mdsl.graph.model @Tiny
// MODULE: mdsl.graph.matmul

// STDINKIND: <stdin>:1:{{[0-9]+}}: error[E001]:
// STDINKIND: hint: stdin is read as IR; give -f module for Module DSL text
// NOWRITE: error[E028]: cannot write '{{.*}}out.mlir': No such file or directory
