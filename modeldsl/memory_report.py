"""What a memory plan looks like: ``mdsl-opt --emit=memory-report`` and ``--emit=memory-plot FILE.png``.

Both read a planned ``mdsl.sched`` program (after ``mdsl-plan-memory``, or any
IR whose buffers all have offsets): the offsets come from the IR, the live
steps from the planner's liveness analysis of the same IR (in-place outputs
are aliases by then, so each memory root's interval covers them).

A training step (a program with a ``grads`` arena) gets a training section
too (:func:`training_memory`, :class:`TrainingMemory`): params, grads, the
AdamW state the optimizer will need (computed: two fp32 moments per trainable
parameter and an fp32 master copy of each 16-bit trainable parameter; the
step program itself holds no optimizer arena), where the frozen base is stored in
bf16 or fp8 (``mdsl-quantize-frozen``) what that saves against fp32 (:class:`StoredBase`:
also a line of every program's report), the saved activations (the
buffers marked ``saved``: forward values the backward reads), the transient
rest of the activations arena, the workspace and their total, and how many of
the step's FLOPs (:mod:`modeldsl.flops`) recompute forward work.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.ir import Operation

from modeldsl.dialects.sched import ARENAS, BufferOp, LaunchOp, ProgramOp, buffer_type
from modeldsl.flops import FlopsUnknown, ProgramFlops, program_flops
from modeldsl.passes.plan_memory import (
    FIXED_ARENAS,
    REUSED_ARENAS,
    buffer_address,
    build_program,
    liveness,
    programs,
)

ARENA_COLORS = {
    "params": "Purples",
    "activations": "Blues",
    "workspace": "Oranges",
    "grads": "Greens",
    "optimizer": "Reds",
    "external": "Greys",
}


class NotPlanned(ValueError):
    """A buffer without an offset: the program has not been planned."""


@dataclass(frozen=True)
class PlacedBuffer:
    """A buffer that owns memory (not an alias): where it is and when it is live."""

    name: str
    arena: str
    nbytes: int
    offset: int
    interval: tuple[int, int] | None


@dataclass(frozen=True)
class ProgramMemory:
    name: str
    arenas: dict[str, int]
    buffers: tuple[PlacedBuffer, ...]
    n_aliases: int
    n_steps: int
    n_inplace: int
    loops: tuple[tuple[int, int, int], ...]  # (first step, last step, layers)
    peak_live_bytes: int
    peak_step: int | None

    @property
    def peak_arena_bytes(self) -> int:
        return sum(self.arenas[a] for a in REUSED_ARENAS)


def program_memory(program: ProgramOp) -> ProgramMemory:
    """The placed buffers of a planned program with their live steps."""
    model = build_program(program, inplace=False)
    live = liveness(model.program)
    placed = []
    for b, op in enumerate(model.buffer_ops):
        if op.alias_of is not None:
            continue
        if op.offset is None:
            raise NotPlanned(
                f"buffer %{op.result.name_hint or b} of @{program.sym_name.data} has no offset: "
                "run mdsl-plan-memory first (-p mdsl-plan-memory)"
            )
        _, offset = buffer_address(op)
        buf = model.program.buffers[b]
        placed.append(PlacedBuffer(buf.name, buf.arena, buf.nbytes, offset, live.interval[b]))
    n_steps = len(model.program.steps)
    delta = [0] * (n_steps + 1)
    for p in placed:
        if p.interval is not None and p.arena in REUSED_ARENAS:
            delta[p.interval[0]] += p.nbytes
            delta[p.interval[1] + 1] -= p.nbytes
    peak, peak_step, running = 0, None, 0
    for s in range(n_steps):
        running += delta[s]
        if running > peak:
            peak, peak_step = running, s
    return ProgramMemory(
        name=program.sym_name.data,
        arenas=program.arenas,
        buffers=tuple(placed),
        n_aliases=len(model.buffer_ops) - len(placed),
        n_steps=n_steps,
        n_inplace=sum(1 for op in model.step_ops if isinstance(op, LaunchOp) and op.inplace is not None),
        loops=tuple((lp.first, lp.last, lp.trips) for lp in model.program.loops if lp.last >= lp.first),
        peak_live_bytes=peak,
        peak_step=peak_step,
    )


def _programs_of(module: Operation) -> list[ProgramOp]:
    found = programs(module)
    if not found:
        raise NotPlanned("no mdsl.sched.program in the input: lower to mdsl.sched (-p mdsl-lower-to-sched) first")
    return found


def format_report(memory: ProgramMemory, top: int = 10, base: StoredBase | None = None) -> str:
    lines = [
        f"memory plan of @{memory.name}: {len(memory.buffers)} buffers, {memory.n_aliases} aliases, "
        f"{memory.n_steps} steps, {memory.n_inplace} in-place launches",
        f"  {'arena':<12} {'bytes':>12}",
    ]
    lines += [f"  {arena:<12} {memory.arenas[arena]:>12}" for arena in ARENAS]
    if base is not None:
        lines.append(f"  {format_base(base)}")
    at = "" if memory.peak_step is None else f" (step {memory.peak_step})"
    lines.append(
        f"peak: {memory.peak_arena_bytes} bytes of arenas ({' + '.join(REUSED_ARENAS)}), "
        f"{memory.peak_live_bytes} bytes live at once{at}"
    )
    largest = sorted(memory.buffers, key=lambda p: (-p.nbytes, p.arena, p.offset, p.name))[:top]
    lines.append(f"largest buffers ({len(largest)} of {len(memory.buffers)}):")
    width = max([len(p.name) + 1 for p in largest] + [6])
    lines.append(f"  {'buffer':<{width}} {'arena':<12} {'bytes':>12} {'offset':>12}  steps")
    for p in largest:
        steps = "-" if p.interval is None else f"[{p.interval[0]}, {p.interval[1]}]"
        lines.append(f"  {'%' + p.name:<{width}} {p.arena:<12} {p.nbytes:>12} {p.offset:>12}  {steps}")
    return "\n".join(lines) + "\n"


def memory_report(module: Operation, top: int = 10) -> str:
    """The report of every program of a module (``--emit=memory-report``)."""
    return "\n".join(program_report(p, top) for p in _programs_of(module))


def program_report(program: ProgramOp, top: int = 10) -> str:
    """The memory plan of one program (with the params its frozen base saves where it is stored
    narrower), and for a training step its training section."""
    text = format_report(program_memory(program), top, stored_base(program))
    if is_training_step(program):
        text += format_training(training_memory(program))
    return text


# ----------------------------------------------------------------------------
# A frozen base stored narrower (mdsl-quantize-frozen)
# ----------------------------------------------------------------------------


@dataclass(frozen=True)
class StoredBase:
    """The weights of a program's ``params`` arena that ``mdsl-quantize-frozen`` stores narrower
    (``base_dtype`` of ``modeldsl.load``): how many values, their bytes as stored, the bytes of their
    fp32 scales (fp8), and what the same values took in fp32. ``saved`` is what the narrower base
    saves against an fp32 one (4 -> 1 byte per value plus 4 bytes per output channel for fp8,
    4 -> 2 for bf16), counted on the buffers (the arena's 256-byte alignment aside)."""

    dtypes: tuple[str, ...]
    weights: int
    values: int
    stored_bytes: int
    scale_bytes: int

    @property
    def fp32_bytes(self) -> int:
        return FP32_BYTES * self.values

    @property
    def saved(self) -> int:
        return self.fp32_bytes - self.stored_bytes - self.scale_bytes


def stored_base(program: ProgramOp) -> StoredBase | None:
    """The stored frozen base of a program's ``params`` buffers (those with a ``quantized``
    dictionary, copied from their parameters by ``mdsl-lower-to-sched``); None without one."""
    dtypes, weights, values, stored, scales = [], 0, 0, 0, 0
    for op in program.body.block.ops:
        info = op.attributes.get("quantized") if isinstance(op, BufferOp) and op.arena.data == "params" else None
        if info is None:
            continue
        role, dtype = (getattr(info.data.get(k), "data", None) for k in ("role", "dtype"))
        btype = buffer_type(op.result)
        if role == "scale":
            scales += btype.nbytes
            continue
        weights += 1
        values += btype.numel
        stored += btype.nbytes
        if dtype not in dtypes:
            dtypes.append(dtype)
    return StoredBase(tuple(dtypes), weights, values, stored, scales) if weights else None


def format_base(base: StoredBase) -> str:
    scales = f" + {base.scale_bytes} bytes of fp32 scales" if base.scale_bytes else ""
    return (f"params hold the frozen base in {'/'.join(base.dtypes)}: {base.weights} weights, {base.values} values "
            f"in {base.stored_bytes} bytes{scales} (fp32: {base.fp32_bytes} bytes; {base.saved} bytes saved)")


# ----------------------------------------------------------------------------
# Training steps
# ----------------------------------------------------------------------------

FP32_BYTES = 4
ADAMW_MOMENTS = 2  # exp_avg and exp_avg_sq, fp32 each
GIB = 1024**3


@dataclass(frozen=True)
class TrainingMemory:
    """The memory of one training step in bytes, and its FLOPs.

    ``optimizer`` is computed (AdamW: two fp32 moments per trainable parameter,
    an fp32 master copy of each 16-bit trainable parameter), not read from the
    program: a step program holds no optimizer arena (``optimizer_arena`` is
    what it does hold). ``transient`` is the activations arena less the saved
    activations, floored at 0. ``flops`` is None where the cost model cannot
    price some op of the program (``flops_unknown`` says which).
    """

    name: str
    params: int
    grads: int
    optimizer: int
    saved: int
    transient: int
    workspace: int
    trainable_parameters: int
    optimizer_arena: int
    flops: ProgramFlops | None
    flops_unknown: str = ""
    base: StoredBase | None = None  # the frozen base stored narrower (base_dtype), None where it is not

    @property
    def params_saved(self) -> int:
        """The bytes of params a base stored in bf16/fp8 saves against an fp32 one (0 without one)."""
        return self.base.saved if self.base is not None else 0

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer + self.saved + self.transient + self.workspace


def is_training_step(program: ProgramOp) -> bool:
    """A program with a ``grads`` arena."""
    return program.arenas["grads"] > 0


def _memory_roots(program: ProgramOp) -> list[BufferOp]:
    """The buffers of a planned program that own memory (not aliases)."""
    roots = [op for op in program.body.block.ops if isinstance(op, BufferOp) and op.alias_of is None]
    for op in roots:
        if op.offset is None:
            raise NotPlanned(
                f"buffer %{op.result.name_hint or '?'} of @{program.sym_name.data} has no offset: "
                "run mdsl-plan-memory first (-p mdsl-plan-memory)"
            )
    return roots


def _root_of(op: BufferOp) -> BufferOp:
    while op.alias_of is not None:
        op = op.alias_of.owner
    return op


def _is_saved(op: BufferOp) -> bool:
    """Marked ``saved``: a forward value the backward reads (a unit attribute or property)."""
    return "saved" in op.attributes or "saved" in op.properties


def _tag(op: BufferOp, name: str) -> str | None:
    """The ``param``/``grad`` name a buffer is tagged with."""
    attr = op.attributes.get(name)
    return getattr(attr, "data", None) if attr is not None else None


def saved_activation_bytes(program: ProgramOp) -> int:
    """The bytes of the activations-arena memory that ``saved`` buffers (or their aliases) occupy."""
    saved = {_root_of(op) for op in program.body.block.ops if isinstance(op, BufferOp) and _is_saved(op)}
    return sum(op.bytes.value.data for op in saved if op.arena.data == "activations")


def adamw_state(program: ProgramOp) -> tuple[int, int]:
    """(trainable parameter count, AdamW state bytes): two fp32 moments per element of every
    ``grad``-tagged buffer, and an fp32 master copy of each trainable parameter stored in 16 bits."""
    roots = _memory_roots(program)
    params = {_tag(op, "param"): op for op in roots if op.arena.data == "params" and _tag(op, "param")}
    trainable, state = 0, 0
    for op in roots:
        name = _tag(op, "grad")
        if name is None:
            continue
        count = buffer_type(op.result).numel
        trainable += count
        state += ADAMW_MOMENTS * FP32_BYTES * count
        param = params.get(name)
        if param is not None and buffer_type(param.result).dtype.bits == 16:
            state += FP32_BYTES * buffer_type(param.result).numel
    return trainable, state


def training_memory(program: ProgramOp) -> TrainingMemory:
    """The training breakdown of a planned program (see :class:`TrainingMemory`)."""
    arenas = program.arenas
    trainable, optimizer = adamw_state(program)
    saved = saved_activation_bytes(program)
    try:
        flops, unknown = program_flops(program), ""
    except FlopsUnknown as err:
        flops, unknown = None, str(err)
    return TrainingMemory(
        name=program.sym_name.data,
        params=arenas["params"],
        grads=arenas["grads"],
        optimizer=optimizer,
        saved=saved,
        transient=max(arenas["activations"] - saved, 0),
        workspace=arenas["workspace"],
        trainable_parameters=trainable,
        optimizer_arena=arenas["optimizer"],
        flops=flops,
        flops_unknown=unknown,
        base=stored_base(program),
    )


def _size_line(label: str, nbytes: int, note: str = "") -> str:
    return f"  {label:<22} {nbytes / GIB:>9.3f} GiB {nbytes:>14} bytes{note}"


def format_recompute(memory: TrainingMemory) -> str:
    if memory.flops is None:
        return f"recompute: FLOPs unknown ({memory.flops_unknown})"
    f = memory.flops
    return f"recompute: {f.recompute} FLOPs of {f.total} ({100 * f.recompute_fraction:.1f}% of the step)"


def format_training(memory: TrainingMemory) -> str:
    """The training section of the report: one line per memory class in GiB and bytes, then recompute."""
    holds = ("the step program holds no optimizer arena" if memory.optimizer_arena == 0
             else f"the program's own optimizer arena holds {memory.optimizer_arena} bytes")
    lines = [
        f"training step @{memory.name}: {memory.trainable_parameters} trainable parameters",
        _size_line("params", memory.params, f"  {format_base(memory.base)}" if memory.base is not None else ""),
        _size_line("grads", memory.grads),
        _size_line("optimizer (AdamW)", memory.optimizer, f"  computed: 2 fp32 moments per trainable parameter "
                                                          f"+ fp32 masters of 16-bit ones; {holds}"),
        _size_line("saved activations", memory.saved),
        _size_line("transient activations", memory.transient),
        _size_line("workspace", memory.workspace),
        _size_line("total", memory.total),
        format_recompute(memory),
    ]
    return "\n".join(lines) + "\n"


def _human(n: float) -> str:
    """Bytes in B, KiB, MiB or GiB, with at most two decimals (1.25 KiB)."""
    units = ["B", "KiB", "MiB", "GiB"]
    while abs(n) >= 1024 and len(units) > 1:
        n /= 1024
        units.pop(0)
    unit = units[0]
    return f"{f'{n:.2f}'.rstrip('0').rstrip('.')} {unit}"


def _tick_step(size: int) -> int:
    """A power of two that puts about four to eight ticks on an axis of ``size`` bytes."""
    step = 1
    while size / step > 8:
        step *= 2
    return step


def plot_memory(module: Operation, path: str) -> None:
    """Draw every placed buffer of every program as a rectangle (``--emit=memory-plot FILE.png``):
    x is the schedule steps start..end+1, y the bytes offset..offset+bytes, one panel per
    non-empty arena. ``params`` and ``external`` buffers are never reused, so they span
    the whole program; unused buffers are left out. The PNG replaces ``path`` atomically."""
    from modeldsl.files import replacing_file

    try:
        import matplotlib
    except ImportError:  # pragma: no cover - matplotlib is a dependency
        raise NotPlanned("--emit=memory-plot needs matplotlib: pip install matplotlib") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle
    from matplotlib.ticker import FuncFormatter, MaxNLocator, MultipleLocator

    panels = []
    for program in _programs_of(module):
        memory = program_memory(program)
        for arena in ARENAS:
            drawn = [p for p in memory.buffers if p.arena == arena and p.nbytes > 0
                     and (p.interval is not None or arena in FIXED_ARENAS)]
            if drawn and memory.arenas[arena] > 0:
                panels.append((memory, arena, drawn))
    if not panels:
        raise NotPlanned("nothing to plot: no program has a buffer with bytes")

    fig, axes = plt.subplots(len(panels), 1, figsize=(12, 2.2 + 2.6 * len(panels)), squeeze=False)
    for ax, (memory, arena, drawn) in zip(axes[:, 0], panels):
        steps = max(memory.n_steps, 1)
        size = memory.arenas[arena]
        cmap = plt.get_cmap(ARENA_COLORS.get(arena, "Greys"))
        for first, last, trips in memory.loops:
            ax.axvspan(first, last + 1, color="#f2f2f2", zorder=0)
            ax.text(first + 0.1, size * 1.01, f"layer_loop x{trips}", fontsize=7, va="bottom", color="#666666")
        for k, p in enumerate(sorted(drawn, key=lambda p: (p.offset, p.name))):
            start, end = (0, steps - 1) if arena in FIXED_ARENAS or p.interval is None else p.interval
            shade = 0.35 + 0.4 * ((k * 0.618) % 1.0)
            ax.add_patch(Rectangle((start, p.offset), end + 1 - start, p.nbytes, facecolor=cmap(shade),
                                   edgecolor="black", linewidth=0.5, zorder=2))
            if (end + 1 - start) / steps > 0.06 and p.nbytes / size > 0.07:
                ax.text(start + (end + 1 - start) / 2, p.offset + p.nbytes / 2, p.name, ha="center",
                        va="center", fontsize=7, zorder=3, clip_on=True)
        ax.set_xlim(0, steps)
        ax.set_ylim(0, size * 1.08)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.yaxis.set_major_locator(MultipleLocator(_tick_step(size)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: _human(v)))
        ax.set_ylabel("offset")
        ax.set_title(f"@{memory.name} {arena}: {_human(size)} ({size} bytes), {len(drawn)} buffers", fontsize=10,
                     loc="left")
        ax.grid(axis="x", color="#dddddd", linewidth=0.5, zorder=1)
    axes[-1, 0].set_xlabel("schedule step")
    fig.tight_layout()
    try:
        with replacing_file(path) as tmp:  # atomically: the old file or the whole new one, nothing else touched
            fig.savefig(tmp, format="png", dpi=110)
    finally:
        plt.close(fig)
