"""Mixture of experts (spec 6.9): the router, expert offsets, the permutation of tokens to experts
and back, and their backwards (the kernels of ``moe.cu``)."""

from __future__ import annotations

from modeldsl.dialects.graph_primitives import (
    MoeComputeOffsetsOp,
    MoePermuteOp,
    MoeRouterBackwardOp,
    MoeRouterOp,
    MoeUnpermuteBackwardOp,
    MoeUnpermuteOp,
)
from modeldsl.dialects.graph_types import TensorType
from modeldsl.prims.base import FP32, INT32, Primitive, op_attr, same
from modeldsl.prims.counts import free, per_input_element, projection_softmax_rule
from modeldsl.prims.grads import checked, forward_params, zeros_like


def infer_moe_router(ts, p):
    x = ts[0]
    k = p["top_k"]
    return [TensorType([x.shape[0], k], x.dtype), TensorType([x.shape[0], k], INT32), TensorType([], FP32)]


def infer_moe_compute_offsets(ts, p):
    return [TensorType([p["num_experts"] + 1], INT32)]


def infer_moe_permute(ts, p):
    x, indices = ts[0], ts[1]
    total = indices.shape[0] * indices.shape[1]
    return [TensorType([total, x.shape[1]], x.dtype), TensorType([total], INT32)]


def infer_moe_unpermute(ts, p):
    expert_outputs, weights = ts[0], ts[1]
    return [TensorType([weights.shape[0], expert_outputs.shape[1]], expert_outputs.dtype)]


def vjp_moe_router(b, op, grads):
    """moe_router_backward gives the gradient of ``sum(d_weights * weights) + aux_loss_coef * aux`` with the
    indices held: once with the weights' gradient (coefficient 0), once with zero weight gradients for the
    auxiliary loss, scaled by its gradient (a scalar). The indices are integers (no gradient)."""
    g_weights, _, g_aux = grads
    x, gate = op.operands
    weights, indices = op.results[0], op.results[1]
    params = forward_params(op, "normalize", "use_sigmoid")
    coefficient = op_attr(op, "aux_loss_coef", 0.01)
    parts = []
    if g_weights is not None:
        parts.append(b.op("moe_router_backward", g_weights, x, gate, indices, aux_loss_coef=0.0, **params))
    if g_aux is not None and coefficient:
        d_x, d_gate = b.op("moe_router_backward", zeros_like(b, weights), x, gate, indices,
                           aux_loss_coef=coefficient, **params)
        parts.append([b.one("mul", d_x, g_aux), b.one("mul", d_gate, g_aux)])
    if not parts:
        return [None, None]
    d_x, d_gate = parts[0]
    for more_x, more_gate in parts[1:]:
        d_x, d_gate = b.one("add", d_x, more_x), b.one("add", d_gate, more_gate)
    return [d_x, d_gate]


def vjp_moe_permute(b, op, grads):
    """Each token's rows of the gradient, summed back: moe_unpermute with unit weights."""
    x, indices, _ = op.operands
    ones = b.one("ones", shape=list(indices.type.shape), dtype=x.type.dtype)
    return [b.one("moe_unpermute", grads[0], ones, op.results[1]), None, None]


def vjp_moe_unpermute(b, op, grads):
    expert_outputs, weights, scatter_indices = op.operands
    d_outputs, d_weights = b.op("moe_unpermute_backward", grads[0], expert_outputs, weights, scatter_indices)
    return [d_outputs, d_weights, None]


ENTRIES = (
    Primitive(MoeRouterOp, infer_moe_router, projection_softmax_rule(gemms=1), checked(vjp_moe_router)),
    Primitive(MoeRouterBackwardOp, same(1, 2), projection_softmax_rule(gemms=2)),
    Primitive(MoeComputeOffsetsOp, infer_moe_compute_offsets, free,
              no_vjp="its result is integer offsets: no gradient flows through it"),
    Primitive(MoePermuteOp, infer_moe_permute, free, checked(vjp_moe_permute)),
    Primitive(MoeUnpermuteOp, infer_moe_unpermute, per_input_element(2, 0), checked(vjp_moe_unpermute)),
    Primitive(MoeUnpermuteBackwardOp, same(1, 2), per_input_element(4, 1)),
)
