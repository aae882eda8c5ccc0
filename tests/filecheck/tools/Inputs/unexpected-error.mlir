!a = !mdsl.graph.tensor<[4, 8], fp32>
!b = !mdsl.graph.tensor<[16, 3], fp32>
mdsl.graph.model @m {
  mdsl.graph.func @f(%a: !a, %b: !b) -> !mdsl.graph.tensor<[4, 3], fp32> {
    %c = mdsl.graph.matmul %a, %b : (!a, !b) -> !mdsl.graph.tensor<[4, 3], fp32>
    mdsl.graph.return %c : !mdsl.graph.tensor<[4, 3], fp32>
  }
}
