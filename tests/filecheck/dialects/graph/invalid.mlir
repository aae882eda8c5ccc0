// Verifier rules of mdsl.graph: each chunk breaks one rule; the diagnostic
// names the op, its location and the rule.
// RUN: mdsl-opt %s --split-input-file --print-diagnostics | filecheck %s

!a = !mdsl.graph.tensor<[4, 8], fp32>
!b = !mdsl.graph.tensor<[16, 3], fp32>
!c = !mdsl.graph.tensor<[4, 3], fp32>
mdsl.graph.model @m {
  mdsl.graph.func @f(%a: !a, %b: !b) -> !c {
    %c = mdsl.graph.matmul %a, %b : (!a, !b) -> !c
    mdsl.graph.return %c : !c
  }
}
// CHECK: invalid.mlir:10:5: error[{{E[0-9]+}}]: 'mdsl.graph.matmul' op inner dimensions (NN): 8 != 16
// CHECK-NEXT: %c = mdsl.graph.matmul %a, %b : (!a, !b) -> !c
// CHECK-NEXT: ^^^^^^^^^^^^^^^^^^^^^^

// -----

!x = !mdsl.graph.tensor<[B, T, 64], bf16>
!w = !mdsl.graph.tensor<[32, 64], bf16>
!y = !mdsl.graph.tensor<[B, T, 32], bf16>
mdsl.graph.model @m {
  mdsl.graph.func @f(%x: !x, %w: !w) -> !y {
    %y = mdsl.graph.matmul %x, %w {transpose = "NN"} : (!x, !w) -> !y
    mdsl.graph.return %y : !y
  }
}
// CHECK: invalid.mlir:25:5: error[{{E[0-9]+}}]: 'mdsl.graph.matmul' op inner dimensions (NN): 64 != 32

// -----

!x = !mdsl.graph.tensor<[B, T, D], bf16>
!u = !mdsl.graph.tensor<[B, T, D + 1], bf16>
mdsl.graph.model @m {
  mdsl.graph.func @f(%g: !x, %u: !u) -> !x {
    %y = mdsl.graph.swiglu %g, %u : (!x, !u) -> !x
    mdsl.graph.return %y : !x
  }
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.graph.swiglu' op gate and up: shapes [B, T, D] and [B, T, D + 1] differ

// -----

!q = !mdsl.graph.tensor<[B, 12, T, 64], bf16>
!kv = !mdsl.graph.tensor<[B, 8, T, 64], bf16>
!l = !mdsl.graph.tensor<[B, 12, T], fp32>
mdsl.graph.model @m {
  mdsl.graph.func @f(%q: !q, %k: !kv, %v: !kv) -> !q {
    %o, %lse = mdsl.graph.flash_attention %q, %k, %v : (!q, !kv, !kv) -> (!q, !l)
    mdsl.graph.return %o : !q
  }
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.graph.flash_attention' op query heads (12) must be a multiple of kv heads (8) (GQA)

// -----

!q = !mdsl.graph.tensor<[B, H, T, 64], bf16>
!f = !mdsl.graph.tensor<[T, 64, 2], fp32>
mdsl.graph.model @m {
  mdsl.graph.func @f(%q: !q, %k: !q, %freqs: !f) -> !q {
    %qr, %kr = mdsl.graph.rope %q, %k, %freqs : (!q, !q, !f) -> (!q, !q)
    mdsl.graph.return %qr : !q
  }
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.graph.rope' op freqs pairs (head_dim // 2): 64 != 32

// -----

!x = !mdsl.graph.tensor<[B, T, 96], bf16>
!p = !mdsl.graph.tensor<[B, T, 32], bf16>
mdsl.graph.model @m {
  mdsl.graph.func @f(%x: !x) -> !p {
    %a, %b = mdsl.graph.split %x {sizes = #mdsl.graph.dims<[32, 32]>} : (!x) -> (!p, !p)
    mdsl.graph.return %a : !p
  }
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.graph.split' op split sizes must sum to the split dimension: 64 != 96

// -----

!x = !mdsl.graph.tensor<[B, T, 64], bf16>
!v = !mdsl.graph.tensor<[B, T, 8, 16], bf16>
mdsl.graph.model @m {
  mdsl.graph.func @f(%x: !x) -> !v {
    %y = mdsl.graph.view %x : (!x) -> !v
    mdsl.graph.return %y : !v
  }
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.graph.view' op a view keeps the element count: [B, T, 64] has 64*B*T elements, [B, T, 8, 16] has 128*B*T

// -----

!x = !mdsl.graph.tensor<[B, T, 64], bf16>
!w = !mdsl.graph.tensor<[32], bf16>
!r = !mdsl.graph.tensor<[B, T], fp32>
mdsl.graph.model @m {
  mdsl.graph.func @f(%x: !x, %w: !w) -> !x {
    %y, %rstd = mdsl.graph.rmsnorm %x, %w : (!x, !w) -> (!x, !r)
    mdsl.graph.return %y : !x
  }
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.graph.rmsnorm' op weight length: 32 != 64

// -----

!x = !mdsl.graph.tensor<[B, T, 64], bf16>
!w = !mdsl.graph.tensor<[64], bf16>
!r = !mdsl.graph.tensor<[B, T], bf16>
mdsl.graph.model @m {
  mdsl.graph.func @f(%x: !x, %w: !w) -> !x {
    %y, %rstd = mdsl.graph.rmsnorm %x, %w : (!x, !w) -> (!x, !r)
    mdsl.graph.return %y : !x
  }
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.graph.rmsnorm' op rstd must have element type fp32, got bf16

// -----

!i = !mdsl.graph.tensor<[B, T], fp32>
!e = !mdsl.graph.tensor<[V, 64], bf16>
!y = !mdsl.graph.tensor<[B, T, 64], bf16>
mdsl.graph.model @m {
  mdsl.graph.func @f(%i: !i, %e: !e) -> !y {
    %y = mdsl.graph.embedding %i, %e : (!i, !e) -> !y
    mdsl.graph.return %y : !y
  }
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.graph.embedding' op indices must have element type int32 or int64, got fp32

// -----

!w = !mdsl.graph.tensor<[4, 4], fp32>
mdsl.graph.model @m {
  mdsl.graph.func @f(%w: !w) -> !w {
    %y = mdsl.graph.matmul %w, %w {transpose = "XN"} : (!w, !w) -> !w
    mdsl.graph.return %y : !w
  }
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.graph.matmul' op transpose must be one of NN, NT, TN, TT, got 'XN'

// -----

!a = !mdsl.graph.tensor<[B, T, 64], bf16>
!b = !mdsl.graph.tensor<[B, T, 32], bf16>
mdsl.graph.model @m {
  mdsl.graph.func @f(%a: !a, %b: !b) -> !a {
    %y = mdsl.graph.add %a, %b : (!a, !b) -> !a
    mdsl.graph.return %y : !a
  }
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.graph.add' op operands: shapes [B, T, 64] and [B, T, 32] do not broadcast

// -----

!q = !mdsl.graph.tensor<[B, H, T, D], bf16>
mdsl.graph.model @m {
  mdsl.graph.func @f(%q: !q) -> !q {
    %y = mdsl.graph.permute %q {dims = array<i64: 0, 1, 1, 3>} : (!q) -> !q
    mdsl.graph.return %y : !q
  }
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.graph.permute' op dims [0, 1, 1, 3] is not a permutation of 0..3

// -----

!w = !mdsl.graph.tensor<[64, 64], bf16>
mdsl.graph.model @m {
  mdsl.graph.param @w : !w
  mdsl.graph.func @f() -> !mdsl.graph.tensor<[64, 32], bf16> {
    %w = mdsl.graph.param_ref @w : !mdsl.graph.tensor<[64, 32], bf16>
    mdsl.graph.return %w : !mdsl.graph.tensor<[64, 32], bf16>
  }
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.graph.param_ref' op type !mdsl.graph.tensor<[64, 32], bf16> does not match the declaration of '@w' (!mdsl.graph.tensor<[64, 64], bf16>)

// -----

!x = !mdsl.graph.tensor<[B, T, 64], bf16>
!s = !mdsl.graph.tensor<[3, 64, 64], bf16>
!w = !mdsl.graph.tensor<[64, 64], bf16>
mdsl.graph.model @m {
  mdsl.graph.param @blocks.w : !s
  mdsl.graph.func @block(%h: !x, %w: !w) -> !x {
    mdsl.graph.return %h : !x
  }
  mdsl.graph.func @f(%x: !x) -> !x {
    %w = mdsl.graph.param_ref @blocks.w : !s
    %y = mdsl.graph.stack @block count #mdsl.graph.expr<4> (%x : !x) layers(%w : !s) -> !x
    mdsl.graph.return %y : !x
  }
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.graph.stack' op per-layer operand #0 has 3 layers, the stack runs 4

// -----

!x = !mdsl.graph.tensor<[B, T, 64], bf16>
!s = !mdsl.graph.tensor<[4, 64, 64], bf16>
!w = !mdsl.graph.tensor<[64, 64], bf16>
mdsl.graph.model @m {
  mdsl.graph.param @blocks.w : !s
  mdsl.graph.func @block(%h: !x, %w: !w) -> (!x, !x) {
    mdsl.graph.return %h, %h : !x, !x
  }
  mdsl.graph.func @f(%x: !x) -> !x {
    %w = mdsl.graph.param_ref @blocks.w : !s
    %y, %saved = mdsl.graph.stack @block count #mdsl.graph.expr<4> (%x : !x) layers(%w : !s) -> !x, !mdsl.graph.tensor<[3, B, T, 64], bf16>
    mdsl.graph.return %y : !x
  }
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.graph.stack' op collected result #0 has 3 layers, the stack runs 4

// -----

!x = !mdsl.graph.tensor<[B, T, 64], bf16>
mdsl.graph.model @m {
  mdsl.graph.func @f(%x: !x) -> !x {
    %y = mdsl.graph.call @nothere(%x) : (!x) -> !x
    mdsl.graph.return %y : !x
  }
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.graph.call' op '@nothere' does not name a function of the model

// -----

!x = !mdsl.graph.tensor<[B, T, 64], bf16>
mdsl.graph.model @m {
  mdsl.graph.func @f(%x: !x) -> !mdsl.graph.tensor<[B, T, 64], fp32> {
    mdsl.graph.return %x : !x
  }
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.graph.return' op returned types (!mdsl.graph.tensor<[B, T, 64], bf16>) do not match the function results (!mdsl.graph.tensor<[B, T, 64], fp32>)

// -----

!l = !mdsl.graph.tensor<[N, V], fp32>
!t = !mdsl.graph.tensor<[N], fp32>
!s = !mdsl.graph.tensor<[], fp32>
mdsl.graph.model @m {
  mdsl.graph.func @f(%l: !l, %t: !t) -> !s {
    %loss, %lse = mdsl.graph.cross_entropy %l, %t : (!l, !t) -> (!s, !t)
    mdsl.graph.return %loss : !s
  }
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.graph.cross_entropy' op labels must have element type int32 or int64, got fp32

// -----

!x = !mdsl.graph.tensor<[B, 32, 64], bf16>
!z = !mdsl.graph.tensor<[B, 64, 64], bf16>
mdsl.graph.model @m {
  mdsl.graph.func @f(%x: !x) -> !z {
    %y = mdsl.graph.transpose %x {dim0 = 1 : i64, dim1 = 2 : i64} : (!x) -> !z
    mdsl.graph.return %y : !z
  }
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.graph.transpose' op result: shapes [B, 64, 32] and [B, 64, 64] differ

// -----

!v = !mdsl.graph.tensor<[B, 4], bf16>
!i = !mdsl.graph.tensor<[B, 4], int32>
!x = !mdsl.graph.tensor<[B, 8, C], bf16>
mdsl.graph.model @m {
  mdsl.graph.func @f(%v: !v, %i: !i) -> !x {
    %dx = mdsl.graph.reduce_max_backward %v, %i {dim = -1 : i64} : (!v, !i) -> !x
    mdsl.graph.return %dx : !x
  }
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.graph.reduce_max_backward' op d_values: shapes [B, 8] and [B, 4] differ

// -----

!v = !mdsl.graph.tensor<[B, T], bf16>
!x = !mdsl.graph.tensor<[B, T, C], bf16>
mdsl.graph.model @m {
  mdsl.graph.func @f(%v: !v, %i: !v) -> !x {
    %dx = mdsl.graph.reduce_max_backward %v, %i {dim = -1 : i64} : (!v, !v) -> !x
    mdsl.graph.return %dx : !x
  }
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.graph.reduce_max_backward' op indices must have element type int32 or int64, got bf16

// -----

!v = !mdsl.graph.tensor<[B, 8], bf16>
!i = !mdsl.graph.tensor<[B, 4], int32>
!x = !mdsl.graph.tensor<[B, 8, C], bf16>
mdsl.graph.model @m {
  mdsl.graph.func @f(%v: !v, %i: !i) -> !x {
    %dx = mdsl.graph.reduce_max_backward %v, %i {dim = -1 : i64} : (!v, !i) -> !x
    mdsl.graph.return %dx : !x
  }
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.graph.reduce_max_backward' op indices: shapes [B, 8] and [B, 4] differ

// -----

!v = !mdsl.graph.tensor<[B, T], bf16>
!i = !mdsl.graph.tensor<[B, T], int32>
!x = !mdsl.graph.tensor<[B, T, C], bf16>
mdsl.graph.model @m {
  mdsl.graph.func @f(%v: !v, %i: !i) -> !x {
    %dx = mdsl.graph.reduce_max_backward %v, %i {dim = -1 : i64, keepdim = true} : (!v, !i) -> !x
    mdsl.graph.return %dx : !x
  }
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.graph.reduce_max_backward' op d_values: shapes [B, T, 1] and [B, T] differ in rank

// -----

!v = !mdsl.graph.tensor<[B, T], fp32>
!i = !mdsl.graph.tensor<[B, T], int32>
!x = !mdsl.graph.tensor<[B, T, C], bf16>
mdsl.graph.model @m {
  mdsl.graph.func @f(%v: !v, %i: !i) -> !x {
    %dx = mdsl.graph.reduce_max_backward %v, %i {dim = -1 : i64} : (!v, !i) -> !x
    mdsl.graph.return %dx : !x
  }
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.graph.reduce_max_backward' op d_values and d_x: element types differ (bf16, fp32)

// -----

!v = !mdsl.graph.tensor<[B, T], bf16>
!i = !mdsl.graph.tensor<[B, T], int32>
!x = !mdsl.graph.tensor<[B, T, C], bf16>
mdsl.graph.model @m {
  mdsl.graph.func @f(%v: !v, %i: !i) -> !x {
    %dx = mdsl.graph.reduce_max_backward %v, %i {dim = 3 : i64} : (!v, !i) -> !x
    mdsl.graph.return %dx : !x
  }
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.graph.reduce_max_backward' op reduction dim 3 is out of range for rank 3

// -----

!x = !mdsl.graph.tensor<[N, 64], bf16>
!w = !mdsl.graph.tensor<[E, 64, 32], bf16>
!o = !mdsl.graph.tensor<[E + 1], int32>
!y = !mdsl.graph.tensor<[N, 64], bf16>
mdsl.graph.model @m {
  mdsl.graph.func @f(%x: !x, %w: !w, %o: !o) -> !y {
    %y = mdsl.graph.grouped_gemm %x, %w, %o : (!x, !w, !o) -> !y
    mdsl.graph.return %y : !y
  }
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.graph.grouped_gemm' op inner dimension (TN): 64 != 32

// -----

!x = !mdsl.graph.tensor<[16, 64], bf16>
!w = !mdsl.graph.tensor<[E, 64, 32], bf16>
!o = !mdsl.graph.tensor<[E + 1], int32>
!y = !mdsl.graph.tensor<[64, 32], bf16>
mdsl.graph.model @m {
  mdsl.graph.func @f(%x: !x, %w: !w, %o: !o) -> !y {
    %y = mdsl.graph.grouped_gemm %x, %w, %o {transpose = "NT"} : (!x, !w, !o) -> !y
    mdsl.graph.return %y : !y
  }
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.graph.grouped_gemm' op inner dimension (NT): 16 != 64

// -----

!x = !mdsl.graph.tensor<[N, 64], bf16>
!w = !mdsl.graph.tensor<[E, 64, 32], bf16>
!o = !mdsl.graph.tensor<[E], int32>
!y = !mdsl.graph.tensor<[N, 32], bf16>
mdsl.graph.model @m {
  mdsl.graph.func @f(%x: !x, %w: !w, %o: !o) -> !y {
    %y = mdsl.graph.grouped_gemm %x, %w, %o {transpose = "NN"} : (!x, !w, !o) -> !y
    mdsl.graph.return %y : !y
  }
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.graph.grouped_gemm' op offsets length (groups + 1): E != E + 1

// -----

!x = !mdsl.graph.tensor<[N, 64], bf16>
!w = !mdsl.graph.tensor<[E, 32, 64], bf16>
!o = !mdsl.graph.tensor<[E + 1], int32>
!y = !mdsl.graph.tensor<[N, 32], bf16>
mdsl.graph.model @m {
  mdsl.graph.func @f(%x: !x, %w: !w, %o: !o) -> !y {
    %y = mdsl.graph.grouped_gemm %x, %w, %o {transpose = "XT"} : (!x, !w, !o) -> !y
    mdsl.graph.return %y : !y
  }
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.graph.grouped_gemm' op transpose must be one of NN, NT, TN, TT, got 'XT'

// -----

!g = !mdsl.graph.tensor<[4, 8], bf16>
!a = !mdsl.graph.tensor<[4, 1], bf16>
!v = !mdsl.graph.tensor<[1], bf16>
mdsl.graph.model @m {
  mdsl.graph.func @f(%g: !g) -> !v {
    %da, %db = mdsl.graph.add_backward %g : (!g) -> (!a, !v)
    mdsl.graph.return %db : !v
  }
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.graph.add_backward' op d_a and d_b broadcast: shapes [4, 1] and [4, 8] differ

// -----

!g = !mdsl.graph.tensor<[4, 8], bf16>
!v = !mdsl.graph.tensor<[3], bf16>
mdsl.graph.model @m {
  mdsl.graph.func @f(%g: !g) -> !v {
    %da, %db = mdsl.graph.add_backward %g : (!g) -> (!g, !v)
    mdsl.graph.return %db : !v
  }
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.graph.add_backward' op d_a and d_b: shapes [4, 8] and [3] do not broadcast

// -----

!g = !mdsl.graph.tensor<[4, 8], bf16>
!v = !mdsl.graph.tensor<[8], bf16>
!f = !mdsl.graph.tensor<[8], fp32>
mdsl.graph.model @m {
  mdsl.graph.func @f(%g: !g, %a: !g, %b: !v) -> !f {
    %da, %db = mdsl.graph.mul_backward %g, %a, %b : (!g, !g, !v) -> (!g, !f)
    mdsl.graph.return %db : !f
  }
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.graph.mul_backward' op operands and results: element types differ (bf16, fp32)

// -----

!g = !mdsl.graph.tensor<[4, 8], bf16>
!v = !mdsl.graph.tensor<[8], bf16>
mdsl.graph.model @m {
  mdsl.graph.func @f(%g: !g, %a: !g, %b: !v) -> !g {
    %da, %db = mdsl.graph.mul_backward %g, %a, %b : (!g, !g, !v) -> (!g, !g)
    mdsl.graph.return %db : !g
  }
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.graph.mul_backward' op d_b: shapes [8] and [4, 8] differ in rank

// -----

!q = !mdsl.graph.tensor<[B, 4, T, 16], bf16>
!s = !mdsl.graph.tensor<[B, 4, T], fp32>
!h = !mdsl.graph.tensor<[2], fp32>
mdsl.graph.model @m {
  mdsl.graph.func @f(%q: !q, %lse: !s, %slopes: !h) -> !q {
    %dq, %dk, %dv = mdsl.graph.flash_attention_backward %q, %q, %q, %q, %q, %lse, %slopes : (!q, !q, !q, !q, !q, !s, !h) -> (!q, !q, !q)
    mdsl.graph.return %dq : !q
  }
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.graph.flash_attention_backward' op alibi_slopes length: 2 != 4

// -----

// A model's invariants (kept from primitive declarations' invariants: sections) name a
// primitive of the dialect, a known kind and the op's operand and result names.
mdsl.graph.model @m attributes {invariants = {softmaxx = {backward_uses = ["out"]}}} {
  mdsl.graph.param @w : !mdsl.graph.tensor<[4], fp32>
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.graph.model' op invariants name 'softmaxx', which is no primitive of mdsl.graph

// -----

mdsl.graph.model @m attributes {invariants = {softmax = {backward_uses = ["y"]}}} {
  mdsl.graph.param @w : !mdsl.graph.tensor<[4], fp32>
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.graph.model' op softmax's backward_uses names 'y', which is none of its operands and results (x, out)

// -----

mdsl.graph.model @m attributes {invariants = {softmax = {saves = ["out"]}}} {
  mdsl.graph.param @w : !mdsl.graph.tensor<[4], fp32>
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.graph.model' op 'saves' of softmax is no invariant (they are: backward_uses)
