// A tied embedding's gradient is the sum of its two uses: the embedding's scatter-add and the
// LM head's weight GEMM. With grads_arena=true each term goes into the one fp32 gradient buffer
// by itself: embedding_backward accumulates natively (a launch marked accumulate, no zeroing),
// the GEMM gets beta = 1; the add of the two terms is gone.
// RUN: mdsl-opt %s -p 'mdsl-autodiff,mdsl-lower-to-sched{func=forward_grad grads_arena=true}' | filecheck %s

!ids = !mdsl.graph.tensor<[2, 4], int32>
!x = !mdsl.graph.tensor<[2, 4, 8], bf16>
!e = !mdsl.graph.tensor<[16, 8], bf16>
!l = !mdsl.graph.tensor<[2, 4, 16], bf16>
mdsl.graph.model @m config {} {
  mdsl.graph.param @embed : !e
  mdsl.graph.func @forward(%tokens: !ids) -> !l attributes {kind = "forward"} {
    %embed = mdsl.graph.param_ref @embed : !e
    %x = mdsl.graph.embedding %tokens, %embed : (!ids, !e) -> !x
    %logits = mdsl.graph.matmul %x, %embed {transpose = "NT"} : (!x, !e) -> !l
    mdsl.graph.return %logits : !l
  }
}

// CHECK-LABEL: mdsl.sched.program @forward_grad
// CHECK:         %d_embed = mdsl.sched.buffer grads bytes 512 {grad = "embed"} : !mdsl.sched.buffer<[16, 8], fp32>
// CHECK-NOT:     "add"
// CHECK:         mdsl.sched.gemm %{{.+}}, %{{.+}} -> %d_embed {transa = true, beta = 1.000000e+00 : f64}
// CHECK-NOT:     "add"
// CHECK:         mdsl.sched.launch "embedding_backward"(%{{.+}}, %tokens) -> (%d_embed) {accumulate}
// CHECK-NOT:     "add"
// CHECK:       }
