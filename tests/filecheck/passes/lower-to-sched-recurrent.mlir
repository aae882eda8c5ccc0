// mdsl-lower-to-sched{kv_cache=C}: a Mamba conv and scan without a state operand of their own
// carry their state from one decoding run to the next: mamba_conv1d_step and
// mamba_selective_scan_step read and update state buffers ([B, D, K-1] and [B, D, N], stacked per
// layer) at the runtime position, and the program takes one more input, how many of the run's
// steps are real. Without kv_cache, and for ops that take their state as an operand, plain launches.
// RUN: mdsl-opt %s -p 'mdsl-lower-to-sched{kv_cache=16}' | filecheck %s
// RUN: mdsl-opt %s -p mdsl-lower-to-sched | filecheck %s --check-prefix=PLAIN

!x = !mdsl.graph.tensor<[1, 6, 4], fp32>
!bc = !mdsl.graph.tensor<[1, 1, 3, 4], fp32>
mdsl.graph.model @m config {} {
  mdsl.graph.func @block(%x: !x, %w: !mdsl.graph.tensor<[6, 1, 4], fp32>, %bias: !mdsl.graph.tensor<[6], fp32>, %a: !mdsl.graph.tensor<[6, 3], fp32>, %b: !bc, %d: !mdsl.graph.tensor<[6], fp32>, %own: !mdsl.graph.tensor<[1, 6, 3], fp32>) -> !x attributes {kind = "block"} {
    %u = mdsl.graph.mamba_conv1d %x, %w bias %bias : !x, !mdsl.graph.tensor<[6, 1, 4], fp32> bias !mdsl.graph.tensor<[6], fp32> -> !x
    %y, %h = mdsl.graph.mamba_selective_scan %u, %x, %a, %b, %b, %d, %d : (!x, !x, !mdsl.graph.tensor<[6, 3], fp32>, !bc, !bc, !mdsl.graph.tensor<[6], fp32>, !mdsl.graph.tensor<[6], fp32>) -> (!x, !mdsl.graph.tensor<[1, 6, 3], fp32>)
    %y2, %h2 = mdsl.graph.mamba_selective_scan %y, %x, %a, %b, %b, %d, %d, %own : (!x, !x, !mdsl.graph.tensor<[6, 3], fp32>, !bc, !bc, !mdsl.graph.tensor<[6], fp32>, !mdsl.graph.tensor<[6], fp32>, !mdsl.graph.tensor<[1, 6, 3], fp32>) -> (!x, !mdsl.graph.tensor<[1, 6, 3], fp32>)
    mdsl.graph.return %y2 : !x
  }
  mdsl.graph.func @forward(%x: !x, %w: !mdsl.graph.tensor<[6, 1, 4], fp32>, %bias: !mdsl.graph.tensor<[6], fp32>, %a: !mdsl.graph.tensor<[6, 3], fp32>, %b: !bc, %d: !mdsl.graph.tensor<[6], fp32>, %own: !mdsl.graph.tensor<[1, 6, 3], fp32>) -> !x attributes {kind = "forward"} {
    %s = mdsl.graph.stack @block count #mdsl.graph.expr<2> (%x : !x) shared(%w, %bias, %a, %b, %d, %own : !mdsl.graph.tensor<[6, 1, 4], fp32>, !mdsl.graph.tensor<[6], fp32>, !mdsl.graph.tensor<[6, 3], fp32>, !bc, !mdsl.graph.tensor<[6], fp32>, !mdsl.graph.tensor<[1, 6, 3], fp32>) -> !x
    mdsl.graph.return %s : !x
  }
}

// CHECK:      %position = mdsl.sched.buffer external bytes 4 {input = 7 : i64} : !mdsl.sched.buffer<[1], int32>
// CHECK:      %conv_state = mdsl.sched.buffer external bytes 144 {state = "conv0"} : !mdsl.sched.buffer<[2, 1, 6, 3], fp32>
// CHECK:      %valid = mdsl.sched.buffer external bytes 4 {input = 8 : i64} : !mdsl.sched.buffer<[1], int32>
// CHECK:      %ssm_state = mdsl.sched.buffer external bytes 144 {state = "ssm1"} : !mdsl.sched.buffer<[2, 1, 6, 3], fp32>
// CHECK-NOT:  state = "ssm2"
// CHECK:      mdsl.sched.layer_loop
// CHECK:        %[[CS:.*]] = mdsl.sched.layer_view %conv_state[%{{.*}}] : !mdsl.sched.buffer<[2, 1, 6, 3], fp32> -> !mdsl.sched.buffer<[1, 6, 3], fp32>
// CHECK-NEXT:   mdsl.sched.launch "mamba_conv1d_step"(%{{.*}}, %w, %[[CS]], %position, %valid, %bias) -> (%u, %[[CS]]) {inplace, kernel_size = 4 : i64, activation = "silu"}
// CHECK-NEXT:   %[[SS:.*]] = mdsl.sched.layer_view %ssm_state[%{{.*}}]
// CHECK-NEXT:   mdsl.sched.launch "mamba_selective_scan_step"(%u, %{{.*}}, %a, %b, %b, %d, %d, %[[SS]], %position, %valid) -> (%y, %[[SS]]) {inplace, chunk_size = 256 : i64}
// CHECK-NEXT:   mdsl.sched.launch "mamba_selective_scan"(%y, %{{.*}}, %a, %b, %b, %d, %d, %own) -> (%y2, %h2)

// PLAIN-NOT: _step
// PLAIN:     mdsl.sched.launch "mamba_conv1d"
// PLAIN:     mdsl.sched.launch "mamba_selective_scan"
