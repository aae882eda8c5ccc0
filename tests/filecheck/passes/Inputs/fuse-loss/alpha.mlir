// Variant 'alpha' of the input of ../../fuse-loss.mlir (the test that runs it), these lines changed:
//   -      %logits = mdsl.graph.matmul %x, %head {transpose = "NT"} : (!mdsl.graph.tensor<[2, 8, 32], fp32>, !mdsl.graph.tensor<[64, 32], fp32>) -> !mdsl.graph.tensor<[2, 8, 64], fp32>
//   +      %logits = mdsl.graph.matmul %x, %head {transpose = "NT", alpha = 2.0 : f64} : (!mdsl.graph.tensor<[2, 8, 32], fp32>, !mdsl.graph.tensor<[64, 32], fp32>) -> !mdsl.graph.tensor<[2, 8, 64], fp32>

builtin.module {
  mdsl.graph.model @M config {} {
    mdsl.graph.param @head : !mdsl.graph.tensor<[64, 32], fp32>
    mdsl.graph.func @loss_grad(%x: !mdsl.graph.tensor<[2, 8, 32], fp32>, %labels: !mdsl.graph.tensor<[16], int64>, %d: !mdsl.graph.tensor<[], fp32>) -> (!mdsl.graph.tensor<[], fp32>, !mdsl.graph.tensor<[2, 8, 32], fp32>, !mdsl.graph.tensor<[64, 32], fp32>) attributes {kind = "helper", forward_ops = 4 : i64} {
      %head = mdsl.graph.param_ref @head : !mdsl.graph.tensor<[64, 32], fp32>
      %logits = mdsl.graph.matmul %x, %head {transpose = "NT", alpha = 2.0 : f64} : (!mdsl.graph.tensor<[2, 8, 32], fp32>, !mdsl.graph.tensor<[64, 32], fp32>) -> !mdsl.graph.tensor<[2, 8, 64], fp32>
      %rows = mdsl.graph.view %logits : (!mdsl.graph.tensor<[2, 8, 64], fp32>) -> !mdsl.graph.tensor<[16, 64], fp32>
      %loss, %lse = mdsl.graph.cross_entropy %rows, %labels : (!mdsl.graph.tensor<[16, 64], fp32>, !mdsl.graph.tensor<[16], int64>) -> (!mdsl.graph.tensor<[], fp32>, !mdsl.graph.tensor<[16], fp32>)
      %d_rows = mdsl.graph.cross_entropy_backward %d, %rows, %labels, %lse : (!mdsl.graph.tensor<[], fp32>, !mdsl.graph.tensor<[16, 64], fp32>, !mdsl.graph.tensor<[16], int64>, !mdsl.graph.tensor<[16], fp32>) -> !mdsl.graph.tensor<[16, 64], fp32>
      %d_logits = mdsl.graph.view %d_rows : (!mdsl.graph.tensor<[16, 64], fp32>) -> !mdsl.graph.tensor<[2, 8, 64], fp32>
      %d_x = mdsl.graph.matmul %d_logits, %head : (!mdsl.graph.tensor<[2, 8, 64], fp32>, !mdsl.graph.tensor<[64, 32], fp32>) -> !mdsl.graph.tensor<[2, 8, 32], fp32>
      %d_w = mdsl.graph.matmul %d_logits, %x {transpose = "TN"} : (!mdsl.graph.tensor<[2, 8, 64], fp32>, !mdsl.graph.tensor<[2, 8, 32], fp32>) -> !mdsl.graph.tensor<[64, 32], fp32>
      mdsl.graph.return %loss, %d_x, %d_w : !mdsl.graph.tensor<[], fp32>, !mdsl.graph.tensor<[2, 8, 32], fp32>, !mdsl.graph.tensor<[64, 32], fp32>
    }
  }
}
