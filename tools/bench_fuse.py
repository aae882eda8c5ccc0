"""Benchmark (not a test): what each ``mdsl-fuse`` pattern saves, in one run.

Run: ``python -m modeldsl.tools.bench_fuse``. For the training step of each shape (compiled as
:func:`modeldsl.runtime.train.compile_training_step` compiles it: ``annotated`` recompute,
16-bit activations on the GPU shapes) with fusion **off**, **each pattern alone** and **all
on**, it prints:

* for ``tools/bench.py``'s GPU shapes (``qwen3-0.6b`` and ``llama-1b``, batch 8 x 1024 tokens),
  nothing executed: launches, bytes moved, FLOPs and roofline time of the planned schedule by the
  cost model (:mod:`modeldsl.cost`, H100 SXM peaks: an estimate, not a measurement), the planned
  activations + workspace arenas, and whether a ``[B*T, vocab]`` logits buffer is in the plan;
* for the ``tiny`` shape on the CPU (fp32, random weights), the same columns and the measured
  step time of the schedule executor, each variant timed in alternation with the others
  (``--rounds`` rounds, the median kept; BLAS threads set to one, the machine is shared).

Ratios are against fusion off in the same run. Targets (issue 15), printed as met or missed:
all on moves <= 0.6x the bytes of all off at the Llama-1B shape, and no logits buffer is planned
with all on.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass

GiB = float(1 << 30)
GPU_SHAPES = ("qwen3-0.6b", "llama-1b")
BATCH, TOKENS = 8, 1024
TINY_BATCH, TINY_TOKENS = 2, 16


@dataclass
class Row:
    shape: str
    variant: str
    launches: int
    bytes: int
    flops: int
    seconds: float
    arena: int
    logits_planned: bool
    step_ms: float | None = None


def variants() -> list[tuple[str, object]]:
    """(name, the ``fuse`` argument of compile_training_step): off, each pattern alone, all on."""
    from modeldsl.passes.fuse import PATTERNS, FusePass

    alone = [(name, FusePass(disable=tuple(p for p in PATTERNS if p != name))) for name in PATTERNS]
    return [("off", False), *alone, ("all on", FusePass())]


def logits_planned(program) -> bool:
    """Whether the plan computes logits: a GEMM by the transposed LM head (or the tied embedding)."""
    from modeldsl.dialects.sched import BufferOp, GemmOp

    heads = {op.result for op in program.walk() if isinstance(op, BufferOp)
             and getattr(op.attributes.get("param"), "data", None) in ("lm_head", "embedding")}
    return any(isinstance(op, GemmOp) and op.b in heads and op.transb.value.data for op in program.walk())


def measure(shape: str, model, batch: int, tokens: int, storage: str | None, fuse) -> tuple[object, Row]:
    from modeldsl.cost import program_cost
    from modeldsl.runtime.train import compile_training_step

    program = compile_training_step(model, batch, tokens, storage, "annotated", fuse=fuse)
    cost = program_cost(program).total
    arenas = program.arenas
    return program, Row(shape, "", cost.launches, cost.bytes, cost.flops, cost.seconds,
                        arenas["activations"] + arenas["workspace"], logits_planned(program))


def gpu_rows(shape: str) -> list[Row]:
    from modeldsl.tools.bench import SHAPES
    from modeldsl.tools.bench_recompute import Shape, model_of

    model = model_of(Shape(shape, SHAPES[shape][1], SHAPES[shape][2], BATCH, TOKENS))
    rows = []
    for name, fuse in variants():
        _, row = measure(shape, model, BATCH, TOKENS, None, fuse)
        row.variant = name
        rows.append(row)
    return rows


def tiny_rows(rounds: int) -> list[Row]:
    """The tiny Llama on the CPU: the cost columns and the measured step time, variants alternated."""
    import numpy as np

    from modeldsl.runtime.threads import set_pool_size
    from modeldsl.tools.bench import SHAPES, dsl_model

    set_pool_size(1)  # one BLAS thread: the machine is shared, the tiny products gain nothing from more
    model = dsl_model("tiny")
    vocab = SHAPES["tiny"][2]["vocab_size"]
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, vocab, size=(TINY_BATCH, TINY_TOKENS)).astype(np.int32)
    labels = np.roll(tokens, -1, axis=1).astype(np.int64)
    runs, rows = [], []
    for name, fuse in variants():
        program, row = measure("tiny (CPU)", model.model, TINY_BATCH, TINY_TOKENS, "fp32", fuse)
        row.variant = name
        executor = model.schedule.executor(program)
        arguments = (*model.inputs(tokens, 0), labels, np.array(1.0, dtype=np.float32))
        runs.append((executor, arguments, []))
        rows.append(row)
    for executor, arguments, _ in runs:
        executor.execute(*arguments)  # warm-up
    for _ in range(rounds):
        for executor, arguments, times in runs:
            start = time.perf_counter()
            executor.execute(*arguments)
            times.append(time.perf_counter() - start)
    for row, (_, _, times) in zip(rows, runs):
        row.step_ms = 1e3 * statistics.median(times)
    return rows


def table(rows: list[Row]) -> str:
    head = (f"{'shape':<12} {'variant':<18} {'launches':>8} {'GB moved':>9} {'x off':>6} {'TFLOP':>8} "
            f"{'roofline ms':>11} {'x off':>6} {'arena GiB':>9} {'logits':>6} {'step ms':>8} {'x off':>6}")
    lines = [head, "-" * len(head)]
    off = None
    for row in rows:
        off = row if row.variant == "off" else off
        step = f"{row.step_ms:>8.2f} {row.step_ms / off.step_ms:>6.2f}" if row.step_ms else f"{'-':>8} {'-':>6}"
        lines.append(f"{row.shape:<12} {row.variant:<18} {row.launches:>8} {row.bytes / 1e9:>9.3f} "
                     f"{row.bytes / off.bytes:>6.2f} {row.flops / 1e12:>8.3f} {row.seconds * 1e3:>11.3f} "
                     f"{row.seconds / off.seconds:>6.2f} {row.arena / GiB:>9.3f} "
                     f"{'yes' if row.logits_planned else 'no':>6} {step}")
    return "\n".join(lines)


def verdicts(rows: list[Row]) -> list[str]:
    lines = []
    by = {(r.shape, r.variant): r for r in rows}
    if ("llama-1b", "off") in by:
        off, on = by["llama-1b", "off"], by["llama-1b", "all on"]
        ratio = on.bytes / off.bytes
        lines.append(f"llama-1b: all on moves {ratio:.2f}x the bytes of all off (<= 0.6x): "
                     f"{'met' if ratio <= 0.6 else 'MISSED'}")
    for (shape, variant), row in by.items():
        if variant == "all on":
            verdict = "yes (MISSED)" if row.logits_planned else "no (met)"
            lines.append(f"{shape}: logits in the plan with all on: {verdict}")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m modeldsl.tools.bench_fuse", description=__doc__.split("\n")[0])
    p.add_argument("--shapes", default="qwen3-0.6b,llama-1b,tiny",
                   help="comma-separated: qwen3-0.6b, llama-1b (cost model), tiny (CPU, measured)")
    p.add_argument("--rounds", type=int, default=15, help="timed rounds of the tiny CPU step per variant")
    args = p.parse_args(argv)
    chosen = args.shapes.split(",")
    unknown = set(chosen) - {*GPU_SHAPES, "tiny"}
    if unknown or args.rounds < 1:
        what = f"no shape {', '.join(sorted(unknown))}" if unknown else f"--rounds {args.rounds} is below 1"
        print(f"error[E029]: bench_fuse: {what}", file=sys.stderr)
        return 1
    rows = []
    for shape in chosen:
        rows += tiny_rows(args.rounds) if shape == "tiny" else gpu_rows(shape)
    print(f"training step, fusion variants (cost model: H100 SXM roofline, an estimate; GPU shapes batch "
          f"{BATCH} x {TOKENS} bf16, tiny {TINY_BATCH} x {TINY_TOKENS} fp32 measured on the CPU)")
    print(table(rows))
    print("\n".join(verdicts(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
