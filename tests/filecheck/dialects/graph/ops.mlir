// Every op of mdsl.graph in its custom form: the custom print re-parses to
// itself, the generic print re-parses to the same IR.
// RUN: %roundtrip %s | filecheck %s
// RUN: mdsl-opt %s --print-op-generic | mdsl-opt | filecheck %s

!x = !mdsl.graph.tensor<[B, T, C], bf16>
!rows = !mdsl.graph.tensor<[B, T], fp32>
!w = !mdsl.graph.tensor<[C, C], bf16>
!vec = !mdsl.graph.tensor<[C], bf16>
!q = !mdsl.graph.tensor<[B, H, T, D], bf16>
!kv = !mdsl.graph.tensor<[B, Hkv, T, D], bf16>
!qs = !mdsl.graph.tensor<[B, H, T], fp32>
!ks = !mdsl.graph.tensor<[B, Hkv, T], fp32>
!hv = !mdsl.graph.tensor<[D], bf16>
!hslopes = !mdsl.graph.tensor<[H], fp32>
!freqs = !mdsl.graph.tensor<[T, D floordiv 2, 2], fp32>
!ids = !mdsl.graph.tensor<[B, T], int32>
!emb = !mdsl.graph.tensor<[V, C], bf16>
!flat = !mdsl.graph.tensor<[B*T, C], bf16>
!flatids = !mdsl.graph.tensor<[B*T], int32>
!logits = !mdsl.graph.tensor<[B*T, V], fp32>
!tok = !mdsl.graph.tensor<[B*T], fp32>
!scalar = !mdsl.graph.tensor<[], fp32>
!stacked = !mdsl.graph.tensor<[n_layers, C, C], bf16>

// CHECK: mdsl.graph.model @tiny config {d_model = 64 : i64, n_layers = 2 : i64} attributes {hf_config = {hidden_size = "d_model"}} {
mdsl.graph.model @tiny config {d_model = 64 : i64, n_layers = 2 : i64} attributes {hf_config = {hidden_size = "d_model"}} {
  // CHECK-NEXT: mdsl.graph.param @embed : !mdsl.graph.tensor<[V, C], bf16> {annotations = [#mdsl.graph.trainable<lr_scale = 0.1>, #mdsl.graph.shard<column, tp_size = 2>]}
  mdsl.graph.param @embed : !emb {annotations = [#mdsl.graph.trainable<lr_scale = 0.1>, #mdsl.graph.shard<column, tp_size = 2>]}
  // CHECK-NEXT: mdsl.graph.param @blocks.w : !mdsl.graph.tensor<[n_layers, C, C], bf16>
  mdsl.graph.param @blocks.w : !stacked
  // CHECK-NEXT: mdsl.graph.param @norm : !mdsl.graph.tensor<[C], bf16> {annotations = [#mdsl.graph.frozen]}
  mdsl.graph.param @norm : !vec {annotations = [#mdsl.graph.frozen]}

  // CHECK: mdsl.graph.func @block(%h: !mdsl.graph.tensor<[B, T, C], bf16>, %w: !mdsl.graph.tensor<[C, C], bf16>) -> !mdsl.graph.tensor<[B, T, C], bf16> attributes {kind = "block"} {
  mdsl.graph.func @block(%h: !x, %w: !w) -> !x attributes {kind = "block"} {
    // CHECK-NEXT: %y = mdsl.graph.matmul %h, %w {transpose = "NT"} : (!mdsl.graph.tensor<[B, T, C], bf16>, !mdsl.graph.tensor<[C, C], bf16>) -> !mdsl.graph.tensor<[B, T, C], bf16>
    %y = mdsl.graph.matmul %h, %w {transpose = "NT"} : (!x, !w) -> !x
    // CHECK-NEXT: mdsl.graph.return %y : !mdsl.graph.tensor<[B, T, C], bf16>
    mdsl.graph.return %y : !x
  }

  // A body with a collected result (after its carried one): a stack holds it layer by layer.
  // CHECK: mdsl.graph.func @block_saving(%h: !mdsl.graph.tensor<[B, T, C], bf16>, %w: !mdsl.graph.tensor<[C, C], bf16>) -> (!mdsl.graph.tensor<[B, T, C], bf16>, !mdsl.graph.tensor<[B, T, C], bf16>)
  mdsl.graph.func @block_saving(%h: !x, %w: !w) -> (!x, !x) attributes {kind = "block"} {
    %y = mdsl.graph.matmul %h, %w {transpose = "NT"} : (!x, !w) -> !x
    mdsl.graph.return %y, %h : !x, !x
  }

  // CHECK: mdsl.graph.func @forward
  mdsl.graph.func @forward(%x: !x, %r: !x, %w: !w, %ids: !ids, %q: !q, %k: !kv, %v: !kv, %freqs: !freqs, %labels: !flatids) -> !x attributes {kind = "forward"} {
    // CHECK: mdsl.graph.param_ref @embed : !mdsl.graph.tensor<[V, C], bf16>
    %e = mdsl.graph.param_ref @embed : !emb
    %sw = mdsl.graph.param_ref @blocks.w : !stacked
    %g = mdsl.graph.param_ref @norm : !vec
    // CHECK: mdsl.graph.stack @block count #mdsl.graph.expr<n_layers>(%x : !mdsl.graph.tensor<[B, T, C], bf16>) layers(%sw : !mdsl.graph.tensor<[n_layers, C, C], bf16>) -> !mdsl.graph.tensor<[B, T, C], bf16>
    %s = mdsl.graph.stack @block count #mdsl.graph.expr<n_layers> (%x : !x) layers(%sw : !stacked) -> !x
    // CHECK: mdsl.graph.stack @block count #mdsl.graph.expr<n_layers>(%x : !mdsl.graph.tensor<[B, T, C], bf16>) shared(%w : !mdsl.graph.tensor<[C, C], bf16>) -> !mdsl.graph.tensor<[B, T, C], bf16>
    %s0 = mdsl.graph.stack @block count #mdsl.graph.expr<n_layers> (%x : !x) shared(%w : !w) -> !x
    // CHECK: %{{.+}}, %{{.+}} = mdsl.graph.stack @block_saving count #mdsl.graph.expr<n_layers> reverse(%x : !mdsl.graph.tensor<[B, T, C], bf16>) layers(%sw : !mdsl.graph.tensor<[n_layers, C, C], bf16>) -> !mdsl.graph.tensor<[B, T, C], bf16>, !mdsl.graph.tensor<[n_layers, B, T, C], bf16>
    %sr, %saved = mdsl.graph.stack @block_saving count #mdsl.graph.expr<n_layers> reverse (%x : !x) layers(%sw : !stacked) -> !x, !mdsl.graph.tensor<[n_layers, B, T, C], bf16>
    // CHECK: mdsl.graph.call @block(%s, %w) : (!mdsl.graph.tensor<[B, T, C], bf16>, !mdsl.graph.tensor<[C, C], bf16>) -> !mdsl.graph.tensor<[B, T, C], bf16>
    %c = mdsl.graph.call @block(%s, %w) : (!x, !w) -> !x

    // 6.1 linear algebra
    // CHECK: mdsl.graph.matmul %w, %w {transpose = "TT", accumulate = true, alpha = 5.000000e-01 : f64, beta = 1.000000e+00 : f64}
    %mm = mdsl.graph.matmul %w, %w {transpose = "TT", accumulate = true, alpha = 0.5 : f64, beta = 1.0 : f64} : (!w, !w) -> !w
    // CHECK: mdsl.graph.batched_matmul %q, %q {transpose = "NT"} : (!mdsl.graph.tensor<[B, H, T, D], bf16>, !mdsl.graph.tensor<[B, H, T, D], bf16>) -> !mdsl.graph.tensor<[B, H, T, T], bf16>
    %bmm = mdsl.graph.batched_matmul %q, %q {transpose = "NT"} : (!q, !q) -> !mdsl.graph.tensor<[B, H, T, T], bf16>
    // CHECK: mdsl.graph.batched_matmul %q, %q {transpose = "NT", alpha = 1.250000e-01 : f64} :
    %bmm_scaled = mdsl.graph.batched_matmul %q, %q {transpose = "NT", alpha = 0.125 : f64} : (!q, !q) -> !mdsl.graph.tensor<[B, H, T, T], bf16>
    // CHECK: mdsl.graph.grouped_gemm %{{.*}}, %{{.*}}, %{{.*}} : (!mdsl.graph.tensor<[N, C], bf16>, !mdsl.graph.tensor<[E, F, C], bf16>, !mdsl.graph.tensor<[E + 1], int32>) -> !mdsl.graph.tensor<[N, F], bf16>
    %gx = mdsl.graph.zeros : !mdsl.graph.tensor<[N, C], bf16>
    %gw = mdsl.graph.zeros : !mdsl.graph.tensor<[E, F, C], bf16>
    %goff = mdsl.graph.zeros : !mdsl.graph.tensor<[E + 1], int32>
    %gy = mdsl.graph.grouped_gemm %gx, %gw, %goff : (!mdsl.graph.tensor<[N, C], bf16>, !mdsl.graph.tensor<[E, F, C], bf16>, !mdsl.graph.tensor<[E + 1], int32>) -> !mdsl.graph.tensor<[N, F], bf16>
    // the spec's default TN is not printed; NN takes weights [E, C, F], NT and TT the input as [C, N]
    // CHECK: mdsl.graph.grouped_gemm %gx, %gwn, %goff {transpose = "NN"} : (!mdsl.graph.tensor<[N, C], bf16>, !mdsl.graph.tensor<[E, C, F], bf16>, !mdsl.graph.tensor<[E + 1], int32>) -> !mdsl.graph.tensor<[N, F], bf16>
    %gwn = mdsl.graph.zeros : !mdsl.graph.tensor<[E, C, F], bf16>
    %gyn = mdsl.graph.grouped_gemm %gx, %gwn, %goff {transpose = "NN"} : (!mdsl.graph.tensor<[N, C], bf16>, !mdsl.graph.tensor<[E, C, F], bf16>, !mdsl.graph.tensor<[E + 1], int32>) -> !mdsl.graph.tensor<[N, F], bf16>
    // CHECK: mdsl.graph.grouped_gemm %gxt, %gwn, %goff {transpose = "NT"} : (!mdsl.graph.tensor<[C, N], bf16>, !mdsl.graph.tensor<[E, C, F], bf16>, !mdsl.graph.tensor<[E + 1], int32>) -> !mdsl.graph.tensor<[N, F], bf16>
    %gxt = mdsl.graph.zeros : !mdsl.graph.tensor<[C, N], bf16>
    %gynt = mdsl.graph.grouped_gemm %gxt, %gwn, %goff {transpose = "NT"} : (!mdsl.graph.tensor<[C, N], bf16>, !mdsl.graph.tensor<[E, C, F], bf16>, !mdsl.graph.tensor<[E + 1], int32>) -> !mdsl.graph.tensor<[N, F], bf16>
    // CHECK: mdsl.graph.grouped_gemm %gxt, %gw, %goff {transpose = "TT"} : (!mdsl.graph.tensor<[C, N], bf16>, !mdsl.graph.tensor<[E, F, C], bf16>, !mdsl.graph.tensor<[E + 1], int32>) -> !mdsl.graph.tensor<[N, F], bf16>
    %gytt = mdsl.graph.grouped_gemm %gxt, %gw, %goff {transpose = "TT"} : (!mdsl.graph.tensor<[C, N], bf16>, !mdsl.graph.tensor<[E, F, C], bf16>, !mdsl.graph.tensor<[E + 1], int32>) -> !mdsl.graph.tensor<[N, F], bf16>
    // CHECK: mdsl.graph.grouped_gemm_weight_grad
    %gdw = mdsl.graph.grouped_gemm_weight_grad %gx, %gy, %goff : (!mdsl.graph.tensor<[N, C], bf16>, !mdsl.graph.tensor<[N, F], bf16>, !mdsl.graph.tensor<[E + 1], int32>) -> !mdsl.graph.tensor<[E, F, C], bf16>

    // linear_bias_act: one GEMM with the bias (+ activation) epilogue; out and the pre-activation
    // CHECK: %lo, %lpre = mdsl.graph.linear_bias_act %x, %w, %g {activation = "gelu", alpha = 5.000000e-01 : f64} : (!mdsl.graph.tensor<[B, T, C], bf16>, !mdsl.graph.tensor<[C, C], bf16>, !mdsl.graph.tensor<[C], bf16>) -> (!mdsl.graph.tensor<[B, T, C], bf16>, !mdsl.graph.tensor<[B, T, C], bf16>)
    %lo, %lpre = mdsl.graph.linear_bias_act %x, %w, %g {activation = "gelu", alpha = 0.5 : f64} : (!x, !w, !vec) -> (!x, !x)

    // 6.2 normalization
    // CHECK: mdsl.graph.rmsnorm %x, %g {eps = 1.000000e-05 : f64} : (!mdsl.graph.tensor<[B, T, C], bf16>, !mdsl.graph.tensor<[C], bf16>) -> (!mdsl.graph.tensor<[B, T, C], bf16>, !mdsl.graph.tensor<[B, T], fp32>)
    %n, %rstd = mdsl.graph.rmsnorm %x, %g {eps = 1.0e-05 : f64} : (!x, !vec) -> (!x, !rows)
    // CHECK: mdsl.graph.rmsnorm_backward %x, %x, %g, %rstd :
    %dx, %dg = mdsl.graph.rmsnorm_backward %x, %x, %g, %rstd : (!x, !x, !vec, !rows) -> (!x, !vec)
    // CHECK: mdsl.graph.fused_residual_rmsnorm %r, %x, %g :
    %ro, %fy, %frstd = mdsl.graph.fused_residual_rmsnorm %r, %x, %g : (!x, !x, !vec) -> (!x, !x, !rows)
    // CHECK: mdsl.graph.fused_residual_rmsnorm_backward %x, %x, %ro, %g, %frstd :
    %d1, %d2, %d3 = mdsl.graph.fused_residual_rmsnorm_backward %x, %x, %ro, %g, %frstd : (!x, !x, !x, !vec, !rows) -> (!x, !x, !vec)
    // CHECK: mdsl.graph.layernorm %x, %g, %g :
    %ln, %lm, %lr = mdsl.graph.layernorm %x, %g, %g : (!x, !vec, !vec) -> (!x, !rows, !rows)
    // CHECK: mdsl.graph.layernorm %x, %g {eps = 1.000000e-06 : f64} :
    %ln2, %lm2, %lr2 = mdsl.graph.layernorm %x, %g {eps = 1.0e-06 : f64} : (!x, !vec) -> (!x, !rows, !rows)
    // CHECK: mdsl.graph.layernorm_backward %x, %x, %g, %lm, %lr : {{.*}} -> (!mdsl.graph.tensor<[B, T, C], bf16>, !mdsl.graph.tensor<[C], bf16>, !mdsl.graph.tensor<[C], bf16>)
    %lb1, %lb2, %lb3 = mdsl.graph.layernorm_backward %x, %x, %g, %lm, %lr : (!x, !x, !vec, !rows, !rows) -> (!x, !vec, !vec)
    // CHECK: mdsl.graph.layernorm_backward %x, %x, %g, %lm, %lr : {{.*}} -> (!mdsl.graph.tensor<[B, T, C], bf16>, !mdsl.graph.tensor<[C], bf16>)
    %lc1, %lc2 = mdsl.graph.layernorm_backward %x, %x, %g, %lm, %lr : (!x, !x, !vec, !rows, !rows) -> (!x, !vec)

    // 6.3 activations
    // CHECK: mdsl.graph.swiglu %x, %r :
    %sg = mdsl.graph.swiglu %x, %r : (!x, !x) -> !x
    // CHECK: mdsl.graph.swiglu_backward %x, %x, %r :
    %sg1, %sg2 = mdsl.graph.swiglu_backward %x, %x, %r : (!x, !x, !x) -> (!x, !x)
    // CHECK: mdsl.graph.geglu %x, %r : (!mdsl.graph.tensor<[B, T, C], bf16>, !mdsl.graph.tensor<[B, T, C], bf16>) -> !mdsl.graph.tensor<[B, T, C], bf16>
    %gg = mdsl.graph.geglu %x, %r : (!x, !x) -> !x
    // CHECK: mdsl.graph.geglu_backward %x, %x, %r :
    %gg1, %gg2 = mdsl.graph.geglu_backward %x, %x, %r : (!x, !x, !x) -> (!x, !x)
    // CHECK: mdsl.graph.fused_split_swiglu %fgu : (!mdsl.graph.tensor<[B, T, 2*C], bf16>) -> !mdsl.graph.tensor<[B, T, C], bf16>
    %fgu = mdsl.graph.concat %x, %r : (!x, !x) -> !mdsl.graph.tensor<[B, T, 2 * C], bf16>
    %fsg = mdsl.graph.fused_split_swiglu %fgu : (!mdsl.graph.tensor<[B, T, 2 * C], bf16>) -> !x
    // CHECK: mdsl.graph.fused_split_swiglu_backward %x, %fgu :
    %fsg1 = mdsl.graph.fused_split_swiglu_backward %x, %fgu : (!x, !mdsl.graph.tensor<[B, T, 2 * C], bf16>) -> !mdsl.graph.tensor<[B, T, 2 * C], bf16>
    // CHECK: mdsl.graph.fused_split_geglu %fgu :
    %fgg = mdsl.graph.fused_split_geglu %fgu : (!mdsl.graph.tensor<[B, T, 2 * C], bf16>) -> !x
    // CHECK: mdsl.graph.fused_split_geglu_backward %x, %fgu :
    %fgg1 = mdsl.graph.fused_split_geglu_backward %x, %fgu : (!x, !mdsl.graph.tensor<[B, T, 2 * C], bf16>) -> !mdsl.graph.tensor<[B, T, 2 * C], bf16>
    // CHECK: mdsl.graph.silu %x {annotations = [#mdsl.graph.memory<recompute>, #mdsl.graph.hook<AfterMLPActivation, mode = modify>]} :
    %a1 = mdsl.graph.silu %x {annotations = [#mdsl.graph.memory<recompute>, #mdsl.graph.hook<AfterMLPActivation, mode = modify>]} : (!x) -> !x
    // CHECK: mdsl.graph.silu_backward %x, %x :
    %a2 = mdsl.graph.silu_backward %x, %x : (!x, !x) -> !x
    // CHECK: mdsl.graph.relu %x :
    %a3 = mdsl.graph.relu %x : (!x) -> !x
    // CHECK: mdsl.graph.relu_backward %x, %x :
    %a4 = mdsl.graph.relu_backward %x, %x : (!x, !x) -> !x
    // CHECK: mdsl.graph.relu2 %x :
    %a5 = mdsl.graph.relu2 %x : (!x) -> !x
    // CHECK: mdsl.graph.relu2_backward %x, %x :
    %a6 = mdsl.graph.relu2_backward %x, %x : (!x, !x) -> !x
    // CHECK: mdsl.graph.gelu %x {approximate = false} :
    %a7 = mdsl.graph.gelu %x {approximate = false} : (!x) -> !x
    // CHECK: mdsl.graph.gelu_backward %x, %x :
    %a8 = mdsl.graph.gelu_backward %x, %x : (!x, !x) -> !x
    // CHECK: mdsl.graph.softmax %x {dim = 1 : i64} :
    %sm = mdsl.graph.softmax %x {dim = 1 : i64} : (!x) -> !x
    // CHECK: mdsl.graph.softmax_backward %x, %sm :
    %smb = mdsl.graph.softmax_backward %x, %sm : (!x, !x) -> !x
    // CHECK: mdsl.graph.causal_mask %x :
    %cm = mdsl.graph.causal_mask %x : (!x) -> !x
    // CHECK: mdsl.graph.causal_mask %q {offset = 3 : i64, window_size = 2 : i64, fill = "zero"} :
    %cmw = mdsl.graph.causal_mask %q {offset = 3 : i64, window_size = 2 : i64, fill = "zero"} : (!q) -> !q

    // 6.4 attention
    // CHECK: mdsl.graph.flash_attention %q, %k, %v {window_size = 4096 : i64} : (!mdsl.graph.tensor<[B, H, T, D], bf16>, !mdsl.graph.tensor<[B, Hkv, T, D], bf16>, !mdsl.graph.tensor<[B, Hkv, T, D], bf16>) -> (!mdsl.graph.tensor<[B, H, T, D], bf16>, !mdsl.graph.tensor<[B, H, T], fp32>)
    %o, %lse = mdsl.graph.flash_attention %q, %k, %v {window_size = 4096 : i64} : (!q, !kv, !kv) -> (!q, !qs)
    // CHECK: mdsl.graph.flash_attention %q, %k, %v, %{{.*}} {causal = false, softmax_scale = 1.250000e-01 : f64} :
    %slopes = mdsl.graph.zeros : !hslopes
    %o2, %lse2 = mdsl.graph.flash_attention %q, %k, %v, %slopes {causal = false, softmax_scale = 0.125 : f64} : (!q, !kv, !kv, !hslopes) -> (!q, !qs)
    // CHECK: mdsl.graph.flash_attention_backward %q, %q, %k, %v, %o, %lse :
    %fq, %fk, %fv = mdsl.graph.flash_attention_backward %q, %q, %k, %v, %o, %lse : (!q, !q, !kv, !kv, !q, !qs) -> (!q, !kv, !kv)
    // CHECK: mdsl.graph.flash_attention_backward %q, %q, %k, %v, %o2, %lse2, %slopes {causal = false} : (!mdsl.graph.tensor<[B, H, T, D], bf16>, !mdsl.graph.tensor<[B, H, T, D], bf16>, !mdsl.graph.tensor<[B, Hkv, T, D], bf16>, !mdsl.graph.tensor<[B, Hkv, T, D], bf16>, !mdsl.graph.tensor<[B, H, T, D], bf16>, !mdsl.graph.tensor<[B, H, T], fp32>, !mdsl.graph.tensor<[H], fp32>) -> (!mdsl.graph.tensor<[B, H, T, D], bf16>, !mdsl.graph.tensor<[B, Hkv, T, D], bf16>, !mdsl.graph.tensor<[B, Hkv, T, D], bf16>)
    %aq, %ak, %av = mdsl.graph.flash_attention_backward %q, %q, %k, %v, %o2, %lse2, %slopes {causal = false} : (!q, !q, !kv, !kv, !q, !qs, !hslopes) -> (!q, !kv, !kv)
    // CHECK: mdsl.graph.rope %q, %k, %freqs {interleaved = true} : (!mdsl.graph.tensor<[B, H, T, D], bf16>, !mdsl.graph.tensor<[B, Hkv, T, D], bf16>, !mdsl.graph.tensor<[T, D floordiv 2, 2], fp32>)
    %qr, %kr = mdsl.graph.rope %q, %k, %freqs {interleaved = true} : (!q, !kv, !freqs) -> (!q, !kv)
    // CHECK: mdsl.graph.rope_backward %qr, %kr, %freqs :
    %dq, %dk = mdsl.graph.rope_backward %qr, %kr, %freqs : (!q, !kv, !freqs) -> (!q, !kv)
    // CHECK: %hw = mdsl.graph.ones : !mdsl.graph.tensor<[D], bf16>
    %hw = mdsl.graph.ones : !hv
    // CHECK: mdsl.graph.qk_norm %q, %k, %hw, %hw :
    %qn, %kn, %qrs, %krs = mdsl.graph.qk_norm %q, %k, %hw, %hw : (!q, !kv, !hv, !hv) -> (!q, !kv, !qs, !ks)
    // CHECK: mdsl.graph.qk_norm_backward %qn, %kn, %q, %k, %hw, %hw, %qrs, %krs :
    %b1, %b2, %b3, %b4 = mdsl.graph.qk_norm_backward %qn, %kn, %q, %k, %hw, %hw, %qrs, %krs : (!q, !kv, !q, !kv, !hv, !hv, !qs, !ks) -> (!q, !kv, !hv, !hv)
    // CHECK: mdsl.graph.fused_qk_norm_rope %q, %k, %hw, %hw, %freqs {eps = 1.000000e-05 : f64, interleaved = true} :
    %fqr, %fkr, %fqs, %fks = mdsl.graph.fused_qk_norm_rope %q, %k, %hw, %hw, %freqs {eps = 1.0e-05 : f64, interleaved = true} : (!q, !kv, !hv, !hv, !freqs) -> (!q, !kv, !qs, !ks)
    // CHECK: mdsl.graph.fused_qk_norm_rope_backward %fqr, %fkr, %q, %k, %hw, %hw, %fqs, %fks, %freqs :
    %e1, %e2, %e3, %e4 = mdsl.graph.fused_qk_norm_rope_backward %fqr, %fkr, %q, %k, %hw, %hw, %fqs, %fks, %freqs : (!q, !kv, !q, !kv, !hv, !hv, !qs, !ks, !freqs) -> (!q, !kv, !hv, !hv)

    // 6.5 tensor manipulation
    %gu = mdsl.graph.zeros : !mdsl.graph.tensor<[B, T, 2*F], bf16>
    // CHECK: mdsl.graph.split %gu {sizes = #mdsl.graph.dims<[F, F]>} : (!mdsl.graph.tensor<[B, T, 2*F], bf16>) -> (!mdsl.graph.tensor<[B, T, F], bf16>, !mdsl.graph.tensor<[B, T, F], bf16>)
    %s1, %s2 = mdsl.graph.split %gu {sizes = #mdsl.graph.dims<[F, F]>} : (!mdsl.graph.tensor<[B, T, 2*F], bf16>) -> (!mdsl.graph.tensor<[B, T, F], bf16>, !mdsl.graph.tensor<[B, T, F], bf16>)
    // CHECK: mdsl.graph.split %x {sizes = #mdsl.graph.dims<[4, C - 4]>, dim = 2 : i64} :
    %s3, %s4 = mdsl.graph.split %x {sizes = #mdsl.graph.dims<[4, C - 4]>, dim = 2 : i64} : (!x) -> (!mdsl.graph.tensor<[B, T, 4], bf16>, !mdsl.graph.tensor<[B, T, C - 4], bf16>)
    // CHECK: mdsl.graph.concat %s1, %s2 : (!mdsl.graph.tensor<[B, T, F], bf16>, !mdsl.graph.tensor<[B, T, F], bf16>) -> !mdsl.graph.tensor<[B, T, 2*F], bf16>
    %cat = mdsl.graph.concat %s1, %s2 : (!mdsl.graph.tensor<[B, T, F], bf16>, !mdsl.graph.tensor<[B, T, F], bf16>) -> !mdsl.graph.tensor<[B, T, 2*F], bf16>
    // CHECK: mdsl.graph.view %x : (!mdsl.graph.tensor<[B, T, C], bf16>) -> !mdsl.graph.tensor<[B*T, C], bf16>
    %flat = mdsl.graph.view %x : (!x) -> !flat
    // CHECK: mdsl.graph.transpose %q {dim0 = 1 : i64, dim1 = 2 : i64} : (!mdsl.graph.tensor<[B, H, T, D], bf16>) -> !mdsl.graph.tensor<[B, T, H, D], bf16>
    %tq = mdsl.graph.transpose %q {dim0 = 1 : i64, dim1 = 2 : i64} : (!q) -> !mdsl.graph.tensor<[B, T, H, D], bf16>
    // CHECK: mdsl.graph.permute %q {dims = array<i64: 0, 2, 1, 3>} :
    %pq = mdsl.graph.permute %q {dims = array<i64: 0, 2, 1, 3>} : (!q) -> !mdsl.graph.tensor<[B, T, H, D], bf16>
    // CHECK: mdsl.graph.contiguous %tq :
    %ct = mdsl.graph.contiguous %tq : (!mdsl.graph.tensor<[B, T, H, D], bf16>) -> !mdsl.graph.tensor<[B, T, H, D], bf16>

    // 6.6 elementwise
    // CHECK: mdsl.graph.add %x, %g : (!mdsl.graph.tensor<[B, T, C], bf16>, !mdsl.graph.tensor<[C], bf16>) -> !mdsl.graph.tensor<[B, T, C], bf16>
    %add = mdsl.graph.add %x, %g : (!x, !vec) -> !x
    // CHECK: mdsl.graph.mul %x, %r :
    %mul = mdsl.graph.mul %x, %r : (!x, !x) -> !x
    // CHECK: %{{.*}}, %{{.*}} = mdsl.graph.add_backward %add : (!mdsl.graph.tensor<[B, T, C], bf16>) -> (!mdsl.graph.tensor<[B, T, C], bf16>, !mdsl.graph.tensor<[C], bf16>)
    %dadd_a, %dadd_b = mdsl.graph.add_backward %add : (!x) -> (!x, !vec)
    // CHECK: %{{.*}}, %{{.*}} = mdsl.graph.mul_backward %mul, %x, %g : (!mdsl.graph.tensor<[B, T, C], bf16>, !mdsl.graph.tensor<[B, T, C], bf16>, !mdsl.graph.tensor<[C], bf16>) -> (!mdsl.graph.tensor<[B, T, C], bf16>, !mdsl.graph.tensor<[C], bf16>)
    %dmul_a, %dmul_b = mdsl.graph.mul_backward %mul, %x, %g : (!x, !x, !vec) -> (!x, !vec)
    // CHECK: mdsl.graph.bias_add %x, %g :
    %ba = mdsl.graph.bias_add %x, %g : (!x, !vec) -> !x
    // CHECK: mdsl.graph.scale %x {factor = 1.250000e-01 : f64} :
    %sc = mdsl.graph.scale %x {factor = 0.125 : f64} : (!x) -> !x
    // CHECK: mdsl.graph.add3 %x, %r, %c :
    %a3x = mdsl.graph.add3 %x, %r, %c : (!x, !x, !x) -> !x
    // CHECK: mdsl.graph.sub %x, %g : (!mdsl.graph.tensor<[B, T, C], bf16>, !mdsl.graph.tensor<[C], bf16>) -> !mdsl.graph.tensor<[B, T, C], bf16>
    %sub = mdsl.graph.sub %x, %g : (!x, !vec) -> !x
    // CHECK: mdsl.graph.div %x, %g :
    %div = mdsl.graph.div %x, %g : (!x, !vec) -> !x
    // CHECK: mdsl.graph.add_scalar %x {value = 1.000000e-06 : f64} :
    %as = mdsl.graph.add_scalar %x {value = 1.0e-06 : f64} : (!x) -> !x
    // CHECK: mdsl.graph.exp %x : (!mdsl.graph.tensor<[B, T, C], bf16>) -> !mdsl.graph.tensor<[B, T, C], bf16>
    %exp = mdsl.graph.exp %x : (!x) -> !x
    // CHECK: mdsl.graph.tanh %x :
    %tanh = mdsl.graph.tanh %x : (!x) -> !x
    // CHECK: mdsl.graph.sigmoid %x :
    %sig = mdsl.graph.sigmoid %x : (!x) -> !x
    // CHECK: mdsl.graph.rsqrt %x :
    %rsq = mdsl.graph.rsqrt %x : (!x) -> !x
    // CHECK: mdsl.graph.log %x :
    %logx = mdsl.graph.log %x : (!x) -> !x

    // 6.7 reductions
    // CHECK: mdsl.graph.reduce_sum %x {dims = array<i64: 0, 1>} : (!mdsl.graph.tensor<[B, T, C], bf16>) -> !mdsl.graph.tensor<[C], bf16>
    %rs = mdsl.graph.reduce_sum %x {dims = array<i64: 0, 1>} : (!x) -> !vec
    // CHECK: mdsl.graph.reduce_mean %x {dims = array<i64: -1>, keepdim = true} : (!mdsl.graph.tensor<[B, T, C], bf16>) -> !mdsl.graph.tensor<[B, T, 1], bf16>
    %rm = mdsl.graph.reduce_mean %x {dims = array<i64: -1>, keepdim = true} : (!x) -> !mdsl.graph.tensor<[B, T, 1], bf16>
    // CHECK: mdsl.graph.reduce_max %x {dim = -1 : i64} :
    %mx, %mi = mdsl.graph.reduce_max %x {dim = -1 : i64} : (!x) -> (!mdsl.graph.tensor<[B, T], bf16>, !ids)
    // CHECK: mdsl.graph.reduce_max_backward %mx, %mi {dim = -1 : i64} : (!mdsl.graph.tensor<[B, T], bf16>, !mdsl.graph.tensor<[B, T], int32>) -> !mdsl.graph.tensor<[B, T, C], bf16>
    %dmx = mdsl.graph.reduce_max_backward %mx, %mi {dim = -1 : i64} : (!mdsl.graph.tensor<[B, T], bf16>, !ids) -> !x
    // CHECK: mdsl.graph.reduce_max_backward %kx, %ki {dim = 1 : i64, keepdim = true} : (!mdsl.graph.tensor<[B, 1, C], bf16>, !mdsl.graph.tensor<[B, 1, C], int64>) -> !mdsl.graph.tensor<[B, T, C], bf16>
    %kx, %ki = mdsl.graph.reduce_max %x {dim = 1 : i64, keepdim = true} : (!x) -> (!mdsl.graph.tensor<[B, 1, C], bf16>, !mdsl.graph.tensor<[B, 1, C], int64>)
    %dkx = mdsl.graph.reduce_max_backward %kx, %ki {dim = 1 : i64, keepdim = true} : (!mdsl.graph.tensor<[B, 1, C], bf16>, !mdsl.graph.tensor<[B, 1, C], int64>) -> !x

    // 6.8 embedding
    // CHECK: mdsl.graph.embedding %ids, %e : (!mdsl.graph.tensor<[B, T], int32>, !mdsl.graph.tensor<[V, C], bf16>) -> !mdsl.graph.tensor<[B, T, C], bf16>
    %emb = mdsl.graph.embedding %ids, %e : (!ids, !emb) -> !x
    // CHECK: mdsl.graph.embedding_backward %x, %ids :
    %demb = mdsl.graph.embedding_backward %x, %ids : (!x, !ids) -> !emb

    // 6.9 MoE
    // CHECK: %gate = mdsl.graph.zeros : !mdsl.graph.tensor<[E, C], bf16>
    %gate = mdsl.graph.zeros : !mdsl.graph.tensor<[E, C], bf16>
    // CHECK: mdsl.graph.moe_router %flat, %gate {top_k = 2 : i64} :
    %rw, %ri, %aux = mdsl.graph.moe_router %flat, %gate {top_k = 2 : i64} : (!flat, !mdsl.graph.tensor<[E, C], bf16>) -> (!mdsl.graph.tensor<[B*T, 2], bf16>, !mdsl.graph.tensor<[B*T, 2], int32>, !scalar)
    // CHECK: mdsl.graph.moe_router_backward %rw, %flat, %gate, %ri {use_sigmoid = true} :
    %rdx, %rdg = mdsl.graph.moe_router_backward %rw, %flat, %gate, %ri {use_sigmoid = true} : (!mdsl.graph.tensor<[B*T, 2], bf16>, !flat, !mdsl.graph.tensor<[E, C], bf16>, !mdsl.graph.tensor<[B*T, 2], int32>) -> (!flat, !mdsl.graph.tensor<[E, C], bf16>)
    // CHECK: mdsl.graph.moe_permute %flat, %ri, %goff : {{.*}} -> (!mdsl.graph.tensor<[2*B*T, C], bf16>, !mdsl.graph.tensor<[2*B*T], int32>)
    %perm, %scat = mdsl.graph.moe_permute %flat, %ri, %goff : (!flat, !mdsl.graph.tensor<[B*T, 2], int32>, !mdsl.graph.tensor<[E + 1], int32>) -> (!mdsl.graph.tensor<[B*T*2, C], bf16>, !mdsl.graph.tensor<[B*T*2], int32>)
    // CHECK: mdsl.graph.moe_unpermute %perm, %rw, %scat :
    %comb = mdsl.graph.moe_unpermute %perm, %rw, %scat : (!mdsl.graph.tensor<[2*B*T, C], bf16>, !mdsl.graph.tensor<[B*T, 2], bf16>, !mdsl.graph.tensor<[2*B*T], int32>) -> !flat
    // CHECK: mdsl.graph.moe_unpermute_backward %comb, %perm, %rw, %scat :
    %ude, %udw = mdsl.graph.moe_unpermute_backward %comb, %perm, %rw, %scat : (!flat, !mdsl.graph.tensor<[2*B*T, C], bf16>, !mdsl.graph.tensor<[B*T, 2], bf16>, !mdsl.graph.tensor<[2*B*T], int32>) -> (!mdsl.graph.tensor<[2*B*T, C], bf16>, !mdsl.graph.tensor<[B*T, 2], bf16>)

    // 6.10 Mamba
    %mu = mdsl.graph.zeros : !mdsl.graph.tensor<[B, C, T], bf16>
    %mw = mdsl.graph.zeros : !mdsl.graph.tensor<[C, 1, 4], bf16>
    %mst = mdsl.graph.zeros : !mdsl.graph.tensor<[B, C, 3], bf16>
    // CHECK: mdsl.graph.mamba_conv1d %mu, %mw : !mdsl.graph.tensor<[B, C, T], bf16>, !mdsl.graph.tensor<[C, 1, 4], bf16> -> !mdsl.graph.tensor<[B, C, T], bf16>
    %my = mdsl.graph.mamba_conv1d %mu, %mw : !mdsl.graph.tensor<[B, C, T], bf16>, !mdsl.graph.tensor<[C, 1, 4], bf16> -> !mdsl.graph.tensor<[B, C, T], bf16>
    // CHECK: mdsl.graph.mamba_conv1d %mu, %mw bias %g state %mst {activation = "none"} : !mdsl.graph.tensor<[B, C, T], bf16>, !mdsl.graph.tensor<[C, 1, 4], bf16> bias !mdsl.graph.tensor<[C], bf16> state !mdsl.graph.tensor<[B, C, 3], bf16> -> !mdsl.graph.tensor<[B, C, T], bf16>, !mdsl.graph.tensor<[B, C, 3], bf16>
    %my2, %mso = mdsl.graph.mamba_conv1d %mu, %mw bias %g state %mst {activation = "none"} : !mdsl.graph.tensor<[B, C, T], bf16>, !mdsl.graph.tensor<[C, 1, 4], bf16> bias !vec state !mdsl.graph.tensor<[B, C, 3], bf16> -> !mdsl.graph.tensor<[B, C, T], bf16>, !mdsl.graph.tensor<[B, C, 3], bf16>
    // CHECK: mdsl.graph.mamba_conv1d_backward %mu, %mu, %mw, %g :
    %mb1, %mb2, %mb3 = mdsl.graph.mamba_conv1d_backward %mu, %mu, %mw, %g : (!mdsl.graph.tensor<[B, C, T], bf16>, !mdsl.graph.tensor<[B, C, T], bf16>, !mdsl.graph.tensor<[C, 1, 4], bf16>, !vec) -> (!mdsl.graph.tensor<[B, C, T], bf16>, !mdsl.graph.tensor<[C, 1, 4], bf16>, !vec)
    %sa = mdsl.graph.zeros : !mdsl.graph.tensor<[C, S], fp32>
    %sb = mdsl.graph.zeros : !mdsl.graph.tensor<[B, G, S, T], bf16>
    %sd = mdsl.graph.zeros : !mdsl.graph.tensor<[C], fp32>
    // CHECK: mdsl.graph.mamba_selective_scan %mu, %mu, %sa, %sb, %sb, %sd, %sd {chunk_size = 128 : i64} :
    %sy, %sst = mdsl.graph.mamba_selective_scan %mu, %mu, %sa, %sb, %sb, %sd, %sd {chunk_size = 128 : i64} : (!mdsl.graph.tensor<[B, C, T], bf16>, !mdsl.graph.tensor<[B, C, T], bf16>, !mdsl.graph.tensor<[C, S], fp32>, !mdsl.graph.tensor<[B, G, S, T], bf16>, !mdsl.graph.tensor<[B, G, S, T], bf16>, !mdsl.graph.tensor<[C], fp32>, !mdsl.graph.tensor<[C], fp32>) -> (!mdsl.graph.tensor<[B, C, T], bf16>, !mdsl.graph.tensor<[B, C, S], fp32>)
    // CHECK: mdsl.graph.mamba_selective_scan_backward %mu, %mu, %mu, %sa, %sb, %sb, %sd, %sd, %sst, %sy :
    %z1, %z2, %z3, %z4, %z5, %z6, %z7 = mdsl.graph.mamba_selective_scan_backward %mu, %mu, %mu, %sa, %sb, %sb, %sd, %sd, %sst, %sy : (!mdsl.graph.tensor<[B, C, T], bf16>, !mdsl.graph.tensor<[B, C, T], bf16>, !mdsl.graph.tensor<[B, C, T], bf16>, !mdsl.graph.tensor<[C, S], fp32>, !mdsl.graph.tensor<[B, G, S, T], bf16>, !mdsl.graph.tensor<[B, G, S, T], bf16>, !mdsl.graph.tensor<[C], fp32>, !mdsl.graph.tensor<[C], fp32>, !mdsl.graph.tensor<[B, C, S], fp32>, !mdsl.graph.tensor<[B, C, T], bf16>) -> (!mdsl.graph.tensor<[B, C, T], bf16>, !mdsl.graph.tensor<[B, C, T], bf16>, !mdsl.graph.tensor<[C, S], fp32>, !mdsl.graph.tensor<[B, G, S, T], bf16>, !mdsl.graph.tensor<[B, G, S, T], bf16>, !mdsl.graph.tensor<[C], fp32>, !mdsl.graph.tensor<[C], fp32>)

    // 6.11 utility
    // CHECK: mdsl.graph.fill {value = 5.000000e-01 : f64} : !mdsl.graph.tensor<[B, T, C], bf16>
    %fl = mdsl.graph.fill {value = 0.5 : f64} : !x
    // CHECK: mdsl.graph.copy %x :
    %cp = mdsl.graph.copy %x : (!x) -> !x
    // CHECK: mdsl.graph.cast %x : (!mdsl.graph.tensor<[B, T, C], bf16>) -> !mdsl.graph.tensor<[B, T, C], fp32>
    %cs = mdsl.graph.cast %x : (!x) -> !mdsl.graph.tensor<[B, T, C], fp32>

    // losses
    %lg = mdsl.graph.zeros : !logits
    // CHECK: mdsl.graph.cross_entropy %lg, %labels : (!mdsl.graph.tensor<[B*T, V], fp32>, !mdsl.graph.tensor<[B*T], int32>) -> (!mdsl.graph.tensor<[], fp32>, !mdsl.graph.tensor<[B*T], fp32>)
    %loss, %clse = mdsl.graph.cross_entropy %lg, %labels : (!logits, !flatids) -> (!scalar, !tok)
    // CHECK: mdsl.graph.cross_entropy %lg, %labels {ignore_index = -1 : i64, reduction = "none"} :
    %tl, %tlse = mdsl.graph.cross_entropy %lg, %labels {ignore_index = -1 : i64, reduction = "none"} : (!logits, !flatids) -> (!tok, !tok)
    // CHECK: mdsl.graph.cross_entropy_backward %loss, %lg, %labels, %clse :
    %dlg = mdsl.graph.cross_entropy_backward %loss, %lg, %labels, %clse : (!scalar, !logits, !flatids, !tok) -> !logits
    // CHECK: mdsl.graph.fused_lm_head_loss %flat, %e, %labels {compute_accuracy = true} :
    %fll, %flse = mdsl.graph.fused_lm_head_loss %flat, %e, %labels {compute_accuracy = true} : (!flat, !emb, !flatids) -> (!scalar, !tok)
    // CHECK: mdsl.graph.fused_lm_head_loss_backward %fll, %flat, %e, %labels, %flse :
    %fdx, %fdw = mdsl.graph.fused_lm_head_loss_backward %fll, %flat, %e, %labels, %flse : (!scalar, !flat, !emb, !flatids, !tok) -> (!flat, !emb)
    // CHECK: mdsl.graph.fused_lm_head_loss_grad %fll, %flat, %e, %labels {chunk = 4 : i64} : (!mdsl.graph.tensor<[], fp32>, {{.*}}) -> (!mdsl.graph.tensor<[], fp32>, !mdsl.graph.tensor<[B*T, C], bf16>, !mdsl.graph.tensor<[V, C], bf16>)
    %lgl, %lgdx, %lgdw = mdsl.graph.fused_lm_head_loss_grad %fll, %flat, %e, %labels {chunk = 4 : i64} : (!scalar, !flat, !emb, !flatids) -> (!scalar, !flat, !emb)

    mdsl.graph.return %c : !x
  }
}
