// mdsl-fuse pattern gated_mlp (passes/fuse_mlp.py) on split shapes, orders and readers: geglu
// fires as swiglu does (forward and backward, the backward reading a gate_up whose split other
// ops also read); a three-way split, a split along a dim other than the last, halves passed in
// the other order, a concat of the gradients in the other order or along another dim, a
// gradient half another op also reads, and halves that come from no split do not fire.
// RUN: mdsl-opt %s -p 'mdsl-fuse' | filecheck %s

!h = !mdsl.graph.tensor<[4, 6], fp32>
!p = !mdsl.graph.tensor<[4, 12], fp32>
builtin.module {
  mdsl.graph.model @M config {} {
    mdsl.graph.func @geglu(%gu: !p, %d: !h) -> (!h, !p, !h) attributes {kind = "helper"} {
      %g, %u = mdsl.graph.split %gu {sizes = #mdsl.graph.dims<[6, 6]>} : (!p) -> (!h, !h)
      %y = mdsl.graph.geglu %g, %u : (!h, !h) -> !h
      %gb, %ub = mdsl.graph.split %gu {sizes = #mdsl.graph.dims<[6, 6]>, dim = 1 : i64} : (!p) -> (!h, !h)
      %dg, %du = mdsl.graph.geglu_backward %d, %gb, %ub : (!h, !h, !h) -> (!h, !h)
      %dgu = mdsl.graph.concat %dg, %du : (!h, !h) -> !p
      %keep = mdsl.graph.add %gb, %ub : (!h, !h) -> !h
      mdsl.graph.return %y, %dgu, %keep : !h, !p, !h
    }
    mdsl.graph.func @three_way(%gu: !mdsl.graph.tensor<[4, 14], fp32>) -> (!h, !mdsl.graph.tensor<[4, 2], fp32>) attributes {kind = "helper"} {
      %g, %u, %r = mdsl.graph.split %gu {sizes = #mdsl.graph.dims<[6, 6, 2]>} : (!mdsl.graph.tensor<[4, 14], fp32>) -> (!h, !h, !mdsl.graph.tensor<[4, 2], fp32>)
      %y = mdsl.graph.swiglu %g, %u : (!h, !h) -> !h
      mdsl.graph.return %y, %r : !h, !mdsl.graph.tensor<[4, 2], fp32>
    }
    mdsl.graph.func @rows(%gu: !mdsl.graph.tensor<[8, 6], fp32>) -> !h attributes {kind = "helper"} {
      %g, %u = mdsl.graph.split %gu {sizes = #mdsl.graph.dims<[4, 4]>, dim = 0 : i64} : (!mdsl.graph.tensor<[8, 6], fp32>) -> (!h, !h)
      %y = mdsl.graph.swiglu %g, %u : (!h, !h) -> !h
      mdsl.graph.return %y : !h
    }
    mdsl.graph.func @swapped(%gu: !p, %d: !h, %d2: !h) -> (!h, !p, !p) attributes {kind = "helper"} {
      %g, %u = mdsl.graph.split %gu {sizes = #mdsl.graph.dims<[6, 6]>} : (!p) -> (!h, !h)
      %y = mdsl.graph.swiglu %u, %g : (!h, !h) -> !h
      %dg, %du = mdsl.graph.swiglu_backward %d, %g, %u : (!h, !h, !h) -> (!h, !h)
      %dgu = mdsl.graph.concat %du, %dg : (!h, !h) -> !p
      %dg2, %du2 = mdsl.graph.swiglu_backward %d2, %g, %u : (!h, !h, !h) -> (!h, !h)
      %dgu2 = mdsl.graph.concat %dg2, %du2 : (!h, !h) -> !p
      %y2 = mdsl.graph.add %y, %dg2 : (!h, !h) -> !h
      mdsl.graph.return %y2, %dgu, %dgu2 : !h, !p, !p
    }
    mdsl.graph.func @unsplit(%g: !h, %u: !h, %d: !h) -> (!p, !mdsl.graph.tensor<[8, 6], fp32>) attributes {kind = "helper"} {
      %dg, %du = mdsl.graph.swiglu_backward %d, %g, %u : (!h, !h, !h) -> (!h, !h)
      %dgu = mdsl.graph.concat %dg, %du : (!h, !h) -> !p
      %gu = mdsl.graph.concat %g, %u : (!h, !h) -> !p
      %g2, %u2 = mdsl.graph.split %gu {sizes = #mdsl.graph.dims<[6, 6]>} : (!p) -> (!h, !h)
      %dg2, %du2 = mdsl.graph.swiglu_backward %d, %g2, %u2 : (!h, !h, !h) -> (!h, !h)
      %rows = mdsl.graph.concat %dg2, %du2 {dim = 0 : i64} : (!h, !h) -> !mdsl.graph.tensor<[8, 6], fp32>
      mdsl.graph.return %dgu, %rows : !p, !mdsl.graph.tensor<[8, 6], fp32>
    }
  }
}

// CHECK-LABEL: mdsl.graph.func @geglu
// CHECK-NEXT:    %y = mdsl.graph.fused_split_geglu %gu : (!mdsl.graph.tensor<[4, 12], fp32>) -> !mdsl.graph.tensor<[4, 6], fp32>
// CHECK-NEXT:    %gb, %ub = mdsl.graph.split %gu
// CHECK-NEXT:    %dgu = mdsl.graph.fused_split_geglu_backward %d, %gu :
// CHECK-NEXT:    %keep = mdsl.graph.add %gb, %ub
// CHECK-NEXT:    mdsl.graph.return %y, %dgu, %keep

// CHECK-LABEL: mdsl.graph.func @three_way
// CHECK-NEXT:    %g, %u, %r = mdsl.graph.split %gu
// CHECK-NEXT:    %y = mdsl.graph.swiglu %g, %u

// CHECK-LABEL: mdsl.graph.func @rows
// CHECK-NEXT:    %g, %u = mdsl.graph.split %gu {sizes = #mdsl.graph.dims<[4, 4]>, dim = 0 : i64}
// CHECK-NEXT:    %y = mdsl.graph.swiglu %g, %u

// CHECK-LABEL: mdsl.graph.func @swapped
// CHECK-NEXT:    %g, %u = mdsl.graph.split %gu
// CHECK-NEXT:    %y = mdsl.graph.swiglu %u, %g
// CHECK-NEXT:    %dg, %du = mdsl.graph.swiglu_backward %d, %g, %u
// CHECK-NEXT:    %dgu = mdsl.graph.concat %du, %dg
// CHECK-NEXT:    %dg2, %du2 = mdsl.graph.swiglu_backward %d2, %g, %u
// CHECK-NEXT:    %dgu2 = mdsl.graph.concat %dg2, %du2
// CHECK-NOT:     fused_split

// CHECK-LABEL: mdsl.graph.func @unsplit
// CHECK-NEXT:    %dg, %du = mdsl.graph.swiglu_backward %d, %g, %u
// CHECK-NEXT:    %dgu = mdsl.graph.concat %dg, %du
// CHECK-NOT:     fused_split
// CHECK:         %rows = mdsl.graph.concat %dg2, %du2 {dim = 0 : i64}
