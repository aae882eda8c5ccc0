"""Benchmark (not a test): what LoRA saves in planned memory, and its CPU training speed against PEFT.

Run: ``python -m modeldsl.tools.bench_lora`` (``--quick``: small shapes and one step, for the
tests). Two parts:

**1. Planned memory** (``--only memory``; nothing is allocated, nothing runs). For the
Qwen3-0.6B shape (``qwen.module``: d 1024, 28 layers, 16/8 heads, head_dim 128, d_ff 3072,
vocab 151936, tied embeddings, QK norm) and the Llama-3.2-1B shape (``llama.module``: d 2048,
16 layers, 32/8 heads, head_dim 64, d_ff 8192, vocab 128256, tied), at ``B = 8, T = 1024`` (the
shapes of ``tools/bench_recompute.py``, lowered by its :func:`~modeldsl.tools.bench_recompute.model_of`:
the std model with the shape's configuration, no weights), two settings:

* ``full``: full fine-tuning, every parameter trainable;
* ``LoRA r=16``: ``mdsl-adapters`` with r = 16, alpha = 32 on ``all-linear`` (every linear module
  but the LM head, as PEFT's), run on the configured model
  (:func:`modeldsl.runtime.lora.adapt`, what ``modeldsl.load(lora=...)`` runs before it allocates):
  the base is frozen, only the adapters are trainable.

Each is compiled the way :class:`modeldsl.runtime.train.Trainer` compiles it, in two precisions:
``fp32`` (the CPU trainer's default: fp32 parameters, gradients and moments) and ``bf16`` mixed
precision (the std models' declared 16-bit parameters and activations; fp32 gradients, master
weights and moments): the training step (:func:`~modeldsl.runtime.train.compile_training_step`,
recompute ``annotated``, every fusion on: ``mdsl-train-step``, planned by ``mdsl-plan-memory``)
and the optimizer step (:func:`~modeldsl.runtime.train.compile_optimizer_step`, AdamW:
``mdsl-optimizer-update``). The columns are the planned arena sizes of those programs (their
``arenas``; every buffer is 256-byte aligned):

* **trainable state** = the optimizer program's ``grads`` arena (one fp32 gradient per trainable
  parameter; the training step adds into the same arena) + its ``optimizer`` arena (AdamW's two
  fp32 moments, and in mixed precision an fp32 master copy of each 16-bit trainable parameter):
  12 bytes per trainable parameter in fp32, 16 in mixed precision, plus alignment;
* **params**: the ``params`` arena (the frozen base and the adapters);
* **activations**: the training step's ``activations`` arena (split by
  :func:`modeldsl.memory_report.training_memory` into the **saved** activations the backward reads
  and the **transient** rest) plus its ``workspace`` arena;
* **state / full**: the LoRA row's trainable state over the full fine-tune's (target <= 2%).

A third row, **LoRA on an fp8 base**, is the LoRA setting with the frozen base stored in fp8
(``mdsl-quantize-frozen{dtype=fp8_e4m3}`` after the adapters, what ``modeldsl.load(lora=...,
base_dtype="fp8")`` runs): every frozen linear weight (the tied embedding, which ``embedding``
reads, stays) in 1 byte per value plus an fp32 scale per output channel, widened by each GEMM a
tile at a time (no widened weight is held; the untied head the fused loss reads is widened a layer
at a time); its ``params`` arena is the one that shrinks.

**2. CPU tokens/s** (``--only speed``). A small Llama (d 256, 4 layers, 4 heads, d_ff 688, vocab
1024) with random weights (seed 0) is saved once as a HuggingFace checkpoint
(:func:`modeldsl.tools.bench_cpu.save_random_checkpoint`); both sides load those weights, add LoRA
r = 16, alpha = 32, dropout 0 on ``q_proj, v_proj`` and on ``all-linear``, and train fp32 with
AdamW (lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight decay 0.01, gradient clipping at 1.0) on
``B = 4`` x ``T = 128`` random tokens (seed 0, :func:`modeldsl.tools.bench.batches`):

* ``modeldsl``: ``modeldsl.load(hf=DIR, lora=...)`` and :class:`~modeldsl.runtime.train.Trainer`
  (``train_step`` of one micro-batch: the training step, then the optimizer step);
* ``PEFT``: ``peft.get_peft_model(AutoModelForCausalLM.from_pretrained(DIR), LoraConfig(...))``
  on transformers in eager mode (no ``torch.compile``; its default ``sdpa`` attention),
  ``torch.optim.AdamW`` over the trainable parameters, the step of
  :func:`modeldsl.tools.bench.torch_training_step` (forward with the loss, backward, clipping,
  ``optimizer.step()``, ``zero_grad(set_to_none=True)``).

Both compute the same loss: transformers shifts ``labels = input_ids`` inside, modeldsl gets the
shifted labels with the last position ignored (``-100``), so the first step's losses agree (the
adapters' ``lora_B`` start at zero) and are printed side by side as a check. ``--warmup`` steps
(default 3: compiles, first-touch allocations) are run and not timed, then ``--steps`` (default 20)
timed ones; tokens/s is ``B x T x steps`` over their wall time. Every measurement is a fresh
process (``python -m modeldsl.tools.bench_lora --child SPEC``) with ``--threads`` threads set
deliberately: ``OMP_NUM_THREADS``, ``OPENBLAS_NUM_THREADS``, ``MKL_NUM_THREADS`` and
``MDSL_NUM_THREADS`` in its environment (:func:`modeldsl.tools.bench_cpu.child_env`),
threadpoolctl's ``threadpool_limits`` for BLAS, and ``torch.set_num_threads`` (PEFT) or
:func:`modeldsl.runtime.threads.set_pool_size` (modeldsl); each child reports the count it ran
with. The processes alternate, modeldsl and PEFT, for ``--rounds`` rounds (default 5; which side
goes first alternates too), since the machine is shared and noisy; the table gives each side's
median tokens/s with its range, the ratio of the medians (target >= 1.0x) and, for reference, the
ratio of the best rounds (PyTorch's OpenMP threads lose the most when other processes take the
cores, so a busy machine inflates the medians' ratio: compare the load averages printed before
and after).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from modeldsl.tools import bench_deps
from modeldsl.tools.bench import Settings, batches, timed, torch_training_step
from modeldsl.tools.bench_cpu import child_env, load_average, peak_rss, save_random_checkpoint
from modeldsl.tools.bench_deps import reporting_diagnostics, require_packages
from modeldsl.tools.bench_recompute import Shape, model_of, shapes

RANK, ALPHA = 16, 32.0
LR, WEIGHT_DECAY, CLIP = 1e-3, 0.01, 1.0
MEMORY_SHAPES = ("qwen3-0.6b", "llama-1b")
QUICK_MEMORY_SHAPES = ("tiny",)
PRECISIONS = {"fp32": "fp32", "bf16": None}  # name -> compile_training_step's storage
TARGET_STATE_RATIO = 0.02
TARGET_SPEED_RATIO = 1.0
FP8_BASE = "fp8_e4m3"  # what the third row stores the frozen base in (mdsl-quantize-frozen)
# the throughput model (LlamaConfig arguments) and the --quick one
SPEED_MODEL: dict[str, Any] = dict(vocab_size=1024, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                                   num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256)
QUICK_MODEL: dict[str, Any] = dict(vocab_size=128, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
TARGETS: dict[str, str | list[str]] = {"q,v": ["q_proj", "v_proj"], "all-linear": "all-linear"}
RUNNERS = ("modeldsl", "PEFT")
RESULT = "bench_lora result: "  # the child's last stdout line: this marker, then its JSON
MiB = float(1 << 20)


def adamw_config():
    from modeldsl.runtime.optim import AdamWConfig

    return AdamWConfig(lr=LR, weight_decay=WEIGHT_DECAY, clip_norm=CLIP)


def lora_options(targets: str | list[str]) -> dict[str, Any]:
    """The adapters, in PEFT's ``LoraConfig`` names (``modeldsl.load(lora=...)`` takes them too)."""
    return dict(r=RANK, lora_alpha=ALPHA, target_modules=targets, lora_dropout=0.0)


# ---------------------------------------------------------------------------- 1. planned memory
@dataclass(frozen=True)
class Plan:
    """The planned arenas (bytes) of one setting's training and optimizer steps."""

    shape: str
    setting: str  # full, LoRA r=16, LoRA r=16 fp8 base
    precision: str  # fp32, bf16
    batch: int
    tokens: int
    parameters: int  # every parameter's elements, frozen ones included
    trainable_parameters: int
    grads: int  # the optimizer program's grads arena
    optimizer: int  # its optimizer arena: moments (and masters of 16-bit parameters)
    params: int
    saved: int
    transient: int
    workspace: int

    @property
    def trainable_state(self) -> int:
        return self.grads + self.optimizer

    @property
    def activations(self) -> int:
        """The training step's activations arena (saved + transient) and its workspace."""
        return self.saved + self.transient + self.workspace


def memory_shapes(quick: bool = False) -> list[Shape]:
    names = QUICK_MEMORY_SHAPES if quick else MEMORY_SHAPES
    return [s for s in shapes() if s.name in names]


def plan(shape: Shape, lora: str | list[str] | None, precision: str = "fp32", base: str | None = None) -> Plan:
    """Compile one setting at ``shape`` (no weights) and read its arenas; ``lora``: the targets, or
    None for full fine-tuning; ``base``: the dtype ``mdsl-quantize-frozen`` stores the frozen base in
    (with ``lora``), None: as declared."""
    from modeldsl.memory_report import training_memory
    from modeldsl.passes.quantize_frozen import quantize_frozen
    from modeldsl.runtime.lora import LoraOptions, adapt
    from modeldsl.runtime.train import compile_optimizer_step, compile_training_step

    model = model_of(shape)
    if lora is not None:
        adapt(model, LoraOptions.of(lora_options(lora)))
        if base is not None:
            quantize_frozen(model, base)
    storage = PRECISIONS[precision]
    step = compile_training_step(model, shape.batch, shape.tokens, storage)
    optimizer = compile_optimizer_step(model, adamw_config(), storage)
    if step.arenas["grads"] != optimizer.arenas["grads"]:  # the Trainer shares one grads arena
        raise AssertionError(f"{shape.name}: the training and optimizer steps plan different grads arenas")
    memory = training_memory(step)
    parameters = 0
    for param in model.params():
        if param.quantized is not None and param.quantized["role"] == "scale":
            continue  # the fp8 base's scales: no parameter of the model's
        count = 1
        for dim in param.param_type.shape:
            count *= dim.evaluate({})
        parameters += count
    setting = "full" if lora is None else f"LoRA r={RANK}" + (" fp8 base" if base is not None else "")
    return Plan(shape.name, setting, precision, shape.batch, shape.tokens, parameters, memory.trainable_parameters,
                optimizer.arenas["grads"], optimizer.arenas["optimizer"], step.arenas["params"], memory.saved,
                memory.transient, memory.workspace)


def plans(quick: bool = False, precisions: tuple[str, ...] = tuple(PRECISIONS)) -> list[Plan]:
    """Full fine-tuning, LoRA r=16 all-linear and the same on an fp8 base at every memory shape, in every
    precision."""
    return [plan(shape, lora, precision, base) for precision in precisions for shape in memory_shapes(quick)
            for lora, base in ((None, None), ("all-linear", None), ("all-linear", FP8_BASE))]


def _mib(n: int) -> str:
    return f"{n / MiB:,.1f}"


def memory_table(found: list[Plan]) -> str:
    head = (f"{'shape':<11} {'setting':<20} {'trainable':>13} {'of params':>9} {'grads':>10} {'optimizer':>10} "
            f"{'state':>10} {'params':>10} {'saved':>10} {'transient':>10} {'workspace':>9} "
            f"{'activ.':>10}  state / full")
    lines = []
    for precision in dict.fromkeys(p.precision for p in found):
        group = [p for p in found if p.precision == precision]
        first = group[0]
        what = ("fp32: fp32 params, grads and AdamW moments" if precision == "fp32" else
                "bf16 mixed precision: bf16 params and activations; fp32 grads, masters and moments")
        lines += [f"planned memory of one training step, B={first.batch} T={first.tokens}, {what} "
                  f"(MiB; compiled only, no weights allocated)", head, "-" * len(head)]
        for shape in dict.fromkeys(p.shape for p in group):
            rows = [p for p in group if p.shape == shape]
            full = next((p for p in rows if p.setting == "full"), None)
            for p in rows:
                verdict = ""
                if full is not None and p is not full:
                    share = p.trainable_state / full.trainable_state
                    verdict = f"{share:.2%} (target <= {TARGET_STATE_RATIO:.0%}: " \
                              f"{'met' if share <= TARGET_STATE_RATIO else 'MISSED'})"
                setting = {"full": "full fine-tune", f"LoRA r={RANK} fp8 base": "LoRA on fp8 base"}.get(
                    p.setting, p.setting + " all-linear")
                lines.append(f"{p.shape:<11} {setting:<20} {p.trainable_parameters:>13,} "
                             f"{p.trainable_parameters / p.parameters:>9.2%} {_mib(p.grads):>10} "
                             f"{_mib(p.optimizer):>10} {_mib(p.trainable_state):>10} {_mib(p.params):>10} "
                             f"{_mib(p.saved):>10} {_mib(p.transient):>10} {_mib(p.workspace):>9} "
                             f"{_mib(p.activations):>10}  {verdict}".rstrip())
        lines.append("")
    lines.append("state = grads + optimizer (the trainable state); activ. = saved + transient + workspace "
                 "(the step's activations and workspace arenas); params = the params arena (on an fp8 base: "
                 "1 byte per frozen linear weight + its fp32 scales)")
    return "\n".join(lines)


# ---------------------------------------------------------------------------- 2. CPU tokens/s: the children
def child_main(spec: dict[str, Any]) -> dict[str, Any]:
    """One measurement in this process (``spec``: runner, hf, targets, threads, batch, seq, steps, warmup)."""
    from threadpoolctl import threadpool_limits

    threads = spec["threads"]
    settings = Settings("cpu", "fp32", spec["batch"], spec["seq"], spec["steps"], spec["warmup"], lr=LR)
    make = modeldsl_step if spec["runner"] == "modeldsl" else peft_step
    step, vocab, trainable, used = make(spec, threads)
    with threadpool_limits(limits=threads):  # every BLAS and OpenMP library loaded by now
        tokens_per_s, losses = timed(step, batches(vocab, settings), settings, lambda: None)
    return {"value": tokens_per_s, "losses": losses, "threads": used, "trainable": trainable,
            "peak_rss": peak_rss()}


def modeldsl_step(spec: dict[str, Any], threads: int):
    """modeldsl's LoRA training step on ``[B, T + 1]`` tokens (the loss transformers computes on ``[:, :T]``)."""
    import numpy as np

    import modeldsl
    from modeldsl.runtime.threads import pool_size, set_pool_size
    from modeldsl.runtime.train import Trainer

    set_pool_size(threads)
    model = modeldsl.load(hf=spec["hf"], lora=lora_options(TARGETS[spec["targets"]]))
    trainer = Trainer(model, adamw_config(), dtype="fp32")

    def step(tokens: np.ndarray) -> float:
        labels = tokens[:, 1:].copy()
        labels[:, -1] = -100  # transformers' shift predicts no token after the last input
        return trainer.train_step([(tokens[:, :-1], labels)])

    trainable = sum(int(np.prod(trainer.optimizer.params[n].shape)) for n in trainer.optimizer.grads)
    return step, model.config("vocab_size"), trainable, pool_size()


def peft_step(spec: dict[str, Any], threads: int):
    """PEFT's LoRA on transformers eager, its AdamW over the trainable parameters."""
    import peft
    import torch
    import transformers

    torch.set_num_threads(threads)
    transformers.utils.logging.set_verbosity_error()
    base = transformers.AutoModelForCausalLM.from_pretrained(spec["hf"], dtype=torch.float32)
    model = peft.get_peft_model(base, peft.LoraConfig(**lora_options(TARGETS[spec["targets"]])))
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=LR, weight_decay=WEIGHT_DECAY)
    step = torch_training_step(model, model, optimizer)
    return step, base.config.vocab_size, sum(p.numel() for p in trainable), torch.get_num_threads()


# ---------------------------------------------------------------------------- 2. CPU tokens/s: the parent
def run_child(spec: dict[str, Any]) -> dict[str, Any]:
    """One measurement in a fresh process: its result, or ``{"note": why it failed}``."""
    return bench_deps.run_child("modeldsl.tools.bench_lora", RESULT, spec, child_env(spec["threads"]))


@dataclass
class Speed:
    """One side's measurements of one target set, over the rounds."""

    targets: str
    runner: str
    samples: list[float] = field(default_factory=list)  # tokens/s of every round that ran
    first_loss: float | None = None
    threads: set[int] = field(default_factory=set)
    trainable: int | None = None
    peak_rss: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def median(self) -> float | None:
        return statistics.median(self.samples) if self.samples else None

    def add(self, result: dict[str, Any]) -> None:
        if "value" not in result:
            self.notes.append(result["note"])
            return
        self.samples.append(result["value"])
        self.first_loss = result["losses"][0]
        self.threads.add(result["threads"])
        self.trainable = result["trainable"]
        self.peak_rss = max(self.peak_rss, result["peak_rss"])


def measure_speed(checkpoint: Path, args: argparse.Namespace) -> list[Speed]:
    """Alternate modeldsl's and PEFT's processes for ``args.rounds`` rounds, both target sets each round."""
    found = {(t, r): Speed(t, r) for t in TARGETS for r in RUNNERS}
    common = dict(hf=str(checkpoint), threads=args.threads, batch=args.batch, seq=args.seq, steps=args.steps,
                  warmup=args.warmup)
    for round_ in range(args.rounds):
        for targets in TARGETS:
            for runner in RUNNERS if round_ % 2 == 0 else RUNNERS[::-1]:
                result = run_child(dict(common, runner=runner, targets=targets))
                found[targets, runner].add(result)
                print(f"  round {round_ + 1} LoRA {targets:<10} {runner:<8} {describe(result)}", flush=True)
    return list(found.values())


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def describe(result: dict[str, Any]) -> str:
    if "value" not in result:
        return result["note"]
    return (f"{result['value']:>10,.0f} tokens/s on {plural(result['threads'], 'thread')}, first loss "
            f"{result['losses'][0]:.4f}, peak RSS {result['peak_rss'] / MiB:,.0f} MiB")


def speed_table(rows: list[Speed]) -> str:
    head = (f"{'LoRA on':<11} {'runner':<9} {'tokens/s':>10} {'range (rounds)':>22} {'threads':>7} "
            f"{'trainable':>10} {'first loss':>10} {'RSS MiB':>8}")
    lines = [head, "-" * len(head)]
    for targets in dict.fromkeys(r.targets for r in rows):
        group = {r.runner: r for r in rows if r.targets == targets}
        for r in group.values():
            if r.median is None:
                lines.append(f"{targets:<11} {r.runner:<9} {'-':>10}  {r.notes[-1] if r.notes else ''}")
                continue
            spread = f"{min(r.samples):,.0f}..{max(r.samples):,.0f} ({len(r.samples)})"
            threads = ",".join(str(t) for t in sorted(r.threads))
            failed = f"  {len(r.notes)} failed: {r.notes[-1]}" if r.notes else ""
            lines.append(f"{targets:<11} {r.runner:<9} {r.median:>10,.0f} {spread:>22} {threads:>7} "
                         f"{r.trainable:>10,} {r.first_loss:>10.4f} {r.peak_rss / MiB:>8,.0f}{failed}")
        lines.append(f"{targets:<11} {verdict(group.get('modeldsl'), group.get('PEFT'))}")
    return "\n".join(lines)


def verdict(ours: Speed | None, peft: Speed | None) -> str:
    """The ratio of the medians against the target, and whether both sides agree on what they train."""
    if ours is None or peft is None or ours.median is None or peft.median is None:
        return "modeldsl / PEFT: - (a side has no measurement)"
    ratio, best = ours.median / peft.median, max(ours.samples) / max(peft.samples)
    checks = []
    if ours.trainable != peft.trainable:
        checks.append(f"trainable parameters differ: {ours.trainable:,} vs {peft.trainable:,}")
    if abs(ours.first_loss - peft.first_loss) > 1e-3 * max(1.0, abs(peft.first_loss)):
        checks.append(f"first losses differ: {ours.first_loss:.6f} vs {peft.first_loss:.6f}")
    return (f"modeldsl / PEFT: {ratio:.2f}x (median tokens/s; target >= {TARGET_SPEED_RATIO:.1f}x: "
            f"{'met' if ratio >= TARGET_SPEED_RATIO else 'MISSED'}); best / best {best:.2f}x"
            + "".join(f"; {c}" for c in checks))


# ---------------------------------------------------------------------------- the command
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m modeldsl.tools.bench_lora", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small shapes, one round of 1 warm-up + 1 timed step "
                   "(a check of the harness, not of the speed)")
    p.add_argument("--threads", type=int, default=2, help="threads of both sides (BLAS, OpenMP, torch, modeldsl)")
    p.add_argument("--rounds", type=int, default=None, help="rounds of alternating processes; the median "
                   "counts (default 5, --quick 1)")
    p.add_argument("--steps", type=int, default=None, help="timed training steps per process (default 20, --quick 1)")
    p.add_argument("--warmup", type=int, default=None, help="untimed steps before them (default 3, --quick 1)")
    p.add_argument("--only", choices=("memory", "speed"), help="run one part only")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    quick = args.quick
    args.rounds = args.rounds if args.rounds is not None else (1 if quick else 5)
    args.steps = args.steps if args.steps is not None else (1 if quick else 20)
    args.warmup = args.warmup if args.warmup is not None else (1 if quick else 3)
    args.batch, args.seq = (2, 16) if quick else (4, 128)
    for name in ("threads", "rounds", "steps"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1")
    if args.warmup < 0:
        p.error("--warmup must not be negative")
    return args


def main(argv: list[str] | None = None) -> int:
    return reporting_diagnostics(lambda: run(argv))


def run(argv: list[str] | None) -> int:
    args = parse_args(argv)
    if args.child is not None:
        print(RESULT + json.dumps(child_main(json.loads(args.child))), flush=True)
        return 0
    start = time.perf_counter()
    if args.only != "speed":
        print(memory_table(plans(args.quick)), flush=True)
        print(flush=True)
    if args.only != "memory":
        require_packages(("torch", "transformers", "peft"), "python -m modeldsl.tools.bench_lora",
                         "the PEFT side of the CPU tokens/s")
        config = QUICK_MODEL if args.quick else SPEED_MODEL
        print(f"CPU LoRA training, fp32: Llama d {config['hidden_size']}, {config['num_hidden_layers']} layers, "
              f"{config['num_attention_heads']}/{config['num_key_value_heads']} heads, d_ff "
              f"{config['intermediate_size']}, vocab {config['vocab_size']}; B={args.batch} T={args.seq}; "
              f"r={RANK} alpha={ALPHA:g}; AdamW lr {LR:g}, weight decay {WEIGHT_DECAY:g}, clip {CLIP:g}; "
              f"{plural(args.threads, 'thread')} each; {args.warmup} warm-up + {plural(args.steps, 'timed step')} "
              f"per process, {plural(args.rounds, 'alternating round')}, median; {load_average()}", flush=True)
        with tempfile.TemporaryDirectory(prefix="mdsl-bench-lora-") as temp:
            checkpoint = save_random_checkpoint(config, Path(temp) / "llama")
            rows = measure_speed(checkpoint, args)
        print(f"{load_average()} (others' processes slow either side down)")
        print(speed_table(rows))
    print(f"({time.perf_counter() - start:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
