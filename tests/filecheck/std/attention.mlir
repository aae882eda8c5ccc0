// The std attention modules (std/modules/attention/: gqa, mha, mqa) and the dense block lower to
// mdsl.graph. GQA's save: list keeps x, q_rot, k_rot, v, att and lse; the intermediates it leaves
// out are recompute, the output is not. The heads stay [B, T, H, D] (rope and attention in layout
// bthd): no transposes. MHA and MQA are GQA (their one child, gqa) with num_kv_heads fixed to
// num_heads and to 1: the same graph with H or 1 key/value heads.
// RUN: mdsl-opt %S/../../../modeldsl/std/modules/attention/gqa.module --top GQA | filecheck %s --check-prefix=ATTN
// RUN: mdsl-opt %S/../../../modeldsl/std/modules/attention/mha.module --top MHA | filecheck %s --check-prefix=MHA
// RUN: mdsl-opt %S/../../../modeldsl/std/modules/attention/mqa.module --top MQA | filecheck %s --check-prefix=MQA
// RUN: mdsl-opt %S/../../../modeldsl/std/blocks/dense.module --top DenseTransformerBlock | filecheck %s --check-prefix=BLOCK

// ATTN: mdsl.graph.model @GQA config {use_qkv_bias = false, use_qk_norm = false, sliding_window = 0 : i64, eps = 1.000000e-06 : f64, use_out_bias = false, rotary_pass = 0 : i64, softmax_scale = 0.000000e+00 : f64, qk_norm_whole = false, softcap = 0.000000e+00 : f64, qk_norm_offset = 0.000000e+00 : f64} attributes {baked = ["rotary_pass", "sliding_window"]} {
// ATTN-NEXT: mdsl.graph.param @qkv_weight : !mdsl.graph.tensor<[head_dim*num_heads + 2*head_dim*num_kv_heads, d_model], bf16>
// ATTN-NEXT: mdsl.graph.param @out_weight : !mdsl.graph.tensor<[d_model, head_dim*num_heads], bf16>
// ATTN: mdsl.graph.func @forward(%x: !mdsl.graph.tensor<[B, T, d_model], bf16>, %freqs: !mdsl.graph.tensor<[T, (head_dim - rotary_pass) floordiv 2, 2], fp32>)
// ATTN: %qkv_proj = mdsl.graph.matmul %x, %qkv_weight {transpose = "NT", memory = ["recompute"]}
// ATTN-NEXT: %q_flat, %k_flat, %v_flat = mdsl.graph.split %qkv_proj {sizes = #mdsl.graph.dims<[head_dim*num_heads, head_dim*num_kv_heads, head_dim*num_kv_heads]>, memory = ["recompute", "recompute", "recompute"]}
// ATTN: %q_heads = mdsl.graph.view {{.*}} -> !mdsl.graph.tensor<[B, T, num_heads, head_dim], bf16>
// ATTN: %k_heads = mdsl.graph.view {{.*}} -> !mdsl.graph.tensor<[B, T, num_kv_heads, head_dim], bf16>
// ATTN: %q_rot, %k_rot = mdsl.graph.rope %q_heads, %k_heads, %freqs {layout = "bthd", annotations = [#mdsl.graph.hook<BeforeAttention>], memory = ["save", "save"]}
// ATTN-NEXT: %att, %lse = mdsl.graph.flash_attention %q_rot, %k_rot, %v {layout = "bthd", memory = ["save", "save"]} :
// ATTN-NOT: mdsl.graph.transpose
// ATTN: %att_flat = mdsl.graph.view {{.*}} -> !mdsl.graph.tensor<[B, T, head_dim*num_heads], bf16>
// ATTN: %out = mdsl.graph.matmul %att_flat, %out_weight {transpose = "NT"} :
// ATTN-NOT: qk_norm

// MHA: mdsl.graph.model @MHA config {use_qkv_bias = false, use_qk_norm = false, sliding_window = 0 : i64, eps = 1.000000e-06 : f64}
// MHA-NEXT: mdsl.graph.param @gqa.qkv_weight : !mdsl.graph.tensor<[3*head_dim*num_heads, d_model], bf16>
// MHA-NEXT: mdsl.graph.param @gqa.out_weight : !mdsl.graph.tensor<[d_model, head_dim*num_heads], bf16>
// MHA-NEXT: mdsl.graph.func @forward(%x: !mdsl.graph.tensor<[B, T, d_model], bf16>, %freqs: {{.*}} attributes {kind = "forward", input_memory = {x = "save"}
// MHA: %q_flat, %k_flat, %v_flat = mdsl.graph.split %qkv_proj {sizes = #mdsl.graph.dims<[head_dim*num_heads, head_dim*num_heads, head_dim*num_heads]>
// MHA: %k_heads = mdsl.graph.view {{.*}} -> !mdsl.graph.tensor<[B, T, num_heads, head_dim], bf16>
// MHA: %att, %lse = mdsl.graph.flash_attention %q_rot, %k_rot, %v {layout = "bthd", memory = ["save", "save"]} : (!mdsl.graph.tensor<[B, T, num_heads, head_dim], bf16>, !mdsl.graph.tensor<[B, T, num_heads, head_dim], bf16>, !mdsl.graph.tensor<[B, T, num_heads, head_dim], bf16>)
// MHA: %out = mdsl.graph.matmul %att_flat, %gqa_out_weight {transpose = "NT"} :

// MQA: mdsl.graph.model @MQA config {use_qkv_bias = false, use_qk_norm = false, sliding_window = 0 : i64, eps = 1.000000e-06 : f64}
// MQA-NEXT: mdsl.graph.param @gqa.qkv_weight : !mdsl.graph.tensor<[head_dim*num_heads + 2*head_dim, d_model], bf16>
// MQA-NEXT: mdsl.graph.param @gqa.out_weight : !mdsl.graph.tensor<[d_model, head_dim*num_heads], bf16>
// MQA-NEXT: mdsl.graph.func @forward(%x: !mdsl.graph.tensor<[B, T, d_model], bf16>, %freqs: {{.*}} attributes {kind = "forward", input_memory = {x = "save"}
// MQA: %q_flat, %k_flat, %v_flat = mdsl.graph.split %qkv_proj {sizes = #mdsl.graph.dims<[head_dim*num_heads, head_dim, head_dim]>
// MQA: %k_heads = mdsl.graph.view {{.*}} -> !mdsl.graph.tensor<[B, T, 1, head_dim], bf16>
// MQA: %att, %lse = mdsl.graph.flash_attention %q_rot, %k_rot, %v {layout = "bthd", memory = ["save", "save"]} : (!mdsl.graph.tensor<[B, T, num_heads, head_dim], bf16>, !mdsl.graph.tensor<[B, T, 1, head_dim], bf16>, !mdsl.graph.tensor<[B, T, 1, head_dim], bf16>)
// MQA: %out = mdsl.graph.matmul %att_flat, %gqa_out_weight {transpose = "NT"} :

// BLOCK: mdsl.graph.model @DenseTransformerBlock
// BLOCK: mdsl.graph.param @ln1.weight : !mdsl.graph.tensor<[d_model], bf16>
// BLOCK-NEXT: mdsl.graph.param @attention.qkv_weight
// BLOCK-NEXT: mdsl.graph.param @attention.out_weight
// BLOCK-NEXT: mdsl.graph.param @ln2.weight
// BLOCK-NEXT: mdsl.graph.param @mlp.up_weight : !mdsl.graph.tensor<[2*d_ff, d_model], bf16>
// BLOCK-NEXT: mdsl.graph.param @mlp.down_weight
// BLOCK: %ln1_out, %{{.*}} = mdsl.graph.rmsnorm %x, %ln1_weight
// BLOCK: %attn_out = mdsl.graph.matmul %att_flat, %attention_out_weight {transpose = "NT", annotations = [#mdsl.graph.hook<AfterAttnOutProjection>]}
// BLOCK-NEXT: %residual_mid = mdsl.graph.add %x, %attn_out
// SwiGLU_MLP has a written backward: the mlp is called (its parameters as arguments), not inlined,
// and the flow's hook annotates the call.
// BLOCK: %mlp_out, %saved_in, %saved_gate_up = mdsl.graph.call @mlp_forward(%ln2_out, %mlp_up_weight, %mlp_down_weight) {annotations = [#mdsl.graph.hook<AfterMLPDownProjection>]}
// BLOCK-NEXT: %out = mdsl.graph.add %residual_mid, %mlp_out
// BLOCK: mdsl.graph.func @mlp_forward(%in: !mdsl.graph.tensor<[B, T, d_model], bf16>, %up_weight: !mdsl.graph.tensor<[2*d_ff, d_model], bf16>, %down_weight: !mdsl.graph.tensor<[d_model, d_ff], bf16>)
// BLOCK-SAME: attributes {kind = "helper", backward = @mlp_backward, saved = ["in", "gate_up"], params = ["up_weight", "down_weight"]}
// BLOCK-NEXT: %gate_up = mdsl.graph.matmul %in, %up_weight {transpose = "NT", memory = ["save"]}
// BLOCK-NEXT: %gate, %up = mdsl.graph.split %gate_up
// BLOCK-NEXT: %hidden = mdsl.graph.swiglu %gate, %up
// BLOCK-NEXT: %out = mdsl.graph.matmul %hidden, %down_weight {transpose = "NT"}
// BLOCK-NEXT: mdsl.graph.return %out, %in, %gate_up
// The written backward recomputes gate, up and hidden from saved.gate_up (recompute:) and returns d_in, d_up_weight, d_down_weight.
// BLOCK: mdsl.graph.func @mlp_backward(%d_out: !mdsl.graph.tensor<[B, T, d_model], bf16>, %saved_in: !mdsl.graph.tensor<[B, T, d_model], bf16>, %saved_gate_up: !mdsl.graph.tensor<[B, T, 2*d_ff], bf16>, %up_weight: {{.*}}, %down_weight: {{.*}})
// BLOCK-SAME: attributes {kind = "backward", saved = ["in", "gate_up"], grads = ["d_in", "d_up_weight", "d_down_weight"], grad_args = array<i64: 0, 1, 2>}
// BLOCK-NEXT: %gate, %up = mdsl.graph.split %saved_gate_up {{.*}}recompute
// BLOCK: mdsl.graph.swiglu_backward
// BLOCK: mdsl.graph.return %d_in, %d_up_weight, %d_down_weight
