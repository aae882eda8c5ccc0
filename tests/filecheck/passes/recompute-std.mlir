// mdsl-recompute on the std Llama (tiny checkpoint). Annotated: the attention's save: list keeps
// att, not its [B, T, q_dim] view att_flat (an intermediate it leaves out), so each layer's
// backward replays the view before the output projection's weight gradient; the
// norms' outputs are the modules' outputs, saved because their consumers' backward reads them.
// Full: the layer saves its input alone and replays the whole block (one flash_attention for
// att and lse: an op with several results is replayed once; the MLP's gate_up projection, which its
// written backward reads saved) before the first op of its backward.
// RUN: mdsl-opt %S/../../../modeldsl/std/models/llama.module --hf %S/../../../examples/tiny_llama -p 'mdsl-specialize{hf="%S/../../../examples/tiny_llama" B=1 T=8},mdsl-autodiff,mdsl-recompute' | filecheck %s --check-prefix=ANNOTATED
// RUN: mdsl-opt %S/../../../modeldsl/std/models/llama.module --hf %S/../../../examples/tiny_llama -p 'mdsl-specialize{hf="%S/../../../examples/tiny_llama" B=1 T=8},mdsl-autodiff,mdsl-recompute{mode=full}' | filecheck %s --check-prefix=FULL

// ANNOTATED:      func @blocks_fwd({{.*}} saved = ["ln2_out", "gate_up", "residual_mid", "rstd", "q_rot", "k_rot", "v", "att", "lse", "ln1_out", "x", "rstd"]}
// ANNOTATED-LABEL: func @blocks_bwd(
// ANNOTATED:        %att_flat = mdsl.graph.view %saved_att {recompute = "att_flat"}
// ANNOTATED-NEXT:   mdsl.graph.matmul %{{.+}}, %att_flat {transpose = "TN"}
// ANNOTATED-LABEL: func @forward_grad(
// ANNOTATED-NOT:    recompute =

// FULL:      func @blocks_fwd({{.*}} saved = ["x"]}
// FULL-LABEL: func @blocks_bwd(
// FULL-NEXT:   %ln1_out, %rstd = mdsl.graph.rmsnorm %saved_x, %ln1_weight {recompute = "ln2_out"}
// FULL-COUNT-1: mdsl.graph.flash_attention %q_rot, %k_rot, %v {layout = "bthd", recompute = "ln2_out"}
// FULL-NOT:    mdsl.graph.flash_attention {{.*}}recompute
// FULL:        %ln2_out, %rstd_1 = mdsl.graph.rmsnorm %residual_mid, %ln2_weight {recompute = "ln2_out"}
// FULL-NEXT:   %gate_up = mdsl.graph.matmul %ln2_out, %mlp_up_weight {transpose = "NT", recompute = "ln2_out"}
// FULL-NEXT:   %blocks_mlp_d_in, {{.*}} = mdsl.graph.call @blocks_mlp_backward(%d_out, %ln2_out, %gate_up,
