"""Loading and saving model parameters as HuggingFace safetensors, through ``hf_mapping``.

Each ``hf_mapping`` entry is a rule from a DSL parameter to checkpoint
tensors. Its key names the parameter (``final_norm.weight``), possibly per
layer of a stack (``blocks[{layer}].ln1.weight``, filled into the stacked
parameter's row ``layer``), possibly several numbered ones (a ``{name}`` inside
a parameter name, ``"groups[{layer}].local_{k}.mlp.down_weight"``: one rule per
parameter it matches, ``k`` bound to its number for the tensor names) and
possibly optional (``lm_head?``). Its value is

- ``"hf.name.{layer}"``: one tensor (a placeholder may be an expression of the
  layer and the model's integer config values, ``"model.layers.{2 * layer + 1}"``
  or ``"model.layers.{layer + first_window_layer}"``, for a stack that holds
  every other layer, or the layers after another stack's);
- ``fuse("a", "b", ..., dim=0)``: tensors concatenated along ``dim``;
- ``split("hf.name": [start, end], ..., dim=0)``: the slice ``[start, end)``
  along ``dim`` of a checkpoint tensor (several parts are concatenated in
  order), so that one fused checkpoint tensor (Phi-3's ``qkv_proj``) fills
  several DSL parameters, one rule each; ``start``/``end`` are integers or
  expressions of the model's integer config values. This is the inverse of
  ``hf_export``'s ``split``, whose ranges index the DSL parameter instead;
- ``transform(fn, "name")`` / ``transform("name", fn=...)``: one tensor through
  ``transpose``, ``negate_exp`` (``-exp(x)``) or ``permute_qkv`` (undo the
  permutation of q/k rows that HF's ``convert_llama_weights_to_hf`` applies,
  from Meta's interleaved RoPE layout to the half-split one, for a model whose
  ``rope`` is ``interleaved``; ``head_dim=`` is an integer or a config
  expression);
- ``stack_experts("...{expert}...", n=...)``: one tensor per expert, stacked
  (``{layer}`` may appear too);
- ``tied_to(other)``: nothing to load (the parameter is shared).

A frozen weight that ``mdsl-quantize-frozen`` stores narrower (its ``quantized``
dictionary) is read a layer at a time in float32 and stored in bf16 (rounded to
nearest even) or in fp8 with its scales (:func:`modeldsl.kernels.reference.quantize`,
filling its scale parameter too); a save writes the values it then holds
(:func:`modeldsl.runtime.lora.merged_weights` dequantizes them).

Each parameter (a stacked one whole) is filled in place, so peak memory stays
near one copy of the weights: given the arrays to fill (``into``: the views of
the schedule's params arena), a tensor that a rule places whole (a tensor, a
``fuse`` along dim 0, one expert of a ``stack_experts``) is read from its file
straight into its rows there, converted in bounded chunks (or backed by the
file's pages, untouched until used); the other rules (``split``, a ``fuse``
along another dim, the transforms) read their tensors' rows a bounded chunk at
a time into one buffer and place each chunk before reading the next. No tensor
is ever read through the memory map, whose pages would stay in the process's
memory beside the copy. What was read (names,
dtypes, part sizes, and the memory-mapped tensors themselves, which cost no
memory) is kept in an :class:`ImportRecord`, from which
:func:`save_checkpoint` writes the same tensors back. A parameter that still
equals what was loaded is written as the original bytes, so an import and an
export are bitwise identical even through a lossy transform (``negate_exp``)
or a narrower load dtype; a changed one goes through the inverse of its rule.
A multimodal wrapper's checkpoint holds the text model's tensors under a
prefix, which the model's ``hf_config`` ``tensor_prefix`` gives per
architecture (``Gemma3ForConditionalGeneration: "language_model."``): the rules
read and write the names without it. The tensors ``ignore_tensors`` names (the
wrapper's vision tower) are not read, and a save writes them back as they were.
Every problem is a :class:`CheckpointError` naming the tensor and the rule.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm
from xdsl.dialects.builtin import DictionaryAttr, IntegerAttr, StringAttr
from xdsl.ir import Attribute

from modeldsl.diagnostics import Diagnostic
from modeldsl.dialects.dtypes import DType
from modeldsl.dialects.graph import ModelOp, ParamOp
from modeldsl.dialects.graph_types import TensorType
from modeldsl.hf.compat import python_value, warn_python
from modeldsl.hf.config import export_config
from modeldsl.hf.safetensors_io import READ_CHUNK, CheckpointError, Mapper, SafetensorsFile, write_safetensors
from modeldsl.kernels.reference import quantize
from modeldsl.runtime.executor import NUMPY_DTYPES
from modeldsl.runtime.threads import usable_cores
from modeldsl.symbolic import Expr, SymbolicError

KEY = re.compile(r"^(?P<stack>[A-Za-z_]\w*)\[\{(?P<var>\w+)\}\]\.(?P<rest>.+)$")
COPIED_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                "special_tokens_map.json", "tokenizer.model", "vocab.json", "merges.txt", "added_tokens.json",
                "chat_template.json", "chat_template.jinja",  # the chat template, where not in tokenizer_config
                "preprocessor_config.json", "processor_config.json")  # a multimodal wrapper's image processor
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                   "vocab.json", "merges.txt", "added_tokens.json", "chat_template.json", "chat_template.jinja")
RULES = "rules are a tensor name, fuse, split, transform, stack_experts or tied_to"
ROW_RULES = ("direct", "fuse", "stack_experts")  # rules that may place whole tensors one after another
ROW_CHUNK = READ_CHUNK  # bytes of a tensor's rows read at a time where a rule slices, transposes or permutes them


@dataclass
class Rule:
    """One ``hf_mapping`` entry."""

    key: str
    target: str
    var: str | None
    optional: bool
    source: Attribute
    bindings: tuple[tuple[str, int], ...] = ()  # the names a key pattern (``local_{k}``) bound for this target

    @property
    def op(self) -> str:
        if isinstance(self.source, StringAttr):
            return "direct"
        return self.source.data["op"].data if isinstance(self.source, DictionaryAttr) else "?"

    @property
    def written(self) -> str:
        """The key as written in hf_mapping (with its ``?``), and the names its pattern bound."""
        bound = ", ".join(f"{name} = {value}" for name, value in self.bindings)
        return self.key + ("?" if self.optional else "") + (f" ({bound})" if bound else "")

    def arg(self, name: str, default: Any = None) -> Any:
        value = self.source.data.get(name) if isinstance(self.source, DictionaryAttr) else None
        return python_value(value) if value is not None else default

    def names(self) -> list[str]:
        """The checkpoint name templates the rule reads."""
        if self.op == "direct":
            return [self.source.data]
        if self.op == "split":
            return list(self.arg("parts", {}))
        return [a for a in self.arg("args", []) if isinstance(a, str) and a not in TRANSFORMS]


@dataclass
class TensorRecord:
    name: str
    dtype: np.dtype
    shape: tuple[int, ...]


@dataclass
class ImportRecord:
    """What a load read, so that a save writes the checkpoint back unchanged: per
    (parameter, layer), the tensors read and (``arrays``) the memory-mapped
    tensors themselves, to write their original bytes while the parameter is
    unchanged."""

    source: Path | None = None
    reads: dict[tuple[str, int | None], list[TensorRecord]] = field(default_factory=dict)
    arrays: dict[tuple[str, int | None], list[np.ndarray]] = field(default_factory=dict)
    prefix: str = ""  # the wrapper's prefix of the mapped tensors' names (tensor_prefix)


def parse_rules(model: ModelOp) -> list[Rule]:
    if model.hf_mapping is None:
        raise CheckpointError("E010", f"@{model.sym_name.data} has no hf_mapping section",
                              "write hf_mapping: to map checkpoint tensors to parameters")
    rules = []
    params = [op.sym_name.data for op in model.body.block.ops if isinstance(op, ParamOp)]
    for key, source in model.hf_mapping.data.items():
        optional = key.endswith("?")
        key = key.rstrip("?")
        match = KEY.match(key)
        if match:
            rule = Rule(key, f"{match['stack']}.{match['rest']}", match["var"], optional, source)
        else:
            rule = Rule(key, key, None, optional, source)
        rules += _expanded(rule, params)
    return rules


def _expanded(rule: Rule, params: list[str]) -> list[Rule]:
    """The rule once per parameter its key names: a key whose path holds ``{name}`` inside a
    parameter name (``"groups[{layer}].local_{k}.mlp.down_weight"``) is a pattern that binds
    ``name`` to the integer of each parameter it matches (``groups.local_0...``, ``local_1``, ...),
    which the tensor names' placeholders then take (``{6 * layer + k}``); E010 where it matches none."""
    if not PLACEHOLDER.search(rule.target):
        return [rule]
    parts = re.split(r"(\{\w+\})", rule.target)
    pattern = re.compile("".join(f"(?P<{part[1:-1]}>\\d+)" if part.startswith("{") else re.escape(part)
                                 for part in parts))
    found = sorted({tuple((name, int(value)) for name, value in m.groupdict().items())
                    for m in map(pattern.fullmatch, params) if m is not None}, key=lambda bound: [v for _, v in bound])
    if not found and not rule.optional:
        raise CheckpointError("E010", f"hf_mapping {rule.written}: the pattern matches no parameter of the model",
                              "a {name} in a key stands for the integer in parameter names such as local_0, "
                              "local_1; check the path against the model's parameters")
    return [replace(rule, target=PLACEHOLDER.sub(lambda m, bound=bound: str(dict(bound)[m.group(1)]), rule.target),
                    bindings=bound) for bound in found]


class Checkpoint:
    """The tensors of a checkpoint folder, by name, across its safetensors files; with a ``prefix``
    (a wrapper's, ``language_model.``), the tensors under it by their names without it."""

    def __init__(self, directory: Path, prefix: str = "", slices: RankSlices | None = None):
        self.directory = directory
        paths = sorted(directory.glob("*.safetensors"))
        if not paths:
            raise CheckpointError("E031", f"'{directory}' has no *.safetensors files",
                                  "only safetensors checkpoints load (pickled .bin files never do)")
        self.files = [SafetensorsFile(p) for p in paths]
        self.where: dict[str, SafetensorsFile] = {}
        self.prefixed: set[str] = set()  # the names read without the prefix
        for f in self.files:
            if prefix:
                self.prefixed |= {n.removeprefix(prefix) for n in f.entries if n.startswith(prefix)}
                f.entries = {n.removeprefix(prefix): e for n, e in f.entries.items()}
            for name in f.keys():
                if name in self.where:
                    raise CheckpointError("E034", f"checkpoint tensor '{name}' is in two files: "
                                          f"{self.where[name].path.name} and {f.path.name}",
                                          "a checkpoint holds each tensor once; remove the stale or duplicated "
                                          "shard (model.safetensors.index.json says which file is meant)",
                                          tensor=name)
                self.where[name] = f
        self.used: set[str] = set()
        self.prefix = prefix
        for name, (dim, index, parts) in (slices or {}).items():
            if name in self.where:
                self.where[name].narrow(name, dim, index, parts)

    def __contains__(self, name: str) -> bool:
        return name in self.where

    def written(self, name: str) -> str:
        """``name`` as the files write it (with the prefix, where it was read without)."""
        return self.prefix + name if name in self.prefixed or name not in self.where else name

    def get(self, name: str, rule: Rule) -> np.ndarray:
        if name not in self.where:
            missing = self.written(name)
            raise CheckpointError("E031", f"checkpoint tensor '{missing}' is missing (hf_mapping: {rule.written})",
                                  _close(missing, [self.written(n) for n in self.where]), tensor=missing)
        self.used.add(name)
        return self.where[name].array(name)

    def unused(self, ignored: list[str] = ()) -> list[str]:
        """Tensors no rule read (as the files name them), except those matching the model's
        ``ignore_tensors`` patterns."""
        return [self.written(n) for n in self.where
                if n not in self.used and not any(fnmatchcase(n, p) for p in ignored)]


RankSlices = dict[str, tuple[int, int, int]]  # tensor -> (dim, this rank's index, the ranks)
TP_RULES = {"column": ("direct", "fuse"), "row": ("direct",)}  # the rules a rank reads a slice through


def rank_slices(model: ModelOp, tp: int, rank: int) -> RankSlices:
    """The checkpoint tensors rank ``rank`` of ``tp`` tensor-parallel ranks reads a slice of: those of
    each parameter declared ``@shard(column)`` (dim 0: the output rows; of each tensor a ``fuse`` packs,
    so q, k and v each give their share) or ``@shard(row)`` (dim 1: the input columns). E048 for
    such a parameter filled through another rule (a split or transform of packed tensors)."""
    if tp == 1:
        return {}
    from modeldsl.dialects.annotations import SHARD_DIMS, shard_strategy

    params = {p.sym_name.data: p for p in model.params()}
    config = config_integers(model)
    slices: RankSlices = {}
    for rule in parse_rules(model):
        param = params.get(rule.target)
        strategy = shard_strategy(param) if param is not None else None
        if strategy not in SHARD_DIMS:
            continue
        if rule.op not in TP_RULES[strategy] or rule.op == "fuse" and _axis(rule, 2, config) != 0:
            raise CheckpointError("E048", f"hf_mapping {rule.written}: a @shard({strategy}) parameter is read by rank "
                                  f"through {', '.join(TP_RULES[strategy])} rules only, not {rule.op}",
                                  "map the parameter from its tensors one by one (fuse along dim 0), or leave tp=1")
        layers = [None] if rule.var is None else range(_concrete_shape(param.param_type, rule)[0])
        for layer in layers:
            for name in _names(rule, layer, config):
                slices[name] = (SHARD_DIMS[strategy], rank, tp)
    return slices


def config_integers(model: ModelOp) -> dict[str, int]:
    """The model's integer config values, for sizes written as expressions (``n``, ranges)."""
    return {k: v.value.data for k, v in model.config_values.items()
            if isinstance(v, IntegerAttr) and v.type.width.data != 1}


def load_checkpoint(model: ModelOp, directory: str | Path, dtype: np.dtype,
                    warn: Callable[[CheckpointError], None] | None = None,
                    progress: bool = False, allow_unused: bool = False,
                    into: dict[str, np.ndarray] | None = None,
                    mapper: Mapper | None = None,
                    slices: RankSlices | None = None) -> tuple[dict[str, np.ndarray], ImportRecord]:
    """Every parameter of a (specialized) model filled from the checkpoint (with a tqdm bar
    over the rules when ``progress``). A tensor no rule reads is E040 (W006 with
    ``allow_unused``); a tensor holding NaN or Inf is W011. Warnings go to ``warn``, else
    to Python's ``warnings``. ``into`` gives the arrays to fill (views of the schedule's
    params arena, in ``dtype``): each tensor is read into its place there (``mapper``, given,
    may back it with the file's pages instead, see :func:`direct_pieces`), no second copy of
    the weights is made, and those arrays are the weights. ``slices`` (:func:`rank_slices`): the
    tensors of which a tensor-parallel rank reads its share only."""
    directory = Path(directory)
    prefix = tensor_prefix(model, directory)
    checkpoint = Checkpoint(directory, prefix, slices)
    params = {p.sym_name.data: p for p in model.walk() if isinstance(p, ParamOp)}
    record = ImportRecord(directory, prefix=prefix)
    config = config_integers(model)
    weights: dict[str, np.ndarray] = {}
    skipped: dict[str, tuple[Rule, str]] = {}  # parameter -> its optional rule and the first absent tensor
    for rule in tqdm(parse_rules(model), desc="loading weights", unit="rule", disable=not progress):
        param = params.get(rule.target)
        if param is None or rule.op == "tied_to":
            continue
        shape = _concrete_shape(param.param_type, rule)
        layers: list[int | None] = [None] if rule.var is None else list(range(shape[0]))
        if rule.optional:
            absent = next((n for layer in layers for n in _names(rule, layer, config) if n not in checkpoint), None)
            if absent is not None:
                skipped[rule.target] = (rule, absent)
                continue
        target = into.get(rule.target) if into is not None else None
        if _converted(param, dtype):
            weights |= _read_stored(rule, param, params, shape, layers, checkpoint, record, config, warn, into)
            continue
        fits = target is not None and target.shape == shape and target.dtype == dtype
        value = target if fits else np.empty(shape, dtype)
        for layer in layers:
            _read(rule, layer, checkpoint, record, shape if layer is None else shape[1:], dtype, config, warn,
                  value if layer is None else value[layer], mapper)
        weights[rule.target] = value
    missing = [p for p in params if p not in weights and not params[p].is_adapter]
    if missing and missing[0] in skipped:
        rule, absent = skipped[missing[0]]
        raise CheckpointError("E031", f"checkpoint tensor '{absent}' is missing (hf_mapping: {rule.written}, an "
                              f"optional entry), but the model needs the parameter '{missing[0]}'",
                              "an optional entry may be absent only where the model, as configured, has no such "
                              "parameter; add the tensor, or fix config.json (an LM head tied to the embedding "
                              "needs tie_word_embeddings: true)", tensor=absent)
    if missing:
        raise CheckpointError("E031", f"no hf_mapping rule loads the parameter '{missing[0]}'",
                              "add a rule for it to hf_mapping", tensor=missing[0])
    _check_unused(checkpoint.unused(ignored_tensors(model)), model, allow_unused, warn)
    return weights, record


def _converted(param: ParamOp, dtype: np.dtype) -> bool:
    """Whether a parameter is stored in another form than the load's ``dtype`` gives it: a weight
    ``mdsl-quantize-frozen`` stores in fp8 (with its scale), or in bf16 in a load of another dtype."""
    info = param.quantized
    return info is not None and info["role"] == "data" and ("scale" in info or NUMPY_DTYPES[DType(info["dtype"])]
                                                            != np.dtype(dtype))


def _read_stored(rule: Rule, param: ParamOp, params: dict[str, ParamOp], shape: tuple[int, ...],
                 layers: list[int | None], checkpoint: Checkpoint, record: ImportRecord, config: dict[str, int],
                 warn: Callable[[CheckpointError], None] | None,
                 into: dict[str, np.ndarray] | None) -> dict[str, np.ndarray]:
    """A weight ``mdsl-quantize-frozen`` stores narrower, from the checkpoint: each layer read in
    float32 into one buffer (so no more than a layer is held wide), then rounded to nearest even
    into bf16, or quantized into fp8 with one fp32 scale per output channel
    (:func:`modeldsl.kernels.reference.quantize`); written into the arrays of ``into`` (the params
    arena) where it has them. The weight's values and (fp8) its scale's, by parameter name."""
    info = param.quantized
    stored = NUMPY_DTYPES[DType(info["dtype"])]
    values = _target(into, rule.target, shape, stored)
    scale = _target(into, info["scale"], shape[:-1], np.dtype(np.float32)) if "scale" in info else None
    buffer = np.empty(shape if layers == [None] else shape[1:], np.float32)
    for layer in layers:
        wide = _read(rule, layer, checkpoint, record, buffer.shape, np.dtype(np.float32), config, warn, buffer)
        where = () if layer is None else (layer,)
        if scale is None:
            np.copyto(values[where], wide, casting="unsafe")
        else:
            q, s = quantize(wide, dtype=stored)
            np.copyto(values[where], q)
            np.copyto(scale[where], s)
    return {rule.target: values} | ({info["scale"]: scale} if scale is not None else {})


def _target(into: dict[str, np.ndarray] | None, name: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """The array of ``into`` to fill for ``name`` where it has one of that shape and dtype, else a new one."""
    target = into.get(name) if into is not None else None
    return target if target is not None and target.shape == tuple(shape) and target.dtype == dtype \
        else np.empty(shape, dtype)


def direct_pieces(model: ModelOp, directory: str | Path, dtype: np.dtype,
                  into: dict[str, np.ndarray], slices: RankSlices | None = None) -> Iterator[tuple[int, int, int]]:
    """(offset in its file, address, bytes) of each checkpoint tensor :func:`load_checkpoint` would
    read into an array of ``into`` as the file stores it (a ``direct``, row-wise ``fuse`` or
    ``stack_experts`` rule, the file's dtype ``dtype``): the bytes a loader may map instead of reading."""
    checkpoint = Checkpoint(Path(directory), tensor_prefix(model, Path(directory)), slices)
    config = config_integers(model)
    for rule in parse_rules(model):
        out = into.get(rule.target)
        if out is None or out.dtype != dtype or rule.op not in ROW_RULES:
            continue
        for layer in [None] if rule.var is None else range(out.shape[0]):
            names = _names(rule, layer, config)
            if not all(n in checkpoint for n in names):
                break
            target = out if layer is None else out[layer]
            if not _rows_in_order(rule, [checkpoint.where[n].array(n) for n in names], target, config):
                continue
            for source, name, rows in _row_slices(rule, names, checkpoint, target):
                if source.dtype(name) == dtype and name not in source.windows:
                    yield source.data_start + source.entries[name][2], rows.ctypes.data, rows.nbytes


def tensor_prefix(model: ModelOp, directory: Path) -> str:
    """The prefix of the mapped tensors' names in the checkpoint: the ``hf_config`` ``tensor_prefix``
    of the architecture its config.json names (a wrapper's: ``Gemma3ForConditionalGeneration:
    "language_model."`` holds the text model under ``language_model.``), else none."""
    section = model.hf_config.data if model.hf_config is not None else {}
    prefixes = python_value(section["tensor_prefix"]) if "tensor_prefix" in section else {}
    if not isinstance(prefixes, dict) or not prefixes:
        return ""
    try:
        architectures = json.loads((directory / "config.json").read_text()).get("architectures") or []
    except (OSError, ValueError, AttributeError):
        return ""
    return next((prefixes[a] for a in architectures if isinstance(a, str) and isinstance(prefixes.get(a), str)), "")


def ignored_tensors(model: ModelOp) -> list[str]:
    """The ``hf_config`` ``ignore_tensors`` patterns: checkpoint tensors the model declares it does
    not need (e.g. ``*.rotary_emb.inv_freq``, a buffer older transformers saved)."""
    section = model.hf_config.data if model.hf_config is not None else {}
    value = python_value(section["ignore_tensors"]) if "ignore_tensors" in section else []
    return [value] if isinstance(value, str) else [v for v in value if isinstance(v, str)]


def _check_unused(unused: list[str], model: ModelOp, allow_unused: bool,
                  warn: Callable[[CheckpointError], None] | None) -> None:
    """E040 naming the tensors no rule reads (a checkpoint of another variant: biases, a router,
    q/k norms the model would silently drop), or W006 for each with ``allow_unused``."""
    if not unused:
        return
    if not allow_unused:
        shown = ", ".join(f"'{n}'" for n in unused[:5]) + (f" and {len(unused) - 5} more" if len(unused) > 5 else "")
        raise CheckpointError("E040", f"{len(unused)} checkpoint tensor{'s' if len(unused) > 1 else ''} "
                              f"{'are' if len(unused) > 1 else 'is'} not used by any hf_mapping rule of "
                              f"@{model.sym_name.data}: {shown}",
                              "the checkpoint has weights the model would drop (another variant of the family?); "
                              "map them, declare them in hf_config's ignore_tensors, or pass "
                              "--allow-unused-tensors (allow_unused_tensors=True) to load anyway",
                              tensor=unused[0])
    for name in unused:
        _warn(warn, CheckpointError("W006", f"checkpoint tensor '{name}' is not used by any hf_mapping rule",
                                    "it is ignored (--allow-unused-tensors); map it if the model needs it",
                                    tensor=name))


def _warn(warn: Callable[[CheckpointError], None] | None, warning: CheckpointError) -> None:
    if warn is not None:
        warn(warning)
    else:
        warn_python(Diagnostic(warning.code, warning.message, None, warning.hint))


def _names(rule: Rule, layer: int | None, config: dict[str, int]) -> list[str]:
    """The checkpoint tensors one layer of a rule reads."""
    names = [_fill(n, rule, layer, config) for n in rule.names()]
    if rule.op == "stack_experts":
        count = _size(rule.arg("n", rule.arg("num_experts")), config, rule)
        names = [n.replace("{expert}", str(e)) for n in names for e in range(count)]
    return names


def _read(rule: Rule, layer: int | None, checkpoint: Checkpoint, record: ImportRecord,
          shape: tuple[int, ...], dtype: np.dtype, config: dict[str, int],
          warn: Callable[[CheckpointError], None] | None = None, out: np.ndarray | None = None,
          mapper: Mapper | None = None) -> np.ndarray:
    """One parameter (or one layer of a stacked one) through its rule, in ``dtype``, written into
    ``out`` (a new array where none is given). Nothing is held twice: a rule that places whole
    tensors one after another (a tensor, a ``fuse`` along dim 0, an expert stack) reads each
    straight into its place; the others read their tensors' rows a bounded chunk at a time and
    place each chunk (sliced, transposed, permuted, converted) before reading the next."""
    names = _names(rule, layer, config)
    parts = [checkpoint.get(n, rule) for n in names]
    for name, part in zip(names, parts):
        if not _is_float(part.dtype):
            raise CheckpointError("E033", f"checkpoint tensor '{name}' is {part.dtype}, but {rule.written} is a float "
                                  "parameter", tensor=name)
    record.reads[(rule.target, layer)] = [TensorRecord(n, p.dtype, tuple(p.shape)) for n, p in zip(names, parts)]
    record.arrays[(rule.target, layer)] = parts
    if out is not None and out.shape == shape and _rows_in_order(rule, parts, out, config):
        _read_rows(rule, names, checkpoint, out, warn, mapper)
        return out
    if any(p.ndim == 0 for p in parts):
        return _read_scalars(rule, parts, names, shape, dtype, config, warn, out)
    found, pieces = _pieces(rule, parts, names, config)
    _check_shape(rule, names, found, shape)
    out = out if out is not None else np.empty(shape, dtype)
    _read_pieces(rule, pieces, checkpoint, out, warn)
    return out


def _read_scalars(rule: Rule, parts: list[np.ndarray], names: list[str], shape: tuple[int, ...], dtype: np.dtype,
                  config: dict[str, int], warn: Callable[[CheckpointError], None] | None,
                  out: np.ndarray | None) -> np.ndarray:
    """A rule over 0-d tensors (which have no rows to read a chunk of), combined whole."""
    value = _combine(rule, parts, names, config)
    _check_shape(rule, names, tuple(value.shape), shape)
    for name, part in zip(names, parts):
        _warn_non_finite(warn, rule, name, non_finite(part))
    if out is None:
        return value.astype(dtype, copy=False)
    np.copyto(out, value, casting="unsafe")
    return out


def _check_shape(rule: Rule, names: list[str], found: tuple[int, ...], shape: tuple[int, ...]) -> None:
    """E032 where the rule gives the checkpoint's tensors another shape than the parameter's."""
    if found != shape:
        what = names[0] if len(names) == 1 else " + ".join(names)
        raise CheckpointError("E032", f"checkpoint tensor '{what}' gives shape {found} but "
                              f"{rule.written} needs {shape}", "the config.json and the weights disagree, or the "
                              "mapping's fuse/split/transform is wrong", tensor=names[0])


def _warn_non_finite(warn: Callable[[CheckpointError], None] | None, rule: Rule, name: str, problem: str) -> None:
    """W011 for a checkpoint tensor whose values read hold NaN or Inf (``problem``; none when empty)."""
    if problem:
        _warn(warn, CheckpointError("W011", f"checkpoint tensor '{name}' holds {problem} (hf_mapping: "
                                    f"{rule.written})", "the logits will be NaN or infinite; the checkpoint is "
                                    "corrupt or was saved after a diverged training step", tensor=name))


def _rows_in_order(rule: Rule, parts: list[np.ndarray], out: np.ndarray, config: dict[str, int]) -> bool:
    """Whether ``parts``, one after another, are ``out``'s elements in order (a ``direct`` rule, a
    ``fuse`` along dim 0 of tensors of ``out``'s other dims, or a ``stack_experts`` of tensors of
    ``out``'s shape after its first dim), and ``out`` is C-contiguous."""
    if not out.flags.c_contiguous or not parts or rule.op not in ROW_RULES:
        return False
    if rule.op == "direct":
        return tuple(parts[0].shape) == out.shape
    if rule.op == "stack_experts":
        return out.ndim >= 1 and len(parts) == out.shape[0] and all(tuple(p.shape) == out.shape[1:] for p in parts)
    if not all(p.ndim == out.ndim >= 1 for p in parts) or _axis(rule, out.ndim, config) != 0:
        return False
    rows = sum(p.shape[0] for p in parts)
    return rows == out.shape[0] and all(tuple(p.shape[1:]) == out.shape[1:] for p in parts)


def _read_rows(rule: Rule, names: list[str], checkpoint: Checkpoint, out: np.ndarray,
               warn: Callable[[CheckpointError], None] | None, mapper: Mapper | None) -> None:
    """Read each tensor from its file into its rows of ``out`` (W011 for NaN or Inf values,
    counted on the file's values as they are read)."""
    for source, name, rows in _row_slices(rule, names, checkpoint, out):
        seen = source.read_into(name, rows, _chunk_non_finite, threads=usable_cores(), mapper=mapper)
        _warn_non_finite(warn, rule, name, _non_finite_text(sum(s[0] for s in seen), sum(s[1] for s in seen)))


def _row_slices(rule: Rule, names: list[str], checkpoint: Checkpoint,
                out: np.ndarray) -> Iterator[tuple[SafetensorsFile, str, np.ndarray]]:
    """Each tensor's file, name and its place in ``out``: the tensors one after another along
    dim 0 (a scalar ``out`` is the one tensor's), or for an expert stack, expert ``e`` in ``out[e]``."""
    if rule.op == "stack_experts":
        for expert, name in enumerate(names):
            yield checkpoint.where[name], name, out[expert]
        return
    row = 0
    for name in names:
        source = checkpoint.where[name]
        rows = source.shape(name)[0] if out.ndim else 1
        yield source, name, out[row:row + rows] if out.ndim else out
        row += rows


# ---------------------------------------------------------------------------- rules read a chunk of rows at a time
Place = Callable[[np.ndarray, np.ndarray, int], None]  # (the parameter, rows of a tensor as stored, their first row)


@dataclass(frozen=True)
class _Piece:
    """Rows ``start..stop`` (along dim 0) of one checkpoint tensor and where they go:
    ``place(out, rows, first)`` writes the rows from row ``start + first`` on into the parameter
    ``out``, converted to its dtype; ``block`` rows are read together (permute_qkv: a head)."""

    name: str
    start: int
    stop: int
    place: Place
    block: int = 1


def _read_pieces(rule: Rule, pieces: list[_Piece], checkpoint: Checkpoint, out: np.ndarray,
                 warn: Callable[[CheckpointError], None] | None) -> None:
    """Read each piece's rows from its file :data:`ROW_CHUNK` bytes at a time into one buffer,
    placing each chunk in ``out`` before the next is read (W011 for NaN or Inf values among
    the rows read, as the file stores them)."""
    counts: dict[str, list[int]] = {}
    for piece in pieces:
        found = counts.setdefault(piece.name, [0, 0])
        for first, rows in checkpoint.where[piece.name].row_chunks(piece.name, piece.start, piece.stop, piece.block,
                                                                   ROW_CHUNK):
            _count_non_finite(rows.reshape(-1), found)
            piece.place(out, rows, first - piece.start)
    for name, (nans, infs) in counts.items():
        _warn_non_finite(warn, rule, name, _non_finite_text(nans, infs))


def _pieces(rule: Rule, parts: list[np.ndarray], names: list[str],
            config: dict[str, int]) -> tuple[tuple[int, ...], list[_Piece]]:
    """The parameter's shape under ``rule`` from the (unread) tensors ``parts`` of at least one
    dim, and where each tensor's rows go in it; the errors of :func:`_combine`, which builds
    the same value whole."""
    if not parts:
        raise CheckpointError("E010", f"hf_mapping {rule.written}: {rule.op}(...) names no checkpoint tensor", RULES)
    shapes = [tuple(p.shape) for p in parts]
    if rule.op == "direct":
        return shapes[0], [_Piece(names[0], 0, shapes[0][0], _rows_at(0))]
    if rule.op == "fuse":
        return _fuse_pieces(rule, names, shapes, config)
    if rule.op == "split":
        return _split_pieces(rule, names, shapes, config)
    if rule.op == "transform":
        shape, place, block = TRANSFORMS[_transform_name(rule)].place(shapes[0], rule, config)
        return shape, [_Piece(names[0], 0, shapes[0][0], place, block)]
    if rule.op == "stack_experts":
        if len(set(shapes)) > 1:
            listed = ", ".join(f"{n} {shape}" for n, shape in zip(names, shapes))
            raise CheckpointError("E032", f"stack_experts of {rule.written}: the experts differ in shape: {listed}",
                                  tensor=names[0])
        return (len(shapes), *shapes[0]), [_Piece(n, 0, shapes[0][0], _rows_at(0, e)) for e, n in enumerate(names)]
    raise CheckpointError("E010", f"hf_mapping {rule.written}: unknown rule '{rule.op}'", RULES)


def _fuse_pieces(rule: Rule, names: list[str], shapes: list[tuple[int, ...]],
                 config: dict[str, int]) -> tuple[tuple[int, ...], list[_Piece]]:
    """The tensors one after another along ``dim``: their rows from an offset (dim 0), or each
    row whole at an offset along ``dim`` of the same row."""
    dim = _axis(rule, len(shapes[0]), config)
    if not _fit(shapes, dim):
        listed = ", ".join(f"{n} {shape}" for n, shape in zip(names, shapes))
        raise CheckpointError("E032", f"fuse(dim={dim}) of {rule.written}: shapes do not fit: {listed}",
                              tensor=names[0])
    pieces, offset = [], 0
    for name, shape in zip(names, shapes):
        place = _rows_at(offset) if dim == 0 else _columns_at(dim, offset, slice(None))
        pieces.append(_Piece(name, 0, shape[0], place))
        offset += shape[dim]
    return _concatenated(shapes, dim), pieces


def _split_pieces(rule: Rule, names: list[str], shapes: list[tuple[int, ...]],
                  config: dict[str, int]) -> tuple[tuple[int, ...], list[_Piece]]:
    """The slices ``[start, end)`` along ``dim`` of the tensors, one after another: only the rows
    of a slice along dim 0 are read; along another dim every row is, and its slice placed."""
    sliced, pieces, offset = [], [], 0
    for name, shape, (start, end) in zip(names, shapes, _split_ranges(rule, config)):
        axis = _axis(rule, len(shape), config)
        if not 0 <= start < end <= shape[axis]:
            raise CheckpointError("E032", f"split range [{start}, {end}) of {rule.written} is outside checkpoint "
                                  f"tensor '{name}' {shape} along dim {axis}",
                                  "the config.json and the weights disagree, or the ranges are wrong", tensor=name)
        sliced.append(shape[:axis] + (end - start,) + shape[axis + 1:])
        if axis == 0:
            pieces.append(_Piece(name, start, end, _rows_at(offset)))
        else:
            pieces.append(_Piece(name, 0, shape[0], _columns_at(axis, offset, slice(start, end))))
        offset += end - start
    dim = _axis(rule, len(shapes[0]), config)
    if len(sliced) > 1 and not _fit(sliced, dim):
        listed = ", ".join(f"{n} {shape}" for n, shape in zip(names, sliced))
        raise CheckpointError("E032", f"split of {rule.written}: the slices do not fit together: {listed}",
                              tensor=names[0])
    return _concatenated(sliced, dim), pieces


def _fit(shapes: list[tuple[int, ...]], dim: int) -> bool:
    """Whether tensors of ``shapes`` concatenate along ``dim`` (one rank, the other dims equal)."""
    return all(len(s) == len(shapes[0]) and s[:dim] + s[dim + 1:] == shapes[0][:dim] + shapes[0][dim + 1:]
               for s in shapes)


def _concatenated(shapes: list[tuple[int, ...]], dim: int) -> tuple[int, ...]:
    first = shapes[0]
    return first[:dim] + (sum(s[dim] for s in shapes),) + first[dim + 1:]


def _rows_at(offset: int, slab: int | None = None) -> Place:
    """Rows placed one after another from row ``offset`` of the parameter (of its ``slab``: one
    expert of a stack)."""
    def place(out: np.ndarray, rows: np.ndarray, first: int) -> None:
        target = out if slab is None else out[slab]
        _copy(target[offset + first:offset + first + len(rows)], rows)

    return place


def _columns_at(dim: int, offset: int, source: slice) -> Place:
    """Each row's ``source`` slice along ``dim`` (> 0) placed from ``offset`` along it, in the same
    rows of the parameter."""
    def place(out: np.ndarray, rows: np.ndarray, first: int) -> None:
        piece = rows[(slice(None),) * dim + (source,)]
        index = (slice(first, first + len(rows)),) + (slice(None),) * (dim - 1)
        _copy(out[index + (slice(offset, offset + piece.shape[dim]),)], piece)

    return place


def _copy(target: np.ndarray, values: np.ndarray) -> None:
    np.copyto(target, values, casting="unsafe")


def _transposed_rows(shape: tuple[int, ...], rule: Rule, config: dict[str, int]) -> tuple[tuple[int, ...], Place, int]:
    """transpose: rows of the tensor become the parameter's last dim."""
    def place(out: np.ndarray, rows: np.ndarray, first: int) -> None:
        _copy(out[..., first:first + len(rows)], rows.T)

    return shape[::-1], place, 1


def _negated_exp_rows(shape: tuple[int, ...], rule: Rule,
                      config: dict[str, int]) -> tuple[tuple[int, ...], Place, int]:
    """negate_exp: ``-exp(x)`` of each chunk of rows, in fp32 as for the whole tensor."""
    def place(out: np.ndarray, rows: np.ndarray, first: int) -> None:
        _copy(out[first:first + len(rows)], -np.exp(rows.astype(np.float32)))

    return shape, place, 1


def _unpermuted_qkv_rows(shape: tuple[int, ...], rule: Rule,
                         config: dict[str, int]) -> tuple[tuple[int, ...], Place, int]:
    """permute_qkv: whole heads at a time, each head's rows [even; odd] put back in pairs."""
    head_dim = _qkv_head_dim(rule, config, shape)

    def place(out: np.ndarray, rows: np.ndarray, first: int) -> None:
        heads, rest = len(rows) // head_dim, rows.shape[1:]
        target = _view(out[first:first + len(rows)], (heads, head_dim // 2, 2, *rest))
        _copy(target, rows.reshape(heads, 2, head_dim // 2, *rest).swapaxes(1, 2))

    return shape, place, head_dim


def _view(array: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """``array`` seen in ``shape`` without a copy (AttributeError where none can be)."""
    view = array.view()
    view.shape = shape
    return view


def non_finite(x: np.ndarray, chunk: int = 1 << 20) -> str:
    """``"3 NaN and 1 Inf values"`` for a tensor that has any, else ``""`` (checked in chunks, so
    no full-size temporary is made; 16-bit floats by their exponent bits, at memory speed)."""
    if not _is_float(x.dtype):
        return ""
    flat = x.reshape(-1)
    counts = [0, 0]
    for begin in range(0, flat.size, chunk):
        _count_non_finite(flat[begin:begin + chunk], counts)
    return _non_finite_text(*counts)


def _chunk_non_finite(block: np.ndarray) -> list[int]:
    """[NaN values, Inf values] of a 1-d float ``block``."""
    counts = [0, 0]
    _count_non_finite(block, counts)
    return counts


def _count_non_finite(block: np.ndarray, counts: list[int]) -> None:
    """Add the NaN and Inf values of a 1-d float ``block`` to ``counts`` ([NaN, Inf]); a block
    whose sum (16-bit floats summed in fp32) is finite has none (one pass, no temporary)."""
    masks = EXPONENT_MASKS.get(block.dtype.name)
    if block.dtype in (np.float32, np.float64) or masks is not None:
        with np.errstate(invalid="ignore", over="ignore"):
            if np.isfinite(np.add.reduce(block, dtype=np.float32 if masks is not None else None)):
                return
    if masks is not None:
        exponent, mantissa = masks
        bits = block.view(np.uint16)
        special = (bits & exponent) == exponent
        if special.any():
            counts[0] += int((special & ((bits & mantissa) != 0)).sum())
            counts[1] += int((special & ((bits & mantissa) == 0)).sum())
    elif _is_float(block.dtype) and not np.isfinite(block).all():
        counts[0] += int(np.isnan(block).sum())
        counts[1] += int(np.isinf(block).sum())


def _non_finite_text(nans: int, infs: int) -> str:
    counts = [f"{n} {kind}" for n, kind in ((nans, "NaN"), (infs, "Inf")) if n]
    return " and ".join(counts) + (" values" if counts else "")


EXPONENT_MASKS = {"bfloat16": (0x7F80, 0x007F), "float16": (0x7C00, 0x03FF)}  # all-ones exponent: Inf or NaN


def _combine(rule: Rule, parts: list[np.ndarray], names: list[str], config: dict[str, int]) -> np.ndarray:
    if not parts:
        raise CheckpointError("E010", f"hf_mapping {rule.written}: {rule.op}(...) names no checkpoint tensor", RULES)
    if rule.op == "direct":
        return parts[0]
    if rule.op == "fuse":
        dim = _axis(rule, parts[0].ndim, config)
        try:
            return np.concatenate(parts, axis=dim)
        except ValueError:
            shapes = ", ".join(f"{n} {tuple(p.shape)}" for n, p in zip(names, parts))
            raise CheckpointError("E032", f"fuse(dim={dim}) of {rule.written}: shapes do not fit: {shapes}",
                                  tensor=names[0]) from None
    if rule.op == "split":
        pieces = []
        for name, part, (start, end) in zip(names, parts, _split_ranges(rule, config)):
            axis = _axis(rule, part.ndim, config)
            if not 0 <= start < end <= part.shape[axis]:
                raise CheckpointError("E032", f"split range [{start}, {end}) of {rule.written} is outside checkpoint "
                                      f"tensor '{name}' {tuple(part.shape)} along dim {axis}",
                                      "the config.json and the weights disagree, or the ranges are wrong",
                                      tensor=name)
            pieces.append(_take(part, start, end, axis))
        if len(pieces) == 1:
            return pieces[0]
        try:
            return np.concatenate(pieces, axis=_axis(rule, parts[0].ndim, config))
        except ValueError:
            shapes = ", ".join(f"{n} {tuple(p.shape)}" for n, p in zip(names, pieces))
            raise CheckpointError("E032", f"split of {rule.written}: the slices do not fit together: {shapes}",
                                  tensor=names[0]) from None
    if rule.op == "transform":
        return TRANSFORMS[_transform_name(rule)].load(parts[0], rule, config)
    if rule.op == "stack_experts":
        try:
            return np.stack(parts)
        except ValueError:
            shapes = ", ".join(f"{n} {tuple(p.shape)}" for n, p in zip(names, parts))
            raise CheckpointError("E032", f"stack_experts of {rule.written}: the experts differ in shape: {shapes}",
                                  tensor=names[0]) from None
    raise CheckpointError("E010", f"hf_mapping {rule.written}: unknown rule '{rule.op}'", RULES)


def _split_ranges(rule: Rule, config: dict[str, int]) -> list[tuple[int, int]]:
    ranges = []
    for name, bounds in rule.arg("parts", {}).items():
        if not (isinstance(bounds, list) and len(bounds) == 2):
            raise CheckpointError("E010", f"hf_mapping {rule.written}: split part '{name}' needs [start, end], "
                                  f"not {bounds!r}", "write split(\"name\": [start, end], ..., dim=0)")
        ranges.append((_size(bounds[0], config, rule), _size(bounds[1], config, rule)))
    if not ranges:
        raise CheckpointError("E010", f"hf_mapping {rule.written}: split names no tensor",
                              "write split(\"name\": [start, end], ..., dim=0)")
    return ranges


def _axis(rule: Rule, ndim: int, config: dict[str, int] | None = None) -> int:
    """``dim=`` of a rule (``-1`` reaches here as text) as an axis of an ``ndim``-d tensor."""
    dim = _size(rule.arg("dim", 0), config or {}, rule)
    if not -ndim <= dim < ndim:
        raise CheckpointError("E010", f"hf_mapping {rule.written}: dim={dim!r} is not a dimension of a "
                              f"{ndim}-d tensor")
    return dim % ndim


def _take(x: np.ndarray, start: int, end: int, axis: int) -> np.ndarray:
    index = [slice(None)] * x.ndim
    index[axis] = slice(start, end)
    return x[tuple(index)]


def _size(value: Any, config: dict[str, int], rule: Rule) -> int:
    """An int, or an expression of config values such as ``num_heads * head_dim``."""
    if isinstance(value, int):
        return value
    try:
        return Expr.parse(str(value)).evaluate(config)
    except (SymbolicError, ValueError, ZeroDivisionError) as err:
        raise CheckpointError("E010", f"hf rule {rule.written}: cannot evaluate '{value}': {err}",
                              "sizes are integers or expressions of the model's integer config values") from None


def _transform_name(rule: Rule) -> str:
    fn = rule.arg("fn") or next((a for a in rule.arg("args", []) if a in TRANSFORMS), None)
    if fn not in TRANSFORMS:
        raise CheckpointError("E010", f"hf_mapping {rule.written}: unknown transform '{fn}'",
                              f"transforms: {', '.join(TRANSFORMS)}")
    return fn


def _permute_qkv(x: np.ndarray, rule: Rule, config: dict[str, int], to_hf: bool = False) -> np.ndarray:
    """HF's conversion stores the rows of each q/k head as [even rows; odd rows] (for
    rotate_half RoPE); Meta's interleaved layout pairs neighbouring rows. Loading
    undoes HF's permutation, saving applies it again."""
    head_dim = _qkv_head_dim(rule, config, tuple(x.shape))
    heads, rest = x.shape[0] // head_dim, x.shape[1:]
    if to_hf:
        return x.reshape(heads, head_dim // 2, 2, *rest).swapaxes(1, 2).reshape(x.shape)
    return x.reshape(heads, 2, head_dim // 2, *rest).swapaxes(1, 2).reshape(x.shape)


def _qkv_head_dim(rule: Rule, config: dict[str, int], shape: tuple[int, ...]) -> int:
    """permute_qkv's head_dim, checked against the shape of the tensor it permutes (E010, E032)."""
    if rule.arg("head_dim") is None:
        raise CheckpointError("E010", f"hf_mapping {rule.written}: permute_qkv needs head_dim=",
                              "write transform(\"name\", fn: permute_qkv, head_dim=head_dim)")
    head_dim = _size(rule.arg("head_dim"), config, rule)
    if head_dim < 2 or head_dim % 2 or not shape or shape[0] % head_dim:
        raise CheckpointError("E032", f"hf_mapping {rule.written}: permute_qkv with head_dim={head_dim} needs an "
                              f"even head_dim that divides the rows of {shape}")
    return head_dim


@dataclass(frozen=True)
class Transform:
    load: Callable[[np.ndarray, Rule, dict[str, int]], np.ndarray]
    save: Callable[[np.ndarray, Rule, dict[str, int]], np.ndarray]
    exact: bool  # moves elements only: save(load(x)) is x bit for bit
    # loading a chunk of rows at a time: (the tensor's shape, rule, config) -> (the parameter's shape, where a
    # chunk of rows goes, the rows read together)
    place: Callable[[tuple[int, ...], Rule, dict[str, int]], tuple[tuple[int, ...], Place, int]]


TRANSFORMS: dict[str, Transform] = {
    "transpose": Transform(lambda x, r, c: x.T, lambda x, r, c: x.T, True, _transposed_rows),
    "negate_exp": Transform(lambda x, r, c: -np.exp(x.astype(np.float32)),
                            lambda x, r, c: np.log(-x.astype(np.float32)), False, _negated_exp_rows),
    "permute_qkv": Transform(_permute_qkv, lambda x, r, c: _permute_qkv(x, r, c, to_hf=True), True,
                             _unpermuted_qkv_rows),
}


def save_checkpoint(model: ModelOp, weights: dict[str, np.ndarray], record: ImportRecord,
                    directory: str | Path, dtype: np.dtype | None = None) -> set[str]:
    """Write the parameters as HF tensors (original names, dtypes and part sizes; the
    original bytes of every tensor whose parameters still hold what was loaded), each in its
    checkpoint dtype or, given ``dtype``, every floating-point one in that (changed values
    rounded to nearest even). The config (exported, or the imported one's) names the dtype
    the tensors have (``dtype``, and ``torch_dtype`` where the config has it; the dtype of most
    elements where they differ). Returns the names of the floating-point dtypes written."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {record.prefix + name: value for name, value in hf_tensors(model, weights, record, dtype).items()}
    carried = carried_tensors(model, record)
    tensors |= {name: value.astype(dtype) if dtype is not None and _is_float(value.dtype) else value
                for name, value in carried.items()}
    tmp = out / "model.safetensors.tmp"
    write_safetensors(tmp, tensors, {"format": "pt"})
    tmp.replace(out / "model.safetensors")
    written = tensors_dtype(tensors)
    if record.source is None:
        config = export_config(model) | ({"dtype": written} if written else {})
        (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    else:
        copy_tokenizer(record, out, COPIED_FILES)
        if written and (out / "config.json").is_file():
            _name_dtype(out / "config.json", written)
    return {value.dtype.name for value in tensors.values() if _is_float(value.dtype)}


def copy_tokenizer(record: ImportRecord, out: Path, names: tuple[str, ...] | None = None) -> None:
    """The loaded checkpoint's tokenizer files (and config and processor files: ``names``, default
    the tokenizer's alone) into ``out``."""
    if record.source is None or record.source.resolve() == Path(out).resolve():
        return
    for name in names if names is not None else TOKENIZER_FILES:
        if (record.source / name).is_file():
            shutil.copyfile(record.source / name, Path(out) / name)


def tensors_dtype(tensors: dict[str, np.ndarray]) -> str | None:
    """The dtype a config names for these tensors: that of most floating-point elements."""
    elements: dict[str, int] = {}
    for value in tensors.values():
        if _is_float(value.dtype):
            elements[value.dtype.name] = elements.get(value.dtype.name, 0) + value.size
    return max(elements, key=elements.get) if elements else None


def _name_dtype(path: Path, dtype: str) -> None:
    """Make a copied config.json name ``dtype`` (``dtype``, ``torch_dtype`` where present, and
    those of its sub-configs, ``text_config``); unchanged bytes where it names it already."""
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return  # not a JSON object: the load read it, so nothing to name here
    if not isinstance(config, dict):
        return
    changed = _set_dtype(config, dtype, top=True)
    if changed:
        path.write_text(json.dumps(config, indent=2, sort_keys=False) + "\n", encoding="utf-8")


def _set_dtype(config: dict, dtype: str, top: bool = False) -> bool:
    changed = False
    for key in ("dtype", "torch_dtype"):
        if (key in config or (top and key == "dtype")) and config.get(key) != dtype:
            config[key] = dtype
            changed = True
    for key, value in config.items():
        if key.endswith("_config") and isinstance(value, dict) and ("dtype" in value or "torch_dtype" in value):
            changed = _set_dtype(value, dtype) or changed
    return changed


def carried_tensors(model: ModelOp, record: ImportRecord) -> dict[str, np.ndarray]:
    """The imported checkpoint's tensors that ``ignore_tensors`` names (a wrapper's vision tower), as
    they are in its files (memory-mapped): an export writes them back unchanged."""
    patterns = ignored_tensors(model)
    if record.source is None or not patterns:
        return {}
    carried = {}
    for path in sorted(record.source.glob("*.safetensors")):
        source = SafetensorsFile(path)
        carried |= {name: source.array(name) for name in source.keys()
                    if any(fnmatchcase(name, p) for p in patterns)}
    return carried


def hf_tensors(model: ModelOp, weights: dict[str, np.ndarray], record: ImportRecord,
               dtype: np.dtype | None = None) -> dict[str, np.ndarray]:
    """The parameters as HF-named tensors, through the inverse of each ``hf_mapping`` rule
    (fused tensors split, stacked layers unstacked, a ``tied_to`` parameter written once
    under the name it is loaded from), in ``dtype`` or each tensor's checkpoint dtype.
    Where ``record`` holds the memory-mapped tensors a load read, a parameter that still
    equals them gives their original bytes. Mapping per-parameter gradients (the
    ``grads`` of ``mdsl-autodiff``) through it with a record without ``arrays`` gives the
    gradients of the checkpoint's tensors."""
    tensors: dict[str, np.ndarray] = {}
    assemblies: dict[str, _Assembly] = {}
    exports = _export_rules(model)
    config = config_integers(model)
    for rule in parse_rules(model):
        if rule.target not in weights or rule.op == "tied_to":
            continue
        value = weights[rule.target]
        layers = range(value.shape[0]) if rule.var is not None else [None]
        for layer in layers:
            reads = record.reads.get((rule.target, layer))
            arrays = record.arrays.get((rule.target, layer))
            part = value[layer] if layer is not None else value
            if reads is None and record.source is not None:
                continue  # an optional tensor the checkpoint did not have
            if rule.op == "split":
                _export_split(rule, layer, part, reads, arrays, assemblies, config)
                continue
            if reads is None:
                reads = _planned_reads(rule, exports.get(rule.key), layer, part, config)
            if arrays is not None and _unchanged(rule, part, arrays, reads, config):
                pieces = arrays
            else:
                pieces = _uncombine(rule, part, reads, config)
            for read, piece in zip(reads, pieces):
                tensors[read.name] = piece.astype(dtype or read.dtype, copy=False)
    for name, assembly in assemblies.items():
        tensors[name] = assembly.build(name).astype(dtype or assembly.dtype, copy=False)
    return tensors


def _unchanged(rule: Rule, value: np.ndarray, arrays: list[np.ndarray], reads: list[TensorRecord],
               config: dict[str, int]) -> bool:
    """Whether a parameter still holds exactly what was loaded from ``arrays``. Where the
    rule only moves elements in the parameter's own dtype, its inverse gives the original
    bytes anyway and nothing is compared."""
    exact = rule.op != "transform" or TRANSFORMS[_transform_name(rule)].exact
    if exact and all(a.dtype == value.dtype for a in arrays):
        return False
    loaded = _combine(rule, arrays, [r.name for r in reads], config).astype(value.dtype, copy=False)
    return _same_bits(loaded, value)


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    bits = np.dtype(f"u{a.dtype.itemsize}") if a.dtype.itemsize in (1, 2, 4, 8) else None
    if bits is None:
        return np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes()
    return bool(np.array_equal(np.ascontiguousarray(a).view(bits), np.ascontiguousarray(b).view(bits)))


@dataclass
class _Assembly:
    """A checkpoint tensor that ``split`` rules load slices of, put back together."""

    dtype: np.dtype
    shape: tuple[int, ...] | None = None  # None: not imported, from the slices' extent
    source: np.ndarray | None = None
    pieces: list[tuple[int, int, int, np.ndarray]] = field(default_factory=list)  # axis, start, end, values
    changed: bool = False

    def build(self, name: str) -> np.ndarray:
        if self.source is not None and not self.changed:
            return self.source
        shape = self.shape
        if shape is None:
            axis, _, _, piece = self.pieces[0]
            shape = list(piece.shape)
            shape[axis] = max(end for a, _, end, _ in self.pieces if a == axis)
            shape = tuple(shape)
        out = np.array(self.source) if self.source is not None else np.empty(shape, self.dtype)
        covered = None if self.source is not None else np.zeros(shape, bool)
        for axis, start, end, piece in self.pieces:
            index = [slice(None)] * len(shape)
            index[axis] = slice(start, end)
            out[tuple(index)] = piece
            if covered is not None:
                covered[tuple(index)] = True
        if covered is not None and not covered.all():
            raise CheckpointError("E010", f"no hf_mapping split covers all of '{name}' {shape}",
                                  "the model was not imported, so the parts no parameter holds are unknown; map "
                                  "every slice of the tensor", tensor=name)
        return out


def _export_split(rule: Rule, layer: int | None, value: np.ndarray, reads: list[TensorRecord] | None,
                  arrays: list[np.ndarray] | None, assemblies: dict[str, _Assembly],
                  config: dict[str, int]) -> None:
    """Put a parameter loaded by ``split`` back into the checkpoint tensors it slices."""
    names = _names(rule, layer, config)
    axis = _axis(rule, value.ndim, config)
    offset = 0
    for index, (name, (start, end)) in enumerate(zip(names, _split_ranges(rule, config))):
        piece = _take(value, offset, offset + end - start, axis)
        offset += end - start
        read = reads[index] if reads is not None else None
        source = arrays[index] if arrays is not None else None
        assembly = assemblies.setdefault(name, _Assembly(read.dtype if read is not None else value.dtype,
                                                         read.shape if read is not None else None, source))
        if source is not None and _same_bits(_take(source, start, end, axis).astype(value.dtype, copy=False), piece):
            continue  # the original bytes stay
        assembly.changed = True
        assembly.pieces.append((axis, start, end, piece.astype(assembly.dtype, copy=False)))
    if offset != value.shape[axis]:
        raise CheckpointError("E032", f"split of {rule.written}: the ranges give {offset} along dim {axis}, "
                              f"the parameter has {value.shape[axis]}", tensor=names[0])


def _export_rules(model: ModelOp) -> dict[str, dict[str, Any]]:
    """``hf_export`` entries by the key of the rule they invert."""
    if model.hf_export is None:
        return {}
    return {key.rstrip("?"): python_value(value) for key, value in model.hf_export.data.items()}


def _planned_reads(rule: Rule, export: dict[str, Any] | None, layer: int | None, value: np.ndarray,
                   config: dict[str, int]) -> list[TensorRecord]:
    """The checkpoint tensors of a parameter that was not imported: its names, and for
    a fused one the part sizes that ``hf_export``'s split ranges give."""
    names = _names(rule, layer, config)
    if rule.op == "stack_experts":
        return [TensorRecord(name, value.dtype, value.shape[1:]) for name in names]
    if rule.op != "fuse":
        return [TensorRecord(names[0], value.dtype, value.shape)]
    if export is None or export.get("op") != "split":
        raise CheckpointError("E010", f"hf_export has no split for the fused {rule.written}",
                              "add `" + rule.key + " -> split(\"name\": [start, end], ..., dim=0)` to hf_export")
    dim = _size(export.get("dim", 0), config, rule)
    records = []
    for template, (start, end) in export["parts"].items():
        shape = list(value.shape)
        shape[dim] = _size(end, config, rule) - _size(start, config, rule)
        records.append(TensorRecord(_fill(template, rule, layer, config), value.dtype, tuple(shape)))
    return records


def _uncombine(rule: Rule, value: np.ndarray, reads: list[TensorRecord], config: dict[str, int]) -> list[np.ndarray]:
    if rule.op == "direct":
        return [value]
    if rule.op == "fuse":
        dim = _axis(rule, value.ndim, config)
        bounds = np.cumsum([r.shape[dim] for r in reads])[:-1]
        return np.split(value, bounds, axis=dim)
    if rule.op == "transform":
        return [TRANSFORMS[_transform_name(rule)].save(value, rule, config)]
    if rule.op == "stack_experts":
        return list(value)
    raise CheckpointError("E010", f"hf_mapping {rule.written}: unknown rule '{rule.op}'", RULES)


def _is_float(dtype: np.dtype) -> bool:
    return dtype.kind == "f" or dtype.name.startswith(("bfloat16", "float8"))


PLACEHOLDER = re.compile(r"\{([^{}]+)\}")


def _fill(template: str, rule: Rule, layer: int | None, config: dict[str, int]) -> str:
    """The template with the stack's layer filled in: ``{layer}``, or an expression of it and the
    config values (``{2 * layer + 1}``, ``{layer + max_window_layers}``: one stack of a model whose
    layers alternate, or are split over several stacks). ``{expert}`` stays for stack_experts."""
    if rule.var is None and not rule.bindings:
        return template
    values = {**config, **dict(rule.bindings), **({rule.var: layer} if rule.var is not None else {})}

    def value(match: re.Match) -> str:
        text = match.group(1).strip()
        if text == "expert":
            return match.group(0)
        try:
            return str(Expr.parse(text).evaluate(values))
        except (SymbolicError, ValueError, ZeroDivisionError) as err:
            raise CheckpointError("E010", f"hf rule {rule.written}: cannot evaluate '{{{text}}}' in '{template}': "
                                  f"{err}", f"a tensor name's placeholder is {{{rule.var}}} or an expression of "
                                  f"{rule.var} and the model's integer config values") from None

    return PLACEHOLDER.sub(value, template)


def _concrete_shape(ptype: TensorType, rule: Rule) -> tuple[int, ...]:
    dims = [d.const_value() for d in ptype.shape]
    if any(d is None for d in dims):
        raise CheckpointError("E029", f"the shape of {rule.target} ({ptype}) is not concrete",
                              "specialize the model (mdsl-specialize) before loading weights")
    return tuple(dims)


def _close(name: str, names: list[str]) -> str:
    """A "did you mean" for a missing tensor that only points at a tensor of the same dotted
    path with one similar component (a typo, never ``mlp.gate`` for ``mlp.gate_proj`` nor
    ``v_proj`` for ``gate_proj``), or at the same name under another prefix; else no guess."""
    close = [n for n in names if _nested(name, n)] or [n for n in names if _one_typo_apart(name, n)]
    if close:
        return f"did you mean '{min(close, key=lambda n: (-_ratio(name, n), n))}'?"
    return "check the checkpoint's tensor names against hf_mapping"


def _nested(name: str, other: str) -> bool:
    """The same dotted name under an added or dropped prefix (``model.`` / ``language_model.``)."""
    return other.endswith("." + name) or name.endswith("." + other)


def _one_typo_apart(name: str, other: str) -> bool:
    """Same dotted path but one component, which is a close spelling of it (never a layer index)."""
    ours, theirs = name.split("."), other.split(".")
    if len(ours) != len(theirs):
        return False
    differing = [(a, b) for a, b in zip(ours, theirs) if a != b]
    if len(differing) != 1:
        return False
    a, b = differing[0]
    if a.isdigit() or b.isdigit():
        return False
    return _ratio(a, b) >= SIMILAR


SIMILAR = 0.85  # q_proj/k_proj (0.83) and gate/gate_proj (0.62) are different tensors; typos score above


def _ratio(a: str, b: str) -> float:
    import difflib

    return difflib.SequenceMatcher(None, a, b).ratio()
