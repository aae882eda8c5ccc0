"""Benchmark (not a test): modeldsl's CPU backend against PyTorch on the same cores, in one run.

``python -m modeldsl.tools.bench_cpu --threads 2`` measures, every runner with the same thread
count (``OMP_NUM_THREADS``, ``OPENBLAS_NUM_THREADS``, ``MKL_NUM_THREADS`` and ``MDSL_NUM_THREADS``
in its environment, ``torch.set_num_threads`` in PyTorch's), all in fp32:

* ``train``: tokens/s of a full AdamW step (lr 1e-3, weight decay 0.01, gradient clipping at
  1.0) on ``--batch`` x ``--seq`` random tokens, ``--warmup`` steps then ``--steps`` timed ones:
  modeldsl (:class:`modeldsl.runtime.train.Trainer`), transformers ``eager`` and
  ``torch.compile`` (compiled in the warm-up), on each of ``--shapes`` and on the bundled tiny
  checkpoint (``--checkpoint``, ``examples/tiny_llama``, the one ``mdsl-run`` runs in the README).
* ``prefill T=n``: tokens/s of the logits of one ``n``-token prompt (B=1), modeldsl
  (:meth:`Model.forward`, the planned schedule) against transformers eager (``no_grad``).
* ``decode``: tokens/s of greedy decoding with the KV cache, ``--decode`` new tokens after a
  ``--prompt``-token prompt, the prefill not counted: modeldsl :meth:`Model.generate` (its
  ``decode`` timing) against a transformers eager loop of one-token steps on its cache.
* ``load`` (``--load``, opt-in: it writes a 4.4 GB checkpoint once into ``--cache-dir``): seconds
  from ``modeldsl.load`` / ``AutoModelForCausalLM.from_pretrained`` to the logits of a 16-token
  prompt, for TinyLlama-1.1B-shaped random weights, and the peak RSS against the fp32 weights.

The models of ``--shapes`` get random weights (seed 0) saved as a HuggingFace checkpoint in a
temporary folder, so both sides load the very same weights through their loaders (modeldsl:
``modeldsl.load(hf=...)``, the std model the registry serves for the checkpoint's architecture:
Llama for the Llama shapes, Mixtral, Qwen3-MoE or Mamba for ``mixtral-tiny``, ``qwen3moe-tiny``,
``mamba-tiny``). Every measurement is a
fresh process (``python -m modeldsl.tools.bench_cpu --child SPEC``) that reports its own peak
RSS (``VmHWM``: the imports included, worker processes not; inductor compiles in-process
here). The processes alternate between runners (modeldsl, eager, compile, modeldsl, ...) for
``--repeats`` rounds, since the machine is shared and noisy; the table gives each runner's best
speed and its highest peak RSS over the rounds, the ratios against eager (and compile) and the
issue's targets next to them. ``--json`` writes the rows. Without torch or transformers the
benchmark stops with E029.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from modeldsl.files import write_file
from modeldsl.tools import bench_deps
from modeldsl.tools.bench import SHAPES, Settings, batches, timed, torch_training_step
from modeldsl.tools.bench_deps import reporting_diagnostics, require_packages

BUNDLED_CHECKPOINT = Path(__file__).resolve().parents[1] / "examples" / "tiny_llama"  # in a source checkout
LOAD_SHAPES: dict[str, dict[str, Any]] = {
    "tinyllama-1.1b": dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
                           num_attention_heads=32, num_key_value_heads=4, max_position_embeddings=2048),
    "tiny": SHAPES["tiny"][2],  # the tests' run of the load section
}
RUNNERS = ("modeldsl", "eager", "compile")
RESULT = "bench_cpu result: "  # the child's last stdout line: this marker, then its JSON
MiB = float(1 << 20)

# section -> the targets: (speed: tokens/s at least, or rss: peak RSS at most) bound x the peer's
TARGETS: dict[str, tuple[tuple[str, float, str], ...]] = {
    "train": (("speed", 1.0, "eager"), ("rss", 0.5, "eager")),
    "prefill T=256": (("speed", 1.0, "eager"), ("rss", 0.5, "eager")),
    "decode": (("speed", 2.0, "eager"), ("rss", 0.5, "eager")),
}


@dataclass
class Row:
    section: str  # train, prefill T=n, decode, load
    shape: str
    runner: str
    value: float | None = None  # tokens/s (load: seconds)
    peak_rss: int | None = None  # bytes
    weight_bytes: int | None = None  # load: the fp32 weights modeldsl holds
    note: str = ""
    samples: list[float] = field(default_factory=list)  # the value of every round, in order


# ---------------------------------------------------------------------------- the children
def child_main(spec: dict[str, Any]) -> dict[str, Any]:
    """Run one measurement in this process: ``{"value": ..., ...}`` plus this process's peak RSS."""
    threads = spec["threads"]
    if spec["runner"] != "modeldsl":
        import torch

        torch.set_num_threads(threads)
    measure = {"train": child_train, "prefill": child_prefill, "decode": child_decode, "load": child_load}
    result = measure[spec["task"]](spec)
    result["peak_rss"] = peak_rss()
    return result


def peak_rss() -> int:
    """This process's peak resident set in bytes: ``VmHWM``, which exec resets; ``ru_maxrss`` keeps
    the parent's peak from before the fork and only serves where there is no ``/proc``."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    line = next(line for line in status.splitlines() if line.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024


def child_train(spec: dict[str, Any]) -> dict[str, Any]:
    settings = Settings("cpu", "fp32", spec["batch"], spec["seq"], spec["steps"], spec["warmup"], lr=1e-3)
    step, vocab = (modeldsl_train_step if spec["runner"] == "modeldsl" else torch_train_step)(spec, settings)
    tokens_per_s, losses = timed(step, batches(vocab, settings), settings, lambda: None)
    return {"value": tokens_per_s, "losses": losses}


def modeldsl_train_step(spec: dict[str, Any], settings: Settings):
    import modeldsl
    from modeldsl.runtime.optim import AdamWConfig
    from modeldsl.runtime.train import Trainer

    model = modeldsl.load(hf=spec["hf"])
    trainer = Trainer(model, AdamWConfig(lr=settings.lr, weight_decay=0.01, clip_norm=1.0), dtype="fp32")
    return (lambda tokens: trainer.train_step([(tokens[:, :-1], tokens[:, 1:])])), model.config("vocab_size")


def torch_train_step(spec: dict[str, Any], settings: Settings):
    import torch

    model = torch_model(spec["hf"])
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=settings.lr, weight_decay=0.01)
    forward = torch.compile(model) if spec["runner"] == "compile" else model
    return torch_training_step(model, forward, optimizer), model.config.vocab_size


def torch_model(directory: str):
    import torch
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)


def prompt(length: int, vocab: int) -> np.ndarray:
    return np.random.default_rng(1).integers(0, vocab, length)


def child_prefill(spec: dict[str, Any]) -> dict[str, Any]:
    logits = modeldsl_logits(spec["hf"]) if spec["runner"] == "modeldsl" else torch_logits(spec["hf"])
    ids = prompt(spec["tokens"], spec["vocab"])
    for _ in range(spec["warmup"]):
        logits(ids)
    start = time.perf_counter()
    for _ in range(spec["steps"]):
        logits(ids)
    return {"value": spec["tokens"] * spec["steps"] / (time.perf_counter() - start)}


def modeldsl_logits(directory: str):
    import modeldsl

    model = modeldsl.load(hf=directory)
    return lambda ids: model.forward(ids[None, :])


def torch_logits(directory: str):
    import torch

    model = torch_model(directory).eval()

    def logits(ids: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return model(torch.as_tensor(ids)[None, :]).logits.numpy()

    return logits


def child_decode(spec: dict[str, Any]) -> dict[str, Any]:
    decode = modeldsl_decode if spec["runner"] == "modeldsl" else torch_decode
    ids = prompt(spec["prompt"], spec["vocab"])
    seconds = [decode(spec["hf"], ids, spec["new"]) for _ in range(spec["warmup"] + spec["steps"])][spec["warmup"]:]
    return {"value": (spec["new"] - 1) * len(seconds) / sum(seconds)}


_loaded: dict[str, Any] = {}


def loaded_once(directory: str, load) -> Any:
    """The model of ``directory`` loaded by ``load``, once per process (the warm-up reuses it)."""
    if directory not in _loaded:
        _loaded[directory] = load(directory)
    return _loaded[directory]


def modeldsl_decode(directory: str, ids: np.ndarray, new: int) -> float:
    """Seconds of the ``new - 1`` one-token steps after the prefill (greedy, KV cache)."""
    import modeldsl

    model = loaded_once(directory, lambda d: modeldsl.load(hf=d))
    timings: dict[str, float] = {}
    model.generate(ids.tolist(), new, timings=timings)
    return timings["decode"]


def torch_decode(directory: str, ids: np.ndarray, new: int) -> float:
    """The same as :func:`modeldsl_decode` for transformers eager: its cache, argmax per step."""
    import torch

    model = loaded_once(directory, lambda d: torch_model(d).eval())
    with torch.no_grad():
        out = model(torch.as_tensor(ids)[None, :], use_cache=True)
        start = time.perf_counter()
        for step in range(new - 1):
            token = out.logits[:, -1:].argmax(-1)
            if getattr(out, "cache_params", None) is not None:  # Mamba: the recurrent state, at its position
                out = model(token, cache_params=out.cache_params, use_cache=True,
                            cache_position=torch.tensor([ids.size + step]))
            else:
                out = model(token, past_key_values=out.past_key_values, use_cache=True)
        return time.perf_counter() - start


def child_load(spec: dict[str, Any]) -> dict[str, Any]:
    """Seconds from loading to the logits of a 16-token prompt (imports done before the clock)."""
    ids = prompt(16, spec["vocab"])
    if spec["runner"] == "modeldsl":
        import modeldsl

        start = time.perf_counter()
        model = modeldsl.load(hf=spec["hf"])
        model.forward(ids)
        seconds = time.perf_counter() - start
        return {"value": seconds, "weight_bytes": sum(w.size for w in model.weights.values()) * 4}
    import torch
    import transformers  # noqa: F401 - imported before the clock

    start = time.perf_counter()
    model = torch_model(spec["hf"]).eval()
    with torch.no_grad():
        model(torch.as_tensor(ids)[None, :])
    return {"value": time.perf_counter() - start}


# ---------------------------------------------------------------------------- the parent
def child_env(threads: int) -> dict[str, str]:
    env = dict(os.environ)
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "MDSL_NUM_THREADS"):
        env[name] = str(threads)
    env["TORCHINDUCTOR_COMPILE_THREADS"] = "1"  # compile in the measured process, not in workers
    return env


def run_child(spec: dict[str, Any]) -> dict[str, Any]:
    """One measurement in a fresh process: its result, or ``{"note": why it failed}``."""
    return bench_deps.run_child("modeldsl.tools.bench_cpu", RESULT, spec, child_env(spec["threads"]))


def save_random_checkpoint(config: dict[str, Any], directory: Path, config_class: str = "LlamaConfig") -> Path:
    """A model of ``config`` (transformers' ``config_class``) with random weights (seed 0), fp32, saved once
    in ``directory``."""
    if (directory / "config.json").exists():
        return directory
    import torch
    import transformers

    transformers.utils.logging.disable_progress_bar()
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(getattr(transformers, config_class)(**config),
                                                          dtype=torch.float32)
    partial = directory.with_name(directory.name + ".partial")
    model.save_pretrained(partial)
    partial.rename(directory)
    return directory


@dataclass(frozen=True)
class Job:
    """The measurements of one table group: one child per runner per round."""

    section: str
    shape: str
    runners: tuple[str, ...]
    spec: dict[str, Any]


def jobs(args: argparse.Namespace, checkpoints: dict[str, Path]) -> list[Job]:
    runners = tuple(args.runners.split(","))
    torch_peer = tuple(r for r in runners if r != "compile")
    common = dict(threads=args.threads, steps=args.steps, warmup=args.warmup)
    train = dict(common, task="train", batch=args.batch, seq=args.seq)
    out = [Job("train", name, runners, dict(train, hf=str(path))) for name, path in checkpoints.items()]
    for shape in args.shapes.split(","):
        spec = dict(common, hf=str(checkpoints[shape]), vocab=SHAPES[shape][2]["vocab_size"])
        out += [Job(f"prefill T={t}", shape, torch_peer, dict(spec, task="prefill", tokens=t)) for t in args.prefill]
        out.append(Job("decode", shape, torch_peer, dict(spec, task="decode", prompt=args.prompt, new=args.decode)))
    return out


def load_job(args: argparse.Namespace) -> Job:
    config = LOAD_SHAPES[args.load_shape]
    path = save_random_checkpoint(config, args.cache_dir / args.load_shape)
    spec = dict(task="load", threads=args.threads, hf=str(path), vocab=config["vocab_size"])
    return Job("load", args.load_shape, ("modeldsl", "transformers"), spec)


def measure(job: Job, repeats: int) -> list[Row]:
    """Alternate the runners' processes for ``repeats`` rounds; each runner's best row."""
    results: dict[str, list[dict[str, Any]]] = {runner: [] for runner in job.runners}
    for _ in range(repeats):
        for runner in job.runners:
            result = run_child(dict(job.spec, runner=runner))
            results[runner].append(result)
            print(f"  {job.section} {job.shape} {runner}: {describe(job.section, result)}", flush=True)
    return [best_row(job, runner, found) for runner, found in results.items()]


def describe(section: str, result: dict[str, Any]) -> str:
    if "value" not in result:
        return result["note"]
    value = f"{result['value']:.2f} s" if section == "load" else f"{result['value']:,.0f} tokens/s"
    return f"{value}, peak RSS {result['peak_rss'] / MiB:,.0f} MiB"


def best_row(job: Job, runner: str, results: list[dict[str, Any]]) -> Row:
    """The best value (load: the fewest seconds, else the most tokens/s) and the highest peak RSS."""
    good = [r for r in results if "value" in r]
    if not good:
        return Row(job.section, job.shape, runner, note=results[-1]["note"])
    values = [r["value"] for r in good]
    finite = all(math.isfinite(x) for r in good for x in r.get("losses", ()))
    return Row(job.section, job.shape, runner, min(values) if job.section == "load" else max(values),
               max(r["peak_rss"] for r in good), good[0].get("weight_bytes"), "" if finite else "non-finite loss",
               values)


# ---------------------------------------------------------------------------- the table
def ratio(value: float | None, peer: float | None) -> float | None:
    return None if value is None or not peer else value / peer


def fmt_ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def table(rows: list[Row]) -> str:
    """The speed and RSS rows of every (section, shape), ratios against eager and compile."""
    lines = [f"{'section':<14} {'shape':<10} {'runner':<9} {'tokens/s':>10} {'x eager':>8} {'x compile':>9} "
             f"{'RSS MiB':>8} {'x eager':>8} {'x compile':>9}  target"]
    for key in dict.fromkeys((r.section, r.shape) for r in rows if r.section != "load"):
        group = {r.runner: r for r in rows if (r.section, r.shape) == key}
        eager, compiled = group.get("eager"), group.get("compile")
        for row in group.values():
            speed = "-" if row.value is None else f"{row.value:,.0f}"
            rss = "-" if row.peak_rss is None else f"{row.peak_rss / MiB:,.0f}"
            ratios = [fmt_ratio(ratio(getattr(row, column), getattr(peer, column, None)))
                      for column in ("value", "peak_rss") for peer in (eager, compiled)]
            target = targets_met(row, group) if row.runner == "modeldsl" else row.note
            lines.append(f"{key[0]:<14} {key[1]:<10} {row.runner:<9} {speed:>10} {ratios[0]:>8} {ratios[1]:>9} "
                         f"{rss:>8} {ratios[2]:>8} {ratios[3]:>9}  {target}")
    return "\n".join(lines)


def targets_met(row: Row, group: dict[str, Row]) -> str:
    """The issue's targets of ``row``'s section, each with whether it is met: ``speed >= 1.0x eager: no``."""
    words = []
    for kind, bound, peer_name in TARGETS.get("train" if row.section == "train" else row.section, ()):
        column = "value" if kind == "speed" else "peak_rss"
        found = ratio(getattr(row, column), getattr(group.get(peer_name), column, None))
        sign = ">=" if kind == "speed" else "<="
        met = "-" if found is None else ("yes" if (found >= bound if kind == "speed" else found <= bound) else "no")
        words.append(f"{'RSS' if kind == 'rss' else kind} {sign} {bound}x {peer_name}: {met}")
    return "; ".join(words) if words else row.note


def load_table(rows: list[Row]) -> str:
    """Load + first forward: seconds and peak RSS against transformers' and the fp32 weights."""
    by_runner = {r.runner: r for r in rows}
    dsl, hf = by_runner.get("modeldsl"), by_runner.get("transformers")
    weights = dsl.weight_bytes if dsl else None
    lines = [f"{'load + first forward':<22} {'seconds':>8} {'RSS MiB':>8} {'x weights':>9}  "
             f"(fp32 weights: {'-' if weights is None else f'{weights / MiB:,.1f}'} MiB)"]
    for row in rows:
        seconds = "-" if row.value is None else f"{row.value:.2f}"
        rss = "-" if row.peak_rss is None else f"{row.peak_rss / MiB:,.0f}"
        lines.append(f"{row.shape + ' ' + row.runner:<22} {seconds:>8} {rss:>8} "
                     f"{fmt_ratio(ratio(row.peak_rss, weights)):>9}  {row.note}")
    time_ratio = ratio(dsl.value if dsl else None, hf.value if hf else None)
    rss_ratio = ratio(dsl.peak_rss if dsl else None, weights)
    lines.append(f"targets: time {fmt_ratio(time_ratio)} of transformers' (<= 1.0x: {met(time_ratio, 1.0)}); "
                 f"peak RSS {fmt_ratio(rss_ratio)} of the fp32 weights (<= 1.1x: {met(rss_ratio, 1.1)})")
    return "\n".join(lines)


def met(found: float | None, bound: float) -> str:
    return "-" if found is None else ("yes" if found <= bound else "no")


# ---------------------------------------------------------------------------- the command
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m modeldsl.tools.bench_cpu", description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2, help="threads of every runner (BLAS, OpenMP, torch, modeldsl)")
    p.add_argument("--repeats", type=int, default=2, help="rounds of alternating runner processes; the best counts")
    p.add_argument("--shapes", default="small", help=f"comma-separated shapes of bench.py: {', '.join(SHAPES)}")
    p.add_argument("--checkpoint", default=str(BUNDLED_CHECKPOINT),
                   help="a HuggingFace Llama checkpoint also trained on ('none': only --shapes)")
    p.add_argument("--runners", default=",".join(RUNNERS), help=f"comma-separated: {', '.join(RUNNERS)}; eager "
                   "is the peer of the ratios and always runs")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--steps", type=int, default=5, help="timed steps (prefill: forwards, decode: generations)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--prefill", default="64,256,1024", help="comma-separated prompt lengths of the prefill rows")
    p.add_argument("--prompt", type=int, default=64, help="the prompt length before decoding")
    p.add_argument("--decode", type=int, default=32, help="new tokens decoded (greedy, KV cache)")
    p.add_argument("--load", action="store_true", help="also time load + first forward of TinyLlama-1.1B-shaped "
                   "random weights (writes a 4.4 GB checkpoint into --cache-dir once)")
    p.add_argument("--load-shape", default="tinyllama-1.1b", choices=tuple(LOAD_SHAPES))
    p.add_argument("--cache-dir", type=Path, default=Path("/tmp/mdsl-bench-cpu"))
    p.add_argument("--json", type=Path, help="write the rows (and the settings) to this file")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    check_args(p, args)
    return args


def check_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    for name, values, known in (("--shapes", args.shapes, list(SHAPES)), ("--runners", args.runners, RUNNERS)):
        unknown = [v for v in values.split(",") if v not in known]
        if unknown:
            p.error(f"{name}: unknown {', '.join(unknown)} (choose from {', '.join(known)})")
    if "eager" not in args.runners.split(","):
        args.runners = "eager," + args.runners
    try:
        args.prefill = [int(t) for t in args.prefill.split(",")]
    except ValueError:
        p.error(f"--prefill: '{args.prefill}' is not comma-separated whole numbers")
    for name in ("threads", "repeats", "batch", "seq", "steps", "prompt"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1")
    if args.decode < 2 or min(args.prefill) < 1 or args.warmup < 0:
        p.error("--decode must be at least 2, --prefill lengths at least 1 and --warmup not negative")
    if args.checkpoint != "none" and not (Path(args.checkpoint) / "config.json").is_file():
        p.error(f"--checkpoint {args.checkpoint}: no config.json there (give a HuggingFace checkpoint folder)")


def load_average() -> str:
    return "load average {:.1f} {:.1f} {:.1f}".format(*os.getloadavg())


def main(argv: list[str] | None = None) -> int:
    return reporting_diagnostics(lambda: run(argv))


def run(argv: list[str] | None) -> int:
    args = parse_args(argv)
    if args.child is not None:
        print(RESULT + json.dumps(child_main(json.loads(args.child))), flush=True)
        return 0
    require_packages(("torch", "transformers"), "python -m modeldsl.tools.bench_cpu", "the PyTorch runners")
    print(f"CPU benchmark: fp32, {args.threads} threads for every runner, {args.repeats} alternating rounds of "
          f"fresh processes, each runner's best tokens/s (load: fewest seconds) and highest peak RSS; "
          f"{load_average()}", flush=True)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="mdsl-bench-cpu-") as temp:
        checkpoints = {s: save_random_checkpoint(SHAPES[s][2], Path(temp) / s, SHAPES[s][0])
                       for s in args.shapes.split(",")}
        if args.checkpoint != "none":
            checkpoints[Path(args.checkpoint).name] = Path(args.checkpoint).resolve()
        for job in jobs(args, checkpoints):
            rows += measure(job, args.repeats)
    print(f"{load_average()} (others' processes slow the runners down, PyTorch's OpenMP threads most)")
    print(table(rows))
    if args.load:
        load_rows = measure(load_job(args), args.repeats)
        print(load_table(load_rows))
        rows += load_rows
    if args.json is not None:
        settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "child"}
        write_file(args.json, json.dumps({"settings": settings, "rows": [asdict(r) for r in rows]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
