// Every annotation (spec section 7, and @alias/@noalias/@barrier of 5.11) as a
// typed #mdsl.graph attribute: the canonical print drops parameters equal to
// their default and prints positional parameters bare; the print re-parses to
// itself. Annotations sit in an `annotations` array on any op.
// RUN: %roundtrip %s | filecheck %s
// RUN: mdsl-opt %s --print-op-generic | mdsl-opt | filecheck %s

// On a builtin module and on func ops (any op may carry them).
// CHECK: builtin.module attributes {annotations = [#mdsl.graph.recipe<FP8HybridRecipe>, #mdsl.graph.trace<tensors>, #mdsl.graph.checkpoint]} {
builtin.module attributes {annotations = [#mdsl.graph.recipe<FP8HybridRecipe>, #mdsl.graph.trace<level = tensors>, #mdsl.graph.checkpoint<granularity = full, preserve = []>]} {
  // CHECK: func.func @debug() attributes {annotations = [#mdsl.graph.nofuse<"checking for NaN source">, #mdsl.graph.profile<"forward", memory = true>, #mdsl.graph.trace, #mdsl.graph.barrier]} {
  func.func @debug() attributes {annotations = [#mdsl.graph.nofuse<reason = "checking for NaN source">, #mdsl.graph.profile<"forward", memory = true, nvtx = true>, #mdsl.graph.trace<ops>, #mdsl.graph.barrier]} {
    func.return
  }
  // CHECK: func.func @stage() attributes {annotations = [#mdsl.graph.partition<1, recompute = true>, #mdsl.graph.checkpoint<selective, preserve = ["attn_out"]>, #mdsl.graph.fuse<scope = global>]} {
  func.func @stage() attributes {annotations = [#mdsl.graph.partition<stage = 1, micro_batch = true, recompute = true>, #mdsl.graph.checkpoint<selective, preserve = ["attn_out"]>, #mdsl.graph.fuse<scope = global>]} {
    func.return
  }
}

// -----

!x = !mdsl.graph.tensor<[B, 64], bf16>
mdsl.graph.model @m {
  // On parameter declarations.
  // CHECK: mdsl.graph.param @w : !mdsl.graph.tensor<[64, 64], bf16> {annotations = [#mdsl.graph.frozen, #mdsl.graph.dtype<fp8_e4m3>, #mdsl.graph.scaling<per_block, block_size = [16, 16]>, #mdsl.graph.shard<row, tp_size = 8, async_comm = false>, #mdsl.graph.memory<offload, priority = 2>]}
  mdsl.graph.param @w : !mdsl.graph.tensor<[64, 64], bf16> {annotations = [#mdsl.graph.frozen, #mdsl.graph.dtype<type = fp8_e4m3>, #mdsl.graph.scaling<per_block, block_size = [16, 16]>, #mdsl.graph.shard<row, tp_size = 8, async_comm = false>, #mdsl.graph.memory<mode = offload, priority = 2, prefetch = true>]}
  // CHECK: mdsl.graph.param @lora_a : !mdsl.graph.tensor<[8, 64], bf16> {annotations = [#mdsl.graph.trainable<lr_scale = 2.0, grad_clip = 1.0>, #mdsl.graph.shard<replicated>]}
  mdsl.graph.param @lora_a : !mdsl.graph.tensor<[8, 64], bf16> {annotations = [#mdsl.graph.trainable<lr_scale = 2.0, wd_scale = 1.0, grad_clip = 1.0>, #mdsl.graph.shard<replicated>]}
  // CHECK: mdsl.graph.param @norm : !mdsl.graph.tensor<[64], bf16> {annotations = [#mdsl.graph.trainable<wd_scale = 0.0, grad_clip = 1.0e-05>, #mdsl.graph.memory<pin>]}
  mdsl.graph.param @norm : !mdsl.graph.tensor<[64], bf16> {annotations = [#mdsl.graph.trainable<wd_scale = 0.0, grad_clip = 0.00001>, #mdsl.graph.memory<pin>]}
  // CHECK: mdsl.graph.param @experts : !mdsl.graph.tensor<[8, 64, 64], bf16> {annotations = [#mdsl.graph.shard<expert, ep_size = 8>, #mdsl.graph.memory<stream, prefetch = false>]}
  mdsl.graph.param @experts : !mdsl.graph.tensor<[8, 64, 64], bf16> {annotations = [#mdsl.graph.shard<strategy = expert, ep_size = 8, reduce_scatter = true>, #mdsl.graph.memory<stream, prefetch = false, async = true>]}

  // On graph ops (the op producing an annotated tensor).
  mdsl.graph.func @f(%x: !x) -> !x {
    // CHECK: %a = mdsl.graph.silu %x {annotations = [#mdsl.graph.memory<recompute>, #mdsl.graph.checkpoint, #mdsl.graph.lifetime<start = "qkv", end = "attn">, #mdsl.graph.gradient<scale = 0.5>]}
    %a = mdsl.graph.silu %x {annotations = [#mdsl.graph.memory<recompute>, #mdsl.graph.checkpoint<full>, #mdsl.graph.lifetime<operation, start = "qkv", end = "attn">, #mdsl.graph.gradient<compute, scale = 0.5>]} : (!x) -> !x
    // CHECK: %b = mdsl.graph.relu %a {annotations = [#mdsl.graph.hook<AfterQKVProjection>, #mdsl.graph.hook<attn_out, mode = replace, priority = 3>, #mdsl.graph.adapter<lora, rank = 8, alpha = 16.0, targets = ["q", "v"]>, #mdsl.graph.adapter<ia3>, #mdsl.graph.probe<"scores", capture = histogram, frequency = 100>, #mdsl.graph.probe<"nan", capture = full, condition = "has_nan_or_inf(out)">]}
    %b = mdsl.graph.relu %a {annotations = [#mdsl.graph.hook<AfterQKVProjection, mode = observe>, #mdsl.graph.hook<"attn_out", mode = replace, priority = 3>, #mdsl.graph.adapter<lora, rank = 8, alpha = 16.0, dropout = 0.0, targets = ["q", "v"]>, #mdsl.graph.adapter<type = ia3>, #mdsl.graph.probe<"scores", capture = histogram, frequency = 100>, #mdsl.graph.probe<"nan", capture = full, condition = "has_nan_or_inf(out)">]} : (!x) -> !x
    // CHECK: %c = mdsl.graph.gelu %b {annotations = [#mdsl.graph.precision<compute = fp8_e4m3, output = bf16>, #mdsl.graph.dtype<bf16>, #mdsl.graph.scaling<delayed, update_interval = 4>, #mdsl.graph.fuse<gated_mlp>, #mdsl.graph.kernel<"cudnn_sdpa", autotune = false, workspace = 1024>]}
    %c = mdsl.graph.gelu %b {annotations = [#mdsl.graph.precision<compute = fp8_e4m3, accumulate = fp32, output = bf16>, #mdsl.graph.dtype<bf16>, #mdsl.graph.scaling<delayed, history_len = 16, update_interval = 4>, #mdsl.graph.fuse<pattern = gated_mlp>, #mdsl.graph.kernel<"cudnn_sdpa", autotune = false, workspace = 1024>]} : (!x) -> !x
    // CHECK: %d = mdsl.graph.relu2 %c {annotations = [#mdsl.graph.partition<1>, #mdsl.graph.comm<all_reduce, group = "tp", bucket_size = 1048576>, #mdsl.graph.assert<"!has_nan(out)", "NaN">, #mdsl.graph.assert<"out.shape[-1] == 64", enabled = false>, #mdsl.graph.profile<"mlp", cuda_events = false, nvtx = false>, #mdsl.graph.gradient<skip>]}
    %d = mdsl.graph.relu2 %c {annotations = [#mdsl.graph.partition<1, micro_batch = true>, #mdsl.graph.comm<all_reduce, group = "tp", async = true, bucket_size = 1048576>, #mdsl.graph.assert<"!has_nan(out)", message = "NaN">, #mdsl.graph.assert<condition = "out.shape[-1] == 64", enabled = false>, #mdsl.graph.profile<"mlp", cuda_events = false, nvtx = false>, #mdsl.graph.gradient<skip>]} : (!x) -> !x
    // CHECK: %e = mdsl.graph.silu %d {annotations = [#mdsl.graph.precision<policy = fp8_hybrid>, #mdsl.graph.scaling<dynamic, margin = 0.1>, #mdsl.graph.fuse_required<ops = ["add", "rmsnorm"], scope = global>, #mdsl.graph.adapter<prefix, length = 20, hidden_dim = 512>, #mdsl.graph.lifetime<sublayer>, #mdsl.graph.memory<temporary>, #mdsl.graph.alias]}
    %e = mdsl.graph.silu %d {annotations = [#mdsl.graph.precision<policy = fp8_hybrid>, #mdsl.graph.scaling<dynamic, margin = 0.1>, #mdsl.graph.fuse_required<ops = ["add", "rmsnorm"], scope = global>, #mdsl.graph.adapter<prefix, length = 20, hidden_dim = 512>, #mdsl.graph.lifetime<scope = sublayer>, #mdsl.graph.memory<temporary>, #mdsl.graph.alias]} : (!x) -> !x
    // CHECK: %f = mdsl.graph.relu %e {annotations = [#mdsl.graph.adapter<adapter, bottleneck_dim = 32, activation = silu>, #mdsl.graph.adapter<prompt>, #mdsl.graph.comm<send, async = false>, #mdsl.graph.noalias, #mdsl.graph.nofuse, #mdsl.graph.gradient<accumulate, clip = 1.0>, #mdsl.graph.kernel<"my_kernel">]}
    %f = mdsl.graph.relu %e {annotations = [#mdsl.graph.adapter<adapter, bottleneck_dim = 32, activation = silu>, #mdsl.graph.adapter<prompt, length = 10>, #mdsl.graph.comm<send, group = "default", async = false>, #mdsl.graph.noalias, #mdsl.graph.nofuse, #mdsl.graph.gradient<accumulate, clip = 1.0>, #mdsl.graph.kernel<name = "my_kernel", fallback = true>]} : (!x) -> !x
    mdsl.graph.return %f : !x
  }
}
