// mdsl-plan-memory in-place reuse: an output of a kernel whose registry entry
// allows it takes over the memory of an input that dies at that launch (it
// becomes an alias of the input's root at offset 0, the launch is marked
// inplace); chains land in one buffer; every rule that refuses it.
// RUN: mdsl-opt %s --split-input-file -p mdsl-plan-memory | filecheck %s
// RUN: mdsl-opt %s --split-input-file -p 'mdsl-plan-memory{inplace=false}' | filecheck %s --check-prefix=OFF

!t = !mdsl.sched.buffer<[256], fp32>

// silu -> relu -> gelu -> scale: %b, %c and %d all live in %a (not %c in %b):
// the chain is one buffer whose interval covers every link. %x is external,
// so %a cannot take it over.
// CHECK-LABEL: mdsl.sched.program @chain arenas(params = 0, activations = 1024, workspace = 0, grads = 0, optimizer = 0, external = 2048) {
// CHECK-NEXT:    %x = mdsl.sched.buffer external offset 0 bytes 1024
// CHECK-NEXT:    %y = mdsl.sched.buffer external offset 1024 bytes 1024
// CHECK-NEXT:    %a = mdsl.sched.buffer activations offset 0 bytes 1024 :
// CHECK-NEXT:    %b = mdsl.sched.buffer activations offset 0 bytes 1024 alias_of %a :
// CHECK-NEXT:    %c = mdsl.sched.buffer activations offset 0 bytes 1024 alias_of %a :
// CHECK-NEXT:    %d = mdsl.sched.buffer activations offset 0 bytes 1024 alias_of %a :
// CHECK-NEXT:    mdsl.sched.launch "silu"(%x) -> (%a) :
// CHECK-NEXT:    mdsl.sched.launch "relu"(%a) -> (%b) {inplace} :
// CHECK-NEXT:    mdsl.sched.launch "gelu"(%b) -> (%c) {inplace} :
// CHECK-NEXT:    mdsl.sched.launch "scale"(%c) -> (%d) {factor = 2.000000e+00 : f64, inplace} :
// OFF-LABEL: mdsl.sched.program @chain arenas(params = 0, activations = 2048, workspace = 0, grads = 0, optimizer = 0, external = 2048) {
// OFF-NOT:   alias_of
// OFF-NOT:   inplace
// OFF:       mdsl.sched.copy %d -> %y
mdsl.sched.program @chain arenas(params = 0, activations = 0, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  %x = mdsl.sched.buffer external bytes 1024 : !t
  %y = mdsl.sched.buffer external bytes 1024 : !t
  %a = mdsl.sched.buffer activations bytes 1024 : !t
  %b = mdsl.sched.buffer activations bytes 1024 : !t
  %c = mdsl.sched.buffer activations bytes 1024 : !t
  %d = mdsl.sched.buffer activations bytes 1024 : !t
  mdsl.sched.launch "silu"(%x) -> (%a) : (!t) -> (!t)
  mdsl.sched.launch "relu"(%a) -> (%b) : (!t) -> (!t)
  mdsl.sched.launch "gelu"(%b) -> (%c) : (!t) -> (!t)
  mdsl.sched.launch "scale"(%c) -> (%d) {factor = 2.0 : f64} : (!t) -> (!t)
  mdsl.sched.copy %d -> %y : !t -> !t
}

// -----

!t = !mdsl.sched.buffer<[256], fp32>
!h = !mdsl.sched.buffer<[128], fp32>

// A value with two consumers is taken over only by the last: relu cannot write
// over %a (add reads it later), add can. Deaths are counted on the program's
// own aliases: %b is not an alias of %a, so %a's death does not wait for %b's
// uses. Refused: an output of another size (%h), a parameter input (%w), an
// output used before the launch (%f, memset first), an output that is an
// alias (%o). Intervals: %a+%s [0, 3], %b [1, 2], %h [3, 8], %e [4, 6],
// %f [5, 7], %big [7, 9].
// CHECK-LABEL: mdsl.sched.program @refused arenas(params = 1024, activations = 4608, workspace = 0, grads = 0, optimizer = 0, external = 2048) {
// CHECK-NEXT:    %x = mdsl.sched.buffer external offset 0 bytes 1024
// CHECK-NEXT:    %y = mdsl.sched.buffer external offset 1024 bytes 1024
// CHECK-NEXT:    %w = mdsl.sched.buffer params offset 0 bytes 1024
// CHECK-NEXT:    %a = mdsl.sched.buffer activations offset 0 bytes 1024 :
// CHECK-NEXT:    %b = mdsl.sched.buffer activations offset 1024 bytes 1024 :
// CHECK-NEXT:    %s = mdsl.sched.buffer activations offset 0 bytes 1024 alias_of %a :
// CHECK-NEXT:    %h = mdsl.sched.buffer activations offset 1024 bytes 512 :
// CHECK-NEXT:    %e = mdsl.sched.buffer activations offset 0 bytes 1024 :
// CHECK-NEXT:    %f = mdsl.sched.buffer activations offset 1536 bytes 1024 :
// CHECK-NEXT:    %big = mdsl.sched.buffer activations offset 2560 bytes 2048 :
// CHECK-NEXT:    %o = mdsl.sched.buffer activations offset 0 bytes 1024 alias_of %big :
// CHECK-NEXT:    mdsl.sched.launch "silu"(%x) -> (%a) :
// CHECK-NEXT:    mdsl.sched.launch "relu"(%a) -> (%b) :
// CHECK-NEXT:    mdsl.sched.launch "add"(%a, %b) -> (%s) {inplace} :
// CHECK-NEXT:    mdsl.sched.launch "silu"(%s) -> (%h) :
// CHECK-NEXT:    mdsl.sched.launch "relu"(%w) -> (%e) :
// CHECK-NEXT:    mdsl.sched.memset %f
// CHECK-NEXT:    mdsl.sched.launch "relu"(%e) -> (%f) :
// CHECK-NEXT:    mdsl.sched.launch "relu"(%f) -> (%o) :
mdsl.sched.program @refused arenas(params = 0, activations = 0, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  %x = mdsl.sched.buffer external bytes 1024 : !t
  %y = mdsl.sched.buffer external bytes 1024 : !t
  %w = mdsl.sched.buffer params bytes 1024 : !t
  %a = mdsl.sched.buffer activations bytes 1024 : !t
  %b = mdsl.sched.buffer activations bytes 1024 : !t
  %s = mdsl.sched.buffer activations bytes 1024 : !t
  %h = mdsl.sched.buffer activations bytes 512 : !h
  %e = mdsl.sched.buffer activations bytes 1024 : !t
  %f = mdsl.sched.buffer activations bytes 1024 : !t
  %big = mdsl.sched.buffer activations bytes 2048 : !mdsl.sched.buffer<[512], fp32>
  %o = mdsl.sched.buffer activations offset 0 bytes 1024 alias_of %big : !t from !mdsl.sched.buffer<[512], fp32>
  mdsl.sched.launch "silu"(%x) -> (%a) : (!t) -> (!t)
  mdsl.sched.launch "relu"(%a) -> (%b) : (!t) -> (!t)
  mdsl.sched.launch "add"(%a, %b) -> (%s) : (!t, !t) -> (!t)
  mdsl.sched.launch "silu"(%s) -> (%h) : (!t) -> (!h)
  mdsl.sched.launch "relu"(%w) -> (%e) : (!t) -> (!t)
  mdsl.sched.memset %f : !t
  mdsl.sched.launch "relu"(%e) -> (%f) : (!t) -> (!t)
  mdsl.sched.launch "relu"(%f) -> (%o) : (!t) -> (!t)
  mdsl.sched.copy %h -> %y {bytes = 512 : i64} : !h -> !t
  mdsl.sched.copy %big -> %y {bytes = 1024 : i64} : !mdsl.sched.buffer<[512], fp32> -> !t
}

// -----

!t = !mdsl.sched.buffer<[256], fp32>
!t2 = !mdsl.sched.buffer<[512], fp32>
!m = !mdsl.sched.buffer<[2, 256], fp32>

// Through aliases: an input that is part of its root (%lo, %hi) is refused; an
// alias that covers its whole root at offset 0 (%v) is accepted, and the
// output aliases the root %a itself. An output declared before the input's
// root (%early) moves after it.
// CHECK-LABEL: mdsl.sched.program @through_aliases arenas(params = 0, activations = 4096, workspace = 0, grads = 0, optimizer = 0, external = 3072) {
// CHECK-NEXT:    %x = mdsl.sched.buffer external offset 0 bytes 2048
// CHECK-NEXT:    %y = mdsl.sched.buffer external offset 2048 bytes 1024
// CHECK-NEXT:    %a = mdsl.sched.buffer activations offset 0 bytes 2048 :
// CHECK-NEXT:    %early = mdsl.sched.buffer activations offset 0 bytes 2048 alias_of %a :
// CHECK-NEXT:    %lo = mdsl.sched.buffer activations offset 0 bytes 1024 alias_of %a :
// CHECK-NEXT:    %hi = mdsl.sched.buffer activations offset 1024 bytes 1024 alias_of %a :
// CHECK-NEXT:    %v = mdsl.sched.buffer activations offset 0 bytes 2048 alias_of %a :
// CHECK-NEXT:    %b = mdsl.sched.buffer activations offset 2048 bytes 1024 :
// CHECK-NEXT:    %c = mdsl.sched.buffer activations offset 3072 bytes 1024 :
// CHECK-NEXT:    mdsl.sched.launch "silu"(%x) -> (%a) :
// CHECK-NEXT:    mdsl.sched.launch "relu"(%lo) -> (%b) :
// CHECK-NEXT:    mdsl.sched.launch "relu"(%hi) -> (%c) :
// CHECK-NEXT:    mdsl.sched.launch "relu"(%v) -> (%early) {inplace} :
mdsl.sched.program @through_aliases arenas(params = 0, activations = 0, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  %x = mdsl.sched.buffer external bytes 2048 : !t2
  %y = mdsl.sched.buffer external bytes 1024 : !t
  %early = mdsl.sched.buffer activations bytes 2048 : !m
  %a = mdsl.sched.buffer activations bytes 2048 : !t2
  %lo = mdsl.sched.buffer activations offset 0 bytes 1024 alias_of %a : !t from !t2
  %hi = mdsl.sched.buffer activations offset 1024 bytes 1024 alias_of %a : !t from !t2
  %v = mdsl.sched.buffer activations offset 0 bytes 2048 alias_of %a : !m from !t2
  %b = mdsl.sched.buffer activations bytes 1024 : !t
  %c = mdsl.sched.buffer activations bytes 1024 : !t
  mdsl.sched.launch "silu"(%x) -> (%a) : (!t2) -> (!t2)
  mdsl.sched.launch "relu"(%lo) -> (%b) : (!t) -> (!t)
  mdsl.sched.launch "relu"(%hi) -> (%c) : (!t) -> (!t)
  mdsl.sched.launch "relu"(%v) -> (%early) : (!m) -> (!m)
  mdsl.sched.copy %early -> %y {bytes = 1024 : i64} : !m -> !t
  mdsl.sched.copy %b -> %y : !t -> !t
  mdsl.sched.copy %c -> %y : !t -> !t
}

// -----

!q = !mdsl.sched.buffer<[1, 2, 4, 8], fp32>
!k = !mdsl.sched.buffer<[1, 1, 4, 8], fp32>
!f = !mdsl.sched.buffer<[4, 4, 2], fp32>

// rope may write both outputs over its inputs; two outputs never take the same
// memory: with %q passed twice, only the first output gets it.
// CHECK-LABEL: mdsl.sched.program @rope
// CHECK:         %qr = mdsl.sched.buffer activations offset 0 bytes 256 alias_of %q :
// CHECK-NEXT:    %kr = mdsl.sched.buffer activations offset 0 bytes 128 alias_of %k :
// CHECK:         mdsl.sched.launch "rope"(%q, %k, %f) -> (%qr, %kr) {inplace} :
// CHECK-LABEL: mdsl.sched.program @rope_twice
// CHECK:         %q2 = mdsl.sched.buffer activations offset 0 bytes 256 alias_of %q :
// CHECK-NEXT:    %k2 = mdsl.sched.buffer activations offset 256 bytes 256 :
// CHECK:         mdsl.sched.launch "rope"(%q, %q, %f) -> (%q2, %k2) {inplace} :
builtin.module {
mdsl.sched.program @rope arenas(params = 0, activations = 0, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  %f = mdsl.sched.buffer external bytes 128 : !f
  %o = mdsl.sched.buffer external bytes 384 : !mdsl.sched.buffer<[96], fp32>
  %q = mdsl.sched.buffer activations bytes 256 : !q
  %k = mdsl.sched.buffer activations bytes 128 : !k
  %qr = mdsl.sched.buffer activations bytes 256 : !q
  %kr = mdsl.sched.buffer activations bytes 128 : !k
  mdsl.sched.launch "transpose"(%f) -> (%q) : (!f) -> (!q)
  mdsl.sched.launch "transpose"(%f) -> (%k) : (!f) -> (!k)
  mdsl.sched.launch "rope"(%q, %k, %f) -> (%qr, %kr) : (!q, !k, !f) -> (!q, !k)
  mdsl.sched.launch "concat"(%qr, %kr) -> (%o) : (!q, !k) -> (!mdsl.sched.buffer<[96], fp32>)
}
mdsl.sched.program @rope_twice arenas(params = 0, activations = 0, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  %f = mdsl.sched.buffer external bytes 128 : !f
  %o = mdsl.sched.buffer external bytes 512 : !mdsl.sched.buffer<[128], fp32>
  %q = mdsl.sched.buffer activations bytes 256 : !q
  %q2 = mdsl.sched.buffer activations bytes 256 : !q
  %k2 = mdsl.sched.buffer activations bytes 256 : !q
  mdsl.sched.launch "transpose"(%f) -> (%q) : (!f) -> (!q)
  mdsl.sched.launch "rope"(%q, %q, %f) -> (%q2, %k2) : (!q, !q, !f) -> (!q, !q)
  mdsl.sched.launch "concat"(%q2, %k2) -> (%o) : (!q, !q) -> (!mdsl.sched.buffer<[128], fp32>)
}
}
