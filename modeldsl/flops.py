"""A FLOP cost model of ``mdsl.graph`` primitives and ``mdsl.sched`` programs.

Every count here is an estimate: a matrix product counts its multiply-adds
exactly (``2 * M * N * K``), attention counts the two products of its score
matrix (``4 * B * H * Tq * Tk * D``, half of it under a causal mask), and
everything else counts a small constant per element (a norm about 5, rotary
embedding 6, an add 1). Data movement (views, transposes, copies, casts,
gathers, fills) counts 0. Each primitive's rule is on its entry in
:mod:`modeldsl.prims` (built from :mod:`modeldsl.prims.counts`), found by the
primitive's name, which is also the kernel name an ``mdsl.sched.launch`` uses,
so one rule prices both the graph and the schedule; the schedule's kernels
without a graph op have theirs in :data:`KERNEL_FLOP_RULES`:

- :func:`graph_op_flops`: one ``mdsl.graph`` primitive with concrete shapes;
- :func:`sched_op_flops`: one ``mdsl.sched`` op, from its buffer shapes;
- :func:`program_flops`: a whole program, layer loops counted once per
  layer (nested loops multiply) and the work replayed inside
  ``recompute_segment`` counted in ``recompute`` as well as in ``total``.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.ir import Attribute, Block, Operation

from modeldsl.dialects.graph_types import TensorType
from modeldsl.dialects.sched import (
    AttentionBackwardOp,
    AttentionOp,
    GemmOp,
    LaunchOp,
    ProgramOp,
    buffer_type,
)
from modeldsl.dialects.sched_walk import At, ScheduleVisitor, visit, walk
from modeldsl.primitives import primitive_name
from modeldsl.prims import by_name
from modeldsl.prims.counts import (
    ATTENTION_BACKWARD_FACTOR,
    FlopsUnknown,
    OpShapes,
    Rule,
    attention_flops,
    conv1d_rule,
    kv_cache_attention,
    matmul_flops,
    numel,
    per_input_element,
    selective_scan_rule,
    transposed,
)
from modeldsl.symbolic import SymbolicError

Shape = tuple[int, ...]

GRAPH_PREFIX = "mdsl.graph."

# kernels of the schedule that no graph op has (each primitive's rule is on its registry entry)
KERNEL_FLOP_RULES: dict[str, Rule] = {
    "kv_cache_attention": kv_cache_attention,
    "mamba_conv1d_step": conv1d_rule(passes=1),
    "mamba_selective_scan_step": selective_scan_rule(passes=1),
    # optimizer kernels (registry only)
    "adamw": per_input_element(12, 0),
    "global_norm": lambda s: 2 * sum(numel(i) for i in s.inputs),
    "clip_factor": lambda s: 3,
}


def flop_rule(name: str) -> Rule | None:
    """The FLOP rule of primitive (or schedule kernel) ``name``, None where there is none."""
    entry = by_name().get(name)
    return entry.flops if entry is not None else KERNEL_FLOP_RULES.get(name)


def apply_rule(name: str, shapes: OpShapes) -> int:
    """The FLOPs of primitive (or kernel) ``name`` on ``shapes``."""
    rule = flop_rule(name)
    if rule is None:
        raise FlopsUnknown(f"no FLOP rule for '{name}'")
    try:
        return int(rule(shapes))
    except (IndexError, ValueError, TypeError) as err:
        if isinstance(err, FlopsUnknown):
            raise
        raise FlopsUnknown(
            f"'{name}' with inputs {[list(i) for i in shapes.inputs]} and outputs "
            f"{[list(o) for o in shapes.outputs]} does not fit its FLOP rule"
        ) from None


# ----------------------------------------------------------------------------
# mdsl.graph
# ----------------------------------------------------------------------------


def concrete_shape(t: Attribute) -> Shape:
    """The integer dims of a ``TensorType`` whose dims are all bound."""
    if not isinstance(t, TensorType):
        raise FlopsUnknown(f"expected a !mdsl.graph.tensor, got {t}")
    if t.is_variadic:
        raise FlopsUnknown(f"{t} has a variadic '*': specialize the shapes first")
    try:
        return tuple(d.evaluate({}) for d in t.shape)
    except SymbolicError as err:
        raise FlopsUnknown(f"{t}: {err}: specialize the shapes first (mdsl-specialize)") from None


def graph_op_flops(op: Operation) -> int:
    """The estimated FLOPs of one ``mdsl.graph`` primitive op with concrete shapes."""
    if not op.name.startswith(GRAPH_PREFIX):
        raise FlopsUnknown(f"'{op.name}' is not an mdsl.graph primitive")
    shapes = OpShapes(
        tuple(concrete_shape(v.type) for v in op.operands),
        tuple(concrete_shape(r.type) for r in op.results),
        op.attributes,
    )
    return apply_rule(primitive_name(op), shapes)


# ----------------------------------------------------------------------------
# mdsl.sched
# ----------------------------------------------------------------------------

# per element of C: a bias add 1, GELU 8, its derivative times C 13 (+1 for the column sums);
# bgrada/bgradb sum the operand they reduce (see EPILOGUES in dialects/sched.py)
EPILOGUE_FLOPS_PER_ELEMENT = {
    "none": 0, "bias": 1, "relu": 1, "relu_bias": 2, "gelu": 8, "gelu_bias": 9, "gelu_aux": 8,
    "gelu_aux_bias": 9, "dgelu": 13, "dgelu_bgrad": 14, "bgrada": 0, "bgradb": 0,
}


def gemm_flops(op: GemmOp) -> int:
    """``op(A) @ op(B)`` per batch entry (C's leading dims), plus the epilogue's elementwise work
    and, for ``bgrada``/``bgradb``, one add per element of the summed operand."""
    a, b, c = (buffer_type(v).shape for v in (op.a, op.b, op.c))
    m, k = transposed(a[-2], a[-1], bool(op.transa.value.data))
    _, n = transposed(b[-2], b[-1], bool(op.transb.value.data))
    flops = matmul_flops(numel(c[:-2]), m, n, k)
    epilogue = op.epilogue.data
    flops += EPILOGUE_FLOPS_PER_ELEMENT.get(epilogue, 0) * numel(c)
    if epilogue == "bgrada":
        flops += numel(a)
    elif epilogue == "bgradb":
        flops += numel(b)
    if op.scale_b is not None:  # B widened: one multiply per stored value (dequantize's count)
        flops += numel(b)
    return flops


def sched_attention_flops(op: AttentionOp | AttentionBackwardOp) -> int:
    """From ``q`` and ``k`` in the op's layout (``bhtd`` or ``bthd``); the backward is 2.5x."""
    q, k = buffer_type(op.q).shape, buffer_type(op.k).shape
    bthd = op.layout.data == "bthd"
    (b, tq, h, d), tk = (q, k[1]) if bthd else ((q[0], q[2], q[1], q[3]), k[2])
    flops = attention_flops(b, h, tq, tk, d, bool(op.causal.value.data))
    factor = ATTENTION_BACKWARD_FACTOR if isinstance(op, AttentionBackwardOp) else 1.0
    return round(factor * flops)


def launch_flops(op: LaunchOp) -> int:
    """The kernel's rule on its buffer shapes; a trailing ``scratch`` output is not an output."""
    outputs = [buffer_type(v).shape for v in op.outputs]
    if "scratch" in op.attributes:
        outputs = outputs[:-1]
    shapes = OpShapes(tuple(buffer_type(v).shape for v in op.inputs), tuple(outputs), op.attributes)
    return apply_rule(op.kernel.data, shapes)


@dataclass(frozen=True)
class ProgramFlops:
    """The FLOPs of a program; ``recompute`` is the part of ``total`` replayed in recompute segments."""

    total: int = 0
    recompute: int = 0

    def __add__(self, other: ProgramFlops) -> ProgramFlops:
        return ProgramFlops(self.total + other.total, self.recompute + other.recompute)

    def times(self, trips: int) -> ProgramFlops:
        return ProgramFlops(self.total * trips, self.recompute * trips)

    @property
    def recompute_fraction(self) -> float:
        return self.recompute / self.total if self.total else 0.0


class FlopCount(ScheduleVisitor):
    """Sums the FLOPs of the ops it visits, each times the runs it stands for (a layer loop's
    body once per layer, nested loops multiplying); the work in a recompute segment also in
    ``recompute``."""

    def __init__(self) -> None:
        self.total = 0
        self.recompute = 0

    @property
    def result(self) -> ProgramFlops:
        return ProgramFlops(self.total, self.recompute)

    def add(self, flops: int, at: At) -> None:
        self.total += flops * at.runs
        if at.segment is not None:
            self.recompute += flops * at.runs

    def gemm(self, op: GemmOp, at: At) -> None:
        self.add(gemm_flops(op), at)

    def attention(self, op: AttentionOp, at: At) -> None:
        self.add(sched_attention_flops(op), at)

    def attention_backward(self, op: AttentionBackwardOp, at: At) -> None:
        self.add(sched_attention_flops(op), at)

    def launch(self, op: LaunchOp, at: At) -> None:
        self.add(launch_flops(op), at)

    def work(self, op: Operation, at: At) -> None:
        """Memsets, copies and collectives move data: 0."""

    def other(self, op: Operation, at: At) -> None:
        raise FlopsUnknown(f"no FLOP rule for '{op.name}'")


def block_flops(block: Block) -> ProgramFlops:
    """The FLOPs of the ops of a block, structure included."""
    count = FlopCount()
    walk(block, count)
    return count.result


def op_flops(op: Operation) -> ProgramFlops:
    """One op: a layer loop runs its body ``upper - lower`` times; a recompute segment's work is all recompute."""
    count = FlopCount()
    visit(op, count)
    return count.result


def sched_op_flops(op: Operation) -> int:
    """The estimated FLOPs of one ``mdsl.sched`` op (a loop or segment: all of its body's runs)."""
    return op_flops(op).total


def program_flops(program: ProgramOp) -> ProgramFlops:
    """The FLOPs of one run of ``program``, and how many of them recompute forward work."""
    return block_flops(program.body.block)
