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
from collections.abc import Callable, Sequence
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
from modeldsl.dialects.annotations import (
    ANNOTATIONS_ATTR_NAME,
    AdapterAttr,
    FrozenAttr,
    TrainableAttr,
    annotations_of,
)
from modeldsl.dialects.graph import ADAPTER_ATTR, CallOp, FuncOp, ModelOp, ParamOp, ParamRefOp, StackOp
from modeldsl.dialects.graph_types import TensorType
from modeldsl.graph_builder import GraphBuilder, op_attr
from modeldsl.ir import replace_with_twin
from modeldsl.symbolic import Expr

ALL_LINEAR = "all-linear"
DEFAULT_RANK = 8
DEFAULT_TARGETS = ("q_proj", "v_proj")
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
    """``blocks.attention.qkv_weight.q_proj.lora_A``; ``mlp.up_weight.lora_A`` where the module is the weight's own."""
    own = param.rsplit(".", 1)[-1] == part.short
    return f"{param}.lora_{role}" if own else f"{param}.{part.short}.lora_{role}"


# ----------------------------------------------------------------------------- the IR


@dataclass
class Pair:
    """One adapted part of a weight, its options, and the values of its A and B where the weight's value is."""

    weight: Weight
    part: Part
    lora: Lora
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
                inner.append(Pair(pair.weight, pair.part, pair.lora, a, b))
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
        replace_with_twin(stack, new)

    def into_call(self, call: CallOp, index: int, pairs: list[Pair], param: str) -> None:
        callee = self.funcs[call.callee.root_reference.data]
        self.callee_pairs(callee, index, pairs, param, per_layer=False)
        callee.attributes.pop("backward", None)  # its written backward would not see the adapters
        extra = [v for pair in pairs for v in (pair.a, pair.b)]
        new = CallOp(call.callee.root_reference.data, [*call.arguments, *extra], [r.type for r in call.res])
        replace_with_twin(call, new)


def _layer_slice(t: TensorType) -> TensorType:
    return t.with_shape(t.shape[1:])


class AddLoraPath(RewritePattern):
    """``y = matmul(x, W, NT)`` of an adapted ``W``: ``y + scaling * B(A(dropout(x)))``, by part."""

    def __init__(self, adapted: dict[SSAValue, list[Pair]]):
        self.adapted = adapted
        self.count = 0  # matmuls adapted: each adapter's dropout draws masks of its own (offset)

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> None:
        if op.name != "mdsl.graph.matmul" or op.operands[1] not in self.adapted:
            return
        self.count += 1
        pairs = self.adapted[op.operands[1]]
        x, y = op.operands[0], op.results[0]
        uses = [u for u in y.uses]
        build = GraphBuilder.at(InsertPoint.after(op), rewriter)
        sources: dict[tuple[float, int], SSAValue] = {}  # the adapters' input by (dropout, seed)

        def source(lora: Lora) -> SSAValue:
            if lora.dropout == 0:
                return x
            key = (lora.dropout, lora.seed)
            if key not in sources:
                offset = self.count + (len(sources) << 20)  # a second dropout of one matmul draws its own masks
                sources[key] = build.one("dropout", x, p=lora.dropout, seed=lora.seed, offset=offset)
                sources[key].name_hint = f"{x.name_hint or 'x'}_lora_dropout"
            return sources[key]

        deltas = {p.part: self.low_rank_path(build, source(p.lora), p) for p in pairs}
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
        up = build.one("matmul", down, pair.b, transpose="NT", alpha=pair.lora.scaling)
        up.name_hint = f"{pair.part.short}_lora_b"
        return up


PATTERNS: dict[str, tuple[type[RewritePattern], ...]] = {"lora_path": (AddLoraPath,)}


@dataclass(frozen=True)
class AdaptersPass(ModulePass):
    """``mdsl-adapters``: see the module docstring."""

    name = "mdsl-adapters"

    rank: int = 0  # 0 (and no targets): the model's @adapter annotations, else 8
    alpha: float = 0.0  # 0: the rank (scaling 1, PEFT's default of lora_alpha = r = 8)
    dropout: float = 0.0
    targets: tuple[str, ...] = ()  # (): the model's @adapter annotations, else q_proj,v_proj
    rslora: bool = False
    seed: int = 0
    annotations_only: bool = False  # only the @adapter annotations of a model that has no adapters yet

    def __post_init__(self) -> None:
        if self.rank < 0:
            raise PassOptionError(f"mdsl-adapters: rank={self.rank} is not a positive integer", "rank",
                                  "give the rank of the adapters: rank=8")
        if not 0 <= self.dropout < 1:
            raise PassOptionError(f"mdsl-adapters: dropout={self.dropout} is not in [0, 1)", "dropout",
                                  "give the probability of dropping an input of the adapters: dropout=0.05")
        if self.alpha < 0:
            raise PassOptionError(f"mdsl-adapters: alpha={self.alpha} is negative", "alpha",
                                  "give lora_alpha (scaling = alpha / rank), or 0 for the rank")

    @property
    def lora(self) -> Lora:
        rank = self.rank or DEFAULT_RANK
        return Lora(rank, self.alpha or float(rank), self.dropout, self.rslora, self.seed)

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for model in [m for m in op.walk() if isinstance(m, ModelOp)]:
            if self.annotations_only:
                if has_adapter_annotations(model) and not any(p.is_adapter for p in model.params()):
                    add_annotated_adapters(model, self.seed)
                continue
            if any(p.is_adapter for p in model.params()):
                raise DiagnosticError([Diagnostic("E047", f"mdsl-adapters: the model {model.sym_name.data} has "
                                                  "adapters already", None, "run mdsl-adapters once")])
            if not self.rank and not self.targets and has_adapter_annotations(model):
                add_annotated_adapters(model, self.seed)
            else:
                add_adapters(model, self.lora, self.targets or DEFAULT_TARGETS)


Plan = dict[str, dict[str, Lora]]  # weight -> the short names of the parts it adapts -> their options


def add_adapters(model: ModelOp, lora: Lora | Callable[[str, int | None], Lora], targets: Sequence[str]) -> list[str]:
    """Adapt ``model`` in place (see the module docstring) with the options ``lora``, or those of
    each module (by its name and, in a stack, the number of layers); the names of the parameters added."""
    weights = {w.param: w for w in linear_weights(model, mapped_weights(model))}
    options = lora if callable(lora) else (lambda module, layers: lora)
    plan = {name: {p.short: options(p.module, _layers(model, name) if weights[name].stacked else None)
                   for p in weights[name].parts if p.short in shorts}
            for name, shorts in chosen_parts(list(weights.values()), targets).items()}
    return apply_plan(model, weights, plan)


def _layers(model: ModelOp, param: str) -> int | None:
    """The layers of a stacked parameter, where its count is a number."""
    dim = next(p for p in model.params() if p.sym_name.data == param).param_type.shape[0]
    return dim.evaluate({}) if Expr.of(dim).is_const() else None


def apply_plan(model: ModelOp, weights: dict[str, Weight], plan: Plan) -> list[str]:
    """Declare the pairs of ``plan``, thread them to the matmuls, add their paths, freeze the rest."""
    params = {p.sym_name.data: p for p in model.params()}
    threader = Threader(model)
    added = []
    for name, parts in plan.items():
        weight = weights[name]
        pairs_of_param = declare_pairs(params[name], weight, parts)
        added += [n for a, b in pairs_of_param for n in (a.sym_name.data, b.sym_name.data)]
        for ref in [r for r in model.walk() if isinstance(r, ParamRefOp) and r.param.root_reference.data == name]:
            pairs = []
            builder = Builder(InsertPoint.after(ref))
            for (a, b), part in zip(pairs_of_param, [p for p in weight.parts if p.short in parts]):
                a_ref = builder.insert(ParamRefOp(a.sym_name.data, a.param_type))
                b_ref = builder.insert(ParamRefOp(b.sym_name.data, b.param_type))
                pairs.append(Pair(weight, part, parts[part.short], a_ref.result, b_ref.result))
            threader.thread(ref.result, pairs, name)
    for param in params.values():
        freeze(param)
    PatternRewriteWalker(AddLoraPath(threader.adapted), apply_recursively=False).rewrite_module(model)
    _drop_unused_backwards(model)
    return added


def declare_pairs(param: ParamOp, weight: Weight, parts: dict[str, Lora]) -> list[tuple[ParamOp, ParamOp]]:
    """``lora_A`` and ``lora_B`` of each adapted part, declared after the weight."""
    ptype = param.param_type
    lead = list(ptype.shape[:1]) if weight.stacked else []
    columns = ptype.shape[-1]
    builder = Builder(InsertPoint.after(param))
    declared = []
    for part in (p for p in weight.parts if p.short in parts):
        module, lora = part.module, parts[part.short]
        pair = []
        for role, shape, init in (("A", [*lead, lora.rank, columns], "kaiming_uniform"),
                                  ("B", [*lead, part.rows, lora.rank], "zeros")):
            op = ParamOp(lora_name(param.sym_name.data, part, role), TensorType(shape, ptype.dtype))
            op.attributes[ADAPTER_ATTR] = DictionaryAttr({
                "kind": StringAttr("lora"), "role": StringAttr(role), "module": StringAttr(module),
                "weight": StringAttr(param.sym_name.data),
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


# ----------------------------------------------------------------------------- @adapter annotations


def lora_annotations(attrs: Sequence[Attribute]) -> list[AdapterAttr]:
    return [a for a in attrs if isinstance(a, AdapterAttr) and a["type"] == "lora"]


def has_adapter_annotations(model: ModelOp) -> bool:
    """Whether the model, a parameter or an op carries ``@adapter(lora, ...)``."""
    return any(lora_annotations(annotations_of(op)) for op in model.walk())


def annotation_lora(attr: AdapterAttr, seed: int) -> Lora:
    return Lora(int(attr["rank"]), float(attr["alpha"]), float(attr["dropout"]), False, seed)


def add_annotated_adapters(model: ModelOp, seed: int = 0) -> list[str]:
    """Adapt ``model`` where its ``@adapter(lora, rank=, alpha=, dropout=, targets=[...])`` annotations
    say (spec 7.3.2), each with its own options: on the model, every linear module but the output
    layer; on a parameter or an instance (whose parameters all carry it), its linear weights; on a
    flow, the weights of the matmuls it computes (through the calls and stacks it makes). ``targets``
    name the parts of a packed weight (``q``, ``v`` of ``qkv``) or modules (``q_proj``); none: all.
    E047 for an annotation on no linear weight, a target it does not hold, or two that differ on one
    weight."""
    weights = {w.param: w for w in linear_weights(model, mapped_weights(model) + unmapped_weights(model))}
    plan: Plan = {}
    for attr, names, where in annotation_sites(model, weights):
        lora = annotation_lora(attr, seed)
        chosen = _site_parts([weights[n] for n in names if n in weights], attr, where)
        for name, shorts in chosen.items():
            for short in shorts:
                given = plan.setdefault(name, {}).setdefault(short, lora)
                if given != lora:
                    raise _annotation_error(f"{name} ({short}) is adapted by two @adapter annotations with "
                                            f"different options (rank {given.rank} and {lora.rank}, alpha "
                                            f"{given.alpha:g} and {lora.alpha:g}, ...)", where,
                                            "give the weight one @adapter")
    return apply_plan(model, weights, plan)


def annotation_sites(model: ModelOp, weights: dict[str, Weight]) -> list[tuple[AdapterAttr, list[str], object]]:
    """(annotation, the weights it is on, where it is written) for every ``@adapter(lora)``."""
    sites: list[tuple[AdapterAttr, list[str], object]] = []
    for attr in lora_annotations(annotations_of(model)):
        names = [n for n, w in weights.items() if not all(p.short in OUTPUT_MODULES for p in w.parts)]
        sites.append((attr, names, model.location))
    by_attr: dict[AdapterAttr, list[ParamOp]] = {}
    for param in model.params():
        for attr in lora_annotations(annotations_of(param)):
            by_attr.setdefault(attr, []).append(param)
    for attr, params in by_attr.items():  # an instance's annotation is on each of its parameters
        sites.append((attr, [p.sym_name.data for p in params], params[0].location))
    origins = weight_origins(model)
    for op in model.walk():
        if isinstance(op, (ParamOp, ModelOp)):
            continue
        for attr in lora_annotations(annotations_of(op)):
            read = [op.operands[1]] if op.name == "mdsl.graph.matmul" else list(op.operands)
            sites.append((attr, sorted({n for v in read for n in origins.get(v, ())}), op.location))
    return sites


def weight_origins(model: ModelOp) -> dict[SSAValue, set[str]]:
    """The parameters each value stands for: a ``param_ref``'s result, and the stack body and
    callee arguments it is passed on to."""
    funcs = {f.sym_name.data: f for f in model.funcs()}
    origins: dict[SSAValue, set[str]] = {}

    def follow(value: SSAValue, name: str) -> None:
        if name in origins.setdefault(value, set()):
            return
        origins[value].add(name)
        for use in value.uses:
            reader = weight_reader(use, funcs)
            if isinstance(reader, FuncOp):
                follow(reader.body.block.args[use.index], name)

    for ref in [r for r in model.walk() if isinstance(r, ParamRefOp)]:
        follow(ref.result, ref.param.root_reference.data)
    return origins


def unmapped_weights(model: ModelOp) -> list[Weight]:
    """The parameters ``hf_mapping`` does not fill, each one module named by the parameter
    (``blocks.{layer}.mlp.up_weight`` for a stack's)."""
    mapped = {w.param for w in mapped_weights(model)}
    per_layer = set()
    for stack in [op for op in model.walk() if isinstance(op, StackOp)]:
        per_layer |= {v.owner.param.root_reference.data for v in stack.per_layer if isinstance(v.owner, ParamRefOp)}
    found = []
    for param in model.params():
        name = param.sym_name.data
        shape = param.param_type.shape
        stacked = name in per_layer
        if name in mapped or len(shape) != (3 if stacked else 2):
            continue
        module = name.replace(".", ".{layer}.", 1) if stacked and "." in name else name
        found.append(Weight(name, (Part(module, Expr.const(0), Expr.of(shape[1 if stacked else 0])),), stacked))
    return found


def _site_parts(weights: list[Weight], attr: AdapterAttr, where: object) -> dict[str, set[str]]:
    """The parts an annotation adapts among its weights: those its targets name, else all."""
    if not weights:
        raise _annotation_error("@adapter(lora) is on no linear weight (a weight y = matmul(x, W, "
                                "transpose=NT) reads)", where,
                                "write it on a linear's flow, on the weight or its module instance, or on the model")
    targets = list(attr["targets"])
    if not targets:
        return {w.param: {p.short for p in w.parts} for w in weights}
    held = {p.short for w in weights for p in w.parts}
    short_of = {t: next((h for h in held if h in (t, canonical_target(t))), None) for t in targets}
    missing = [t for t, h in short_of.items() if h is None]
    if missing:
        raise _annotation_error(f"@adapter target '{missing[0]}' is no part of the weights it is on "
                                f"({', '.join(w.param for w in weights)})", where,
                                f"their parts: {', '.join(sorted(held))}")
    wanted = set(short_of.values())
    chosen = {w.param: {p.short for p in w.parts if p.short in wanted} for w in weights}
    return {k: v for k, v in chosen.items() if v}


def _annotation_error(message: str, where: object, hint: str) -> DiagnosticError:
    from modeldsl.ir import span_of_annotation

    return DiagnosticError([Diagnostic("E047", f"mdsl-adapters: {message}", span_of_annotation(where, "@adapter"),
                                       hint)])
