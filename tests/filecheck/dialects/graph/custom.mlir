// mdsl.graph.custom, a call of a user primitive (modeldsl.register_primitive): the custom print
// re-parses to itself, the generic print to the same IR. Without the registration it is an opaque
// call; with it (MDSL_PRIMITIVES names the module that registers softplus and pair_sum) the verifier
// checks the call against the registration, and the IR is the same.
// RUN: %roundtrip %s | filecheck %s
// RUN: env MDSL_PRIMITIVES=%S/../../Inputs/user_primitives.py %roundtrip %s | filecheck %s
// RUN: mdsl-opt %s --print-op-generic | mdsl-opt | filecheck %s

!x = !mdsl.graph.tensor<[B, T, 8], fp32>
!rows = !mdsl.graph.tensor<[B, T], fp32>

// CHECK-LABEL: mdsl.graph.func @f(
mdsl.graph.model @m {
  mdsl.graph.func @f(%x: !x, %y: !x) -> (!x, !rows) {
    // CHECK-NEXT: %s = mdsl.graph.custom "softplus"(%x) {beta = 2.000000e+00 : f64} : (!mdsl.graph.tensor<[B, T, 8], fp32>) -> !mdsl.graph.tensor<[B, T, 8], fp32>
    %s = mdsl.graph.custom "softplus"(%x) {beta = 2.0 : f64} : (!x) -> !x
    // CHECK-NEXT: %t, %r = mdsl.graph.custom "pair_sum"(%s, %y) {mode = "all", annotations = [#mdsl.graph.gradient<skip>]} : (!mdsl.graph.tensor<[B, T, 8], fp32>, !mdsl.graph.tensor<[B, T, 8], fp32>) -> (!mdsl.graph.tensor<[B, T, 8], fp32>, !mdsl.graph.tensor<[B, T], fp32>)
    %t, %r = mdsl.graph.custom "pair_sum"(%s, %y) {mode = "all", annotations = [#mdsl.graph.gradient<skip>]} : (!x, !x) -> (!x, !rows)
    // CHECK-NEXT: %z = mdsl.graph.custom "mylib.unregistered"() : () -> !mdsl.graph.tensor<[B, T], fp32>
    %z = mdsl.graph.custom "mylib.unregistered"() : () -> !rows
    mdsl.graph.return %t, %r : !x, !rows
  }
}
