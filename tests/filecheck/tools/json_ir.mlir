// The JSON IR round-trips through mdsl-opt: --emit=json writes it, -f json (or a .json file) reads
// it back into the same IR, which then runs through passes like any input.
// RUN: mdsl-opt %S/../../../examples/tiny_llama.mlir --emit=json | filecheck %s --check-prefix=JSON
// RUN: mdsl-opt %S/../../../examples/tiny_llama.mlir --emit=json | mdsl-opt -f json > %t.ir
// RUN: mdsl-opt %S/../../../examples/tiny_llama.mlir > %t.direct
// RUN: diff %t.ir %t.direct
// RUN: mdsl-opt %S/../../../examples/tiny_llama.mlir --emit=json | mdsl-opt -f json -p 'mdsl-specialize{B=1 T=8}' | filecheck %s

// JSON: "format": "modeldsl-ir",
// JSON-NEXT: "version": 1,
// JSON: "op": "mdsl.graph.model",
// JSON: "op": "mdsl.graph.flash_attention",

// CHECK: mdsl.graph.model @tiny_llama
// CHECK: mdsl.graph.flash_attention
// CHECK-SAME: tensor<[1, 4, 8, 16], bf16>
