// The input of ../../lower-to-sched-kernel.module after mdsl-specialize{B=1 T=4}, its flash_attention's
// kernel choice then made "cudnn_fmha_v2", no kernel of flash_attention: IR that did not come through
// the frontend (which refuses the name, E043), for mdsl-lower-to-sched to refuse.

builtin.module {
  mdsl.graph.model @Attn config {h = 2 : i64, d = 4 : i64} {
    mdsl.graph.param @w : !mdsl.graph.tensor<[4, 4], bf16>
    mdsl.graph.func @forward(%q: !mdsl.graph.tensor<[1, 2, 4, 4], bf16>, %k: !mdsl.graph.tensor<[1, 2, 4, 4], bf16>, %v: !mdsl.graph.tensor<[1, 2, 4, 4], bf16>) -> !mdsl.graph.tensor<[1, 2, 4, 4], bf16> attributes {kind = "forward"} {
      %a, %lse = mdsl.graph.flash_attention %q, %k, %v {annotations = [#mdsl.graph.kernel<"cudnn_fmha_v2", workspace = 1048576, fallback = false>]} : (!mdsl.graph.tensor<[1, 2, 4, 4], bf16>, !mdsl.graph.tensor<[1, 2, 4, 4], bf16>, !mdsl.graph.tensor<[1, 2, 4, 4], bf16>) -> (!mdsl.graph.tensor<[1, 2, 4, 4], bf16>, !mdsl.graph.tensor<[1, 2, 4], fp32>)
      %w = mdsl.graph.param_ref @w : !mdsl.graph.tensor<[4, 4], bf16>
      %out = mdsl.graph.matmul %a, %w {transpose = "NT", annotations = [#mdsl.graph.kernel<"cublaslt">]} : (!mdsl.graph.tensor<[1, 2, 4, 4], bf16>, !mdsl.graph.tensor<[4, 4], bf16>) -> !mdsl.graph.tensor<[1, 2, 4, 4], bf16>
      mdsl.graph.return %out : !mdsl.graph.tensor<[1, 2, 4, 4], bf16>
    }
  }
}

