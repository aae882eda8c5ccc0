"""``mdsl-fuse`` patterns ``linear_bias_act`` and ``bias_activation`` (spec 7.5.1): GEMM epilogues.

``linear_bias_act``: ``y = matmul(x, w); h = bias_add(y, b)`` (or an ``add`` of a ``[N]``
bias) and a ReLU or tanh-GELU of ``h`` become ``(out, pre) = linear_bias_act(x, w, b)
{activation}``, which lowers to one ``mdsl.sched.gemm`` with the ``bias``, ``relu_bias`` or
``gelu_bias`` epilogue (cuBLASLt's; ``gelu_aux_bias`` where the backward reads ``pre``, so
the pre-activation is written by the GEMM instead of a separate add kernel). The readers of
``h`` other than the activation read ``pre``; ReLU's backward (``relu_backward(d, h)``) reads
``out`` instead, the same mask (cuBLASLt keeps no ReLU input), and a ReLU whose input has any
other reader stays unfused. The backward's GELU gradient and bias gradient become the
``dgelu(_bgrad)``/``bgrad*`` epilogues of its GEMMs in lowering (passes/lower_gemm_epilogues.py).

``bias_activation``: a ReLU or tanh GELU of a ``linear_bias_act`` without an activation
(one written so, or fused while the activation was not) moves into its epilogue. A bias add
with no GEMM before it stays as it is: no primitive adds a bias and activates in one kernel
(the backend's bias + activation epilogues belong to a GEMM), so there is nothing to fuse into.

Not fused: a matmul result another op also reads, a bias of another shape or dtype (an ``add``
of a full tensor), an accumulating or transposed-A matmul, the exact (erf) GELU and SiLU
(cuBLASLt has no epilogue for them: only what the backend runs), a barrier on any op. The
arithmetic is the unfused one (the product, plus the bias, then the activation), so results
on the CPU are bitwise equal.
"""

from __future__ import annotations

from xdsl.ir import Operation, SSAValue
from xdsl.pattern_rewriter import PatternRewriter, op_type_rewrite_pattern
from xdsl.rewriter import InsertPoint

from modeldsl.dialects.graph_primitives import (
    AddOp,
    BiasAddOp,
    GeluOp,
    LinearBiasActOp,
    MatmulOp,
    ReluBackwardOp,
    ReluOp,
)
from modeldsl.graph_builder import GraphBuilder, op_attr
from modeldsl.passes.fuse.common import (
    FusionPattern,
    carry_checkpoint,
    carry_memory_modes,
    is_barrier,
    memory_modes,
    only_use,
)
from modeldsl.passes.fuse.gemm import fusable_matmul


def epilogue_activation(op: Operation) -> str | None:
    """``relu`` or ``gelu`` where ``op`` is an activation a GEMM epilogue runs, else None."""
    if isinstance(op, ReluOp):
        return "relu"
    if isinstance(op, GeluOp) and op_attr(op, "approximate", True):
        return "gelu"
    return None


def foldable_activation(h: SSAValue) -> Operation | None:
    """The one ReLU/GELU reading ``h`` whose other readers may read the pre-activation instead
    (any for GELU; for ReLU only ``relu_backward``'s mask, which reads the output as well)."""
    acts = [u.operation for u in h.uses if u.index == 0 and epilogue_activation(u.operation) is not None]
    if len(acts) != 1 or is_barrier(acts[0]):
        return None
    act = acts[0]
    others = [u for u in h.uses if u.operation is not act]
    if epilogue_activation(act) == "relu" and not all(
            isinstance(u.operation, ReluBackwardOp) and u.index == 1 for u in others):
        return None
    return act


def bias_operand(op: Operation, y: SSAValue) -> SSAValue | None:
    """The ``[N]`` bias ``op`` adds to ``y`` (``bias_add``, or an ``add`` of a vector): None for
    another op or a bias of another shape or dtype."""
    if isinstance(op, BiasAddOp) and op.operands[0] is y:
        bias = op.operands[1]
    elif isinstance(op, AddOp) and y in op.operands and op.operands[0] is not op.operands[1]:
        bias = op.operands[1] if op.operands[0] is y else op.operands[0]
    else:
        return None
    shape, target = list(bias.type.shape), list(y.type.shape)
    if len(shape) != 1 or shape[-1] != target[-1] or bias.type.dtype != y.type.dtype \
            or op.results[0].type != y.type:
        return None
    return bias


def gemm_operands(matmul: Operation) -> tuple[SSAValue, SSAValue, str] | None:
    """(x, w, transpose) of a matmul a linear_bias_act can run: untransposed x, a weight matrix."""
    if not fusable_matmul(matmul):
        return None
    mode = op_attr(matmul, "transpose", "NN")
    x, w = matmul.operands
    if mode not in ("NN", "NT") or w.type.rank != 2 or len({x.type.dtype, w.type.dtype}) != 1:
        return None
    return x, w, mode


def build_fused(rewriter: PatternRewriter, where: Operation, x: SSAValue, w: SSAValue, bias: SSAValue,
                params: dict, act: Operation | None, h: SSAValue, replaced: list[Operation]) -> None:
    """``linear_bias_act`` before ``where``: ``act``'s result (or ``h``) becomes its ``out``, ``h``
    its ``pre``; the ``replaced`` ops (last first: the activation, the bias op, the GEMM) go."""
    activation = epilogue_activation(act) if act is not None else "none"
    alpha = params.get("alpha", 1.0)
    out, pre = GraphBuilder.at(InsertPoint.before(where), rewriter).op(
        "linear_bias_act", x, w, bias, transpose=params["transpose"], activation=activation,
        alpha=alpha if alpha != 1.0 else None)
    fused = out.owner
    fused.location = (act or where).location
    copy_memory_modes(fused, act, h)
    carry_checkpoint(fused, *replaced)
    out.name_hint = (act.results[0] if act is not None else h).name_hint
    pre.name_hint = h.name_hint if act is not None else f"{h.name_hint}_pre" if h.name_hint else None
    if act is not None:
        for use in list(h.uses):
            if isinstance(use.operation, ReluBackwardOp):
                use.operation.operands[1] = out
                rewriter.notify_op_modified(use.operation)
        rewriter.replace(act, [], [out])
    for op in replaced:
        if op is act:
            continue
        if h in op.results:  # without an activation, ``out`` is ``h``
            rewriter.replace(op, [], [pre if act is not None else out] * len(op.results))
        else:
            rewriter.erase(op)


def copy_memory_modes(fused: Operation, act: Operation | None, h: SSAValue) -> None:
    """The ``memory`` modes of the values that ``out`` and ``pre`` stand for."""
    carry_memory_modes(fused, [mode_of(act.results[0]) if act is not None else mode_of(h), mode_of(h)])


def mode_of(value: SSAValue) -> str:
    return memory_modes(value.owner)[value.index] if isinstance(value.owner, Operation) else "auto"


class LinearBiasAct(FusionPattern):
    """``matmul`` + bias (+ ReLU/tanh GELU) -> ``linear_bias_act``; rooted at the bias op."""

    name = "linear_bias_act"
    primitives = ("matmul", "bias_add", "relu", "gelu")

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: BiasAddOp | AddOp, rewriter: PatternRewriter) -> None:
        for y in op.operands:
            matmul = y.owner
            if not isinstance(matmul, MatmulOp) or only_use(y) is not op:
                continue
            bias, operands = bias_operand(op, y), gemm_operands(matmul)
            if bias is None or operands is None:
                continue
            h = op.results[0]
            act = foldable_activation(h)  # a @fuse request sits on the flow's last op: the activation
            if act is not None and not self.may_fuse(matmul, op, act):
                act = None
            if act is None and not self.may_fuse(matmul, op):
                continue
            x, w, mode = operands
            params = {"transpose": mode, "alpha": op_attr(matmul, "alpha", 1.0)}
            replaced = [act, op, matmul] if act is not None else [op, matmul]
            self.fused(replaced)
            build_fused(rewriter, op, x, w, bias, params, act, h, replaced)
            return


class BiasActivation(FusionPattern):
    """A ReLU/tanh GELU of a ``linear_bias_act`` without an activation -> its epilogue."""

    name = "bias_activation"
    primitives = ("bias_add", "relu", "gelu")

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: ReluOp | GeluOp, rewriter: PatternRewriter) -> None:
        fused = op.operands[0].owner
        if not isinstance(fused, LinearBiasActOp) or op_attr(fused, "activation", "none") != "none":
            return
        h = fused.results[0]
        if foldable_activation(h) is not op or list(fused.results[1].uses) or not self.may_fuse(fused, op):
            return
        x, w, bias = fused.operands
        params = {"transpose": op_attr(fused, "transpose", "NT"), "alpha": op_attr(fused, "alpha", 1.0)}
        self.fused((fused, op))
        build_fused(rewriter, fused, x, w, bias, params, op, h, [op, fused])
