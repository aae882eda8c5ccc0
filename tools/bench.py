"""Benchmark (not a test): tokens/s and peak memory of a full AdamW training step, modeldsl
against transformers eager and transformers under ``torch.compile``, measured in one run.

``python -m modeldsl.tools.bench`` (on a GPU: ``--device cuda``, the default when one is there)
trains, for each shape, ``--warmup`` steps and then ``--steps`` timed steps of batch ``--batch``
x ``--seq`` random tokens (seed 0; labels are the inputs, shifted as transformers shifts them),
with random weights, for each runner:

* ``modeldsl``: the std DSL model (``modeldsl/std/models``) with the shape's configuration;
  on the CPU the schedule executor's :class:`modeldsl.runtime.train.Trainer`, on a GPU the CUDA
  executor's trainer (``modeldsl.runtime.cuda_train``, once it exists; until then the row says
  why it is missing). ``--dtype bf16``: mixed precision (bf16 weights and activations, fp32
  master weights, moments and loss).
* ``eager``: ``transformers.AutoModelForCausalLM.from_config`` with fp32 weights,
  ``torch.autocast`` to bf16 with ``--dtype bf16``, ``torch.optim.AdamW`` (fused on a GPU),
  gradient clipping at 1.0, ``zero_grad(set_to_none=True)``.
* ``compile``: the same model wrapped in ``torch.compile`` (its compilation happens in the
  warm-up steps).

tokens/s is ``batch x seq x steps`` over the wall time of the timed steps (the device
synchronized before the clock stops). Peak memory on a GPU is the device memory in use at its
highest during the timed steps (``torch.cuda.max_memory_allocated`` for PyTorch; the CUDA
executor's arenas and workspace for modeldsl); on the CPU only modeldsl's planned arenas are
reported. The table gives every runner's ratio against ``compile`` (else ``eager``); ``--json``
writes the rows.

Shapes: ``qwen3-0.6b`` (28 layers, d 1024, 16/8 heads, head_dim 128, d_ff 3072, vocab 151936,
tied), ``llama-1b`` (16 layers, d 2048, 32/8 heads, d_ff 8192, vocab 128256, tied), ``small``
(4 layers, d 256, 8/4 heads, d_ff 688, vocab 4096: the CPU benchmark's, ``bench_cpu``) and ``tiny``
(the tests' 2-layer Llama, for a CPU run of the harness itself).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from modeldsl.files import write_file
from modeldsl.tools.bench_deps import reporting_diagnostics, require_packages

# name -> (transformers config class, DSL model file, HF config)
SHAPES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "qwen3-0.6b": ("Qwen3Config", "qwen.module", dict(
        vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
        num_key_value_heads=8, head_dim=128, tie_word_embeddings=True, max_position_embeddings=40960,
        rope_theta=1000000.0, rms_norm_eps=1e-6)),
    "llama-1b": ("LlamaConfig", "llama.module", dict(
        vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
        num_key_value_heads=8, head_dim=64, tie_word_embeddings=True, max_position_embeddings=131072,
        rope_theta=500000.0, rms_norm_eps=1e-5)),
    "small": ("LlamaConfig", "llama.module", dict(
        vocab_size=4096, hidden_size=256, intermediate_size=688, num_hidden_layers=4, num_attention_heads=8,
        num_key_value_heads=4, max_position_embeddings=2048)),
    "tiny": ("LlamaConfig", "llama.module", dict(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128)),
    # sparse experts and a state space model, for bench_cpu's side-by-side training rows
    "mixtral-tiny": ("MixtralConfig", "mixtral.module", dict(
        vocab_size=4096, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=512)),
    "qwen3moe-tiny": ("Qwen3MoeConfig", "qwen3_moe.module", dict(
        vocab_size=4096, hidden_size=128, moe_intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, num_experts=4, num_experts_per_tok=2, max_position_embeddings=512)),
    "mamba-tiny": ("MambaConfig", "mamba.module", dict(
        vocab_size=4096, hidden_size=128, num_hidden_layers=2, state_size=16, expand=2, conv_kernel=4,
        time_step_rank=8)),
}
RUNNERS = ("modeldsl", "eager", "compile")
GiB = float(1 << 30)


@dataclass
class Row:
    shape: str
    runner: str
    tokens_per_s: float | None = None
    peak_bytes: int | None = None
    losses: list[float] = field(default_factory=list)
    note: str = ""


@dataclass(frozen=True)
class Settings:
    device: str
    dtype: str
    batch: int
    seq: int
    steps: int
    warmup: int
    lr: float = 1e-4


def batches(vocab: int, settings: Settings) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.integers(0, vocab, (settings.batch, settings.seq + 1)) for _ in range(settings.warmup + settings.steps)]


def timed(step: Callable[[np.ndarray], float], data: list[np.ndarray], settings: Settings,
          synchronize: Callable[[], None]) -> tuple[float, list[float]]:
    """Run the warm-up steps, then time the others; (tokens/s, all losses)."""
    losses = [step(tokens) for tokens in data[:settings.warmup]]
    synchronize()
    start = time.perf_counter()
    losses += [step(tokens) for tokens in data[settings.warmup:]]
    synchronize()
    seconds = time.perf_counter() - start
    return settings.batch * settings.seq * settings.steps / seconds, losses


# ---------------------------------------------------------------------------- PyTorch
def torch_training_step(model, forward, optimizer, device: str = "cpu", autocast=None) -> Callable[[np.ndarray], float]:
    """One transformers training step on ``[B, T + 1]`` tokens (labels are the inputs, shifted by
    transformers): ``forward`` (the model, or it under ``torch.compile``), clipping at 1.0, the
    optimizer step and ``zero_grad(set_to_none=True)``; returns the loss."""
    import contextlib

    import torch

    def step(tokens: np.ndarray) -> float:
        ids = torch.as_tensor(tokens, device=device)
        with autocast or contextlib.nullcontext():
            loss = forward(ids[:, :-1], labels=ids[:, :-1]).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())

    return step


def run_torch(shape: str, compiled: bool, settings: Settings) -> Row:
    import torch
    import transformers

    row = Row(shape, "compile" if compiled else "eager")
    config_class, _, hf = SHAPES[shape]
    torch.manual_seed(0)
    config = getattr(transformers, config_class)(**hf)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).to(settings.device)
    model.train()
    fused = settings.device == "cuda"
    optimizer = torch.optim.AdamW(model.parameters(), lr=settings.lr, weight_decay=0.01, fused=fused)
    forward = torch.compile(model) if compiled else model
    autocast = torch.autocast(settings.device, dtype=torch.bfloat16, enabled=settings.dtype == "bf16")
    step = torch_training_step(model, forward, optimizer, settings.device, autocast)
    cuda = settings.device == "cuda"
    synchronize = torch.cuda.synchronize if cuda else (lambda: None)
    data = batches(hf["vocab_size"], settings)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    row.tokens_per_s, row.losses = timed(step, data, settings, synchronize)
    if cuda:
        row.peak_bytes = int(torch.cuda.max_memory_allocated())
    return row


# ---------------------------------------------------------------------------- modeldsl
def dsl_model(shape: str):
    """The std DSL model of a shape with random weights (fp32: the master copy)."""
    import modeldsl
    from modeldsl.frontend.text.parser import parse_file
    from modeldsl.lower import choose_top
    from modeldsl.resolve.imports import STD_ROOT
    from modeldsl.runtime.model import hf_config_values

    _, module, hf = SHAPES[shape]
    path = STD_ROOT / "models" / module
    program = parse_file(path)
    return modeldsl.load(path, config=hf_config_values(program, choose_top(program), hf))


def modeldsl_label(recompute: str, fuse: bool) -> str:
    """``modeldsl``, with the settings that differ from the defaults: ``modeldsl[full,nofuse]``."""
    settings = [*([recompute] if recompute != "annotated" else []), *([] if fuse else ["nofuse"])]
    return f"modeldsl[{','.join(settings)}]" if settings else "modeldsl"


def run_modeldsl(shape: str, settings: Settings, recompute: str = "annotated", fuse: bool = True) -> Row:
    """The modeldsl runner's row, training with ``recompute`` (mdsl-recompute's mode) and ``fuse``
    (mdsl-fuse, every pattern, or none)."""
    from modeldsl.runtime.optim import AdamWConfig

    row = Row(shape, modeldsl_label(recompute, fuse))
    config = AdamWConfig(lr=settings.lr, weight_decay=0.01, clip_norm=1.0)
    if settings.device == "cuda":
        try:
            from modeldsl.runtime.cuda_train import CudaTrainer  # the CUDA executor's trainer
        except ImportError as err:
            row.note = f"no CUDA executor yet ({err})"
            return row
        trainer = CudaTrainer(dsl_model(shape), config, dtype=settings.dtype, recompute=recompute, fuse=fuse)
        synchronize, peak = trainer.synchronize, trainer.peak_bytes
    else:
        from modeldsl.runtime.train import Trainer

        trainer = Trainer(dsl_model(shape), config, dtype=settings.dtype, recompute=recompute, fuse=fuse)
        synchronize = lambda: None  # noqa: E731

        def peak() -> int:
            programs = [trainer.optimizer.program, *(e.program for e in trainer.programs.values())]
            fixed = {a: max(p.arenas[a] for p in programs) for a in ("params", "grads", "optimizer")}
            return sum(fixed.values()) + max(p.arenas["activations"] + p.arenas["workspace"] for p in programs)

    def step(tokens: np.ndarray) -> float:
        return trainer.train_step([(tokens[:, :-1], tokens[:, 1:])])

    row.tokens_per_s, row.losses = timed(step, batches(SHAPES[shape][2]["vocab_size"], settings), settings,
                                         synchronize)
    row.peak_bytes = int(peak())
    return row


# ---------------------------------------------------------------------------- the table
def table(rows: list[Row]) -> str:
    lines = [f"{'shape':<11} {'runner':<16} {'tokens/s':>11} {'x peer':>7} {'peak GiB':>9} {'x peer':>7}  note"]
    for shape in dict.fromkeys(r.shape for r in rows):
        group = {r.runner: r for r in rows if r.shape == shape}
        peer = group.get("compile") if group.get("compile") and group["compile"].tokens_per_s else group.get("eager")
        for row in group.values():
            speed = "-" if row.tokens_per_s is None else f"{row.tokens_per_s:,.0f}"
            memory = "-" if row.peak_bytes is None else f"{row.peak_bytes / GiB:.2f}"
            speed_ratio = _ratio(row.tokens_per_s, peer.tokens_per_s if peer else None)
            memory_ratio = _ratio(row.peak_bytes, peer.peak_bytes if peer else None)
            lines.append(f"{shape:<11} {row.runner:<16} {speed:>11} {speed_ratio:>7} {memory:>9} {memory_ratio:>7}  "
                         f"{row.note}")
        if peer is not None:
            lines.append(f"{'':<11} (ratios against {peer.runner})")
    return "\n".join(lines)


def _ratio(value: float | None, peer: float | None) -> str:
    return "-" if value is None or not peer else f"{value / peer:.2f}x"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m modeldsl.tools.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default="qwen3-0.6b,llama-1b", help=f"comma-separated: {', '.join(SHAPES)}")
    p.add_argument("--runners", default=",".join(RUNNERS), help=f"comma-separated: {', '.join(RUNNERS)}")
    p.add_argument("--device", choices=("cuda", "cpu"), default=None, help="default: cuda when there is one")
    p.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--recompute", default="annotated", help="comma-separated recompute modes of the modeldsl "
                   "runner, one row each: none, annotated, full, auto[:BYTES] (see mdsl-run --recompute)")
    p.add_argument("--fuse", default="on", help="comma-separated: on (mdsl-fuse, every pattern), off; one modeldsl "
                   "row each (with each --recompute mode)")
    p.add_argument("--json", type=Path, help="write the rows (and the settings) to this file")
    args = p.parse_args(argv)
    from modeldsl.tools.train import recompute_problems

    for mode in args.recompute.split(","):
        for problem in recompute_problems(mode):
            p.error(problem)
    for name, values, known in (("--shapes", args.shapes, SHAPES), ("--runners", args.runners, RUNNERS),
                                ("--fuse", args.fuse, ("on", "off"))):
        unknown = [v for v in values.split(",") if v not in known]
        if unknown:
            p.error(f"{name}: unknown {', '.join(unknown)} (choose from {', '.join(known)})")
    for name in ("batch", "seq", "steps"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1")
    if args.warmup < 0:
        p.error("--warmup must not be negative")
    return args


TORCH_RUNNERS = ("eager", "compile")


def main(argv: list[str] | None = None) -> int:
    return reporting_diagnostics(lambda: run(argv))


def run(argv: list[str] | None) -> int:
    args = parse_args(argv)
    torch_runners = [r for r in args.runners.split(",") if r in TORCH_RUNNERS]
    if torch_runners:
        require_packages(("torch", "transformers"), "python -m modeldsl.tools.bench",
                         f"the runners {', '.join(torch_runners)}; --runners modeldsl runs without them")
    if args.device is None:
        try:
            import torch

            args.device = "cuda" if torch.cuda.is_available() else "cpu"
        except ImportError:
            args.device = "cpu"
    settings = Settings(args.device, args.dtype, args.batch, args.seq, args.steps, args.warmup)
    print(f"training step benchmark on {settings.device}: {settings.dtype}, batch {settings.batch} x seq "
          f"{settings.seq}, {settings.warmup} warm-up + {settings.steps} timed steps", flush=True)
    rows = []
    for shape in args.shapes.split(","):
        for runner in args.runners.split(","):
            variants = [(mode, fuse == "on") for mode in args.recompute.split(",") for fuse in args.fuse.split(",")]
            for mode, fuse in variants if runner == "modeldsl" else [(None, True)]:
                row = run_row(shape, runner, settings, mode, fuse)
                rows.append(row)
                print(f"  {shape} {row.runner}: "
                      + (f"{row.tokens_per_s:,.0f} tokens/s" if row.tokens_per_s else row.note), flush=True)
    print(table(rows))
    if args.json is not None:
        write_file(args.json, json.dumps({"settings": asdict(settings), "rows": [asdict(r) for r in rows]}, indent=1))
    return 0


def run_row(shape: str, runner: str, settings: Settings, recompute: str | None, fuse: bool = True) -> Row:
    """One runner's row (a runner that fails is a row that says so; the others still run)."""
    try:
        row = run_modeldsl(shape, settings, recompute, fuse) if runner == "modeldsl" else \
            run_torch(shape, runner == "compile", settings)
    except Exception as err:  # noqa: BLE001
        label = modeldsl_label(recompute, fuse) if runner == "modeldsl" else runner
        row = Row(shape, label, note=f"failed: {type(err).__name__}: {err}".splitlines()[0][:200])
    if row.losses and not all(math.isfinite(x) for x in row.losses):
        row.note = (row.note + " non-finite loss").strip()
    return row


if __name__ == "__main__":
    sys.exit(main())
