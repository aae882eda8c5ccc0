// #mdsl.graph.sym: a primitive's parameter computed from symbols without a value yet
// (mdsl-specialize evaluates it). The custom print re-parses to itself, the generic one
// to the same IR; floor division, modulo and powers are spelled floordiv, mod and pow().
// RUN: %roundtrip %s | filecheck %s
// RUN: mdsl-opt %s --print-op-generic | mdsl-opt | filecheck %s

!s = !mdsl.graph.tensor<[B, H, T, T], bf16>
!i = !mdsl.graph.tensor<[N, 2], int32>
!o = !mdsl.graph.tensor<[E + 1], int32>
mdsl.graph.model @m {
  mdsl.graph.func @f(%s: !s, %i: !i) -> (!s, !s, !s, !o) {
    %a = mdsl.graph.scale %s {factor = #mdsl.graph.sym<1.0 / sqrt(d_head) : f64>} : (!s) -> !s
    %b = mdsl.graph.scale %s {factor = #mdsl.graph.sym<1.0 / (B * T) : f64>} : (!s) -> !s
    %c = mdsl.graph.add_scalar %s {value = #mdsl.graph.sym<-pow(2, -d) + 1.0e-06 * (H mod 4) - (T floordiv 2) : f64>} : (!s) -> !s
    %o = mdsl.graph.moe_compute_offsets %i {num_experts = #mdsl.graph.sym<E : i64>} : (!i) -> !o
    mdsl.graph.return %a, %b, %c, %o : !s, !s, !s, !o
  }
}

// CHECK: mdsl.graph.scale %s {factor = #mdsl.graph.sym<1.0 / sqrt(d_head) : f64>}
// CHECK: mdsl.graph.scale %s {factor = #mdsl.graph.sym<1.0 / (B * T) : f64>}
// CHECK: mdsl.graph.add_scalar %s {value = #mdsl.graph.sym<-pow(2, -d) + 1.0e-06 * (H mod 4) - T floordiv 2 : f64>}
// CHECK: mdsl.graph.moe_compute_offsets %i {num_experts = #mdsl.graph.sym<E : i64>} : (!mdsl.graph.tensor<[N, 2], int32>) -> !mdsl.graph.tensor<[E + 1], int32>
