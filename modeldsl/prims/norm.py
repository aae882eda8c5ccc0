"""Normalization (spec 6.2): rmsnorm, the fused residual add + rmsnorm, layernorm, and their backwards."""

from __future__ import annotations

from modeldsl.dialects.graph_primitives import (
    FusedResidualRmsnormBackwardOp,
    FusedResidualRmsnormOp,
    LayernormBackwardOp,
    LayernormOp,
    RmsnormBackwardOp,
    RmsnormOp,
)
from modeldsl.prims.base import Primitive, rows, same
from modeldsl.prims.counts import NORM, per_input_element
from modeldsl.prims.grads import checked, or_zeros

# about 5 FLOPs per element of the normalized input (the backward's d_y)
NORM_FLOPS = per_input_element(NORM, 0)


def infer_rmsnorm(ts, p):
    return [ts[0], rows(ts[0])]


def infer_layernorm(ts, p):
    return [ts[0], rows(ts[0]), rows(ts[0])]


def infer_layernorm_backward(ts, p):
    x, weight = ts[1], ts[2]
    results = [x, weight]
    if p.get("with_bias", True):
        results.append(weight)
    return results


def vjp_rmsnorm(b, op, grads):
    x, w = op.operands
    d_x, d_w = b.op("rmsnorm_backward", grads[0], x, w, op.results[1])
    return [d_x, d_w]


def vjp_fused_residual_rmsnorm(b, op, grads):
    residual_out, y, rstd = op.results
    w = op.operands[2]
    d_res, d_in, d_w = b.op("fused_residual_rmsnorm_backward", or_zeros(b, grads[1], y),
                            or_zeros(b, grads[0], residual_out), residual_out, w, rstd)
    return [d_res, d_in, d_w]


def vjp_layernorm(b, op, grads):
    x, w = op.operands[0], op.operands[1]
    d_x, d_w, d_b = b.op("layernorm_backward", grads[0], x, w, op.results[1], op.results[2])
    return [d_x, d_w] + ([d_b] if len(op.operands) == 3 else [])


ENTRIES = (
    Primitive(RmsnormOp, infer_rmsnorm, NORM_FLOPS, checked(vjp_rmsnorm), fusion_kinds=("norm",), cpu=True),
    Primitive(RmsnormBackwardOp, same(1, 2), NORM_FLOPS, cpu=True),
    Primitive(FusedResidualRmsnormOp, lambda ts, p: [ts[0], ts[0], rows(ts[0])], NORM_FLOPS,
              checked(vjp_fused_residual_rmsnorm), fusion_kinds=("add", "norm"), cpu=True),
    Primitive(FusedResidualRmsnormBackwardOp, lambda ts, p: [ts[2], ts[2], ts[3]], NORM_FLOPS, cpu=True),
    Primitive(LayernormOp, infer_layernorm, NORM_FLOPS, checked(vjp_layernorm), fusion_kinds=("norm",),
              cuda="none"),
    Primitive(LayernormBackwardOp, infer_layernorm_backward, NORM_FLOPS, cuda="none"),
)
