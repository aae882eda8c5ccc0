"""``mdsl-fuse`` pattern ``residual_norm`` (spec 7.5.1): a residual add feeding an RMSNorm.

``r = add(a, b); (y, rstd) = rmsnorm(r, w)`` becomes ``(r, y, rstd) =
fused_residual_rmsnorm(a, b, w)``: one pass over the residual stream instead of
a write of ``r`` and a read of it. ``r`` may have other readers (the next
residual add, the backward): they read the fused op's ``residual_out``. The
arithmetic is the same (the sum, then the norm of it), so results are bitwise
equal. Not fused: operands of different shapes or dtypes (a broadcasting add),
or a barrier on either op (``@nofuse``, a hook or probe, a recompute replay).
"""

from __future__ import annotations

from xdsl.pattern_rewriter import PatternRewriter, op_type_rewrite_pattern

from xdsl.dialects.builtin import ArrayAttr, StringAttr
from xdsl.ir import Operation

from modeldsl.dialects.graph_primitives import AddOp, RmsnormOp
from modeldsl.graph_builder import GraphBuilder, op_attr
from modeldsl.passes.fuse_common import FusionPattern, same_types


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
        builder = GraphBuilder(op.parent_block(), before=where)
        residual_out, y, rstd = builder.op("fused_residual_rmsnorm", a, b, op.operands[1], eps=op_attr(op, "eps"))
        fused = residual_out.owner
        fused.location = op.location
        modes = [*_modes(add), *_modes(op)]
        if any(m != "auto" for m in modes):
            fused.attributes["memory"] = ArrayAttr([StringAttr(m) for m in modes])
        for source in (op, add):
            if "checkpoint" in source.attributes:
                fused.attributes["checkpoint"] = source.attributes["checkpoint"]
        residual_out.name_hint, y.name_hint, rstd.name_hint = residual.name_hint, *(r.name_hint for r in op.results)
        self.fused((add, op))
        rewriter.replace(op, [], [y, rstd])
        rewriter.replace(add, [], [residual_out])


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


def _modes(op) -> list[str]:
    """An op's ``memory`` modes, ``auto`` for each result where it records none."""
    memory = op.attributes.get("memory")
    return [a.data for a in memory.data] if isinstance(memory, ArrayAttr) else ["auto"] * len(op.results)
