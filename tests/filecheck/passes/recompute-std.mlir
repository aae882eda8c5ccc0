// mdsl-recompute on the std Llama (tiny checkpoint). Annotated: the norms' save: lists keep
// their input and rstd, not their output, so each layer's backward replays rmsnorm (once for
// both of its results: out and rstd, a group), and the attention's save: list keeps att, not
// its [B, T, q_dim] view, so the transpose and view are replayed; outside the stack the final
// norm's output is replayed before the LM head's weight gradient. Full: the layer saves its
// input alone and replays the whole block (one flash_attention for att and lse) before the
// first op of its backward.
// RUN: mdsl-opt %S/../../../modeldsl/std/models/llama.module --hf %S/../../../examples/tiny_llama -p 'mdsl-specialize{hf="%S/../../../examples/tiny_llama" B=1 T=8},mdsl-autodiff,mdsl-recompute' | filecheck %s --check-prefix=ANNOTATED
// RUN: mdsl-opt %S/../../../modeldsl/std/models/llama.module --hf %S/../../../examples/tiny_llama -p 'mdsl-specialize{hf="%S/../../../examples/tiny_llama" B=1 T=8},mdsl-autodiff,mdsl-recompute{mode=full}' | filecheck %s --check-prefix=FULL

// ANNOTATED:      func @blocks_fwd({{.*}} saved = ["residual_mid", "rstd", "q_rot", "k_rot", "v", "att", "lse", "x", "rstd"]}
// ANNOTATED-LABEL: func @blocks_bwd(
// ANNOTATED:        %ln2_out, %rstd = mdsl.graph.rmsnorm %saved_residual_mid, %ln2_weight {recompute = "ln2_out"}
// ANNOTATED-NEXT:   %blocks_mlp_d_in, {{.*}} = mdsl.graph.call @blocks_mlp_backward({{.*}}, %ln2_out,
// ANNOTATED:        mdsl.graph.transpose %saved_att {dim0 = 1 : i64, dim1 = 2 : i64, recompute = "att_flat"}
// ANNOTATED-NEXT:   %att_flat = mdsl.graph.view %{{.+}} {recompute = "att_flat"}
// ANNOTATED:        %ln1_out, %rstd_1 = mdsl.graph.rmsnorm %saved_x, %ln1_weight {recompute = "ln1_out"}
// ANNOTATED-LABEL: func @forward_grad(
// ANNOTATED:        %xF_1, %rstd_1 = mdsl.graph.rmsnorm %xN, %final_norm_weight {recompute = "xF"}
// ANNOTATED-NEXT:   mdsl.graph.matmul %d_logits, %xF_1 {transpose = "TN"}

// FULL:      func @blocks_fwd({{.*}} saved = ["x"]}
// FULL-LABEL: func @blocks_bwd(
// FULL-NEXT:   %ln1_out, %rstd = mdsl.graph.rmsnorm %saved_x, %ln1_weight {recompute = "ln2_out"}
// FULL-COUNT-1: mdsl.graph.flash_attention %q_rot, %k_rot, %v {recompute = "ln2_out"}
// FULL-NOT:    mdsl.graph.flash_attention {{.*}}recompute
// FULL:        %ln2_out, %rstd_1 = mdsl.graph.rmsnorm %residual_mid, %ln2_weight {recompute = "ln2_out"}
// FULL-NEXT:   %blocks_mlp_d_in, {{.*}} = mdsl.graph.call @blocks_mlp_backward
