// The std models lower: Llama (untied head, full attention), Qwen3 (QK-norm, tied
// head), Mistral (sliding window); one block body per model, run by a stack, its
// MLP called (SwiGLU_MLP's forward and written backward follow as helper functions).
// RUN: mdsl-opt %S/../../../modeldsl/std/models/llama.module | filecheck %s --check-prefixes=CHECK,LLAMA
// RUN: mdsl-opt %S/../../../modeldsl/std/models/qwen.module | filecheck %s --check-prefixes=CHECK,QWEN
// RUN: mdsl-opt %S/../../../modeldsl/std/models/mistral.module | filecheck %s --check-prefixes=CHECK,MISTRAL

// LLAMA: mdsl.graph.model @Llama config {vocab_size = 32000 : i64, d_model = 4096 : i64, n_layers = 32 : i64, num_heads = 32 : i64, num_kv_heads = 32 : i64, head_dim = 128 : i64, d_ff = 11008 : i64, max_seq = 4096 : i64, eps = 1.000000e-05 : f64, rope_theta = 1.000000e+04 : f64, tie_embeddings = false, attention_bias = false, mlp_bias = false}
// LLAMA-SAME: hf_config = {architecture = "LlamaForCausalLM"
// QWEN: mdsl.graph.model @Qwen3 config {vocab_size = 151936 : i64, d_model = 1024 : i64, n_layers = 28 : i64, num_heads = 16 : i64, num_kv_heads = 8 : i64, head_dim = 128 : i64
// QWEN-SAME: "blocks[{layer}].attention.q_norm" = "model.layers.{layer}.self_attn.q_norm.weight"
// MISTRAL: mdsl.graph.model @Mistral
// MISTRAL-SAME: sliding_window = 4096 : i64
// CHECK: mdsl.graph.param @embedding : !mdsl.graph.tensor<[vocab_size, d_model], bf16>
// CHECK-NEXT: mdsl.graph.param @blocks.ln1.weight : !mdsl.graph.tensor<[n_layers, d_model], bf16>
// CHECK-NEXT: mdsl.graph.param @blocks.attention.qkv_weight : !mdsl.graph.tensor<[n_layers, head_dim*num_heads + 2*head_dim*num_kv_heads, d_model], bf16>
// QWEN-NEXT: mdsl.graph.param @blocks.attention.q_norm : !mdsl.graph.tensor<[n_layers, head_dim], bf16>
// QWEN-NEXT: mdsl.graph.param @blocks.attention.k_norm : !mdsl.graph.tensor<[n_layers, head_dim], bf16>
// CHECK: mdsl.graph.param @final_norm.weight : !mdsl.graph.tensor<[d_model], bf16>
// LLAMA-NEXT: mdsl.graph.param @lm_head : !mdsl.graph.tensor<[vocab_size, d_model], bf16>
// QWEN-NOT: mdsl.graph.param @lm_head
// CHECK: mdsl.graph.func @forward(%tokens: !mdsl.graph.tensor<[B, T], int32>, %freqs: !mdsl.graph.tensor<[T, head_dim floordiv 2, 2], fp32>) -> !mdsl.graph.tensor<[B, T, vocab_size], bf16>
// CHECK: %x0 = mdsl.graph.embedding %tokens, %embedding {annotations = [#mdsl.graph.hook<AfterEmbedding>]}
// CHECK: %xN = mdsl.graph.stack @blocks count #mdsl.graph.expr<n_layers>(%x0 : !mdsl.graph.tensor<[B, T, d_model], bf16>) shared(%freqs : !mdsl.graph.tensor<[T, head_dim floordiv 2, 2], fp32>) layers(
// LLAMA: %logits = mdsl.graph.matmul %xF, %lm_head {transpose = "NT"}
// QWEN: %logits = mdsl.graph.matmul %xF, %embedding {transpose = "NT"}
// CHECK: mdsl.graph.func @blocks(%x: !mdsl.graph.tensor<[B, T, d_model], bf16>, %freqs: !mdsl.graph.tensor<[T, head_dim floordiv 2, 2], fp32>, %ln1_weight
// QWEN: mdsl.graph.qk_norm %q_heads, %k_heads, %attention_q_norm, %attention_k_norm
// LLAMA: mdsl.graph.flash_attention %q_rot, %k_rot, %v {layout = "bthd", memory = ["save", "save"]} :
// MISTRAL: mdsl.graph.flash_attention %q_rot, %k_rot, %v {window_size = 4096 : i64, layout = "bthd", memory = ["save", "save"]}
// The block's SwiGLU_MLP has a written backward: called with the layer's MLP weights.
// CHECK: %mlp_out, %{{.*}} = mdsl.graph.call @blocks_mlp_forward(%ln2_out, %mlp_up_weight, %mlp_down_weight)
// CHECK: mdsl.graph.return %out
// CHECK: mdsl.graph.func @blocks_mlp_forward({{.*}}) -> {{.*}} attributes {kind = "helper", backward = @blocks_mlp_backward, saved = ["in", "gate_up"], params = ["up_weight", "down_weight"]}
// CHECK: mdsl.graph.func @blocks_mlp_backward({{.*}}) -> {{.*}} attributes {kind = "backward", saved = ["in", "gate_up"], grads = ["d_in", "d_up_weight", "d_down_weight"], grad_args = array<i64: 0, 1, 2>}
