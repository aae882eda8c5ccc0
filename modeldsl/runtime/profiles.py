"""Profiles: one planned schedule per shape bucket of a model's forward function.

A :class:`ProfiledForward` holds, for each batch size and sequence bucket
(``T`` in ``buckets``), the forward function specialized to that shape,
lowered to ``mdsl.sched`` and planned, with its :class:`ScheduleExecutor`.
A run picks the smallest bucket that holds its tokens, pads the tokens at the
end (causal attention keeps the padding from reaching the real positions) and
returns the rows of the real positions. Each bucket is compiled on its first
use and never again; every profile shares one ``params`` arena, so the
weights are held once. :func:`params_arena` lays that arena out before any
profile is compiled (the parameters come first in every program, in the
model's order), so a loader can read the checkpoint straight into it, or map
the checkpoint file's pages there (:mod:`modeldsl.runtime.pages`), and the
model's weights are its views from the start; the first profile then binds
nothing.

Decoding runs profiles compiled with a KV cache of a bucketed capacity
(``mdsl-lower-to-sched{kv_cache=C}``): the prompt's profile writes the cache
from position 0, each later one-token step from its position; the profiles
of one batch size and capacity share the cache arrays. Padding written past
the real tokens is overwritten before any query can see it. A recurrent state
(Mamba's conv and scan states) is carried the same way; such a program takes
one more input, the number of real tokens, so the padding never reaches it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from modeldsl.dialects.dtypes import DType
from modeldsl.dialects.graph import ModelOp
from modeldsl.dialects.sched import ProgramOp
from modeldsl.passes.lower_to_sched import parameter_buffers
from modeldsl.passes.pipelines import ForwardProfile, GenerateStep, pipeline_of, planned, tensor_parallel_option
from modeldsl.runtime.executor import NUMPY_DTYPES, ExecutionError
from modeldsl.runtime.fits import check_fits_on
from modeldsl.runtime.pages import PagedArena, best_shift
from modeldsl.runtime.sched_executor import ScheduleExecutor, tagged_layout

DEFAULT_BUCKETS = (1, 16, 64, 256, 1024, 4096)


def plan(program: ProgramOp) -> ProgramOp:
    """Run ``mdsl-plan-memory`` (default options) on one program."""
    return planned(program)


def compile_profile(model: ModelOp, batch: int, tokens: int, storage: str | None, kv_cache: int = 0,
                    split_gemms: bool = True) -> ProgramOp:
    """The planned forward schedule of ``model`` for ``[batch, tokens]`` inputs: the pipeline
    ``mdsl-forward-profile``, or with a KV cache of ``kv_cache`` positions ``mdsl-generate-step``
    (:mod:`modeldsl.passes.pipelines`), every ``mdsl-fuse`` pattern applied."""
    options = {"B": batch, "T": tokens, "storage": storage or "", "split_gemms": split_gemms,
               **tensor_parallel_option(model)}
    if kv_cache:
        return pipeline_of(GenerateStep, **options, kv_cache=kv_cache).program(model)
    return pipeline_of(ForwardProfile, **options).program(model)


@dataclass
class ParamsArena:
    """The ``params`` arena of a model's programs: the bytes, each parameter's view of them,
    and the layout (:func:`tagged_layout`) every program must agree on."""

    arena: np.ndarray
    views: dict[str, np.ndarray]
    layout: dict[str, tuple[int, tuple[int, ...], str]]
    pages: PagedArena

    @classmethod
    def allocate(cls, nbytes: int, layout: dict[str, tuple[int, tuple[int, ...], str]], shift: int = 0,
                 populate: bool = True) -> ParamsArena:
        """``nbytes`` zero bytes starting ``shift`` bytes into a page (see :class:`PagedArena`),
        with a view per parameter of ``layout``."""
        pages = PagedArena(nbytes, shift, populate)
        views = {}
        for name, (offset, shape, dtype) in layout.items():
            kind = NUMPY_DTYPES[DType(dtype)]
            views[name] = pages.array[offset:offset + math.prod(shape) * kind.itemsize].view(kind).reshape(shape)
        return cls(pages.array, views, layout, pages)

    def lined_up(self, pieces: Iterable[tuple[int, int, int]]) -> ParamsArena:
        """An arena of the same layout for a loader that will read ``pieces`` (offset in their file,
        address in this arena, bytes; :func:`modeldsl.hf.checkpoint.direct_pieces`): where at least
        half its bytes can line up with their file's pages, it starts where they do and gives out
        no page in advance (the loader maps the file there); otherwise it is populated."""
        base = self.arena.ctypes.data
        shift, lined_up = best_shift((where, address - base, n) for where, address, n in pieces)
        if 2 * lined_up < self.arena.nbytes:
            return ParamsArena.allocate(self.arena.nbytes, self.layout)
        return ParamsArena.allocate(self.arena.nbytes, self.layout, shift, populate=False)


def params_arena(model: ModelOp, storage: str | None, populate: bool = True) -> ParamsArena:
    """The ``params`` arena of every forward profile of a specialized ``model`` (allocated and
    zero; ``populate``: see :class:`PagedArena`), planned from the parameter buffers alone: every
    program declares them first, in the model's order."""
    program = ProgramOp("params", {})
    program.body.block.add_ops(parameter_buffers(model, storage == "fp32"))
    plan(program)
    return ParamsArena.allocate(program.arenas["params"], tagged_layout(program, "param"), populate=populate)


class ProfiledForward:
    """Runs the forward function through the planned schedule of the smallest bucket that fits."""

    def __init__(self, model: ModelOp, weights: dict[str, np.ndarray], buckets: Sequence[int] = DEFAULT_BUCKETS,
                 storage: str | None = None, max_tokens: int | None = None, device: Any = None,
                 params: ParamsArena | None = None):
        """``device``: a :class:`modeldsl.runtime.cuda_device.Device` to run the programs on (with
        CUDA executors); None: the CPU :class:`ScheduleExecutor`. ``params``: the arena of
        :func:`params_arena` (on the CPU) the ``weights`` already are views of; the profiles run
        on it and nothing is copied."""
        limit = max_tokens or max(buckets)
        self.buckets = sorted({b for b in buckets if b <= limit} | {limit})
        self.model, self.weights, self.storage = model, weights, storage
        self.profiles: dict[tuple[int, int, int], ScheduleExecutor] = {}
        self.device = device
        self.params: Any = params.arena if params is not None else None  # numpy, or a device arena
        self.param_layout: dict | None = params.layout if params is not None else None
        self.caches: dict[tuple[int, int], dict[str, np.ndarray]] = {}

    def bucket(self, tokens: int) -> int:
        for size in self.buckets:
            if tokens <= size:
                return size
        raise ExecutionError(f"{tokens} tokens exceed the largest profile ({self.buckets[-1]})")

    def profile(self, batch: int, tokens: int, capacity: int = 0) -> ScheduleExecutor:
        key = (batch, self.bucket(tokens), capacity)
        if key not in self.profiles:
            program = compile_profile(self.model, batch, key[1], self.storage, capacity)
            executor = self.executor(program, self.caches.get((batch, capacity)))
            if capacity:
                self.caches[(batch, capacity)] = executor.state
            self.profiles[key] = executor
        return self.profiles[key]

    def executor(self, program: ProgramOp, state: dict[str, np.ndarray] | None = None,
                 arenas: dict[str, np.ndarray] | None = None) -> ScheduleExecutor:
        """An executor of one of the model's programs (with any other ``arenas`` it shares) on the
        shared params arena: the first one copies the weights in, and the weights become views of
        it. E038 before anything is allocated when the arenas the planner sized do not fit in the
        memory available (the host's, or the device's); ExecutionError when the program lays out
        the parameters differently."""
        shared = {**(arenas or {}), **({"params": self.params} if self.params is not None else {})}
        needs = {f"the {name} arena of @{program.sym_name.data}": size
                 for name, size in program.arenas.items() if name not in shared and size}
        check_fits_on(self.device, needs, "run fewer tokens at once (a shorter prompt, a smaller batch), --dtype bf16")
        layout = tagged_layout(program, "param")
        if self.param_layout is None:
            self.param_layout = layout
        elif layout != self.param_layout:
            raise ExecutionError(f"@{program.sym_name.data} lays out the parameters unlike the model's other "
                                 "programs (a different storage dtype?)")
        weights = None if self.params is not None else self.weights
        if self.device is None:
            executor = ScheduleExecutor(program, weights, shared, state)
        else:
            from modeldsl.runtime.cuda_executor import CudaExecutor

            executor = CudaExecutor(program, weights, shared, state, device=self.device)
        if self.params is None:
            self.adopt_weights(executor)
            self.params = executor.arenas["params"]
        return executor

    def adopt_weights(self, executor: ScheduleExecutor) -> None:
        """The weights become views of the params arena (same values and dtype), so they are held once
        (on the CPU: a device's arena is no host memory)."""
        if self.device is not None:
            return
        for name, view in executor.params.items():
            weight = self.weights.get(name)
            if weight is not None and weight.dtype == view.dtype and weight.shape == view.shape:
                self.weights[name] = view

    def run(self, tokens: np.ndarray, make_inputs: Callable[[np.ndarray], list[np.ndarray]],
            position: int | None = None, capacity: int = 0) -> np.ndarray:
        """Logits ``[B, T, vocab]`` for token ids ``[B, T]``; ``make_inputs`` builds the
        forward's inputs (token ids, RoPE table of the positions) for the padded ids.
        With a ``capacity``, the tokens sit at ``position`` .. in the KV cache."""
        batch, length = tokens.shape
        executor = self.profile(batch, length, capacity)
        padded = np.zeros((batch, self.bucket(length)), dtype=tokens.dtype)
        padded[:, :length] = tokens
        inputs = make_inputs(padded)
        if capacity:
            if position + padded.shape[1] > capacity:
                raise ExecutionError(f"positions {position}..{position + padded.shape[1] - 1} exceed the cache "
                                     f"capacity {capacity}")
            inputs.append(np.array([position], dtype=np.int32))
            if len(executor.inputs) > len(inputs):  # recurrent state (Mamba): how many steps are real
                inputs.append(np.array([length], dtype=np.int32))
        logits = executor.execute(*inputs)[0]
        return np.array(logits[:, :length], dtype=np.float32)
