"""Training a loaded model on the CPU schedule executor (first part of the training issue).

``add_loss_function`` gives a causal language model ``@train_loss(inputs...,
labels) -> loss``: its forward, then the mean cross-entropy of the logits
over the labels that are not ``-100``. ``mdsl-autodiff`` derives
``@train_loss_grad``; each batch shape is lowered to ``mdsl.sched`` and
planned once. A :class:`Trainer` step runs that schedule for each
micro-batch (gradients averaged over them), clips by the global norm and
updates every parameter with the registry's ``adamw`` kernel, on views of
the params arena and one fp32 moment pair per parameter.

:func:`save_training_state` writes what a step depends on besides the
weights (the moments, the step, the :class:`AdamWConfig` and any extra
arrays and JSON metadata of the caller: data position, random state) to one
``.npz`` file without pickles; :func:`load_training_state` reads it back and
:meth:`Trainer.restore` continues from it bit for bit.
"""

from __future__ import annotations

import json
import math
import zipfile
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp

from modeldsl.dialects.dtypes import DType
from modeldsl.dialects.graph import CallOp, FuncOp, ModelOp, ReturnOp
from modeldsl.dialects.graph_types import TensorType
from modeldsl.dialects.sched import ProgramOp
from modeldsl.graph_builder import GraphBuilder
from modeldsl.kernels.reference import adamw, global_norm
from modeldsl.passes.autodiff import gradient_function
from modeldsl.passes.lower_to_sched import lower_function
from modeldsl.passes.specialize import SpecializePass
from modeldsl.runtime.optim import AdamWConfig, parameter_scales
from modeldsl.runtime.profiles import plan
from modeldsl.runtime.sched_executor import ScheduleExecutor

IGNORE_INDEX = -100
STATE_FORMAT = "modeldsl-training-state"
STATE_VERSION = 1
MOMENTS = ("exp_avg.", "exp_avg_sq.")  # array name prefixes of the first and second moments


def add_loss_function(model: ModelOp) -> FuncOp:
    """``@train_loss(forward inputs..., labels [B, T] int64) -> loss``: mean cross-entropy of the logits."""
    forward = next(f for f in model.body.block.ops if isinstance(f, FuncOp) and f.sym_name.data == "forward")
    inputs = list(forward.function_type.inputs.data)
    (logits_type,) = forward.function_type.outputs.data
    batch, tokens, vocab = logits_type.shape
    labels_type = TensorType([batch, tokens], DType.INT64)
    func = FuncOp("train_loss", [*inputs, labels_type], [], kind="helper")
    block = func.body.block
    for arg, old in zip(block.args, forward.body.block.args):
        arg.name_hint = old.name_hint
    block.args[-1].name_hint = "labels"
    call = CallOp("forward", list(block.args[:-1]), [logits_type])
    block.add_op(call)
    builder = GraphBuilder(block)
    rows = batch * tokens
    flat_logits = builder.one("view", call.res[0], shape=[rows, vocab])
    flat_labels = builder.one("view", block.args[-1], shape=[rows])
    loss, _ = builder.op("cross_entropy", flat_logits, flat_labels, ignore_index=IGNORE_INDEX, reduction="mean")
    block.add_op(ReturnOp(loss))
    func.function_type = type(func.function_type).from_lists([a.type for a in block.args], [loss.type])
    model.body.block.add_op(func)
    return func


def compile_training_step(model: ModelOp, batch: int, tokens: int,
                          storage: str | None = "fp32") -> tuple[ProgramOp, list[str]]:
    """The planned schedule of ``@train_loss_grad`` for ``[batch, tokens]`` micro-batches, and the
    parameter of each gradient it outputs (after the loss), in order."""
    module = ModuleOp([model.clone()])
    SpecializePass.of(B=batch, T=tokens).apply(Context(), module)
    specialized = next(op for op in module.body.block.ops if isinstance(op, ModelOp))
    add_loss_function(specialized)
    grad = gradient_function(specialized, "train_loss")
    names = [a.data for a in grad.attributes["grads"].data]
    return plan(lower_function(specialized, "train_loss_grad", storage)), names


@dataclass
class Trainer:
    """AdamW training of a loaded :class:`modeldsl.runtime.model.Model` on the schedule executor."""

    model: object  # modeldsl.runtime.model.Model
    config: AdamWConfig = field(default_factory=AdamWConfig)
    step: int = 0

    def __post_init__(self) -> None:
        self.programs: dict[tuple[int, int], tuple[ScheduleExecutor, list[str]]] = {}
        self.params: dict[str, np.ndarray] | None = None
        self.moments: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self.scales = parameter_scales(self.model.model)  # @trainable(lr_scale, wd_scale)

    def executor(self, batch: int, tokens: int) -> tuple[ScheduleExecutor, list[str]]:
        key = (batch, tokens)
        if key not in self.programs:
            program, grads = compile_training_step(self.model.model, batch, tokens)
            self.programs[key] = (self.model.schedule.executor(program), grads)
        return self.programs[key]

    def loss_and_grads(self, tokens: np.ndarray, labels: np.ndarray) -> tuple[float, dict[str, np.ndarray]]:
        executor, names = self.executor(*tokens.shape)
        inputs = self.model.inputs(tokens, 0)
        outputs = executor.execute(*inputs, labels.astype(np.int64), np.ones((), dtype=np.float32))
        return float(outputs[0]), dict(zip(names, outputs[1:1 + len(names)]))

    def train_step(self, micro_batches: list[tuple[np.ndarray, np.ndarray]]) -> float:
        """One optimizer step over micro-batches of (tokens, labels); the mean loss."""
        total: dict[str, np.ndarray] = {}
        losses = []
        for tokens, labels in micro_batches:
            loss, grads = self.loss_and_grads(tokens, labels)
            losses.append(loss)
            for name, grad in grads.items():
                total[name] = total[name] + grad if name in total else np.array(grad, dtype=np.float32)
        for grad in total.values():
            grad /= len(micro_batches)
        factor = self.config.clip_factor(float(global_norm(*total.values())))
        lr = self.config.lr_at(self.step)
        self.step += 1
        views = next(iter(self.programs.values()))[0].params
        for name, grad in total.items():
            param = views[name]
            m, v = self.moments.setdefault(name, (np.zeros(param.shape, np.float32), np.zeros(param.shape, np.float32)))
            lr_scale, wd_scale = self.scales.get(name, (1.0, 1.0))
            adamw(param, grad * np.float32(factor), m, v, lr * lr_scale, self.step, beta1=self.config.beta1,
                  beta2=self.config.beta2, eps=self.config.eps, weight_decay=self.config.weight_decay * wd_scale)
        return float(np.mean(losses))

    # ------------------------------------------------------------------ state
    def state_arrays(self) -> dict[str, np.ndarray]:
        """The optimizer moments by name, ``exp_avg.PARAM`` and ``exp_avg_sq.PARAM`` (fp32)."""
        arrays = {}
        for name, (m, v) in self.moments.items():
            arrays[MOMENTS[0] + name] = m
            arrays[MOMENTS[1] + name] = v
        return arrays

    def restore(self, step: int, arrays: dict[str, np.ndarray]) -> None:
        """Continue from :meth:`state_arrays` taken after ``step`` steps (ValueError when the
        moments do not fit the model's parameters)."""
        moments: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for key, value in arrays.items():
            if not key.startswith(MOMENTS[0]):
                continue
            name = key[len(MOMENTS[0]):]
            second = arrays.get(MOMENTS[1] + name)
            weight = self.model.weights.get(name)
            if second is None:
                raise ValueError(f"the moments of '{name}' have no {MOMENTS[1]}{name}")
            if weight is None:
                raise ValueError(f"the moments name '{name}', which is no parameter of the model")
            if value.shape != weight.shape or second.shape != weight.shape:
                raise ValueError(f"the moments of '{name}' have shape {value.shape}, the parameter {weight.shape}")
            moments[name] = (np.array(value, dtype=np.float32), np.array(second, dtype=np.float32))
        self.moments = moments
        self.step = int(step)


@dataclass
class TrainingState:
    """What :func:`load_training_state` read."""

    config: AdamWConfig
    step: int
    moments: dict[str, np.ndarray]
    meta: dict[str, Any]
    arrays: dict[str, np.ndarray]


def save_training_state(path: str | Path, trainer: Trainer, meta: dict[str, Any] | None = None,
                        arrays: dict[str, np.ndarray] | None = None) -> None:
    """Write the trainer's step, AdamWConfig and moments, with the caller's JSON ``meta`` and
    numeric ``arrays``, as an ``.npz`` file (no pickles: the metadata is one JSON string)."""
    header = {"format": STATE_FORMAT, "version": STATE_VERSION, "step": trainer.step,
              "config": asdict(trainer.config), "meta": meta or {}}
    content = {"state": np.array(json.dumps(header, sort_keys=True))}
    for name, value in (arrays or {}).items():
        if name == "state" or name.startswith(MOMENTS):
            raise ValueError(f"'{name}' is a reserved training state name")
        content[name] = np.asarray(value)
    content.update(trainer.state_arrays())
    with open(path, "wb") as f:
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
    except json.JSONDecodeError as err:
        raise ValueError(f"its 'state' entry is not JSON ({err})") from None
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
    moments = {k: v for k, v in content.items() if k.startswith(MOMENTS)}
    arrays = {k: v for k, v in content.items() if not k.startswith(MOMENTS)}
    return TrainingState(AdamWConfig(**config), step, moments, header.get("meta") or {}, arrays)
