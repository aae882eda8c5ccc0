"""``mdsl-fuse`` pattern ``qk_norm_rope`` (issue 15: "qk_norm + rope -> one op"): the per-head
RMSNorm of q and k and the rotary embedding after it, forward and backward.

Forward (:class:`QkNormRope`): ``(q, k, q_rstd, k_rstd) = qk_norm(q_heads, k_heads, q_w, k_w);
(q_rot, k_rot) = rope(q, k, freqs)`` becomes ``(q_rot, k_rot, q_rstd, k_rstd) =
fused_qk_norm_rope(q_heads, k_heads, q_w, k_w, freqs)``: each head vector is normalized and
rotated in registers, the normed q and k are never written nor read back. The statistics may have
other readers (a backward that saved them): they read the fused op's. The fused op yields rope's
results unchanged, so an ``observe`` hook on the rope (the std attention's
``@hook(BeforeAttention)``) moves onto it (spec 5.11.3; :func:`~modeldsl.passes.fuse.common.carry_hooks`).

Backward (:class:`QkNormRopeBackward`): ``(d_q_norm, d_k_norm) = rope_backward(d_q_rot, d_k_rot,
freqs)`` read only by ``qk_norm_backward`` becomes ``fused_qk_norm_rope_backward(d_q_rot, d_k_rot,
q, k, q_w, k_w, q_rstd, k_rstd, freqs)``.

Numerics: the reference composes the qk_norm and rope references with the intermediate in the
compute dtype, so in fp32 the fused ops are bitwise the unfused pair; in bf16 the unfused pair
rounds the normed q/k (forward) and ``d_q_norm``/``d_k_norm`` (backward) to bf16 between the two
ops and the fused ops do not (at most one bf16 rounding apart, the fused one the closer).

Not fused: the normed q or k read by another op, a barrier on either op (``@nofuse``, a
``@probe``, a ``modify``/``replace`` hook, any hook on the qk_norm, a recompute replay), or no
place in the block where the fused op's operands are all defined before its results are read.
A heads-first pair that ``attention_layout`` will put in ``[B, T, H, D]`` waits for it (that
pattern rewrites qk_norm and rope, not the fused op), then fuses in ``bthd``.
"""

from __future__ import annotations

from xdsl.ir import Operation, SSAValue
from xdsl.pattern_rewriter import PatternRewriter, op_type_rewrite_pattern
from xdsl.rewriter import InsertPoint

from modeldsl.dialects.graph_primitives import FlashAttentionOp, QkNormBackwardOp, QkNormOp, RopeBackwardOp, RopeOp
from modeldsl.graph_builder import GraphBuilder, op_attr
from modeldsl.passes.fuse.common import (
    FusionPattern,
    carry_checkpoint,
    carry_hooks,
    carry_memory_modes,
    memory_modes,
    only_use,
)
from modeldsl.passes.fuse.layout import AttentionLayout, head_chain, is_head_transpose


class QkNormRope(FusionPattern):
    """``rope(qk_norm(...).q_norm, .k_norm, freqs)`` -> ``fused_qk_norm_rope``."""

    name = "qk_norm_rope"
    primitives = ("qk_norm", "rope")
    carries_hooks = True

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: RopeOp, rewriter: PatternRewriter) -> None:
        norm = _normed_by(op)
        if norm is None or not self.may_fuse(norm, op, carrying=(op,)) or self.left_to_attention_layout(op):
            return
        where = _forward_insertion_point(norm, op)
        if where is None:
            return
        q_heads, k_heads, q_weight, k_weight = norm.operands
        builder = GraphBuilder.at(InsertPoint.before(where), rewriter)
        q_rot, k_rot, q_rstd, k_rstd = builder.op(
            "fused_qk_norm_rope", q_heads, k_heads, q_weight, k_weight, op.operands[2], eps=op_attr(norm, "eps"),
            interleaved=op_attr(op, "interleaved"), layout=op_attr(op, "layout"))
        fused = q_rot.owner
        fused.location = op.location
        carry_memory_modes(fused, [*memory_modes(op), *memory_modes(norm)[2:]])
        carry_checkpoint(fused, norm, op)
        carry_hooks(fused, op)
        for new, old in zip((q_rot, k_rot, q_rstd, k_rstd), (*op.results, *norm.results[2:])):
            new.name_hint = old.name_hint
        self.fused((norm, op))
        rewriter.replace(op, [], [q_rot, k_rot])
        rewriter.replace(norm, [], [None, None, q_rstd, k_rstd])

    def left_to_attention_layout(self, rope: RopeOp) -> bool:
        """A heads-first rope that ``attention_layout`` puts in ``bthd`` with its chain from the head
        transposes to the attention (that pattern knows qk_norm and rope, not the fused op): this
        pattern fuses the pair once it has."""
        attention = only_use(rope.results[0])
        if rope.layout.data != "bhtd" or not isinstance(attention, FlashAttentionOp):
            return False
        exit_ = only_use(attention.out)
        if attention.layout.data != "bhtd" or attention.alibi_slopes is not None or not is_head_transpose(exit_):
            return False
        chain, layout = head_chain(attention), AttentionLayout(self.switch)
        if chain is None or layout.name not in self.switch.enabled:
            return False
        return layout.may_fuse(*chain.ops(attention, exit_))


class QkNormRopeBackward(FusionPattern):
    """``qk_norm_backward(rope_backward(...).d_q, .d_k, ...)`` -> ``fused_qk_norm_rope_backward``."""

    name = "qk_norm_rope"
    primitives = ("rope_backward", "qk_norm_backward")

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: QkNormBackwardOp, rewriter: PatternRewriter) -> None:
        rope = op.operands[0].owner
        if not isinstance(rope, RopeBackwardOp) or tuple(op.operands[:2]) != tuple(rope.results):
            return
        if any(only_use(r) is not op for r in rope.results) or rope.parent_block() is not op.parent_block():
            return
        if not self.may_fuse(rope, op):
            return
        d_q_rot, d_k_rot, freqs = rope.operands
        builder = GraphBuilder.at(InsertPoint.before(op), rewriter)
        results = builder.op("fused_qk_norm_rope_backward", d_q_rot, d_k_rot, *op.operands[2:], freqs,
                             interleaved=op_attr(rope, "interleaved"), layout=op_attr(rope, "layout"))
        results[0].owner.location = op.location
        for new, old in zip(results, op.results):
            new.name_hint = old.name_hint
        self.fused((rope, op))
        rewriter.replace(op, [], list(results))
        rewriter.erase(rope)


def _normed_by(rope: RopeOp) -> QkNormOp | None:
    """The qk_norm whose normed q and k (and nothing else of it, as q and k) only ``rope`` reads."""
    q, k = rope.operands[0], rope.operands[1]
    norm = q.owner
    if not isinstance(norm, QkNormOp) or (q, k) != (norm.results[0], norm.results[1]):
        return None
    if only_use(q) is not rope or only_use(k) is not rope or norm.parent_block() is not rope.parent_block():
        return None
    return norm


def _forward_insertion_point(norm: QkNormOp, rope: RopeOp) -> Operation | None:
    """At the rope when nothing reads the statistics before it, else at the qk_norm when freqs is
    defined before that; None when neither."""
    if all(u.operation is rope or rope.is_before_in_block(u.operation) for r in norm.results[2:] for u in r.uses):
        return rope
    return norm if _defined_before(rope.operands[2], norm) else None


def _defined_before(value: SSAValue, op: Operation) -> bool:
    owner = value.owner
    if not isinstance(owner, Operation):  # a block argument: of this block or an enclosing one
        return True
    return owner.parent_block() is not op.parent_block() or owner.is_before_in_block(op)

