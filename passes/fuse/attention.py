"""``mdsl-fuse`` attention patterns: ``attention_softmax`` (spec 7.5.1) and ``dag_attention``.

``attention_softmax`` (:class:`AttentionSoftmax`): ``softmax(scale(matmul(a, b), s))``, the
scores of attention scaled by ``1/sqrt(d)``, becomes ``softmax(matmul(a, b) {alpha = alpha *
s})``: the GEMM scales its product (softmax has no scale of its own; ``batched_matmul`` and
``matmul`` have the GEMM's ``alpha``), so the scaled scores are never written. The product is
scaled once, as the scale did: on the CPU in fp32 the result is bitwise the unfused one when the
GEMM's alpha was 1 (the reference computes ``alpha * (A @ B)``, the scale ``x * s``); on the GPU
cuBLASLt applies alpha in its fp32 accumulator, so bf16 scores skip one rounding. Spec 7.5.1's
table lists dropout too: ``mdsl.graph`` has no dropout primitive, so there is none to merge.

``dag_attention`` (:class:`DagAttention`): attention written out op by op,
``s = batched_matmul(q, k, NT)`` (or ``NN`` on a ``transpose`` of ``k``'s last two dims),
``[scale(s, c)]``, ``[causal_mask(s)]``, ``p = softmax(s, -1)``, ``o = batched_matmul(p, v)``,
becomes ``o, lse = flash_attention(q, k, v) {causal, softmax_scale = c * alpha}``: the ``[T,
T]`` scores and probabilities are never written. The scale may stand as a ``scale`` op or as
the scores GEMM's ``alpha`` (after ``attention_softmax``); without either it is 1. ``q``, ``k``,
``v`` are ``[B, H, T, D]`` (flash_attention's ``bhtd`` layout, spec 6.4.1), or ``[N, T, D]``
with the heads folded into the batch: views to ``[1, N, T, D]`` (aliases, no copies) go around
the fused op. GQA needs no match: a written-out ``batched_matmul`` requires ``q`` and ``k`` of
the same heads.

Causal attention: a ``causal_mask`` (PyTorch's ``masked_fill`` of ``triu(offset + 1)`` with
``-inf``) before or after the scale makes it ``flash_attention {causal = true}``, its
``window_size`` the flash_attention's (a causal sliding window, as Mistral's). flash_attention
puts the queries at the last positions (query ``i`` sees keys ``j <= i + Tk - Tq``), so the
mask's ``offset`` must be ``Tk - Tq`` (0 with as many queries as keys); another offset, a
symbolic ``Tk - Tq`` that is no constant, or ``fill = "zero"`` (the mask's gradient form) keeps
the written-out attention.

Numerics of ``dag_attention``: flash_attention's reference normalizes with the log-sum-exp
(``exp(s - lse)``) where softmax divides by the sum of ``exp(s - max)``, so the result differs
from the written-out one by a few ulps (tested at a tight tolerance against the unfused graph and
against PyTorch's ``scaled_dot_product_attention``).

Not fused (either pattern): a barrier (``@nofuse``, a hook or probe, a recompute replay) on any
merged op, an accumulating GEMM (``accumulate`` or ``beta``), an intermediate another op also
reads (so after autodiff, whose backward reads the probabilities, the written-out attention
stays; a training step therefore runs ``dag_attention`` before autodiff too, ``BEFORE_AUTODIFF`` in
:mod:`modeldsl.passes.pipelines`, and differentiates flash_attention), a ``@checkpoint`` or ``@memory``
mode on an intermediate. ``dag_attention`` also keeps: a non-positive scale (flash_attention's
``softmax_scale`` must be positive), a scale on the probabilities instead of the scores, a
softmax over another dim than the last, a second scale or mask, a probability GEMM with a transpose or an alpha, and
``q``/``k``/``v`` whose shapes or dtypes are not attention's (``v`` must have ``k``'s shape, and
there may not be more queries than keys).
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.dialects.builtin import ArrayAttr, FloatAttr, StringAttr, f64
from xdsl.ir import Operation, SSAValue
from xdsl.pattern_rewriter import PatternRewriter, op_type_rewrite_pattern
from xdsl.rewriter import InsertPoint

from modeldsl.dialects.graph_primitives import (
    BatchedMatmulOp,
    CausalMaskOp,
    MatmulOp,
    ScaleOp,
    SoftmaxOp,
    is_symbolic,
)
from modeldsl.graph_builder import GraphBuilder, op_attr
from modeldsl.passes.fuse.common import FusionPattern, carry_checkpoint, keeps_no_mode, only_use
from modeldsl.passes.fuse.gemm import swaps_last_two

GEMMS = (MatmulOp, BatchedMatmulOp)


def plain_gemm(op: Operation | None) -> bool:
    """A ``matmul``/``batched_matmul`` that overwrites its result (no ``accumulate``, no ``beta``)."""
    return isinstance(op, GEMMS) and not op_attr(op, "accumulate", False) and op_attr(op, "beta", 0.0) == 0.0


class AttentionSoftmax(FusionPattern):
    """``softmax(scale(gemm(a, b), s))`` -> ``softmax(gemm(a, b) {alpha = alpha * s})``."""

    name = "attention_softmax"
    primitives = ("scale", "softmax")

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: SoftmaxOp, rewriter: PatternRewriter) -> None:
        scaled = op.operands[0]
        scale = scaled.owner
        if not isinstance(scale, ScaleOp) or only_use(scaled) is not op:
            return
        scores = scale.operands[0]
        gemm = scores.owner
        if not plain_gemm(gemm) or only_use(scores) is not scale or scores.type != scaled.type:
            return
        if not keeps_no_mode(scale) or not self.may_fuse(gemm, scale, op):
            return
        gemm.attributes["alpha"] = FloatAttr(op_attr(gemm, "alpha", 1.0) * op_attr(scale, "factor"), f64)
        scores.name_hint = scaled.name_hint or scores.name_hint
        rewriter.notify_op_modified(gemm)
        self.fused((gemm, scale, op))
        rewriter.replace(scale, [], [scores])


@dataclass
class WrittenAttention:
    """The ops of one written-out attention (the probability GEMM last) and what it computes."""

    ops: list[Operation]
    q: SSAValue
    k: SSAValue
    v: SSAValue
    scale: float
    mask: CausalMaskOp | None = None


def written_attention(root: BatchedMatmulOp) -> WrittenAttention | None:
    """The written-out attention whose last op is ``root`` (``p @ v``), or None."""
    if not plain_gemm(root) or op_attr(root, "transpose", "NN") != "NN" or op_attr(root, "alpha", 1.0) != 1.0:
        return None
    p, v = root.operands
    softmax = p.owner
    if not isinstance(softmax, SoftmaxOp) or only_use(p) is not root or not softmax_over_last_dim(softmax):
        return None
    ops, scores = [softmax, root], softmax.operands[0]
    while isinstance(scores.owner, (ScaleOp, CausalMaskOp)) and not any(type(o) is type(scores.owner) for o in ops):
        if only_use(scores) is not ops[0]:
            return None
        ops.insert(0, scores.owner)
        scores = scores.owner.operands[0]
    found = query_key_product(scores, ops[0])
    if found is None:
        return None
    gemm_ops, q, k = found
    if any(is_symbolic(o) for o in [*gemm_ops, *ops]):
        return None  # a #mdsl.graph.sym scale waits for mdsl-specialize
    scale = op_attr(gemm_ops[-1], "alpha", 1.0)
    scale *= next((op_attr(o, "factor") for o in ops if isinstance(o, ScaleOp)), 1.0)
    mask = next((o for o in ops if isinstance(o, CausalMaskOp)), None)
    return WrittenAttention([*gemm_ops, *ops], q, k, v, scale, mask)


def flash_causal(mask: CausalMaskOp | None, q: SSAValue, k: SSAValue) -> bool:
    """Whether ``mask`` (or its absence) is what flash_attention's ``causal`` computes: -inf past
    query ``i``'s position ``i + Tk - Tq``, so ``offset`` must be the constant ``Tk - Tq``."""
    if mask is None:
        return True
    extra_keys = (k.type.shape[-2] - q.type.shape[-2]).const_value()
    return op_attr(mask, "fill", "neg_inf") == "neg_inf" and extra_keys == op_attr(mask, "offset", 0)


def softmax_over_last_dim(softmax: SoftmaxOp) -> bool:
    x = softmax.operands[0].type
    dim = op_attr(softmax, "dim", -1)
    return dim == -1 or (not x.is_variadic and dim == len(x.shape) - 1)


def query_key_product(scores: SSAValue, reader: Operation) -> tuple[list[Operation], SSAValue, SSAValue] | None:
    """(its ops, q, k) of ``scores = q @ k^T`` read only by ``reader``: a ``NT`` GEMM, or an ``NN``
    one on a transpose of ``k``'s last two dims that nothing else reads."""
    gemm = scores.owner
    if not isinstance(gemm, BatchedMatmulOp) or not plain_gemm(gemm) or only_use(scores) is not reader:
        return None
    q, k = gemm.operands
    mode = op_attr(gemm, "transpose", "NN")
    if mode == "NT":
        return [gemm], q, k
    if mode == "NN" and swaps_last_two(k.owner) and only_use(k) is gemm:
        return [k.owner, gemm], q, k.owner.operands[0]
    return None


def attention_shapes(q: SSAValue, k: SSAValue, v: SSAValue, out: SSAValue) -> bool:
    """Whether ``q [*, Tq, D]``, ``k``/``v [*, Tk, D]`` and ``out [*, Tq, D]`` (rank 3 or 4, one
    dtype) are what flash_attention computes on."""
    types = [x.type for x in (q, k, v, out)]
    if any(t.is_variadic for t in types) or len({t.dtype for t in types}) != 1:
        return False
    if len(q.type.shape) not in (3, 4) or v.type != k.type or out.type != q.type:
        return False
    if len(k.type.shape) != len(q.type.shape) or k.type.shape[-1] != q.type.shape[-1]:
        return False
    more_queries = (q.type.shape[-2] - k.type.shape[-2]).const_value()
    return more_queries is None or more_queries <= 0  # flash_attention takes Tq <= Tk


class DagAttention(FusionPattern):
    """Written-out attention, causal (``causal_mask``) or not -> ``flash_attention`` (module docstring)."""

    name = "dag_attention"
    primitives = ("batched_matmul", "softmax")

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: BatchedMatmulOp, rewriter: PatternRewriter) -> None:
        found = written_attention(op)
        if found is None or not found.scale > 0 or not attention_shapes(found.q, found.k, found.v, op.results[0]):
            return
        if not flash_causal(found.mask, found.q, found.k):
            return
        if not all(keeps_no_mode(o) for o in found.ops[:-1]) or not self.may_fuse(*found.ops):
            return
        out = self.build(found, op, rewriter)
        self.fused(found.ops)
        rewriter.replace(op, [], [out])
        for dead in reversed(found.ops[:-1]):
            rewriter.erase(dead)

    def build(self, found: WrittenAttention, root: BatchedMatmulOp, rewriter: PatternRewriter) -> SSAValue:
        """``flash_attention`` before ``root`` (between views to ``[1, N, T, D]`` for rank 3): its ``out``."""
        builder = GraphBuilder.at(InsertPoint.before(root), rewriter)
        q, k, v = found.q, found.k, found.v
        folded = len(q.type.shape) == 3
        if folded:
            q, k, v = (builder.one("view", x, shape=[1, *x.type.shape]) for x in (q, k, v))
        window = None if found.mask is None else op_attr(found.mask, "window_size")
        out, lse = builder.op("flash_attention", q, k, v, causal=found.mask is not None, softmax_scale=found.scale,
                              window_size=window)
        fused = out.owner
        fused.location = root.location
        carry_checkpoint(fused, root)
        memory = root.attributes.get("memory")
        if isinstance(memory, ArrayAttr):
            fused.attributes["memory"] = ArrayAttr([*memory.data, StringAttr("auto")])
        if folded:
            out = builder.one("view", out, shape=list(root.results[0].type.shape))
        out.name_hint = root.results[0].name_hint
        lse.name_hint = f"{out.name_hint}_lse" if out.name_hint else None
        return out
