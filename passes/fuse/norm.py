"""``mdsl-fuse`` pattern ``residual_norm`` (spec 7.5.1): a residual add feeding an RMSNorm, and
the backward pair of it.

``r = add(a, b); (y, rstd) = rmsnorm(r, w)`` becomes ``(r, y, rstd) =
fused_residual_rmsnorm(a, b, w)``: one pass over the residual stream instead of
a write of ``r`` and a read of it. ``r`` may have other readers (the next
residual add, the backward): they read the fused op's ``residual_out``. The
arithmetic is the same (the sum, then the norm of it), so results are bitwise
equal. Not fused: operands of different shapes or dtypes (a broadcasting add),
or a barrier on either op (``@nofuse``, a hook or probe, a recompute replay).

Backward (:class:`ResidualNormBackward`): the gradient of the norm's input joins the residual
stream's gradient, ``(d_r, d_w) = rmsnorm_backward(d_y, r, w, rstd); d = add(d_r, d_next)``
(either operand order), and becomes ``(d, d_input, d_w) = fused_residual_rmsnorm_backward(d_y,
d_next, r, w, rstd)``: the sum is written while the rows are in registers, ``d_r`` never is.
``d_input`` equals ``d`` (the fused op's two residual gradients); nothing reads it here. The
reference computes ``d_next + d_x`` in the compute dtype and rounds once, so in fp32 the result
is bitwise the unfused pair's (IEEE addition commutes); in bf16 the unfused pair rounds ``d_r`` to
bf16 before the add, the fused op does not (at most one bf16 ulp apart, and the fused one is the
closer). Not fused: ``d_r`` read by another op, operands of different shapes or dtypes, a barrier
on either op.
"""

from __future__ import annotations

from xdsl.ir import Operation
from xdsl.pattern_rewriter import PatternRewriter, op_type_rewrite_pattern
from xdsl.rewriter import InsertPoint

from modeldsl.dialects.graph_primitives import AddOp, RmsnormBackwardOp, RmsnormOp
from modeldsl.graph_builder import GraphBuilder, op_attr
from modeldsl.passes.fuse.common import (
    FusionPattern,
    carry_checkpoint,
    carry_memory_modes,
    memory_modes,
    only_use,
    same_types,
)


class ResidualNorm(FusionPattern):
    name = "residual_norm"
    primitives = ("add", "rmsnorm")

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: RmsnormOp, rewriter: PatternRewriter) -> None:
        residual = op.operands[0]
        add = residual.owner
        if not isinstance(add, AddOp) or not self.may_fuse(add, op):
            return
        a, b = add.operands
        if not same_types(a, b, residual):
            return
        where = _insertion_point(add, op)
        if where is None:
            return
        builder = GraphBuilder.at(InsertPoint.before(where), rewriter)
        residual_out, y, rstd = builder.op("fused_residual_rmsnorm", a, b, op.operands[1], eps=op_attr(op, "eps"))
        fused = residual_out.owner
        fused.location = op.location
        carry_memory_modes(fused, [*memory_modes(add), *memory_modes(op)])
        carry_checkpoint(fused, op, add)
        residual_out.name_hint, y.name_hint, rstd.name_hint = residual.name_hint, *(r.name_hint for r in op.results)
        self.fused((add, op))
        rewriter.replace(op, [], [y, rstd])
        rewriter.replace(add, [], [residual_out])


class ResidualNormBackward(FusionPattern):
    """``add(rmsnorm_backward(...).d_x, d_next)`` (either order) -> ``fused_residual_rmsnorm_backward``."""

    name = "residual_norm"
    primitives = ("rmsnorm_backward", "add")

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: AddOp, rewriter: PatternRewriter) -> None:
        found = _norm_gradient_operand(op)
        if found is None:
            return
        backward, d_next = found
        d_x, d_w = backward.results
        if not same_types(d_x, d_next, op.results[0]) or not self.may_fuse(backward, op):
            return
        where = _backward_insertion_point(backward, op, d_next)
        if where is None:
            return
        d_y, residual, weight, rstd = backward.operands
        builder = GraphBuilder.at(InsertPoint.before(where), rewriter)
        d_residual, d_input, d_weight = builder.op("fused_residual_rmsnorm_backward", d_y, d_next, residual, weight,
                                                   rstd)
        d_residual.owner.location = op.location
        carry_checkpoint(d_residual.owner, backward, op)
        d_residual.name_hint, d_weight.name_hint = op.results[0].name_hint, d_w.name_hint
        self.fused((backward, op))
        rewriter.replace(op, [], [d_residual])
        rewriter.replace(backward, [], [None, d_weight])


def _norm_gradient_operand(add: AddOp) -> tuple[RmsnormBackwardOp, object] | None:
    """(the rmsnorm_backward whose ``d_x`` only this add reads, the add's other operand)."""
    for index, operand in enumerate(add.operands):
        backward = operand.owner
        if isinstance(backward, RmsnormBackwardOp) and operand is backward.results[0] and only_use(operand) is add:
            return backward, add.operands[1 - index]
    return None


def _backward_insertion_point(backward: RmsnormBackwardOp, add: AddOp, d_next):
    """At the add when nothing reads ``d_w`` before it, else at the norm's backward when ``d_next``
    is defined before that; None when neither."""
    block = add.parent_block()
    if backward.parent_block() is not block:
        return None
    if all(u.operation is add or add.is_before_in_block(u.operation) for u in backward.results[1].uses):
        return add
    owner = d_next.owner
    if not isinstance(owner, Operation) or owner.parent_block() is not block or owner.is_before_in_block(backward):
        return backward
    return None


def _insertion_point(add: AddOp, norm: RmsnormOp):
    """Where the fused op can stand: at the norm when nothing reads the sum before it, else at the
    add when the norm's weight is defined before the add; None when neither."""
    block = norm.parent_block()
    if add.parent_block() is not block:
        return None
    if all(u.operation is norm or norm.is_before_in_block(u.operation) for u in add.results[0].uses):
        return norm
    weight = norm.operands[1].owner
    if not isinstance(weight, Operation) or weight.parent_block() is not block or weight.is_before_in_block(add):
        return add
    return None

