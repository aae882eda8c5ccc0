"""Benchmark (not a test): what each recompute mode saves and costs, computed by the planner.

Run: ``python -m modeldsl.tools.bench_recompute``. Nothing runs on a device: for each model shape
the std model is lowered with the shape's configuration (no weights), its training step is
compiled the way :class:`modeldsl.runtime.train.Trainer` compiles it in mixed precision
(:func:`modeldsl.runtime.train.compile_training_step`, 16-bit activations:
``mdsl-autodiff``, ``mdsl-recompute``, ``mdsl-lower-to-sched{grads_arena=true}``,
``mdsl-plan-memory``) and :func:`modeldsl.memory_report.training_memory` reads the planned
program: the **saved** activations (buffers marked ``saved``: what the backward reads, per layer
in stacked buffers), the **transient** rest of the activations arena, and the step's FLOPs with
those of ``recompute_segment``s (:mod:`modeldsl.flops`).

Shapes: Qwen3-0.6B and Llama-3.2-1B as in ``tools/bench.py`` (B = 8, T = 1024) and Llama-2-7B
(B = 1, T = 4096). Modes: ``none`` (save what the backward reads), ``annotated`` (the std models'
own ``save:`` lists and annotations), ``full`` (every stack checkpointed: each layer saves its
input only) and ``auto`` at two budgets for the saved activations, halfway between ``full``'s and
``none``'s saved bytes and a tenth of the way (tight). Columns: saved, transient and their sum (the
activations arena) in GiB, the arena as a multiple of ``none``'s, the recompute FLOPs as a
percentage of the step, and the step's extra FLOPs over ``none``'s. (``none`` still recomputes
what a written backward's own ``recompute:`` section replays: SwiGLU_MLP's gate/up projection.)

Targets (issue 14), printed as met or missed: ``full`` and the tight ``auto`` keep the activations
arena at <= 0.35x ``none``'s with <= 35% extra step FLOPs; ``auto`` at the halfway budget spends at
most 60% of ``full``'s extra FLOPs. Where the LM head's logits (saved for the loss's backward,
``B x T x vocab``) outweigh the layers, no recompute mode gets under the floor they set: that
takes the chunked fused LM-head loss. A second table times the compile of the Llama-2-7B-shaped training step
at 16, 32 and 64 layers (best of 3): the target is 64 layers <= 1.3x 32 layers.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from typing import Any

from xdsl.context import Context

GiB = float(1 << 30)
MODES = ("none", "annotated", "full")
LLAMA2_7B = dict(vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                 num_attention_heads=32, num_key_value_heads=32, tie_word_embeddings=False,
                 max_position_embeddings=4096, rope_theta=10000.0, rms_norm_eps=1e-5)


@dataclass(frozen=True)
class Shape:
    name: str
    module: str
    hf: dict[str, Any]
    batch: int
    tokens: int


def shapes() -> list[Shape]:
    """The benchmark's shapes, and ``tiny`` (tools/bench.py's, for a quick run)."""
    from modeldsl.tools.bench import SHAPES

    return [Shape("qwen3-0.6b", SHAPES["qwen3-0.6b"][1], SHAPES["qwen3-0.6b"][2], 8, 1024),
            Shape("llama-1b", SHAPES["llama-1b"][1], SHAPES["llama-1b"][2], 8, 1024),
            Shape("llama-2-7b", "llama.module", LLAMA2_7B, 1, 4096),
            Shape("tiny", SHAPES["tiny"][1], SHAPES["tiny"][2], 2, 16)]


@dataclass
class Row:
    shape: str
    mode: str
    saved: int
    transient: int
    flops: int
    recompute: int

    @property
    def arena(self) -> int:
        return self.saved + self.transient


def model_of(shape: Shape, **overrides: Any):
    """The std model of a shape, lowered with its configuration and specialized (no weights)."""
    from modeldsl.diagnostics import DiagnosticSink
    from modeldsl.dialects.graph import ModelOp
    from modeldsl.frontend.text.parser import parse_file
    from modeldsl.lower import choose_top, lower_program
    from modeldsl.passes.specialize import SpecializePass
    from modeldsl.resolve.imports import STD_ROOT
    from modeldsl.runtime.model import hf_config_values

    path = STD_ROOT / "models" / shape.module
    program = parse_file(path)
    top = choose_top(program)
    values = {**hf_config_values(program, top, shape.hf), **overrides}
    module = lower_program(program, top.name, values, DiagnosticSink())
    SpecializePass().apply(Context(), module)
    return next(op for op in module.walk() if isinstance(op, ModelOp))


def measure(shape: Shape, model, mode: str) -> Row:
    from modeldsl.memory_report import training_memory
    from modeldsl.runtime.train import compile_training_step

    memory = training_memory(compile_training_step(model, shape.batch, shape.tokens, None, mode))
    return Row(shape.name, mode, memory.saved, memory.transient, memory.flops.total, memory.flops.recompute)


def rows_of(shape: Shape) -> list[Row]:
    model = model_of(shape)
    rows = [measure(shape, model, mode) for mode in MODES]
    none, full = rows[0], rows[2]
    for fraction, label in ((0.5, "auto (halfway)"), (0.1, "auto (tight)")):
        budget = int(full.saved + fraction * (none.saved - full.saved))
        row = measure(shape, model, f"auto:{budget}")
        row.mode = f"{label} {budget / GiB:.2f} GiB"
        rows.append(row)
    return rows


def verdicts(rows: list[Row]) -> list[str]:
    """The issue's targets, met or missed, for one shape's rows (none, annotated, full, auto halfway,
    auto tight)."""
    none, full, halfway, tight = rows[0], rows[2], rows[3], rows[4]
    lines = []
    for row in (full, tight):
        ratio, extra = row.arena / none.arena, (row.flops - none.flops) / none.flops
        met = ratio <= 0.35 and extra <= 0.35
        lines.append(f"  {row.mode}: arena {ratio:.2f}x none (<= 0.35x), extra FLOPs {extra:.1%} (<= 35%): "
                     f"{'met' if met else 'MISSED'}")
    full_extra, half_extra = full.flops - none.flops, halfway.flops - none.flops
    share = half_extra / full_extra if full_extra else 0.0
    lines.append(f"  {halfway.mode} spends {share:.0%} of full's extra FLOPs (<= 60%): "
                 f"{'met' if share <= 0.6 else 'MISSED'}")
    return lines


def table(all_rows: list[list[Row]]) -> str:
    head = f"{'shape':<12} {'mode':<26} {'saved GiB':>9} {'transient':>9} {'arena GiB':>9} {'x none':>7} " \
           f"{'recompute %':>11} {'extra FLOPs':>11}"
    lines = [head, "-" * len(head)]
    for rows in all_rows:
        none = rows[0]
        for row in rows:
            lines.append(f"{row.shape:<12} {row.mode:<26} {row.saved / GiB:>9.2f} {row.transient / GiB:>9.2f} "
                         f"{row.arena / GiB:>9.2f} {row.arena / none.arena:>7.2f} "
                         f"{100 * row.recompute / row.flops:>10.1f}% "
                         f"{100 * (row.flops - none.flops) / none.flops:>10.1f}%")
        lines += verdicts(rows)
    return "\n".join(lines)


def compile_times(layers: tuple[int, ...] = (16, 32, 64), repeats: int = 3) -> str:
    from modeldsl.runtime.train import compile_training_step

    shape = next(s for s in shapes() if s.name == "llama-2-7b")
    seconds = {}
    for n in layers:
        model = model_of(shape, n_layers=n)
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            compile_training_step(model, shape.batch, shape.tokens, None)
            best = min(best, time.perf_counter() - start)
        seconds[n] = best
    lines = ["compile time of the Llama-2-7B-shaped training step (B=1, T=4096, annotated):"]
    lines += [f"  {n:>3} layers: {s * 1000:8.1f} ms" for n, s in seconds.items()]
    if 32 in seconds and 64 in seconds:
        ratio = seconds[64] / seconds[32]
        lines.append(f"  64 / 32 layers: {ratio:.2f}x (<= 1.3x): {'met' if ratio <= 1.3 else 'MISSED'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m modeldsl.tools.bench_recompute", description=__doc__.split("\n")[0])
    p.add_argument("--shapes", default="qwen3-0.6b,llama-1b,llama-2-7b", help="comma-separated: qwen3-0.6b, "
                   "llama-1b, llama-2-7b, tiny")
    p.add_argument("--compile-layers", default="16,32,64", help="layer counts of the compile-time table ('' skips it)")
    args = p.parse_args(argv)
    chosen = [s for s in shapes() if s.name in args.shapes.split(",")]
    unknown = set(args.shapes.split(",")) - {s.name for s in chosen}
    if unknown:
        print(f"error[E029]: bench_recompute: no shape {', '.join(sorted(unknown))} "
              f"(choose {', '.join(s.name for s in shapes())})", file=sys.stderr)
        return 1
    print(table([rows_of(shape) for shape in chosen]))
    if args.compile_layers:
        print()
        print(compile_times(tuple(int(n) for n in args.compile_layers.split(","))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
