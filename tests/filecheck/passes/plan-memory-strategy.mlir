// mdsl-plan-memory: first-fit and best-fit where they differ, and kernel
// scratch (a trailing workspace output of a launch marked `scratch`: live for
// that one launch, reused by the next).
// RUN: mdsl-opt %s --split-input-file -p mdsl-plan-memory | filecheck %s --check-prefixes=CHECK,FIRST
// RUN: mdsl-opt %s --split-input-file -p 'mdsl-plan-memory{strategy=first-fit}' | filecheck %s --check-prefixes=CHECK,FIRST
// RUN: mdsl-opt %s --split-input-file -p 'mdsl-plan-memory{strategy=best-fit}' | filecheck %s --check-prefixes=CHECK,BEST
// RUN: not mdsl-opt %s --split-input-file -p 'mdsl-plan-memory{strategy=worst-fit}' 2>&1 | filecheck %s --check-prefix=BAD
// RUN: not mdsl-opt %s --split-input-file -p 'mdsl-plan-memory{alignment=0}' 2>&1 | filecheck %s --check-prefix=BADALIGN

!t = !mdsl.sched.buffer<[256], fp32>
!t2 = !mdsl.sched.buffer<[512], fp32>

// %g1 [0, 2] at 0, %a [0, 5] at 2048, %g2 [1, 2] at 3072, %b [1, 5] at 4096.
// At step 3 the free gaps are [0, 2048) and [3072, 4096): %n goes to the first
// with first-fit, to the smaller with best-fit.
// CHECK-LABEL: mdsl.sched.program @fit arenas(params = 0, activations = 5120, workspace = 0, grads = 0, optimizer = 0, external = 1024) {
// CHECK:         %g1 = mdsl.sched.buffer activations offset 0 bytes 2048
// CHECK-NEXT:    %a = mdsl.sched.buffer activations offset 2048 bytes 1024
// CHECK-NEXT:    %g2 = mdsl.sched.buffer activations offset 3072 bytes 1024
// CHECK-NEXT:    %b = mdsl.sched.buffer activations offset 4096 bytes 1024
// FIRST-NEXT:    %n = mdsl.sched.buffer activations offset 0 bytes 1024
// BEST-NEXT:     %n = mdsl.sched.buffer activations offset 3072 bytes 1024
mdsl.sched.program @fit arenas(params = 0, activations = 0, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  %x = mdsl.sched.buffer external bytes 1024 : !t
  %g1 = mdsl.sched.buffer activations bytes 2048 : !t2
  %a = mdsl.sched.buffer activations bytes 1024 : !t
  %g2 = mdsl.sched.buffer activations bytes 1024 : !t
  %b = mdsl.sched.buffer activations bytes 1024 : !t
  %n = mdsl.sched.buffer activations bytes 1024 : !t
  mdsl.sched.launch "matmul"(%x) -> (%g1, %a) : (!t) -> (!t2, !t)
  mdsl.sched.launch "matmul"(%x) -> (%g2, %b) : (!t) -> (!t, !t)
  mdsl.sched.launch "matmul"(%g1, %g2) -> (%x) : (!t2, !t) -> (!t)
  mdsl.sched.launch "matmul"(%x) -> (%n) : (!t) -> (!t)
  mdsl.sched.launch "matmul"(%n) -> (%x) : (!t) -> (!t)
  mdsl.sched.launch "matmul"(%a, %b) -> (%x) : (!t, !t) -> (!t)
}

// -----

!t = !mdsl.sched.buffer<[256], fp32>
!r = !mdsl.sched.buffer<[2, 128], fp32>
!s1 = !mdsl.sched.buffer<[2000], int8>
!s2 = !mdsl.sched.buffer<[3000], int8>
!s3 = !mdsl.sched.buffer<[1000], int8>

// Scratch lives one step: %s1 (step 0) and %ws (first written at step 1,
// live [1, 4]) share offset 0; %s2 (step 2) and %s3 (step 3) go above %ws and
// share 1024. The scratch output takes no part in in-place reuse (softmax and
// relu write their result over %a, never the scratch over anything).
// CHECK-LABEL: mdsl.sched.program @scratch arenas(params = 0, activations = 1024, workspace = 4024, grads = 0, optimizer = 0, external = 2048) {
// CHECK-NEXT:    %x = mdsl.sched.buffer external offset 0 bytes 1024
// CHECK-NEXT:    %y = mdsl.sched.buffer external offset 1024 bytes 1024
// CHECK-NEXT:    %a = mdsl.sched.buffer activations offset 0 bytes 1024 :
// CHECK-NEXT:    %b = mdsl.sched.buffer activations offset 0 bytes 1024 alias_of %a :
// CHECK-NEXT:    %r = mdsl.sched.buffer activations offset 0 bytes 1024 alias_of %a :
// CHECK-NEXT:    %ws = mdsl.sched.buffer workspace offset 0 bytes 1024 :
// CHECK-NEXT:    %s1 = mdsl.sched.buffer workspace offset 0 bytes 2000 :
// CHECK-NEXT:    %s2 = mdsl.sched.buffer workspace offset 1024 bytes 3000 :
// CHECK-NEXT:    %s3 = mdsl.sched.buffer workspace offset 1024 bytes 1000 :
// CHECK-NEXT:    mdsl.sched.launch "softmax"(%x) -> (%a, %s1) {dim = -1 : i64, scratch} :
// CHECK-NEXT:    mdsl.sched.memset %ws
// CHECK-NEXT:    mdsl.sched.launch "softmax"(%a) -> (%b, %s2) {dim = -1 : i64, scratch, inplace} :
// CHECK-NEXT:    mdsl.sched.launch "relu"(%b, %ws) -> (%r, %s3) {scratch, inplace} :
mdsl.sched.program @scratch arenas(params = 0, activations = 0, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  %x = mdsl.sched.buffer external bytes 1024 : !t
  %y = mdsl.sched.buffer external bytes 1024 : !t
  %a = mdsl.sched.buffer activations bytes 1024 : !t
  %b = mdsl.sched.buffer activations bytes 1024 : !t
  %r = mdsl.sched.buffer activations bytes 1024 : !t
  %ws = mdsl.sched.buffer workspace bytes 1024 : !r
  %s1 = mdsl.sched.buffer workspace bytes 2000 : !s1
  %s2 = mdsl.sched.buffer workspace bytes 3000 : !s2
  %s3 = mdsl.sched.buffer workspace bytes 1000 : !s3
  mdsl.sched.launch "softmax"(%x) -> (%a, %s1) {dim = -1 : i64, scratch} : (!t) -> (!t, !s1)
  mdsl.sched.memset %ws : !r
  mdsl.sched.launch "softmax"(%a) -> (%b, %s2) {dim = -1 : i64, scratch} : (!t) -> (!t, !s2)
  mdsl.sched.launch "relu"(%b, %ws) -> (%r, %s3) {scratch} : (!t, !r) -> (!t, !s3)
  mdsl.sched.launch "matmul"(%r, %ws) -> (%y) : (!t, !r) -> (!t)
}

// BAD: error[E029]: mdsl-plan-memory: unknown strategy 'worst-fit'
// BADALIGN: error[E029]: mdsl-plan-memory: alignment must be a positive integer, got 0
