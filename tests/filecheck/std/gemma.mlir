// The std Gemma 3 lowers to a stack of groups of six layers and a stack tail: the forward takes a
// second RoPE table (local_freqs) that the five local layers of a group rotate with and that the stack
// passes to the tail's layers (their own input freqs), the global layer rotating with freqs over full
// attention; per-head QK-norms of (1 + w).
// RUN: mdsl-opt %S/../../../modeldsl/std/models/gemma3.module | filecheck %s

// CHECK: mdsl.graph.model @Gemma3
// CHECK-SAME: rope_local_theta = 1.000000e+04 : f64
// CHECK: mdsl.graph.param @groups.local_0.attention.q_norm : !mdsl.graph.tensor<[n_layers floordiv 6, head_dim], bf16>
// CHECK: mdsl.graph.param @groups.global_layer.input_norm.weight : !mdsl.graph.tensor<[n_layers floordiv 6, d_model], bf16>
// CHECK: mdsl.graph.param @tail.input_norm.weight : !mdsl.graph.tensor<[n_layers mod 6, d_model], bf16>
// CHECK: mdsl.graph.func @forward(%tokens: !mdsl.graph.tensor<[B, T], int32>, %freqs: !mdsl.graph.tensor<[T, head_dim floordiv 2, 2], fp32>, %local_freqs: !mdsl.graph.tensor<[T, head_dim floordiv 2, 2], fp32>)
// CHECK: %x_groups = mdsl.graph.stack @groups count #mdsl.graph.expr<n_layers floordiv 6>(%x0 : {{.*}}) shared(%freqs, %local_freqs :
// CHECK: %xN = mdsl.graph.stack @tail count #mdsl.graph.expr<n_layers mod 6>(%x_groups : {{.*}}) shared(%local_freqs :
// CHECK: mdsl.graph.func @groups(
// CHECK: %q_norm_weight = mdsl.graph.add_scalar %local_0_attention_q_norm {value = 1.000000e+00 : f64
// CHECK: mdsl.graph.qk_norm %q_heads, %k_heads, %q_norm_weight, %k_norm_weight
// CHECK: mdsl.graph.rope %q, %k, %local_freqs
// CHECK: mdsl.graph.flash_attention %q_rot, %k_rot, %v {softmax_scale = 6.250000e-02 : f64, window_size = 4096 : i64, layout = "bthd"
// CHECK: mdsl.graph.rope %q_5, %k_5, %freqs
// CHECK: mdsl.graph.flash_attention %q_rot_5, %k_rot_5, %v_5 {softmax_scale = 6.250000e-02 : f64, layout = "bthd"
// CHECK: mdsl.graph.func @tail(%x: !mdsl.graph.tensor<[B, T, d_model], bf16>, %freqs:
// CHECK: mdsl.graph.rope %q, %k, %freqs
