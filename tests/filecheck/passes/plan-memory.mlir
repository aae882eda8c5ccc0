// mdsl-plan-memory: liveness, reuse after death, aliases, params/external laid
// out in order, arena sizes, the alignment option; already-planned offsets are
// replanned (aliases keep theirs).
// RUN: mdsl-opt %s --split-input-file -p mdsl-plan-memory | filecheck %s
// RUN: mdsl-opt %s --split-input-file -p 'mdsl-plan-memory{alignment=64}' | filecheck %s --check-prefix=ALIGN64
// RUN: mdsl-opt %s --split-input-file -p mdsl-plan-memory,mdsl-plan-memory | filecheck %s

!t = !mdsl.sched.buffer<[256], fp32>
!s = !mdsl.sched.buffer<[25], fp32>
!h = !mdsl.sched.buffer<[128], fp32>

// Steps: %a [0, 1], %b [1, 2], %c [2, 3], %d [3, 4]: %c takes %a's place once
// %a is dead, %d takes %b's. Buffers that are never used go to offset 0.
// CHECK-LABEL: mdsl.sched.program @reuse arenas(params = 1280, activations = 2048, workspace = 0, grads = 0, optimizer = 0, external = 2048) {
// CHECK-NEXT:    %x = mdsl.sched.buffer external offset 0 bytes 1024
// CHECK-NEXT:    %w = mdsl.sched.buffer params offset 0 bytes 100
// CHECK-NEXT:    %w2 = mdsl.sched.buffer params offset 256 bytes 1024
// CHECK-NEXT:    %y = mdsl.sched.buffer external offset 1024 bytes 1024
// CHECK-NEXT:    %a = mdsl.sched.buffer activations offset 0 bytes 1024
// CHECK-NEXT:    %b = mdsl.sched.buffer activations offset 1024 bytes 1024
// CHECK-NEXT:    %c = mdsl.sched.buffer activations offset 0 bytes 1024
// CHECK-NEXT:    %d = mdsl.sched.buffer activations offset 1024 bytes 1024
// CHECK-NEXT:    %dead = mdsl.sched.buffer activations offset 0 bytes 512
// CHECK-NOT:     inplace
// ALIGN64-LABEL: mdsl.sched.program @reuse arenas(params = 1152, activations = 2048, workspace = 0, grads = 0, optimizer = 0, external = 2048) {
// ALIGN64:       %w2 = mdsl.sched.buffer params offset 128 bytes 1024
mdsl.sched.program @reuse arenas(params = 20000, activations = 8192, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  %x = mdsl.sched.buffer external bytes 1024 : !t
  %w = mdsl.sched.buffer params bytes 100 : !s
  %w2 = mdsl.sched.buffer params offset 9999 bytes 1024 : !t
  %y = mdsl.sched.buffer external bytes 1024 : !t
  %a = mdsl.sched.buffer activations offset 4096 bytes 1024 : !t
  %b = mdsl.sched.buffer activations bytes 1024 : !t
  %c = mdsl.sched.buffer activations bytes 1024 : !t
  %d = mdsl.sched.buffer activations bytes 1024 : !t
  %dead = mdsl.sched.buffer activations bytes 512 : !h
  mdsl.sched.launch "matmul"(%x, %w) -> (%a) : (!t, !s) -> (!t)
  mdsl.sched.launch "matmul"(%a, %w2) -> (%b) : (!t, !t) -> (!t)
  mdsl.sched.launch "matmul"(%b, %w) -> (%c) : (!t, !s) -> (!t)
  mdsl.sched.launch "matmul"(%c, %w) -> (%d) : (!t, !s) -> (!t)
  mdsl.sched.copy %d -> %y : !t -> !t
}

// -----

!t = !mdsl.sched.buffer<[256], fp32>
!t2 = !mdsl.sched.buffer<[512], fp32>
!h = !mdsl.sched.buffer<[128], fp32>

// An alias has no space of its own; its uses keep its root live: %a lives
// [0, 4] through %hi2 (an alias of an alias), so %c (step 3) cannot take
// %a's place; %d (step 5) can. Alias offsets are kept.
// CHECK-LABEL: mdsl.sched.program @aliases arenas(params = 0, activations = 4096, workspace = 0, grads = 0, optimizer = 0, external = 2048) {
// CHECK-NEXT:    %x = mdsl.sched.buffer external offset 0 bytes 1024
// CHECK-NEXT:    %a = mdsl.sched.buffer activations offset 0 bytes 2048
// CHECK-NEXT:    %lo = mdsl.sched.buffer activations offset 0 bytes 1024 alias_of %a
// CHECK-NEXT:    %hi = mdsl.sched.buffer activations offset 1024 bytes 1024 alias_of %a
// CHECK-NEXT:    %hi2 = mdsl.sched.buffer activations offset 512 bytes 512 alias_of %hi
// CHECK-NEXT:    %b = mdsl.sched.buffer activations offset 2048 bytes 1024
// CHECK-NEXT:    %c = mdsl.sched.buffer activations offset 3072 bytes 1024
// CHECK-NEXT:    %d = mdsl.sched.buffer activations offset 0 bytes 2048
// CHECK-NEXT:    %y = mdsl.sched.buffer external offset 1024 bytes 1024
mdsl.sched.program @aliases arenas(params = 0, activations = 0, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  %x = mdsl.sched.buffer external bytes 1024 : !t
  %a = mdsl.sched.buffer activations bytes 2048 : !t2
  %lo = mdsl.sched.buffer activations offset 0 bytes 1024 alias_of %a : !t from !t2
  %hi = mdsl.sched.buffer activations offset 1024 bytes 1024 alias_of %a : !t from !t2
  %hi2 = mdsl.sched.buffer activations offset 512 bytes 512 alias_of %hi : !h from !t
  %b = mdsl.sched.buffer activations bytes 1024 : !t
  %c = mdsl.sched.buffer activations bytes 1024 : !t
  %d = mdsl.sched.buffer activations bytes 2048 : !t2
  %y = mdsl.sched.buffer external bytes 1024 : !t
  mdsl.sched.launch "matmul"(%x) -> (%lo) : (!t) -> (!t)
  mdsl.sched.launch "matmul"(%x) -> (%hi) : (!t) -> (!t)
  mdsl.sched.launch "matmul"(%lo) -> (%b) : (!t) -> (!t)
  mdsl.sched.launch "matmul"(%b) -> (%c) : (!t) -> (!t)
  mdsl.sched.launch "matmul"(%hi2, %c) -> (%y) : (!h, !t) -> (!t)
  mdsl.sched.launch "matmul"(%y) -> (%d) : (!t) -> (!t2)
  mdsl.sched.copy %d -> %y {bytes = 1024 : i64} : !t2 -> !t
}

// -----

!t = !mdsl.sched.buffer<[256], fp32>

// Grads, like params, outlive a run (they accumulate over micro-batches until
// the optimizer step): laid out in declaration order, never reused, so %g3
// does not take the place of %g1, although %g1 is dead by then.
// CHECK-LABEL: mdsl.sched.program @grads arenas(params = 1024, activations = 1024, workspace = 0, grads = 3072, optimizer = 0, external = 1024) {
// CHECK-NEXT:    %x = mdsl.sched.buffer external offset 0 bytes 1024
// CHECK-NEXT:    %w = mdsl.sched.buffer params offset 0 bytes 1024
// CHECK-NEXT:    %a = mdsl.sched.buffer activations offset 0 bytes 1024
// CHECK-NEXT:    %g1 = mdsl.sched.buffer grads offset 0 bytes 1024
// CHECK-NEXT:    %g2 = mdsl.sched.buffer grads offset 1024 bytes 1024
// CHECK:         %g3 = mdsl.sched.buffer grads offset 2048 bytes 1024
mdsl.sched.program @grads arenas(params = 0, activations = 0, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  %x = mdsl.sched.buffer external bytes 1024 : !t
  %w = mdsl.sched.buffer params bytes 1024 : !t
  %a = mdsl.sched.buffer activations bytes 1024 : !t
  %g1 = mdsl.sched.buffer grads bytes 1024 : !t
  %g2 = mdsl.sched.buffer grads bytes 1024 : !t
  mdsl.sched.memset %g1 : !t
  mdsl.sched.launch "matmul"(%x, %w) -> (%a) : (!t, !t) -> (!t)
  mdsl.sched.collective "all_reduce" %g1 -> %g2 group "dp" {op = "sum"} : !t -> !t
  %g3 = mdsl.sched.buffer grads bytes 1024 : !t
  mdsl.sched.launch "matmul"(%g2, %a) -> (%g3) : (!t, !t) -> (!t)
  mdsl.sched.copy %g3 -> %x : !t -> !t
}
