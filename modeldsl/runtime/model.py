"""The Python API: ``modeldsl.load(model_file, hf=dir) -> Model``.

Loading reads the checkpoint's ``config.json`` through the model's
``hf_config``, lowers the DSL model with that configuration (so its
constraints are checked against the checkpoint), binds the configuration
into the IR (``mdsl-specialize``, :func:`modeldsl.passes.pipelines.bind_configuration`), and fills the
parameters through ``hf_mapping``. The forward function's inputs follow one convention: the
integer input is the token ids, an input named ``freqs`` is the RoPE table
of the positions (from ``rope_theta``, ``head_dim`` and the checkpoint's
``rope_scaling``), and one named ``local_freqs`` the unscaled RoPE table of
``rope_local_theta`` (Gemma 3's sliding-window layers, ``rope_local_base_freq``),
both computed here.

Bad arguments are coded diagnostics (:class:`DiagnosticError`), never raw
Python errors: token ids that are not integers of the vocabulary, an empty
sequence, a sequence longer than the model's positions
(``max_position_embeddings``), invalid sampling arguments (E029); a
checkpoint file that cannot be read or a checkpoint folder that cannot be
written (E028); a malformed or unsupported ``rope_scaling`` (E030); a
``save_hf`` folder that holds files the model did not save there (E044).
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from xdsl.dialects.builtin import FloatAttr, IntegerAttr, ModuleOp

from modeldsl.diagnostics import Diagnostic, DiagnosticError, DiagnosticSink
from modeldsl.dialects.dtypes import DType
from modeldsl.dialects.graph import ModelOp, ParamOp
from modeldsl.frontend.read import read_model
from modeldsl.hf.checkpoint import ImportRecord, direct_pieces, load_checkpoint, rank_slices, save_checkpoint
from modeldsl.hf.compat import (
    DiagnosticWarning,  # noqa: F401 - the API's warning class
    declarations,
    declared_types,
    warn_python,
)
from modeldsl.hf.config import dsl_config, read_config
from modeldsl.hf.safetensors_io import CheckpointError
from modeldsl.ir import verify_module
from modeldsl.kernels.cpu.compiled import prepare as prepare_cpu_kernels
from modeldsl.kernels.reference import quantize
from modeldsl.lower import choose_top, lower_program
from modeldsl.passes.pipelines import bind_configuration
from modeldsl.passes.shard import rank_shapes
from modeldsl.rank_config import lower_for_rank
from modeldsl.registry import model_for_checkpoint
from modeldsl.runtime import distributed
from modeldsl.runtime.executor import NUMPY_DTYPES, GraphExecutor, KVCache
from modeldsl.runtime.fits import check_fits_on, parameter_bytes
from modeldsl.runtime.lora import (
    LoraOptions,
    adapt,
    adapter_params,
    fill_adapters,
    init_adapters,
    merged_weights,
    quantize_base,
    read_adapter,
    stored_dtype,
    write_adapter,
)
from modeldsl.runtime.profiles import ParamsArena, ProfiledForward, params_arena
from modeldsl.runtime.rope import SUPPORTED, RopeFrequencies, RopeScalingError, rope_frequencies, rope_type
from modeldsl.runtime.saves import SaveTarget, new_run, saving_folder
from modeldsl.symbolic import STAR

STORAGE = {"fp32": np.dtype(np.float32), "bf16": NUMPY_DTYPES[DType.BF16]}
# the architectures whose transformers generation runs the whole sequence again where longrope switches to
# its long factors (Phi3ForCausalLM.prepare_inputs_for_generation); the others keep the cached keys
GENERATION_RECOMPUTES = {"Phi3ForCausalLM"}
# the forward inputs that are RoPE tables: name -> the config value of their theta; only freqs takes the
# checkpoint's rope_scaling (local_freqs: Gemma 3's sliding-window layers, whose rope_type is default)
ROPE_INPUTS = {"freqs": "rope_theta", "local_freqs": "rope_local_theta"}
RopeTables = dict[str, np.ndarray]
# the rope types transformers' config class of an architecture accepts, where it narrows them (Phi3Config's
# validate_rope); the others take every type of rope.py
ROPE_TYPES = {"Phi3ForCausalLM": ("default", "longrope")}


def _quiet_numpy(method: Callable) -> Callable:
    """Run ``method`` without numpy's RuntimeWarnings: NaN or infinite weights and values were
    reported at load (W011), and the logits show the rest."""
    @functools.wraps(method)
    def quiet(*args: Any, **kwargs: Any) -> Any:
        with np.errstate(all="ignore"):
            return method(*args, **kwargs)

    return quiet


@dataclass
class Model:
    """A loaded model: its lowered IR, weights and an executor."""

    module: ModuleOp
    model: ModelOp
    weights: dict[str, np.ndarray]
    dtype: str
    hf_config: dict[str, Any] = field(default_factory=dict)
    record: ImportRecord = field(default_factory=ImportRecord)
    device: Any = None  # a modeldsl.runtime.cuda_device.Device the schedule runs on; None: the CPU
    params: ParamsArena | None = None  # the schedule's params arena the weights are views of (the CPU)
    save_id: str = field(default_factory=new_run, repr=False)  # marks its saves (save_hf)
    whole: ModelOp | None = None  # with tp > 1, the whole model (what a save writes)
    slices: dict = field(default_factory=dict)  # with tp > 1, the tensors this rank read a slice of

    def __post_init__(self) -> None:
        if self.device is None:  # the first use on a machine builds the CPU kernels: now, before any timer
            prepare_cpu_kernels()
        float_dtype = np.float32 if self.dtype == "fp32" else None
        self.executor = GraphExecutor(self.model, self.weights, float_dtype)
        self.forward_func = self.executor.funcs["forward"]
        self.ropes = self._ropes()
        self.rope = self.ropes.get("freqs")
        self.schedule = ProfiledForward(self.model, self.weights, storage="fp32" if self.dtype == "fp32" else None,
                                        max_tokens=self.max_positions, device=self.device, params=self.params)

    @property
    def tp(self) -> int:
        """The tensor-parallel ranks the model is one rank's share of (modeldsl.rank_config; 1: the whole)."""
        return rank_shapes(self.model)

    # ------------------------------------------------------------------ config
    def config(self, name: str, default: Any = None) -> Any:
        attr = self.model.config_values.get(name)
        if isinstance(attr, IntegerAttr):
            return attr.value.data
        if isinstance(attr, FloatAttr):
            return attr.value.data
        return default

    @property
    def max_positions(self) -> int | None:
        """The longest sequence (prompt and generated tokens) the model runs: ``max_seq``
        (``max_position_embeddings``), or None for a model without one."""
        return self.config("max_seq")

    def _ropes(self) -> dict[str, RopeFrequencies]:
        """The RoPE frequencies of each RoPE input (:data:`ROPE_INPUTS`) the forward takes
        (RopeScalingError for a bad ``rope_scaling``)."""
        ropes = {}
        for arg in self.forward_func.body.block.args:
            if arg.name_hint not in ROPE_INPUTS:
                continue
            shape = arg.type.shape
            if len(shape) != 3 or shape[1] is STAR or not shape[1].is_const() or shape[1].evaluate({}) < 1 \
                    or not shape[2] == 2:
                raise DiagnosticError([Diagnostic("E004", f"the forward input '{arg.name_hint}' is {arg.type}; the "
                                                  "runtime gives the RoPE table as [T, head_dim // 2, 2]", None,
                                                  f"declare it as {arg.name_hint}: [T, head_dim // 2, 2, fp32]")])
            ropes[arg.name_hint] = self._rope(arg.name_hint, 2 * shape[1].evaluate({}))
        return ropes

    def _rope(self, name: str, rotary_dim: int) -> RopeFrequencies:
        """The frequencies of the RoPE input ``name``: its theta's, and for ``freqs`` the checkpoint's
        scaling (a rope type the architecture's transformers config class refuses is a RopeScalingError)."""
        theta_name = ROPE_INPUTS[name]
        theta = self.config(theta_name, self.hf_config.get(theta_name, 10000.0))
        if name != "freqs":
            return rope_frequencies(rotary_dim, theta)
        max_positions = self.max_positions
        if max_positions is None and isinstance(self.hf_config.get("max_position_embeddings"), int):
            max_positions = self.hf_config["max_position_embeddings"]
        # the config's top-level original_max_position_embeddings (Phi-3's, its default where absent)
        # goes before the scaling's, as in transformers' standardize_rope_params
        original = self.config("original_max_seq", self.hf_config.get("original_max_position_embeddings"))
        served = declared_types(declarations(self.model))[0]
        scaling = self.hf_config.get("rope_scaling")
        for architecture in set(served) & set(ROPE_TYPES):
            if rope_type(scaling) not in ROPE_TYPES[architecture]:
                raise RopeScalingError(f"has rope_type '{rope_type(scaling)}', which {architecture} does not take "
                                       f"(transformers' config class takes {', '.join(ROPE_TYPES[architecture])})",
                                       "rope_type")
        return rope_frequencies(rotary_dim, theta, scaling, max_positions,
                                head_dim=self.config("head_dim"), original_max_positions=original,
                                generation_recomputes=bool(GENERATION_RECOMPUTES & set(served)))

    def rope_tables(self, positions: Sequence[int], seq_len: int | None = None) -> RopeTables:
        """The RoPE table of each RoPE input for ``positions`` in a sequence of ``seq_len`` positions
        (default: the last position + 1), which picks longrope's short or long factors."""
        return {name: rope.table(np.asarray(positions), seq_len) for name, rope in self.ropes.items()}

    def inputs(self, tokens: np.ndarray, start: int, rope_tables: RopeTables | None = None,
               length: int | None = None) -> list[np.ndarray]:
        """The forward's inputs for ``tokens`` at positions ``start..``; ``rope_tables``: the RoPE tables
        of positions ``0..`` already computed (a decoder's: their rows are the same bits); ``length``: how
        many of the tokens are real where the rest pad a profile (the sequence then ends at ``start +
        length``, which picks longrope's factors)."""
        values = []
        end = start + tokens.shape[-1]
        seq_len = start + (length if length is not None else tokens.shape[-1])
        held = rope_tables is not None and all(end <= len(table) for table in rope_tables.values())
        tables = None
        for arg in self.forward_func.body.block.args:
            if arg.name_hint in ROPE_INPUTS:
                if held:
                    values.append(rope_tables[arg.name_hint][start:end])
                    continue
                tables = tables or self.rope_tables(range(start, end), seq_len)
                values.append(tables[arg.name_hint])
            elif not arg.type.dtype.is_float:
                values.append(tokens.astype(NUMPY_DTYPES[arg.type.dtype]))
            else:
                raise DiagnosticError([Diagnostic("E029", f"the forward input '{arg.name_hint}' is neither the "
                                                  f"token ids nor a RoPE table ({', '.join(ROPE_INPUTS)}); call "
                                                  "the executor directly", None)])
        return values

    # ------------------------------------------------------------------ running
    def token_array(self, token_ids: Sequence[int] | np.ndarray, start: int = 0, batch: bool = True) -> np.ndarray:
        """``token_ids`` as an integer array ``[T]`` (or ``[B, T]`` where ``batch``), checked:
        not empty, integers inside the vocabulary, positions ``start..start+T`` inside
        ``max_positions``; E029 naming the bad token id otherwise."""
        shapes = "a list of token ids or a [B, T] array of them" if batch else "a list of token ids"
        hint = "e.g. [1, 2, 3]" + (", or [[1, 2], [3, 4]] for a batch of rows of one length" if batch else "")
        try:
            tokens = np.asarray(token_ids)
        except (ValueError, TypeError):
            raise _argument_error(f"token ids must be {shapes}; these do not form one (rows of different "
                                  "lengths?)", hint) from None
        if tokens.ndim not in ((1, 2) if batch else (1,)):
            raise _argument_error(f"token ids must be {shapes}, got an array of shape {tokens.shape}", hint)
        if tokens.size == 0:
            raise _argument_error("the token ids are empty: give at least one token id",
                                  "pass a non-empty sequence, e.g. [1, 2, 3]")
        if tokens.dtype.kind not in "iu":
            bad = next((t for t in tokens.ravel().tolist()
                        if isinstance(t, bool) or not isinstance(t, (int, np.integer))), tokens.ravel()[0])
            raise _argument_error(f"token id {bad!r} is not an integer (the ids have dtype {tokens.dtype})",
                                  "token ids are integers in [0, vocab_size)")
        vocab = self.config("vocab_size")
        outside = (tokens < 0) | (tokens >= vocab) if vocab is not None else tokens < 0
        if outside.any():
            where = tuple(int(i) for i in np.argwhere(outside)[0])
            position = where[0] if len(where) == 1 else list(where)
            raise _argument_error(f"token id {int(tokens[where])} at position {position} is outside the "
                                  f"vocabulary [0, {vocab})", "token ids are integers in [0, vocab_size)")
        end = start + tokens.shape[-1]
        if self.max_positions is not None and end > self.max_positions:
            raise _argument_error(f"the sequence would reach {end} positions, more than the model's "
                                  f"{self.max_positions} (max_position_embeddings)",
                                  f"run at most {self.max_positions} tokens in all")
        return tokens.astype(np.int64)

    @_quiet_numpy
    def forward(self, token_ids: Sequence[int] | np.ndarray, cache: KVCache | None = None,
                engine: str = "schedule") -> np.ndarray:
        """Logits ``[B, T, vocab]`` (``[T, vocab]`` for a 1-D input) in fp32.

        ``engine="schedule"`` runs the planned schedule of the smallest profile that
        fits; ``"graph"`` the graph interpreter (the oracle), which also serves
        decoding with a KV ``cache``."""
        if engine not in ("schedule", "graph"):
            raise _argument_error(f"engine '{engine}' is not 'schedule' or 'graph'")
        start = cache.length if cache is not None else 0
        tokens = self.token_array(token_ids, start)
        batched = tokens.ndim == 2
        tokens = tokens if batched else tokens[None, :]
        if cache is None and engine == "schedule":
            logits = self.schedule.run(tokens, lambda padded: self.inputs(padded, 0, length=tokens.shape[-1]))
        else:
            logits = self.executor.run("forward", *self.inputs(tokens, start), cache=cache)[0]
        logits = np.asarray(logits, dtype=np.float32)
        return logits if batched else logits[0]

    @_quiet_numpy
    def generate(self, prompt: Sequence[int], max_new_tokens: int, temperature: float = 0.0,
                 top_k: int | None = None, seed: int | None = None, use_cache: bool = True,
                 on_token: Callable[[int], None] | None = None,
                 timings: dict[str, float] | None = None, engine: str = "schedule") -> list[int]:
        """Greedy (temperature 0) or sampled continuation of ``prompt``; with the KV
        cache, one prefill then one-token steps; without it, full recomputation.
        ``timings`` receives ``prefill`` and ``decode`` seconds. The prompt and the new
        tokens together may hold at most ``max_positions`` tokens (E029 otherwise).
        ``engine="graph"`` decodes with the graph interpreter (the oracle)."""
        if engine not in ("schedule", "graph"):
            raise _argument_error(f"engine '{engine}' is not 'schedule' or 'graph'")
        problems = sampling_problems(max_new_tokens, temperature, top_k, seed)
        if problems:
            raise DiagnosticError([Diagnostic("E029", f"{name} {problem}", None, "see Model.generate")
                                   for name, problem in problems])
        tokens = self.token_array(prompt, batch=False).tolist()
        limit = self.max_positions
        if limit is not None and len(tokens) + max_new_tokens > limit:
            raise _argument_error(f"the prompt ({len(tokens)} tokens) and max_new_tokens={max_new_tokens} "
                                  f"exceed the model's {limit} positions (max_position_embeddings)",
                                  f"pass max_new_tokens <= {max(limit - len(tokens), 0)}")
        rng = np.random.default_rng(seed)
        step_logits = self.decoder(len(tokens) + max_new_tokens, use_cache, engine)
        start = time.perf_counter()
        logits = step_logits(tokens, 0)
        prefilled = time.perf_counter()
        generated: list[int] = []
        for step in range(max_new_tokens):
            token = choose_token(logits, temperature, top_k, rng)
            generated.append(token)
            tokens.append(token)
            if on_token is not None:
                on_token(token)
            if step + 1 < max_new_tokens:
                logits = step_logits(tokens, len(tokens) - 1)
        if timings is not None:
            timings.update(prefill=prefilled - start, decode=time.perf_counter() - prefilled)
        return generated

    def decoder(self, total: int, use_cache: bool, engine: str) -> Callable[[list[int], int], np.ndarray]:
        """``step(tokens, start)``: the last position's logits after feeding ``tokens[start:]``
        (all of them without a cache: full recomputation). The cache holds attention's keys and values
        and the recurrent states (Mamba's conv and scan) after the tokens fed so far. With longrope in
        a family whose transformers generation does so (Phi-3: ``RopeFrequencies.recomputes``), the
        step that first grows the sequence past original_max_position_embeddings feeds all of it again
        from position 0 (with the long factors): the cached keys were rotated with the short ones."""
        if not use_cache:
            return lambda tokens, start: self.forward(tokens, engine=engine)[-1]
        rope = self.rope

        def begin(tokens: list[int], start: int) -> int:
            return 0 if rope is not None and rope.recomputes(start, len(tokens)) else start

        if engine == "graph":
            caches = [KVCache()]

            def graph_step(tokens: list[int], start: int) -> np.ndarray:
                start = begin(tokens, start)
                if start == 0:
                    caches[0] = KVCache()
                return self.forward(tokens[start:], caches[0], engine="graph")[-1]

            return graph_step
        capacity = self.schedule.bucket(total)
        tables: dict[bool, RopeTables] = {}

        def table(end: int) -> RopeTables | None:
            if not self.ropes:
                return None
            long = rope is not None and rope.uses_long(end)
            if long not in tables:
                tables[long] = self.rope_tables(range(total), end)
            return tables[long]

        def step(tokens: list[int], start: int) -> np.ndarray:
            start = begin(tokens, start)
            new = self.token_array(tokens[start:], start)[None, :]
            held = table(len(tokens))
            logits = self.schedule.run(new, lambda padded: self.inputs(padded, start, held, new.shape[-1]), start,
                                       capacity)
            return logits[0, -1]

        return step

    def save_hf(self, directory: str | Path, dtype: str | None = None, overwrite: bool = False) -> None:
        """Write the weights as a HuggingFace checkpoint through the import record, each
        tensor in its checkpoint dtype or, given ``dtype`` ("fp32", "bf16"), every floating-point
        one in that (rounded to nearest even); config.json names the dtype written. The folder
        is written atomically and holds only the save's files: a new or empty folder, or one this
        model saved before, is (re)written; a folder holding anything else is E044 unless
        ``overwrite`` (then it is replaced, everything in it included). E028 when the folder
        cannot be created or written (:mod:`modeldsl.runtime.saves`). A model with LoRA adapters is
        saved merged (each adapted weight plus its adapters, as PEFT's ``merge_and_unload``): an
        ordinary checkpoint of the base architecture."""
        if dtype is not None and dtype not in STORAGE:
            raise _argument_error(f"dtype '{dtype}' is not fp32 or bf16")
        target = SaveTarget(Path(directory), self.save_id, overwrite=bool(overwrite),
                            what=f"save_hf('{directory}')", how="overwrite=True", owner="this model")
        model, weights, record = self.whole_checkpoint({**self.weights, **merged_weights(self.model, self.weights)})
        if distributed.communicator().rank != 0:
            return  # every rank holds the whole model now: one writes it
        try:
            with saving_folder(target) as folder:
                save_checkpoint(model, weights, record, folder, STORAGE[dtype] if dtype is not None else None)
        except OSError as err:
            raise DiagnosticError([Diagnostic("E028", f"cannot write the checkpoint to '{directory}': "
                                              f"{_reason(err)}", None,
                                              "give a folder path whose parents are folders you can write")]) from None


    def whole_checkpoint(self, weights: dict[str, np.ndarray]) -> tuple[ModelOp, dict[str, np.ndarray], ImportRecord]:
        """(the model, ``weights``, the import record) of the whole model: on tensor-parallel ranks the
        whole model, every rank's shares gathered (:mod:`modeldsl.runtime.tensor_parallel`: a
        collective, every rank calls it) and the record of the whole tensors."""
        if self.tp == 1:
            return self.model, weights, self.record
        from modeldsl.runtime.tensor_parallel import whole_arrays, whole_record

        return self.whole, whole_arrays(self.model, self.record, weights, self.tp), \
            whole_record(self.record, self.slices)

    def save_adapter(self, directory: str | Path, overwrite: bool = False) -> None:
        """Write the LoRA adapters as PEFT does (``adapter_config.json``, ``adapter_model.safetensors``),
        for ``peft.PeftModel.from_pretrained`` or ``modeldsl.load(..., adapter=DIR)``; the folder
        rules of :meth:`save_hf` (E044 for a folder of other files unless ``overwrite``)."""
        if not adapter_params(self.model):
            raise _argument_error("the model has no LoRA adapters to save: load it with lora=... or adapter=DIR")
        target = SaveTarget(Path(directory), self.save_id, overwrite=bool(overwrite),
                            what=f"save_adapter('{directory}')", how="overwrite=True", owner="this model")
        base = str(self.record.source) if self.record.source is not None else None
        try:
            with saving_folder(target) as folder:
                write_adapter(folder, self.model, self.weights, base)
        except OSError as err:
            raise DiagnosticError([Diagnostic("E028", f"cannot write the adapter to '{directory}': "
                                              f"{_reason(err)}", None,
                                              "give a folder path whose parents are folders you can write")]) from None


def _adapter_step(step: Callable, adapter: str | Path, *args: Any) -> Any:
    """``step(adapter, ...)`` or ``step(...)`` on an adapter folder's files, its errors located there."""
    try:
        return step(adapter) if not args else step(*args)
    except CheckpointError as err:
        raise DiagnosticError([_diagnostic(err, adapter)]) from None


def sampling_problems(max_new_tokens: Any, temperature: Any, top_k: Any, seed: Any) -> list[tuple[str, str]]:
    """``(argument, problem)`` for each invalid argument of :meth:`Model.generate`
    (mdsl-run checks its flags with this too)."""
    def integer(value: Any) -> bool:
        return isinstance(value, (int, np.integer)) and not isinstance(value, bool)

    problems = []
    for name, value in (("max_new_tokens", max_new_tokens), ("top_k", top_k), ("seed", seed)):
        if value is None and name != "max_new_tokens":
            continue
        if not integer(value):
            problems.append((name, f"must be a non-negative integer, got {value!r}"))
        elif value < 0:
            problems.append((name, f"must not be negative, got {value}"))
    if not (integer(temperature) or isinstance(temperature, (float, np.floating))) \
            or not math.isfinite(temperature) or temperature < 0:
        problems.append(("temperature", f"must be a finite number >= 0 (0 is greedy), got {temperature!r}"))
    return problems


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


def load(model_file: str | Path | None = None, hf: str | Path | None = None, dtype: str = "fp32",
         top: str | None = None, config: dict[str, Any] | None = None, progress: bool = False,
         sink: DiagnosticSink | None = None, device: str = "cpu", force_architecture: bool = False,
         allow_unused_tensors: bool = False, lora: Any = None, adapter: str | Path | None = None,
         base_dtype: str | None = None, tp: int = 1) -> Model:
    """Load a DSL model with the weights of a HuggingFace checkpoint (or random
    weights, normal(0, 0.02) with seed 0, when ``hf`` is None). Without ``model_file``, the std
    model that serves the checkpoint's ``architectures`` / ``model_type`` (E036 listing the served
    architectures when none does; :mod:`modeldsl.registry`). ``device``: where the schedule
    runs: ``cpu``, ``cuda`` (the GPU) or ``emulated`` (the CUDA executor on numpy, for tests).

    A checkpoint of an architecture the model does not declare is E036 (W010 with
    ``force_architecture``); a config field that changes the math and that the model does
    not handle is E037; a checkpoint tensor no rule reads is E040 (W006 with
    ``allow_unused_tensors``); a model whose parameters do not fit in the memory available
    is E038, checked before anything is allocated. Warnings (W006, W010, W011, ...) go to
    ``sink`` when one is given, else each is raised through Python's ``warnings`` as a
    :class:`DiagnosticWarning` carrying its code.

    ``lora`` adds LoRA adapters before the parameters are allocated (a rank, or a dictionary of
    PEFT's ``LoraConfig`` options: ``dict(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"])``;
    :mod:`modeldsl.runtime.lora`): the model is frozen but for the adapters, which start as PEFT's.
    ``adapter`` loads a PEFT LoRA adapter folder instead (``adapter_config.json``,
    ``adapter_model.safetensors``: ours or one PEFT wrote), to generate with or to train on.

    ``base_dtype`` stores the frozen base of such a model narrower (QLoRA-style): ``"bf16"``, or
    ``"fp8"`` (fp8 e4m3 with one fp32 scale per output channel, ``scale = max|W[o, :]| / 448``);
    None (the default) stores it as the trained weights are (``dtype``). It applies to every frozen
    weight that only matmuls read (the linear modules, the LM head included; not the embedding, the
    norms, biases or the adapters): ``mdsl-quantize-frozen`` (:mod:`modeldsl.passes.quantize_frozen`)
    rewrites the model, the checkpoint's values are quantized once as they are read (round to nearest
    even, saturating), and each GEMM widens a stored weight into the compute dtype a tile at a time
    (what else reads one, the fused LM-head loss, widens one layer's weight right before it).
    ``save_hf`` then writes the dequantized values (merged with the adapters); ``save_adapter`` writes
    the adapters alone, as on a full-precision base. E029 for another ``base_dtype``, or one given for
    a model without frozen linear weights.

    ``tp`` loads this process's share of a model tensor-parallel over ``tp`` ranks (the layout's
    ``tp`` group, :func:`modeldsl.runtime.distributed.start`): the model is lowered for one rank
    (:mod:`modeldsl.rank_config`), each rank reads its slice of every sharded tensor from the
    memory-mapped checkpoint, and the forward's schedule sums the partial products over the ranks
    (``mdsl-shard{tp}``): every rank computes the whole model's logits. E048 where ``tp`` does not
    divide the heads or ``d_ff``."""
    if dtype not in STORAGE:
        raise DiagnosticError([Diagnostic("E029", f"dtype '{dtype}' is not fp32 or bf16", None)])
    if base_dtype is not None:
        stored_dtype(base_dtype)  # E029 before anything is read
    collected = sink if sink is not None else DiagnosticSink()
    before = len(collected.diagnostics)
    try:
        if lora is not None and adapter is not None:
            raise _argument_error("give lora= (new adapters) or adapter=DIR (trained ones), not both")
        adapters = LoraOptions.of(lora) if lora is not None else None
        model = _load(model_file, hf, dtype, top, config, progress, collected, device, force_architecture,
                      allow_unused_tensors, adapters, adapter, base_dtype, tp)
    except DiagnosticError as err:  # the warnings of this load ride along with the error
        riding = [d for d in collected.diagnostics[before:] if d.severity == "warning" and d not in err.diagnostics]
        raise DiagnosticError(riding + err.diagnostics) from None
    if sink is None:
        for diagnostic in collected.diagnostics:
            if diagnostic.severity == "warning":
                warn_python(diagnostic)
    return model


def _load(model_file: str | Path, hf: str | Path | None, dtype: str, top: str | None,
          config: dict[str, Any] | None, progress: bool, sink: DiagnosticSink, device: str,
          force_architecture: bool, allow_unused_tensors: bool, lora: LoraOptions | None = None,
          adapter: str | Path | None = None, base_dtype: str | None = None, tp: int = 1) -> Model:
    runs_on = _device(device)
    check_tensor_parallel(tp, runs_on, lora, adapter, base_dtype)
    if model_file is None:
        model_file, top = _served_model(hf, top)
    program, top = read_model(model_file, top)
    decl = choose_top(program, top)
    values = dict(config or {})
    hf_config: dict[str, Any] = {}
    storage = STORAGE[dtype]
    try:
        tensors = None
        if adapter is not None:
            lora, tensors = _adapter_step(read_adapter, adapter)
        if hf is not None:
            hf_config = read_config(hf)
            checkpoint_values, default = _checkpoint_values(program, decl, hf_config, sink, force_architecture)
            values = {**checkpoint_values, **values}
            _check_parameters_fit(default, values, storage, runs_on, base_dtype)
        module, whole = (lower_program(program, decl.name, values, sink), None) if tp == 1 else \
            lower_for_rank(program, decl.name, values, tp, sink)
        bind_configuration(module)
        if whole is not None:
            bind_configuration(whole)
        _verify_specialized(module)
        model = _model_op(module)
        adapted = adapt(model, lora)  # lora=, an adapter's options, or the model's @adapter annotations
        quantize_base(model, base_dtype)  # base_dtype=: the frozen base stored in bf16 or fp8
        _check_parameters_fit(model, {}, storage, runs_on)
        arena = params_arena(model, "fp32" if dtype == "fp32" else None, populate=hf is None) \
            if runs_on is None else None
        slices = rank_slices(model, tp, distributed.rank_in("tp")) if hf is not None else {}
        if arena is not None and hf is not None:
            arena = arena.lined_up(direct_pieces(model, hf, storage, arena.views, slices))
        into = arena.views if arena is not None else None
        if hf is not None:
            weights, record = load_checkpoint(model, hf, storage, warn=lambda w: sink.add(_diagnostic(w, hf)),
                                              progress=progress, allow_unused=allow_unused_tensors, into=into,
                                              mapper=arena.pages.map_file if arena is not None else None,
                                              slices=slices)
        else:
            weights, record = random_weights(model, storage, into=into), ImportRecord()
        if adapted:
            init_adapters(model, weights, storage, lora.seed if lora is not None else 0, into)
        if tensors is not None:
            _adapter_step(fill_adapters, adapter, model, weights, tensors)
        if arena is not None:
            _hold_once(weights, arena)
    except CheckpointError as err:
        raise DiagnosticError([_diagnostic(err, hf)]) from None
    except OSError as err:  # e.g. an unreadable file
        raise DiagnosticError([Diagnostic("E028", f"cannot read '{err.filename or hf}': {_reason(err)}", None,
                                          "the checkpoint folder must hold readable config.json and "
                                          "*.safetensors files")]) from None
    try:
        with np.errstate(all="ignore"):  # a nonsensical rope_theta is W011, not a numpy RuntimeWarning
            return Model(module, model, weights, dtype, hf_config, record, runs_on, arena,
                         whole=_model_op(whole) if whole is not None else None, slices=slices)
    except RopeScalingError as err:
        raise DiagnosticError([_rope_diagnostic(err, hf_config, hf)]) from None


def check_tensor_parallel(tp: int, device: Any, lora: Any, adapter: Any, base_dtype: str | None) -> None:
    """E048 for a ``tp`` that is no size or that the started layout does not have, and E029 for what
    tensor-parallel ranks do not run yet (a GPU, adapters, a narrower frozen base)."""
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise distributed.layout_error(f"tp={tp!r}: a parallel size is a positive integer", "give tp=1 or more")
    if tp == 1:
        return
    started = distributed.communicator().layout.tp
    if started != tp:
        raise distributed.layout_error(f"tp={tp}, but this process's layout has tp={started}",
                                       f"start the layout first: modeldsl.runtime.distributed.start(Layout(tp={tp}))")
    refused = [what for what, given in (("a GPU", device is not None), ("LoRA adapters", lora or adapter),
                                        ("base_dtype", base_dtype)) if given]
    if refused:
        raise DiagnosticError([Diagnostic("E029", f"tensor parallelism with {refused[0]} is not implemented", None,
                                          "run tensor-parallel ranks on the CPU with full-precision weights")])


def _served_model(hf: str | Path | None, top: str | None) -> tuple[Path, str]:
    """The file and declaration of the std model that serves the checkpoint ``hf``."""
    if hf is None:
        raise _argument_error("give a model file, or a checkpoint folder (hf=DIR) whose config.json names the "
                              "architecture")
    try:
        entry = model_for_checkpoint(read_config(hf), str(Path(hf) / "config.json"))
    except CheckpointError as err:
        raise DiagnosticError([_diagnostic(err, hf)]) from None
    return entry.path, top or entry.name


def _verify_specialized(module: ModuleOp) -> None:
    """Shapes that agree symbolically may disagree once the configuration is bound: coded
    verifier failures (E041, at the DSL line) before the kernels see them."""
    problems = verify_module(module)
    if problems:
        raise DiagnosticError([p.diagnostic() for p in problems])


def _hold_once(weights: dict[str, np.ndarray], arena: ParamsArena) -> None:
    """Every weight in its place in the schedule's params arena, and a view of it where the dtypes
    agree. The loader filled the views in the load dtype in place; a parameter the arena stores in
    another dtype (declared fp32 in a bf16 load) is copied in, converted, and stays its own array."""
    for name, view in arena.views.items():
        weight = weights.get(name)
        if weight is None or weight is view:
            continue
        np.copyto(view, np.asarray(weight).reshape(view.shape), casting="unsafe")
        if weight.dtype == view.dtype and weight.shape == view.shape:
            weights[name] = view


def _check_parameters_fit(model: ModelOp, values: dict[str, Any], storage: np.dtype, device: Any,
                          base_dtype: str | None = None) -> None:
    """E038 before anything is allocated: the parameters (on the CPU they are read into the
    schedule's params arena, so they are held once; a weight stored narrower counts its stored
    bytes). Before the model is adapted and its base stored (``base_dtype``), the parameters are
    counted at the narrowest they may be stored in: the check after it counts them exactly."""
    itemsize = storage.itemsize
    if base_dtype is not None:
        itemsize = min(itemsize, DType(stored_dtype(base_dtype)).byte_size(1))
    size = parameter_bytes(model, values, itemsize)
    if size is None:
        return
    advice = "choose a smaller configuration, --dtype bf16 to halve the parameters"
    check_fits_on(None, {"parameters": size}, advice)
    if device is not None:
        check_fits_on(device, {"parameters": size}, advice)


def hf_config_values(program: Any, decl: Any, hf_config: dict[str, Any],
                     sink: DiagnosticSink | None = None, force_architecture: bool = False) -> dict[str, Any]:
    """The values of a DSL model's parameters for a HuggingFace ``config.json`` (its ``hf_config``
    rules, spec 8), for the declaration ``decl`` of a parsed ``program``."""
    return _checkpoint_values(program, decl, hf_config, sink if sink is not None else DiagnosticSink(),
                              force_architecture)[0]


def _checkpoint_values(program: Any, decl: Any, hf_config: dict[str, Any], sink: DiagnosticSink,
                       force_architecture: bool) -> tuple[dict[str, Any], ModelOp]:
    """The parameter values for a checkpoint's config, and the model lowered with its defaults."""
    default = _model_op(lower_program(program, decl.name, None, DiagnosticSink()))  # lowered again, reported then
    return dsl_config(decl, default, hf_config, force_architecture, warn=sink.add), default


def random_weights(model: ModelOp, dtype: np.dtype, seed: int = 0,
                   into: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """normal(0, 0.02) weights in ``dtype``, written into the arrays of ``into`` where it has
    one of the parameter's shape and dtype. A weight stored narrower (``base_dtype``) is those
    values stored so (its scales with it): the same draws as the model without it."""
    rng = np.random.default_rng(seed)
    weights = {}
    for param in (op for op in model.walk() if isinstance(op, ParamOp)):
        name = param.sym_name.data
        info = param.quantized
        if info is not None and info["role"] == "scale":
            continue  # made with its weight
        shape = tuple(d.evaluate({}) for d in param.param_type.shape)
        if info is not None:
            weights |= _stored_values(param, (rng.standard_normal(shape) * 0.02).astype(np.float32), into)
            continue
        value = (rng.standard_normal(shape) * 0.02).astype(dtype)
        target = (into or {}).get(name)
        if target is not None and target.shape == shape and target.dtype == value.dtype:
            np.copyto(target, value)
            value = target
        weights[name] = value
    return weights


def _stored_values(param: ParamOp, wide: np.ndarray, into: dict[str, np.ndarray] | None) -> dict[str, np.ndarray]:
    """A weight stored narrower from its float32 values: rounded to bf16, or quantized to fp8 with
    its scales (:func:`modeldsl.kernels.reference.quantize`), in the arrays of ``into`` where it has them."""
    info = param.quantized
    stored = NUMPY_DTYPES[DType(info["dtype"])]
    found = {param.sym_name.data: wide.astype(stored)} if "scale" not in info else \
        dict(zip((param.sym_name.data, info["scale"]), quantize(wide, dtype=stored)))
    for name, value in found.items():
        target = (into or {}).get(name)
        if target is not None and target.shape == value.shape and target.dtype == value.dtype:
            np.copyto(target, value)
            found[name] = target
    return found


def _rope_diagnostic(err: RopeScalingError, hf_config: dict[str, Any], directory: str | Path | None) -> Diagnostic:
    scaling = hf_config.get("rope_scaling")
    field = "rope_parameters" if scaling is not None and scaling is hf_config.get("rope_parameters") else "rope_scaling"
    where = str(Path(directory) / "config.json") if directory is not None else "config.json"
    return Diagnostic("E030", f"{where}: '{field}' {err}", None,
                      f"fix '{field}' in config.json; the rope types this runtime implements are "
                      f"{', '.join(SUPPORTED)}")


def _device(kind: str) -> Any:
    """The device the schedule runs on (None: the CPU); E029 for an unknown or unusable one."""
    if kind == "cpu":
        return None
    from modeldsl.runtime.cuda_device import DEVICES, make_device

    if kind not in DEVICES:
        raise _argument_error(f"device '{kind}' is not cpu, {' or '.join(DEVICES)}")
    try:
        return make_device(kind)
    except RuntimeError as err:
        raise _argument_error(f"--device {kind}: {err}", "run on --device cpu, or on a machine with an NVIDIA GPU "
                              "and cuda-python") from None


def _argument_error(message: str, hint: str = "") -> DiagnosticError:
    return DiagnosticError([Diagnostic("E029", message, None, hint)])


def _reason(err: OSError) -> str:
    return err.strerror or str(err)


def _diagnostic(err: CheckpointError, directory: str | Path | None) -> Diagnostic:
    where = f" (in {directory})" if directory is not None else ""
    return Diagnostic(err.code, err.message + ("" if err.span is not None else where), err.span, err.hint)


def _model_op(module: ModuleOp) -> ModelOp:
    return next(op for op in module.walk() if isinstance(op, ModelOp))
