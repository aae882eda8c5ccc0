"""Benchmark (not a test): activation memory of a planned forward against no reuse and PyTorch.

For the bundled tiny Llama (``examples/tiny_llama``, its ``config.json``) and
a 2-layer Llama-3.2-1B-shaped model (d_model 2048, 32 query heads, 8 kv
heads, head_dim 64, d_ff 8192, vocab 128256, tied embeddings), one inference
forward at batch 1 and ``T = 512`` tokens, the script prints three numbers
and their ratios. Run: ``python -m modeldsl.tools.bench_memory``.

**Planned arena** (modeldsl). The std Llama model is lowered with the
configuration, specialized to ``B = 1, T = 512`` and compiled the way the
runtime compiles a profile (:func:`modeldsl.runtime.profiles.compile_profile`,
``storage="fp32"``: ``mdsl-lower-to-sched`` then ``mdsl-plan-memory`` with
its defaults). The arena is the ``activations`` plus the ``workspace`` arena
size of the planned program (``grads`` is empty in a forward). The
``external`` arena (the token ids and RoPE table in, the logits out) and the
``params`` arena are not part of it: the logits buffer is the caller's
output, never an intermediate. The table prints the logits size on its own.

**Sum of intermediates** (modeldsl, no reuse). What a runtime that gives
every intermediate tensor its own memory and frees nothing holds at the end
of the same forward: the sum of ``nbytes x copies`` over every buffer of the
*unplanned* program (the output of ``mdsl-lower-to-sched``, before
``mdsl-plan-memory`` adds in-place aliases) that

* lies in the ``activations`` or ``workspace`` arena (not a parameter, not
  an input or the output), and
* is not an alias (``alias_of``: views, reshapes and splits along the
  outermost dimension share their root's memory and are not counted).

``copies`` counts layers: a layer loop's body declares its buffers once, but
a runtime without reuse makes new ones every layer. A buffer whose group (it,
its aliases and layer views) is used only inside a ``layer_loop`` and is not
live across iterations (not carried from one layer to the next, see
``mdsl-plan-memory``'s liveness) gets ``copies = trips`` of that loop
(multiplied over nested loops); a buffer used outside the loop or carried
across it (the residual stream ``x0``) gets one copy. A buffer that no step
uses (none in these models) counts once.

**PyTorch peak** (transformers ``LlamaForCausalLM``, same configuration,
random weights with ``torch.manual_seed(0)``, CPU, fp32, ``torch.no_grad()``,
``use_cache=False``, the default ``sdpa`` attention). One warm-up forward of 8
tokens, then the measured forward runs under
``torch.profiler.profile(profile_memory=True)``. Every allocation and free of
PyTorch's CPU allocator is an allocation event of the profile (address,
bytes +/-, the allocator's running total, the op that made it; read from
the profiler's event tree). Summing the bytes in time order gives the bytes
allocated above the level when the profiler started (weights and inputs
already existed and are excluded); the **peak** is the largest running sum.
It includes the logits (the forward's output, allocated by the LM head
GEMM) and scratch that kernels allocate through PyTorch's allocator (the CPU
flash-attention kernel's buffers). The peak **without the output** subtracts
the logits from the running sum from their allocation on: the intermediates
alone, like for like with the planned arena, which holds no output. (The
``FunctionEvent`` list of ``prof.events()`` cannot be used: it attaches most
allocations to their ops and keeps only leftover frees as ``[memory]`` rows,
so its running sum goes negative.)

Checks that the number is sensible, printed with it:

* the running sum equals the allocator's own running total at every event;
* the level after the forward less the logits bytes (``left after``) is 0:
  the forward kept nothing but its output;
* the peak is at least the logits (``[1, 512, 128256]`` fp32 is 262.7 MB for
  the 1B shape);
* an independent **tensor-level peak**: a second forward under a
  ``TorchDispatchMode`` that tracks the storages of every op's outputs (weak
  references, so a freed storage leaves the sum) and records the most bytes
  alive after any op. It misses scratch that kernels allocate internally,
  so it is at most the profiler's peak, and close to it.

**Targets.** arena <= 0.5 x sum of intermediates, arena <= 0.4 x PyTorch
peak (the peak with the logits, as stated). A miss is printed as a miss,
with the buffers live at the planner's peak step and the op at PyTorch's
peak, so the cause can be read off. Because the arena holds no output while
PyTorch's peak may be mostly the logits, the table also prints the two
like-for-like ratios: arena / PyTorch's peak without the output, and
(arena + logits) / PyTorch's peak (what the process holds at once: the
planned program keeps its arena while the LM head writes the logits).

The tiny checkpoint has ``max_position_embeddings = 256``; both models here
get ``max(T, ...)`` so that 512 positions are valid (positions do not change
any buffer size). MB are 10^6 bytes.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp

from modeldsl.diagnostics import DiagnosticSink
from modeldsl.dialects.graph import ModelOp
from modeldsl.dialects.sched import ProgramOp
from modeldsl.frontend.text.parser import parse_file
from modeldsl.hf.config import dsl_config, read_config
from modeldsl.lower import choose_top, lower_program
from modeldsl.memory_report import PlacedBuffer, ProgramMemory, program_memory
from modeldsl.passes.lower_to_sched import lower_function
from modeldsl.passes.plan_memory import build_program, liveness
from modeldsl.passes.specialize import SpecializePass
from modeldsl.resolve.imports import STD_ROOT
from modeldsl.runtime.profiles import compile_profile
from modeldsl.tools.bench_deps import reporting_diagnostics, require_packages

ROOT = Path(__file__).resolve().parents[1]
TINY_LLAMA = ROOT / "examples" / "tiny_llama"
LLAMA = STD_ROOT / "models" / "llama.module"
INTERMEDIATE_ARENAS = ("activations", "workspace")
TARGET_VS_INTERMEDIATES = 0.5
TARGET_VS_TORCH = 0.4
MB = 1e6


# ----------------------------------------------------------------------------
# The two models
# ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelSpec:
    """One model: the DSL configuration of ``llama.module`` and the same model as a transformers ``LlamaConfig``."""

    name: str
    dsl: dict[str, Any]
    hf: dict[str, Any]


def tiny_llama(tokens: int = 512) -> ModelSpec:
    """The bundled tiny checkpoint's configuration (read the way ``modeldsl.load`` reads it)."""
    program = parse_file(LLAMA)
    decl = choose_top(program, None)
    hf_config = read_config(TINY_LLAMA)
    default = _model_op(lower_program(program, decl.name, None, DiagnosticSink()))
    dsl = dsl_config(decl, default, hf_config)
    dsl["max_seq"] = max(dsl["max_seq"], tokens)
    hf = _hf_config(dsl)
    return ModelSpec("tiny_llama", dsl, hf)


def llama_1b_2layers() -> ModelSpec:
    """Llama-3.2-1B's dimensions with 2 layers (tied embeddings; RoPE scaling changes no buffer and is left out)."""
    dsl = dict(vocab_size=128256, d_model=2048, n_layers=2, num_heads=32, num_kv_heads=8, head_dim=64,
               d_ff=8192, max_seq=131072, eps=1e-5, rope_theta=500000.0, tie_embeddings=True)
    return ModelSpec("llama-1B x2 layers", dsl, _hf_config(dsl))


def _hf_config(dsl: dict[str, Any]) -> dict[str, Any]:
    """The same configuration as transformers' ``LlamaConfig`` arguments."""
    return dict(vocab_size=dsl["vocab_size"], hidden_size=dsl["d_model"], intermediate_size=dsl["d_ff"],
                num_hidden_layers=dsl["n_layers"], num_attention_heads=dsl["num_heads"],
                num_key_value_heads=dsl["num_kv_heads"], head_dim=dsl["head_dim"],
                max_position_embeddings=dsl["max_seq"], rms_norm_eps=dsl["eps"], rope_theta=dsl["rope_theta"],
                tie_word_embeddings=dsl["tie_embeddings"], attention_bias=False, mlp_bias=False)


def _model_op(module: ModuleOp) -> ModelOp:
    return next(op for op in module.walk() if isinstance(op, ModelOp))


# ----------------------------------------------------------------------------
# modeldsl: the planned arena and the sum of intermediates
# ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Intermediate:
    """One non-alias activation/workspace buffer of the unplanned program and how many copies a
    runtime without reuse holds (the trips of the layer loops it is a per-layer temporary of)."""

    name: str
    arena: str
    nbytes: int
    copies: int

    @property
    def total(self) -> int:
        return self.nbytes * self.copies


@dataclass
class ScheduleMemory:
    activations: int
    workspace: int
    external: int
    logits: int
    peak_live: int
    intermediates: tuple[Intermediate, ...]
    planned: ProgramMemory = field(repr=False)

    @property
    def arena(self) -> int:
        """The planned activation arena: ``activations + workspace``."""
        return self.activations + self.workspace

    @property
    def sum_intermediates(self) -> int:
        return sum(i.total for i in self.intermediates)

    def live_at_peak(self) -> list[PlacedBuffer]:
        """The activation/workspace buffers live at the planner's peak step, largest first."""
        step = self.planned.peak_step
        if step is None:
            return []
        return sorted((p for p in self.planned.buffers if p.arena in INTERMEDIATE_ARENAS and p.interval is not None
                       and p.interval[0] <= step <= p.interval[1]), key=lambda p: (-p.nbytes, p.name))


def dsl_model(spec: ModelSpec) -> ModelOp:
    """``llama.module`` lowered with the spec's configuration and specialized (as ``modeldsl.load`` does)."""
    module = lower_program(parse_file(LLAMA), "Llama", dict(spec.dsl), DiagnosticSink())
    SpecializePass().apply(Context(), module)
    return _model_op(module)


def unplanned_program(model: ModelOp, batch: int, tokens: int, storage: str | None = "fp32") -> ProgramOp:
    """The forward schedule of ``compile_profile`` before ``mdsl-plan-memory``."""
    module = ModuleOp([model.clone()])
    SpecializePass.of(B=batch, T=tokens).apply(Context(), module)
    return lower_function(_model_op(module), "forward", storage)


def intermediates(program: ProgramOp) -> tuple[Intermediate, ...]:
    """Every non-alias ``activations``/``workspace`` buffer of an (unplanned) program with its copies
    (see the module docstring)."""
    model = build_program(program, inplace=False)
    live = liveness(model.program)
    loops = model.program.loops
    found = []
    for b, buf in enumerate(model.program.buffers):
        if buf.alias_of is not None or buf.arena not in INTERMEDIATE_ARENAS:
            continue
        span = live.interval[b]
        copies = 1
        if span is not None:
            for lid, loop in enumerate(loops):
                inside = loop.first <= span[0] and span[1] <= loop.last
                if inside and lid not in live.loop_live[b]:
                    copies *= loop.trips
        found.append(Intermediate(buf.name, buf.arena, buf.nbytes, copies))
    return tuple(found)


def schedule_memory(spec: ModelSpec, batch: int = 1, tokens: int = 512) -> ScheduleMemory:
    """The planned arena (through ``compile_profile``) and the sum of intermediates of one forward."""
    model = dsl_model(spec)
    planned = compile_profile(model, batch, tokens, "fp32")
    memory = program_memory(planned)
    logits = sum(p.nbytes for p in memory.buffers if p.arena == "external" and p.name == "logits")
    return ScheduleMemory(
        activations=memory.arenas["activations"],
        workspace=memory.arenas["workspace"],
        external=memory.arenas["external"],
        logits=logits,
        peak_live=memory.peak_live_bytes,
        intermediates=intermediates(unplanned_program(model, batch, tokens)),
        planned=memory,
    )


# ----------------------------------------------------------------------------
# PyTorch: the peak of the same forward
# ----------------------------------------------------------------------------


@dataclass(frozen=True)
class TorchMemory:
    peak: int  # profiler: most bytes allocated above the level before the forward
    peak_without_output: int  # the same, not counting the logits once they are allocated
    peak_op: str  # the op whose allocation reached the peak
    residual: int  # bytes still allocated after the forward, less the logits
    logits: int
    allocator_agrees: bool  # the running sum equals the allocator's own running total at every event
    tensor_peak: int  # dispatch mode: most bytes of op outputs alive at once
    seconds: float


def torch_model(spec: ModelSpec, seed: int = 0):
    import torch
    import transformers

    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**spec.hf)).eval()


def torch_memory(spec: ModelSpec, batch: int = 1, tokens: int = 512, seed: int = 0, model=None) -> TorchMemory:
    """PyTorch's peak activation memory of one forward (see the module docstring)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    model = torch_model(spec, seed) if model is None else model
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, spec.hf["vocab_size"], (batch, tokens), generator=generator)
    with torch.no_grad():
        model(ids[:, :8], use_cache=False)  # warm-up: lazy state, not measured
        start = time.perf_counter()
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            out = model(ids, use_cache=False)
        seconds = time.perf_counter() - start
        logits = out.logits.numel() * out.logits.element_size()
        logits_ptr = out.logits.untyped_storage().data_ptr()
        events = _allocations(prof)
        # the logits' allocation: the last one at their address (an earlier block there was freed)
        output_at = max((k for k, (ptr, size, _, _) in enumerate(events) if ptr == logits_ptr and size > 0),
                        default=len(events))
        level = peak = peak_without = 0
        peak_op, agrees = "", True
        base = events[0][2] - events[0][1] if events else 0
        for k, (_, size, total, op) in enumerate(events):
            level += size
            agrees = agrees and total - base == level
            if level > peak:
                peak, peak_op = level, op
            peak_without = max(peak_without, level - (logits if k >= output_at else 0))
        del out
        tensor_peak = _tensor_peak(model, ids)
    return TorchMemory(peak, peak_without, peak_op, level - logits, logits, agrees, tensor_peak, seconds)


def _allocations(prof) -> list[tuple[int, int, int, str]]:
    """(address, bytes (+ allocation, - free), allocator total after it, op) of every CPU allocator event of a
    profile, in time order."""
    from torch._C._profiler import _EventType

    found = []

    def walk(nodes, op: str) -> None:
        for node in nodes:
            if node.tag == _EventType.Allocation and node.extra_fields.device.type == "cpu":
                f = node.extra_fields
                found.append((node.start_time_ns, f.ptr, f.alloc_size, f.total_allocated, op))
            walk(node.children, node.name if node.tag == _EventType.TorchOp else op)

    walk(prof.profiler.kineto_results.experimental_event_tree(), "")
    found.sort(key=lambda e: e[0])
    return [e[1:] for e in found]


def _tensor_peak(model, ids) -> int:
    """Most bytes of storages created by the forward's ops alive at once (a lower bound of the profiler's
    peak: kernel-internal scratch is not seen)."""
    import torch
    from torch.multiprocessing.reductions import StorageWeakRef
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    def key(t: torch.Tensor) -> int:
        return t.untyped_storage()._cdata

    old = {key(t) for t in (*model.parameters(), *model.buffers(), ids)}

    class LiveStorages(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.live: dict[int, tuple[StorageWeakRef, int]] = {}
            self.level = self.peak = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for k in [k for k, (ref, _) in self.live.items() if ref.expired()]:
                self.level -= self.live.pop(k)[1]
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                    storage = t.untyped_storage()
                    k = storage._cdata
                    if k not in old and k not in self.live:
                        self.live[k] = (StorageWeakRef(storage), storage.nbytes())
                        self.level += storage.nbytes()
            self.peak = max(self.peak, self.level)
            return out

    with torch.no_grad(), LiveStorages() as mode:
        out = model(ids, use_cache=False)
    del out
    return mode.peak


# ----------------------------------------------------------------------------
# The table
# ----------------------------------------------------------------------------


@dataclass
class Result:
    spec: ModelSpec
    schedule: ScheduleMemory
    torch: TorchMemory

    @property
    def vs_intermediates(self) -> float:
        return self.schedule.arena / self.schedule.sum_intermediates

    @property
    def vs_torch(self) -> float:
        return self.schedule.arena / self.torch.peak


def measure(spec: ModelSpec, batch: int = 1, tokens: int = 512) -> Result:
    return Result(spec, schedule_memory(spec, batch, tokens), torch_memory(spec, batch, tokens))


def _mb(n: int) -> str:
    return f"{n / MB:,.2f} MB"


def _verdict(ratio: float, target: float) -> str:
    return f"{ratio:.3f} (target <= {target}: {'met' if ratio <= target else 'MISSED'})"


def format_table(results: list[Result], tokens: int) -> str:
    rows: list[tuple[str, list[str]]] = [
        ("modeldsl planned arena (activations + workspace)", [_mb(r.schedule.arena) for r in results]),
        ("  activations", [_mb(r.schedule.activations) for r in results]),
        ("  workspace", [_mb(r.schedule.workspace) for r in results]),
        ("  peak live bytes (planner's lower bound)", [_mb(r.schedule.peak_live) for r in results]),
        ("modeldsl sum of intermediates (no reuse)", [_mb(r.schedule.sum_intermediates) for r in results]),
        ("logits output (external arena, not in the arena)", [_mb(r.schedule.logits) for r in results]),
        ("PyTorch peak above weights (with the logits)", [_mb(r.torch.peak) for r in results]),
        ("  PyTorch peak without the logits output", [_mb(r.torch.peak_without_output) for r in results]),
        ("  check: tensor-level peak (dispatch mode)", [_mb(r.torch.tensor_peak) for r in results]),
        ("  check: left after forward less logits", [_mb(r.torch.residual) for r in results]),
        ("  check: allocator total agrees, peak >= logits",
         ["yes" if r.torch.allocator_agrees and r.torch.peak >= r.torch.logits else "NO" for r in results]),
        ("arena / sum of intermediates", [_verdict(r.vs_intermediates, TARGET_VS_INTERMEDIATES) for r in results]),
        ("arena / PyTorch peak", [_verdict(r.vs_torch, TARGET_VS_TORCH) for r in results]),
        ("  like for like: arena / PyTorch peak without logits",
         [f"{r.schedule.arena / r.torch.peak_without_output:.3f}" for r in results]),
        ("  like for like: (arena + logits) / PyTorch peak",
         [f"{(r.schedule.arena + r.schedule.logits) / r.torch.peak:.3f}" for r in results]),
    ]
    label = max(len(name) for name, _ in rows)
    widths = [max(len(r.spec.name), *(len(values[k]) for _, values in rows)) for k, r in enumerate(results)]
    title = f"forward, batch 1, T={tokens}, fp32"
    lines = [f"{title:<{label}}  " + "  ".join(f"{r.spec.name:>{w}}" for r, w in zip(results, widths))]
    lines.append("-" * len(lines[0]))
    for name, values in rows:
        lines.append(f"{name:<{label}}  " + "  ".join(f"{v:>{w}}" for v, w in zip(values, widths)))
    return "\n".join(lines)


def format_breakdown(result: Result, top: int = 8) -> str:
    """The buffers live at the planner's peak step and the largest intermediates (copies x bytes)."""
    s = result.schedule
    live = s.live_at_peak()
    lines = [f"{result.spec.name}: {len(live)} buffers live at the planner's peak step {s.planned.peak_step} "
             f"({_mb(sum(p.nbytes for p in live))} of the {_mb(s.arena)} arena):"]
    lines += [f"  %{p.name:<14} {_mb(p.nbytes):>12}  steps [{p.interval[0]}, {p.interval[1]}]" for p in live[:top]]
    if len(live) > top:
        lines.append(f"  ... {len(live) - top} more, {_mb(sum(p.nbytes for p in live[top:]))}")
    lines.append(f"  PyTorch's peak ({_mb(result.torch.peak)}) is reached by an allocation of {result.torch.peak_op}; "
                 f"without the logits its peak is {_mb(result.torch.peak_without_output)}")
    largest = sorted(s.intermediates, key=lambda i: (-i.total, i.name))[:top]
    lines.append(f"  largest intermediates without reuse (of {len(s.intermediates)}, {_mb(s.sum_intermediates)}):")
    lines += [f"  %{i.name:<14} {_mb(i.nbytes):>12} x {i.copies}" for i in largest]
    return "\n".join(lines)


def main(tokens: int = 512) -> int:
    return reporting_diagnostics(lambda: compare(tokens))


def compare(tokens: int) -> int:
    """Measure both models and print the table, the breakdowns and whether the targets are met."""
    require_packages(("torch", "transformers"), "python -m modeldsl.tools.bench_memory",
                     "PyTorch's memory of the same forward is the comparison")
    start = time.perf_counter()
    results = [measure(spec, 1, tokens) for spec in (tiny_llama(tokens), llama_1b_2layers())]
    print(format_table(results, tokens))
    print()
    for result in results:
        print(format_breakdown(result))
        print()
    missed = [r.spec.name for r in results
              if r.vs_intermediates > TARGET_VS_INTERMEDIATES or r.vs_torch > TARGET_VS_TORCH]
    print(f"targets missed by: {', '.join(missed)}" if missed else "all targets met")
    print(f"({time.perf_counter() - start:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
