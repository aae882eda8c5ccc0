// Segment ids that are not one per key of each row (attention-segments.mlir runs this file).
// CHECK: error[{{E[0-9]+}}]: 'mdsl.sched.attention' op segments must be [2, 16] int32 or int64 (the keys' example ids), got [2, 8] int32
!q = !mdsl.sched.buffer<[2, 16, 4, 16], fp32>
!kv = !mdsl.sched.buffer<[2, 16, 2, 16], fp32>
!lse = !mdsl.sched.buffer<[2, 4, 16], fp32>
mdsl.sched.program @train arenas(params = 0, activations = 65536, workspace = 0, grads = 0, optimizer = 0, external = 256) {
  %q = mdsl.sched.buffer activations bytes 8192 : !q
  %k = mdsl.sched.buffer activations bytes 4096 : !kv
  %o = mdsl.sched.buffer activations bytes 8192 : !q
  %lse = mdsl.sched.buffer activations bytes 512 : !lse
  %ids = mdsl.sched.buffer external bytes 64 : !mdsl.sched.buffer<[2, 8], int32>
  mdsl.sched.attention %q, %k, %k segments %ids -> %o, %lse {layout = "bthd"} : !q, !kv, !kv segments !mdsl.sched.buffer<[2, 8], int32> -> !q, !lse
}
