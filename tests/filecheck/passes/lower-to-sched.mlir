// mdsl-lower-to-sched: views and leading-dim splits become aliases, a transpose
// of the last two dims feeding a matmul becomes a GEMM flag, a weight-gradient
// matmul reads 2-d views, a stack becomes a layer loop over layer views, and
// the function's inputs and results live in the external arena.
// RUN: mdsl-opt %s -p mdsl-lower-to-sched | filecheck %s
// RUN: mdsl-opt %s -p 'mdsl-lower-to-sched{storage=fp32}' | filecheck %s --check-prefix=FP32

!x = !mdsl.graph.tensor<[2, 4, 8], bf16>
!w = !mdsl.graph.tensor<[8, 8], bf16>
!sw = !mdsl.graph.tensor<[3, 8, 8], bf16>
mdsl.graph.model @m config {} {
  mdsl.graph.param @w : !w
  mdsl.graph.param @blocks.w : !sw
  mdsl.graph.func @block(%h: !x, %bw: !w) -> !x attributes {kind = "block"} {
    %y = mdsl.graph.matmul %h, %bw {transpose = "NT"} : (!x, !w) -> !x
    %z = mdsl.graph.silu %y : (!x) -> !x
    mdsl.graph.return %z : !x
  }
  mdsl.graph.func @forward(%x: !x) -> (!x, !w) attributes {kind = "forward"} {
    %w = mdsl.graph.param_ref @w : !w
    %sw = mdsl.graph.param_ref @blocks.w : !sw
    %wt = mdsl.graph.transpose %w {dim0 = 0 : i64, dim1 = 1 : i64} : (!w) -> !w
    %a = mdsl.graph.matmul %x, %wt : (!x, !w) -> !x
    %flat = mdsl.graph.view %a : (!x) -> !mdsl.graph.tensor<[8, 8], bf16>
    %top, %bottom = mdsl.graph.split %flat {sizes = #mdsl.graph.dims<[3, 5]>, dim = 0 : i64} : (!mdsl.graph.tensor<[8, 8], bf16>) -> (!mdsl.graph.tensor<[3, 8], bf16>, !mdsl.graph.tensor<[5, 8], bf16>)
    %l, %r = mdsl.graph.split %a {sizes = #mdsl.graph.dims<[4, 4]>} : (!x) -> (!mdsl.graph.tensor<[2, 4, 4], bf16>, !mdsl.graph.tensor<[2, 4, 4], bf16>)
    %lr = mdsl.graph.add %l, %r : (!mdsl.graph.tensor<[2, 4, 4], bf16>, !mdsl.graph.tensor<[2, 4, 4], bf16>) -> !mdsl.graph.tensor<[2, 4, 4], bf16>
    %s = mdsl.graph.stack @block count #mdsl.graph.expr<3> (%a : !x) layers(%sw : !sw) -> !x
    %gw = mdsl.graph.matmul %s, %x {transpose = "TN"} : (!x, !x) -> !w
    mdsl.graph.return %s, %gw : !x, !w
  }
}

// CHECK:      mdsl.sched.program @forward arenas(params = 0, activations = 0, workspace = 0, grads = 0, optimizer = 0, external = 0) attributes {model = "m"} {
// Every parameter first, in the model's order (so all programs of a model share one params layout):
// CHECK-NEXT:   %w = mdsl.sched.buffer params bytes 128 {param = "w"} : !mdsl.sched.buffer<[8, 8], bf16>
// CHECK-NEXT:   %blocks.w = mdsl.sched.buffer params bytes 384 {param = "blocks.w"} : !mdsl.sched.buffer<[3, 8, 8], bf16>
// CHECK-NEXT:   %x = mdsl.sched.buffer external bytes 128 {input = 0 : i64} : !mdsl.sched.buffer<[2, 4, 8], bf16>
// CHECK-NEXT:   %a = mdsl.sched.buffer activations bytes 128 : !mdsl.sched.buffer<[2, 4, 8], bf16>
// CHECK-NEXT:   %flat = mdsl.sched.buffer activations offset 0 bytes 128 alias_of %a : !mdsl.sched.buffer<[8, 8], bf16> from !mdsl.sched.buffer<[2, 4, 8], bf16>
// CHECK-NEXT:   %top = mdsl.sched.buffer activations offset 0 bytes 48 alias_of %flat : !mdsl.sched.buffer<[3, 8], bf16> from !mdsl.sched.buffer<[8, 8], bf16>
// CHECK-NEXT:   %bottom = mdsl.sched.buffer activations offset 48 bytes 80 alias_of %flat : !mdsl.sched.buffer<[5, 8], bf16> from !mdsl.sched.buffer<[8, 8], bf16>
// CHECK-NEXT:   %l = mdsl.sched.buffer activations bytes 64 : !mdsl.sched.buffer<[2, 4, 4], bf16>
// CHECK-NEXT:   %r = mdsl.sched.buffer activations bytes 64 : !mdsl.sched.buffer<[2, 4, 4], bf16>
// CHECK-NEXT:   %lr = mdsl.sched.buffer activations bytes 64 : !mdsl.sched.buffer<[2, 4, 4], bf16>
// CHECK-NEXT:   %y = mdsl.sched.buffer activations bytes 128 : !mdsl.sched.buffer<[2, 4, 8], bf16>
// CHECK-NEXT:   %z = mdsl.sched.buffer activations bytes 128 : !mdsl.sched.buffer<[2, 4, 8], bf16>
// CHECK-NEXT:   %a_2d = mdsl.sched.buffer activations offset 0 bytes 128 alias_of %a : !mdsl.sched.buffer<[8, 8], bf16> from !mdsl.sched.buffer<[2, 4, 8], bf16>
// CHECK-NEXT:   %x_2d = mdsl.sched.buffer external offset 0 bytes 128 alias_of %x : !mdsl.sched.buffer<[8, 8], bf16> from !mdsl.sched.buffer<[2, 4, 8], bf16>
// CHECK-NEXT:   %gw = mdsl.sched.buffer external bytes 128 {output = 1 : i64} : !mdsl.sched.buffer<[8, 8], bf16>
// CHECK-NEXT:   %s = mdsl.sched.buffer external bytes 128 {output = 0 : i64} : !mdsl.sched.buffer<[2, 4, 8], bf16>
// The transpose is a flag of the GEMM, not a launch:
// CHECK-NEXT:   mdsl.sched.gemm %x, %w -> %a {transb = true}
// CHECK-NEXT:   mdsl.sched.launch "split"(%a) -> (%l, %r) {sizes = #mdsl.graph.dims<[4, 4]>, dim = -1 : i64}
// CHECK-NEXT:   mdsl.sched.launch "add"(%l, %r) -> (%lr)
// The stack carries its state in %a, the only use of the stack's input:
// CHECK-NEXT:   mdsl.sched.layer_loop %{{.*}} = 0 to 3 {
// CHECK-NEXT:     %[[LW:.*]] = mdsl.sched.layer_view %blocks.w[%{{.*}}] : !mdsl.sched.buffer<[3, 8, 8], bf16> -> !mdsl.sched.buffer<[8, 8], bf16>
// CHECK-NEXT:     mdsl.sched.gemm %a, %[[LW]] -> %y {transb = true}
// CHECK-NEXT:     mdsl.sched.launch "silu"(%y) -> (%z)
// CHECK-NEXT:     mdsl.sched.copy %z -> %a
// CHECK-NEXT:   }
// A weight gradient contracts every leading dim through 2-d views:
// CHECK-NEXT:   mdsl.sched.gemm %a_2d, %x_2d -> %gw {transa = true}
// CHECK-NEXT:   mdsl.sched.copy %a -> %s
// CHECK-NEXT: }
// CHECK-NOT: mdsl.sched.launch "transpose"

// FP32: %w = mdsl.sched.buffer params bytes 256 {param = "w"} : !mdsl.sched.buffer<[8, 8], fp32>
// FP32: %a = mdsl.sched.buffer activations bytes 256 : !mdsl.sched.buffer<[2, 4, 8], fp32>
