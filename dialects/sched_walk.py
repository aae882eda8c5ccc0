"""The one walk over an ``mdsl.sched`` program that everything reading a schedule shares.

The CPU and CUDA executors, the FLOP count, the cost model and the memory planner's liveness
each visit a program's ops in execution order through :func:`walk` (a block or a program) or
:func:`visit` (one op and what it holds), with a :class:`ScheduleVisitor`: one callback per op
kind (``buffer``, ``layer_view``, ``marker`` for streams and syncs, ``launch``, ``gemm``,
``attention``, ``attention_backward``, ``memset``, ``copy``, ``collective``; the work kinds fall
back to ``work``; ``check`` for an ``@assert``'s runtime check) and ``other`` for an op the
dialect does not run (a container of ops without buffer operands may :func:`descend` into it).
The walk itself handles the structure:

- a ``recompute_segment`` runs its body where it stands (:attr:`At.segment` names it);
- a ``layer_loop`` runs its body once per layer, ``lower`` to ``upper - 1`` (backwards when
  ``reverse``). A visitor that sets ``unroll`` sees the body once per layer, each visit with the
  layer of every enclosing loop bound (:meth:`At.layer`): the executors, which turn each layer's
  ops into their own steps (and give a launch marked ``keyed_by_layer``, dropout's, those layers:
  :func:`layer_params`). Any other visitor sees the body once, with :attr:`At.runs` the
  number of times the ops run (the product of the enclosing loops' trip counts): the FLOP
  count, the cost model, liveness. Either way ``enter_loop`` and ``exit_loop`` bracket the body.

:func:`operand_roles` says which buffers each work op reads and writes (the planner's liveness
and the cost model's bytes). This module reads IR only: every layer may import it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import ClassVar

from xdsl.ir import Block, Operation, SSAValue

from modeldsl.dialects.sched import (
    EPILOGUES,
    KEYED_BY_LAYER,
    AssertOp,
    AttentionBackwardOp,
    AttentionOp,
    BufferOp,
    BufferType,
    CollectiveOp,
    CopyOp,
    GemmOp,
    LaunchOp,
    LayerLoopOp,
    LayerViewOp,
    MemsetOp,
    ProgramOp,
    RecomputeSegmentOp,
    StreamOp,
    SyncOp,
)

# the ops that do work on buffers (each runs a primitive, moves bytes or communicates)
WORK_OPS = (LaunchOp, GemmOp, AttentionOp, AttentionBackwardOp, MemsetOp, CopyOp, CollectiveOp)

# op class -> the visitor callback that receives it (loops and segments are the walk's own)
CALLBACKS: dict[type[Operation], str] = {
    BufferOp: "buffer",
    LayerViewOp: "layer_view",
    StreamOp: "marker",
    SyncOp: "marker",
    LaunchOp: "launch",
    GemmOp: "gemm",
    AttentionOp: "attention",
    AttentionBackwardOp: "attention_backward",
    MemsetOp: "memset",
    CopyOp: "copy",
    CollectiveOp: "collective",
    AssertOp: "check",
}


@dataclass(frozen=True)
class At:
    """Where a visited op runs: its enclosing layer loops (outermost first), in an unrolled walk
    the layer each of them is at, its innermost enclosing recompute segment, and how many runs
    of the op this visit stands for (1 in an unrolled walk)."""

    loops: tuple[LayerLoopOp, ...] = ()
    layers: tuple[int, ...] = ()
    segment: RecomputeSegmentOp | None = None
    runs: int = 1

    @property
    def nested(self) -> bool:
        """Whether the op is inside a loop or a segment (not at the top of its block)."""
        return bool(self.loops) or self.segment is not None

    def layer(self, index: SSAValue) -> int:
        """The layer an unrolled walk is at in the enclosing loop whose index is ``index``."""
        for loop, layer in zip(self.loops, self.layers):
            if loop.index is index:
                return layer
        raise ValueError("a layer index that is not the index of an enclosing, unrolled layer loop")

    def in_loop(self, loop: LayerLoopOp) -> At:
        """The body of ``loop``, walked once for all its layers."""
        return At((*self.loops, loop), self.layers, self.segment, self.runs * trips(loop))

    def at_layer(self, loop: LayerLoopOp, layer: int) -> At:
        """The body of ``loop`` at one of its layers."""
        return At((*self.loops, loop), (*self.layers, layer), self.segment, self.runs)

    def in_segment(self, segment: RecomputeSegmentOp) -> At:
        return At(self.loops, self.layers, segment, self.runs)


TOP = At()

def layer_params(op: Operation, at: At) -> dict[str, list[int]]:
    """The ``layers`` parameter an executor gives a launch marked
    :data:`~modeldsl.dialects.sched.KEYED_BY_LAYER` (the layer of each enclosing loop, outermost
    first, in an unrolled walk); nothing for any other launch."""
    return {"layers": list(at.layers)} if KEYED_BY_LAYER in op.attributes else {}


class ScheduleVisitor:
    """The callbacks of a walk, each given the op and where it runs. Every callback does nothing
    unless overridden; the work kinds call :meth:`work`."""

    unroll: ClassVar[bool] = False  # visit a loop body once per layer (the executors)

    def buffer(self, op: BufferOp, at: At) -> None:
        pass

    def layer_view(self, op: LayerViewOp, at: At) -> None:
        pass

    def marker(self, op: StreamOp | SyncOp, at: At) -> None:
        """A stream declaration or a synchronization: no work."""

    def enter_loop(self, op: LayerLoopOp, at: At) -> None:
        """Before the body of ``op`` (``at``: where the loop itself runs)."""

    def exit_loop(self, op: LayerLoopOp, at: At) -> None:
        """After the body of ``op``, every layer of it."""

    def launch(self, op: LaunchOp, at: At) -> None:
        self.work(op, at)

    def gemm(self, op: GemmOp, at: At) -> None:
        self.work(op, at)

    def attention(self, op: AttentionOp, at: At) -> None:
        self.work(op, at)

    def attention_backward(self, op: AttentionBackwardOp, at: At) -> None:
        self.work(op, at)

    def memset(self, op: MemsetOp, at: At) -> None:
        self.work(op, at)

    def copy(self, op: CopyOp, at: At) -> None:
        self.work(op, at)

    def collective(self, op: CollectiveOp, at: At) -> None:
        self.work(op, at)

    def check(self, op: AssertOp, at: At) -> None:
        """An ``@assert`` check: it reads its buffer and does no work (the FLOP count, the cost
        model and liveness pass it by: it runs right after the op that wrote the buffer)."""

    def work(self, op: Operation, at: At) -> None:
        """Any work op whose own callback is not overridden."""

    def other(self, op: Operation, at: At) -> None:
        """An op that is none of the dialect's body ops."""


def trips(loop: LayerLoopOp) -> int:
    """How many layers a loop runs."""
    return loop.upper.value.data - loop.lower.value.data


def layer_order(loop: LayerLoopOp) -> Iterable[int]:
    """The layers of a loop in the order they run."""
    layers = range(loop.lower.value.data, loop.upper.value.data)
    return reversed(layers) if loop.reverse is not None else layers


def walk(body: ProgramOp | Block, visitor: ScheduleVisitor, at: At = TOP) -> None:
    """Visit every op of a program's body (or of a block), in execution order."""
    block = body.body.block if isinstance(body, ProgramOp) else body
    for op in block.ops:
        visit(op, visitor, at)


def visit(op: Operation, visitor: ScheduleVisitor, at: At = TOP) -> None:
    """Visit one op (a loop or a segment: its body, as it runs)."""
    if isinstance(op, LayerLoopOp):
        _visit_loop(op, visitor, at)
    elif isinstance(op, RecomputeSegmentOp):
        walk(op.body.block, visitor, at.in_segment(op))
    else:
        getattr(visitor, CALLBACKS.get(type(op), "other"))(op, at)


def descend(op: Operation, visitor: ScheduleVisitor, at: At) -> None:
    """Visit the ops of every block of ``op``'s regions where ``op`` stands (a container the
    dialect does not know)."""
    for region in op.regions:
        for block in region.blocks:
            walk(block, visitor, at)


def _visit_loop(loop: LayerLoopOp, visitor: ScheduleVisitor, at: At) -> None:
    visitor.enter_loop(loop, at)
    if visitor.unroll:
        for layer in layer_order(loop):
            walk(loop.body.block, visitor, at.at_layer(loop, layer))
    else:
        walk(loop.body.block, visitor, at.in_loop(loop))
    visitor.exit_loop(loop, at)


# ----------------------------------------------------------------------------
# What a work op reads and writes
# ----------------------------------------------------------------------------

Role = tuple[SSAValue, bool, bool, int | None]  # value, read, written, leading bytes (None: all of it)


def operand_roles(op: Operation) -> list[Role]:
    """(value, read, write, leading bytes) of each buffer operand of a work op; an op this does
    not know reads and writes every buffer operand."""
    if isinstance(op, LaunchOp):
        return [(v, True, False, None) for v in op.inputs] + [(v, False, True, None) for v in op.outputs]
    if isinstance(op, GemmOp):
        return _gemm_roles(op)
    if isinstance(op, AttentionOp):
        reads = (op.q, op.k, op.v, *([] if op.segments is None else [op.segments]))
        return [(v, True, False, None) for v in reads] + [(v, False, True, None) for v in (op.out, op.lse)]
    if isinstance(op, AttentionBackwardOp):
        reads = (op.q, op.k, op.v, op.out, op.d_out, op.lse, *([] if op.segments is None else [op.segments]))
        return [(v, True, False, None) for v in reads] + [(v, False, True, None) for v in (op.d_q, op.d_k, op.d_v)]
    if isinstance(op, MemsetOp):
        return [(op.target, False, True, None)]
    if isinstance(op, CopyOp):
        n = None if op.nbytes is None else op.nbytes.value.data
        return [(op.src, True, False, n), (op.dst, False, True, n)]
    if isinstance(op, CollectiveOp):
        return [(op.input, True, False, None), (op.output, False, True, None)]
    if isinstance(op, AssertOp):
        return [(op.value, True, False, None)]
    return [(v, True, True, None) for v in op.operands if isinstance(v.type, BufferType)]


def _gemm_roles(op: GemmOp) -> list[Role]:
    """A and B (and B's scale) read; the bias and aux read or written as the epilogue says; C written, and read
    where ``beta != 0``."""
    rule = EPILOGUES.get(op.epilogue.data)
    roles: list[Role] = [(op.a, True, False, None), (op.b, True, False, None)]
    if op.scale_b is not None:
        roles.append((op.scale_b, True, False, None))
    if op.bias is not None:
        writes = rule is not None and rule.bias in ("write_n", "write_m")
        roles.append((op.bias, not writes, writes, None))
    if op.aux is not None:
        writes = rule is not None and rule.aux == "write"
        roles.append((op.aux, not writes, writes, None))
    roles.append((op.c, op.beta.value.data != 0.0, True, None))
    return roles
