// Packed rows in mdsl.graph (mdsl-pack-sequences): flash_attention and its backward with segment ids
// (`segments %ids`, after ALiBi's slopes where both are given), rope and the fused qk_norm + rope with a
// table per row ([B, T, D/2, 2]); the custom print re-parses to itself, the generic one to the same IR.
// Without segments the ops print as they always did (the uniform form).
// RUN: %roundtrip %s | filecheck %s
// RUN: mdsl-opt %s --print-op-generic | mdsl-opt | filecheck %s
// RUN: mdsl-opt %S/Inputs/attention-segments/invalid.mlir --split-input-file --print-diagnostics | filecheck %S/Inputs/attention-segments/invalid.mlir

!q = !mdsl.graph.tensor<[2, 4, 8, 16], fp32>
!kv = !mdsl.graph.tensor<[2, 2, 8, 16], fp32>
!l = !mdsl.graph.tensor<[2, 4, 8], fp32>
!ids = !mdsl.graph.tensor<[2, 8], int32>
!rows = !mdsl.graph.tensor<[2, 8, 8, 2], fp32>
!w = !mdsl.graph.tensor<[16], fp32>
mdsl.graph.model @m {
  mdsl.graph.func @f(%q: !q, %k: !kv, %v: !kv, %ids: !ids, %slopes: !mdsl.graph.tensor<[4], fp32>, %freqs: !rows, %qw: !w) -> !q {
    // CHECK: mdsl.graph.flash_attention %q, %k, %v segments %ids : (!mdsl.graph.tensor<[2, 4, 8, 16], fp32>, !mdsl.graph.tensor<[2, 2, 8, 16], fp32>, !mdsl.graph.tensor<[2, 2, 8, 16], fp32> segments !mdsl.graph.tensor<[2, 8], int32>) -> (!mdsl.graph.tensor<[2, 4, 8, 16], fp32>, !mdsl.graph.tensor<[2, 4, 8], fp32>)
    %o, %lse = mdsl.graph.flash_attention %q, %k, %v segments %ids : (!q, !kv, !kv segments !ids) -> (!q, !l)
    // CHECK: mdsl.graph.flash_attention %q, %k, %v, %slopes segments %ids {window_size = 3 : i64} : ({{.*}}, !mdsl.graph.tensor<[4], fp32> segments !mdsl.graph.tensor<[2, 8], int32>) -> (
    %o2, %lse2 = mdsl.graph.flash_attention %q, %k, %v, %slopes segments %ids {window_size = 3 : i64} : (!q, !kv, !kv, !mdsl.graph.tensor<[4], fp32> segments !ids) -> (!q, !l)
    // CHECK: mdsl.graph.flash_attention %q, %k, %v, %slopes : ({{.*}}, !mdsl.graph.tensor<[4], fp32>) -> (
    %o3, %lse3 = mdsl.graph.flash_attention %q, %k, %v, %slopes : (!q, !kv, !kv, !mdsl.graph.tensor<[4], fp32>) -> (!q, !l)
    // CHECK: mdsl.graph.flash_attention_backward %o, %q, %k, %v, %o, %lse segments %ids : ({{.*}} segments !mdsl.graph.tensor<[2, 8], int32>) -> (
    %dq, %dk, %dv = mdsl.graph.flash_attention_backward %o, %q, %k, %v, %o, %lse segments %ids : (!q, !q, !kv, !kv, !q, !l segments !ids) -> (!q, !kv, !kv)
    // CHECK: mdsl.graph.rope %q, %k, %freqs : ({{.*}}, !mdsl.graph.tensor<[2, 8, 8, 2], fp32>) -> (
    %qr, %kr = mdsl.graph.rope %q, %k, %freqs : (!q, !kv, !rows) -> (!q, !kv)
    // CHECK: mdsl.graph.rope_backward %qr, %kr, %freqs : ({{.*}}, !mdsl.graph.tensor<[2, 8, 8, 2], fp32>) -> (
    %bq, %bk = mdsl.graph.rope_backward %qr, %kr, %freqs : (!q, !kv, !rows) -> (!q, !kv)
    // CHECK: mdsl.graph.fused_qk_norm_rope %q, %k, %qw, %qw, %freqs :
    %fq, %fk, %fqs, %fks = mdsl.graph.fused_qk_norm_rope %q, %k, %qw, %qw, %freqs : (!q, !kv, !w, !w, !rows) -> (!q, !kv, !l, !mdsl.graph.tensor<[2, 2, 8], fp32>)
    mdsl.graph.return %o : !q
  }
}
