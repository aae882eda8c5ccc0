"""``mdsl-fuse`` patterns on GEMMs (seed 004): ``scalar_alpha`` and ``transpose_flag``.

``matmul(scale(a, s), b)`` and ``scale(matmul(a, b), s)`` become one
``matmul(a, b) {alpha = alpha * s}``: the GEMM scales its product, and the
scaled tensor is never written. Not fused: a scaled tensor another op also reads, an
accumulating matmul (``accumulate`` or ``beta``), a barrier on either op. The
product is rounded once instead of twice, so results may differ from the
unfused graph in the last bit.

``transpose_flag``: a transpose of the last two dims feeding a ``matmul`` or
``batched_matmul`` (and read by nothing else) becomes the GEMM's transpose flag,
where the op takes the flipped mode; the arithmetic is the same. (Lowering folds
such transposes too, but only this makes the flag visible in ``mdsl.graph``.)
"""

from __future__ import annotations

from xdsl.dialects.builtin import FloatAttr, StringAttr, f64
from xdsl.pattern_rewriter import PatternRewriter, op_type_rewrite_pattern
from xdsl.utils.exceptions import VerifyException

from modeldsl.dialects.graph_primitives import BatchedMatmulOp, MatmulOp, ScaleOp, TransposeOp
from modeldsl.graph_builder import op_attr
from modeldsl.passes.fuse.common import FusionPattern, is_barrier, only_use


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


def swaps_last_two(op) -> bool:
    """Whether ``op`` is a transpose of the last two dims of its operand."""
    if not isinstance(op, TransposeOp):
        return False
    rank = len(op.operands[0].type.shape)
    dims = {d % rank for d in (op.dim0.value.data, op.dim1.value.data)} if rank >= 2 else set()
    return dims == {rank - 2, rank - 1}


def flipped(mode: str, index: int) -> str:
    letters = list(mode)
    letters[index] = "N" if letters[index] == "T" else "T"
    return "".join(letters)


class TransposeIntoFlags(FusionPattern):
    """``matmul(transpose(a), b)`` / ``matmul(a, transpose(b))`` (and ``batched_matmul``): the
    transpose of the last two dims becomes the GEMM's transpose flag (seed 004: absorbed before
    anything folds the transpose away), where the flipped mode is one the op takes."""

    name = "transpose_flag"
    primitives = ("transpose", "matmul")

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: MatmulOp | BatchedMatmulOp, rewriter: PatternRewriter) -> None:
        if op_attr(op, "accumulate", False):
            return
        for index, operand in enumerate(op.operands):
            transpose = operand.owner
            if not swaps_last_two(transpose) or only_use(operand) is not op or not self.may_fuse(transpose, op):
                continue
            mode = op_attr(op, "transpose", "NN")
            candidate = op.clone()
            candidate.operands[index] = transpose.operands[0]
            candidate.attributes["transpose"] = StringAttr(flipped(mode, index))
            try:
                candidate.verify_()
            except VerifyException:
                candidate.erase()
                continue
            self.fused((transpose, op))
            candidate.results[0].name_hint = op.results[0].name_hint
            rewriter.replace(op, candidate)
            rewriter.erase(transpose)
            return
