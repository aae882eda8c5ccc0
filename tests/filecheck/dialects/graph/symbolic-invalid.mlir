// What a #mdsl.graph.sym must be: an expression with a symbol, of the kind its op's parameter
// is (an integer one for i64), and an integer or float parameter the op lets be symbolic.
// RUN: mdsl-opt %s --split-input-file --print-diagnostics 2>&1 | filecheck %s

!s = !mdsl.graph.tensor<[B, T], fp32>
mdsl.graph.model @m {
  mdsl.graph.func @f(%s: !s) -> !s {
    %a = mdsl.graph.scale %s {factor = #mdsl.graph.sym<1.0 / 8 : f64>} : (!s) -> !s
    mdsl.graph.return %a : !s
  }
}
// CHECK: error[{{E[0-9]+}}]: {{.*}}a symbolic attribute needs a symbol: write the value as a plain attribute

// -----

!i = !mdsl.graph.tensor<[N, 2], int32>
!o = !mdsl.graph.tensor<[E + 1], int32>
mdsl.graph.model @m {
  mdsl.graph.func @f(%i: !i) -> !o {
    %o = mdsl.graph.moe_compute_offsets %i {num_experts = #mdsl.graph.sym<E / 2 : i64>} : (!i) -> !o
    mdsl.graph.return %o : !o
  }
}
// CHECK: error[{{E[0-9]+}}]: {{.*}}'E / 2' is not an integer expression

// -----

!i = !mdsl.graph.tensor<[N, 2], int32>
!o = !mdsl.graph.tensor<[E + 1], int32>
mdsl.graph.model @m {
  mdsl.graph.func @f(%i: !i) -> !o {
    %o = mdsl.graph.moe_compute_offsets %i {num_experts = #mdsl.graph.sym<E : f64>} : (!i) -> !o
    mdsl.graph.return %o : !o
  }
}
// CHECK: error[{{E[0-9]+}}]: {{.*}}should be a #mdsl.graph.sym of kind i64

// -----

!s = !mdsl.graph.tensor<[B, T], fp32>
mdsl.graph.model @m {
  mdsl.graph.func @f(%s: !s) -> !s {
    %a = mdsl.graph.transpose %s {dim0 = #mdsl.graph.sym<d : i64>, dim1 = 1 : i64} : (!s) -> !s
    mdsl.graph.return %a : !s
  }
}
// CHECK: error[{{E[0-9]+}}]: {{.*}}#mdsl.graph.sym<d : i64> should be of base attribute integer

// -----

!s = !mdsl.graph.tensor<[B, T], fp32>
mdsl.graph.model @m {
  mdsl.graph.func @f(%s: !s) -> !s {
    %a = mdsl.graph.scale %s {factor = #mdsl.graph.sym<1.0 / cbrt(d) : f64>} : (!s) -> !s
    mdsl.graph.return %a : !s
  }
}
// CHECK: error[{{E[0-9]+}}]: {{.*}}invalid symbolic expression: unknown function 'cbrt'
