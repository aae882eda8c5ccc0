"""LoRA adapters on a loaded model: the options, and the adapters' initial weights.

``modeldsl.load(..., lora=dict(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]))`` runs
``mdsl-adapters`` (:mod:`modeldsl.passes.adapters`) on the configured model before its
parameters are allocated, so that the adapters live in the params arena beside the frozen
weights. The options take PEFT's ``LoraConfig`` names (``r``, ``lora_alpha``,
``target_modules``, ``lora_dropout``, ``use_rslora``) or the pass's (``rank``, ``alpha``,
``targets``, ``dropout``, ``rslora``), and ``seed``. The adapters start as PEFT's do:
``lora_A`` uniform in ``[-1/sqrt(in), 1/sqrt(in)]`` (Kaiming-uniform with ``a = sqrt(5)``),
``lora_B`` zeros, so the adapted model computes what the base does until it trains; each
layer of a stack draws its own ``lora_A``, from a generator seeded with ``seed`` and the
parameter's name.

PEFT's files: :func:`save_adapter` writes ``adapter_config.json`` and
``adapter_model.safetensors`` as PEFT names them
(``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight``), which
``peft.PeftModel.from_pretrained`` loads; :func:`read_adapter` reads such a folder, ours or
one PEFT wrote (``modeldsl.load(..., adapter=DIR)``): its LoRA options from the config, its
tensors by name. A config of a kind of adapter this runtime does not compute (DoRA, biases,
``modules_to_save``, per-layer ranks) is E030; a tensor missing, of another shape or that no
adapter takes is E031, E032 or E040, naming it. :func:`merged_weights` folds the adapters into
the weights they adapt (``W + scaling * B @ A``, slice by slice), as PEFT's ``merge_and_unload``.

A low-precision frozen base (QLoRA-style, ``modeldsl.load(..., lora=..., base_dtype="fp8")``):
:func:`quantize_base` runs ``mdsl-quantize-frozen`` (:mod:`modeldsl.passes.quantize_frozen`) after
the adapters are added, so every frozen linear weight is stored in bf16, or in fp8 e4m3 with an fp32
scale per output channel, and widened by the GEMM that reads it, a tile at a time. The adapters stay in
the load's dtype and train as on a full-precision base; their files do not change (an adapter trained
on an fp8 base loads on a full-precision one, and back). :func:`merged_weights` widens a stored weight
(``q * scale``) before it folds the adapters in, so a merged save of an fp8 base holds the dequantized
values.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from modeldsl.diagnostics import Diagnostic, DiagnosticError
from modeldsl.dialects.graph import ModelOp, ParamOp
from modeldsl.hf.safetensors_io import CheckpointError, SafetensorsFile, regular_file, write_safetensors
from modeldsl.kernels.reference import dequantize
from modeldsl.passes.adapters import (
    Lora,
    adapter_info,
    add_adapters,
    add_annotated_adapters,
    has_adapter_annotations,
    mapped_weights,
    unmapped_weights,
)
from modeldsl.passes.quantize_frozen import quantize_frozen

CONFIG_FILE = "adapter_config.json"
TENSORS_FILE = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."
# adapter_config.json keys whose non-default values ask for what this runtime does not compute
UNSUPPORTED = {"use_dora": False, "bias": "none", "modules_to_save": None, "layers_to_transform": None,
               "fan_in_fan_out": False, "lora_bias": False, "use_qalora": False}

# base_dtype= of modeldsl.load: what mdsl-quantize-frozen stores the frozen base in
BASE_DTYPES = {"bf16": "bf16", "fp8": "fp8_e4m3", "fp8_e4m3": "fp8_e4m3"}
ALIASES = {"r": "rank", "lora_alpha": "alpha", "target_modules": "targets", "lora_dropout": "dropout",
           "use_rslora": "rslora"}


@dataclass(frozen=True)
class LoraOptions:
    """What ``mdsl-adapters`` adds: rank, alpha (None: the rank), targets, dropout, rsLoRA, seed."""

    rank: int = 8
    alpha: float | None = None
    targets: tuple[str, ...] = ("q_proj", "v_proj")
    dropout: float = 0.0
    rslora: bool = False
    seed: int = 0
    rank_pattern: Mapping[str, int] = field(default_factory=dict)  # PEFT's: module pattern -> its rank
    alpha_pattern: Mapping[str, float] = field(default_factory=dict)  # and -> its alpha

    @classmethod
    def of(cls, spec: LoraOptions | Mapping[str, Any] | int) -> LoraOptions:
        """From a rank, a dictionary (PEFT's names or ours) or options; E029 naming a wrong key or value."""
        if isinstance(spec, LoraOptions):
            return spec.checked()
        if isinstance(spec, int) and not isinstance(spec, bool):
            return cls(rank=spec).checked()
        if not isinstance(spec, Mapping):
            raise _error(f"lora={spec!r} is not a rank or a dictionary of LoRA options",
                         "give lora=8 or lora=dict(r=8, lora_alpha=16, target_modules=['q_proj', 'v_proj'])")
        known = {f for f in cls.__dataclass_fields__}
        values: dict[str, Any] = {}
        for key, value in spec.items():
            name = ALIASES.get(key, key)
            if name not in known:
                raise _error(f"lora: no option '{key}'", f"the options: {', '.join([*ALIASES, 'seed'])}")
            values[name] = tuple([value] if isinstance(value, str) else value) if name == "targets" else value
        return cls(**values).checked()

    def checked(self) -> LoraOptions:
        if not isinstance(self.rank, int) or isinstance(self.rank, bool) or self.rank < 1:
            raise _error(f"lora: r={self.rank!r} is not a positive integer", "give the adapters' rank: r=8")
        if self.alpha is not None and (not isinstance(self.alpha, (int, float)) or not self.alpha > 0):
            raise _error(f"lora: lora_alpha={self.alpha!r} is not a positive number",
                         "give lora_alpha (the scaling is lora_alpha / r), or leave it out for r")
        if not isinstance(self.dropout, (int, float)) or not 0 <= self.dropout < 1:
            raise _error(f"lora: lora_dropout={self.dropout!r} is not in [0, 1)", "give a probability: 0.05")
        if not self.targets or not all(isinstance(t, str) and t for t in self.targets):
            raise _error(f"lora: target_modules={list(self.targets)!r} names no module",
                         "name the modules: ['q_proj', 'v_proj'], or 'all-linear'")
        for name, pattern, kind in (("rank_pattern", self.rank_pattern, int), ("alpha_pattern", self.alpha_pattern,
                                                                                 (int, float))):
            if not isinstance(pattern, Mapping) or any(
                    not isinstance(k, str) or not isinstance(v, kind) or isinstance(v, bool) or not v > 0
                    for k, v in pattern.items()):
                raise _error(f"lora: {name}={pattern!r} is not a dictionary of module patterns to positive numbers",
                             f"e.g. {name}={{'q_proj': 16}}")
        return self

    @property
    def lora(self) -> Lora:
        return Lora(self.rank, float(self.alpha if self.alpha is not None else self.rank), float(self.dropout),
                    bool(self.rslora), int(self.seed))

    def lora_for(self, module: str, layers: int | None = None) -> Lora:
        """The options of one module (``model.layers.{layer}.self_attn.q_proj``, a stack's over
        ``layers`` layers): the rank and alpha of the first ``rank_pattern`` / ``alpha_pattern``
        key that matches its name as PEFT matches them, else ``rank`` and ``alpha``. E029 where a
        key gives the layers of one stack different values (one module of a stack has one rank)."""
        rank = _pattern_value(self.rank_pattern, module, layers, self.rank)
        default_alpha = self.alpha if self.alpha is not None else self.rank
        alpha = _pattern_value(self.alpha_pattern, module, layers, default_alpha)
        if not self.alpha_pattern and self.alpha is None:
            alpha = rank  # PEFT: lora_alpha defaults to r
        return Lora(int(rank), float(alpha), float(self.dropout), bool(self.rslora), int(self.seed))


def _pattern_value(pattern: Mapping[str, Any], module: str, layers: int | None, default: Any) -> Any:
    names = [module.format(layer=k) for k in range(layers)] if layers else [module]
    values = {_pattern_match(pattern, name, default) for name in names}
    if len(values) > 1:
        raise _error(f"lora: the layers of {module} would get the ranks or alphas {sorted(values)}",
                     "one module of a stack has one rank: give the pattern for all its layers")
    return values.pop()


def _pattern_match(pattern: Mapping[str, Any], name: str, default: Any) -> Any:
    """PEFT's ``get_pattern_key``: the first key ``k`` with ``(.*\\.)?(k)$`` matching the module's name."""
    for key, value in pattern.items():
        try:
            if re.match(rf"(.*\.)?({key})$", name):
                return value
        except re.error:
            raise _error(f"lora: the pattern '{key}' is no regular expression", "give module names such as "
                         "q_proj") from None
    return default


def _error(message: str, hint: str) -> DiagnosticError:
    return DiagnosticError([Diagnostic("E029", message, None, hint)])


def adapt(model: ModelOp, options: LoraOptions | None) -> list[str]:
    """Add the adapters to a configured model (``mdsl-adapters``): those of ``options``, else those
    its ``@adapter(lora)`` annotations declare (none where it has none); their parameters' names."""
    if options is None:
        return add_annotated_adapters(model) if has_adapter_annotations(model) else []
    return add_adapters(model, options.lora_for, options.targets)


def adapter_params(model: ModelOp) -> list[ParamOp]:
    """The parameters ``mdsl-adapters`` declared, in declaration order."""
    return [p for p in model.params() if adapter_info(p) is not None]


def initial_value(param: ParamOp, seed: int, dtype: np.dtype) -> np.ndarray:
    """The adapter's first value: Kaiming-uniform (``a = sqrt(5)``) for lora_A, zeros for lora_B."""
    shape = tuple(d.evaluate({}) for d in param.param_type.shape)
    info = adapter_info(param)
    if info["init"] == "zeros":
        return np.zeros(shape, dtype)
    bound = 1.0 / math.sqrt(shape[-1])
    digest = hashlib.sha256(param.sym_name.data.encode()).digest()
    rng = np.random.default_rng([seed, int.from_bytes(digest[:8], "little")])
    return rng.uniform(-bound, bound, size=shape).astype(dtype)


def init_adapters(model: ModelOp, weights: dict[str, np.ndarray], dtype: np.dtype, seed: int,
                  into: Mapping[str, np.ndarray] | None = None) -> None:
    """Give every adapter parameter its first value, in place in ``into`` (the params arena's views)
    where it has one."""
    for param in adapter_params(model):
        name = param.sym_name.data
        value = initial_value(param, seed, dtype)
        target = (into or {}).get(name)
        if target is not None and target.shape == value.shape:
            np.copyto(target, value, casting="unsafe")
            value = target
        weights[name] = value


def adapter_names(model: ModelOp) -> Sequence[str]:
    return [p.sym_name.data for p in adapter_params(model)]


# ----------------------------------------------------------------------------- PEFT's files


def stacked(param: ParamOp) -> bool:
    """Whether an adapter parameter is per layer of a stack (its module's name holds ``{layer}``)."""
    return "{layer}" in str(adapter_info(param)["module"])


def peft_names(param: ParamOp) -> list[str]:
    """PEFT's tensor names of an adapter parameter, one per layer of a stacked one."""
    info = adapter_info(param)
    name = PEFT_PREFIX + str(info["module"]) + f".lora_{info['role']}.weight"
    if not stacked(param):
        return [name]
    return [name.format(layer=layer) for layer in range(param.param_type.shape[0].evaluate({}))]


def per_name(param: ParamOp, value: np.ndarray) -> list[tuple[str, np.ndarray]]:
    """(PEFT's name, the value's part of it): a stacked parameter's layers, or the whole value."""
    names = peft_names(param)
    return list(zip(names, value)) if stacked(param) else [(names[0], value)]


def peft_tensors(model: ModelOp, weights: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The adapters as PEFT's ``adapter_model.safetensors`` holds them, in fp32."""
    return {name: np.ascontiguousarray(part, dtype=np.float32)
            for param in adapter_params(model) for name, part in per_name(param, weights[param.sym_name.data])}


def peft_config(model: ModelOp, base: str | None = None) -> dict[str, Any]:
    """PEFT's ``adapter_config.json`` of the model's adapters: the most common rank and alpha as
    ``r`` and ``lora_alpha``, the modules with others in ``rank_pattern`` and ``alpha_pattern``."""
    infos = [adapter_info(p) for p in adapter_params(model)]
    info = infos[0]
    modules = sorted({str(i["module"]).rsplit(".", 1)[-1] for i in infos})
    options = {str(i["module"]): (int(i["rank"]), float(i["alpha"])) for i in infos}
    counts = Counter(options.values())
    rank, alpha = max(counts, key=lambda k: (counts[k], k))
    rslora = not math.isclose(float(info["scaling"]), float(info["alpha"]) / int(info["rank"]))
    rank_pattern, alpha_pattern = {}, {}
    for module, (r, a) in options.items():
        key = _pattern_key(module, options)
        if r != rank:
            rank_pattern[key] = r
        if a != alpha:
            alpha_pattern[key] = a
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base, "r": rank,
            "lora_alpha": alpha, "target_modules": modules, "lora_dropout": float(info.get("dropout", 0.0)),
            "use_rslora": rslora, "bias": "none", "fan_in_fan_out": False, "inference_mode": True,
            "init_lora_weights": True, "modules_to_save": None, "rank_pattern": rank_pattern,
            "alpha_pattern": alpha_pattern}


def _pattern_key(module: str, options: Mapping[str, tuple[int, float]]) -> str:
    """The ``rank_pattern`` key of a module: its short name where every module of that name has its
    options, else its whole name (a stack's layers as ``\\d+``)."""
    short = module.rsplit(".", 1)[-1]
    if len({v for m, v in options.items() if m.rsplit(".", 1)[-1] == short}) == 1:
        return short
    return re.escape(module).replace(re.escape("{layer}"), r"\d+")


def write_adapter(folder: Path, model: ModelOp, weights: Mapping[str, np.ndarray], base: str | None = None) -> None:
    """``adapter_config.json`` and ``adapter_model.safetensors`` into ``folder`` (PEFT's layout)."""
    if not adapter_params(model):
        raise _error("the model has no adapters to save", "load it with lora=... or adapter=DIR")
    (folder / CONFIG_FILE).write_text(json.dumps(peft_config(model, base), indent=2) + "\n", encoding="utf-8")
    write_safetensors(folder / TENSORS_FILE, peft_tensors(model, weights))


def read_adapter(directory: str | Path) -> tuple[LoraOptions, SafetensorsFile]:
    """The LoRA options and the tensors file of a PEFT adapter folder (E028/E030 for what is wrong)."""
    folder = Path(directory)
    where = folder / CONFIG_FILE
    regular_file(where, "the adapter config")
    try:
        config = json.loads(where.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise CheckpointError("E030", f"{where}: not readable JSON ({err})") from None
    if not isinstance(config, dict) or config.get("peft_type", "LORA") != "LORA":
        raise CheckpointError("E030", f"{where}: not a LoRA adapter (peft_type {config.get('peft_type')!r})"
                              if isinstance(config, dict) else f"{where}: not a JSON object",
                              "give the folder of a PEFT LoRA adapter")
    for key, default in UNSUPPORTED.items():
        if config.get(key, default) not in (default, None, [], {}):
            raise CheckpointError("E030", f"{where}: '{key}' is {config[key]!r}; this runtime computes plain LoRA "
                                  f"adapters only", f"an adapter trained with {key}={default!r} loads", field=key)
    targets = config.get("target_modules")
    if isinstance(targets, str):
        targets = [targets]
    if isinstance(targets, list):  # PEFT may write the modules' full names (model.layers.1.mlp.up_proj)
        targets = sorted({t.rsplit(".", 1)[-1] if isinstance(t, str) else t for t in targets})
    try:
        options = LoraOptions.of({"r": config.get("r", 8), "lora_alpha": config.get("lora_alpha", 8),
                                  "target_modules": targets or [], "use_rslora": bool(config.get("use_rslora")),
                                  "rank_pattern": config.get("rank_pattern") or {},
                                  "alpha_pattern": config.get("alpha_pattern") or {}})
    except DiagnosticError as err:
        raise CheckpointError("E030", f"{where}: {err.diagnostics[0].message}", err.diagnostics[0].hint) from None
    tensors_path = folder / TENSORS_FILE
    regular_file(tensors_path, "the adapter weights")
    return options, SafetensorsFile(tensors_path)


def fill_adapters(model: ModelOp, weights: dict[str, np.ndarray], tensors: SafetensorsFile) -> None:
    """The adapters' values from PEFT's tensors (PEFT's names, with or without ``.default``)."""
    available = {name.replace(".default.weight", ".weight"): name for name in tensors.keys()}
    used = set()
    for param in adapter_params(model):
        for name, into in per_name(param, weights[param.sym_name.data]):
            if name not in available:
                raise CheckpointError("E031", f"adapter tensor '{name}' is missing", "the adapter was trained "
                                      "for another model or other target_modules", tensor=name)
            shape = tensors.shape(available[name])
            if tuple(shape) != into.shape:
                raise CheckpointError("E032", f"adapter tensor '{name}' has shape {list(shape)}, the model's "
                                      f"adapter {list(into.shape)}", "the adapter was trained for another base "
                                      "model (sizes) or another rank", tensor=name)
            np.copyto(into, tensors.array(available[name]), casting="unsafe")
            used.add(available[name])
    unused = sorted(set(tensors.keys()) - used)
    if unused:
        raise CheckpointError("E040", f"adapter tensor '{unused[0]}' belongs to no adapter of the model",
                              "the adapter targets modules this model does not have, or was trained for "
                              "another architecture", tensor=unused[0])


def quantize_base(model: ModelOp, base_dtype: str | None) -> list[str]:
    """Store the frozen base of a configured model narrower (``mdsl-quantize-frozen``): ``base_dtype``
    ``"bf16"`` or ``"fp8"`` (fp8 e4m3 with an fp32 scale per output channel); None leaves it as it
    is. The names of the weights stored; E029 for another ``base_dtype``, or for a model with no
    frozen linear weight to store (load it with ``lora=`` or ``adapter=``)."""
    if base_dtype is None:
        return []
    stored = quantize_frozen(model, stored_dtype(base_dtype))
    if not stored:
        raise _error(f"base_dtype={base_dtype!r}: the model has no frozen linear weight to store narrower",
                     "the base is frozen by LoRA: load with lora=... or adapter=DIR (or freeze weights with @frozen)")
    return stored


def stored_dtype(base_dtype: object) -> str:
    """The dtype ``mdsl-quantize-frozen`` stores a ``base_dtype`` in (``fp8`` -> ``fp8_e4m3``); E029
    naming the choices for any other value."""
    if not isinstance(base_dtype, str) or base_dtype not in BASE_DTYPES:
        raise _error(f"base_dtype={base_dtype!r} is not one of {', '.join(repr(k) for k in BASE_DTYPES)}",
                     "store the frozen base in bf16, or in fp8 (e4m3, a scale per output channel); leave "
                     "base_dtype out to store it as the trained weights are")
    return BASE_DTYPES[base_dtype]


def dequantized(model: ModelOp, weights: Mapping[str, np.ndarray], name: str) -> np.ndarray:
    """The value of weight ``name`` in float32: a stored one widened (``q * scale`` per output
    channel for fp8, :func:`modeldsl.kernels.reference.dequantize`), any other as it is held."""
    param = next((p for p in model.params() if p.sym_name.data == name), None)
    info = param.quantized if param is not None else None
    if info is None or info["role"] != "data":
        return np.asarray(weights[name], dtype=np.float32)
    if "scale" not in info:
        return np.asarray(weights[name], dtype=np.float32)
    return dequantize(np.asarray(weights[name]), np.asarray(weights[info["scale"]]))


def merged_weights(model: ModelOp, weights: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The adapted weights with their adapters folded in (``W[rows] += scaling * B @ A`` per part),
    and every weight stored narrower (``base_dtype``) widened to float32: a save writes what the model
    computes with, so a merged save of an fp8 base holds its dequantized values (``q * scale``), not the
    checkpoint's it was quantized from."""
    merged: dict[str, np.ndarray] = {}
    stored = {p.sym_name.data for p in model.params() if p.quantized is not None and p.quantized["role"] == "data"}
    parts = {(w.param, p.module): p for w in mapped_weights(model) + unmapped_weights(model) for p in w.parts}
    for param in adapter_params(model):
        name, info = param.sym_name.data, adapter_info(param)
        if info["role"] != "A":
            continue
        base = str(info["weight"])
        part = parts[(base, str(info["module"]))]
        a, b = (np.asarray(weights[name.removesuffix("A") + r], dtype=np.float64) for r in "AB")
        value = merged.setdefault(base, np.array(dequantized(model, weights, base), dtype=np.float64))
        start, end = part.start.evaluate({}), part.end.evaluate({})
        value[..., start:end, :] += float(adapter_info(param)["scaling"]) * (b @ a)
    widened = {k: v.astype(np.float32 if k in stored else np.asarray(weights[k]).dtype) for k, v in merged.items()}
    return {**{name: dequantized(model, weights, name) for name in stored}, **widened}
