"""``mdsl-fuse`` pattern ``fold``: ops that cancel or combine, folded (xDSL's CSE and the rewriter's
dead-code removal do the rest of the pass's cleanup).

* ``scale(x, 1)``, ``add_scalar(x, 0)``, a ``view`` to the shape it has: ``x`` itself;
* ``transpose(transpose(x, a, b), a, b)``: ``x``;
* ``view(view(x))``: one ``view`` of ``x``;
* ``scale(scale(x, a), b)``: ``scale(x, a * b)`` (one rounding instead of two).

The inner op is folded only when nothing else reads it; barriers (``@nofuse``, hooks, probes,
recompute replays) are left alone. The graph holds no constant tensors to fold (parameters
are bound at run time), so a transpose of a weight is never materialized here: ``transpose_flag``
puts it into the GEMM's flags.
"""

from __future__ import annotations

from xdsl.dialects.builtin import FloatAttr, f64
from xdsl.ir import Operation
from xdsl.pattern_rewriter import PatternRewriter, op_type_rewrite_pattern

from modeldsl.dialects.graph_primitives import AddScalarOp, ScaleOp, TransposeOp, ViewOp
from modeldsl.graph_builder import op_attr
from modeldsl.passes.fuse.common import FusionPattern, only_use


def swapped_dims(op: TransposeOp) -> frozenset[int]:
    rank = len(op.operands[0].type.shape)
    return frozenset(d % rank for d in (op.dim0.value.data, op.dim1.value.data))


def is_identity(op: Operation) -> bool:
    """Whether ``op`` returns its operand unchanged."""
    if isinstance(op, ScaleOp):
        return op_attr(op, "factor") == 1.0
    if isinstance(op, AddScalarOp):
        return op_attr(op, "value") == 0.0
    return isinstance(op, ViewOp) and op.operands[0].type == op.results[0].type


class FoldIdentity(FusionPattern):
    """``scale(x, 1)``, ``add_scalar(x, 0)``, a view to its own shape -> ``x``."""

    name = "fold"
    primitives = ("scale",)

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: ScaleOp | AddScalarOp | ViewOp, rewriter: PatternRewriter) -> None:
        if is_identity(op) and op.results[0].type == op.operands[0].type and self.may_fuse(op):
            self.fused((op,))
            op.operands[0].name_hint = op.operands[0].name_hint or op.results[0].name_hint
            rewriter.replace(op, [], [op.operands[0]])


def inner(op: Operation, kind: type) -> Operation | None:
    """The op of type ``kind`` that alone feeds ``op``'s first operand."""
    source = op.operands[0].owner
    return source if isinstance(source, kind) and only_use(op.operands[0]) is op else None


class FoldTransposes(FusionPattern):
    """``transpose(transpose(x, a, b), a, b)`` -> ``x``."""

    name = "fold"
    primitives = ("transpose",)

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: TransposeOp, rewriter: PatternRewriter) -> None:
        first = inner(op, TransposeOp)
        if first is None or swapped_dims(first) != swapped_dims(op) or not self.may_fuse(first, op):
            return
        self.fused((first, op))
        rewriter.replace(op, [], [first.operands[0]])
        rewriter.erase(first)


class FoldViews(FusionPattern):
    """``view(view(x))`` -> ``view(x)``."""

    name = "fold"
    primitives = ("view",)

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: ViewOp, rewriter: PatternRewriter) -> None:
        first = inner(op, ViewOp)
        if first is None or not self.may_fuse(first, op):
            return
        self.fused((first, op))
        rewriter.replace_uses_with_if(first.results[0], first.operands[0], lambda use: use.operation is op)
        rewriter.erase(first)
        rewriter.notify_op_modified(op)


class FoldScales(FusionPattern):
    """``scale(scale(x, a), b)`` -> ``scale(x, a * b)``."""

    name = "fold"
    primitives = ("scale",)

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: ScaleOp, rewriter: PatternRewriter) -> None:
        first = inner(op, ScaleOp)
        if first is None or not self.may_fuse(first, op):
            return
        self.fused((first, op))
        op.attributes["factor"] = FloatAttr(op_attr(first, "factor") * op_attr(op, "factor"), f64)
        rewriter.replace_uses_with_if(first.results[0], first.operands[0], lambda use: use.operation is op)
        rewriter.erase(first)
        rewriter.notify_op_modified(op)
