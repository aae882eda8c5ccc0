"""``--emit=comm-report``: the bytes each rank sends in one run of each ``mdsl.sched`` program.

Every ``mdsl.sched.collective`` (layer loops counted once per layer) over a group of ``n`` ranks
(its ``size``) moving ``S`` bytes (the whole value: an all-reduce's buffer, an all-gather's output, a
reduce-scatter's input) sends, per rank, what the ring algorithms NCCL and MPI use for large
messages send: ``2 (n - 1) / n * S`` for ``all_reduce`` (a reduce-scatter, then an all-gather),
``(n - 1) / n * S`` for ``all_gather`` and ``reduce_scatter``, ``S`` for ``broadcast``, ``send`` and
``all_to_all`` (a rank keeps ``S / n`` of an all-to-all: it sends ``(n - 1) / n * S``). A group of
one rank sends nothing. The report is a table per program: each collective kind and group, how many
run, their bytes and what one rank sends, then the total.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from xdsl.ir import Operation

from modeldsl.dialects.sched import CollectiveOp, ProgramOp, buffer_type
from modeldsl.dialects.sched_walk import At, ScheduleVisitor, visit


def moved_bytes(op: CollectiveOp) -> int:
    """``S``: the bytes of the whole value the collective moves."""
    source, target = buffer_type(op.input), buffer_type(op.output)
    return source.nbytes if op.kind.data == "reduce_scatter" else target.nbytes


def sent_bytes(kind: str, size: int, moved: int) -> float:
    """What one rank of a group of ``size`` sends for a collective moving ``moved`` bytes."""
    if size <= 1:
        return 0.0
    share = (size - 1) / size
    if kind == "all_reduce":
        return 2 * share * moved
    if kind in ("all_gather", "reduce_scatter", "all_to_all"):
        return share * moved
    return float(moved)  # broadcast (the root's), send


@dataclass
class Traffic:
    """The collectives of one kind over one group in a program: how many ran, their bytes, what a rank sent."""

    kind: str
    group: str
    size: int
    count: int = 0
    moved: int = 0
    sent: float = 0.0


@dataclass
class ProgramTraffic:
    name: str
    rows: dict[tuple[str, str], Traffic] = field(default_factory=dict)

    @property
    def sent(self) -> float:
        return sum(row.sent for row in self.rows.values())


class _Collectives(ScheduleVisitor):
    unroll = True  # a collective in a layer loop runs once per layer

    def __init__(self, traffic: ProgramTraffic):
        self.traffic = traffic

    def collective(self, op: CollectiveOp, at: At) -> None:
        kind, group = op.kind.data, op.group.data
        size = op.size.value.data if op.size is not None else 1
        row = self.traffic.rows.setdefault((kind, group), Traffic(kind, group, size))
        moved = moved_bytes(op)
        row.count += 1
        row.moved += moved
        row.sent += sent_bytes(kind, size, moved)


def program_traffic(program: ProgramOp) -> ProgramTraffic:
    traffic = ProgramTraffic(program.sym_name.data)
    walker = _Collectives(traffic)
    for op in program.body.block.ops:
        visit(op, walker)
    return traffic


def comm_report(module: Operation) -> str:
    """``--emit=comm-report``: a table of every program of ``module``."""
    return "".join(format_traffic(program_traffic(p)) for p in module.walk() if isinstance(p, ProgramOp))


def _mib(n: float) -> str:
    return f"{n / 2**20:,.3f}"


def format_traffic(traffic: ProgramTraffic) -> str:
    lines = [f"program @{traffic.name}: bytes each rank sends per run (ring algorithms)"]
    if not traffic.rows:
        return "\n".join([*lines, "  no collectives", ""]) + "\n"
    lines.append(f"  {'collective':<16}{'group':<8}{'ranks':>6}{'count':>7}{'bytes':>16}{'sent/rank':>16}{'MiB':>12}")
    for row in sorted(traffic.rows.values(), key=lambda r: (-r.sent, r.kind, r.group)):
        lines.append(f"  {row.kind:<16}{row.group:<8}{row.size:>6}{row.count:>7}{row.moved:>16,}"
                     f"{round(row.sent):>16,}{_mib(row.sent):>12}")
    lines.append(f"  total sent per rank: {round(traffic.sent):,} bytes ({_mib(traffic.sent)} MiB)")
    return "\n".join(lines) + "\n\n"

