"""Activations (spec 6.3): the gated units (swiglu, geglu, their fused_split_* forms), silu, relu,
relu2, gelu, softmax, and their backwards. The elementwise kernels read each element before writing
it, so an output may take over its dying input's buffer."""

from __future__ import annotations

from modeldsl.dialects.graph_primitives import (
    FusedSplitGegluBackwardOp,
    FusedSplitGegluOp,
    FusedSplitSwigluBackwardOp,
    FusedSplitSwigluOp,
    GegluBackwardOp,
    GegluOp,
    GeluBackwardOp,
    GeluOp,
    Relu2BackwardOp,
    Relu2Op,
    ReluBackwardOp,
    ReluOp,
    SiluBackwardOp,
    SiluOp,
    SoftmaxBackwardOp,
    SoftmaxOp,
    SwigluBackwardOp,
    SwigluOp,
)
from modeldsl.prims.base import Primitive, half_last, same
from modeldsl.prims.counts import SOFTMAX, per_input_element, per_output_element
from modeldsl.prims.grads import checked, forward_params, short_name

IN_PLACE = {0: 0}


def vjp_activation(b, op, grads):
    return [b.one(f"{short_name(op)}_backward", grads[0], op.operands[0], **forward_params(op, "approximate"))]


def vjp_gated(b, op, grads):
    return b.op(f"{short_name(op)}_backward", grads[0], *op.operands, **forward_params(op, "approximate"))


def vjp_fused_split_gated(b, op, grads):
    return [b.one(f"{short_name(op)}_backward", grads[0], op.operands[0])]


def vjp_softmax(b, op, grads):
    return [b.one("softmax_backward", grads[0], op.results[0], **forward_params(op, "dim"))]


def _split_half(ts, p):
    return [half_last(ts[0])]


GATED = ("gated", "activation")

ENTRIES = (
    Primitive(SwigluOp, same(0), per_output_element(5), checked(vjp_gated), reuse=IN_PLACE, fusion_kinds=GATED,
              cpu=True),
    Primitive(SwigluBackwardOp, same(1, 2), per_output_element(6), cpu=True),
    Primitive(GegluOp, same(0), per_output_element(9), checked(vjp_gated), reuse=IN_PLACE, fusion_kinds=GATED),
    Primitive(GegluBackwardOp, same(1, 2), per_output_element(10)),
    Primitive(FusedSplitSwigluOp, _split_half, per_output_element(5), checked(vjp_fused_split_gated), cpu=True),
    # each thread reads its gate and up elements before writing their gradients at the same places;
    # d_gate_up packs d_gate and d_up
    Primitive(FusedSplitSwigluBackwardOp, same(1), per_output_element(6), reuse={0: 1}, cpu=True),
    Primitive(FusedSplitGegluOp, _split_half, per_output_element(9), checked(vjp_fused_split_gated)),
    Primitive(FusedSplitGegluBackwardOp, same(1), per_output_element(10), reuse={0: 1}),
    Primitive(SiluOp, same(0), per_output_element(4), checked(vjp_activation), reuse=IN_PLACE,
              fusion_kinds=("activation",), cpu=True),
    Primitive(SiluBackwardOp, same(1), per_output_element(8), cpu=True),
    Primitive(ReluOp, same(0), per_output_element(1), checked(vjp_activation), reuse=IN_PLACE,
              fusion_kinds=("activation",)),
    Primitive(ReluBackwardOp, same(1), per_output_element(1)),
    Primitive(Relu2Op, same(0), per_output_element(2), checked(vjp_activation), reuse=IN_PLACE,
              fusion_kinds=("activation",)),
    Primitive(Relu2BackwardOp, same(1), per_output_element(2)),
    Primitive(GeluOp, same(0), per_output_element(8), checked(vjp_activation), reuse=IN_PLACE,
              fusion_kinds=("activation",)),
    Primitive(GeluBackwardOp, same(1), per_output_element(12)),
    Primitive(SoftmaxOp, same(0), per_input_element(SOFTMAX, 0), checked(vjp_softmax), reuse=IN_PLACE,
              fusion_kinds=("softmax",)),
    Primitive(SoftmaxBackwardOp, same(1), per_input_element(SOFTMAX, 0)),
)
