"""Training a loaded model on the CPU schedule executor.

The programs come from the named pipelines (:mod:`modeldsl.passes.pipelines`):
``mdsl-train-step`` gives a causal language model ``@train_loss(inputs...,
labels) -> loss`` (``mdsl-attach-loss``: its forward, then the mean
cross-entropy of the logits over the labels that are not ``-100``),
``mdsl-autodiff`` derives ``@train_loss_grad``, and each micro-batch shape is
lowered to ``mdsl.sched`` with ``grads_arena=true`` (the parameter gradients
are added into the ``grads`` arena) and planned once.
``mdsl-optimizer-update`` gives the update program: global norm, clipping factor, one in-place ``adamw`` launch per
trainable parameter over the ``params``, ``grads`` and ``optimizer`` (the
moments) arenas, and zeroed gradients. A :class:`Trainer` step runs the
training program once per micro-batch (the loss gradient seeded with ``1/K``
for ``K`` micro-batches, so the accumulated gradient is their mean), then
the optimizer program with the step's learning rate (warmup + cosine, on the
host) and step number. A training program with dropout takes one more input, the step counter
``rng_step`` its masks are keyed with (:mod:`modeldsl.kernels.dropout_mask`): the trainer's
:attr:`Trainer.rng_step`, one more after every micro-batch, so each micro-batch of each step
draws fresh masks while its forward, recomputes and backward draw the same. All programs share
one params arena (in fp32 the model's own) and one grads arena; the moments, and in mixed precision
(``bf16``: 16-bit weights and activations) the fp32 master weights, live in
the optimizer program's arena.

:func:`save_training_state` writes what a step depends on besides the
weights (the moments, the step, the dropout counter, the :class:`AdamWConfig` and any extra
arrays and JSON metadata of the caller: data position, random state) to one
``.npz`` file without pickles; :func:`load_training_state` reads it back and
:meth:`Trainer.restore` continues from it bit for bit.
"""

from __future__ import annotations

import json
import math
import sys
import zipfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from modeldsl.diagnostics import Diagnostic
from modeldsl.dialects.graph import ModelOp
from modeldsl.dialects.sched import BufferOp, ProgramOp
from modeldsl.files import replacing_file
from modeldsl.hf.compat import training_only_fields, warn_python
from modeldsl.passes.fuse import FusePass
from modeldsl.passes.lower_to_sched import rng_step_input
from modeldsl.passes.pipelines import OptimizerUpdate, TrainStep, pipeline_of, tensor_parallel_option
from modeldsl.runtime import distributed
from modeldsl.runtime.assertions import AssertionFailed
from modeldsl.runtime.device_memory import free_memory_bytes
from modeldsl.runtime.executor import ExecutionError
from modeldsl.runtime.optim import AdamWConfig
from modeldsl.runtime.profiles import ProfiledForward
from modeldsl.runtime.sched_executor import ScheduleExecutor, tagged_layout

STATE_FORMAT = "modeldsl-training-state"
STATE_VERSION = 1
MOMENTS = ("exp_avg.", "exp_avg_sq.")  # array name prefixes of the first and second moments
TRAINING_DTYPES = ("fp32", "bf16")


def compile_training_step(model: ModelOp, batch: int, tokens: int, storage: str | None = "fp32",
                          recompute: str = "annotated", fuse: bool | FusePass = True,
                          packed: bool = False, dp: int = 1) -> ProgramOp:
    """The planned schedule of ``@train_loss_grad`` for ``[batch, tokens]`` micro-batches: inputs
    (forward inputs..., labels, d_loss, and with dropout the step counter ``rng_step``), output the
    loss; parameter gradients added into ``grads``.
    The pipeline ``mdsl-train-step`` (:class:`~modeldsl.passes.pipelines.TrainStep`) makes it.
    ``recompute`` is ``mdsl-recompute``'s mode: ``none``, ``annotated``, ``full``, or ``auto:BYTES``
    / ``auto`` (the automatic mode under that activation budget; ``auto``: the device's free memory;
    its table goes to stderr). ``fuse``: every ``mdsl-fuse`` pattern on (or the given ``FusePass``'s
    options; False: none). ``packed``: rows that pack several examples (``mdsl-pack-sequences``: the
    inputs take the segment ids and per-row RoPE tables, :func:`modeldsl.runtime.rope.packed_inputs`).
    ``dp``: data-parallel ranks (``mdsl-shard{dp}``: each parameter gradient summed over them)."""
    options = {"B": batch, "T": tokens, "storage": storage or "", **training_recompute(recompute),
               **fuse_options(fuse), **({"packed": True} if packed else {}), **({"dp": dp} if dp != 1 else {}),
               **tensor_parallel_option(model)}
    pipeline = pipeline_of(TrainStep, **options)
    return pipeline.reporting(_to_stderr).program(model)


def training_recompute(spelling: str) -> dict[str, str | int]:
    """The recompute options of ``mdsl-train-step`` for a ``--recompute`` spelling (the device's free
    memory measured for ``auto``)."""
    options = recompute_options(spelling)
    if options.get("budget") == "auto":
        return {"budget": "auto", "free_memory": free_memory_bytes()}
    return {"recompute": options["mode"]} if "mode" in options else options


def recompute_options(spelling: str) -> dict[str, str]:
    """``mdsl-recompute``'s options for ``none|annotated|full|auto[:BYTES]`` (``auto``: the device's free memory)."""
    mode, _, budget = spelling.partition(":")
    if mode == "auto":
        return {"budget": budget or "auto"}
    if budget:
        raise ExecutionError(f"--recompute {spelling}: only auto takes a budget (auto:2GiB)")
    return {"mode": mode}


def fuse_options(fuse: bool | FusePass) -> dict[str, object]:
    """The fusion options of a pipeline: every pattern (True), none (False), or a ``FusePass``'s."""
    if isinstance(fuse, FusePass):
        return {"disable": fuse.disable, "auto": fuse.auto, "lm_head_chunk": fuse.lm_head_chunk, "only": fuse.only}
    return {} if fuse else {"fuse": False}


def _to_stderr(text: str) -> None:
    print(text, file=sys.stderr)


def compile_evaluation_step(model: ModelOp, batch: int, tokens: int, storage: str | None = "fp32",
                            fuse: bool | FusePass = True) -> ProgramOp:
    """The planned schedule of ``@train_loss`` alone for ``[batch, tokens]`` micro-batches: inputs
    (forward inputs..., labels), output the loss; no gradient, dropout off (an evaluation)."""
    from xdsl.context import Context
    from xdsl.dialects.builtin import ModuleOp

    from modeldsl.passes.attach_loss import LOSS_FUNCTION, AttachLossPass
    from modeldsl.passes.lower_to_sched import LowerToSchedPass
    from modeldsl.passes.pipelines import ANNOTATED_ADAPTERS, tensor_sharding
    from modeldsl.passes.plan_memory import PlanMemoryPass
    from modeldsl.passes.shard import rank_shapes
    from modeldsl.passes.specialize import SpecializePass

    fusion = fuse if isinstance(fuse, FusePass) else (FusePass() if fuse else None)
    module = ModuleOp([model.clone()])
    stages = [SpecializePass.of(B=batch, T=tokens), ANNOTATED_ADAPTERS, AttachLossPass(),
              *tensor_sharding(rank_shapes(model)), *([fusion] if fusion is not None else []),
              LowerToSchedPass(func=LOSS_FUNCTION, storage=storage or ""), PlanMemoryPass()]
    for stage in stages:
        stage.apply(Context(), module)
    program = [op for op in module.body.block.ops if isinstance(op, ProgramOp)][-1]
    program.detach()
    return program


def compile_optimizer_step(model: ModelOp, config: AdamWConfig, storage: str | None = "fp32",
                           zero: tuple[int, int] | None = None) -> ProgramOp:
    """The planned ``@optimizer_step`` of ``model``: inputs (lr, step), output the gradient norm. The
    pipeline ``mdsl-optimizer-update`` (:class:`~modeldsl.passes.pipelines.OptimizerUpdate`) makes it;
    ``zero``: ZeRO-1's (data-parallel ranks, this rank), the program of this rank's share of the state."""
    sharding = {} if zero is None else {"dp": zero[0], "rank": zero[1], "zero": 1}
    pipeline = pipeline_of(OptimizerUpdate, beta1=config.beta1, beta2=config.beta2, eps=config.eps,
                           weight_decay=config.weight_decay, clip_norm=config.clip_norm, storage=storage or "",
                           **sharding, **tensor_parallel_option(model))
    return pipeline.program(model)


@dataclass
class Trainer:
    """AdamW training of a loaded :class:`modeldsl.runtime.model.Model` on the schedule executor.

    The model is loaded in fp32. ``dtype="fp32"`` trains in fp32 on the model's own params
    arena (shared with its forward profiles). ``dtype="bf16"`` trains in mixed precision: the
    programs keep the model's declared (16-bit) weights and activations in their own params
    arena, the fp32 weights are the optimizer's master copies, and :meth:`sync_weights` writes
    the trained ones back into ``model.weights``. With a ``device`` the programs run on CUDA
    executors there (:class:`modeldsl.runtime.cuda_train.CudaTrainer` picks the GPU)."""

    model: object  # modeldsl.runtime.model.Model
    config: AdamWConfig = field(default_factory=AdamWConfig)
    step: int = 0
    dtype: str = "fp32"
    device: Any = None  # a modeldsl.runtime.cuda_device.Device the programs run on; None: the CPU
    recompute: str = "annotated"  # mdsl-recompute's mode (see compile_training_step)
    fuse: bool = True  # mdsl-fuse, every pattern on (False: none)
    warn: Callable[[Diagnostic], None] | None = None  # where W007 for training-only config fields go (None: warnings)
    rng_step: int = 0  # dropout's step counter: micro-batches run so far (each draws its own masks)
    packed: bool = False  # micro-batches of packed rows: (tokens, labels, segments, positions)
    dp: int = 1  # data-parallel ranks: each runs its rows of every micro-batch, the gradients summed over them
    zero: bool = False  # ZeRO-1: the optimizer state shared out over the dp ranks by parameter

    def __post_init__(self) -> None:
        for diagnostic in training_only_fields(self.model.hf_config):
            (self.warn or warn_python)(diagnostic)
        if self.model.dtype != "fp32":
            raise ExecutionError(f"the model is loaded as {self.model.dtype}; load it in fp32 (its weights are the "
                                 f"master copy) and give the training dtype to the {type(self).__name__}")
        if self.dtype not in TRAINING_DTYPES:
            raise ExecutionError(f"no training dtype '{self.dtype}' (choose {', '.join(TRAINING_DTYPES)})")
        self.storage = "fp32" if self.dtype == "fp32" else None
        self.schedule = self.shared_params()
        self.programs: dict[tuple[int, int], ScheduleExecutor] = {}
        self.evaluators: dict[tuple[int, int], ScheduleExecutor] = {}
        if self.zero and (self.dp == 1 or self.dtype != "fp32"):  # mixed precision keeps every master on every rank
            raise distributed.layout_error("zero shares the optimizer state over data-parallel ranks in fp32: it needs "
                                           f"dp > 1 (dp={self.dp}) and dtype fp32 (dtype={self.dtype})",
                                           "give dp=2 or more and train in fp32, or leave zero out")
        self.optimizer = self.schedule.executor(compile_optimizer_step(self.model.model, self.config, self.storage,
                                                                       self.zero_rank()))
        for name, master in self.optimizer.masters.items():
            write(master, self.model.weights[name])
        self.grad_norm = math.nan  # of the last step, before clipping

    def zero_rank(self) -> tuple[int, int] | None:
        """ZeRO-1's (data-parallel ranks, this process's rank among them), None without it."""
        if not self.zero:
            return None
        return self.dp, distributed.rank_in("dp")

    def owners(self) -> dict[str, int]:
        """ZeRO-1: the rank that keeps each trainable parameter's moments (the grad buffers' ``owner``)."""
        found = {}
        for op in self.optimizer.program.body.block.ops:
            if isinstance(op, BufferOp) and "grad" in op.attributes and "owner" in op.attributes:
                found[op.attributes["grad"].data] = op.attributes["owner"].value.data
        return found

    def shared_params(self) -> ProfiledForward:
        """What makes the executors of the programs, on one shared params arena: in fp32 on the
        model's own device the model's own (its forward profiles'), else a new one (16-bit weights
        in mixed precision)."""
        if self.dtype == "fp32" and self.model.schedule.device is self.device:
            return self.model.schedule
        return ProfiledForward(self.model.model, dict(self.model.weights), storage=self.storage, device=self.device)

    def executor(self, batch: int, tokens: int, sync: bool = True) -> ScheduleExecutor:
        """The training step of ``[batch, tokens]`` micro-batches (compiled on first use). With ``dp``
        ranks, ``sync`` is the step that sums the accumulated gradients over them (the last micro-batch
        of an optimizer step's); the others accumulate the rank's own."""
        key = (batch, tokens) if sync or self.dp == 1 else (batch, tokens, "local")
        if key not in self.programs:
            program = compile_training_step(self.model.model, batch, tokens, self.storage, self.recompute, self.fuse,
                                            self.packed, self.dp if sync else 1)
            if tagged_layout(program, "grad") != tagged_layout(self.optimizer.program, "grad"):
                raise ExecutionError("the training step lays out the gradients unlike the optimizer step")
            self.programs[key] = self.schedule.executor(program, arenas={"grads": self.optimizer.arenas["grads"]})
        return self.programs[key]

    def sync_weights(self) -> None:
        """Make ``model.weights`` the trained weights (in fp32 on the CPU they are the same memory
        already; else the fp32 parameters or the fp32 masters of 16-bit ones are copied in, from
        the device where the programs run on one)."""
        if self.schedule is self.model.schedule and self.device is None:
            return
        weights = self.model.weights
        for name in self.optimizer.grads:
            source = read(self.optimizer.masters.get(name, self.optimizer.params[name]))
            if weights[name].flags.writeable:  # a view of the forward profiles' params arena
                np.copyto(weights[name], source, casting="unsafe")
            else:  # still the loaded (read-only, memory-mapped) array
                weights[name] = np.array(source, dtype=weights[name].dtype)

    def accumulate(self, tokens: np.ndarray, labels: np.ndarray, weight: float = 1.0,
                   segments: np.ndarray | None = None, positions: np.ndarray | None = None,
                   sync: bool = True) -> float:
        """Run one micro-batch: its loss; ``weight`` times its gradients are added into the grads arena.
        A packed trainer's micro-batches give each token's example (``segments``) and position in it.
        ``sync``: with ``dp`` ranks, the accumulated gradients are then summed over them."""
        executor = self.executor(*tokens.shape, sync=sync)
        if self.packed:
            from modeldsl.runtime.rope import packed_inputs

            if segments is None or positions is None:
                raise ExecutionError("a packed training step needs the segments and positions of its rows")
            forward = packed_inputs(self.model, tokens, segments, positions)
        else:
            forward = self.model.inputs(tokens, 0)
        inputs = [*forward, labels.astype(np.int64), np.array(weight, dtype=np.float32)]
        counter = rng_step_input(executor.program)
        if counter is not None:  # dropout: this micro-batch's masks, the same in its forward and backward
            inputs.insert(counter, np.array([self.rng_step], dtype=np.int64))
        (loss, *_) = executor.execute(*inputs)
        self.rng_step += 1
        return float(loss)

    def evaluate(self, tokens: np.ndarray, labels: np.ndarray) -> float:
        """The mean loss of one batch over its labels that are not -100, with the weights as
        trained so far: the forward alone (:func:`compile_evaluation_step`, compiled on first use)."""
        key = tokens.shape
        if key not in self.evaluators:
            program = compile_evaluation_step(self.model.model, *key, self.storage, self.fuse)
            self.evaluators[key] = self.schedule.executor(program)
        with np.errstate(all="ignore"):
            (loss, *_) = self.evaluators[key].execute(*self.model.inputs(tokens, 0), labels.astype(np.int64))
        return float(loss)

    def train_step(self, micro_batches: list[tuple[np.ndarray, ...]]) -> float:
        """One optimizer step over micro-batches of (tokens, labels) (packed: and their segments
        and positions); the mean loss (overflow to Inf or NaN shows in it, not as numpy RuntimeWarnings).
        With ``dp`` ranks each gives its own rows of the step's micro-batches, its loss gradient seeded
        with ``1 / (dp * micro-batches)`` (the summed gradients are the global batch's mean) and the
        loss the mean over the ranks."""
        weight = 1.0 / (len(micro_batches) * self.dp)
        with np.errstate(all="ignore"):
            losses = []
            for index, (tokens, labels, *rows) in enumerate(micro_batches):
                try:
                    losses.append(self.accumulate(tokens, labels, weight, *rows,
                                                  sync=index == len(micro_batches) - 1))
                except AssertionFailed as failed:  # an @assert of the model: name the step and micro-batch
                    raise failed.in_training_step(self.step + 1, index) from None
            lr = self.config.lr_at(self.step)
            self.step += 1
            (norm,) = self.optimizer.execute(np.array([lr], dtype=np.float32),
                                             np.array([self.step], dtype=np.int64))
        self.grad_norm = float(norm)
        loss = float(np.mean(losses))
        return distributed.communicator().all_reduce_scalar(loss, "dp", "avg") if self.dp > 1 else loss

    # ------------------------------------------------------------------ state
    def state_arrays(self) -> dict[str, np.ndarray]:
        """The optimizer moments by name, ``exp_avg.PARAM`` and ``exp_avg_sq.PARAM`` (fp32 copies); under
        ZeRO-1 every rank's, each broadcast from its owner (every rank calls it, in step)."""
        arrays = {name: read(view) for name, view in self.optimizer.moments.items()}
        if not self.zero:
            return arrays
        comm, grads = distributed.communicator(), self.optimizer.grads
        for name, owner in self.owners().items():
            for prefix in MOMENTS:
                key = f"{prefix}{name}"
                value = arrays.get(key)
                value = np.empty(grads[name].shape, np.float32) if value is None else np.ascontiguousarray(value)
                comm.run("broadcast", "dp", value, value, root=owner)
                arrays[key] = value
        return arrays

    def restore(self, step: int, arrays: dict[str, np.ndarray], rng_step: int | None = None) -> None:
        """Continue from :meth:`state_arrays` taken after ``step`` steps, and dropout's counter from
        ``rng_step`` where given (ValueError when the moments do not fit the model's trainable parameters)."""
        moments = {k: v for k, v in arrays.items() if k.startswith(MOMENTS)}
        views = self.optimizer.moments
        if self.zero:  # every rank's moments in the state: this rank keeps its own
            known = {f"{prefix}{name}" for name in self.owners() for prefix in MOMENTS}
            missing = sorted(known - set(moments))
            if missing:
                raise ValueError(f"no moments '{missing[0]}' for a trainable parameter of the model")
            moments = {k: v for k, v in moments.items() if k in views or k not in known}
        unknown = sorted(set(moments) - set(views))
        if unknown:
            raise ValueError(f"the moments '{unknown[0]}' belong to no trainable parameter of the model")
        missing = sorted(set(views) - set(moments))
        if missing:
            raise ValueError(f"no moments '{missing[0]}' for a trainable parameter of the model")
        for name, value in moments.items():
            if np.shape(value) != views[name].shape:
                raise ValueError(f"the moments '{name}' have shape {np.shape(value)}, the parameter "
                                 f"{views[name].shape}")
            if not np.issubdtype(np.asarray(value).dtype, np.floating):
                raise ValueError(f"the moments '{name}' are {np.asarray(value).dtype}, not floating point")
            if not np.isfinite(value).all() or (name.startswith("exp_avg_sq") and (np.asarray(value) < 0).any()):
                raise ValueError(f"the moments '{name}' hold NaN, infinite or (squares) negative values")
        for name, value in moments.items():
            write(views[name], value)
        self.step = int(step)
        if rng_step is not None:
            self.rng_step = int(rng_step)


def read(view) -> np.ndarray:
    """A host copy of a tagged view: a numpy view of a CPU arena, or a device array (``read()``)."""
    return view.read() if hasattr(view, "read") else np.array(view)


def write(view, value: np.ndarray) -> None:
    """Fill a tagged view (a numpy view, or a device array: ``write()``) with ``value``."""
    if hasattr(view, "write"):
        view.write(value)
    else:
        np.copyto(view, value, casting="unsafe")


@dataclass
class TrainingState:
    """What :func:`load_training_state` read."""

    config: AdamWConfig
    step: int
    moments: dict[str, np.ndarray]
    meta: dict[str, Any]
    arrays: dict[str, np.ndarray]
    rng_step: int = 0  # dropout's step counter (0 in a file saved before it was kept)


def save_training_state(path: str | Path, trainer: Trainer, meta: dict[str, Any] | None = None,
                        arrays: dict[str, np.ndarray] | None = None,
                        moments: dict[str, np.ndarray] | None = None) -> None:
    """Write the trainer's step, dropout counter, AdamWConfig and moments (``moments``: as
    :meth:`Trainer.state_arrays` gave them, else taken now), with the caller's JSON ``meta`` and
    numeric ``arrays``, as an ``.npz`` file (no pickles: the metadata is one JSON string),
    replacing ``path`` atomically."""
    header = {"format": STATE_FORMAT, "version": STATE_VERSION, "step": trainer.step,
              "rng_step": trainer.rng_step, "config": asdict(trainer.config), "meta": meta or {}}
    content = {"state": np.array(json.dumps(header, sort_keys=True))}
    for name, value in (arrays or {}).items():
        if name == "state" or name.startswith(MOMENTS):
            raise ValueError(f"'{name}' is a reserved training state name")
        content[name] = np.asarray(value)
    content.update(trainer.state_arrays() if moments is None else moments)
    with replacing_file(path) as tmp, open(tmp, "wb") as f:  # atomically: the old file or the whole new one
        np.savez(f, **content)


def load_training_state(path: str | Path) -> TrainingState:
    """Read :func:`save_training_state`'s file (``allow_pickle=False``); ValueError naming what is
    wrong with a file that is not one, OSError when it cannot be read."""
    try:
        with np.load(path, allow_pickle=False) as data:
            content = {name: data[name] for name in data.files}
    except (ValueError, EOFError, KeyError, zipfile.BadZipFile) as err:  # not a zip, truncated, pickled
        raise ValueError(f"not a readable .npz file ({err})") from None
    if "state" not in content:
        raise ValueError("it has no 'state' entry")
    try:
        header = json.loads(str(content.pop("state")))
    except (json.JSONDecodeError, RecursionError, ValueError) as err:  # ValueError: integers past 4300 digits
        raise ValueError(f"its 'state' entry is not JSON ({type(err).__name__}: {str(err)[:200]})") from None
    if not isinstance(header, dict) or header.get("format") != STATE_FORMAT:
        raise ValueError(f"it is not a {STATE_FORMAT} file")
    if header.get("version") != STATE_VERSION:
        raise ValueError(f"it has version {header.get('version')!r}; this modeldsl reads version {STATE_VERSION}")
    known = {f.name for f in fields(AdamWConfig)}
    config = header.get("config")
    if not isinstance(config, dict) or set(config) != known:
        raise ValueError(f"its AdamW settings {config!r} are not {sorted(known)}")
    if any(not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) for v in config.values()):
        raise ValueError(f"its AdamW settings {config!r} are not all finite numbers")
    step = header.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise ValueError(f"its step {step!r} is not a non-negative integer")
    rng_step = header.get("rng_step", 0)
    if not isinstance(rng_step, int) or isinstance(rng_step, bool) or not 0 <= rng_step < 2**63:
        raise ValueError(f"its dropout counter rng_step {str(rng_step)[:100]} is not a non-negative 64-bit integer")
    meta = header.get("meta") or {}
    if not isinstance(meta, dict):
        raise ValueError(f"its 'meta' entry {str(meta)[:100]} is not a dictionary")
    moments = {k: v for k, v in content.items() if k.startswith(MOMENTS)}
    arrays = {k: v for k, v in content.items() if not k.startswith(MOMENTS)}
    return TrainingState(AdamWConfig(**config), step, moments, meta, arrays, rng_step)
