"""``mdsl-fuse`` pattern ``scalar_alpha`` (seed 004): a scalar multiply around a GEMM goes into its alpha.

``matmul(scale(a, s), b)`` and ``scale(matmul(a, b), s)`` become one
``matmul(a, b) {alpha = alpha * s}``: the GEMM scales its product, and the
scaled tensor is never written. (``mdsl-lower-to-sched`` already folds a
transpose of the last two dims into the GEMM's flags.) Not fused: a scaled
tensor another op also reads, an accumulating matmul (``accumulate`` or
``beta``), a barrier on either op. The product is rounded once instead of twice,
so results may differ from the unfused graph in the last bit.
"""

from __future__ import annotations

from xdsl.dialects.builtin import FloatAttr, f64
from xdsl.pattern_rewriter import PatternRewriter, op_type_rewrite_pattern

from modeldsl.dialects.graph_primitives import MatmulOp, ScaleOp
from modeldsl.graph_builder import op_attr
from modeldsl.passes.fuse_common import FusionPattern, is_barrier, only_use


def fusable_matmul(op) -> bool:
    return isinstance(op, MatmulOp) and not is_barrier(op) and not op_attr(op, "accumulate", False) \
        and op_attr(op, "beta", 0.0) == 0.0


def scaled_alpha(matmul: MatmulOp, scale: ScaleOp) -> FloatAttr:
    return FloatAttr(op_attr(matmul, "alpha", 1.0) * op_attr(scale, "factor", 1.0), f64)


class ScaleIntoAlpha(FusionPattern):
    """``matmul(scale(a, s), b)`` or ``matmul(a, scale(b, s))``."""

    name = "scalar_alpha"
    primitives = ("scale", "matmul")

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: MatmulOp, rewriter: PatternRewriter) -> None:
        if not fusable_matmul(op):
            return
        for index, operand in enumerate(op.operands):
            scale = operand.owner
            if isinstance(scale, ScaleOp) and only_use(operand) is op and self.may_fuse(scale, op):
                op.attributes["alpha"] = scaled_alpha(op, scale)
                op.operands[index] = scale.operands[0]
                self.fused((scale, op))
                rewriter.erase(scale)
                rewriter.notify_op_modified(op)
                return


class AlphaFromScale(FusionPattern):
    """``scale(matmul(a, b), s)``: the scale's result is the matmul's, with alpha scaled."""

    name = "scalar_alpha"
    primitives = ("scale", "matmul")

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: ScaleOp, rewriter: PatternRewriter) -> None:
        matmul = op.operands[0].owner
        if not fusable_matmul(matmul) or only_use(op.operands[0]) is not op or not self.may_fuse(matmul, op):
            return
        if op.results[0].type != matmul.results[0].type:
            return
        matmul.attributes["alpha"] = scaled_alpha(matmul, op)
        matmul.results[0].name_hint = op.results[0].name_hint or matmul.results[0].name_hint
        rewriter.notify_op_modified(matmul)
        self.fused((matmul, op))
        rewriter.replace(op, [], [matmul.results[0]])
