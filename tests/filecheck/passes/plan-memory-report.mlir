// mdsl-opt --emit=memory-report: each arena's size, the peak (the reusable
// arenas together, and the most bytes live at one step) and the 10 largest
// buffers with their arena, bytes, offset and live steps.
// RUN: mdsl-opt %s -p mdsl-plan-memory --emit=memory-report | filecheck %s
// RUN: not mdsl-opt %s --emit=memory-report 2>&1 | filecheck %s --check-prefix=UNPLANNED
// RUN: not mdsl-opt %s -p mdsl-plan-memory --emit=memory-plot 2>&1 | filecheck %s --check-prefix=NOFILE

!t = !mdsl.sched.buffer<[256], fp32>
!st = !mdsl.sched.buffer<[3, 256], fp32>
!ws = !mdsl.sched.buffer<[100], int8>

// CHECK:      memory plan of @layers: 12 buffers, 1 aliases, 8 steps, 0 in-place launches
// CHECK-NEXT:   arena               bytes
// CHECK-NEXT:   params               3072
// CHECK-NEXT:   activations          6144
// CHECK-NEXT:   workspace             100
// CHECK-NEXT:   grads                   0
// CHECK-NEXT:   optimizer               0
// CHECK-NEXT:   external             2048
// CHECK-NEXT: peak: 6244 bytes of arenas (activations + workspace), 6244 bytes live at once (step 2)
// CHECK-NEXT: largest buffers (10 of 12):
// CHECK-NEXT:   buffer arena               bytes       offset  steps
// CHECK-NEXT:   %saved activations          3072         2048  [1, 6]
// CHECK-NEXT:   %w     params               3072            0  [1, 5]
// CHECK-NEXT:   %h     activations          1024            0  [0, 6]
// CHECK-NEXT:   %after activations          1024         1024  [6, 7]
// CHECK-NEXT:   %t1    activations          1024         1024  [1, 2]
// CHECK-NEXT:   %t3    activations          1024         1024  [3, 5]
// CHECK-NEXT:   %t2    activations          1024         5120  [2, 3]
// CHECK-NEXT:   %x     external             1024            0  [0, 0]
// CHECK-NEXT:   %y     external             1024         1024  [7, 7]
// CHECK-NEXT:   %dead  activations           512            0  -
// CHECK-EMPTY:
// UNPLANNED: error[E029]: buffer %x of @layers has no offset: run mdsl-plan-memory first (-p mdsl-plan-memory)
// NOFILE: error[E029]: --emit=memory-plot needs the PNG file to write: --emit=memory-plot FILE.png
mdsl.sched.program @layers arenas(params = 0, activations = 0, workspace = 0, grads = 0, optimizer = 0, external = 0) {
  %x = mdsl.sched.buffer external bytes 1024 : !t
  %y = mdsl.sched.buffer external bytes 1024 : !t
  %w = mdsl.sched.buffer params bytes 3072 : !st
  %h = mdsl.sched.buffer activations bytes 1024 : !t
  %t1 = mdsl.sched.buffer activations bytes 1024 : !t
  %t2 = mdsl.sched.buffer activations bytes 1024 : !t
  %t3 = mdsl.sched.buffer activations bytes 1024 : !t
  %saved = mdsl.sched.buffer activations bytes 3072 : !st
  %view = mdsl.sched.buffer activations offset 0 bytes 1024 alias_of %saved : !t from !st
  %after = mdsl.sched.buffer activations bytes 1024 : !t
  %dead = mdsl.sched.buffer activations bytes 512 : !mdsl.sched.buffer<[128], fp32>
  %scratch = mdsl.sched.buffer workspace bytes 100 : !ws
  %scratch2 = mdsl.sched.buffer workspace bytes 50 : !mdsl.sched.buffer<[50], int8>
  mdsl.sched.copy %x -> %h : !t -> !t
  mdsl.sched.layer_loop %l = 0 to 3 {
    %wl = mdsl.sched.layer_view %w[%l] : !st -> !t
    %sl = mdsl.sched.layer_view %saved[%l] : !st -> !t
    mdsl.sched.launch "matmul"(%h, %wl) -> (%t1) : (!t, !t) -> (!t)
    mdsl.sched.launch "matmul"(%t1) -> (%t2, %scratch) {scratch} : (!t) -> (!t, !ws)
    mdsl.sched.launch "matmul"(%t2) -> (%t3) : (!t) -> (!t)
    mdsl.sched.copy %t3 -> %sl : !t -> !t
    mdsl.sched.copy %t3 -> %h : !t -> !t
  }
  mdsl.sched.launch "matmul"(%view, %h) -> (%after, %scratch2) {scratch} : (!t, !t) -> (!t, !mdsl.sched.buffer<[50], int8>)
  mdsl.sched.copy %after -> %y : !t -> !t
}
