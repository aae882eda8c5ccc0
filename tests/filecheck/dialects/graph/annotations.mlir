// Every annotation of spec section 7 as a typed attribute: canonical print
// (defaults omitted, positional parameters bare), round trip, and errors.
// RUN: %roundtrip %s | filecheck %s
// RUN: mdsl-opt %s --print-op-generic | mdsl-opt | filecheck %s

!x = !mdsl.graph.tensor<[B, 64], bf16>
mdsl.graph.model @m {
  // CHECK: mdsl.graph.param @w : !mdsl.graph.tensor<[64, 64], bf16> {annotations = [#mdsl.graph.frozen, #mdsl.graph.dtype<fp8_e4m3>, #mdsl.graph.scaling<per_block, block_size = [16, 16]>, #mdsl.graph.shard<row, tp_size = 8, async_comm = false>, #mdsl.graph.memory<offload, priority = 2>]}
  mdsl.graph.param @w : !mdsl.graph.tensor<[64, 64], bf16> {annotations = [#mdsl.graph.frozen, #mdsl.graph.dtype<fp8_e4m3>, #mdsl.graph.scaling<per_block, block_size = [16, 16]>, #mdsl.graph.shard<row, tp_size = 8, async_comm = false>, #mdsl.graph.memory<mode = offload, priority = 2, prefetch = true>]}
  // CHECK: mdsl.graph.param @lora_a : !mdsl.graph.tensor<[8, 64], bf16> {annotations = [#mdsl.graph.trainable<lr_scale = 2.0, grad_clip = 1.0>]}
  mdsl.graph.param @lora_a : !mdsl.graph.tensor<[8, 64], bf16> {annotations = [#mdsl.graph.trainable<lr_scale = 2.0, wd_scale = 1.0, grad_clip = 1.0>]}
  mdsl.graph.func @f(%x: !x) -> !x {
    // CHECK: %a = mdsl.graph.silu %x {annotations = [#mdsl.graph.memory<recompute>, #mdsl.graph.checkpoint, #mdsl.graph.checkpoint<selective, preserve = ["attn_out"]>, #mdsl.graph.lifetime<start = "qkv", end = "attn">]}
    %a = mdsl.graph.silu %x {annotations = [#mdsl.graph.memory<recompute>, #mdsl.graph.checkpoint<full>, #mdsl.graph.checkpoint<granularity = selective, preserve = ["attn_out"]>, #mdsl.graph.lifetime<operation, start = "qkv", end = "attn">]} : (!x) -> !x
    // CHECK: %b = mdsl.graph.relu %a {annotations = [#mdsl.graph.hook<AfterQKVProjection>, #mdsl.graph.hook<MyPoint, mode = replace, priority = 3>, #mdsl.graph.adapter<lora, rank = 8, alpha = 16.0, targets = ["q", "v"]>, #mdsl.graph.adapter<ia3>, #mdsl.graph.probe<"scores", capture = histogram, frequency = 100>]}
    %b = mdsl.graph.relu %a {annotations = [#mdsl.graph.hook<AfterQKVProjection, mode = observe>, #mdsl.graph.hook<MyPoint, mode = replace, priority = 3>, #mdsl.graph.adapter<lora, rank = 8, alpha = 16.0, targets = ["q", "v"]>, #mdsl.graph.adapter<type = ia3>, #mdsl.graph.probe<"scores", capture = histogram, frequency = 100>]} : (!x) -> !x
    // CHECK: %c = mdsl.graph.gelu %b {annotations = [#mdsl.graph.precision<compute = fp8_e4m3, output = bf16>, #mdsl.graph.precision<policy = fp8_hybrid>, #mdsl.graph.fuse<gated_mlp>, #mdsl.graph.fuse<ops = ["add", "rmsnorm"], scope = global>, #mdsl.graph.nofuse<"debugging a NaN">, #mdsl.graph.kernel<"cudnn_sdpa", autotune = false, workspace = 1024>]}
    %c = mdsl.graph.gelu %b {annotations = [#mdsl.graph.precision<compute = fp8_e4m3, accumulate = fp32, output = bf16>, #mdsl.graph.precision<policy = fp8_hybrid>, #mdsl.graph.fuse<pattern = gated_mlp>, #mdsl.graph.fuse<ops = ["add", "rmsnorm"], scope = global>, #mdsl.graph.nofuse<"debugging a NaN">, #mdsl.graph.kernel<"cudnn_sdpa", autotune = false, workspace = 1024>]} : (!x) -> !x
    // CHECK: %d = mdsl.graph.relu2 %c {annotations = [#mdsl.graph.partition<1, recompute = true>, #mdsl.graph.comm<all_reduce, group = "tp", bucket_size = 1048576>, #mdsl.graph.assert<"!isnan(x)", message = "NaN">, #mdsl.graph.profile<"mlp", memory = true>, #mdsl.graph.trace<tensors>, #mdsl.graph.trace, #mdsl.graph.gradient<skip>, #mdsl.graph.gradient<scale = 0.5>, #mdsl.graph.recipe<FP8HybridRecipe>]}
    %d = mdsl.graph.relu2 %c {annotations = [#mdsl.graph.partition<1, recompute = true>, #mdsl.graph.comm<all_reduce, group = "tp", bucket_size = 1048576>, #mdsl.graph.assert<"!isnan(x)", message = "NaN">, #mdsl.graph.profile<"mlp", memory = true>, #mdsl.graph.trace<level = tensors>, #mdsl.graph.trace<ops>, #mdsl.graph.gradient<skip>, #mdsl.graph.gradient<compute, scale = 0.5>, #mdsl.graph.recipe<FP8HybridRecipe>]} : (!x) -> !x
    mdsl.graph.return %d : !x
  }
}
