// mdsl-lower-to-sched{kv_cache=C}: attention becomes kv_cache_attention over a cache
// of C positions, stacked per layer (a layer view in the loop), written and read at
// the runtime position, the program's last input. Without kv_cache it is attention.
// RUN: mdsl-opt %s -p 'mdsl-lower-to-sched{kv_cache=32}' | filecheck %s
// RUN: mdsl-opt %s -p mdsl-lower-to-sched | filecheck %s --check-prefix=PLAIN
// RUN: not mdsl-opt %s -p 'mdsl-lower-to-sched{kv_cache=-1}' 2>&1 | filecheck %s --check-prefix=BAD

!q = !mdsl.graph.tensor<[1, 4, 8, 16], fp32>
!kv = !mdsl.graph.tensor<[1, 2, 8, 16], fp32>
!lse = !mdsl.graph.tensor<[1, 4, 8], fp32>
mdsl.graph.model @m config {} {
  mdsl.graph.func @block(%q: !q, %k: !kv, %v: !kv) -> !q attributes {kind = "block"} {
    %out, %lse = mdsl.graph.flash_attention %q, %k, %v {window_size = 4 : i64} : (!q, !kv, !kv) -> (!q, !lse)
    mdsl.graph.return %out : !q
  }
  mdsl.graph.func @forward(%q: !q, %k: !kv, %v: !kv) -> !q attributes {kind = "forward"} {
    %s = mdsl.graph.stack @block count #mdsl.graph.expr<2> (%q : !q) shared(%k, %v : !kv, !kv) -> !q
    mdsl.graph.return %s : !q
  }
}

// CHECK:      %position = mdsl.sched.buffer external bytes 4 {input = 3 : i64} : !mdsl.sched.buffer<[1], int32>
// CHECK:      %k_cache = mdsl.sched.buffer external bytes 8192 {state = "kv0.k"} : !mdsl.sched.buffer<[2, 1, 2, 32, 16], fp32>
// CHECK-NEXT: %v_cache = mdsl.sched.buffer external bytes 8192 {state = "kv0.v"} : !mdsl.sched.buffer<[2, 1, 2, 32, 16], fp32>
// CHECK:      mdsl.sched.layer_loop
// CHECK-NEXT:   %[[KC:.*]] = mdsl.sched.layer_view %k_cache[%{{.*}}] : !mdsl.sched.buffer<[2, 1, 2, 32, 16], fp32> -> !mdsl.sched.buffer<[1, 2, 32, 16], fp32>
// CHECK-NEXT:   %[[VC:.*]] = mdsl.sched.layer_view %v_cache[%{{.*}}]
// CHECK-NEXT:   mdsl.sched.launch "kv_cache_attention"(%q_1, %k, %v, %[[KC]], %[[VC]], %position) -> (%out, %lse, %[[KC]], %[[VC]]) {inplace, causal = true, window_size = 4 : i64}

// PLAIN-NOT: kv_cache_attention
// PLAIN:     mdsl.sched.attention %q_1, %k, %v -> %out, %lse {window = 4 : i64}

// BAD: error[E029]: mdsl-lower-to-sched: kv_cache=-1 is not a number of positions
