// The verifier rules of packed rows (attention-segments.mlir runs this file): each chunk breaks one.
// CHECK: error[{{E[0-9]+}}]: 'mdsl.graph.flash_attention' op segments length (the keys): 7 != 8

!q = !mdsl.graph.tensor<[2, 4, 8, 16], fp32>
!kv = !mdsl.graph.tensor<[2, 2, 8, 16], fp32>
!l = !mdsl.graph.tensor<[2, 4, 8], fp32>
mdsl.graph.model @m {
  mdsl.graph.func @f(%q: !q, %k: !kv, %ids: !mdsl.graph.tensor<[2, 7], int32>) -> !q {
    %o, %lse = mdsl.graph.flash_attention %q, %k, %k segments %ids : (!q, !kv, !kv segments !mdsl.graph.tensor<[2, 7], int32>) -> (!q, !l)
    mdsl.graph.return %o : !q
  }
}

// -----

// CHECK: error[{{E[0-9]+}}]: 'mdsl.graph.flash_attention_backward' op segments must have element type int32 or int64, got fp32
!q = !mdsl.graph.tensor<[2, 4, 8, 16], fp32>
!kv = !mdsl.graph.tensor<[2, 2, 8, 16], fp32>
!l = !mdsl.graph.tensor<[2, 4, 8], fp32>
mdsl.graph.model @m {
  mdsl.graph.func @f(%q: !q, %k: !kv, %lse: !l, %ids: !mdsl.graph.tensor<[2, 8], fp32>) -> !q {
    %dq, %dk, %dv = mdsl.graph.flash_attention_backward %q, %q, %k, %k, %q, %lse segments %ids : (!q, !q, !kv, !kv, !q, !l segments !mdsl.graph.tensor<[2, 8], fp32>) -> (!q, !kv, !kv)
    mdsl.graph.return %dq : !q
  }
}

// -----

// CHECK: error[{{E[0-9]+}}]: 'mdsl.graph.rope' op freqs rows (the batch): 3 != 2
!q = !mdsl.graph.tensor<[2, 4, 8, 16], fp32>
!kv = !mdsl.graph.tensor<[2, 2, 8, 16], fp32>
!f = !mdsl.graph.tensor<[3, 8, 8, 2], fp32>
mdsl.graph.model @m {
  mdsl.graph.func @f(%q: !q, %k: !kv, %freqs: !f) -> !q {
    %qr, %kr = mdsl.graph.rope %q, %k, %freqs : (!q, !kv, !f) -> (!q, !kv)
    mdsl.graph.return %qr : !q
  }
}
