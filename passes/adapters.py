"""``mdsl-adapters``: LoRA adapters on the matmuls of the weights the targets name.

``mdsl-adapters{rank=8 alpha=16 targets=q_proj,v_proj dropout=0.05 rslora=false}`` gives every
weight whose HuggingFace module a target names (through the model's ``hf_mapping``) a low-rank
pair, as PEFT's LoRA does, and freezes the model:

- ``<weight>.<module>.lora_A`` ``[r, in]`` and ``<weight>.<module>.lora_B`` ``[out, r]`` (per layer
  of a stack: ``[n_layers, r, in]``), declared after the weight, each with an ``adapter``
  dictionary (``role``, ``module``: the HF module, ``{layer}`` in a stack's, ``rank``, ``alpha``,
  ``scaling``, ``init``: ``kaiming_uniform`` for A, PEFT's ``a = sqrt(5)``, ``zeros`` for B);
- on each ``y = matmul(x, W, transpose=NT)`` the weight reaches, the path
  ``y + scaling * B(A(dropout(x)))`` (``scaling = alpha / r``, with ``rslora`` ``alpha / sqrt(r)``):
  ``matmul(dropout(x), A, NT)``, then ``matmul(h, B, NT, alpha=scaling)``, added to ``y``. The
  annotations of the matmul (hooks, memory modes) move to the value that replaces ``y``;
- a packed weight (``hf_mapping``'s ``fuse`` of ``q_proj``, ``k_proj``, ``v_proj``) adapts each
  targeted slice on its own: ``y`` is split by ``hf_export``'s ranges, the slices get their
  paths, and the parts are concatenated back;
- every parameter of the model but the adapters is ``@frozen``, as PEFT freezes the base model:
  only the adapters get gradients, master weights and optimizer moments.

The pair reaches the matmul the way the weight does: through a ``stack``'s per-layer operands
(the body takes the slices as new arguments) and through calls (the callee takes them as new
arguments). A helper whose written backward would not see the adapters loses it, so that
``mdsl-autodiff`` derives its gradient. Targets are module names (``q_proj``) or their short
forms (``q``, ``gate``: ``q_proj``, ``gate_proj``); ``all-linear`` names every module of a
matmul weight but the output layer (``lm_head``), as PEFT's does. A target that names no
module, or a weight used other than as a matmul's ``NT`` weight, is E047.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from xdsl.builder import Builder
from xdsl.context import Context
from xdsl.dialects.builtin import ArrayAttr, DictionaryAttr, FloatAttr, IntegerAttr, ModuleOp, StringAttr, f64, i64
from xdsl.ir import Attribute, Operation, SSAValue, Use
from xdsl.passes import ModulePass
from xdsl.pattern_rewriter import (
    PatternRewriter,
    PatternRewriteWalker,
    RewritePattern,
)
from xdsl.rewriter import InsertPoint

from modeldsl.diagnostics import Diagnostic, DiagnosticError, PassOptionError
from modeldsl.dialects.annotations import ANNOTATIONS_ATTR_NAME, FrozenAttr, TrainableAttr, annotations_of
from modeldsl.dialects.graph import ADAPTER_ATTR, CallOp, FuncOp, ModelOp, ParamOp, ParamRefOp, StackOp
from modeldsl.dialects.graph_types import TensorType
from modeldsl.graph_builder import GraphBuilder, op_attr
from modeldsl.symbolic import Expr

ALL_LINEAR = "all-linear"
OUTPUT_MODULES = ("lm_head",)  # what all-linear leaves out, as PEFT does
MOVED_ATTRS = (ANNOTATIONS_ATTR_NAME, "memory")  # what a matmul's value carries to the value that replaces it
KEY = re.compile(r"^(?P<stack>[A-Za-z_]\w*)\[\{(?P<var>\w+)\}\]\.(?P<rest>.+)$")


# ----------------------------------------------------------------------------- plain data


@dataclass(frozen=True)
class Part:
    """A HuggingFace module a weight holds (all of it, or the rows ``[start, end)`` of a packed one)."""

    module: str  # model.layers.{layer}.self_attn.q_proj
    start: Expr
    end: Expr

    @property
    def short(self) -> str:
        return self.module.rsplit(".", 1)[-1]

    @property
    def rows(self) -> Expr:
        return Expr.of(self.end) - Expr.of(self.start)


@dataclass(frozen=True)
class Weight:
    """A parameter that ``hf_mapping`` fills from linear modules: its parts in row order."""

    param: str
    parts: tuple[Part, ...]
    stacked: bool


@dataclass(frozen=True)
class Lora:
    """The options of the adapters."""

    rank: int
    alpha: float
    dropout: float
    rslora: bool
    seed: int

    @property
    def scaling(self) -> float:
        return self.alpha / (math.sqrt(self.rank) if self.rslora else self.rank)


def module_of(tensor: str) -> str:
    """``model.layers.{layer}.self_attn.q_proj.weight`` -> ``model.layers.{layer}.self_attn.q_proj``."""
    return tensor.removesuffix(".weight")


def mapped_weights(model: ModelOp) -> list[Weight]:
    """Every parameter ``hf_mapping`` fills from ``.weight`` tensors, whole or fused along dim 0."""
    if model.hf_mapping is None:
        return []
    exports = {k.rstrip("?"): v for k, v in (model.hf_export.data.items() if model.hf_export is not None else ())}
    config = {k: v.value.data for k, v in model.config_values.items()
              if isinstance(v, IntegerAttr) and v.type.width.data != 1}
    shapes = {p.sym_name.data: p.param_type.shape for p in model.params()}
    found = []
    for key, source in model.hf_mapping.data.items():
        key = key.rstrip("?")
        match = KEY.match(key)
        param = f"{match['stack']}.{match['rest']}" if match else key
        if param not in shapes:
            continue
        parts = _parts(source, exports.get(key), shapes[param][1 if match else 0], config)
        if parts:
            found.append(Weight(param, parts, match is not None))
    return found


def _parts(source: Attribute, export: Attribute | None, rows: Expr, config: dict[str, int]) -> tuple[Part, ...]:
    if isinstance(source, StringAttr):
        return (Part(module_of(source.data), Expr.const(0), rows),) if source.data.endswith(".weight") else ()
    if not isinstance(source, DictionaryAttr) or _text(source.data.get("op")) != "fuse" or \
            _int(source.data.get("dim"), 0) != 0 or not isinstance(export, DictionaryAttr):
        return ()
    ranges = export.data.get("parts")
    if not isinstance(ranges, DictionaryAttr):
        return ()
    parts = []
    for name, bounds in ranges.data.items():
        start, end = (_size(b, config, rows.is_const()) for b in bounds.data)
        parts.append(Part(module_of(name), start, end))
    return tuple(parts) if all(name.endswith(".weight") for name in ranges.data) else ()


def _text(attr: Attribute | None) -> str | None:
    return attr.data if isinstance(attr, StringAttr) else None


def _int(attr: Attribute | None, default: int) -> int:
    return attr.value.data if isinstance(attr, IntegerAttr) else default


def _size(attr: Attribute, config: dict[str, int], static: bool) -> Expr:
    """A range bound of ``hf_export``: an integer, or an expression of config values (evaluated where
    the weight's shape is static, kept symbolic where it is not)."""
    if isinstance(attr, IntegerAttr):
        return Expr.const(attr.value.data)
    expr = Expr.parse(attr.data)
    return Expr.const(expr.evaluate(config)) if static else expr


def canonical_target(target: str) -> str:
    """``q`` -> ``q_proj``; a module name stays as it is."""
    return target if target.endswith("_proj") or target in (ALL_LINEAR, *OUTPUT_MODULES) or "_" in target \
        else f"{target}_proj"


def chosen_parts(weights: Sequence[Weight], targets: Sequence[str]) -> dict[str, set[str]]:
    """The modules each weight adapts (by their short names), for the targets; E047 for a target
    that names none. ``weights`` are those of linear modules (:func:`linear_weights`)."""
    wanted = {canonical_target(t): t for t in targets}
    every = {part.short for w in weights for part in w.parts}
    unknown = [t for name, t in wanted.items() if name not in every and name != ALL_LINEAR]
    if unknown:
        close = difflib.get_close_matches(canonical_target(unknown[0]), sorted(every), n=1)
        raise DiagnosticError([Diagnostic(
            "E047", f"mdsl-adapters: the target '{unknown[0]}' names no linear module of the model", None,
            (f"did you mean '{close[0]}'? " if close else "")
            + f"its linear modules: {', '.join(sorted(every))}, or {ALL_LINEAR}")])
    chosen: dict[str, set[str]] = {}
    for weight in weights:
        names = {p.short for p in weight.parts
                 if p.short in wanted or ALL_LINEAR in wanted and p.short not in OUTPUT_MODULES}
        if names:
            chosen[weight.param] = names
    return chosen


def linear_weights(model: ModelOp, weights: Sequence[Weight]) -> list[Weight]:
    """The weights only matmuls read as their ``NT`` weight (through stacks and calls): linear modules."""
    funcs = {f.sym_name.data: f for f in model.funcs()}
    refs: dict[str, list[SSAValue]] = {}
    for ref in model.walk():
        if isinstance(ref, ParamRefOp):
            refs.setdefault(ref.param.root_reference.data, []).append(ref.result)
    return [w for w in weights if all(_only_matmul_weight(v, funcs) for v in refs.get(w.param, []))]


def _only_matmul_weight(value: SSAValue, funcs: dict[str, FuncOp]) -> bool:
    for use in value.uses:
        reader = weight_reader(use, funcs)
        if reader is None or isinstance(reader, FuncOp) and \
                not _only_matmul_weight(reader.body.block.args[use.index], funcs):
            return False
    return True


def weight_reader(use: Use, funcs: dict[str, FuncOp]) -> Operation | FuncOp | None:
    """What reads a weight at ``use``: the matmul whose ``NT`` weight it is, the function a stack's
    per-layer operand or a call's argument passes it on to, or None (another reader)."""
    op = use.operation
    if op.name == "mdsl.graph.matmul" and use.index == 1 and op_attr(op, "transpose", "NN") == "NT":
        return op
    if isinstance(op, StackOp) and use.index >= len(op.carried) + len(op.shared):
        return funcs[op.body.root_reference.data]
    if isinstance(op, CallOp):
        return funcs[op.callee.root_reference.data]
    return None


def lora_name(param: str, part: Part, role: str) -> str:
    return f"{param}.{part.short}.lora_{role}"


# ----------------------------------------------------------------------------- the IR


@dataclass
class Pair:
    """One adapted part of a weight, and the values of its A and B where the weight's value is."""

    weight: Weight
    part: Part
    a: SSAValue
    b: SSAValue


class Threader:
    """Carries each pair to the matmuls its weight reaches, through stacks and calls, recording
    in :attr:`adapted` the weight values a matmul reads with their pairs."""

    def __init__(self, model: ModelOp):
        self.funcs = {f.sym_name.data: f for f in model.funcs()}
        self.adapted: dict[SSAValue, list[Pair]] = {}
        self.threaded: dict[tuple[str, int], list[Pair]] = {}  # (func, argument): its new arguments

    def thread(self, value: SSAValue, pairs: list[Pair], param: str) -> None:
        """Only weights :func:`linear_weights` keeps come here: every reader is a matmul, a stack or a call."""
        for use in list(value.uses):
            reader = weight_reader(use, self.funcs)
            if isinstance(reader, FuncOp) and isinstance(use.operation, StackOp):
                self.into_stack(use.operation, use.index, pairs, param)
            elif isinstance(reader, FuncOp):
                self.into_call(use.operation, use.index, pairs, param)
            elif reader is not None:
                self.adapted[value] = pairs
            else:
                raise DiagnosticError([Diagnostic(
                    "E047", f"mdsl-adapters: {param} is read by {use.operation.name}, not as the weight of "
                    "y = matmul(x, W, transpose=NT)", None, "adapt the modules whose weights only matmuls read")])

    def callee_pairs(self, func: FuncOp, index: int, pairs: list[Pair], param: str, per_layer: bool) -> list[Pair]:
        """The callee's arguments for the pairs of its argument ``index`` (added once per callee)."""
        key = (func.sym_name.data, index)
        if key not in self.threaded:
            block = func.body.block
            inner = []
            for pair in pairs:
                types = [_layer_slice(v.type) if per_layer else v.type for v in (pair.a, pair.b)]
                a = block.insert_arg(types[0], len(block.args))
                b = block.insert_arg(types[1], len(block.args))
                a.name_hint, b.name_hint = (f"{pair.part.short}_lora_{r}" for r in "AB")
                inner.append(Pair(pair.weight, pair.part, a, b))
            func.function_type = type(func.function_type).from_lists(
                [a.type for a in block.args], list(func.function_type.outputs.data))
            self.threaded[key] = inner
            self.thread(block.args[index], inner, param)
        return self.threaded[key]

    def into_stack(self, stack: StackOp, index: int, pairs: list[Pair], param: str) -> None:
        body = self.funcs[stack.body.root_reference.data]
        self.callee_pairs(body, index, pairs, param, per_layer=True)
        extra = [v for pair in pairs for v in (pair.a, pair.b)]
        new = StackOp(stack.body.root_reference.data, stack.count, list(stack.carried), [*stack.per_layer, *extra],
                      list(stack.shared), [r.type for r in stack.collected], stack.reverse is not None)
        _replace(stack, new)

    def into_call(self, call: CallOp, index: int, pairs: list[Pair], param: str) -> None:
        callee = self.funcs[call.callee.root_reference.data]
        self.callee_pairs(callee, index, pairs, param, per_layer=False)
        callee.attributes.pop("backward", None)  # its written backward would not see the adapters
        extra = [v for pair in pairs for v in (pair.a, pair.b)]
        _replace(call, CallOp(call.callee.root_reference.data, [*call.arguments, *extra], [r.type for r in call.res]))


def _layer_slice(t: TensorType) -> TensorType:
    return t.with_shape(t.shape[1:])


def _replace(old: Operation, new: Operation) -> None:
    """``new`` in place of ``old``, with its attributes and its results' uses."""
    new.attributes.update(old.attributes)
    Builder(InsertPoint.before(old)).insert(new)
    for before, after in zip(old.results, new.results):
        before.replace_all_uses_with(after)
    old.detach()
    old.erase()


class AddLoraPath(RewritePattern):
    """``y = matmul(x, W, NT)`` of an adapted ``W``: ``y + scaling * B(A(dropout(x)))``, by part."""

    def __init__(self, adapted: dict[SSAValue, list[Pair]], lora: Lora):
        self.adapted = adapted
        self.lora = lora
        self.count = 0  # matmuls adapted: each adapter's dropout draws masks of its own (offset)

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> None:
        if op.name != "mdsl.graph.matmul" or op.operands[1] not in self.adapted:
            return
        self.count += 1
        pairs = self.adapted[op.operands[1]]
        x, y = op.operands[0], op.results[0]
        uses = [u for u in y.uses]
        build = GraphBuilder.at(InsertPoint.after(op), rewriter)
        source = x
        if self.lora.dropout > 0:
            source = build.one("dropout", x, p=self.lora.dropout, seed=self.lora.seed, offset=self.count)
            source.name_hint = f"{x.name_hint or 'x'}_lora_dropout"
        deltas = {p.part: self.low_rank_path(build, source, p) for p in pairs}
        parts = pairs[0].weight.parts
        if len(parts) == 1:
            result = build.one("add", y, deltas[parts[0]])
        else:
            pieces = build.op("split", y, sizes=[p.rows for p in parts], dim=-1)
            summed = [build.one("add", piece, deltas[p]) if p in deltas else piece for p, piece in zip(parts, pieces)]
            result = build.one("concat", *summed, dim=-1)
        for name in MOVED_ATTRS:
            if name in op.attributes:
                result.owner.attributes[name] = op.attributes.pop(name)
        for use in uses:
            use.operation.operands[use.index] = result
        if y.name_hint:
            result.name_hint, y.name_hint = y.name_hint, f"{y.name_hint}_base"

    def low_rank_path(self, build: GraphBuilder, source: SSAValue, pair: Pair) -> SSAValue:
        """``scaling * B(A(source))``: two NT matmuls, the scaling in the second one's alpha."""
        down = build.one("matmul", source, pair.a, transpose="NT")
        down.name_hint = f"{pair.part.short}_lora_a"
        up = build.one("matmul", down, pair.b, transpose="NT", alpha=self.lora.scaling)
        up.name_hint = f"{pair.part.short}_lora_b"
        return up


PATTERNS: dict[str, tuple[type[RewritePattern], ...]] = {"lora_path": (AddLoraPath,)}


@dataclass(frozen=True)
class AdaptersPass(ModulePass):
    """``mdsl-adapters``: see the module docstring."""

    name = "mdsl-adapters"

    rank: int = 8
    alpha: float = 0.0  # 0: the rank (scaling 1, PEFT's default of lora_alpha = r = 8)
    dropout: float = 0.0
    targets: tuple[str, ...] = ("q_proj", "v_proj")
    rslora: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        if self.rank < 1:
            raise PassOptionError(f"mdsl-adapters: rank={self.rank} is not a positive integer", "rank",
                                  "give the rank of the adapters: rank=8")
        if not 0 <= self.dropout < 1:
            raise PassOptionError(f"mdsl-adapters: dropout={self.dropout} is not in [0, 1)", "dropout",
                                  "give the probability of dropping an input of the adapters: dropout=0.05")
        if self.alpha < 0:
            raise PassOptionError(f"mdsl-adapters: alpha={self.alpha} is negative", "alpha",
                                  "give lora_alpha (scaling = alpha / rank), or 0 for the rank")
        if not self.targets:
            raise PassOptionError("mdsl-adapters: no targets", "targets", "name modules: targets=q_proj,v_proj")

    @property
    def lora(self) -> Lora:
        return Lora(self.rank, self.alpha or float(self.rank), self.dropout, self.rslora, self.seed)

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for model in [m for m in op.walk() if isinstance(m, ModelOp)]:
            add_adapters(model, self.lora, self.targets)


def add_adapters(model: ModelOp, lora: Lora, targets: Sequence[str]) -> list[str]:
    """Adapt ``model`` in place (see the module docstring); the names of the parameters added."""
    weights = {w.param: w for w in linear_weights(model, mapped_weights(model))}
    chosen = chosen_parts(list(weights.values()), targets)
    params = {p.sym_name.data: p for p in model.params()}
    threader = Threader(model)
    added = []
    for name, shorts in chosen.items():
        weight = weights[name]
        pairs_of_param = declare_pairs(params[name], weight, shorts, lora)
        added += [n for a, b in pairs_of_param for n in (a.sym_name.data, b.sym_name.data)]
        for ref in [r for r in model.walk() if isinstance(r, ParamRefOp) and r.param.root_reference.data == name]:
            pairs = []
            builder = Builder(InsertPoint.after(ref))
            for (a, b), part in zip(pairs_of_param, [p for p in weight.parts if p.short in shorts]):
                a_ref = builder.insert(ParamRefOp(a.sym_name.data, a.param_type))
                b_ref = builder.insert(ParamRefOp(b.sym_name.data, b.param_type))
                pairs.append(Pair(weight, part, a_ref.result, b_ref.result))
            threader.thread(ref.result, pairs, name)
    for param in params.values():
        freeze(param)
    PatternRewriteWalker(AddLoraPath(threader.adapted, lora), apply_recursively=False).rewrite_module(model)
    _drop_unused_backwards(model)
    return added


def declare_pairs(param: ParamOp, weight: Weight, shorts: set[str], lora: Lora) -> list[tuple[ParamOp, ParamOp]]:
    """``lora_A`` and ``lora_B`` of each adapted part, declared after the weight."""
    ptype = param.param_type
    lead = list(ptype.shape[:1]) if weight.stacked else []
    columns = ptype.shape[-1]
    builder = Builder(InsertPoint.after(param))
    declared = []
    for part in (p for p in weight.parts if p.short in shorts):
        module = part.module
        pair = []
        for role, shape, init in (("A", [*lead, lora.rank, columns], "kaiming_uniform"),
                                  ("B", [*lead, part.rows, lora.rank], "zeros")):
            op = ParamOp(lora_name(param.sym_name.data, part, role), TensorType(shape, ptype.dtype))
            op.attributes[ADAPTER_ATTR] = DictionaryAttr({
                "kind": StringAttr("lora"), "role": StringAttr(role), "module": StringAttr(module),
                "rank": IntegerAttr(lora.rank, i64), "alpha": FloatAttr(lora.alpha, f64),
                "scaling": FloatAttr(lora.scaling, f64), "init": StringAttr(init),
                **({"dropout": FloatAttr(lora.dropout, f64)} if lora.dropout else {})})
            pair.append(op)
        builder.insert(pair[0])
        builder.insert(pair[1])
        declared.append((pair[0], pair[1]))
    return declared


def freeze(param: ParamOp) -> None:
    """Mark the parameter ``@frozen`` (an ``@trainable`` it had goes: the two contradict)."""
    kept = [a for a in annotations_of(param) if not isinstance(a, (FrozenAttr, TrainableAttr))]
    param.attributes[ANNOTATIONS_ATTR_NAME] = ArrayAttr([*kept, FrozenAttr.of()])


def _drop_unused_backwards(model: ModelOp) -> None:
    """Erase written backwards no helper names any more."""
    named = {f.attributes["backward"].root_reference.data for f in model.funcs() if "backward" in f.attributes}
    for func in model.funcs():
        if func.attributes.get("kind") == StringAttr("backward") and func.sym_name.data not in named:
            func.detach()
            func.erase()


def adapter_info(param: ParamOp) -> dict[str, object] | None:
    """The ``adapter`` dictionary of a parameter ``mdsl-adapters`` declared, as Python values."""
    attr = param.attributes.get(ADAPTER_ATTR)
    if not isinstance(attr, DictionaryAttr):
        return None
    out: dict[str, object] = {}
    for key, value in attr.data.items():
        out[key] = value.data if isinstance(value, StringAttr) else value.value.data
    return out
