// mdsl-opt --emit=cost-report: a roofline estimate of each mdsl.sched program, one row per
// op kind (launches, GB read and written, GFLOPs, roofline ms, share of the time), the
// total and the part replayed in recompute segments. By hand (bf16, 1024x4096 activations,
// 4096x4096 weights; H100 SXM: 3.35e12 B/s, 989e12 FLOP/s):
//   gemm, 2 trips: reads 8 MiB + 32 MiB, writes 8 MiB, 2*1024*4096*4096 FLOPs each:
//     compute-bound, 2 * 34.36e9 / 989e12 s = 0.06948 ms;
//   rmsnorm (recomputed), 2 trips: the same bytes, memory-bound: 2 * 48 MiB / 3.35e12 B/s;
//   silu in place with scratch: 8 MiB read, 8 MiB written (the scratch output is not counted);
//   copy: 8 MiB once, then 4096 bytes in each of 2 trips; memset: 8 MiB written.
// RUN: mdsl-opt %s --emit=cost-report | filecheck %s
// RUN: mdsl-opt %s --emit=cost-report --cost-bandwidth 1e12 --cost-flops 1e14 | filecheck %s --check-prefix=PEAKS
// RUN: not mdsl-opt %s --emit=cost-report --cost-bandwidth 0 2>&1 | filecheck %s --check-prefix=BADBW
// RUN: not mdsl-opt %s --emit=cost-report --cost-flops inf 2>&1 | filecheck %s --check-prefix=BADFLOPS
// RUN: not mdsl-opt %s --emit=cost-report --cost-flops fast 2>&1 | filecheck %s --check-prefix=NAN
// RUN: not mdsl-opt %s --cost-flops 1e14 2>&1 | filecheck %s --check-prefix=NOREPORT
// RUN: not mdsl-opt %S/../../../modeldsl/std/models/llama.module --emit=cost-report 2>&1 | filecheck %s --check-prefix=GRAPH
// RUN: mdsl-opt %S/../../../modeldsl/std/models/llama.module --hf %S/../../../examples/tiny_llama -p 'mdsl-specialize{hf="%S/../../../examples/tiny_llama" B=1 T=8},mdsl-lower-to-sched,mdsl-plan-memory' --emit=cost-report | filecheck %s --check-prefix=LLAMA

// CHECK:      cost estimate: roofline at 3350 GB/s and 989 TFLOP/s (H100 SXM, dense bf16); each op takes max(bytes / bandwidth, FLOPs / peak), summed over the ops: no overlap, no caches, no launch latency
// CHECK-NEXT: @step: 0.1171 ms, 10 launches
// CHECK-NEXT:   op kind    launches     GB read  GB written      GFLOPs roofline ms   share
// CHECK-NEXT:   gemm              2     0.08389     0.01678       68.72     0.06948   59.4%
// CHECK-NEXT:   rmsnorm           2     0.08389     0.01678     0.04194     0.03005   25.7%
// CHECK-NEXT:   silu              2     0.01678     0.01678     0.03355     0.01002    8.6%
// CHECK-NEXT:   copy              3    0.008397    0.008397           0    0.005013    4.3%
// CHECK-NEXT:   memset            1           0    0.008389           0    0.002504    2.1%
// CHECK-NEXT:   total            10      0.1929     0.06712       68.79      0.1171  100.0%
// CHECK-NEXT:   recompute         2     0.08389     0.01678     0.04194     0.03005   25.7%  (in the total)
// CHECK-EMPTY:

// PEAKS:      cost estimate: roofline at 1000 GB/s and 100 TFLOP/s (given peaks);
// PEAKS:        gemm              2     0.08389     0.01678       68.72      0.6872

// BADBW:      error[E029]: --cost-bandwidth must be a finite number above 0, got 0
// BADBW-NEXT: hint: e.g. --cost-bandwidth 3.35e+12
// BADFLOPS:   error[E029]: --cost-flops must be a finite number above 0, got inf
// NAN:        error[E029]: --cost-flops 'fast' is not a number
// NOREPORT:   error[E029]: --cost-flops is an option of --emit=cost-report
// NOREPORT-NEXT: hint: add --emit=cost-report
// GRAPH:      error[E029]: --emit=cost-report: no mdsl.sched.program in the input
// GRAPH-NEXT: hint: lower to mdsl.sched first: -p '...,mdsl-lower-to-sched,mdsl-plan-memory'

// LLAMA:      cost estimate: roofline at 3350 GB/s
// LLAMA-NEXT: @forward: {{.*}} ms, 33 launches
// LLAMA-NEXT:   op kind
// LLAMA-NEXT:   gemm             13
// LLAMA-DAG:    attention         2
// LLAMA-DAG:    rmsnorm           5
// LLAMA-DAG:    embedding         1
// LLAMA:        total            33 {{.*}} 100.0%
// LLAMA-NOT:    recompute

!a = !mdsl.sched.buffer<[1024, 4096], bf16>
!w = !mdsl.sched.buffer<[4096, 4096], bf16>
!sw = !mdsl.sched.buffer<[2, 4096, 4096], bf16>
!ws = !mdsl.sched.buffer<[256], int8>

mdsl.sched.program @step arenas(params = 67108864, activations = 16777216, workspace = 256, grads = 0, optimizer = 0, external = 16777216) {
  %x = mdsl.sched.buffer external offset 0 bytes 8388608 : !a
  %y = mdsl.sched.buffer external offset 8388608 bytes 8388608 : !a
  %w = mdsl.sched.buffer params offset 0 bytes 67108864 : !sw
  %h = mdsl.sched.buffer activations offset 0 bytes 8388608 : !a
  %t = mdsl.sched.buffer activations offset 8388608 bytes 8388608 : !a
  %t_out = mdsl.sched.buffer activations offset 0 bytes 8388608 alias_of %t : !a
  %ws = mdsl.sched.buffer workspace offset 0 bytes 256 : !ws
  mdsl.sched.copy %x -> %h : !a -> !a
  mdsl.sched.layer_loop %l = 0 to 2 {
    %wl = mdsl.sched.layer_view %w[%l] : !sw -> !w
    mdsl.sched.gemm %h, %wl -> %t {transb = true} : !a, !w -> !a
    mdsl.sched.launch "silu"(%t) -> (%t_out, %ws) {inplace, scratch} : (!a) -> (!a, !ws)
    mdsl.sched.recompute_segment "mlp" layer(%l) {
      mdsl.sched.launch "rmsnorm"(%t_out, %wl) -> (%h) : (!a, !w) -> (!a)
    }
    mdsl.sched.copy %t_out -> %h {bytes = 4096 : i64} : !a -> !a
  }
  mdsl.sched.memset %y : !a
}
