// mdsl-lower-to-sched: a launch's operands fill its primitive's input slots in order, so an empty
// optional slot before a given one (mamba_conv1d with a state and no bias) is recorded as `absent`;
// with the bias given, or with neither, there is nothing to record.
// RUN: mdsl-opt %s -p mdsl-lower-to-sched | filecheck %s

!x = !mdsl.graph.tensor<[1, 6, 5], fp32>
!s = !mdsl.graph.tensor<[1, 6, 3], fp32>
!w = !mdsl.graph.tensor<[6, 1, 4], fp32>
!b = !mdsl.graph.tensor<[6], fp32>
mdsl.graph.model @m config {} {
  mdsl.graph.func @forward(%x: !x, %state: !s, %w: !w, %bias: !b) -> (!x, !x, !x) attributes {kind = "forward"} {
    %y, %out = mdsl.graph.mamba_conv1d %x, %w state %state : !x, !w state !s -> !x, !s
    %y2, %out2 = mdsl.graph.mamba_conv1d %x, %w bias %bias state %state : !x, !w bias !b state !s -> !x, !s
    %y3 = mdsl.graph.mamba_conv1d %x, %w : !x, !w -> !x
    mdsl.graph.return %y, %y2, %y3 : !x, !x, !x
  }
}

// CHECK:      mdsl.sched.launch "mamba_conv1d"(%x, %w, %state) -> (%y, %out) {kernel_size = 4 : i64, activation = "silu", absent = array<i64: 2>}
// CHECK-NEXT: mdsl.sched.launch "mamba_conv1d"(%x, %w, %bias, %state) -> (%y2, %out2) {kernel_size = 4 : i64, activation = "silu"} :
// CHECK-NEXT: mdsl.sched.launch "mamba_conv1d"(%x, %w) -> (%y3) {kernel_size = 4 : i64, activation = "silu"} :
