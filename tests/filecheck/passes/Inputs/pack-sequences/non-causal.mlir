// mdsl-pack-sequences refuses a non-causal attention (pack-sequences.mlir runs it).
!x = !mdsl.graph.tensor<[2, 4, 8], fp32>
!h = !mdsl.graph.tensor<[2, 4, 2, 4], fp32>
!f = !mdsl.graph.tensor<[4, 2, 2], fp32>
!l = !mdsl.graph.tensor<[2, 2, 4], fp32>
!w = !mdsl.graph.tensor<[2, 8, 8], fp32>
!w1 = !mdsl.graph.tensor<[8, 8], fp32>
!ids = !mdsl.graph.tensor<[2, 4], int32>
builtin.module {
  mdsl.graph.model @M config {} {
    mdsl.graph.param @embedding : !mdsl.graph.tensor<[16, 8], fp32>
    mdsl.graph.param @blocks.w : !w
    mdsl.graph.func @forward(%tokens: !ids, %freqs: !f) -> !x attributes {kind = "forward"} {
      %embedding = mdsl.graph.param_ref @embedding : !mdsl.graph.tensor<[16, 8], fp32>
      %x0 = mdsl.graph.embedding %tokens, %embedding : (!ids, !mdsl.graph.tensor<[16, 8], fp32>) -> !x
      %w = mdsl.graph.param_ref @blocks.w : !w
      %xN = mdsl.graph.stack @blocks count #mdsl.graph.expr<2>(%x0 : !x) shared(%freqs : !f) layers(%w : !w) -> !x
      mdsl.graph.return %xN : !x
    }
    mdsl.graph.func @blocks(%x: !x, %freqs: !f, %w: !w1) -> !x attributes {kind = "block"} {
      %y = mdsl.graph.call @mix(%x, %w) : (!x, !w1) -> !x
      %q = mdsl.graph.view %y : (!x) -> !h
      %qr, %kr = mdsl.graph.rope %q, %q, %freqs {layout = "bthd"} : (!h, !h, !f) -> (!h, !h)
      %o, %lse = mdsl.graph.flash_attention %qr, %kr, %q {layout = "bthd", causal = false} : (!h, !h, !h) -> (!h, !l)
      %out = mdsl.graph.view %o : (!h) -> !x
      mdsl.graph.return %out : !x
    }
    mdsl.graph.func @mix(%x: !x, %w: !w1) -> !x attributes {kind = "helper"} {
      %y = mdsl.graph.matmul %x, %w {transpose = "NT"} : (!x, !w1) -> !x
      %s = mdsl.graph.softmax %y : (!x) -> !x
      mdsl.graph.return %s : !x
    }
    mdsl.graph.func @train_loss(%tokens: !ids, %freqs: !f, %labels: !mdsl.graph.tensor<[2, 4], int64>) -> !x attributes {kind = "helper"} {
      %0 = mdsl.graph.call @forward(%tokens, %freqs) : (!ids, !f) -> !x
      mdsl.graph.return %0 : !x
    }
  }
}

