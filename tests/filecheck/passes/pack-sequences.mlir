// mdsl-pack-sequences: the forward takes the segment ids of packed rows (last) and a RoPE table per row
// ([B, T, D/2, 2]); the stack passes both to its body (segments after the shared table), whose causal
// flash_attention takes them and whose rope reads the per-row table; the caller of the forward (the
// loss) takes them right after the inputs it passes on. Left alone: the helper that attends to nothing
// (no segments input, its call unchanged), the softmax. E029 where it cannot pack: a non-causal attention
// (Inputs/pack-sequences/non-causal.mlir), a written-out one (causal-mask.mlir).
// RUN: mdsl-opt %s -p 'mdsl-pack-sequences' | filecheck %s
// RUN: mdsl-opt %s -p 'mdsl-pack-sequences,mdsl-pack-sequences' | filecheck %s
// RUN: not mdsl-opt %S/Inputs/pack-sequences/non-causal.mlir -p 'mdsl-pack-sequences' 2>&1 | filecheck %s --check-prefix=NONCAUSAL
// RUN: not mdsl-opt %S/Inputs/pack-sequences/causal-mask.mlir -p 'mdsl-pack-sequences' 2>&1 | filecheck %s --check-prefix=MASK

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
      %o, %lse = mdsl.graph.flash_attention %qr, %kr, %q {layout = "bthd"} : (!h, !h, !h) -> (!h, !l)
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

// CHECK:      mdsl.graph.func @forward(%tokens: !mdsl.graph.tensor<[2, 4], int32>, %freqs: !mdsl.graph.tensor<[2, 4, 2, 2], fp32>, %segments: !mdsl.graph.tensor<[2, 4], int32>)
// CHECK:        %xN = mdsl.graph.stack @blocks count #mdsl.graph.expr<2>(%x0 : {{.*}}) shared(%freqs, %segments : !mdsl.graph.tensor<[2, 4, 2, 2], fp32>, !mdsl.graph.tensor<[2, 4], int32>) layers(%w : {{.*}})
// CHECK:      mdsl.graph.func @blocks(%x: !mdsl.graph.tensor<[2, 4, 8], fp32>, %freqs: !mdsl.graph.tensor<[2, 4, 2, 2], fp32>, %segments: !mdsl.graph.tensor<[2, 4], int32>, %w: !mdsl.graph.tensor<[8, 8], fp32>)
// CHECK-NEXT:   %y = mdsl.graph.call @mix(%x, %w) :
// CHECK:        %qr, %kr = mdsl.graph.rope %q, %q, %freqs {layout = "bthd"} : ({{.*}}, !mdsl.graph.tensor<[2, 4, 2, 2], fp32>) -> (
// CHECK-NEXT:   %o, %lse = mdsl.graph.flash_attention %qr, %kr, %q segments %segments {layout = "bthd"} : ({{.*}} segments !mdsl.graph.tensor<[2, 4], int32>) -> (
// CHECK:      mdsl.graph.func @mix(%x: !mdsl.graph.tensor<[2, 4, 8], fp32>, %w: !mdsl.graph.tensor<[8, 8], fp32>)
// CHECK-NEXT:   mdsl.graph.matmul
// CHECK-NEXT:   mdsl.graph.softmax %y :
// CHECK:      mdsl.graph.func @train_loss(%tokens: !mdsl.graph.tensor<[2, 4], int32>, %freqs: !mdsl.graph.tensor<[2, 4, 2, 2], fp32>, %segments: !mdsl.graph.tensor<[2, 4], int32>, %labels: !mdsl.graph.tensor<[2, 4], int64>)
// CHECK-NEXT:   %0 = mdsl.graph.call @forward(%tokens, %freqs, %segments) :

// NONCAUSAL: error[E029]: mdsl-pack-sequences: mdsl.graph.flash_attention in @blocks is not causal: on packed rows its queries would see the later examples
// NONCAUSAL: hint: pack causal attention only (or train on padded rows)

// MASK: error[E029]: mdsl-pack-sequences: mdsl.graph.causal_mask in @forward mixes the tokens of a row: a written-out attention (its causal_mask): mdsl-fuse's dag_attention makes it a flash_attention, which the pass packs
