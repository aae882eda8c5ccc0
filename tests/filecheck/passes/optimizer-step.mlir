// mdsl-optimizer-step adds @optimizer_step: the parameters and the gradients declared as a
// training step declares them (so the two share the params and grads arenas), two fp32
// moments per trainable parameter in the optimizer arena, the runtime learning rate and
// step as inputs, the gradient norm as output 0. @f is @frozen: no gradient, no moments,
// no update (its parameter keeps its place, every 256 bytes as planned). @t's @trainable(lr_scale, wd_scale) goes into its launch's attributes.
// RUN: mdsl-opt %s -p 'mdsl-optimizer-step{weight_decay=0.1 clip_norm=1.0},mdsl-plan-memory' | filecheck %s
// RUN: mdsl-opt %s -p 'mdsl-optimizer-step' | filecheck %s --check-prefix=NOCLIP
// RUN: mdsl-opt %s -p 'mdsl-optimizer-step{storage=fp32}' | filecheck %s --check-prefix=FP32

!w = !mdsl.graph.tensor<[8, 8], bf16>
mdsl.graph.model @m config {} {
  mdsl.graph.param @f : !w {annotations = [#mdsl.graph.frozen]}
  mdsl.graph.param @w : !w
  mdsl.graph.param @t : !mdsl.graph.tensor<[8], fp32> {annotations = [#mdsl.graph.trainable<lr_scale = 0.5, wd_scale = 0.0>]}
}

// CHECK-LABEL: mdsl.sched.program @optimizer_step arenas(params = 544, activations = 0, workspace = 4, grads = 288, optimizer = 1056, external = 516) attributes {model = "m"} {
// CHECK-NEXT:    %f = mdsl.sched.buffer params offset 0 bytes 128 {param = "f"} : !mdsl.sched.buffer<[8, 8], bf16>
// CHECK-NEXT:    %w = mdsl.sched.buffer params offset 256 bytes 128 {param = "w"} : !mdsl.sched.buffer<[8, 8], bf16>
// CHECK-NEXT:    %t = mdsl.sched.buffer params offset 512 bytes 32 {param = "t"} : !mdsl.sched.buffer<[8], fp32>
// CHECK-NEXT:    %d_w = mdsl.sched.buffer grads offset 0 bytes 256 {grad = "w"} : !mdsl.sched.buffer<[8, 8], fp32>
// CHECK-NEXT:    %d_t = mdsl.sched.buffer grads offset 256 bytes 32 {grad = "t"} : !mdsl.sched.buffer<[8], fp32>
// @w is bf16: AdamW updates its fp32 master copy, then a cast writes the bf16 weights.
// CHECK-NEXT:    %master.w = mdsl.sched.buffer optimizer offset 0 bytes 256 {master = "w"} : !mdsl.sched.buffer<[8, 8], fp32>
// CHECK-NEXT:    %exp_avg.w = mdsl.sched.buffer optimizer offset 256 bytes 256 {moment = "exp_avg.w"} : !mdsl.sched.buffer<[8, 8], fp32>
// CHECK-NEXT:    %exp_avg_sq.w = mdsl.sched.buffer optimizer offset 512 bytes 256 {moment = "exp_avg_sq.w"} : !mdsl.sched.buffer<[8, 8], fp32>
// CHECK-NEXT:    %exp_avg.t = mdsl.sched.buffer optimizer offset 768 bytes 32 {moment = "exp_avg.t"} : !mdsl.sched.buffer<[8], fp32>
// CHECK-NEXT:    %exp_avg_sq.t = mdsl.sched.buffer optimizer offset 1024 bytes 32 {moment = "exp_avg_sq.t"} : !mdsl.sched.buffer<[8], fp32>
// CHECK-NEXT:    %lr = mdsl.sched.buffer external offset 0 bytes 4 {input = 0 : i64} : !mdsl.sched.buffer<[1], fp32>
// CHECK-NEXT:    %step = mdsl.sched.buffer external offset 256 bytes 8 {input = 1 : i64} : !mdsl.sched.buffer<[1], int64>
// CHECK-NEXT:    %grad_norm = mdsl.sched.buffer external offset 512 bytes 4 {output = 0 : i64} : !mdsl.sched.buffer<[], fp32>
// CHECK-NEXT:    %clip_factor = mdsl.sched.buffer workspace offset 0 bytes 4 : !mdsl.sched.buffer<[], fp32>
// CHECK-NEXT:    mdsl.sched.launch "global_norm"(%d_w, %d_t) -> (%grad_norm)
// CHECK-NEXT:    mdsl.sched.launch "clip_factor"(%grad_norm) -> (%clip_factor) {max_norm = 1.000000e+00 : f64}
// CHECK-NEXT:    mdsl.sched.launch "adamw"(%master.w, %d_w, %exp_avg.w, %exp_avg_sq.w, %lr, %step, %clip_factor) -> (%master.w, %exp_avg.w, %exp_avg_sq.w) {inplace, beta1 = 9.000000e-01 : f64, beta2 = 9.990000e-01 : f64, eps = 1.000000e-08 : f64, weight_decay = 1.000000e-01 : f64, lr_scale = 1.000000e+00 : f64}
// CHECK-NEXT:    mdsl.sched.launch "adamw"(%t, %d_t, %exp_avg.t, %exp_avg_sq.t, %lr, %step, %clip_factor) -> (%t, %exp_avg.t, %exp_avg_sq.t) {inplace, beta1 = 9.000000e-01 : f64, beta2 = 9.990000e-01 : f64, eps = 1.000000e-08 : f64, weight_decay = 0.000000e+00 : f64, lr_scale = 5.000000e-01 : f64}
// CHECK-NEXT:    mdsl.sched.launch "cast"(%master.w) -> (%w) : (!mdsl.sched.buffer<[8, 8], fp32>) -> (!mdsl.sched.buffer<[8, 8], bf16>)
// The gradients start from zero for the next step's micro-batches:
// CHECK-NEXT:    mdsl.sched.memset %d_w
// CHECK-NEXT:    mdsl.sched.memset %d_t
// CHECK-NEXT:  }

// Without clipping: no clip_factor, and adamw reads the gradient as it is.
// NOCLIP-NOT:  clip_factor
// NOCLIP:      mdsl.sched.launch "adamw"(%master.w, %d_w, %exp_avg.w, %exp_avg_sq.w, %lr, %step) -> (%master.w, %exp_avg.w, %exp_avg_sq.w)

// storage=fp32 (an fp32 run of the bf16 model): no master copies, adamw updates @w itself.
// FP32-NOT:    master
// FP32:        mdsl.sched.launch "adamw"(%w, %d_w, %exp_avg.w, %exp_avg_sq.w, %lr, %step) -> (%w, %exp_avg.w, %exp_avg_sq.w)
// FP32-NOT:    "cast"
