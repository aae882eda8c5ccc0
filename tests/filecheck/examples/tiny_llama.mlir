// The bundled example (the README's main job) parses, verifies, runs cse,dce and round-trips.
// RUN: mdsl-opt %S/../../../examples/tiny_llama.mlir -p cse,dce | filecheck %s
// RUN: mdsl-roundtrip %S/../../../examples/tiny_llama.mlir | filecheck %s

// CHECK: mdsl.graph.model @tiny_llama
// CHECK: mdsl.graph.func @block
// CHECK: mdsl.graph.flash_attention %q_rot, %k_rot, %v
// CHECK: mdsl.graph.func @forward
// CHECK: mdsl.graph.stack @block count #mdsl.graph.expr<n_layers>(%x0 : {{.*}}) shared(%freqs : {{.*}}) layers(
// CHECK: mdsl.graph.func @loss
// CHECK: mdsl.graph.fused_lm_head_loss
