// mdsl-specialize binds symbols and shape-only config integers everywhere:
// types, block arguments, split sizes, view shapes, stack counts.
// RUN: mdsl-opt %s -p 'mdsl-specialize{B=2 T=8}' | filecheck %s
// RUN: mdsl-opt %s -p 'mdsl-specialize{B=2 d=16}' | filecheck %s --check-prefix=OVERRIDE
// RUN: mdsl-opt %s -p 'mdsl-specialize{d=16},mdsl-specialize{B=3}' | filecheck %s --check-prefix=PARTIAL
// RUN: not mdsl-opt %s -p 'mdsl-specialize{Q=2}' 2>&1 | filecheck %s --check-prefix=UNKNOWN
// RUN: not mdsl-opt %s -p 'mdsl-specialize{n=4}' 2>&1 | filecheck %s --check-prefix=BAKED

builtin.module {
  mdsl.graph.model @M config {d = 4 : i64, n = 2 : i64} attributes {baked = ["n"]} {
    mdsl.graph.param @w : !mdsl.graph.tensor<[n, d, d], bf16>
    mdsl.graph.func @forward(%x: !mdsl.graph.tensor<[B, T, 2*d], bf16>) -> !mdsl.graph.tensor<[B, T, d], bf16> attributes {kind = "forward"} {
      %a, %b = mdsl.graph.split %x {sizes = #mdsl.graph.dims<[d, d]>} : (!mdsl.graph.tensor<[B, T, 2*d], bf16>) -> (!mdsl.graph.tensor<[B, T, d], bf16>, !mdsl.graph.tensor<[B, T, d], bf16>)
      %w = mdsl.graph.param_ref @w : !mdsl.graph.tensor<[n, d, d], bf16>
      %y = mdsl.graph.stack @layer count #mdsl.graph.expr<n> (%a : !mdsl.graph.tensor<[B, T, d], bf16>) layers(%w : !mdsl.graph.tensor<[n, d, d], bf16>) -> !mdsl.graph.tensor<[B, T, d], bf16>
      mdsl.graph.return %y : !mdsl.graph.tensor<[B, T, d], bf16>
    }
    mdsl.graph.func @layer(%h: !mdsl.graph.tensor<[B, T, d], bf16>, %lw: !mdsl.graph.tensor<[d, d], bf16>) -> !mdsl.graph.tensor<[B, T, d], bf16> attributes {kind = "block"} {
      %o = mdsl.graph.matmul %h, %lw {transpose = "NT"} : (!mdsl.graph.tensor<[B, T, d], bf16>, !mdsl.graph.tensor<[d, d], bf16>) -> !mdsl.graph.tensor<[B, T, d], bf16>
      mdsl.graph.return %o : !mdsl.graph.tensor<[B, T, d], bf16>
    }
  }
}

// CHECK: mdsl.graph.param @w : !mdsl.graph.tensor<[2, 4, 4], bf16>
// CHECK: @forward(%x: !mdsl.graph.tensor<[2, 8, 8], bf16>) -> !mdsl.graph.tensor<[2, 8, 4], bf16>
// CHECK: mdsl.graph.split %x {sizes = #mdsl.graph.dims<[4, 4]>}
// CHECK: mdsl.graph.stack @layer count #mdsl.graph.expr<2>
// CHECK: @layer(%h: !mdsl.graph.tensor<[2, 8, 4], bf16>, %lw: !mdsl.graph.tensor<[4, 4], bf16>)

// OVERRIDE: mdsl.graph.model @M config {d = 16 : i64, n = 2 : i64}
// OVERRIDE: @forward(%x: !mdsl.graph.tensor<[2, T, 32], bf16>)

// PARTIAL: @forward(%x: !mdsl.graph.tensor<[3, T, 32], bf16>)

// UNKNOWN: error[E029]: mdsl-specialize: Q is neither a config value nor a symbol of @M
// BAKED: error[E029]: mdsl-specialize: n was fixed when @M was lowered
