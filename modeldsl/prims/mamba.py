"""Mamba (spec 6.10): the depthwise causal conv1d and the selective scan, with their backwards (the
kernels of ``mamba.cu``; the decoding steps are schedule kernels without a graph op)."""

from __future__ import annotations

from modeldsl.dialects.graph_primitives import (
    MambaConv1dBackwardOp,
    MambaConv1dOp,
    MambaSelectiveScanBackwardOp,
    MambaSelectiveScanOp,
)
from modeldsl.dialects.graph_types import TensorType
from modeldsl.prims.base import FP32, Primitive, same
from modeldsl.prims.counts import conv1d_rule, selective_scan_rule
from modeldsl.prims.grads import checked, forward_params


def infer_mamba_conv1d(ts, p):
    x = ts[0]
    results = [x]
    if p.get("with_state", False):
        ks = p.get("kernel_size", 4)
        results.append(x.with_shape([x.shape[0], x.shape[1], ks - 1]))
    return results


def infer_selective_scan(ts, p):
    u, a_log = ts[0], ts[2]
    return [u, TensorType([u.shape[0], u.shape[1], a_log.shape[1]], FP32)]


def vjp_mamba_conv1d(b, op, grads):
    """From a zero initial state (training); the gradient through a decode step's conv state is refused."""
    if op.conv_state is not None:
        raise NotImplementedError("the gradient of mamba_conv1d with a conv_state (a decode step)")
    return b.op("mamba_conv1d_backward", grads[0], op.x, op.weight, op.bias,
                **forward_params(op, "kernel_size", "activation"))


def vjp_mamba_selective_scan(b, op, grads):
    """The gradients of u, delta, A_log, B, C, D and dt_bias; a given initial state is held (not
    differentiated), and a gradient reaching the final state is refused."""
    g_y, g_state = grads
    if g_state is not None:
        raise NotImplementedError("the gradient of mamba_selective_scan's final ssm_state")
    state = op.ssm_state
    results = b.op("mamba_selective_scan_backward", g_y, *op.operands[:7], state, op.y,
                   **forward_params(op, "chunk_size"))
    return list(results) + ([None] if state is not None else [])


ENTRIES = (
    Primitive(MambaConv1dOp, infer_mamba_conv1d, conv1d_rule(passes=1), checked(vjp_mamba_conv1d)),
    Primitive(MambaConv1dBackwardOp, lambda ts, p: [ts[1], ts[2], *ts[3:4]], conv1d_rule(passes=2)),
    Primitive(MambaSelectiveScanOp, infer_selective_scan, selective_scan_rule(passes=1),
              checked(vjp_mamba_selective_scan)),
    Primitive(MambaSelectiveScanBackwardOp, same(1, 2, 3, 4, 5, 6, 7), selective_scan_rule(passes=2)),
)
