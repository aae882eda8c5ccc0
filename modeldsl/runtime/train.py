"""Training a loaded model on the CPU schedule executor (first part of the training issue).

``add_loss_function`` gives a causal language model ``@train_loss(inputs...,
labels) -> loss``: its forward, then the mean cross-entropy of the logits
over the labels that are not ``-100``. ``mdsl-autodiff`` derives
``@train_loss_grad``; each batch shape is lowered to ``mdsl.sched`` and
planned once. A :class:`Trainer` step runs that schedule for each
micro-batch (gradients averaged over them), clips by the global norm and
updates every parameter with the registry's ``adamw`` kernel, on views of
the params arena and one fp32 moment pair per parameter.
"""

from __future__ import annotations

from dataclasses import dataclass, field

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
from modeldsl.runtime.optim import AdamWConfig
from modeldsl.runtime.profiles import plan
from modeldsl.runtime.sched_executor import ScheduleExecutor

IGNORE_INDEX = -100


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

    def executor(self, batch: int, tokens: int) -> tuple[ScheduleExecutor, list[str]]:
        key = (batch, tokens)
        if key not in self.programs:
            program, grads = compile_training_step(self.model.model, batch, tokens)
            shared = {"params": self.model.schedule.params} if self.model.schedule.params is not None else None
            executor = ScheduleExecutor(program, None if shared else self.model.weights, shared)
            if self.model.schedule.params is None:
                self.model.schedule.adopt_weights(executor)
                self.model.schedule.params = executor.arenas["params"]
            self.programs[key] = (executor, grads)
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
            adamw(param, grad * np.float32(factor), m, v, lr=lr, step=self.step, beta1=self.config.beta1,
                  beta2=self.config.beta2, eps=self.config.eps, weight_decay=self.config.weight_decay)
        return float(np.mean(losses))
