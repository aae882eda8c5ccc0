// mdsl-fuse pattern lm_head_loss: the LM-head GEMM, the cross-entropy and, in backward,
// cross_entropy_backward and the d_x / d_W GEMMs become fused_lm_head_loss(_backward), which hold
// `chunk` rows of logits at a time (lm_head_chunk=, else the most rows whose fp32 logits fit in 128
// MiB). Each variant (Inputs/fuse-loss/) breaks one: logits another op reads, a GEMM with alpha, a
// @nofuse on the GEMM; disable= turns it off and a negative chunk is E029. CSE (after the patterns)
// leaves one view of x to rows for both. With the loss gradient %d an argument (known where the
// forward stands) and lse read by the backward only, the two then merge into fused_lm_head_loss_grad
// at the forward (FUSED, AUTO); they stay apart where the gradient is computed after the forward
// (LATE) or another op reads lse (LSE).
// RUN: mdsl-opt %s -p 'mdsl-fuse{lm_head_chunk=4}' | filecheck %s --check-prefix=FUSED
// RUN: mdsl-opt %s -p 'mdsl-fuse' | filecheck %s --check-prefix=AUTO
// RUN: mdsl-opt %s -p 'mdsl-fuse{disable=lm_head_loss}' | filecheck %s --check-prefix=OFF
// RUN: mdsl-opt %S/Inputs/fuse-loss/read.mlir -p 'mdsl-fuse' | filecheck %s --check-prefix=OFF
// RUN: mdsl-opt %S/Inputs/fuse-loss/alpha.mlir -p 'mdsl-fuse' | filecheck %s --check-prefix=OFF
// RUN: mdsl-opt %S/Inputs/fuse-loss/nofuse.mlir -p 'mdsl-fuse' | filecheck %s --check-prefix=OFF
// RUN: mdsl-opt %S/Inputs/fuse-loss/late.mlir -p 'mdsl-fuse{lm_head_chunk=4}' | filecheck %s --check-prefix=LATE
// RUN: mdsl-opt %S/Inputs/fuse-loss/lse.mlir -p 'mdsl-fuse{lm_head_chunk=4}' | filecheck %s --check-prefix=LSE
// RUN: not mdsl-opt %s -p 'mdsl-fuse{lm_head_chunk=-1}' 2>&1 | filecheck %s --check-prefix=BAD

builtin.module {
  mdsl.graph.model @M config {} {
    mdsl.graph.param @head : !mdsl.graph.tensor<[64, 32], fp32>
    mdsl.graph.func @loss_grad(%x: !mdsl.graph.tensor<[2, 8, 32], fp32>, %labels: !mdsl.graph.tensor<[16], int64>, %d: !mdsl.graph.tensor<[], fp32>) -> (!mdsl.graph.tensor<[], fp32>, !mdsl.graph.tensor<[2, 8, 32], fp32>, !mdsl.graph.tensor<[64, 32], fp32>) attributes {kind = "helper", forward_ops = 4 : i64} {
      %head = mdsl.graph.param_ref @head : !mdsl.graph.tensor<[64, 32], fp32>
      %logits = mdsl.graph.matmul %x, %head {transpose = "NT"} : (!mdsl.graph.tensor<[2, 8, 32], fp32>, !mdsl.graph.tensor<[64, 32], fp32>) -> !mdsl.graph.tensor<[2, 8, 64], fp32>
      %rows = mdsl.graph.view %logits : (!mdsl.graph.tensor<[2, 8, 64], fp32>) -> !mdsl.graph.tensor<[16, 64], fp32>
      %loss, %lse = mdsl.graph.cross_entropy %rows, %labels : (!mdsl.graph.tensor<[16, 64], fp32>, !mdsl.graph.tensor<[16], int64>) -> (!mdsl.graph.tensor<[], fp32>, !mdsl.graph.tensor<[16], fp32>)
      %d_rows = mdsl.graph.cross_entropy_backward %d, %rows, %labels, %lse : (!mdsl.graph.tensor<[], fp32>, !mdsl.graph.tensor<[16, 64], fp32>, !mdsl.graph.tensor<[16], int64>, !mdsl.graph.tensor<[16], fp32>) -> !mdsl.graph.tensor<[16, 64], fp32>
      %d_logits = mdsl.graph.view %d_rows : (!mdsl.graph.tensor<[16, 64], fp32>) -> !mdsl.graph.tensor<[2, 8, 64], fp32>
      %d_x = mdsl.graph.matmul %d_logits, %head : (!mdsl.graph.tensor<[2, 8, 64], fp32>, !mdsl.graph.tensor<[64, 32], fp32>) -> !mdsl.graph.tensor<[2, 8, 32], fp32>
      %d_w = mdsl.graph.matmul %d_logits, %x {transpose = "TN"} : (!mdsl.graph.tensor<[2, 8, 64], fp32>, !mdsl.graph.tensor<[2, 8, 32], fp32>) -> !mdsl.graph.tensor<[64, 32], fp32>
      mdsl.graph.return %loss, %d_x, %d_w : !mdsl.graph.tensor<[], fp32>, !mdsl.graph.tensor<[2, 8, 32], fp32>, !mdsl.graph.tensor<[64, 32], fp32>
    }
  }
}

// FUSED:      mdsl.graph.func @loss_grad({{.*}}forward_ops = 3 : i64
// FUSED-NEXT:   %head = mdsl.graph.param_ref @head
// FUSED-NEXT:   %[[X:.*]] = mdsl.graph.view %x : {{.*}} -> !mdsl.graph.tensor<[16, 32], fp32>
// FUSED-NEXT:   %loss, %[[DX:.*]], %d_w = mdsl.graph.fused_lm_head_loss_grad %d, %[[X]], %head, %labels {chunk = 4 : i64} : (!mdsl.graph.tensor<[], fp32>, !mdsl.graph.tensor<[16, 32], fp32>, {{.*}}) -> (!mdsl.graph.tensor<[], fp32>, !mdsl.graph.tensor<[16, 32], fp32>, !mdsl.graph.tensor<[64, 32], fp32>)
// FUSED-NEXT:   %d_x = mdsl.graph.view %[[DX]] : {{.*}} -> !mdsl.graph.tensor<[2, 8, 32], fp32>
// FUSED-NEXT:   mdsl.graph.return %loss, %d_x, %d_w
// FUSED-NOT:  cross_entropy
// FUSED-NOT:  fused_lm_head_loss_backward

// AUTO: mdsl.graph.fused_lm_head_loss_grad {{.*}} {chunk = 16 : i64}
// AUTO-NOT: fused_lm_head_loss_backward

// LATE:      %loss, %lse = mdsl.graph.fused_lm_head_loss %[[X:.*]], %head, %labels {chunk = 4 : i64}
// LATE-NEXT: %late = mdsl.graph.scale %d
// LATE-NEXT: %{{.*}}, %d_w = mdsl.graph.fused_lm_head_loss_backward %late, %[[X]], %head, %labels, %lse {chunk = 4 : i64}
// LATE-NOT:  fused_lm_head_loss_grad

// LSE:      %loss, %lse = mdsl.graph.fused_lm_head_loss %[[X:.*]], %head, %labels {chunk = 4 : i64}
// LSE:      mdsl.graph.reduce_sum %lse
// LSE:      mdsl.graph.fused_lm_head_loss_backward %d, %[[X]], %head, %labels, %lse {chunk = 4 : i64}
// LSE-NOT:  fused_lm_head_loss_grad

// OFF-NOT: fused_lm_head_loss
// OFF:     mdsl.graph.cross_entropy %rows, %labels
// OFF:     mdsl.graph.cross_entropy_backward
// OFF-NOT: fused_lm_head_loss

// BAD: error[E029]: mdsl-fuse: lm_head_chunk=-1 is negative
