"""The Python API: ``modeldsl.load(model_file, hf=dir) -> Model``.

Loading reads the checkpoint's ``config.json`` through the model's
``hf_config``, lowers the DSL model with that configuration (so its
constraints are checked against the checkpoint), binds the configuration
into the IR (``mdsl-specialize``), and fills the parameters through
``hf_mapping``. The forward function's inputs follow one convention: the
integer input is the token ids, an input named ``freqs`` is the RoPE table
of the positions (from ``rope_theta``, ``head_dim`` and the checkpoint's
``rope_scaling``), computed here.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from xdsl.context import Context
from xdsl.dialects.builtin import FloatAttr, IntegerAttr, ModuleOp

from modeldsl.diagnostics import Diagnostic, DiagnosticError, DiagnosticSink
from modeldsl.dialects.dtypes import DType
from modeldsl.dialects.graph import ModelOp, ParamOp
from modeldsl.frontend.text.parser import parse_file
from modeldsl.hf.checkpoint import ImportRecord, load_checkpoint, save_checkpoint
from modeldsl.hf.config import dsl_config, read_config
from modeldsl.hf.safetensors_io import CheckpointError
from modeldsl.lower import choose_top, lower_program
from modeldsl.passes.specialize import SpecializePass
from modeldsl.runtime.executor import NUMPY_DTYPES, GraphExecutor, KVCache
from modeldsl.runtime.rope import rope_table

STORAGE = {"fp32": np.dtype(np.float32), "bf16": NUMPY_DTYPES[DType.BF16]}


@dataclass
class Model:
    """A loaded model: its lowered IR, weights and an executor."""

    module: ModuleOp
    model: ModelOp
    weights: dict[str, np.ndarray]
    dtype: str
    hf_config: dict[str, Any] = field(default_factory=dict)
    record: ImportRecord = field(default_factory=ImportRecord)

    def __post_init__(self) -> None:
        float_dtype = np.float32 if self.dtype == "fp32" else None
        self.executor = GraphExecutor(self.model, self.weights, float_dtype)
        self.forward_func = self.executor.funcs["forward"]

    # ------------------------------------------------------------------ config
    def config(self, name: str, default: Any = None) -> Any:
        attr = self.model.config_values.get(name)
        if isinstance(attr, IntegerAttr):
            return attr.value.data
        if isinstance(attr, FloatAttr):
            return attr.value.data
        return default

    def rope_freqs(self, positions: Sequence[int]) -> np.ndarray:
        arg = next(a for a in self.forward_func.body.block.args if a.name_hint == "freqs")
        half = arg.type.shape[1].evaluate({})
        theta = self.config("rope_theta", self.hf_config.get("rope_theta", 10000.0))
        return rope_table(np.asarray(positions), 2 * half, theta, self.hf_config.get("rope_scaling"))

    def inputs(self, tokens: np.ndarray, start: int) -> list[np.ndarray]:
        values = []
        for arg in self.forward_func.body.block.args:
            if arg.name_hint == "freqs":
                values.append(self.rope_freqs(range(start, start + tokens.shape[-1])))
            elif not arg.type.dtype.is_float:
                values.append(tokens.astype(NUMPY_DTYPES[arg.type.dtype]))
            else:
                raise DiagnosticError([Diagnostic("E029", f"the forward input '{arg.name_hint}' is neither the "
                                                  "token ids nor 'freqs'; call the executor directly", None)])
        return values

    # ------------------------------------------------------------------ running
    def forward(self, token_ids: Sequence[int] | np.ndarray, cache: KVCache | None = None) -> np.ndarray:
        """Logits ``[B, T, vocab]`` (``[T, vocab]`` for a 1-D input) in fp32."""
        tokens = np.asarray(token_ids)
        batched = tokens.ndim == 2
        tokens = tokens if batched else tokens[None, :]
        start = cache.length if cache is not None else 0
        (logits,) = self.executor.run("forward", *self.inputs(tokens, start), cache=cache)
        logits = np.asarray(logits, dtype=np.float32)
        return logits if batched else logits[0]

    def generate(self, prompt: Sequence[int], max_new_tokens: int, temperature: float = 0.0,
                 top_k: int | None = None, seed: int | None = None, use_cache: bool = True,
                 on_token: Callable[[int], None] | None = None,
                 timings: dict[str, float] | None = None) -> list[int]:
        """Greedy (temperature 0) or sampled continuation of ``prompt``; with the KV
        cache, one prefill then one-token steps; without it, full recomputation.
        ``timings`` receives ``prefill`` and ``decode`` seconds."""
        rng = np.random.default_rng(seed)
        tokens = list(prompt)
        cache = KVCache() if use_cache else None
        start = time.perf_counter()
        logits = self.forward(tokens, cache)[-1]
        prefilled = time.perf_counter()
        generated: list[int] = []
        for step in range(max_new_tokens):
            token = choose_token(logits, temperature, top_k, rng)
            generated.append(token)
            tokens.append(token)
            if on_token is not None:
                on_token(token)
            if step + 1 < max_new_tokens:
                logits = self.forward([token], cache)[-1] if cache is not None else self.forward(tokens)[-1]
        if timings is not None:
            timings.update(prefill=prefilled - start, decode=time.perf_counter() - prefilled)
        return generated

    def save_hf(self, directory: str | Path) -> None:
        """Write the weights as a HuggingFace checkpoint through the import record."""
        save_checkpoint(self.model, self.weights, self.record, directory)


def choose_token(logits: np.ndarray, temperature: float, top_k: int | None, rng: np.random.Generator) -> int:
    if temperature <= 0:
        return int(np.argmax(logits))
    scaled = logits.astype(np.float64) / temperature
    if top_k is not None and 0 < top_k < scaled.size:
        cutoff = np.partition(scaled, -top_k)[-top_k]
        scaled = np.where(scaled >= cutoff, scaled, -np.inf)
    probs = np.exp(scaled - scaled.max())
    probs /= probs.sum()
    return int(rng.choice(probs.size, p=probs))


def load(model_file: str | Path, hf: str | Path | None = None, dtype: str = "fp32", top: str | None = None,
         config: dict[str, Any] | None = None, progress: bool = False,
         sink: DiagnosticSink | None = None) -> Model:
    """Load a DSL model with the weights of a HuggingFace checkpoint (or random
    weights, normal(0, 0.02) with seed 0, when ``hf`` is None)."""
    if dtype not in STORAGE:
        raise DiagnosticError([Diagnostic("E029", f"dtype '{dtype}' is not fp32 or bf16", None)])
    program = parse_file(model_file)
    decl = choose_top(program, top)
    values = dict(config or {})
    hf_config: dict[str, Any] = {}
    sink = sink if sink is not None else DiagnosticSink()
    try:
        if hf is not None:
            hf_config = read_config(hf)
            default = _model_op(lower_program(program, decl.name, None, sink))
            values = {**dsl_config(decl, default, hf_config), **values}
        module = lower_program(program, decl.name, values, sink)
        SpecializePass().apply(Context(), module)
        model = _model_op(module)
        storage = STORAGE[dtype]
        if hf is not None:
            weights, record = load_checkpoint(model, hf, storage, warn=lambda w: sink.add(_diagnostic(w, hf)),
                                              progress=progress)
        else:
            weights, record = random_weights(model, storage), ImportRecord()
    except CheckpointError as err:
        raise DiagnosticError([_diagnostic(err, hf)]) from None
    return Model(module, model, weights, dtype, hf_config, record)


def random_weights(model: ModelOp, dtype: np.dtype, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    weights = {}
    for param in (op for op in model.walk() if isinstance(op, ParamOp)):
        shape = tuple(d.evaluate({}) for d in param.param_type.shape)
        weights[param.sym_name.data] = (rng.standard_normal(shape) * 0.02).astype(dtype)
    return weights


def _diagnostic(err: CheckpointError, directory: str | Path | None) -> Diagnostic:
    where = f" (in {directory})" if directory is not None else ""
    return Diagnostic(err.code, err.message + where, None, err.hint)


def _model_op(module: ModuleOp) -> ModelOp:
    return next(op for op in module.walk() if isinstance(op, ModelOp))
