"""Attention (spec 6.4): flash_attention, the causal mask of written-out attention, rope, qk_norm,
the fused qk_norm + rope, and their backwards."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from modeldsl.dialects.graph_primitives import (
    CausalMaskOp,
    FlashAttentionBackwardOp,
    FlashAttentionOp,
    FusedQkNormRopeBackwardOp,
    FusedQkNormRopeOp,
    QkNormBackwardOp,
    QkNormOp,
    RopeBackwardOp,
    RopeOp,
)
from modeldsl.dialects.graph_types import TensorType
from modeldsl.prims.base import FP32, Primitive, Shape, op_attr, same
from modeldsl.prims.counts import (
    ATTENTION_BACKWARD_FACTOR,
    NORM,
    ROPE,
    attention_rule,
    per_input_element,
    per_output_element,
)
from modeldsl.prims.grads import checked, forward_params, or_zeros


def infer_attention(ts, p):
    """(out, lse): lse is ``[B, H, T]`` in both layouts (q ``[B, H, T, D]`` or, ``bthd``, ``[B, T, H, D]``)."""
    q = ts[0]
    heads = list(q.shape[:3])
    if p.get("layout") == "bthd" and len(heads) == 3:
        heads[1], heads[2] = heads[2], heads[1]
    return [q, TensorType(heads, FP32)]


def infer_qk_norm(ts, p):
    q, k = ts[0], ts[1]
    return [q, k, TensorType(list(q.shape[:3]), FP32), TensorType(list(k.shape[:3]), FP32)]


def attention_scores(inputs: Sequence[Shape], outputs: Sequence[Shape], params: Mapping[str, Any]) -> int:
    """fp32 scores of every (batch, head) row block: the S x S matrix of a non-flash kernel."""
    q, k = inputs[0], inputs[1]
    return 4 * math.prod(q[:-1]) * k[-2]


def vjp_causal_mask(b, op, grads):
    """The gradient where the score was kept, 0 where it was masked."""
    return [b.one("causal_mask", grads[0], offset=op_attr(op, "offset", 0), window_size=op_attr(op, "window_size"),
                  fill="zero")]


def vjp_flash_attention(b, op, grads):
    """ALiBi slopes (a parameter of the primitive) shift the scores, segment ids (packed rows) mask
    them: neither is differentiated."""
    params = forward_params(op, "causal", "softmax_scale", "window_size", "layout", "softcap")
    d_q, d_k, d_v = b.op("flash_attention_backward", grads[0], op.q, op.k, op.v, op.results[0], op.results[1],
                         op.alibi_slopes, op.segments, **params)
    return [d_q, d_k, d_v, *[None for _ in op.operands[3:]]]


def vjp_rope(b, op, grads):
    q_rot, k_rot = op.results
    d_q, d_k = b.op("rope_backward", or_zeros(b, grads[0], q_rot), or_zeros(b, grads[1], k_rot), op.operands[2],
                    **forward_params(op, "interleaved", "layout"))
    return [d_q, d_k, None]


def vjp_qk_norm(b, op, grads):
    q_norm, k_norm, q_rstd, k_rstd = op.results
    return b.op("qk_norm_backward", or_zeros(b, grads[0], q_norm), or_zeros(b, grads[1], k_norm),
                *op.operands, q_rstd, k_rstd)


def vjp_fused_qk_norm_rope(b, op, grads):
    q_rot, k_rot, q_rstd, k_rstd = op.results
    q, k, q_weight, k_weight, freqs = op.operands
    d_q, d_k, d_qw, d_kw = b.op("fused_qk_norm_rope_backward", or_zeros(b, grads[0], q_rot),
                                or_zeros(b, grads[1], k_rot), q, k, q_weight, k_weight, q_rstd, k_rstd, freqs,
                                **forward_params(op, "interleaved", "layout"))
    return [d_q, d_k, d_qw, d_kw, None]


QK_NORM_FLOPS = per_input_element(NORM, 0, 1)
QK_NORM_ROPE_FLOPS = per_input_element(NORM + ROPE, 0, 1)

ENTRIES = (
    # a compare and select per score
    Primitive(CausalMaskOp, same(0), per_output_element(1), checked(vjp_causal_mask), reuse={0: 0}),
    # q first in the forward, after d_out in the backward
    Primitive(FlashAttentionOp, infer_attention, attention_rule(q_at=0, factor=1.0), checked(vjp_flash_attention),
              scratch=attention_scores, cpu=True),
    Primitive(FlashAttentionBackwardOp, same(1, 2, 3), attention_rule(q_at=1, factor=ATTENTION_BACKWARD_FACTOR),
              cpu=True),
    Primitive(RopeOp, same(0, 1), per_output_element(ROPE), checked(vjp_rope), reuse={0: 0, 1: 1}, cpu=True),
    Primitive(RopeBackwardOp, same(0, 1), per_output_element(ROPE), cpu=True),
    Primitive(QkNormOp, infer_qk_norm, QK_NORM_FLOPS, checked(vjp_qk_norm), cpu=True),
    Primitive(QkNormBackwardOp, same(2, 3, 4, 5), QK_NORM_FLOPS, cpu=True),
    Primitive(FusedQkNormRopeOp, infer_qk_norm, QK_NORM_ROPE_FLOPS, checked(vjp_fused_qk_norm_rope), cpu=True),
    Primitive(FusedQkNormRopeBackwardOp, same(2, 3, 4, 5), QK_NORM_ROPE_FLOPS, cpu=True),
)
