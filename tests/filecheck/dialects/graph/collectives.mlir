// The collectives of mdsl.graph in their custom form (a group of the layout, its size, and each
// op's own parameters): the custom print re-parses to itself, the generic print to the same IR.
// RUN: %roundtrip %s | filecheck %s
// RUN: mdsl-opt %s --print-op-generic | mdsl-opt | filecheck %s

!x = !mdsl.graph.tensor<[4, 8], fp32>
!g = !mdsl.graph.tensor<[8, 8], fp32>
!h = !mdsl.graph.tensor<[2, 8], fp32>
mdsl.graph.model @m config {} {
  mdsl.graph.func @forward(%x: !x) -> (!x, !g, !h) attributes {kind = "forward"} {
    // CHECK: mdsl.graph.all_reduce %x {group = "dp", size = 2 : i64, op = "avg"} : (!mdsl.graph.tensor<[4, 8], fp32>) -> !mdsl.graph.tensor<[4, 8], fp32>
    %s = mdsl.graph.all_reduce %x {group = "dp", size = 2 : i64, op = "avg"} : (!x) -> !x
    // CHECK: mdsl.graph.all_gather %s {group = "tp", size = 2 : i64} : (!mdsl.graph.tensor<[4, 8], fp32>) -> !mdsl.graph.tensor<[8, 8], fp32>
    %a = mdsl.graph.all_gather %s {group = "tp", size = 2 : i64} : (!x) -> !g
    // CHECK: mdsl.graph.reduce_scatter %x {group = "tp", size = 2 : i64} : (!mdsl.graph.tensor<[4, 8], fp32>) -> !mdsl.graph.tensor<[2, 8], fp32>
    %r = mdsl.graph.reduce_scatter %x {group = "tp", size = 2 : i64} : (!x) -> !h
    mdsl.graph.return %s, %a, %r : !x, !g, !h
  }
}
