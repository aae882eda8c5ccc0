// mdsl.sched.attention and attention_backward of packed rows: the segment ids after the values
// (`segments %ids`, [B, Tk] int32 or int64); the custom print re-parses to itself, the generic one to
// the same IR; ids of another shape are refused.
// RUN: %roundtrip %s | filecheck %s
// RUN: mdsl-opt %s --print-op-generic | mdsl-opt | filecheck %s
// RUN: mdsl-opt %S/Inputs/attention-segments/invalid.mlir --print-diagnostics | filecheck %S/Inputs/attention-segments/invalid.mlir

!q = !mdsl.sched.buffer<[2, 16, 4, 16], fp32>
!kv = !mdsl.sched.buffer<[2, 16, 2, 16], fp32>
!lse = !mdsl.sched.buffer<[2, 4, 16], fp32>
!ids = !mdsl.sched.buffer<[2, 16], int32>
mdsl.sched.program @train arenas(params = 0, activations = 65536, workspace = 0, grads = 0, optimizer = 0, external = 256) {
  %q = mdsl.sched.buffer activations bytes 8192 : !q
  %k = mdsl.sched.buffer activations bytes 4096 : !kv
  %v = mdsl.sched.buffer activations bytes 4096 : !kv
  %o = mdsl.sched.buffer activations bytes 8192 : !q
  %lse = mdsl.sched.buffer activations bytes 512 : !lse
  %ids = mdsl.sched.buffer external bytes 128 : !ids
  // CHECK: mdsl.sched.attention %q, %k, %v segments %ids -> %o, %lse {layout = "bthd"} : !mdsl.sched.buffer<[2, 16, 4, 16], fp32>, !mdsl.sched.buffer<[2, 16, 2, 16], fp32>, !mdsl.sched.buffer<[2, 16, 2, 16], fp32> segments !mdsl.sched.buffer<[2, 16], int32> -> !mdsl.sched.buffer<[2, 16, 4, 16], fp32>, !mdsl.sched.buffer<[2, 4, 16], fp32>
  mdsl.sched.attention %q, %k, %v segments %ids -> %o, %lse {layout = "bthd"} : !q, !kv, !kv segments !ids -> !q, !lse
  // CHECK-NEXT: mdsl.sched.attention_backward %q, %k, %v, %o, %o, %lse segments %ids -> %q, %k, %v {layout = "bthd", window = 4 : i64} : {{.*}} segments !mdsl.sched.buffer<[2, 16], int32> ->
  mdsl.sched.attention_backward %q, %k, %v, %o, %o, %lse segments %ids -> %q, %k, %v {layout = "bthd", window = 4 : i64} : !q, !kv, !kv, !q, !q, !lse segments !ids -> !q, !kv, !kv
  // CHECK-NEXT: mdsl.sched.attention %q, %k, %v -> %o, %lse {layout = "bthd"} :
  mdsl.sched.attention %q, %k, %v -> %o, %lse {layout = "bthd"} : !q, !kv, !kv -> !q, !lse
}
