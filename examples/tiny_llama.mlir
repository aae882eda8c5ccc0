// A tiny Llama-shaped model in mdsl.graph: token embedding, a stack of
// n_layers pre-norm blocks (fused QKV, RoPE, GQA flash attention, SwiGLU
// MLP), a final RMSNorm, a tied LM head, and the training loss.
// Run: mdsl-opt examples/tiny_llama.mlir -p cse,dce

!h     = !mdsl.graph.tensor<[B, T, d_model], bf16>
!rows  = !mdsl.graph.tensor<[B, T], fp32>
!ids   = !mdsl.graph.tensor<[B, T], int32>
!vec   = !mdsl.graph.tensor<[d_model], bf16>
!emb   = !mdsl.graph.tensor<[vocab, d_model], bf16>
!freqs = !mdsl.graph.tensor<[T, head_dim floordiv 2, 2], fp32>
!wqkv  = !mdsl.graph.tensor<[(n_heads + 2*n_kv_heads)*head_dim, d_model], bf16>
!wo    = !mdsl.graph.tensor<[d_model, n_heads*head_dim], bf16>
!wup   = !mdsl.graph.tensor<[2*d_ff, d_model], bf16>
!wdown = !mdsl.graph.tensor<[d_model, d_ff], bf16>
!qkv   = !mdsl.graph.tensor<[B, T, (n_heads + 2*n_kv_heads)*head_dim], bf16>
!qf    = !mdsl.graph.tensor<[B, T, n_heads*head_dim], bf16>
!kf    = !mdsl.graph.tensor<[B, T, n_kv_heads*head_dim], bf16>
!q4    = !mdsl.graph.tensor<[B, T, n_heads, head_dim], bf16>
!k4    = !mdsl.graph.tensor<[B, T, n_kv_heads, head_dim], bf16>
!q     = !mdsl.graph.tensor<[B, n_heads, T, head_dim], bf16>
!k     = !mdsl.graph.tensor<[B, n_kv_heads, T, head_dim], bf16>
!lse   = !mdsl.graph.tensor<[B, n_heads, T], fp32>
!gu    = !mdsl.graph.tensor<[B, T, 2*d_ff], bf16>
!ff    = !mdsl.graph.tensor<[B, T, d_ff], bf16>
!flat  = !mdsl.graph.tensor<[B*T, d_model], bf16>
!flab  = !mdsl.graph.tensor<[B*T], int32>
!tok   = !mdsl.graph.tensor<[B*T], fp32>
!loss  = !mdsl.graph.tensor<[], fp32>
!s_vec   = !mdsl.graph.tensor<[n_layers, d_model], bf16>
!s_wqkv  = !mdsl.graph.tensor<[n_layers, (n_heads + 2*n_kv_heads)*head_dim, d_model], bf16>
!s_wo    = !mdsl.graph.tensor<[n_layers, d_model, n_heads*head_dim], bf16>
!s_wup   = !mdsl.graph.tensor<[n_layers, 2*d_ff, d_model], bf16>
!s_wdown = !mdsl.graph.tensor<[n_layers, d_model, d_ff], bf16>

mdsl.graph.model @tiny_llama config {vocab = 256 : i64, d_model = 64 : i64, n_layers = 2 : i64, n_heads = 4 : i64, n_kv_heads = 2 : i64, head_dim = 16 : i64, d_ff = 128 : i64, eps = 1.0e-05 : f64, rope_theta = 1.0e+04 : f64} {
  mdsl.graph.param @embedding : !emb
  mdsl.graph.param @blocks.ln1 : !s_vec
  mdsl.graph.param @blocks.wqkv : !s_wqkv
  mdsl.graph.param @blocks.wo : !s_wo
  mdsl.graph.param @blocks.ln2 : !s_vec
  mdsl.graph.param @blocks.w_up : !s_wup
  mdsl.graph.param @blocks.w_down : !s_wdown
  mdsl.graph.param @final_norm : !vec

  mdsl.graph.func @block(%h: !h, %freqs: !freqs, %ln1: !vec, %wqkv: !wqkv, %wo: !wo, %ln2: !vec, %w_up: !wup, %w_down: !wdown) -> !h attributes {kind = "block"} {
    %x1, %rstd1 = mdsl.graph.rmsnorm %h, %ln1 {eps = 1.0e-05 : f64} : (!h, !vec) -> (!h, !rows)
    %qkv = mdsl.graph.matmul %x1, %wqkv {transpose = "NT"} : (!h, !wqkv) -> !qkv
    %qf, %kf, %vf = mdsl.graph.split %qkv {sizes = #mdsl.graph.dims<[n_heads*head_dim, n_kv_heads*head_dim, n_kv_heads*head_dim]>} : (!qkv) -> (!qf, !kf, !kf)
    %q4 = mdsl.graph.view %qf : (!qf) -> !q4
    %k4 = mdsl.graph.view %kf : (!kf) -> !k4
    %v4 = mdsl.graph.view %vf : (!kf) -> !k4
    %q = mdsl.graph.transpose %q4 {dim0 = 1 : i64, dim1 = 2 : i64} : (!q4) -> !q
    %k = mdsl.graph.transpose %k4 {dim0 = 1 : i64, dim1 = 2 : i64} : (!k4) -> !k
    %v = mdsl.graph.transpose %v4 {dim0 = 1 : i64, dim1 = 2 : i64} : (!k4) -> !k
    %q_rot, %k_rot = mdsl.graph.rope %q, %k, %freqs : (!q, !k, !freqs) -> (!q, !k)
    %att, %lse = mdsl.graph.flash_attention %q_rot, %k_rot, %v : (!q, !k, !k) -> (!q, !lse)
    %att_t = mdsl.graph.transpose %att {dim0 = 1 : i64, dim1 = 2 : i64} : (!q) -> !q4
    %att_f = mdsl.graph.view %att_t : (!q4) -> !qf
    %proj = mdsl.graph.matmul %att_f, %wo {transpose = "NT"} : (!qf, !wo) -> !h
    %mid, %x2, %rstd2 = mdsl.graph.fused_residual_rmsnorm %h, %proj, %ln2 {eps = 1.0e-05 : f64} : (!h, !h, !vec) -> (!h, !h, !rows)
    %gate_up = mdsl.graph.matmul %x2, %w_up {transpose = "NT"} : (!h, !wup) -> !gu
    %gate, %up = mdsl.graph.split %gate_up {sizes = #mdsl.graph.dims<[d_ff, d_ff]>} : (!gu) -> (!ff, !ff)
    %act = mdsl.graph.swiglu %gate, %up : (!ff, !ff) -> !ff
    %down = mdsl.graph.matmul %act, %w_down {transpose = "NT"} : (!ff, !wdown) -> !h
    %out = mdsl.graph.add %mid, %down : (!h, !h) -> !h
    mdsl.graph.return %out : !h
  }

  mdsl.graph.func @forward(%tokens: !ids, %freqs: !freqs) -> !mdsl.graph.tensor<[B, T, vocab], bf16> attributes {kind = "forward"} {
    %emb = mdsl.graph.param_ref @embedding : !emb
    %x0 = mdsl.graph.embedding %tokens, %emb : (!ids, !emb) -> !h
    %ln1 = mdsl.graph.param_ref @blocks.ln1 : !s_vec
    %wqkv = mdsl.graph.param_ref @blocks.wqkv : !s_wqkv
    %wo = mdsl.graph.param_ref @blocks.wo : !s_wo
    %ln2 = mdsl.graph.param_ref @blocks.ln2 : !s_vec
    %w_up = mdsl.graph.param_ref @blocks.w_up : !s_wup
    %w_down = mdsl.graph.param_ref @blocks.w_down : !s_wdown
    %hN = mdsl.graph.stack @block count #mdsl.graph.expr<n_layers> (%x0 : !h) shared(%freqs : !freqs) layers(%ln1, %wqkv, %wo, %ln2, %w_up, %w_down : !s_vec, !s_wqkv, !s_wo, !s_vec, !s_wup, !s_wdown) -> !h
    %gf = mdsl.graph.param_ref @final_norm : !vec
    %xf, %rstd = mdsl.graph.rmsnorm %hN, %gf {eps = 1.0e-05 : f64} : (!h, !vec) -> (!h, !rows)
    %logits = mdsl.graph.matmul %xf, %emb {transpose = "NT"} : (!h, !emb) -> !mdsl.graph.tensor<[B, T, vocab], bf16>
    mdsl.graph.return %logits : !mdsl.graph.tensor<[B, T, vocab], bf16>
  }

  mdsl.graph.func @loss(%tokens: !ids, %freqs: !freqs, %labels: !flab) -> !loss attributes {kind = "forward"} {
    %emb = mdsl.graph.param_ref @embedding : !emb
    %x0 = mdsl.graph.embedding %tokens, %emb : (!ids, !emb) -> !h
    %ln1 = mdsl.graph.param_ref @blocks.ln1 : !s_vec
    %wqkv = mdsl.graph.param_ref @blocks.wqkv : !s_wqkv
    %wo = mdsl.graph.param_ref @blocks.wo : !s_wo
    %ln2 = mdsl.graph.param_ref @blocks.ln2 : !s_vec
    %w_up = mdsl.graph.param_ref @blocks.w_up : !s_wup
    %w_down = mdsl.graph.param_ref @blocks.w_down : !s_wdown
    %hN = mdsl.graph.stack @block count #mdsl.graph.expr<n_layers> (%x0 : !h) shared(%freqs : !freqs) layers(%ln1, %wqkv, %wo, %ln2, %w_up, %w_down : !s_vec, !s_wqkv, !s_wo, !s_vec, !s_wup, !s_wdown) -> !h
    %gf = mdsl.graph.param_ref @final_norm : !vec
    %xf, %rstd = mdsl.graph.rmsnorm %hN, %gf {eps = 1.0e-05 : f64} : (!h, !vec) -> (!h, !rows)
    %flat = mdsl.graph.view %xf : (!h) -> !flat
    %loss, %lse = mdsl.graph.fused_lm_head_loss %flat, %emb, %labels : (!flat, !emb, !flab) -> (!loss, !tok)
    mdsl.graph.return %loss : !loss
  }
}
