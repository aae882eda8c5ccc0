"""``mdsl-plan-memory``: give every buffer of an ``mdsl.sched.program`` its arena offset.

``mdsl-plan-memory{strategy=first-fit alignment=256 inplace=true}`` plans each
program of the module in four steps, all deterministic (the same program
always gets the same offsets):

1. **Steps.** Every work op (launch, gemm, attention, attention_backward,
   memset, copy, collective) gets a step number in pre-order; ``buffer``,
   ``layer_view``, ``stream`` and ``sync`` ops get none, and a
   ``layer_loop`` or ``recompute_segment`` spans the steps of its body.
2. **Liveness.** A buffer and all its aliases (``alias_of``, transitively) and
   layer views form one group, owned by the root buffer. Its interval is
   [first step that reads or writes any of them, last such step]. Inside a
   ``layer_loop`` the interval grows to the whole loop when the group is also
   used outside the loop, when a byte of it is read in the body before the
   body writes it (carried from the previous layer), or when it is a stacked
   buffer read through ``layer_view``; a group used only within one iteration
   keeps its in-body interval and is reused every layer. A buffer whose tensor
   has a ``@lifetime`` (copied onto it by ``mdsl-lower-to-sched``) grows its
   group's interval to what it declares (:class:`Lifetime`; never shrinks it):
   ``global`` the whole program, ``layer``/``block`` its loop iteration,
   ``start``/``end`` the ops of those names around it (E042 where none runs).
3. **In-place reuse** (``inplace=true``), walking launches in order: output
   ``o`` of a launch whose registry entry has ``reuse[o] = i`` takes over the
   memory of input ``i`` when input ``i`` is (at offset 0) the whole of its
   root buffer, that root's group dies at this launch (and is not live across
   an enclosing layer loop), it lies in the same reusable arena and has the
   byte size of ``o``, ``o`` is a root buffer (not an alias, not a stacked
   buffer) first used by this very launch, and no other operand of the launch
   touches that memory except identical reads. Deaths are counted on the
   groups of the IR (aliases written in the program), not on earlier in-place
   decisions, so decisions cannot feed back into the counts (the "consumer
   counting subtlety"); the memory itself follows the decisions, so a chain
   EXP -> RELU -> ... lands in one buffer whose interval covers the whole
   chain. A rejected candidate keeps its own group and interval (the
   "lifetime fix for rejected aliases": a use always extends the group that
   actually owns the memory). In the IR the output becomes ``alias_of`` the
   memory root at offset 0 and the launch is marked ``inplace``.
4. **Offsets.** ``params``, ``grads``, ``optimizer`` and ``external`` buffers
   are never reused (they outlive one run of the program: weights, gradients
   accumulated over micro-batches, optimizer state, inputs and outputs): they
   are laid out one after another in declaration order, so two programs that
   declare the same buffers first (every program of a model declares all its
   parameters, and a training step all its gradients, in the model's order)
   can share those arenas. ``activations`` and ``workspace`` are planned by linear scan over the memory
   roots' intervals sorted by (start, end, declaration order): expired
   blocks are freed, and each buffer goes into the first free gap that holds
   it (``strategy=best-fit``: the smallest such gap), else on top of the live
   blocks. Every offset is a multiple of ``alignment``; an arena's size is the
   largest end. Buffers that are never used get offset 0 (they overlap
   nothing that runs). Kernel scratch (a trailing ``workspace`` output of a
   launch with the ``scratch`` unit attribute) is used by one launch, so it is
   a one-step interval in the workspace arena.

**What is replanned.** Every buffer that is not an alias gets a new offset,
whatever offset it had; aliases keep their offset into the buffer they alias
(in-place outputs of an earlier run are aliases by then, so a second run
keeps them). The program's arena sizes are rewritten.

The planner's core is a pure function over a small model (:class:`Program`
of :class:`Buf`, :class:`Step`, :class:`Access` and :class:`Loop`, buffers
and steps numbered as in the IR) that :func:`build_program` reads off a
``program`` op: :func:`liveness`, :func:`decide_inplace`, :func:`linear_scan`
and :func:`plan` (all of them) give a :class:`MemoryPlan`; :func:`apply_plan`
writes it into the IR and :func:`plan_program` does all of it for one
``program`` op. Executors read the planned IR: :func:`buffer_address`
resolves a buffer op to (arena, absolute byte offset).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from xdsl.context import Context
from xdsl.dialects.builtin import DenseArrayBase, IntegerAttr, ModuleOp, UnitAttr, i64
from xdsl.ir import Block, BlockArgument, Operation, SSAValue
from xdsl.passes import ModulePass

from modeldsl.dialects.sched import (
    ARENAS,
    AttentionBackwardOp,
    AttentionOp,
    BufferOp,
    BufferType,
    CopyOp,
    GemmOp,
    LaunchOp,
    LayerLoopOp,
    LayerViewOp,
    MemsetOp,
    ProgramOp,
)
from modeldsl.dialects.sched_walk import At, ScheduleVisitor, descend, operand_roles, trips, walk

FIXED_ARENAS: tuple[str, ...] = ("params", "grads", "optimizer", "external")
REUSED_ARENAS: tuple[str, ...] = ("activations", "workspace")
STRATEGIES: tuple[str, ...] = ("first-fit", "best-fit")

Interval = tuple[int, int]


# ----------------------------------------------------------------------------
# The model the planner works on
# ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Lifetime:
    """A ``@lifetime`` (spec 7.2.3) of the tensor a buffer holds: ``scope`` ``layer`` or ``block``
    keeps it for its whole layer-loop iteration (the whole program outside loops), ``global`` for
    the whole program, ``operation`` and ``sublayer`` until its last use (as without one); ``start``
    and ``end`` name ops (primitive names: ``matmul``, ``silu``, ...) it lives from and until, where
    they run later than its last use (or earlier than its first)."""

    scope: str = "operation"
    start: str | None = None
    end: str | None = None


class LifetimeError(ValueError):
    """A ``@lifetime`` naming an op that does not run where the tensor lives (buffer index, message)."""

    def __init__(self, buffer: int, message: str):
        super().__init__(message)
        self.buffer = buffer


@dataclass(frozen=True)
class Buf:
    """One ``buffer`` op: an arena and a byte size, or an alias ``offset`` bytes into ``alias_of``."""

    name: str
    arena: str
    nbytes: int
    alias_of: int | None = None
    offset: int = 0
    lifetime: Lifetime | None = None
    noalias: bool = False  # @noalias: no in-place decision shares its storage with another buffer's


@dataclass(frozen=True)
class Access:
    """One buffer operand of a step.

    ``nbytes`` (None: the whole buffer) limits the access to the leading
    bytes (``copy {bytes = N}``). A ``view`` is a ``layer_view`` slice of a
    stacked buffer: layer ``l`` of loop ``layer_loop`` reads or writes bytes
    ``[l * nbytes, (l + 1) * nbytes)`` of ``buffer``.
    """

    buffer: int
    read: bool = False
    write: bool = False
    nbytes: int | None = None
    view: bool = False
    layer_loop: int | None = None


@dataclass(frozen=True)
class Step:
    """One work op: its accesses, its enclosing loops (outermost first) and its
    in-place candidates as (output access index, input access index)."""

    accesses: tuple[Access, ...]
    loops: tuple[int, ...] = ()
    reuse: tuple[tuple[int, int], ...] = ()
    name: str = ""  # the primitive it runs (``matmul`` for a gemm), for @lifetime's start and end


@dataclass(frozen=True)
class Loop:
    """A ``layer_loop``: steps ``first..last`` (inclusive; ``last = first - 1`` when
    empty), run for layers ``lower..lower+trips-1`` (backwards when ``reverse``)."""

    first: int
    last: int
    trips: int = 1
    lower: int = 0
    reverse: bool = False


@dataclass(frozen=True)
class Program:
    buffers: tuple[Buf, ...]
    steps: tuple[Step, ...]
    loops: tuple[Loop, ...] = ()


@dataclass(frozen=True)
class Liveness:
    """Per buffer: its structural root (following ``alias_of``) and its byte offset
    in that root; per root: the live interval of its group (None: never used)
    and the loops it is live across."""

    root: tuple[int, ...]
    root_offset: tuple[int, ...]
    first_use: tuple[int | None, ...]
    interval: tuple[Interval | None, ...]
    loop_live: tuple[frozenset[int], ...]
    has_view: tuple[bool, ...]


@dataclass(frozen=True)
class InPlace:
    """Output buffer ``output`` of step ``step`` takes over the memory of ``root``."""

    step: int
    output: int
    root: int
    input_access: int
    output_access: int


@dataclass(frozen=True)
class MemoryPlan:
    """The result of :func:`plan`.

    ``alias_of``/``offsets`` are the buffers as the IR has them afterwards:
    a buffer with ``alias_of[b] is None`` sits at ``offsets[b]`` in its arena;
    an alias at ``offsets[b]`` bytes into ``alias_of[b]``. ``addresses[b]`` is
    the absolute offset of every buffer in its arena, ``memory_root[b]`` the
    buffer owning its memory and ``intervals[b]`` the live interval of that
    memory (None: never used).
    """

    alias_of: tuple[int | None, ...]
    offsets: tuple[int, ...]
    addresses: tuple[int, ...]
    memory_root: tuple[int, ...]
    intervals: tuple[Interval | None, ...]
    arena_sizes: tuple[tuple[str, int], ...]
    inplace: tuple[InPlace, ...]
    peak_live_bytes: int
    peak_step: int | None
    alignment: int = 256
    strategy: str = "first-fit"

    @property
    def arenas(self) -> dict[str, int]:
        return dict(self.arena_sizes)


# ----------------------------------------------------------------------------
# Liveness
# ----------------------------------------------------------------------------


def structural_roots(buffers: Sequence[Buf]) -> tuple[list[int], list[int]]:
    """The root buffer of every buffer (through ``alias_of`` chains) and its byte offset in that root."""
    root: list[int | None] = [None] * len(buffers)
    offset = [0] * len(buffers)
    for b in range(len(buffers)):
        chain = []
        cur = b
        while root[cur] is None and buffers[cur].alias_of is not None:
            chain.append(cur)
            cur = buffers[cur].alias_of
            if len(chain) > len(buffers):
                raise ValueError(f"alias cycle through buffer {buffers[b].name}")
        if root[cur] is None:
            root[cur], offset[cur] = cur, 0
        for c in reversed(chain):
            parent = buffers[c].alias_of
            root[c] = root[parent]
            offset[c] = offset[parent] + buffers[c].offset
    return root, offset  # type: ignore[return-value]


def access_range(acc: Access, buffers: Sequence[Buf], root_offset: Sequence[int], layer: int = 0) -> Interval:
    """Bytes ``[lo, hi)`` an access touches in its root (``layer``: the slice of a view)."""
    n = buffers[acc.buffer].nbytes if acc.nbytes is None else acc.nbytes
    lo = root_offset[acc.buffer] + (layer * n if acc.view and acc.nbytes is not None else 0)
    return lo, lo + n


class _Covered:
    """A union of byte ranges, for 'written before read' within a loop body."""

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.ends: list[int] = []

    def covers(self, lo: int, hi: int) -> bool:
        if hi <= lo:
            return True
        k = bisect_right(self.starts, lo) - 1
        return k >= 0 and self.ends[k] >= hi

    def add(self, lo: int, hi: int) -> None:
        if hi <= lo:
            return
        pairs = [(s, e) for s, e in zip(self.starts, self.ends) if e < lo or s > hi]
        merged_lo, merged_hi = lo, hi
        for s, e in zip(self.starts, self.ends):
            if not (e < lo or s > hi):
                merged_lo, merged_hi = min(merged_lo, s), max(merged_hi, e)
        pairs.append((merged_lo, merged_hi))
        pairs.sort()
        self.starts = [p[0] for p in pairs]
        self.ends = [p[1] for p in pairs]


def liveness(program: Program) -> Liveness:
    """Live intervals of every root buffer's group (the buffer, its aliases and views)."""
    buffers, steps, loops = program.buffers, program.steps, program.loops
    root, root_offset = structural_roots(buffers)
    n = len(buffers)
    first: list[int | None] = [None] * n
    last: list[int | None] = [None] * n
    has_view = [False] * n
    for s, step in enumerate(steps):
        for acc in step.accesses:
            r = root[acc.buffer]
            if first[r] is None:
                first[r] = s
            last[r] = s
            if acc.view:
                has_view[r] = True

    loop_live: list[set[int]] = [set() for _ in range(n)]
    for lid, loop in enumerate(loops):
        if loop.last < loop.first:
            continue
        written: dict[int, _Covered] = {}
        inside: set[int] = set()
        for s in range(loop.first, loop.last + 1):
            step = steps[s]
            # a write only counts when every loop between this one and the step runs
            inner = step.loops[step.loops.index(lid) + 1 :] if lid in step.loops else ()
            runs = all(loops[k].trips > 0 for k in inner)
            for acc in step.accesses:
                r = root[acc.buffer]
                inside.add(r)
                if acc.view:
                    loop_live[r].add(lid)
                elif acc.read and lid not in loop_live[r]:
                    lo, hi = access_range(acc, buffers, root_offset)
                    if not written.get(r, _Covered()).covers(lo, hi):
                        loop_live[r].add(lid)
            if runs:
                for acc in step.accesses:
                    if acc.write and not acc.view:
                        written.setdefault(root[acc.buffer], _Covered()).add(*access_range(acc, buffers, root_offset))
        for r in inside:  # used in the body and outside the loop
            if first[r] < loop.first or last[r] > loop.last:
                loop_live[r].add(lid)

    interval: list[Interval | None] = [None] * n
    for r in range(n):
        if first[r] is None:
            continue
        lo, hi = first[r], last[r]
        for lid in loop_live[r]:
            lo, hi = min(lo, loops[lid].first), max(hi, loops[lid].last)
        interval[r] = (lo, hi)
    for b, buf in enumerate(buffers):
        r = root[b]
        if buf.lifetime is not None and interval[r] is not None:
            interval[r] = declared_lifetime(program, b, buf.lifetime, interval[r], first[r], last[r])
    return Liveness(
        tuple(root), tuple(root_offset), tuple(first), tuple(interval),
        tuple(frozenset(x) for x in loop_live), tuple(has_view),
    )


def declared_lifetime(program: Program, b: int, lifetime: Lifetime, span: Interval, first: int, last: int) -> Interval:
    """A live interval grown to cover what ``@lifetime`` declares (it never shrinks: a tensor lives
    until its last use whatever the annotation says)."""
    steps, lo, hi = program.steps, span[0], span[1]
    if lifetime.scope == "global":
        return (0, len(steps) - 1)
    if lifetime.scope in ("layer", "block"):
        loop = steps[first].loops[-1] if steps[first].loops else None
        whole = (program.loops[loop].first, program.loops[loop].last) if loop is not None else (0, len(steps) - 1)
        return (min(lo, whole[0]), max(hi, whole[1]))
    if lifetime.end is not None:
        ends = [s for s in range(first, len(steps)) if steps[s].name == lifetime.end]
        if not ends:
            raise LifetimeError(b, f"@lifetime(end={lifetime.end}): no {lifetime.end} runs after "
                                f"%{program.buffers[b].name} is made")
        hi = max(hi, next((s for s in ends if s >= last), ends[-1]))
    if lifetime.start is not None:
        starts = [s for s in range(0, first + 1) if steps[s].name == lifetime.start]
        if not starts:
            raise LifetimeError(b, f"@lifetime(start={lifetime.start}): no {lifetime.start} runs before "
                                f"%{program.buffers[b].name} is made")
        lo = min(lo, starts[-1])
    return (lo, hi)


# ----------------------------------------------------------------------------
# In-place reuse
# ----------------------------------------------------------------------------


def decide_inplace(program: Program, live: Liveness) -> tuple[InPlace, ...]:
    """The in-place decisions, walking the steps in order (see the module doc)."""
    buffers, steps = program.buffers, program.steps
    root, root_offset = live.root, live.root_offset
    merged: dict[int, int] = {}  # root buffer -> the memory root it now lives in

    def memory_root(b: int) -> int:
        r = root[b]
        while r in merged:
            r = merged[r]
        return r

    decisions: list[InPlace] = []
    for s, step in enumerate(steps):
        for oi, ii in step.reuse:
            out, inp = step.accesses[oi], step.accesses[ii]
            o, i = out.buffer, inp.buffer
            ob, ib = buffers[o], buffers[i]
            if not out.write or out.read or out.view or out.nbytes is not None:
                continue
            if not inp.read or inp.view or inp.nbytes is not None:
                continue
            if ob.alias_of is not None or o in merged or ob.arena not in REUSED_ARENAS or live.has_view[o]:
                continue
            r = root[i]
            if ob.noalias or ib.noalias or buffers[r].noalias:
                continue
            if r == o or root_offset[i] != 0 or not ib.nbytes == buffers[r].nbytes == ob.nbytes:
                continue
            # the input's group (as written in the IR) dies here, and not across a loop around it
            span = live.interval[r]
            if span is None or span[1] != s or any(lid in live.loop_live[r] for lid in step.loops):
                continue
            # the output is first used right here, by this access only
            if live.first_use[o] != s:
                continue
            m = memory_root(i)
            if buffers[m].arena != ob.arena or buffers[m].arena not in REUSED_ARENAS:
                continue
            if not _only_identical_reads(step, ii, oi, m, o, memory_root, root, root_offset, buffers):
                continue
            merged[o] = m
            decisions.append(InPlace(s, o, m, ii, oi))
    return tuple(decisions)


def _only_identical_reads(step, ii, oi, m, o, memory_root, root, root_offset, buffers) -> bool:
    """No other operand of the step touches the taken memory (or the output) except
    whole reads at the same place as the input."""
    inp = step.accesses[ii]
    for k, acc in enumerate(step.accesses):
        if k in (ii, oi):
            continue
        if root[acc.buffer] == o:
            return False
        if memory_root(acc.buffer) != m:
            continue
        same = (
            acc.read and not acc.write and not acc.view and acc.nbytes is None
            and root_offset[acc.buffer] == root_offset[inp.buffer]
            and buffers[acc.buffer].nbytes == buffers[inp.buffer].nbytes
        )
        if not same:
            return False
    return True


# ----------------------------------------------------------------------------
# Offsets
# ----------------------------------------------------------------------------


def align_up(value: int, alignment: int) -> int:
    return -(-value // alignment) * alignment


def linear_scan(
    intervals: Sequence[tuple[int, int, int]], alignment: int = 256, strategy: str = "first-fit"
) -> tuple[list[int], int]:
    """Offsets for ``(start, end, nbytes)`` items (inclusive steps), and the arena size.

    Items are placed in (start, end, index) order; blocks whose end is before
    an item's start are free again. ``first-fit`` takes the lowest free gap
    between live blocks that holds the item, ``best-fit`` the smallest such gap
    (lowest on ties); with none, the item goes on top of the live blocks.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy '{strategy}' (expected {', '.join(STRATEGIES)})")
    if alignment <= 0:
        raise ValueError(f"alignment must be positive, got {alignment}")
    order = sorted(range(len(intervals)), key=lambda k: (intervals[k][0], intervals[k][1], k))
    offsets = [0] * len(intervals)
    active: list[tuple[int, int, int]] = []  # (offset, end offset, end step), sorted by offset
    size = 0
    for k in order:
        start, end, nbytes = intervals[k]
        active = [a for a in active if a[2] >= start]
        cursor, chosen, chosen_gap = 0, None, None
        for off, top, _ in active:
            lo = align_up(cursor, alignment)
            if lo + nbytes <= off:
                gap = off - lo
                if strategy == "first-fit":
                    chosen = lo
                    break
                if chosen_gap is None or gap < chosen_gap:
                    chosen, chosen_gap = lo, gap
            cursor = max(cursor, top)
        if chosen is None:
            chosen = align_up(cursor, alignment)
        offsets[k] = chosen
        size = max(size, chosen + nbytes)
        entry = (chosen, chosen + nbytes, end)
        pos = bisect_right([a[0] for a in active], chosen)
        active.insert(pos, entry)
    return offsets, size


def plan(program: Program, *, strategy: str = "first-fit", alignment: int = 256, inplace: bool = True) -> MemoryPlan:
    """Plan a program: liveness, in-place decisions, offsets in every arena."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy '{strategy}' (expected {', '.join(STRATEGIES)})")
    if alignment <= 0:
        raise ValueError(f"alignment must be positive, got {alignment}")
    buffers = program.buffers
    n = len(buffers)
    live = liveness(program)
    decisions = decide_inplace(program, live) if inplace else ()
    merged = {d.output: d.root for d in decisions}

    alias_of = [b.alias_of for b in buffers]
    offsets = [b.offset if b.alias_of is not None else 0 for b in buffers]
    for d in decisions:
        alias_of[d.output], offsets[d.output] = d.root, 0

    memory_root = [0] * n
    for b in range(n):
        r = live.root[b]
        while r in merged:
            r = merged[r]
        memory_root[b] = r
    span: dict[int, Interval | None] = {}
    for r in sorted(set(live.root)):
        m = memory_root[r]
        iv = live.interval[r]
        old = span.get(m)
        if iv is None:
            span.setdefault(m, None)
        elif old is None:
            span[m] = iv
        else:
            span[m] = (min(old[0], iv[0]), max(old[1], iv[1]))

    roots = [b for b in range(n) if alias_of[b] is None]
    sizes: dict[str, int] = {}
    for arena in ARENAS:
        members = [b for b in roots if buffers[b].arena == arena]
        if arena in FIXED_ARENAS or arena not in REUSED_ARENAS:
            tail = 0
            for b in members:
                offsets[b] = align_up(tail, alignment)
                tail = offsets[b] + buffers[b].nbytes
            sizes[arena] = tail
            continue
        used = [b for b in members if span.get(b) is not None]
        placed, size = linear_scan([(*span[b], buffers[b].nbytes) for b in used], alignment, strategy)
        for b, off in zip(used, placed):
            offsets[b] = off
        for b in members:
            if span.get(b) is None:
                offsets[b] = 0
                size = max(size, buffers[b].nbytes)
        sizes[arena] = size

    addresses = [0] * n
    done = [False] * n

    def address(b: int) -> int:
        chain = []
        while not done[b] and alias_of[b] is not None:
            chain.append(b)
            b = alias_of[b]
        if not done[b]:
            addresses[b], done[b] = offsets[b], True
        for c in reversed(chain):
            addresses[c], done[c] = addresses[alias_of[c]] + offsets[c], True
        return addresses[b]

    for b in range(n):
        address(b)

    peak, peak_step = _peak_live(buffers, span, len(program.steps))
    return MemoryPlan(
        alias_of=tuple(alias_of),
        offsets=tuple(offsets),
        addresses=tuple(addresses),
        memory_root=tuple(memory_root),
        intervals=tuple(span.get(memory_root[b]) for b in range(n)),
        arena_sizes=tuple(sizes.items()),
        inplace=decisions,
        peak_live_bytes=peak,
        peak_step=peak_step,
        alignment=alignment,
        strategy=strategy,
    )


def _peak_live(buffers: Sequence[Buf], span: dict[int, Interval | None], nsteps: int) -> tuple[int, int | None]:
    """The most bytes of reusable-arena memory roots live at one step, and that step."""
    delta = [0] * (nsteps + 1)
    for m, iv in span.items():
        if iv is not None and buffers[m].arena in REUSED_ARENAS:
            delta[iv[0]] += buffers[m].nbytes
            delta[iv[1] + 1] -= buffers[m].nbytes
    best, best_step, running = 0, None, 0
    for s in range(nsteps):
        running += delta[s]
        if running > best:
            best, best_step = running, s
    return best, best_step


# ----------------------------------------------------------------------------
# From and back to the IR
# ----------------------------------------------------------------------------


@dataclass
class ProgramModel:
    """The model of a ``program`` op with the ops it was read from."""

    op: ProgramOp
    program: Program
    buffer_ops: list[BufferOp]
    step_ops: list[Operation]
    loop_ops: list[LayerLoopOp] = field(default_factory=list)


# (value, read, write, leading bytes) of each buffer operand of a work op (the walker's table)
_operand_roles = operand_roles


class _ModelReader(ScheduleVisitor):
    """Reads the planner's model off a program, op by op in the walker's order: a step per work
    op (in pre-order), a :class:`Loop` per ``layer_loop`` spanning its body's steps."""

    def __init__(self, reuse_of: dict[str, dict[int, int]] | None):
        self.reuse_of = reuse_of
        self.buffers: list[Buf] = []
        self.buffer_ops: list[BufferOp] = []
        self.index: dict[SSAValue, int] = {}
        self.views: dict[SSAValue, tuple[int, int | None, int | None]] = {}  # view -> (buffer, loop, slice bytes)
        self.steps: list[Step] = []
        self.step_ops: list[Operation] = []
        self.loops: list[Loop] = []
        self.loop_ops: list[LayerLoopOp] = []
        self.loop_of_block: dict[Block, int] = {}
        self.first_step: dict[int, int] = {}  # loop -> its first step

    def model(self, program_op: ProgramOp) -> ProgramModel:
        program = Program(tuple(self.buffers), tuple(self.steps), tuple(self.loops))
        return ProgramModel(program_op, program, self.buffer_ops, self.step_ops, self.loop_ops)

    def stack(self, at: At) -> tuple[int, ...]:
        """The loops around an op, outermost first."""
        return tuple(self.loop_of_block[loop.body.block] for loop in at.loops)

    def buffer(self, op: BufferOp, at: At) -> None:
        alias = None
        if op.alias_of is not None:
            if op.alias_of not in self.index:
                raise ValueError("alias_of must name a buffer declared before the alias")
            alias = self.index[op.alias_of]
        name = op.result.name_hint or f"buf{len(self.buffers)}"
        off = op.offset.value.data if (alias is not None and op.offset is not None) else 0
        self.buffers.append(Buf(name, op.arena.data, op.bytes.value.data, alias, off, _lifetime_of(op),
                                "noalias" in op.attributes))
        self.buffer_ops.append(op)
        self.index[op.result] = len(self.buffers) - 1

    def layer_view(self, op: LayerViewOp, at: At) -> None:
        stack, lid = self.stack(at), None
        if isinstance(op.layer, BlockArgument) and op.layer.block in self.loop_of_block:
            lid = self.loop_of_block[op.layer.block]
        elif stack:
            lid = stack[-1]
        if op.stacked in self.index:
            self.views[op.result] = (self.index[op.stacked], lid, op.result.type.nbytes)
        elif op.stacked in self.views:  # a view of a view: count it as the whole stacked buffer
            self.views[op.result] = (self.views[op.stacked][0], lid, None)
        else:
            raise ValueError("layer_view of a value that is not a buffer")

    def enter_loop(self, op: LayerLoopOp, at: At) -> None:
        lid = len(self.loops)
        self.loops.append(Loop(0, -1))
        self.loop_ops.append(op)
        self.loop_of_block[op.body.block] = lid
        self.first_step[lid] = len(self.steps)

    def exit_loop(self, op: LayerLoopOp, at: At) -> None:
        lid = self.loop_of_block[op.body.block]
        self.loops[lid] = Loop(self.first_step[lid], len(self.steps) - 1, trips(op), op.lower.value.data,
                               op.reverse is not None)

    def access(self, value: SSAValue, read: bool, write: bool, nbytes: int | None) -> Access:
        if value in self.index:
            return Access(self.index[value], read, write, nbytes)
        if value in self.views:
            b, lid, size = self.views[value]
            return Access(b, read, write, size, True, lid)
        raise ValueError(f"operand {value} is neither a buffer nor a layer_view of one")

    def work(self, op: Operation, at: At) -> None:
        accesses = tuple(self.access(v, r, w, nb) for v, r, w, nb in operand_roles(op))
        reuse: tuple[tuple[int, int], ...] = ()
        if self.reuse_of is not None and isinstance(op, LaunchOp):
            reuse = _launch_reuse(op, self.reuse_of)
        self.steps.append(Step(accesses, self.stack(at), reuse, _step_name(op)))
        self.step_ops.append(op)

    def other(self, op: Operation, at: At) -> None:
        """A container of ops without buffer operands holds steps; any other op is one."""
        if op.regions and not _has_buffer_operand(op):
            descend(op, self, at)
        else:
            self.work(op, at)


def build_program(program_op: ProgramOp, *, inplace: bool = True) -> ProgramModel:
    """Read the planner's model off a ``program`` op (``inplace``: collect the
    registry's in-place candidates of every launch)."""
    reader = _ModelReader(_reuse_table() if inplace else None)
    walk(program_op, reader)
    return reader.model(program_op)


def _lifetime_of(op: BufferOp) -> Lifetime | None:
    """The ``@lifetime`` lowering copied onto a buffer (``lifetime`` attribute), if any."""
    attr = op.attributes.get("lifetime")
    if attr is None or not hasattr(attr, "values"):
        return None
    values = attr.values
    return Lifetime(values["scope"], values["start"], values["end"])


STEP_NAMES = {GemmOp: "matmul", AttentionOp: "flash_attention", AttentionBackwardOp: "flash_attention_backward",
              CopyOp: "copy", MemsetOp: "fill"}


def _step_name(op: Operation) -> str:
    """The primitive a step runs: a launch's kernel, ``matmul`` for a gemm, ``flash_attention`` for attention."""
    if isinstance(op, LaunchOp):
        return op.kernel.data
    return STEP_NAMES.get(type(op), op.name.removeprefix("mdsl.sched."))


def _has_buffer_operand(op: Operation) -> bool:
    return any(isinstance(v.type, BufferType) for v in op.operands)


def _reuse_table() -> dict[str, dict[int, int]]:
    from modeldsl.kernels.registry import registry

    return {name: dict(e.reuse) for name, e in registry().items() if e.reuse}


def _launch_reuse(op: LaunchOp, table: dict[str, dict[int, int]]) -> tuple[tuple[int, int], ...]:
    """(output access, input access) pairs of a launch; the scratch output takes no part."""
    rule = table.get(op.kernel.data)
    if not rule:
        return ()
    n_in = len(op.inputs)
    n_out = len(op.outputs) - (1 if "scratch" in op.attributes else 0)
    return tuple((n_in + o, i) for o, i in sorted(rule.items()) if o < n_out and i < n_in)


def apply_plan(model: ProgramModel, memory: MemoryPlan) -> None:
    """Write a plan into the IR: offsets, in-place aliases (launches marked
    ``inplace``), the arena sizes; buffer ops move only where an alias would
    otherwise come before the buffer it aliases."""
    ops = model.buffer_ops
    for d in memory.inplace:
        op = ops[d.output]
        op.operands = [ops[d.root].result]
        model.step_ops[d.step].attributes["inplace"] = UnitAttr()
    for b, op in enumerate(ops):
        op.properties["offset"] = IntegerAttr(memory.offsets[b], i64)
    _order_aliases_after_targets(model.op.body.block)
    model.op.properties["arena_sizes"] = DenseArrayBase.from_list(i64, [memory.arenas[a] for a in ARENAS])


def _order_aliases_after_targets(block: Block) -> None:
    """Move each alias whose target is declared later to just after the target."""
    changed = True
    while changed:
        changed = False
        position = {op: k for k, op in enumerate(block.ops)}
        for op in list(block.ops):
            if isinstance(op, BufferOp) and op.alias_of is not None:
                target = op.alias_of.owner
                if isinstance(target, Operation) and position[target] > position[op]:
                    op.detach()
                    block.insert_op_after(op, target)
                    changed = True
                    break


def plan_program(program_op: ProgramOp, *, strategy: str = "first-fit", alignment: int = 256,
                 inplace: bool = True) -> MemoryPlan:
    """Plan one ``program`` op in place and return the plan."""
    model = build_program(program_op, inplace=inplace)
    memory = plan(model.program, strategy=strategy, alignment=alignment, inplace=inplace)
    apply_plan(model, memory)
    return memory


def buffer_address(op: BufferOp) -> tuple[str, int]:
    """(arena, absolute byte offset) of a planned buffer op, following ``alias_of``."""
    total = 0
    cur: BufferOp = op
    while True:
        if cur.offset is None:
            raise ValueError(f"buffer {cur.result.name_hint or ''} has no offset: run mdsl-plan-memory first")
        total += cur.offset.value.data
        if cur.alias_of is None:
            return cur.arena.data, total
        owner = cur.alias_of.owner
        assert isinstance(owner, BufferOp)
        cur = owner


def programs(module: Operation) -> Iterable[ProgramOp]:
    return [op for op in module.walk() if isinstance(op, ProgramOp)]


@dataclass(frozen=True)
class PlanMemoryPass(ModulePass):
    """Options: ``strategy`` (first-fit, best-fit), ``alignment`` (bytes), ``inplace``."""

    name = "mdsl-plan-memory"

    strategy: str = "first-fit"
    alignment: int = 256
    inplace: bool = True

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        from modeldsl.diagnostics import Diagnostic, DiagnosticError
        from modeldsl.ir import span_of_annotation

        if self.strategy not in STRATEGIES:
            raise DiagnosticError([Diagnostic(
                "E029", f"mdsl-plan-memory: unknown strategy '{self.strategy}'", None,
                f"use one of {', '.join(STRATEGIES)}")])
        if isinstance(self.alignment, bool) or not isinstance(self.alignment, int) or self.alignment <= 0:
            raise DiagnosticError([Diagnostic(
                "E029", f"mdsl-plan-memory: alignment must be a positive integer, got {self.alignment}", None,
                "alignment is in bytes, e.g. alignment=256")])
        for program in programs(op):
            try:
                plan_program(program, strategy=self.strategy, alignment=self.alignment, inplace=self.inplace)
            except LifetimeError as err:
                buffer = build_program(program, inplace=False).buffer_ops[err.buffer]
                raise DiagnosticError([Diagnostic(
                    "E042", f"mdsl-plan-memory: {err}", span_of_annotation(buffer.location, "@lifetime"),
                    "name an op that runs after the tensor is made (end) or before it (start), or give a scope"
                )]) from None
