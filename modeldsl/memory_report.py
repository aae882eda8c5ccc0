"""What a memory plan looks like: ``mdsl-opt --emit=memory-report`` and ``--emit=memory-plot FILE.png``.

Both read a planned ``mdsl.sched`` program (after ``mdsl-plan-memory``, or any
IR whose buffers all have offsets): the offsets come from the IR, the live
steps from the planner's liveness analysis of the same IR (in-place outputs
are aliases by then, so each memory root's interval covers them).
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.ir import Operation

from modeldsl.dialects.sched import ARENAS, LaunchOp, ProgramOp
from modeldsl.passes.plan_memory import (
    FIXED_ARENAS,
    REUSED_ARENAS,
    build_program,
    buffer_address,
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


def format_report(memory: ProgramMemory, top: int = 10) -> str:
    lines = [
        f"memory plan of @{memory.name}: {len(memory.buffers)} buffers, {memory.n_aliases} aliases, "
        f"{memory.n_steps} steps, {memory.n_inplace} in-place launches",
        f"  {'arena':<12} {'bytes':>12}",
    ]
    lines += [f"  {arena:<12} {memory.arenas[arena]:>12}" for arena in ARENAS]
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
    return "\n".join(format_report(program_memory(p), top) for p in _programs_of(module))


def _human(n: float) -> str:
    """Bytes in B, KiB, MiB or GiB, with at most two decimals (1.25 KiB)."""
    for unit in ("B", "KiB", "MiB"):
        if abs(n) < 1024:
            break
        n /= 1024
    else:
        unit = "GiB"
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
    the whole program; unused buffers are left out."""
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
    fig.savefig(path, format="png", dpi=110)
    plt.close(fig)
