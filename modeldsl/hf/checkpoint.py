"""Loading and saving model parameters as HuggingFace safetensors, through ``hf_mapping``.

Each ``hf_mapping`` entry is a rule from a DSL parameter to checkpoint
tensors. Its key names the parameter (``final_norm.weight``), possibly per
layer of a stack (``blocks[{layer}].ln1.weight``, filled into the stacked
parameter's row ``layer``) and possibly optional (``lm_head?``). Its value is

- ``"hf.name.{layer}"``: one tensor;
- ``fuse("a", "b", ..., dim=0)``: tensors concatenated along ``dim``;
- ``transform(fn, "name")`` / ``transform("name", fn=...)``: one tensor through
  ``transpose``, ``negate_exp`` (``-exp(x)``) or ``permute_qkv`` (undo HF's
  rotary permutation of interleaved q/k rows);
- ``stack_experts("...{expert}...", n=...)``: one tensor per expert, stacked;
- ``tied_to(other)``: nothing to load (the parameter is shared).

Arrays are filled from memory-mapped files, one stacked buffer per parameter,
so peak memory stays near one copy of the weights. What was read (names,
dtypes, part sizes) is kept in an :class:`ImportRecord`, from which
:func:`save_checkpoint` writes the same tensors back (bitwise, in their
original dtypes). Every problem is a :class:`CheckpointError` naming the
tensor and the rule.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm
from xdsl.dialects.builtin import ArrayAttr, DictionaryAttr, IntegerAttr, StringAttr
from xdsl.ir import Attribute

from modeldsl.dialects.graph import ModelOp, ParamOp
from modeldsl.dialects.graph_types import TensorType
from modeldsl.hf.config import export_config
from modeldsl.hf.safetensors_io import CheckpointError, SafetensorsFile, write_safetensors
from modeldsl.symbolic import Expr, SymbolicError

KEY = re.compile(r"^(?P<stack>[A-Za-z_]\w*)\[\{(?P<var>\w+)\}\]\.(?P<rest>.+)$")
COPIED_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                "special_tokens_map.json", "tokenizer.model", "vocab.json", "merges.txt")


@dataclass
class Rule:
    """One ``hf_mapping`` entry."""

    key: str
    target: str
    var: str | None
    optional: bool
    source: Attribute

    @property
    def op(self) -> str:
        if isinstance(self.source, StringAttr):
            return "direct"
        return self.source.data["op"].data if isinstance(self.source, DictionaryAttr) else "?"

    def arg(self, name: str, default: Any = None) -> Any:
        value = self.source.data.get(name) if isinstance(self.source, DictionaryAttr) else None
        return _python(value) if value is not None else default

    def names(self) -> list[str]:
        """The checkpoint name templates the rule reads."""
        if self.op == "direct":
            return [self.source.data]
        return [a for a in self.arg("args", []) if isinstance(a, str) and a not in TRANSFORMS]


@dataclass
class TensorRecord:
    name: str
    dtype: np.dtype
    shape: tuple[int, ...]


@dataclass
class ImportRecord:
    """What a load read, so that a save writes the checkpoint back unchanged."""

    source: Path | None = None
    reads: dict[tuple[str, int | None], list[TensorRecord]] = field(default_factory=dict)


def parse_rules(model: ModelOp) -> list[Rule]:
    if model.hf_mapping is None:
        raise CheckpointError("E010", f"@{model.sym_name.data} has no hf_mapping section",
                              "write hf_mapping: to map checkpoint tensors to parameters")
    rules = []
    for key, source in model.hf_mapping.data.items():
        optional = key.endswith("?")
        key = key.rstrip("?")
        match = KEY.match(key)
        if match:
            rules.append(Rule(key, f"{match['stack']}.{match['rest']}", match["var"], optional, source))
        else:
            rules.append(Rule(key, key, None, optional, source))
    return rules


class Checkpoint:
    """The tensors of a checkpoint folder, by name, across its safetensors files."""

    def __init__(self, directory: Path):
        self.directory = directory
        paths = sorted(directory.glob("*.safetensors"))
        if not paths:
            raise CheckpointError("E031", f"'{directory}' has no *.safetensors files",
                                  "only safetensors checkpoints load (pickled .bin files never do)")
        self.files = [SafetensorsFile(p) for p in paths]
        self.where: dict[str, SafetensorsFile] = {}
        for f in self.files:
            for name in f.keys():
                self.where[name] = f
        self.used: set[str] = set()

    def __contains__(self, name: str) -> bool:
        return name in self.where

    def get(self, name: str, rule: Rule) -> np.ndarray:
        if name not in self.where:
            raise CheckpointError("E031", f"checkpoint tensor '{name}' is missing (hf_mapping: {rule.key})",
                                  _close(name, list(self.where)), tensor=name)
        self.used.add(name)
        return self.where[name].array(name)

    def unused(self) -> list[str]:
        return [n for n in self.where if n not in self.used]


def config_integers(model: ModelOp) -> dict[str, int]:
    """The model's integer config values, for sizes written as expressions (``n``, ranges)."""
    return {k: v.value.data for k, v in model.config_values.items()
            if isinstance(v, IntegerAttr) and v.type.width.data != 1}


def load_checkpoint(model: ModelOp, directory: str | Path, dtype: np.dtype,
                    warn: Callable[[CheckpointError], None] | None = None,
                    progress: bool = False) -> tuple[dict[str, np.ndarray], ImportRecord]:
    """Every parameter of a (specialized) model filled from the checkpoint
    (with a tqdm bar over the rules when ``progress``)."""
    directory = Path(directory)
    checkpoint = Checkpoint(directory)
    params = {p.sym_name.data: p for p in model.walk() if isinstance(p, ParamOp)}
    record = ImportRecord(directory)
    config = config_integers(model)
    weights: dict[str, np.ndarray] = {}
    for rule in tqdm(parse_rules(model), desc="loading weights", unit="rule", disable=not progress):
        param = params.get(rule.target)
        if param is None or rule.op == "tied_to":
            continue
        shape = _concrete_shape(param.param_type, rule)
        if rule.var is None:
            value = _read(rule, None, checkpoint, record, shape, dtype, config)
            if value is not None:
                weights[rule.target] = value
            continue
        stacked = np.empty(shape, dtype)
        for layer in range(shape[0]):
            value = _read(rule, layer, checkpoint, record, shape[1:], dtype, config)
            if value is None:
                break
            stacked[layer] = value
        else:
            weights[rule.target] = stacked
    missing = [p for p in params if p not in weights]
    if missing:
        raise CheckpointError("E031", f"no hf_mapping rule loads the parameter '{missing[0]}'",
                              "add a rule for it to hf_mapping", tensor=missing[0])
    if warn is not None:
        for name in checkpoint.unused():
            warn(CheckpointError("W006", f"checkpoint tensor '{name}' is not used by any hf_mapping rule",
                                 "it is ignored; map it if the model needs it", tensor=name))
    return weights, record


def _read(rule: Rule, layer: int | None, checkpoint: Checkpoint, record: ImportRecord,
          shape: tuple[int, ...], dtype: np.dtype, config: dict[str, int]) -> np.ndarray | None:
    names = [_fill(n, rule.var, layer) for n in rule.names()]
    if rule.op == "stack_experts":
        count = _size(rule.arg("n", rule.arg("num_experts")), config, rule)
        names = [n.replace("{expert}", str(e)) for n in names for e in range(count)]
    if rule.optional and not all(n in checkpoint for n in names):
        return None
    parts = [checkpoint.get(n, rule) for n in names]
    for name, part in zip(names, parts):
        if not _is_float(part.dtype):
            raise CheckpointError("E033", f"checkpoint tensor '{name}' is {part.dtype}, but {rule.key} is a float "
                                  "parameter", tensor=name)
    record.reads[(rule.target, layer)] = [TensorRecord(n, p.dtype, tuple(p.shape)) for n, p in zip(names, parts)]
    value = _combine(rule, parts, names)
    if tuple(value.shape) != shape:
        what = names[0] if len(names) == 1 else " + ".join(names)
        raise CheckpointError("E032", f"checkpoint tensor '{what}' has shape {tuple(value.shape)} but "
                              f"{rule.key} needs {shape}", "the config.json and the weights disagree, or the "
                              "mapping's fuse/transform is wrong", tensor=names[0])
    return value.astype(dtype, copy=False)


def _combine(rule: Rule, parts: list[np.ndarray], names: list[str]) -> np.ndarray:
    if rule.op == "direct":
        return parts[0]
    if rule.op == "fuse":
        dim = rule.arg("dim", 0)
        try:
            return np.concatenate(parts, axis=dim)
        except ValueError:
            shapes = ", ".join(f"{n} {tuple(p.shape)}" for n, p in zip(names, parts))
            raise CheckpointError("E032", f"fuse(dim={dim}) of {rule.key}: shapes do not fit: {shapes}",
                                  tensor=names[0]) from None
    if rule.op == "transform":
        fn = _transform_name(rule)
        return TRANSFORMS[fn][0](parts[0], rule)
    if rule.op == "stack_experts":
        return np.stack(parts)
    raise CheckpointError("E010", f"hf_mapping {rule.key}: unknown rule '{rule.op}'",
                          "rules are a tensor name, fuse, transform, stack_experts or tied_to")


def _size(value: Any, config: dict[str, int], rule: Rule) -> int:
    """An int, or an expression of config values such as ``num_heads * head_dim``."""
    if isinstance(value, int):
        return value
    try:
        return Expr.parse(str(value)).evaluate(config)
    except (SymbolicError, ValueError) as err:
        raise CheckpointError("E010", f"hf rule {rule.key}: cannot evaluate '{value}': {err}",
                              "sizes are integers or expressions of the model's integer config values") from None


def _transform_name(rule: Rule) -> str:
    fn = rule.arg("fn") or next((a for a in rule.arg("args", []) if a in TRANSFORMS), None)
    if fn not in TRANSFORMS:
        raise CheckpointError("E010", f"hf_mapping {rule.key}: unknown transform '{fn}'",
                              f"transforms: {', '.join(TRANSFORMS)}")
    return fn


def _permute_qkv(x: np.ndarray, rule: Rule, inverse: bool = False) -> np.ndarray:
    """HF stores q/k rows of each head as [first halves; second halves]; Meta interleaves them."""
    head_dim = rule.arg("head_dim")
    if not isinstance(head_dim, int):
        raise CheckpointError("E010", f"hf_mapping {rule.key}: permute_qkv needs head_dim=<int>")
    heads = x.shape[0] // head_dim
    if inverse:
        return x.reshape(heads, 2, head_dim // 2, *x.shape[1:]).swapaxes(1, 2).reshape(x.shape)
    return x.reshape(heads, head_dim // 2, 2, *x.shape[1:]).swapaxes(1, 2).reshape(x.shape)


TRANSFORMS: dict[str, tuple[Callable, Callable]] = {
    "transpose": (lambda x, r: x.T, lambda x, r: x.T),
    "negate_exp": (lambda x, r: -np.exp(x.astype(np.float32)), lambda x, r: np.log(-x.astype(np.float32))),
    "permute_qkv": (_permute_qkv, lambda x, r: _permute_qkv(x, r, inverse=True)),
}


def save_checkpoint(model: ModelOp, weights: dict[str, np.ndarray], record: ImportRecord,
                    directory: str | Path, dtype: np.dtype | None = None) -> None:
    """Write the parameters as HF tensors (original names, dtypes and part sizes)."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, np.ndarray] = {}
    exports = _export_rules(model)
    config = config_integers(model)
    for rule in parse_rules(model):
        if rule.target not in weights or rule.op == "tied_to":
            continue
        value = weights[rule.target]
        layers = range(value.shape[0]) if rule.var is not None else [None]
        for layer in layers:
            reads = record.reads.get((rule.target, layer))
            part = value[layer] if layer is not None else value
            if reads is None and record.source is not None:
                continue  # an optional tensor the checkpoint did not have
            if reads is None:
                reads = _planned_reads(rule, exports.get(rule.key), layer, part, config)
            for read, piece in zip(reads, _uncombine(rule, part, reads)):
                tensors[read.name] = piece.astype(dtype or read.dtype)
    tmp = out / "model.safetensors.tmp"
    write_safetensors(tmp, tensors, {"format": "pt"})
    tmp.replace(out / "model.safetensors")
    if record.source is None:
        (out / "config.json").write_text(json.dumps(export_config(model), indent=2) + "\n")
    else:
        for name in COPIED_FILES:
            if (record.source / name).is_file() and record.source.resolve() != out.resolve():
                shutil.copyfile(record.source / name, out / name)


def _export_rules(model: ModelOp) -> dict[str, dict[str, Any]]:
    """``hf_export`` entries by the key of the rule they invert."""
    if model.hf_export is None:
        return {}
    return {key.rstrip("?"): _python(value) for key, value in model.hf_export.data.items()}


def _planned_reads(rule: Rule, export: dict[str, Any] | None, layer: int | None, value: np.ndarray,
                   config: dict[str, int]) -> list[TensorRecord]:
    """The checkpoint tensors of a parameter that was not imported: its names, and for
    a fused one the part sizes that ``hf_export``'s split ranges give."""
    names = [_fill(n, rule.var, layer) for n in rule.names()]
    if rule.op == "stack_experts":
        return [TensorRecord(names[0].replace("{expert}", str(e)), value.dtype, value.shape[1:])
                for e in range(value.shape[0])]
    if rule.op != "fuse":
        return [TensorRecord(names[0], value.dtype, value.shape)]
    if export is None or export.get("op") != "split":
        raise CheckpointError("E010", f"hf_export has no split for the fused {rule.key}",
                              "add `" + rule.key + " -> split(\"name\": [start, end], ..., dim=0)` to hf_export")
    dim = export.get("dim", 0)
    records = []
    for template, (start, end) in export["parts"].items():
        shape = list(value.shape)
        shape[dim] = _size(end, config, rule) - _size(start, config, rule)
        records.append(TensorRecord(_fill(template, rule.var, layer), value.dtype, tuple(shape)))
    return records


def _uncombine(rule: Rule, value: np.ndarray, reads: list[TensorRecord]) -> Iterator[np.ndarray]:
    if rule.op in ("direct",):
        yield value
    elif rule.op == "fuse":
        dim = rule.arg("dim", 0)
        bounds = np.cumsum([r.shape[dim] for r in reads])[:-1]
        yield from np.split(value, bounds, axis=dim)
    elif rule.op == "transform":
        yield TRANSFORMS[_transform_name(rule)][1](value, rule)
    elif rule.op == "stack_experts":
        yield from value


def _is_float(dtype: np.dtype) -> bool:
    return dtype.kind == "f" or dtype.name.startswith(("bfloat16", "float8"))


def _fill(template: str, var: str | None, layer: int | None) -> str:
    return template if var is None else template.replace("{" + var + "}", str(layer))


def _concrete_shape(ptype: TensorType, rule: Rule) -> tuple[int, ...]:
    dims = [d.const_value() for d in ptype.shape]
    if any(d is None for d in dims):
        raise CheckpointError("E029", f"the shape of {rule.target} ({ptype}) is not concrete",
                              "specialize the model (mdsl-specialize) before loading weights")
    return tuple(dims)


def _python(attr: Attribute) -> Any:
    if isinstance(attr, StringAttr):
        return attr.data
    if isinstance(attr, IntegerAttr):
        return attr.value.data
    if isinstance(attr, ArrayAttr):
        return [_python(a) for a in attr.data]
    if isinstance(attr, DictionaryAttr):
        return {k: _python(v) for k, v in attr.data.items()}
    return getattr(attr, "data", attr)


def _close(name: str, names: list[str]) -> str:
    import difflib

    close = difflib.get_close_matches(name, names, n=1)
    return f"did you mean '{close[0]}'?" if close else "check the checkpoint's tensor names against hf_mapping"
