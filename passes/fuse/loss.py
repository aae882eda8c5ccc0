"""``mdsl-fuse`` pattern ``lm_head_loss``: the LM head's GEMM and the cross-entropy, chunked.

A training step computes ``logits = matmul(x, lm_head, NT)`` (``[B*T, vocab]``: 2 GiB at the
Llama-1B benchmark shape), ``cross_entropy(logits, labels)``, and in backward
``cross_entropy_backward`` and the two GEMMs of ``d_x`` and ``d_lm_head``. Two rewrites take the
logits out of the program:

* :class:`LmHeadLossBackward`: ``cross_entropy_backward`` whose logits come from the LM-head GEMM,
  and the GEMMs that read its gradient, become ``fused_lm_head_loss_backward(d_loss, x, weight,
  labels, lse) -> (d_x, d_weight)``, which recomputes the logits chunk by chunk;
* :class:`LmHeadLoss`: then the forward ``cross_entropy`` reading those logits (now its only
  reader) becomes ``fused_lm_head_loss(x, weight, labels) -> (loss, lse)``.

* :class:`LmHeadLossGrad`: then the two, where ``d_loss`` is known where the forward stands (an
  argument, or defined before it: a training step's loss seed) and nothing but the backward reads
  ``lse``, become ``fused_lm_head_loss_grad(d_loss, x, weight, labels) -> (loss, d_x, d_weight)``
  at the forward: each chunk's logits are computed once (not again in backward). Its loss is the
  forward's bit for bit, ``d_x``/``d_weight`` the backward's (the same arithmetic per chunk); they
  are computed early and held until the backward reads them.

All carry ``chunk``, the rows of ``x`` whose logits are held at once: the option
``lm_head_chunk`` of ``mdsl-fuse``, or (0, the default) the most rows, a power of two, whose fp32
logits fit in :data:`CHUNK_BYTES`. ``x`` of rank 3 is viewed as rows. Not fused: logits another
op also reads (a forward that returns them, a ``@probe``), a GEMM with alpha, beta or accumulation,
a gradient GEMM of another form, barriers. The weight gradient sums the chunks' products, so
results may differ from the unfused graph in the last bits.
"""

from __future__ import annotations

import math

from xdsl.ir import Block, Operation, SSAValue
from xdsl.pattern_rewriter import PatternRewriter, op_type_rewrite_pattern
from xdsl.rewriter import InsertPoint

from modeldsl.dialects.graph_primitives import (
    CrossEntropyBackwardOp,
    CrossEntropyOp,
    FusedLmHeadLossBackwardOp,
    FusedLmHeadLossOp,
    MatmulOp,
    ViewOp,
)
from modeldsl.graph_builder import GraphBuilder, op_attr
from modeldsl.passes.fuse.common import FusionPattern, only_use
from modeldsl.symbolic import Expr

CHUNK_BYTES = 128 * 2**20  # the fp32 logits of one chunk


def chunk_rows(rows: Expr, vocab: Expr, chosen: int) -> int:
    """The ``chunk`` of a fused loss: ``chosen`` when set, else the most rows (a power of two, or all
    of them) whose fp32 logits fit in :data:`CHUNK_BYTES`; 0 (all rows) when the vocabulary is symbolic."""
    if chosen > 0:
        return chosen
    if vocab.symbols():
        return 0
    fitting = 2 ** max(0, int(math.log2(max(1, CHUNK_BYTES // (4 * vocab.evaluate())))))
    return fitting if rows.symbols() else min(fitting, rows.evaluate())


def lm_head_gemm(logits: SSAValue) -> tuple[MatmulOp, ViewOp | None] | None:
    """The plain ``matmul(x, weight, NT)`` (and the view to rows between) that ``logits`` come from."""
    view = logits.owner if isinstance(logits.owner, ViewOp) else None
    source = view.operands[0] if view is not None else logits
    matmul = source.owner
    if not isinstance(matmul, MatmulOp) or op_attr(matmul, "transpose", "NN") != "NT":
        return None
    if op_attr(matmul, "alpha", 1.0) != 1.0 or op_attr(matmul, "beta", 0.0) != 0.0 \
            or op_attr(matmul, "accumulate", False) or len(matmul.operands[1].type.shape) != 2:
        return None
    if view is not None and only_use(source) is not view:
        return None
    return matmul, view


def loss_params(op: Operation, chunk: int) -> dict:
    return {"ignore_index": op_attr(op, "ignore_index", -100), "reduction": op_attr(op, "reduction", "mean"),
            "chunk": chunk}


def as_rows(builder: GraphBuilder, x: SSAValue) -> SSAValue:
    """``x`` ``[..., C]`` as ``[rows, C]``."""
    if len(x.type.shape) == 2:
        return x
    rows = x.type.shape[0]
    for dim in x.type.shape[1:-1]:
        rows = rows * dim
    return builder.one("view", x, shape=[rows, x.type.shape[-1]])


class LmHeadLossBackward(FusionPattern):
    """``cross_entropy_backward`` + ``d_x = d_logits @ W`` + ``d_W = d_logits^T @ x``."""

    name = "lm_head_loss"
    primitives = ("matmul", "cross_entropy")

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: CrossEntropyBackwardOp, rewriter: PatternRewriter) -> None:
        d_loss, logits, labels, lse = op.operands
        found = lm_head_gemm(logits)
        if found is None or not isinstance(lse.owner, CrossEntropyOp) or lse.owner.operands[0] is not logits:
            return
        matmul, view = found
        x, weight = matmul.operands
        grads = gradient_gemms(op.results[0], x, weight)
        if grads is None:
            return
        d_view, dx_gemm, dw_gemm = grads
        matched = [op, matmul, dx_gemm, dw_gemm, *([d_view] if d_view is not None else [])]
        if not self.may_fuse(*matched):
            return
        builder = GraphBuilder.at(InsertPoint.before(op), rewriter)
        chunk = chunk_rows(logits.type.shape[0], weight.type.shape[0], self.switch.lm_head_chunk)
        d_rows, d_weight = builder.op("fused_lm_head_loss_backward", d_loss, as_rows(builder, x), weight, labels,
                                      lse, **loss_params(op, chunk))
        d_x = d_rows if d_rows.type == x.type else builder.one("view", d_rows, shape=list(x.type.shape))
        d_x.owner.location = d_weight.owner.location = op.location
        d_x.name_hint, d_weight.name_hint = dx_gemm.results[0].name_hint, dw_gemm.results[0].name_hint
        self.fused(matched)
        rewriter.replace(dx_gemm, [], [d_x])
        rewriter.replace(dw_gemm, [], [d_weight])
        if d_view is not None:
            rewriter.erase(d_view)
        rewriter.erase(op)


def gradient_gemms(d_logits: SSAValue, x: SSAValue, weight: SSAValue
                   ) -> tuple[ViewOp | None, MatmulOp, MatmulOp] | None:
    """(the view of ``d_logits`` to ``x``'s shape, the ``d_x`` GEMM, the ``d_W`` GEMM) when
    nothing else reads the logits' gradient: ``matmul(d, W, NN)`` and ``matmul(d, x, TN)``."""
    uses = list(d_logits.uses)
    d_view = uses[0].operation if len(uses) == 1 and isinstance(uses[0].operation, ViewOp) else None
    value = d_view.results[0] if d_view is not None else d_logits
    readers = [use.operation for use in value.uses]
    if len(readers) != 2 or not all(isinstance(r, MatmulOp) and r.operands[0] is value for r in readers):
        return None
    by_form = {(op_attr(r, "transpose", "NN"), r.operands[1]): r for r in readers}
    dx_gemm, dw_gemm = by_form.get(("NN", weight)), by_form.get(("TN", x))
    if dx_gemm is None or dw_gemm is None:
        return None
    for gemm in (dx_gemm, dw_gemm):
        if op_attr(gemm, "alpha", 1.0) != 1.0 or op_attr(gemm, "beta", 0.0) != 0.0 \
                or op_attr(gemm, "accumulate", False):
            return None
    if dw_gemm.results[0].type != weight.type:
        return None
    return d_view, dx_gemm, dw_gemm


class LmHeadLoss(FusionPattern):
    """``cross_entropy(matmul(x, W, NT))`` whose logits nothing else reads."""

    name = "lm_head_loss"
    primitives = ("matmul", "cross_entropy")

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: CrossEntropyOp, rewriter: PatternRewriter) -> None:
        logits, labels = op.operands
        found = lm_head_gemm(logits)
        if found is None or only_use(logits) is not op:
            return
        matmul, view = found
        matched = [op, matmul, *([view] if view is not None else [])]
        if not self.may_fuse(*matched):
            return
        x, weight = matmul.operands
        builder = GraphBuilder.at(InsertPoint.before(op), rewriter)
        chunk = chunk_rows(logits.type.shape[0], weight.type.shape[0], self.switch.lm_head_chunk)
        loss, lse = builder.op("fused_lm_head_loss", as_rows(builder, x), weight, labels, **loss_params(op, chunk))
        loss.owner.location = op.location
        loss.name_hint, lse.name_hint = (r.name_hint for r in op.results)
        self.fused(matched)
        rewriter.replace(op, [], [loss, lse])
        if view is not None:
            rewriter.erase(view)
        rewriter.erase(matmul)


def known_before(value: SSAValue, op: Operation) -> bool:
    """Whether ``value`` is there where ``op`` stands: an argument of its block, or the result of an
    op before it in that block."""
    block = op.parent_block()
    if isinstance(value.owner, Block):
        return value.owner is block
    return value.owner.parent_block() is block and value.owner.is_before_in_block(op)


def same_rows(a: SSAValue, b: SSAValue) -> bool:
    """``a`` and ``b`` are one value, or the same view of one (each fusion views ``x`` to rows: CSE
    merges the two views only after the patterns)."""
    if a is b:
        return True
    return isinstance(a.owner, ViewOp) and isinstance(b.owner, ViewOp) and a.type == b.type \
        and a.owner.operands[0] is b.owner.operands[0]


def same_loss(forward: FusedLmHeadLossOp, backward: FusedLmHeadLossBackwardOp) -> bool:
    """The backward differentiates exactly this forward: the same x, weight, labels and options."""
    return (all(same_rows(a, b) for a, b in zip(forward.operands, backward.operands[1:4]))
            and all(op_attr(forward, k, d) == op_attr(backward, k, d)
                    for k, d in (("ignore_index", -100), ("reduction", "mean"), ("chunk", 0))))


class LmHeadLossGrad(FusionPattern):
    """``fused_lm_head_loss`` + its ``fused_lm_head_loss_backward`` with ``d_loss`` known before the forward."""

    name = "lm_head_loss"
    primitives = ("matmul", "cross_entropy")

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: FusedLmHeadLossBackwardOp, rewriter: PatternRewriter) -> None:
        d_loss, lse = op.operands[0], op.operands[4]
        forward = lse.owner
        if not isinstance(forward, FusedLmHeadLossOp) or lse is not forward.results[1] or only_use(lse) is not op \
                or not same_loss(forward, op) or not known_before(d_loss, forward):
            return
        if not self.may_fuse(forward, op):
            return
        x, weight, labels = forward.operands
        params = loss_params(forward, op_attr(forward, "chunk", 0))
        builder = GraphBuilder.at(InsertPoint.before(forward), rewriter)
        loss, d_x, d_weight = builder.op("fused_lm_head_loss_grad", d_loss, x, weight, labels, **params)
        loss.owner.location = forward.location
        loss.name_hint = forward.results[0].name_hint
        d_x.name_hint, d_weight.name_hint = (r.name_hint for r in op.results)
        self.fused([forward, op])
        rewriter.replace(op, [], [d_x, d_weight])
        rewriter.replace(forward, [], [loss, None])
