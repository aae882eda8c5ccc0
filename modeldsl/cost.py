"""A roofline cost model of ``mdsl.sched`` programs: ``mdsl-opt --emit=cost-report``.

Every work op (launch, gemm, attention, attention_backward, copy, memset,
collective) is priced by what it moves and what it computes:

- bytes read and written come from its buffer operands' types, with the roles
  the memory planner gives them (:func:`modeldsl.dialects.sched_walk.operand_roles`:
  a gemm reads A, B, C when ``beta != 0`` and the bias/aux operands its
  epilogue reads, and writes C and the ones it writes; a copy moves its
  ``bytes`` or the whole buffer). A launch's trailing ``scratch`` output is
  not counted as a buffer, except the traffic through it that
  :data:`SCRATCH_TRAFFIC` knows (the chunked LM-head loss writes and reads
  every chunk's logits there); an ``accumulate`` launch reads its outputs as well as writing
  them (as a gemm with ``beta != 0`` does); an in-place launch's outputs are
  written although they alias its inputs;
  whole operands count, so a gather (``embedding``) reads its whole table;
- FLOPs come from :func:`modeldsl.flops.sched_op_flops`; a kernel without a
  FLOP rule counts 0 FLOPs and is named in the report;
- its time is the roofline ``max(bytes / bandwidth, FLOPs / peak)`` of a
  :class:`Roofline` (default: H100 SXM, 3.35e12 B/s, 989e12 dense bf16 FLOP/s).

An op in a ``layer_loop`` counts ``upper - lower`` times (nested loops
multiply); an op in a ``recompute_segment`` counts in the totals and again in
the recompute line. The times are summed: no overlap of ops, no caches, no
launch latency, collectives priced at memory bandwidth. It is an estimate to
compare schedules with, not a prediction of wall time.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from xdsl.ir import Operation, SSAValue

from modeldsl.dialects.sched import (
    AttentionBackwardOp,
    AttentionOp,
    CollectiveOp,
    CopyOp,
    GemmOp,
    LaunchOp,
    MemsetOp,
    ProgramOp,
    buffer_type,
)
from modeldsl.dialects.sched_walk import At, ScheduleVisitor, operand_roles, walk
from modeldsl.flops import FlopsUnknown, sched_op_flops
from modeldsl.passes.plan_memory import programs

KIND_OF_OP = {GemmOp: "gemm", AttentionOp: "attention", AttentionBackwardOp: "attention_backward",
              CopyOp: "copy", MemsetOp: "memset"}


class NoSchedProgram(ValueError):
    """The module holds no ``mdsl.sched.program`` to price."""


@dataclass(frozen=True)
class Roofline:
    """A device's peaks: memory ``bandwidth`` in bytes/s and ``peak_flops`` in FLOP/s."""

    bandwidth: float = 3.35e12
    peak_flops: float = 989e12
    name: str = "H100 SXM, dense bf16"

    def __post_init__(self) -> None:
        for what, value in (("bandwidth", self.bandwidth), ("peak_flops", self.peak_flops)):
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{what} must be a finite number above 0, got {value}")

    def seconds(self, nbytes: int, flops: int) -> float:
        """The roofline time of one op: the larger of its memory time and its compute time."""
        return max(nbytes / self.bandwidth, flops / self.peak_flops)

    def describe(self) -> str:
        return f"{self.bandwidth / 1e9:g} GB/s and {self.peak_flops / 1e12:g} TFLOP/s ({self.name})"


H100_SXM = Roofline()


@dataclass(frozen=True)
class Cost:
    """Launches, bytes, FLOPs and roofline seconds, of one op or summed over many."""

    launches: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    flops: int = 0
    seconds: float = 0.0

    def __add__(self, other: Cost) -> Cost:
        return Cost(self.launches + other.launches, self.bytes_read + other.bytes_read,
                    self.bytes_written + other.bytes_written, self.flops + other.flops,
                    self.seconds + other.seconds)

    def times(self, trips: int) -> Cost:
        return Cost(self.launches * trips, self.bytes_read * trips, self.bytes_written * trips,
                    self.flops * trips, self.seconds * trips)

    @property
    def bytes(self) -> int:
        return self.bytes_read + self.bytes_written


@dataclass(frozen=True)
class ProgramCost:
    """One run of a program: the cost per op kind, the total, the recompute part of the
    total, and the kinds priced without a FLOP rule."""

    name: str
    roofline: Roofline
    kinds: dict[str, Cost]
    total: Cost
    recompute: Cost
    unpriced: tuple[str, ...] = ()

    @property
    def milliseconds(self) -> float:
        return self.total.seconds * 1e3

    def share(self, cost: Cost) -> float:
        """The part of the program's roofline time that ``cost`` takes."""
        return cost.seconds / self.total.seconds if self.total.seconds else 0.0


# ----------------------------------------------------------------------------
# One op
# ----------------------------------------------------------------------------


def op_kind(op: Operation) -> str:
    """The row an op is summed in: a launch's kernel, ``gemm``, ``copy``, ``collective:all_reduce``..."""
    if isinstance(op, LaunchOp):
        return op.kernel.data
    if isinstance(op, CollectiveOp):
        return f"collective:{op.kind.data}"
    return KIND_OF_OP[type(op)]


def _accesses(op: Operation) -> list[tuple[SSAValue, bool, bool, int | None]]:
    """The planner's (value, read, write, leading bytes) roles, without a launch's scratch
    output and with an accumulating launch's outputs read too."""
    roles = operand_roles(op)
    if isinstance(op, LaunchOp):
        if "scratch" in op.attributes:
            roles = roles[:-1]
        if op.accumulate is not None:
            outputs = set(op.outputs)
            roles = [(v, read or v in outputs, write, n) for v, read, write, n in roles]
    return roles


def _lm_head_loss_traffic(op: LaunchOp, backward: bool) -> tuple[int, int]:
    """(read, written) through the scratch of the CUDA composite of the chunked LM-head loss
    (modeldsl/runtime/cuda_composites.py), over all chunks, the logits in x's dtype: forward, the
    GEMM writes them and the cross-entropy reads them; backward, the GEMM writes them, the
    cross-entropy backward reads them and writes their gradients in place, and the d_x and d_W
    GEMMs each read those."""
    x = buffer_type(op.inputs[1 if backward else 0])
    logits = x.dtype.byte_size(x.shape[0] * buffer_type(op.inputs[2 if backward else 1]).shape[0])
    return (3 * logits, 2 * logits) if backward else (logits, logits)


def _lm_head_loss_grad_traffic(op: LaunchOp) -> tuple[int, int]:
    """The merged loss and gradient (its x and weight where the backward has them): the backward's
    traffic and the forward cross-entropy's read of the logits (one GEMM writes them)."""
    read, written = _lm_head_loss_traffic(op, backward=True)
    x, weight = buffer_type(op.inputs[1]), buffer_type(op.inputs[2])
    return read + x.dtype.byte_size(x.shape[0] * weight.shape[0]), written


SCRATCH_TRAFFIC = {
    "fused_lm_head_loss": lambda op: _lm_head_loss_traffic(op, backward=False),
    "fused_lm_head_loss_backward": lambda op: _lm_head_loss_traffic(op, backward=True),
    "fused_lm_head_loss_grad": _lm_head_loss_grad_traffic,
}


def op_bytes(op: Operation) -> tuple[int, int]:
    """(bytes read, bytes written) of one run of a work op."""
    read = written = 0
    for value, reads, writes, leading in _accesses(op):
        nbytes = buffer_type(value).nbytes if leading is None else leading
        read += nbytes if reads else 0
        written += nbytes if writes else 0
    traffic = SCRATCH_TRAFFIC.get(op.kernel.data) if isinstance(op, LaunchOp) else None
    if traffic is not None:
        extra_read, extra_written = traffic(op)
        read, written = read + extra_read, written + extra_written
    return read, written


def op_cost(op: Operation, roofline: Roofline = H100_SXM) -> tuple[Cost, bool]:
    """One run of a work op, and whether its FLOPs are known (a kernel without a rule counts 0)."""
    read, written = op_bytes(op)
    try:
        flops, known = sched_op_flops(op), True
    except FlopsUnknown:
        flops, known = 0, False
    return Cost(1, read, written, flops, roofline.seconds(read + written, flops)), known


# ----------------------------------------------------------------------------
# A program
# ----------------------------------------------------------------------------


@dataclass
class _Tally(ScheduleVisitor):
    """Sums the cost of every work op the walk visits, times the runs it stands for."""

    roofline: Roofline
    kinds: dict[str, Cost] = field(default_factory=dict)
    total: Cost = Cost()
    recompute: Cost = Cost()
    unpriced: set[str] = field(default_factory=set)

    def work(self, op: Operation, at: At) -> None:
        one, known = op_cost(op, self.roofline)
        cost, kind = one.times(at.runs), op_kind(op)
        self.kinds[kind] = self.kinds.get(kind, Cost()) + cost
        self.total += cost
        if at.segment is not None:
            self.recompute += cost
        if not known:
            self.unpriced.add(kind)


def program_cost(program: ProgramOp, roofline: Roofline = H100_SXM) -> ProgramCost:
    """The estimated cost of one run of ``program`` on ``roofline``."""
    tally = _Tally(roofline)
    walk(program, tally)
    return ProgramCost(program.sym_name.data, roofline, tally.kinds, tally.total, tally.recompute,
                       tuple(sorted(tally.unpriced)))


def module_costs(module: Operation, roofline: Roofline = H100_SXM) -> list[ProgramCost]:
    """The cost of every ``mdsl.sched.program`` of a module (:class:`NoSchedProgram` where there is none)."""
    found = programs(module)
    if not found:
        raise NoSchedProgram("no mdsl.sched.program in the input")
    return [program_cost(p, roofline) for p in found]


# ----------------------------------------------------------------------------
# The report
# ----------------------------------------------------------------------------

HEADER = ("op kind", "launches", "GB read", "GB written", "GFLOPs", "roofline ms", "share")


def estimate_line(roofline: Roofline) -> str:
    return (f"cost estimate: roofline at {roofline.describe()}; each op takes max(bytes / bandwidth, "
            "FLOPs / peak), summed over the ops: no overlap, no caches, no launch latency")


def _row(label: str, cost: Cost, share: float, width: int) -> str:
    return (f"  {label:<{width}} {cost.launches:>9} {cost.bytes_read / 1e9:>11.4g} "
            f"{cost.bytes_written / 1e9:>11.4g} {cost.flops / 1e9:>11.4g} {cost.seconds * 1e3:>11.4g} "
            f"{100 * share:>6.1f}%")


def format_program_cost(cost: ProgramCost) -> str:
    """One program's table: a row per op kind (longest time first), the total, the recompute part."""
    kinds = sorted(cost.kinds.items(), key=lambda item: (-item[1].seconds, item[0]))
    width = max([len(k) for k in cost.kinds] + [len("recompute"), len(HEADER[0])])
    lines = [f"@{cost.name}: {cost.milliseconds:.4g} ms, {cost.total.launches} launches",
             f"  {HEADER[0]:<{width}} {HEADER[1]:>9} " + " ".join(f"{h:>11}" for h in HEADER[2:6])
             + f" {HEADER[6]:>7}"]
    lines += [_row(kind, c, cost.share(c), width) for kind, c in kinds]
    lines.append(_row("total", cost.total, cost.share(cost.total), width))
    if cost.recompute.launches:
        lines.append(_row("recompute", cost.recompute, cost.share(cost.recompute), width) + "  (in the total)")
    if cost.unpriced:
        lines.append(f"  no FLOP rule for {', '.join(cost.unpriced)}: priced by their bytes only")
    return "\n".join(lines) + "\n"


def format_cost_report(costs: Iterable[ProgramCost], roofline: Roofline = H100_SXM) -> str:
    """The estimate line, then a table per program."""
    return estimate_line(roofline) + "\n" + "".join(format_program_cost(c) for c in costs)


def cost_report(module: Operation, roofline: Roofline = H100_SXM) -> str:
    """``--emit=cost-report``: the report of every program of ``module``."""
    return format_cost_report(module_costs(module, roofline), roofline)
