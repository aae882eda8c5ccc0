// Malformed annotations are located parse errors.
// RUN: mdsl-opt %s --split-input-file --parsing-diagnostics --print-diagnostics | filecheck %s

mdsl.graph.model @m {
  mdsl.graph.param @w : !mdsl.graph.tensor<[4], bf16> {annotations = [#mdsl.graph.memory<sometimes>]}
}
// CHECK: error[{{E[0-9]+}}]: @memory(mode=...): 'sometimes' is not one of save, recompute, temporary, pin, offload, stream

// -----

mdsl.graph.model @m {
  mdsl.graph.param @w : !mdsl.graph.tensor<[4], bf16> {annotations = [#mdsl.graph.shard<column, size = 4>]}
}
// CHECK: error[{{E[0-9]+}}]: @shard has no parameter 'size'

// -----

mdsl.graph.model @m {
  mdsl.graph.param @w : !mdsl.graph.tensor<[4], bf16> {annotations = [#mdsl.graph.hook<mode = modify>]}
}
// CHECK: error[{{E[0-9]+}}]: @hook needs 'point'

// -----

mdsl.graph.model @m {
  mdsl.graph.param @w : !mdsl.graph.tensor<[4], bf16> {annotations = [#mdsl.graph.adapter<lora, dropout = 1.5>]}
}
// CHECK: error[{{E[0-9]+}}]: @adapter dropout must be in [0, 1), got 1.5

// -----

mdsl.graph.model @m {
  mdsl.graph.param @w : !mdsl.graph.tensor<[4], bf16> {annotations = [#mdsl.graph.lifetime<start = "a">]}
}
// CHECK: error[{{E[0-9]+}}]: @lifetime needs both 'start' and 'end', or neither

// -----

mdsl.graph.model @m {
  mdsl.graph.param @w : !mdsl.graph.tensor<[4], bf16> {annotations = [#mdsl.graph.precision<policy = bf16, compute = fp32>]}
}
// CHECK: error[{{E[0-9]+}}]: @precision takes a 'policy' or explicit dtypes, not both

// -----

mdsl.graph.model @m {
  mdsl.graph.param @w : !mdsl.graph.tensor<[4], bf16> {annotations = [#mdsl.graph.trainable<lr_scale = -1.0>]}
}
// CHECK: error[{{E[0-9]+}}]: @trainable(lr_scale=...) must be >= 0, got -1.0

// -----

mdsl.graph.model @m {
  mdsl.graph.param @w : !mdsl.graph.tensor<[4], bf16> {annotations = ["frozen"]}
}
// CHECK: error[{{E[0-9]+}}]: 'mdsl.graph.param' op 'annotations' must be an array of #mdsl.graph annotations
