// mdsl-plan-memory over layer loops: a layer loop spans the steps of its body;
// buffers used only within one iteration keep their in-body interval (reused
// every layer, and by each other within the body); a buffer carried from one
// layer to the next, used outside the loop, or a stacked buffer read through
// layer_view is live for the whole loop.
// RUN: mdsl-opt %s --split-input-file -p mdsl-plan-memory | filecheck %s

!t = !mdsl.sched.buffer<[256], fp32>
!st = !mdsl.sched.buffer<[3, 256], fp32>

// Steps: 0 copy, 1-5 the body, 6-7 after. %h [0, 6] (carried), %t1 [1, 2],
// %t2 [2, 3], %t3 [3, 5], %saved [1, 6] (written through layer_view, read
// after the loop), %after [6, 7]: %t3 and %after reuse %t1's place.
// CHECK-LABEL: mdsl.sched.program @layers arenas(params = 3072, activations = 6144, workspace = 0, grads = 0, optimizer = 0, external = 2048) {
// CHECK-NEXT:    %x = mdsl.sched.buffer external offset 0 bytes 1024
// CHECK-NEXT:    %y = mdsl.sched.buffer external offset 1024 bytes 1024
// CHECK-NEXT:    %w = mdsl.sched.buffer params offset 0 bytes 3072
// CHECK-NEXT:    %h = mdsl.sched.buffer activations offset 0 bytes 1024
// CHECK-NEXT:    %t1 = mdsl.sched.buffer activations offset 1024 bytes 1024
// CHECK-NEXT:    %t2 = mdsl.sched.buffer activations offset 5120 bytes 1024
// CHECK-NEXT:    %t3 = mdsl.sched.buffer activations offset 1024 bytes 1024
// CHECK-NEXT:    %saved = mdsl.sched.buffer activations offset 2048 bytes 3072
// CHECK-NEXT:    %after = mdsl.sched.buffer activations offset 1024 bytes 1024
mdsl.sched.program @layers arenas(params = 0, activations = 0, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  %x = mdsl.sched.buffer external bytes 1024 : !t
  %y = mdsl.sched.buffer external bytes 1024 : !t
  %w = mdsl.sched.buffer params bytes 3072 : !st
  %h = mdsl.sched.buffer activations bytes 1024 : !t
  %t1 = mdsl.sched.buffer activations bytes 1024 : !t
  %t2 = mdsl.sched.buffer activations bytes 1024 : !t
  %t3 = mdsl.sched.buffer activations bytes 1024 : !t
  %saved = mdsl.sched.buffer activations bytes 3072 : !st
  %after = mdsl.sched.buffer activations bytes 1024 : !t
  mdsl.sched.copy %x -> %h : !t -> !t
  mdsl.sched.layer_loop %l = 0 to 3 {
    %wl = mdsl.sched.layer_view %w[%l] : !st -> !t
    %sl = mdsl.sched.layer_view %saved[%l] : !st -> !t
    mdsl.sched.launch "matmul"(%h, %wl) -> (%t1) : (!t, !t) -> (!t)
    mdsl.sched.launch "matmul"(%t1) -> (%t2) : (!t) -> (!t)
    mdsl.sched.launch "matmul"(%t2) -> (%t3) : (!t) -> (!t)
    mdsl.sched.copy %t3 -> %sl : !t -> !t
    mdsl.sched.copy %t3 -> %h : !t -> !t
  }
  mdsl.sched.launch "matmul"(%saved, %h) -> (%after) : (!st, !t) -> (!t)
  mdsl.sched.copy %after -> %y : !t -> !t
}

// -----

!t = !mdsl.sched.buffer<[256], fp32>

// In place inside a loop: %h is carried (read first in the body), so scale may
// not write over it even at its last use in the body; %t1 dies within the
// iteration, so silu writes %t2 over it, and %t1's memory lives [1, 3]. %c is
// first written in the body (inside a recompute segment): per-layer, [3, 4].
// CHECK-LABEL: mdsl.sched.program @inplace_in_loop arenas(params = 0, activations = 3072, workspace = 0, grads = 0, optimizer = 0, external = 2048) {
// CHECK-NEXT:    %x = mdsl.sched.buffer external offset 0 bytes 1024
// CHECK-NEXT:    %y = mdsl.sched.buffer external offset 1024 bytes 1024
// CHECK-NEXT:    %h = mdsl.sched.buffer activations offset 0 bytes 1024 :
// CHECK-NEXT:    %t1 = mdsl.sched.buffer activations offset 1024 bytes 1024 :
// CHECK-NEXT:    %t2 = mdsl.sched.buffer activations offset 0 bytes 1024 alias_of %t1 :
// CHECK-NEXT:    %c = mdsl.sched.buffer activations offset 2048 bytes 1024 :
// CHECK:         mdsl.sched.launch "scale"(%h) -> (%t1) {factor = 5.000000e-01 : f64} :
// CHECK-NEXT:    mdsl.sched.launch "silu"(%t1) -> (%t2) {inplace} :
mdsl.sched.program @inplace_in_loop arenas(params = 0, activations = 0, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  %x = mdsl.sched.buffer external bytes 1024 : !t
  %y = mdsl.sched.buffer external bytes 1024 : !t
  %h = mdsl.sched.buffer activations bytes 1024 : !t
  %t1 = mdsl.sched.buffer activations bytes 1024 : !t
  %t2 = mdsl.sched.buffer activations bytes 1024 : !t
  %c = mdsl.sched.buffer activations bytes 1024 : !t
  mdsl.sched.copy %x -> %h : !t -> !t
  mdsl.sched.layer_loop %l = 0 to 2 reverse {
    mdsl.sched.launch "scale"(%h) -> (%t1) {factor = 0.5 : f64} : (!t) -> (!t)
    mdsl.sched.launch "silu"(%t1) -> (%t2) : (!t) -> (!t)
    mdsl.sched.recompute_segment "seg" layer(%l) {
      mdsl.sched.launch "matmul"(%t2) -> (%c) : (!t) -> (!t)
      mdsl.sched.copy %c -> %h : !t -> !t
    }
  }
  mdsl.sched.copy %h -> %y : !t -> !t
}

// -----

!t = !mdsl.sched.buffer<[256], fp32>
!t2 = !mdsl.sched.buffer<[512], fp32>

// Carried by bytes: the body writes only the first half of %p before reading
// all of it, so %p is live across the whole loop ([1, 6]) and cannot take the
// place of %u ([1, 2]); %q is written whole (through two halves) before it is
// read, so it is per-layer ([4, 6]) and does take %u's place.
// CHECK-LABEL: mdsl.sched.program @partial_writes arenas(params = 0, activations = 4096, workspace = 0, grads = 0, optimizer = 0, external = 2048) {
// CHECK:         %p = mdsl.sched.buffer activations offset 2048 bytes 2048
// CHECK:         %q = mdsl.sched.buffer activations offset 0 bytes 2048
// CHECK:         %u = mdsl.sched.buffer activations offset 0 bytes 2048
// CHECK:         %r = mdsl.sched.buffer activations offset 0 bytes 1024
mdsl.sched.program @partial_writes arenas(params = 0, activations = 0, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  %x = mdsl.sched.buffer external bytes 1024 : !t
  %y = mdsl.sched.buffer external bytes 1024 : !t
  %p = mdsl.sched.buffer activations bytes 2048 : !t2
  %p0 = mdsl.sched.buffer activations offset 0 bytes 1024 alias_of %p : !t from !t2
  %q = mdsl.sched.buffer activations bytes 2048 : !t2
  %q0 = mdsl.sched.buffer activations offset 0 bytes 1024 alias_of %q : !t from !t2
  %q1 = mdsl.sched.buffer activations offset 1024 bytes 1024 alias_of %q : !t from !t2
  %u = mdsl.sched.buffer activations bytes 2048 : !t2
  %r = mdsl.sched.buffer activations bytes 1024 : !t
  mdsl.sched.memset %y : !t
  mdsl.sched.layer_loop %l = 0 to 4 {
    mdsl.sched.launch "matmul"(%x) -> (%u) : (!t) -> (!t2)
    mdsl.sched.launch "matmul"(%u) -> (%y) : (!t2) -> (!t)
    mdsl.sched.copy %x -> %p0 : !t -> !t
    mdsl.sched.copy %x -> %q0 : !t -> !t
    mdsl.sched.copy %x -> %q1 : !t -> !t
    mdsl.sched.launch "matmul"(%p, %q) -> (%y) : (!t2, !t2) -> (!t)
  }
  mdsl.sched.launch "matmul"(%y) -> (%r) : (!t) -> (!t)
  mdsl.sched.copy %r -> %y : !t -> !t
}
