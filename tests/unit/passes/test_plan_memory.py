"""mdsl-plan-memory: the core planner fuzzed over 10^4 random programs, the IR
path over a few hundred, and the reports.

Every random plan is checked two ways: statically (aligned offsets inside their
arenas; memory roots whose intervals meet do not overlap; the same program
plans to the same offsets twice) and by running the program on tagged memory:
each write stamps a fresh tag into the bytes it writes, both in the planned
arenas and in a per-buffer logical copy, and every read must find in the arena
the tags its buffer's logical copy holds (loops unrolled, layer views at their
layer's slice). A write may overlap a read of another buffer at the same step
only where the launch is in-place and the two are the same bytes.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

import numpy as np
import pytest
from xdsl.context import Context
from xdsl.dialects.builtin import IndexType, ModuleOp, UnitAttr
from xdsl.ir import Block, Region

from modeldsl.dialects.sched import (
    BufferOp,
    BufferType,
    CopyOp,
    LaunchOp,
    LayerLoopOp,
    LayerViewOp,
    MemsetOp,
    ProgramOp,
    RecomputeSegmentOp,
)
from modeldsl.ir import verify_module
from modeldsl.kernels.registry import entry
from modeldsl.passes.plan_memory import (
    FIXED_ARENAS,
    REUSED_ARENAS,
    Access,
    Buf,
    Lifetime,
    LifetimeError,
    Loop,
    PlanMemoryPass,
    Program,
    Step,
    buffer_address,
    build_program,
    linear_scan,
    liveness,
    plan,
    plan_program,
)

ARENA_WEIGHTS = {"activations": 6, "workspace": 2, "grads": 2, "params": 1, "external": 2}
SIZES = (0, 1, 64, 100, 256, 300, 512, 1000, 1024, 2048, 3000)
# kernels by in-place rule: none, {0: 0}, rope's {0: 0, 1: 1}
PLAIN, ELEMENTWISE, ADD, ROPE = "matmul", "relu", "add", "rope"


# ----------------------------------------------------------------------------
# Random programs: a spec that becomes the core model or the IR
# ----------------------------------------------------------------------------


@dataclass
class OpSpec:
    kind: str  # launch | memset | copy | rw (read and write one buffer: the core model only)
    reads: list[tuple[int, bool]] = field(default_factory=list)  # (buffer, through a layer view)
    writes: list[tuple[int, bool]] = field(default_factory=list)
    kernel: str = PLAIN
    scratch: bool = False
    nbytes: int | None = None
    loops: tuple[int, ...] = ()


@dataclass
class ProgramSpec:
    buffers: list[Buf]
    ops: list[OpSpec]
    loops: list[Loop]
    slice_bytes: dict[int, int]  # stacked buffer -> bytes of one layer


def random_spec(rng: random.Random, *, ir: bool = False) -> ProgramSpec:
    """A random program: buffers in every arena, aliases at offsets, launches with
    in-place candidates and scratch, values read several times, sometimes a layer
    loop (sometimes nested, sometimes with stacked buffers read through layer views)."""
    arenas = list(ARENA_WEIGHTS)
    weights = list(ARENA_WEIGHTS.values())
    buffers: list[Buf] = []

    def new_buffer(arena: str, nbytes: int) -> int:
        buffers.append(Buf(f"b{len(buffers)}", arena, nbytes))
        return len(buffers) - 1

    for _ in range(rng.randint(2, 12)):
        size = rng.choice(SIZES) if rng.random() < 0.8 else rng.randint(0, 4000)
        new_buffer(rng.choices(arenas, weights)[0], size)
    for _ in range(rng.choice((0, 0, 1, 2, 4, 6))):
        target = rng.randrange(len(buffers))
        t = buffers[target]
        if rng.random() < 0.4:
            off, n = 0, t.nbytes
        else:
            off = rng.randint(0, t.nbytes)
            n = rng.randint(0, t.nbytes - off)
        buffers.append(Buf(f"b{len(buffers)}", t.arena, n, target, off))

    n_steps = rng.randint(1, 22)
    loops: list[Loop] = []
    step_loops: list[tuple[int, ...]] = [()] * n_steps
    slice_bytes: dict[int, int] = {}
    stacked: list[int] = []
    if rng.random() < 0.45 and n_steps >= 2:
        first = rng.randrange(n_steps)
        last = rng.randint(first, n_steps - 1)
        trips = rng.choice((0, 1, 2, 2, 3, 3))
        lower = rng.choice((0, 0, 1))
        loops.append(Loop(first, last, trips, lower, rng.random() < 0.3))
        for s in range(first, last + 1):
            step_loops[s] = (0,)
        if rng.random() < 0.25 and last > first:
            f2 = rng.randint(first, last)
            l2 = rng.randint(f2, last)
            loops.append(Loop(f2, l2, rng.choice((0, 1, 2)), 0, rng.random() < 0.5))
            for s in range(f2, l2 + 1):
                step_loops[s] = (0, 1)
        layers = max(lp.lower + lp.trips for lp in loops) or 1
        for _ in range(rng.choice((0, 1, 2))):
            piece = rng.choice((64, 100, 256, 1024))
            b = new_buffer(rng.choice(("activations", "activations", "params", "grads")), layers * piece)
            slice_bytes[b] = piece
            stacked.append(b)

    touched: list[int] = []
    chain: list[int] = []
    ops: list[OpSpec] = []
    plain = [b for b in range(len(buffers)) if b not in slice_bytes]
    for s in range(n_steps):
        in_loop = bool(step_loops[s])

        def operand(chain: list[int] = chain, in_loop: bool = in_loop) -> tuple[int, bool]:
            if chain and rng.random() < 0.35:  # the value just made: chains of single uses
                return chain[-1], False
            if in_loop and stacked and rng.random() < 0.2:
                return rng.choice(stacked), True
            if touched and rng.random() < 0.7:
                return rng.choice(touched), False
            return rng.choice(plain), False

        def fresh_like(size: int | None) -> tuple[int, bool]:
            unused = [b for b in plain if b not in touched and buffers[b].alias_of is None
                      and (size is None or buffers[b].nbytes == size)]
            if unused and rng.random() < 0.7:
                return rng.choice(unused), False
            if rng.random() < 0.3 and size is not None:
                return new_buffer(rng.choices(arenas, weights)[0] if rng.random() < 0.2 else "activations",
                                  size), False
            return operand()

        r = rng.random()
        if r < 0.1:
            op = OpSpec("memset", writes=[operand()])
        elif r < 0.22:
            src, dst = operand(), operand()
            if (ir and src == dst) or (src[1] != dst[1] and rng.random() < 0.5):
                dst = fresh_like(None)
            ns = slice_bytes[src[0]] if src[1] else buffers[src[0]].nbytes
            nd = slice_bytes[dst[0]] if dst[1] else buffers[dst[0]].nbytes
            if (ir and src == dst) or min(ns, nd) == 0:
                op = OpSpec("memset", writes=[dst])
            else:
                nbytes = None if ns == nd and rng.random() < 0.7 else rng.randint(1, min(ns, nd))
                op = OpSpec("copy", reads=[src], writes=[dst], nbytes=nbytes)
        elif r < 0.27 and not ir:
            op = OpSpec("rw", reads=[operand()])
        else:
            kernel = rng.choice((PLAIN, ELEMENTWISE, ELEMENTWISE, ADD, ROPE))
            n_in = {PLAIN: rng.randint(0, 3), ELEMENTWISE: 1, ADD: 2, ROPE: 3}[kernel]
            n_out = {PLAIN: rng.randint(1, 2), ELEMENTWISE: 1, ADD: 1, ROPE: 2}[kernel]
            reads = [operand() for _ in range(n_in)]
            writes = []
            for k in range(n_out):
                like = reads[k] if k < len(reads) and not reads[k][1] else None
                writes.append(fresh_like(buffers[like[0]].nbytes if like else None))
            if ir:  # an output may not be an input of a launch that is not marked inplace
                writes = [w if w not in reads else fresh_like(None) for w in writes]
                writes = [w if w not in reads else (new_buffer("activations", 64), False) for w in writes]
            scratch = rng.random() < 0.15
            if scratch:
                writes.append((new_buffer("workspace", rng.choice((16, 100, 2000))), False))
            op = OpSpec("launch", reads, writes, kernel, scratch)
        op.loops = step_loops[s]
        chain += [b for b, view in op.writes[:1] if not view]
        for b, _ in op.reads + op.writes:
            if b not in touched:
                touched.append(b)
        ops.append(op)
    return ProgramSpec(buffers, ops, loops, slice_bytes)


def spec_to_program(spec: ProgramSpec) -> Program:
    """The core model of a spec, with the registry's in-place candidates, as the pass builds it."""
    steps = []
    for op in spec.ops:
        def acc(b: int, view: bool, read: bool, write: bool, nbytes: int | None = None, *, op: OpSpec = op) -> Access:
            if view:
                return Access(b, read, write, spec.slice_bytes[b], True, op.loops[-1])
            return Access(b, read, write, nbytes)

        if op.kind == "rw":
            accesses = (acc(*op.reads[0], True, True),)
            steps.append(Step(accesses, op.loops))
            continue
        accesses = tuple([acc(b, v, True, False, op.nbytes) for b, v in op.reads]
                         + [acc(b, v, False, True, op.nbytes) for b, v in op.writes])
        reuse = ()
        if op.kind == "launch":
            n_in, n_out = len(op.reads), len(op.writes) - op.scratch
            rule = entry(op.kernel).reuse
            reuse = tuple((n_in + o, i) for o, i in sorted(rule.items()) if o < n_out and i < n_in)
        steps.append(Step(accesses, op.loops, reuse))
    return Program(tuple(spec.buffers), tuple(steps), tuple(spec.loops))


def spec_to_ir(spec: ProgramSpec) -> ModuleOp:
    """The spec as a program op: buffers first (int8 vectors; stacked ones [layers, slice]),
    then the work ops, loops nested, a layer_view before each use of a stacked buffer,
    some ops in recompute segments."""
    program = ProgramOp("fuzz")
    top = program.body.block
    values = []
    for b, buf in enumerate(spec.buffers):
        if b in spec.slice_bytes:
            t = BufferType([buf.nbytes // spec.slice_bytes[b], spec.slice_bytes[b]], "int8")
        else:
            t = BufferType([buf.nbytes], "int8")
        alias = None if buf.alias_of is None else values[buf.alias_of]
        op = BufferOp(buf.arena, t, buf.offset if alias is not None else None, buf.nbytes, alias)
        op.result.name_hint = buf.name
        top.add_op(op)
        values.append(op.result)

    blocks: list[Block] = [top]
    open_loops: list[int] = []
    for k, op in enumerate(spec.ops):
        while len(open_loops) > len(op.loops) or open_loops != list(op.loops[: len(open_loops)]):
            open_loops.pop()
            blocks.pop()
        while len(open_loops) < len(op.loops):
            lid = op.loops[len(open_loops)]
            lp = spec.loops[lid]
            loop = LayerLoopOp(lp.lower, lp.lower + lp.trips, reverse=lp.reverse)
            blocks[-1].add_op(loop)
            blocks.append(loop.body.block)
            open_loops.append(lid)
        block = blocks[-1]
        if k % 5 == 3:
            seg = RecomputeSegmentOp(f"seg{k}")
            block.add_op(seg)
            block = seg.body.block

        def value(b: int, view: bool, block=block):
            if not view:
                return values[b]
            v = LayerViewOp(values[b], blocks[-1].args[0])
            block.add_op(v)
            return v.result

        reads = [value(b, v) for b, v in op.reads]
        writes = [value(b, v) for b, v in op.writes]
        if op.kind == "memset":
            block.add_op(MemsetOp(writes[0]))
        elif op.kind == "copy":
            block.add_op(CopyOp(reads[0], writes[0], nbytes=op.nbytes))
        else:
            launch = LaunchOp(op.kernel, reads, writes)
            if op.scratch:
                launch.attributes["scratch"] = UnitAttr()
            block.add_op(launch)
    return ModuleOp([program])


# ----------------------------------------------------------------------------
# Checks
# ----------------------------------------------------------------------------


def roots_of(buffers) -> tuple[list[int], list[int]]:
    """Root and offset in it of every buffer (written here again, independently of the planner)."""
    root, offset = [], []
    for b, buf in enumerate(buffers):
        if buf.alias_of is None:
            root.append(b)
            offset.append(0)
        else:
            root.append(root[buf.alias_of])
            offset.append(offset[buf.alias_of] + buf.offset)
    return root, offset


def executed_steps(program: Program):
    """(step, {loop: layer}) in execution order, loops unrolled."""
    steps, loops = program.steps, program.loops

    def run(lo: int, hi: int, depth: int, env: dict[int, int]):
        s = lo
        while s <= hi:
            inner = steps[s].loops
            if len(inner) > depth:
                lid = inner[depth]
                lp = loops[lid]
                layers = list(range(lp.lower, lp.lower + lp.trips))
                for layer in reversed(layers) if lp.reverse else layers:
                    yield from run(s, lp.last, depth + 1, {**env, lid: layer})
                s = lp.last + 1
            else:
                yield s, env
                s += 1

    yield from run(0, len(steps) - 1, 0, {})


def simulate(program: Program, addresses, arenas: dict[str, int], inplace_ok, intervals=None) -> None:
    """Run the program on tagged memory (see the module doc); ``inplace_ok(step)``
    says whether a write may cover an identical read of another buffer there."""
    buffers = program.buffers
    root, root_off = roots_of(buffers)
    phys = {a: np.zeros(max(size, 1), dtype=np.int64) for a, size in arenas.items()}
    logical = {b: np.zeros(buf.nbytes, dtype=np.int64) for b, buf in enumerate(buffers) if buf.alias_of is None}
    tag = 1
    for b, buf in enumerate(buffers):
        if buf.alias_of is None and buf.arena in FIXED_ARENAS and buf.nbytes:
            logical[b][:] = tag
            phys[buf.arena][addresses[b]:addresses[b] + buf.nbytes] = tag
            tag += 1
    for s, env in executed_steps(program):
        step = program.steps[s]
        spans = []
        for acc in step.accesses:
            buf = buffers[acc.buffer]
            n = buf.nbytes if acc.nbytes is None else acc.nbytes
            shift = env[acc.layer_loop] * n if acc.view else 0
            lo = addresses[acc.buffer] + shift
            assert 0 <= lo and lo + n <= arenas[buf.arena], f"step {s}: {buf.name} outside its arena"
            spans.append((buf.arena, lo, lo + n, root[acc.buffer], root_off[acc.buffer] + shift))
            if intervals is not None:
                iv = intervals[acc.buffer]
                assert iv is not None and iv[0] <= s <= iv[1], f"step {s} uses {buf.name} outside {iv}"
        for k, acc in enumerate(step.accesses):
            if not acc.write:
                continue
            arena, lo, hi, r, _ = spans[k]
            for j, other in enumerate(step.accesses):
                a2, lo2, hi2, r2, _ = spans[j]
                if j == k or a2 != arena or r2 == r or hi <= lo or hi2 <= lo2 or hi <= lo2 or hi2 <= lo:
                    continue
                same = other.read and not other.write and (lo, hi) == (lo2, hi2) and inplace_ok(s)
                assert same, f"step {s}: {buffers[acc.buffer].name} overlaps {buffers[other.buffer].name}"
        for k, acc in enumerate(step.accesses):
            if acc.read:
                arena, lo, hi, r, llo = spans[k]
                want = logical[r][llo:llo + hi - lo]
                got = phys[arena][lo:hi]
                mask = want != 0
                assert np.array_equal(got[mask], want[mask]), (
                    f"step {s}: {buffers[acc.buffer].name} was overwritten before this read")
        for k, acc in enumerate(step.accesses):
            if acc.write:
                arena, lo, hi, r, llo = spans[k]
                logical[r][llo:llo + hi - lo] = tag
                phys[arena][lo:hi] = tag
                tag += 1


def check_plan(program: Program, memory, alignment: int) -> None:
    buffers = program.buffers
    arenas = memory.arenas
    for b, buf in enumerate(buffers):
        assert 0 <= memory.addresses[b] and memory.addresses[b] + buf.nbytes <= arenas[buf.arena]
        if memory.alias_of[b] is None:
            assert memory.offsets[b] % alignment == 0
    owners = [b for b in range(len(buffers)) if memory.alias_of[b] is None and buffers[b].nbytes]
    for arena in REUSED_ARENAS + FIXED_ARENAS:
        mine = sorted((memory.addresses[b], b) for b in owners if buffers[b].arena == arena)
        for i, (lo, b) in enumerate(mine):
            for lo2, b2 in mine[i + 1:]:
                if lo2 >= lo + buffers[b].nbytes:
                    break
                if arena in REUSED_ARENAS:
                    iv, iv2 = memory.intervals[b], memory.intervals[b2]
                    assert iv is None or iv2 is None or iv[1] < iv2[0] or iv2[1] < iv[0], (
                        f"{buffers[b].name} {iv} and {buffers[b2].name} {iv2} overlap in {arena}")
                else:
                    raise AssertionError(f"{buffers[b].name} and {buffers[b2].name} overlap in {arena}")
    inplace_steps = {d.step for d in memory.inplace}
    simulate(program, memory.addresses, arenas, inplace_steps.__contains__, memory.intervals)


# ----------------------------------------------------------------------------
# The core planner
# ----------------------------------------------------------------------------


def test_fuzz_core_planner_over_ten_thousand_random_programs():
    started = time.perf_counter()
    stats = {"inplace": 0, "loops": 0, "views": 0}
    for seed in range(10_000):
        rng = random.Random(seed)
        program = spec_to_program(random_spec(rng))
        strategy = "best-fit" if seed % 3 == 2 else "first-fit"
        alignment = (256, 64, 1, 100)[seed % 4]
        inplace = seed % 7 != 0
        try:
            memory = plan(program, strategy=strategy, alignment=alignment, inplace=inplace)
            check_plan(program, memory, alignment)
            assert plan(program, strategy=strategy, alignment=alignment, inplace=inplace) == memory
        except AssertionError as err:
            raise AssertionError(f"seed {seed} ({strategy}, alignment {alignment}, inplace {inplace}): {err}\n"
                                 f"{program}") from None
        stats["inplace"] += len(memory.inplace)
        stats["loops"] += bool(program.loops)
        stats["views"] += any(a.view for st in program.steps for a in st.accesses)
    # the programs exercise what they are meant to
    assert stats["inplace"] > 3000 and stats["loops"] > 3000 and stats["views"] > 1000, stats
    print(f"core fuzz: 10^4 programs in {time.perf_counter() - started:.1f} s, {stats}")


def test_same_program_plans_to_the_same_offsets_when_rebuilt():
    for seed in range(50):
        a = plan(spec_to_program(random_spec(random.Random(seed))))
        b = plan(spec_to_program(random_spec(random.Random(seed))))
        assert a == b


def test_linear_scan_first_fit_and_best_fit():
    items = [(0, 2, 2048), (0, 5, 1024), (1, 2, 1024), (1, 5, 1024), (3, 4, 1024)]
    assert linear_scan(items, 256, "first-fit") == ([0, 2048, 3072, 4096, 0], 5120)
    assert linear_scan(items, 256, "best-fit") == ([0, 2048, 3072, 4096, 3072], 5120)
    # alignment rounds every offset up; the arena ends at the last byte used
    assert linear_scan([(0, 1, 100), (0, 1, 100)], 64) == ([0, 128], 228)
    with pytest.raises(ValueError):
        linear_scan(items, 256, "worst-fit")


def test_chained_inplace_counts_deaths_on_the_programs_own_aliases():
    # x -> exp -> a -> relu -> b -> relu -> c; b and c live in a, whose memory lives [0, 3]
    t = 1024
    program = Program(
        (Buf("x", "external", t), Buf("a", "activations", t), Buf("b", "activations", t),
         Buf("c", "activations", t), Buf("y", "external", t)),
        (Step((Access(0, read=True), Access(1, write=True)), reuse=((1, 0),)),
         Step((Access(1, read=True), Access(2, write=True)), reuse=((1, 0),)),
         Step((Access(2, read=True), Access(3, write=True)), reuse=((1, 0),)),
         Step((Access(3, read=True), Access(4, write=True)))),
    )
    memory = plan(program)
    assert [(d.step, d.output, d.root) for d in memory.inplace] == [(1, 2, 1), (2, 3, 1)]
    assert memory.alias_of == (None, None, 1, 1, None)
    assert memory.intervals[1] == memory.intervals[3] == (0, 3)
    assert memory.arenas["activations"] == t


def test_a_noalias_buffer_shares_its_storage_in_place_with_no_other():
    # the chain of the test above: with b @noalias, b takes no memory over (nor c b's), so the
    # relu into b and the relu out of it each get a buffer of their own
    t = 1024

    def program(noalias: int | None) -> Program:
        bufs = [Buf(n, "activations" if n in "abc" else "external", t, noalias=n == noalias) for n in "xabcy"]
        return Program(tuple(bufs), (
            Step((Access(0, read=True), Access(1, write=True)), reuse=((1, 0),)),
            Step((Access(1, read=True), Access(2, write=True)), reuse=((1, 0),)),
            Step((Access(2, read=True), Access(3, write=True)), reuse=((1, 0),)),
            Step((Access(3, read=True), Access(4, write=True)))))

    assert [(d.output, d.root) for d in plan(program(None)).inplace] == [(2, 1), (3, 1)]
    assert plan(program("b")).inplace == ()
    assert [(d.output, d.root) for d in plan(program("c")).inplace] == [(2, 1)]


def test_liveness_of_loops():
    # step 0 outside; loop 1..3 (steps 1-3); step 4 outside
    t = 256
    bufs = (Buf("carried", "activations", t), Buf("local", "activations", t), Buf("stack", "activations", 3 * t),
            Buf("out", "activations", t), Buf("late", "activations", t))
    steps = (
        Step((Access(0, write=True),)),
        Step((Access(0, read=True), Access(1, write=True)), (0,)),
        Step((Access(1, read=True), Access(2, write=True, nbytes=t, view=True, layer_loop=0)), (0,)),
        Step((Access(1, read=True), Access(0, write=True), Access(4, write=True)), (0,)),
        Step((Access(2, read=True), Access(3, write=True))),
    )
    live = liveness(Program(bufs, steps, (Loop(1, 3, 3),)))
    assert live.interval[:5] == ((0, 3), (1, 3), (1, 4), (4, 4), (3, 3))
    assert live.loop_live[0] == {0} and live.loop_live[1] == set() and live.loop_live[2] == {0}
    # written in the body and never read: per-layer, a one-step interval
    assert live.loop_live[4] == set()


def test_a_declared_lifetime_grows_the_interval_and_never_shrinks_it():
    # step 0 outside; a loop over steps 1..3 (3 layers); step 4 outside. h is made at step 1 and
    # read at step 2; the steps are named for @lifetime's start and end.
    t = 256
    names = ("embedding", "matmul", "silu", "add", "matmul")
    steps = (
        Step((Access(0, write=True),), (), (), names[0]),
        Step((Access(0, read=True), Access(1, write=True)), (0,), (), names[1]),
        Step((Access(1, read=True), Access(2, write=True)), (0,), (), names[2]),
        Step((Access(2, read=True), Access(0, write=True)), (0,), (), names[3]),
        Step((Access(0, read=True), Access(3, write=True)), (), (), names[4]),
    )

    def interval_of_h(lifetime: Lifetime | None) -> tuple[int, int]:
        bufs = (Buf("x", "activations", t), Buf("h", "activations", t, lifetime=lifetime),
                Buf("a", "activations", t), Buf("y", "activations", t))
        return liveness(Program(bufs, steps, (Loop(1, 3, 3),))).interval[1]

    assert interval_of_h(None) == interval_of_h(Lifetime("operation")) == interval_of_h(Lifetime("sublayer")) == (1, 2)
    assert interval_of_h(Lifetime("layer")) == interval_of_h(Lifetime("block")) == (1, 3)  # its layer iteration
    assert interval_of_h(Lifetime("global")) == (0, 4)
    assert interval_of_h(Lifetime(start="matmul", end="add")) == (1, 3)
    assert interval_of_h(Lifetime(start="embedding", end="matmul")) == (0, 4)  # the first matmul after h's last use
    assert interval_of_h(Lifetime(start="matmul", end="silu")) == (1, 2)  # never shrinks
    with pytest.raises(LifetimeError, match="no softmax runs after %h is made"):
        interval_of_h(Lifetime(start="matmul", end="softmax"))


# ----------------------------------------------------------------------------
# The IR path
# ----------------------------------------------------------------------------


def assert_defined_before_used(program: ProgramOp) -> None:
    """Every buffer value is defined before its first use in the walk (xDSL's
    verifier does not check dominance inside a block)."""
    seen = set()
    for op in program.body.walk():
        for operand in op.operands:
            if isinstance(operand.type, BufferType):
                assert operand in seen, f"{op.name} uses a buffer before its definition"
        seen.update(op.results)


def test_fuzz_ir_path_over_random_programs():
    started = time.perf_counter()
    inplace = 0
    for seed in range(300):
        rng = random.Random(10**6 + seed)
        module = spec_to_ir(random_spec(rng, ir=True))
        assert verify_module(module) == [], seed
        (program,) = [op for op in module.walk() if isinstance(op, ProgramOp)]
        before = build_program(program)
        expected = plan(before.program)
        strategy = "best-fit" if seed % 2 else "first-fit"
        if strategy == "best-fit":
            expected = plan(before.program, strategy=strategy)
        twin = module.clone()
        PlanMemoryPass(strategy=strategy).apply(Context(), module)
        problems = verify_module(module)
        assert problems == [], (seed, [p.message for p in problems])
        assert_defined_before_used(program)
        # the IR holds the core plan: offsets, in-place aliases, arena sizes
        addresses = tuple(buffer_address(op)[1] for op in before.buffer_ops)
        assert addresses == expected.addresses, seed
        assert program.arenas == expected.arenas, seed
        for d in expected.inplace:
            assert before.step_ops[d.step].attributes.get("inplace") == UnitAttr()
            assert before.buffer_ops[d.output].alias_of == before.buffer_ops[d.root].result
        inplace += len(expected.inplace)
        # the original program runs correctly on the planned memory of the IR
        steps_inplace = {s for s, op in enumerate(before.step_ops) if op.attributes.get("inplace") is not None}
        try:
            simulate(before.program, addresses, program.arenas, steps_inplace.__contains__)
        except AssertionError as err:
            raise AssertionError(f"seed {seed}: {err}\n{module}") from None
        # deterministic, and a second run keeps the plan
        PlanMemoryPass(strategy=strategy).apply(Context(), twin)
        assert str(twin) == str(module), seed
        if seed % 10 == 0:
            again = module.clone()
            PlanMemoryPass(strategy=strategy).apply(Context(), again)
            assert str(again) == str(module), seed
    assert inplace > 50
    print(f"IR fuzz: 300 programs in {time.perf_counter() - started:.1f} s")


def test_an_inplace_output_declared_before_its_root_moves_after_it():
    t = BufferType([64], "fp32")
    program = ProgramOp("p")
    block = program.body.block
    x = BufferOp("external", t)
    out = BufferOp("activations", t)
    a = BufferOp("activations", t)
    view = BufferOp("activations", BufferType([2, 32], "fp32"), 0, 256, out.result)
    for op in (x, out, view, a):
        block.add_op(op)
    block.add_op(LaunchOp("silu", [x.result], [a.result]))
    block.add_op(LaunchOp("relu", [a.result], [out.result]))
    block.add_op(CopyOp(view.result, x.result))
    module = ModuleOp([program])
    memory = plan_program(program)
    assert verify_module(module) == []
    assert_defined_before_used(program)
    order = [op for op in block.ops if isinstance(op, BufferOp)]
    assert order == [x, a, out, view]
    assert out.alias_of == a.result and [d.output for d in memory.inplace] == [1]
    assert buffer_address(view) == ("activations", 0)


def test_a_program_without_buffers_gets_zero_arenas():
    program = ProgramOp("empty", {"activations": 64})
    plan_program(program)
    assert program.arenas == dict.fromkeys(program.arenas, 0)


def test_buffer_address_needs_a_plan():
    op = BufferOp("activations", BufferType([4], "fp32"))
    with pytest.raises(ValueError, match="run mdsl-plan-memory"):
        buffer_address(op)


def test_layer_loop_op_trip_count_and_view_loop_are_read_from_the_ir():
    t = BufferType([3, 16], "int8")
    program = ProgramOp("p")
    top = program.body.block
    stack = BufferOp("activations", t)
    x = BufferOp("external", BufferType([16], "int8"))
    top.add_op(stack)
    top.add_op(x)
    loop = LayerLoopOp(1, 3, Region(Block(arg_types=[IndexType()])), reverse=True)
    top.add_op(loop)
    view = LayerViewOp(stack.result, loop.body.block.args[0])
    loop.body.block.add_op(view)
    loop.body.block.add_op(CopyOp(x.result, view.result))
    model = build_program(program)
    assert model.program.loops == (Loop(0, 0, 2, 1, True),)
    assert model.program.steps[0].accesses[1] == Access(0, False, True, 16, True, 0)


# ----------------------------------------------------------------------------
# Reports
# ----------------------------------------------------------------------------


def planned_llama():
    from pathlib import Path

    from modeldsl.frontend.text.parser import parse_source
    from modeldsl.ir import make_context
    from modeldsl.lower import lower_program
    from modeldsl.passes.registry import PASSES
    from modeldsl.passes.specialize import SpecializePass
    from modeldsl.resolve.imports import STD_ROOT

    path = STD_ROOT / "models" / "llama.module"
    config = {"vocab_size": 64, "d_model": 32, "n_layers": 2, "num_heads": 4, "num_kv_heads": 2, "head_dim": 8,
              "d_ff": 48}
    module = lower_program(parse_source(Path(path).read_text(), str(path)), "Llama", config)
    ctx = make_context()
    SpecializePass.of(B=1, T=8).apply(ctx, module)
    PASSES["mdsl-lower-to-sched"]()().apply(ctx, module)
    PlanMemoryPass().apply(ctx, module)
    return module


def test_memory_report_of_a_planned_model():
    from modeldsl.memory_report import memory_report, program_memory

    module = planned_llama()
    text = memory_report(module)
    (program,) = [op for op in module.walk() if isinstance(op, ProgramOp)]
    memory = program_memory(program)
    lines = text.splitlines()
    assert lines[0].startswith(f"memory plan of @{program.sym_name.data}: ")
    for arena, size in program.arenas.items():
        assert f"  {arena:<12} {size:>12}" in lines
    peak = sum(program.arenas[a] for a in REUSED_ARENAS)
    assert f"peak: {peak} bytes of arenas (activations + workspace), {memory.peak_live_bytes} bytes" in text
    assert 0 < memory.peak_live_bytes <= peak
    rows = lines[lines.index(next(line for line in lines if line.startswith("largest buffers"))) + 2:]
    assert len(rows) == 10
    sizes = [int(row.split()[2]) for row in rows]
    assert sizes == sorted(sizes, reverse=True) and sizes[0] == max(b.nbytes for b in memory.buffers)
    assert "%embedding" in text


def test_memory_plot_is_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    from modeldsl.memory_report import plot_memory
    from modeldsl.tools.opt import main

    module = planned_llama()
    out = tmp_path / "plan.png"
    plot_memory(module, str(out))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # and through mdsl-opt
    src = tmp_path / "prog.mlir"
    src.write_text(str(module))
    cli = tmp_path / "cli.png"
    assert main([str(src), "-p", "mdsl-plan-memory", "--emit=memory-plot", str(cli)]) == 0
    assert cli.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main([str(src), "--emit", "memory-plot", f"{tmp_path / 'b.png'}"]) == 0
    assert (tmp_path / "b.png").exists()


def test_split_plot_file_argument_forms():
    from modeldsl.tools.opt import split_plot_file

    assert split_plot_file(["a.mlir", "--emit=memory-plot", "x.png"]) == [
        "a.mlir", "--emit=memory-plot", "--plot-file", "x.png"]
    assert split_plot_file(["--emit", "memory-plot", "x.png", "a.mlir"]) == [
        "--emit=memory-plot", "--plot-file", "x.png", "a.mlir"]
    assert split_plot_file(["--emit=memory-plot=x.png", "a.mlir"]) == [
        "--emit=memory-plot", "--plot-file", "x.png", "a.mlir"]
    assert split_plot_file(["--emit=memory-plot", "a.mlir"]) == ["--emit=memory-plot", "a.mlir"]
    assert split_plot_file(["--emit=ir", "a.mlir"]) == ["--emit=ir", "a.mlir"]
