"""Benchmark (not a test): the peak memory of loading a checkpoint, modeldsl against transformers.

``python -m modeldsl.tools.bench_load`` loads, for each of ``--shapes`` (published dimensions,
few layers: TinyLlama-1.1B, OLMo-2-7B at 2 layers, Gemma-3-1B, Mixtral-8x7B at 1 layer; also
Gemma-2-2B at 4 layers, Mixtral-8x7B at 2 layers and the tests' ``tiny``), a checkpoint of random
weights (normal(0, 0.02), seed 0, in ``--file-dtype``, written once into ``--cache-dir`` tensor
by tensor) in fp32 with each runner, in fresh processes that alternate between the runners for
``--repeats`` rounds:

* ``modeldsl``: ``modeldsl.load(hf=dir)`` (the std model the registry serves);
* ``transformers``: ``AutoModelForCausalLM.from_pretrained(dir, dtype=torch.float32)``.

Each process imports its runner's packages first, takes its resident set then as its
*baseline*, resets its peak (``/proc/self/clear_refs``), loads, and reports the *load peak*:
the highest resident set (``VmHWM``, anonymous and file-backed pages alike) from the start of the
load to its end. It then runs a forward of a 16-token prompt and reports the peak up to then too
(the *forward peak*: the weights the forward used are resident by then). Both count file pages
mapped into the process as well as anonymous memory: transformers (5.x) memory-maps an fp32
checkpoint and reads it only in the forward, and modeldsl maps an fp32 file's pages into its
params arena where they line up, leaving them untouched until the forward, so for fp32 files
the forward peak is the one that compares the weights held (a model whose forward reads few
rows of its embedding never holds the rest); a bf16 file is converted at load by both. The
table gives, per shape and runner, the baseline, the load peak and the forward peak, each in
total and over the baseline against the weights' fp32 bytes (the checkpoint's tensors at 4
bytes an element, the same for both runners) and against transformers' in the same run, the
seconds of the load and of the first forward; then the targets (peak <= 1.1x the weights, <=
transformers') over the load and over load + forward. Every row keeps the highest peaks and
the fewest seconds of its rounds. The parent reads a checkpoint's files before each process
(so the seconds are the loader's, not the disk's, where the page cache holds them). Before a
shape is written or loaded the free disk and the available memory are checked; a shape that
does not fit is skipped with the reason. ``--json`` writes the rows.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import struct
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from modeldsl.tools import bench_deps
from modeldsl.tools.bench_deps import reporting_diagnostics, require_packages

# name -> (transformers config class, HF config); published dimensions, fewer layers where noted
SHAPES: dict[str, tuple[str, dict[str, Any]]] = {
    "tinyllama-1.1b": ("LlamaConfig", dict(
        vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
        num_key_value_heads=4, max_position_embeddings=2048, rms_norm_eps=1e-5)),
    "olmo2-7b-2l": ("Olmo2Config", dict(
        vocab_size=100352, hidden_size=4096, intermediate_size=11008, num_hidden_layers=2, num_attention_heads=32,
        num_key_value_heads=32, max_position_embeddings=4096, rope_theta=500000.0, rms_norm_eps=1e-6,
        tie_word_embeddings=False, pad_token_id=100277, eos_token_id=100257)),
    "gemma3-1b": ("Gemma3TextConfig", dict(
        vocab_size=262144, hidden_size=1152, intermediate_size=6912, num_hidden_layers=26, num_attention_heads=4,
        num_key_value_heads=1, head_dim=256, max_position_embeddings=32768, query_pre_attn_scalar=256,
        sliding_window=512, rope_local_base_freq=10000.0, rope_theta=1000000.0)),
    "mixtral-8x7b-1l": ("MixtralConfig", dict(
        vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=1, num_attention_heads=32,
        num_key_value_heads=8, num_local_experts=8, num_experts_per_tok=2, max_position_embeddings=32768,
        rope_theta=1000000.0, rms_norm_eps=1e-5)),
    "gemma2-2b-4l": ("Gemma2Config", dict(
        vocab_size=256000, hidden_size=2304, intermediate_size=9216, num_hidden_layers=4, num_attention_heads=8,
        num_key_value_heads=4, head_dim=256, max_position_embeddings=8192, query_pre_attn_scalar=256,
        sliding_window=4096, attn_logit_softcapping=50.0, final_logit_softcapping=30.0)),
    "mixtral-8x7b-2l": ("MixtralConfig", dict(
        vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=2, num_attention_heads=32,
        num_key_value_heads=8, num_local_experts=8, num_experts_per_tok=2, max_position_embeddings=32768,
        rope_theta=1000000.0, rms_norm_eps=1e-5)),
    "tiny": ("LlamaConfig", dict(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128)),
}
DEFAULT_SHAPES = ("tinyllama-1.1b", "olmo2-7b-2l", "gemma3-1b", "mixtral-8x7b-1l")
RUNNERS = ("modeldsl", "transformers")
FILE_DTYPES = {"fp32": ("F32", 4), "bf16": ("BF16", 2)}  # --file-dtype -> (safetensors dtype, bytes an element)
RUN_ITEMSIZE = 4  # both runners load in fp32
PROMPT = 16
RESULT = "bench_load result: "  # the child's last stdout line: this marker, then its JSON
FILL_CHUNK = 1 << 24  # elements of random values made at a time when writing a checkpoint
MiB = float(1 << 20)
GiB = float(1 << 30)
TARGET_WEIGHTS = 1.1  # peak <= 1.1x the fp32 weights
TARGET_PEER = 1.0  # peak <= transformers'


@dataclass
class Row:
    shape: str
    runner: str
    weight_bytes: int  # the checkpoint's tensors in fp32
    baseline: int | None = None  # resident bytes after the imports, before the load
    load_peak: int | None = None  # peak resident bytes over the load (imports included)
    forward_peak: int | None = None  # peak resident bytes up to the end of the first forward
    seconds: float | None = None  # the load's
    forward_seconds: float | None = None  # the first forward's (a lazy loader reads the weights then)
    note: str = ""

    @property
    def load_delta(self) -> int | None:
        return None if self.load_peak is None or self.baseline is None else self.load_peak - self.baseline


# ---------------------------------------------------------------------------- memory of this process
def status_bytes(field: str) -> int | None:
    """A ``/proc/self/status`` size (``VmRSS``, ``VmHWM``, ``RssFile``) in bytes; None without /proc."""
    try:
        lines = Path("/proc/self/status").read_text().splitlines()
    except OSError:
        return None
    line = next((line for line in lines if line.startswith(field + ":")), None)
    return int(line.split()[1]) * 1024 if line is not None else None


def reset_peak() -> bool:
    """Start ``VmHWM`` again from the current resident set (Linux's clear_refs "5"); False where
    it cannot, and the peak then includes what the imports held at their highest."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


# ---------------------------------------------------------------------------- the children
def child_main(spec: dict[str, Any]) -> dict[str, Any]:
    """Load ``spec["hf"]`` with ``spec["runner"]`` in this process; its memory figures."""
    load, forward = (modeldsl_runner if spec["runner"] == "modeldsl" else transformers_runner)(spec["threads"])
    ids = np.random.default_rng(1).integers(0, spec["vocab"], PROMPT)
    baseline = status_bytes("VmRSS")
    reset = reset_peak()
    start = time.perf_counter()
    model = load(spec["hf"])
    seconds = time.perf_counter() - start
    load_peak, held, held_file = status_bytes("VmHWM"), status_bytes("VmRSS"), status_bytes("RssFile")
    start = time.perf_counter()
    logits = forward(model, ids)
    return {"baseline": baseline, "load_peak": load_peak, "held": held, "held_file": held_file,
            "forward_peak": status_bytes("VmHWM"), "seconds": seconds, "forward_seconds": time.perf_counter() - start,
            "peak_reset": reset, "finite": bool(np.isfinite(logits).all())}


def modeldsl_runner(threads: int) -> tuple[Callable[[str], Any], Callable[[Any, np.ndarray], np.ndarray]]:
    import modeldsl
    import modeldsl.runtime.model  # what a load imports, before the baseline

    return (lambda directory: modeldsl.load(hf=directory)), (lambda model, ids: model.forward(ids))


def transformers_runner(threads: int) -> tuple[Callable[[str], Any], Callable[[Any, np.ndarray], np.ndarray]]:
    import torch
    import transformers

    torch.set_num_threads(threads)
    transformers.utils.logging.disable_progress_bar()

    def load(directory: str) -> Any:
        return transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()

    def forward(model: Any, ids: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return model(torch.as_tensor(ids)[None, :]).logits[0].numpy()

    return load, forward


# ---------------------------------------------------------------------------- the checkpoints
def checkpoint_tensors(shape: str) -> tuple[Any, list[tuple[str, tuple[int, ...]]]]:
    """The transformers config of ``shape`` and its checkpoint's tensors (name, shape) as
    save_pretrained names them: a model built on the meta device (nothing allocated), each shared
    (tied) tensor once, under its first name, through transformers' reverse weight conversion
    (Mixtral's fused experts saved as the Hub's one tensor per expert)."""
    import torch
    import transformers
    from transformers.core_model_loading import revert_weight_conversion

    class_name, values = SHAPES[shape]
    config = getattr(transformers, class_name)(**values)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    seen: set[int] = set()
    state = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        if id(tensor) not in seen:
            seen.add(id(tensor))
            state[name] = tensor
    config.architectures = [type(model).__name__]
    return config, [(name, tuple(tensor.shape)) for name, tensor in revert_weight_conversion(model, state).items()]


def safetensors_header(tensors: list[tuple[str, tuple[int, ...]]], file_dtype: str) -> bytes:
    """The 8-byte length and the JSON header (padded to 8 bytes) of ``tensors`` one after another."""
    code, itemsize = FILE_DTYPES[file_dtype]
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, dims in tensors:
        size = math.prod(dims) * itemsize
        header[name] = {"dtype": code, "shape": list(dims), "data_offsets": [offset, offset + size]}
        offset += size
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)
    return struct.pack("<Q", len(encoded)) + encoded


def random_chunks(count: int, file_dtype: str, rng: np.random.Generator) -> Iterator[bytes]:
    """``count`` normal(0, 0.02) values in the file's dtype, at most :data:`FILL_CHUNK` at a time."""
    import ml_dtypes

    target = np.float32 if file_dtype == "fp32" else ml_dtypes.bfloat16
    for begin in range(0, count, FILL_CHUNK):
        values = rng.standard_normal(min(FILL_CHUNK, count - begin), dtype=np.float32) * np.float32(0.02)
        yield values.astype(target).tobytes()


def file_bytes(tensors: list[tuple[str, tuple[int, ...]]], file_dtype: str) -> int:
    return sum(math.prod(dims) for _, dims in tensors) * FILE_DTYPES[file_dtype][1]


def weight_bytes(tensors: list[tuple[str, tuple[int, ...]]]) -> int:
    """The tensors' bytes in the run dtype (fp32)."""
    return sum(math.prod(dims) for _, dims in tensors) * RUN_ITEMSIZE


def write_checkpoint(shape: str, directory: Path, file_dtype: str) -> Path:
    """The random checkpoint of ``shape`` in ``directory``, written once (one tensor's chunk in
    memory at a time; into a ``.partial`` folder renamed when complete)."""
    if (directory / "config.json").is_file():
        return directory
    config, tensors = checkpoint_tensors(shape)
    partial = directory.with_name(directory.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    rng = np.random.default_rng(0)
    with open(partial / "model.safetensors", "wb") as f:
        f.write(safetensors_header(tensors, file_dtype))
        for _, dims in tensors:
            for chunk in random_chunks(math.prod(dims), file_dtype, rng):
                f.write(chunk)
    config.save_pretrained(partial)
    partial.rename(directory)
    return directory


def cached_checkpoint(shape: str, cache_dir: Path, file_dtype: str) -> tuple[Path, int] | str:
    """The checkpoint of ``shape`` and its fp32 weight bytes, or why it is skipped (the disk
    cannot hold it)."""
    directory = cache_dir / f"{shape}-{file_dtype}"
    _, tensors = checkpoint_tensors(shape)
    if not (directory / "config.json").is_file():
        cache_dir.mkdir(parents=True, exist_ok=True)
        needed, free = file_bytes(tensors, file_dtype), shutil.disk_usage(cache_dir).free
        if needed + (1 << 30) > free:
            return f"skipped: the checkpoint needs {needed / GiB:.1f} GiB of disk, {free / GiB:.1f} GiB are free"
        write_checkpoint(shape, directory, file_dtype)
    return directory, weight_bytes(tensors)


def memory_problem(weights: int, headroom: float) -> str:
    """Why a shape of ``weights`` fp32 bytes cannot be loaded now ("" when it can): a load may
    hold ``headroom`` times the weights (a peer that converts through a temporary), plus 1 GiB."""
    from modeldsl.runtime.fits import available_bytes

    needed, available = headroom * weights + (1 << 30), available_bytes()
    if needed <= available:
        return ""
    return f"skipped: a load may need {needed / GiB:.1f} GiB of memory, {available / GiB:.1f} GiB are available"


# ---------------------------------------------------------------------------- the parent
def child_env(threads: int) -> dict[str, str]:
    env = dict(os.environ)
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "MDSL_NUM_THREADS"):
        env[name] = str(threads)
    return env


def run_child(spec: dict[str, Any]) -> dict[str, Any]:
    """One load in a fresh process: its figures, or ``{"note": why it failed}``."""
    return bench_deps.run_child("modeldsl.tools.bench_load", RESULT, spec, child_env(spec["threads"]))


def measure(shape: str, directory: Path, weights: int, args: argparse.Namespace,
            child: Callable[[dict[str, Any]], dict[str, Any]] = run_child) -> list[Row]:
    """Alternate the runners' processes for ``args.repeats`` rounds; each runner's highest figures."""
    vocab = SHAPES[shape][1]["vocab_size"]
    results: dict[str, list[dict[str, Any]]] = {runner: [] for runner in args.runners}
    for _ in range(args.repeats):
        for runner in args.runners:
            problem = memory_problem(weights, args.headroom)
            if not problem:
                warm_page_cache(directory)
            result = {"note": problem} if problem else child(dict(runner=runner, hf=str(directory), vocab=vocab,
                                                                  threads=args.threads))
            results[runner].append(result)
            print(f"  {shape} {runner}: {describe(result, weights)}", flush=True)
    return [highest(shape, runner, weights, found) for runner, found in results.items()]


def warm_page_cache(directory: Path, chunk: int = 1 << 26) -> None:
    """Read the checkpoint's files once (the parent, not a measured process), so that each
    runner's seconds are its loader's and not the disk's where the page cache holds them."""
    buffer = bytearray(chunk)
    for path in sorted(directory.glob("*.safetensors")):
        with open(path, "rb", buffering=0) as f:
            while f.readinto(buffer):
                pass


def describe(result: dict[str, Any], weights: int) -> str:
    if "load_peak" not in result:
        return result["note"]
    delta = result["load_peak"] - result["baseline"]
    return (f"load peak {result['load_peak'] / MiB:,.0f} MiB ({delta / MiB:+,.0f} over its baseline, "
            f"{delta / weights:.2f}x the fp32 weights), forward peak {result['forward_peak'] / MiB:,.0f} MiB, "
            f"held {result['held'] / MiB:,.0f} MiB ({result['held_file'] / MiB:,.0f} of it file pages), "
            f"{result['seconds']:.1f} s + {result['forward_seconds']:.1f} s of forward")


def highest(shape: str, runner: str, weights: int, results: list[dict[str, Any]]) -> Row:
    """A runner's row: the highest baseline and peaks of its rounds, the fewest seconds."""
    good = [r for r in results if "load_peak" in r]
    if not good:
        return Row(shape, runner, weights, note=results[-1]["note"])
    notes = [] if all(r["finite"] for r in good) else ["non-finite logits"]
    notes += [] if all(r["peak_reset"] for r in good) else ["peaks include the imports'"]
    return Row(shape, runner, weights, max(r["baseline"] for r in good), max(r["load_peak"] for r in good),
               max(r["forward_peak"] for r in good), min(r["seconds"] for r in good),
               min(r["forward_seconds"] for r in good), "; ".join(notes))


# ---------------------------------------------------------------------------- the table
def ratio(value: int | float | None, peer: int | float | None) -> float | None:
    return None if value is None or not peer else value / peer


def fmt_ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def fmt_mib(value: int | None) -> str:
    return "-" if value is None else f"{value / MiB:,.0f}"


def fmt_seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def met(found: float | None, bound: float) -> str:
    return "-" if found is None else ("yes" if found <= bound else "no")


HEADER = (f"{'shape':<16} {'runner':<12} {'weights':>8} {'base':>6} {'load peak':>9} {'x wts':>6} {'x tf':>6} "
          f"{'over base':>9} {'x wts':>6} {'x tf':>6} {'fwd peak':>8} {'x wts':>6} {'x tf':>6} "
          f"{'load s':>6} {'+fwd s':>6}")


def table(rows: list[Row]) -> str:
    """Per shape and runner: MiB of the fp32 weights, the baseline, the load peak (total and over
    the baseline, each against the weights and transformers'), the forward peak and the load's
    seconds; then whether modeldsl meets the targets."""
    lines = [HEADER]
    for shape in dict.fromkeys(r.shape for r in rows):
        group = {r.runner: r for r in rows if r.shape == shape}
        peer = group.get("transformers")
        for row in group.values():
            lines.append(f"{row.shape:<16} {row.runner:<12} {fmt_mib(row.weight_bytes):>8} {fmt_mib(row.baseline):>6} "
                         f"{fmt_mib(row.load_peak):>9} {fmt_ratio(ratio(row.load_peak, row.weight_bytes)):>6} "
                         f"{fmt_ratio(ratio(row.load_peak, peer and peer.load_peak)):>6} "
                         f"{fmt_mib(row.load_delta):>9} {fmt_ratio(ratio(row.load_delta, row.weight_bytes)):>6} "
                         f"{fmt_ratio(ratio(row.load_delta, peer and peer.load_delta)):>6} "
                         f"{fmt_mib(row.forward_peak):>8} {fmt_ratio(ratio(row.forward_peak, row.weight_bytes)):>6} "
                         f"{fmt_ratio(ratio(row.forward_peak, peer and peer.forward_peak)):>6} "
                         f"{fmt_seconds(row.seconds):>6} {fmt_seconds(row.forward_seconds):>6}  {row.note}")
    lines += [targets(group_rows) for group_rows in grouped(rows)]
    return "\n".join(lines)


def grouped(rows: list[Row]) -> list[list[Row]]:
    return [[r for r in rows if r.shape == shape] for shape in dict.fromkeys(r.shape for r in rows)]


def targets(rows: list[Row]) -> str:
    """One shape's targets for modeldsl, over the load and over load + first forward: the peak
    <= 1.1x the fp32 weights and <= transformers' peak, each in total and over the baseline."""
    by_runner = {r.runner: r for r in rows}
    dsl, peer = by_runner.get("modeldsl"), by_runner.get("transformers")
    if dsl is None:
        return f"{rows[0].shape}: no modeldsl row"
    return f"{dsl.shape}: " + "; ".join(f"{what} peak {verdicts(dsl, peer, field)}" for what, field in
                                        (("load", "load_peak"), ("load + forward", "forward_peak")))


def verdicts(dsl: Row, peer: Row | None, field: str) -> str:
    """Whether ``dsl``'s peak ``field`` meets both bounds, in total and over its baseline."""
    words = []
    for bound, name, against in ((TARGET_WEIGHTS, "the fp32 weights", None), (TARGET_PEER, "transformers'", peer)):
        found = [ratio(_peak(dsl, field, over), _peak(against, field, over) if against else dsl.weight_bytes)
                 for over in (False, True)]
        words.append(f"<= {bound}x {name}: {met(found[0], bound)} ({fmt_ratio(found[0])}; over the baseline "
                     f"{met(found[1], bound)}, {fmt_ratio(found[1])})")
    return ", ".join(words)


def _peak(row: Row | None, field: str, over_baseline: bool) -> int | None:
    value = getattr(row, field) if row is not None else None
    if value is None or not over_baseline:
        return value
    return None if row.baseline is None else value - row.baseline


# ---------------------------------------------------------------------------- the command
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m modeldsl.tools.bench_load", description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default=",".join(DEFAULT_SHAPES), help=f"comma-separated: {', '.join(SHAPES)}")
    p.add_argument("--runners", default=",".join(RUNNERS), help=f"comma-separated: {', '.join(RUNNERS)}")
    p.add_argument("--file-dtype", default="fp32", choices=tuple(FILE_DTYPES), help="the checkpoint's dtype")
    p.add_argument("--repeats", type=int, default=2, help="rounds of alternating runner processes")
    p.add_argument("--threads", type=int, default=2, help="threads of every runner (BLAS, OpenMP, torch, modeldsl)")
    p.add_argument("--headroom", type=float, default=2.2, help="skip a load unless this many times the fp32 "
                   "weights (plus 1 GiB) are available")
    p.add_argument("--cache-dir", type=Path, default=Path("/tmp/mdsl-bench-load"))
    p.add_argument("--json", type=Path, help="write the rows (and the settings) to this file")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for name, values, known in (("--shapes", args.shapes, SHAPES), ("--runners", args.runners, RUNNERS)):
        unknown = [v for v in values.split(",") if v not in known]
        if unknown:
            p.error(f"{name}: unknown {', '.join(unknown)} (choose from {', '.join(known)})")
    args.shapes, args.runners = args.shapes.split(","), args.runners.split(",")
    if args.repeats < 1 or args.threads < 1 or args.headroom <= 0:
        p.error("--repeats and --threads must be at least 1, --headroom positive")
    return args


def main(argv: list[str] | None = None) -> int:
    return reporting_diagnostics(lambda: run(argv))


def run(argv: list[str] | None) -> int:
    args = parse_args(argv)
    if args.child is not None:
        print(RESULT + json.dumps(child_main(json.loads(args.child))), flush=True)
        return 0
    require_packages(("torch", "transformers"), "python -m modeldsl.tools.bench_load",
                     "the transformers runner and the checkpoints' tensor names")
    print(f"Load benchmark: {args.file_dtype} checkpoints loaded in fp32, {args.threads} threads, {args.repeats} "
          f"alternating rounds of fresh processes; peaks are resident sets (VmHWM) over the load", flush=True)
    rows: list[Row] = []
    for shape in args.shapes:
        found = cached_checkpoint(shape, args.cache_dir, args.file_dtype)
        if isinstance(found, str):
            print(f"  {shape}: {found}", flush=True)
            rows += [Row(shape, runner, weight_bytes(checkpoint_tensors(shape)[1]), note=found)
                     for runner in args.runners]
            continue
        rows += measure(shape, *found, args)
    print(table(rows))
    if args.json is not None:
        settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "child"}
        args.json.write_text(json.dumps({"settings": settings, "rows": [asdict(r) for r in rows]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
