"""``mdsl-fuse`` pattern ``gated_mlp`` (spec 7.5.1; spec 6.3.1's ``[split, swiglu] -> fused_split_swiglu``).

A gated MLP projects ``x`` to the packed ``gate_up = [gate | up]`` in one GEMM, then:

* forward: ``(gate, up) = split(gate_up, [F, F], dim=-1); h = swiglu(gate, up)`` becomes
  ``h = fused_split_swiglu(gate_up)``: the kernel reads both halves in place, so the
  projection stays one GEMM writing ``gate_up`` (lowering would otherwise run one GEMM per
  half) and no ``gate``/``up`` buffers exist;
* backward: ``(d_gate, d_up) = swiglu_backward(d_h, gate, up); d_gate_up = concat(d_gate,
  d_up, dim=-1)``, where ``gate`` and ``up`` are the halves of a ``gate_up`` as above,
  becomes ``d_gate_up = fused_split_swiglu_backward(d_h, gate_up)``: the gradient is written
  packed, no concat copies it (and the backward reads ``gate_up``, not its halves).

The same for ``geglu`` (the exact-GELU GeGLU; ``gelu(approximate=true)`` then ``mul`` is not
this pattern). The arithmetic per element is the unfused ops', so results are bitwise equal
wherever the GEMM is too (one GEMM over ``2F`` rows of the weight instead of two over ``F``:
BLAS may round a narrower GEMM differently in the last bit on ragged shapes).

Not fused: a split of unequal sizes or not along the last dim, a half another op also reads
(forward: the split stays), a gradient half another op reads or a concat in the other order
(backward), a barrier (``@nofuse``, a hook or probe) on a merged op. The backward only reads
through the split: the split itself may be a barrier or keep other readers.

Recompute replays: a replayed ``split`` + gated pair of one segment (``mdsl-recompute``'s, or a
written backward's ``recompute:`` section) fuses too, the fused op staying in that segment. The
other patterns keep replays as they are, so the replay computes what the forward did; this one
fuses the replay exactly as it fused the forward it replays (the same op on the same
``gate_up``), and without it the fused backward's read of the replayed ``gate_up`` would leave
the replay's split a copy kernel (the projection no longer one GEMM per half), trading the
concat copy for a split copy.
"""

from __future__ import annotations

from xdsl.dialects.builtin import ArrayAttr
from xdsl.ir import Operation, SSAValue
from xdsl.pattern_rewriter import PatternRewriter, op_type_rewrite_pattern
from xdsl.rewriter import InsertPoint

from modeldsl.dialects.annotations import annotations_of
from modeldsl.dialects.graph_primitives import (
    ConcatOp,
    GegluBackwardOp,
    GegluOp,
    SplitOp,
    SwigluBackwardOp,
    SwigluOp,
)
from modeldsl.graph_builder import GraphBuilder, op_attr
from modeldsl.passes.fuse.common import BARRIERS, FusionPattern, only_use

GATED = {SwigluOp: "swiglu", GegluOp: "geglu"}
GATED_BACKWARD = {SwigluBackwardOp: "swiglu", GegluBackwardOp: "geglu"}


def along_last_dim(op: Operation, value: SSAValue) -> bool:
    """Whether ``op``'s ``dim`` (default -1) is the last dim of ``value``'s type."""
    shape = value.type.shape
    dim = op_attr(op, "dim", -1)
    return dim == -1 or (not value.type.is_variadic and dim == len(shape) - 1)


def packed_split(gate: SSAValue, up: SSAValue) -> SplitOp | None:
    """The split whose two equal halves along the last dim are ``gate`` then ``up``."""
    split = gate.owner
    if not isinstance(split, SplitOp) or len(split.results) != 2 or up.owner is not split:
        return None
    if (gate, up) != tuple(split.results) or not along_last_dim(split, split.operands[0]):
        return None
    sizes = split.sizes.data
    return split if sizes[0] == sizes[1] else None


def one_replay(*ops: Operation) -> bool:
    """Whether ``ops`` are all replays of one recompute segment, with no other barrier."""
    marks = [op.attributes.get("recompute") for op in ops]
    annotated = any(isinstance(a, BARRIERS) for op in ops for a in annotations_of(op))
    return marks[0] is not None and all(m == marks[0] for m in marks) and not annotated


def carry_attributes(fused: Operation, *sources: Operation) -> None:
    """The ``memory`` mode of the last source (its one result is the fused op's), a ``checkpoint``,
    and the ``recompute`` segment of a fused replay."""
    memory = sources[-1].attributes.get("memory")
    if isinstance(memory, ArrayAttr) and len(memory.data) == len(fused.results):
        fused.attributes["memory"] = memory
    for source in sources:
        for name in ("checkpoint", "recompute"):
            if name in source.attributes:
                fused.attributes[name] = source.attributes[name]


def build_fused(rewriter: PatternRewriter, name: str, at: Operation, operands: list[SSAValue]) -> Operation:
    """Primitive ``name`` on ``operands`` before ``at``, typed as ``at``'s one result."""
    builder = GraphBuilder.at(InsertPoint.before(at), rewriter)
    (result,) = builder.op(name, *operands, result_types=[at.results[-1].type])
    fused = result.owner
    fused.location = at.location
    result.name_hint = at.results[-1].name_hint
    return fused


class SplitGated(FusionPattern):
    """``split`` then ``swiglu``/``geglu`` -> ``fused_split_swiglu``/``fused_split_geglu``."""

    name = "gated_mlp"
    primitives = ("split", "swiglu")

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: SwigluOp | GegluOp, rewriter: PatternRewriter) -> None:
        kind = GATED[type(op)]
        gate, up = op.operands
        split = packed_split(gate, up)
        if split is None or only_use(gate) is not op or only_use(up) is not op or not self.may_fuse_pair(split, op):
            return
        fused = build_fused(rewriter, f"fused_split_{kind}", op, [split.operands[0]])
        carry_attributes(fused, split, op)
        self.fused((split, op))
        rewriter.replace(op, [], list(fused.results))
        rewriter.erase(split)

    def may_fuse_pair(self, split: SplitOp, gated: Operation) -> bool:
        """``may_fuse``, where a replayed pair of one segment is no barrier (module docstring)."""
        if one_replay(split, gated):
            return self.name in self.switch.enabled or self.requested_by(gated)
        return self.may_fuse(split, gated)


class SplitGatedBackward(FusionPattern):
    """``swiglu_backward``/``geglu_backward`` on a packed split's halves, then ``concat`` of the
    two gradients along the last dim -> ``fused_split_*_backward``."""

    name = "gated_mlp"
    primitives = ("swiglu_backward", "concat")

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: ConcatOp, rewriter: PatternRewriter) -> None:
        if len(op.operands) != 2 or not along_last_dim(op, op.results[0]):
            return
        d_gate, d_up = op.operands
        backward = d_gate.owner
        kind = GATED_BACKWARD.get(type(backward))
        if kind is None or (d_gate, d_up) != tuple(backward.results):
            return
        if only_use(d_gate) is not op or only_use(d_up) is not op:
            return
        d_out, gate, up = backward.operands
        split = packed_split(gate, up)
        if split is None or split.operands[0].type != op.results[0].type or not self.may_fuse(backward, op):
            return
        fused = build_fused(rewriter, f"fused_split_{kind}_backward", op, [d_out, split.operands[0]])
        carry_attributes(fused, op)
        self.fused((backward, op))
        rewriter.replace(op, [], list(fused.results))
        rewriter.erase(backward)

