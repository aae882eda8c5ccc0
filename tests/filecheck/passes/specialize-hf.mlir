// The configuration of a checkpoint: mdsl-opt --hf lowers with it, and
// mdsl-specialize{hf=...} binds it (refusing values lowering already fixed).
// RUN: mdsl-opt %S/../../../modeldsl/std/models/llama.module --hf %S/../../../examples/tiny_llama -p 'mdsl-specialize{hf="%S/../../../examples/tiny_llama" B=1 T=8}' | filecheck %s
// RUN: not mdsl-opt %S/../../../modeldsl/std/models/llama.module -p 'mdsl-specialize{hf="%S/../../../examples/tiny_llama"}' 2>&1 | filecheck %s --check-prefix=FIXED
// RUN: not mdsl-opt %S/../../../modeldsl/std/models/llama.module --hf %S 2>&1 | filecheck %s --check-prefix=NOCONFIG

// CHECK: mdsl.graph.model @Llama config {vocab_size = 384 : i64, d_model = 64 : i64, n_layers = 2 : i64, num_heads = 4 : i64, num_kv_heads = 2 : i64, head_dim = 16 : i64, d_ff = 172 : i64
// CHECK: mdsl.graph.param @blocks.attention.qkv_weight : !mdsl.graph.tensor<[2, 128, 64], bf16>
// CHECK: mdsl.graph.func @forward(%tokens: !mdsl.graph.tensor<[1, 8], int32>, %freqs: !mdsl.graph.tensor<[8, 8, 2], fp32>) -> !mdsl.graph.tensor<[1, 8, 384], bf16>

// FIXED: error[E029]: mdsl-specialize: eps was fixed when @Llama was lowered
// NOCONFIG: error[E030]: '{{.*}}' has no config.json
