"""Profiles: one planned schedule per shape bucket of a model's forward function.

A :class:`ProfiledForward` holds, for each batch size and sequence bucket
(``T`` in ``buckets``), the forward function specialized to that shape,
lowered to ``mdsl.sched`` and planned, with its :class:`ScheduleExecutor`.
A run picks the smallest bucket that holds its tokens, pads the tokens at the
end (causal attention keeps the padding from reaching the real positions) and
returns the rows of the real positions. Each bucket is compiled on its first
use and never again; every profile shares one ``params`` arena, so the
weights are held once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp

from modeldsl.dialects.graph import ModelOp
from modeldsl.dialects.sched import ProgramOp
from modeldsl.passes.lower_to_sched import lower_function
from modeldsl.passes.registry import PASSES
from modeldsl.passes.specialize import SpecializePass
from modeldsl.runtime.executor import ExecutionError
from modeldsl.runtime.sched_executor import ScheduleExecutor

DEFAULT_BUCKETS = (16, 64, 256, 1024, 4096)


def plan(program: ProgramOp) -> ProgramOp:
    """Run ``mdsl-plan-memory`` (default options) on one program."""
    holder = ModuleOp([program])
    PASSES["mdsl-plan-memory"]()().apply(Context(), holder)
    program.detach()
    return program


def compile_profile(model: ModelOp, batch: int, tokens: int, storage: str | None) -> ProgramOp:
    """The planned forward schedule of ``model`` for ``[batch, tokens]`` inputs."""
    module = ModuleOp([model.clone()])
    SpecializePass.of(B=batch, T=tokens).apply(Context(), module)
    specialized = next(op for op in module.body.block.ops if isinstance(op, ModelOp))
    return plan(lower_function(specialized, "forward", storage))


class ProfiledForward:
    """Runs the forward function through the planned schedule of the smallest bucket that fits."""

    def __init__(self, model: ModelOp, weights: dict[str, np.ndarray], buckets: Sequence[int] = DEFAULT_BUCKETS,
                 storage: str | None = None, max_tokens: int | None = None):
        limit = max_tokens or max(buckets)
        self.buckets = sorted({b for b in buckets if b <= limit} | {limit})
        self.model, self.weights, self.storage = model, weights, storage
        self.profiles: dict[tuple[int, int], ScheduleExecutor] = {}
        self.params: np.ndarray | None = None

    def bucket(self, tokens: int) -> int:
        for size in self.buckets:
            if tokens <= size:
                return size
        raise ExecutionError(f"{tokens} tokens exceed the largest profile ({self.buckets[-1]})")

    def profile(self, batch: int, tokens: int) -> ScheduleExecutor:
        key = (batch, self.bucket(tokens))
        if key not in self.profiles:
            program = compile_profile(self.model, *key, self.storage)
            shared = {"params": self.params} if self.params is not None else None
            executor = ScheduleExecutor(program, None if shared else self.weights, shared)
            if self.params is None:
                self.adopt_weights(executor)
            self.params = executor.arenas["params"]
            self.profiles[key] = executor
        return self.profiles[key]

    def adopt_weights(self, executor: ScheduleExecutor) -> None:
        """The weights become views of the params arena (same values and dtype), so they are held once."""
        for name, view in executor.params.items():
            weight = self.weights.get(name)
            if weight is not None and weight.dtype == view.dtype and weight.shape == view.shape:
                self.weights[name] = view

    def run(self, tokens: np.ndarray, make_inputs: Callable[[np.ndarray], list[np.ndarray]]) -> np.ndarray:
        """Logits ``[B, T, vocab]`` for token ids ``[B, T]``; ``make_inputs`` builds the
        forward's inputs (token ids, RoPE table) for the padded ids."""
        batch, length = tokens.shape
        executor = self.profile(batch, length)
        padded = np.zeros((batch, self.bucket(length)), dtype=tokens.dtype)
        padded[:, :length] = tokens
        (logits,) = executor.execute(*make_inputs(padded))
        return np.array(logits[:, :length], dtype=np.float32)
