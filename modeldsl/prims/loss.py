"""Losses: cross_entropy and the fused LM-head loss (the head's GEMM and the cross-entropy over
``chunk`` rows of logits at a time), with their backwards and the forward-and-backward merge."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from modeldsl.dialects.graph_primitives import (
    CrossEntropyBackwardOp,
    CrossEntropyOp,
    FusedLmHeadLossBackwardOp,
    FusedLmHeadLossGradOp,
    FusedLmHeadLossOp,
)
from modeldsl.dialects.graph_types import TensorType
from modeldsl.prims.base import FP32, Primitive, Shape, same
from modeldsl.prims.counts import SOFTMAX, per_input_element, projection_softmax_rule
from modeldsl.prims.grads import checked, forward_params


def infer_loss(ts, p):
    n = ts[0].shape[0]
    loss = TensorType([n], FP32) if p.get("reduction", "mean") == "none" else TensorType([], FP32)
    return [loss, TensorType([n], FP32)]


def vjp_cross_entropy(b, op, grads):
    logits, labels = op.operands
    params = forward_params(op, "ignore_index", "reduction")
    return [b.one("cross_entropy_backward", grads[0], logits, labels, op.results[1], **params), None]


def vjp_fused_lm_head_loss(b, op, grads):
    x, weight, labels = op.operands
    params = forward_params(op, "ignore_index", "reduction", "chunk")
    d_x, d_w = b.op("fused_lm_head_loss_backward", grads[0], x, weight, labels, op.results[1], **params)
    return [d_x, d_w, None]


# ----------------------------------------------------------------------------
# scratch
# ----------------------------------------------------------------------------


def per_row_stats(inputs: Sequence[Shape], outputs: Sequence[Shape], params: Mapping[str, Any]) -> int:
    """Two fp32 values (running max and sum) per row of the logits."""
    return 8 * math.prod(inputs[0][:-1])


def aligned(nbytes: int, alignment: int = 256) -> int:
    return -(-nbytes // alignment) * alignment


def loss_chunk(inputs: Sequence[Shape], params: Mapping[str, Any]) -> tuple[int, int, int]:
    """(rows, rows per chunk, vocab) of a fused LM-head loss (``x [N, C]`` is the first 2-d input,
    the ``[V, C]`` weight the next one)."""
    x = next(i for i, shape in enumerate(inputs) if len(shape) == 2)
    n, vocab = inputs[x][0], inputs[x + 1][0]
    return n, min(int(params.get("chunk", 0)) or n, n), vocab


def chunk_logits(inputs: Sequence[Shape], outputs: Sequence[Shape], params: Mapping[str, Any]) -> int:
    """The logits of one chunk of rows (sized for fp32: they take x's dtype) and the fp32 loss of
    every row (before the mean)."""
    n, chunk, vocab = loss_chunk(inputs, params)
    return aligned(4 * chunk * vocab) + 4 * n


def chunk_logit_grads(inputs: Sequence[Shape], outputs: Sequence[Shape], params: Mapping[str, Any]) -> int:
    """The logit gradients of one chunk (in place of its logits, sized for fp32) and the mean's scale."""
    _, chunk, vocab = loss_chunk(inputs, params)
    return aligned(4 * chunk * vocab) + 4


def chunk_loss_and_grads(inputs: Sequence[Shape], outputs: Sequence[Shape], params: Mapping[str, Any]) -> int:
    """The backward's scratch (:func:`chunk_logit_grads`) with, before the mean's scale, the chunk's
    fp32 lse and the fp32 loss of every row (the CUDA composite's layout)."""
    n, chunk, vocab = loss_chunk(inputs, params)
    return aligned(4 * chunk * vocab) + aligned(4 * chunk) + aligned(4 * n) + 4


ENTRIES = (
    Primitive(CrossEntropyOp, infer_loss, per_input_element(SOFTMAX, 0), checked(vjp_cross_entropy),
              scratch=per_row_stats, cpu=True),
    # one pass over each row of the logits, reading each element before writing its gradient
    Primitive(CrossEntropyBackwardOp, same(1), per_input_element(SOFTMAX, 1), reuse={0: 1}, cpu=True),
    Primitive(FusedLmHeadLossOp, infer_loss, projection_softmax_rule(gemms=1), checked(vjp_fused_lm_head_loss),
              scratch=chunk_logits, cuda="composite", cpu=True),
    Primitive(FusedLmHeadLossBackwardOp, same(1, 2), projection_softmax_rule(gemms=3), scratch=chunk_logit_grads,
              cuda="composite", cpu=True),
    # one logits GEMM, the two gradient GEMMs
    Primitive(FusedLmHeadLossGradOp, lambda ts, p: [infer_loss(ts[1:], p)[0], ts[1], ts[2]],
              projection_softmax_rule(gemms=3), no_vjp="a forward and its backward merged (it takes d_loss)",
              scratch=chunk_loss_and_grads, cuda="composite", cpu=True),
)
