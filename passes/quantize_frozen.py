"""``mdsl-quantize-frozen``: the frozen linear weights stored in fp8 (or bf16), widened where a matmul reads them.

``mdsl-quantize-frozen{dtype=fp8_e4m3}`` stores every ``@frozen`` weight that only matmuls read
as their ``NT`` weight (``y = matmul(x, W, transpose=NT)``, through stacks and calls: the linear
modules :func:`~modeldsl.passes.adapters.linear_weights` finds; a LoRA model's frozen base, the
output layer included) in ``dtype``, as QLoRA holds its base:

- the parameter ``W`` takes the stored type (``tensor<[..., out, in], fp8_e4m3>``) and a
  ``quantized`` dictionary (``role = "data"``, ``dtype``, ``compute``: the dtype it was declared
  in and is read in, ``scale``: its scale's name); right after it ``W.scale``
  ``[..., out]`` fp32 is declared, ``@frozen``, with ``quantized = {role = "scale", data = W, dtype,
  granularity = "per_channel"}``: one scale per output channel, ``scale[o] = max|W[o, :]| / F``
  (``F = 448`` for e4m3, 57344 for e5m2; a row of zeros gets 1), ``W = q * scale`` up to the
  rounding of ``q`` (:func:`modeldsl.kernels.reference.quantize`, which the loader runs once on the
  checkpoint's values);
- each matmul reading ``W`` reads ``dequantize(W, W.scale, dtype=compute)`` instead, made right
  before it: inside a stack's body, so the widened weight is one layer's (the stack passes the
  scale as one more per-layer operand), and inside a helper the weight is passed to (it takes the
  scale as one more argument) unless the helper has a written backward, which reads the widened
  weight: then it is widened before the call. ``mdsl-lower-to-sched`` makes it the ``scale``
  operand of a GEMM that reads it as B (the GEMM widens the weight a tile at a time); for any other
  reader it is a transient that ``mdsl-plan-memory`` places like any other. It is marked
  ``@memory(recompute)``, so that a training step replays it in the backward instead of saving it
  (``mdsl-recompute``; its ``mode=none`` saves everything the backward reads, these widened weights
  too);
- ``dtype=bf16`` stores the weight in bf16 and reads it through ``cast(W, dtype=compute)``: no
  scale. The compute dtype of a bf16-declared weight is bf16 too: in a program of the declared
  dtypes the cast is the weight's own buffer (``mdsl-lower-to-sched`` launches nothing), in an
  fp32 one (``storage=fp32``) it widens the bf16 weight into an fp32 transient.

A stored parameter keeps its dtype in the ``params`` arena whatever the storage of a program
(``mdsl-lower-to-sched{storage=fp32}`` widens only the parameters stored as declared). Trainable
parameters (the adapters), the embedding (read by ``embedding``), norm weights and biases (not
matmul weights) and what is stored narrower already are left alone. No gradient flows into a
stored weight: ``dequantize`` has no VJP rule, and ``mdsl-autodiff`` gives what only frozen
parameters compute none. Run it after ``mdsl-adapters`` (an adapter's matmul reads the weight
itself, not its dequantized value). Patterns (``PATTERNS``): ``store`` (:class:`StoreParam`: the
declaration and its scale), ``refs`` (:class:`StoredRef`: a ``param_ref`` takes the stored type, and
reads the scale beside it), ``stacks`` (:class:`ThreadScale`: a stack's body takes the stored slice
and its scale), ``calls`` (:class:`ThreadIntoCall`: so does a helper without a written backward),
``widen`` (:class:`WidenForReader`: the ``dequantize`` or ``cast`` before a reader).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from xdsl.context import Context
from xdsl.dialects.builtin import ArrayAttr, DictionaryAttr, ModuleOp, StringAttr
from xdsl.ir import Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.pattern_rewriter import (
    GreedyRewritePatternApplier,
    PatternRewriter,
    PatternRewriteWalker,
    RewritePattern,
    op_type_rewrite_pattern,
)
from xdsl.rewriter import InsertPoint

from modeldsl.diagnostics import PassOptionError
from modeldsl.dialects.annotations import ANNOTATIONS_ATTR_NAME, FrozenAttr, MemoryAttr, annotations_of, is_frozen
from modeldsl.dialects.dtypes import DType
from modeldsl.dialects.graph import QUANTIZED_ATTR, CallOp, FuncOp, ModelOp, ParamOp, ParamRefOp, StackOp
from modeldsl.dialects.graph_types import TensorType
from modeldsl.graph_builder import GraphBuilder, op_attr
from modeldsl.ir import replace_with_twin
from modeldsl.passes.adapters import Weight, linear_weights

DTYPES: tuple[str, ...] = ("fp8_e4m3", "fp8_e5m2", "bf16")
SCALED: tuple[DType, ...] = (DType.FP8_E4M3, DType.FP8_E5M2)  # stored with a scale per output channel
SCALE_SUFFIX = ".scale"
GRANULARITY = "per_channel"


# ----------------------------------------------------------------------------- what is stored


def storable_weights(model: ModelOp) -> list[str]:
    """The parameters the pass stores narrower: ``@frozen``, float, of rank 2 or more (a stack's
    per-layer ones included), not an adapter nor stored already, and read only as a matmul's
    ``NT`` weight (through stacks and calls), in declaration order."""
    candidates = [p for p in model.params() if is_frozen(p) and not p.is_adapter and p.quantized is None
                  and p.param_type.dtype.is_float and len(p.param_type.shape) >= 2]
    return [w.param for w in linear_weights(model, [Weight(p.sym_name.data, (), False) for p in candidates])]


@dataclass(frozen=True)
class Stored:
    """A value that holds a stored weight (its parameter's ``param_ref``, or the stack body argument
    of its layer slice): its scale there (None for bf16), and the dtype it is read in."""

    scale: SSAValue | None
    compute: DType


@dataclass
class Plan:
    """What the patterns share: the parameters to store, and the values that hold them so far."""

    model: ModelOp
    dtype: DType
    targets: set[str]
    stored: dict[SSAValue, Stored] = field(default_factory=dict)
    scales: dict[tuple[str, int], int] = field(default_factory=dict)  # (stack body, argument) -> its scale's
    widened: dict[SSAValue, SSAValue] = field(default_factory=dict)  # stored value -> its dequantized one
    funcs: dict[str, FuncOp] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.funcs = {f.sym_name.data: f for f in self.model.funcs()}

    @property
    def scaled(self) -> bool:
        return self.dtype in SCALED


def _dictionary(values: dict[str, str]) -> DictionaryAttr:
    return DictionaryAttr({k: StringAttr(v) for k, v in values.items()})


# ----------------------------------------------------------------------------- patterns


class StoreParam(RewritePattern):
    """A weight to store: its stored type and ``quantized`` dictionary, and (fp8) its scale declared after it."""

    def __init__(self, plan: Plan):
        self.plan = plan

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: ParamOp, rewriter: PatternRewriter) -> None:
        name = op.sym_name.data
        if name not in self.plan.targets or op.quantized is not None:
            return
        declared: TensorType = op.param_type
        dtype = self.plan.dtype.value
        info = {"role": "data", "dtype": dtype, "compute": declared.dtype.value}
        if self.plan.scaled:
            scale = ParamOp(name + SCALE_SUFFIX, TensorType(list(declared.shape[:-1]), DType.FP32), [FrozenAttr.of()])
            scale.attributes[QUANTIZED_ATTR] = _dictionary({"role": "scale", "data": name, "dtype": dtype,
                                                            "granularity": GRANULARITY})
            rewriter.insert(scale, InsertPoint.after(op))
            info["scale"] = scale.sym_name.data
        op.param_type = declared.with_dtype(self.plan.dtype)
        op.attributes[QUANTIZED_ATTR] = _dictionary(info)
        rewriter.notify_op_modified(op)


class StoredRef(RewritePattern):
    """A ``param_ref`` of a stored weight takes its stored type; the scale's ``param_ref`` follows it."""

    def __init__(self, plan: Plan):
        self.plan = plan

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: ParamRefOp, rewriter: PatternRewriter) -> None:
        param = self.plan.model.lookup(op.param.root_reference.data)
        info = param.quantized if isinstance(param, ParamOp) else None
        if info is None or info["role"] != "data" or op.result in self.plan.stored:
            return
        scale = None
        if "scale" in info:
            scale_param = self.plan.model.lookup(info["scale"])
            scale_ref = ParamRefOp(info["scale"], scale_param.param_type)
            scale_ref.result.name_hint = _hint(op.result, "scale")
            rewriter.insert(scale_ref, InsertPoint.after(op))
            scale = scale_ref.result
        value = op.result if op.result.type == param.param_type else \
            rewriter.replace_value_with_new_type(op.result, param.param_type)
        value.name_hint = _hint(value, _stored_suffix(self.plan.dtype))
        self.plan.stored[value] = Stored(scale, DType(info["compute"]))
        rewriter.notify_op_modified(op)


class ThreadScale(RewritePattern):
    """A stack passing a stored weight: its body's argument takes the stored layer slice, and the
    scale comes in as one more per-layer operand (one body argument, shared by the stacks of that
    body)."""

    def __init__(self, plan: Plan):
        self.plan = plan

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: StackOp, rewriter: PatternRewriter) -> None:
        body = self.plan.funcs[op.body.root_reference.data]
        first = len(op.carried) + len(op.shared)
        stored = {first + i: v for i, v in enumerate(op.per_layer) if v in self.plan.stored}
        missing = thread(self.plan, body, stored, first + len(op.per_layer), _layer_slice, rewriter)
        if missing is None:
            return
        if not missing:
            rewriter.notify_op_modified(op)
            return
        new = StackOp(op.body.root_reference.data, op.count, list(op.carried), [*op.per_layer, *missing],
                      list(op.shared), [r.type for r in op.collected], op.reverse is not None)
        replace_with_twin(op, new, rewriter)


class ThreadIntoCall(RewritePattern):
    """A call passing a stored weight to a helper it alone calls, which has no written backward (that
    would read the widened weight): the helper's argument takes the stored type and the scale comes in
    as one more argument, so that the weight is widened right before the matmul inside it."""

    def __init__(self, plan: Plan):
        self.plan = plan

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: CallOp, rewriter: PatternRewriter) -> None:
        callee = self.plan.funcs[op.callee.root_reference.data]
        stored = {i: v for i, v in enumerate(op.arguments) if v in self.plan.stored}
        if not stored or not threadable(self.plan, callee):
            return
        missing = thread(self.plan, callee, stored, len(op.arguments), lambda t: t, rewriter)
        if missing is None:
            return
        if not missing:
            rewriter.notify_op_modified(op)
            return
        call = CallOp(op.callee.root_reference.data, [*op.arguments, *missing], [r.type for r in op.res])
        replace_with_twin(op, call, rewriter)


def threadable(plan: Plan, callee: FuncOp) -> bool:
    """Whether the stored weights a call passes go into ``callee`` (else they are widened before the call)."""
    name = callee.sym_name.data
    calls = [op for op in plan.model.walk() if isinstance(op, CallOp) and op.callee.root_reference.data == name]
    return "backward" not in callee.attributes and len(calls) == 1


def thread(plan: Plan, callee: FuncOp, stored: dict[int, SSAValue], passed: int, slice_of,
           rewriter: PatternRewriter) -> list[SSAValue] | None:
    """Give the arguments of ``callee`` numbered in ``stored`` (their operands) the stored type
    (``slice_of`` the operand's) and, for fp8, a scale argument each (appended, once per callee
    argument); the scales to append to the ``passed`` operands of the stack or call (``[]``: it
    passes them already), or None where nothing changed."""
    block = callee.body.block
    extra: dict[int, SSAValue] = {}
    changed = False
    for index, value in stored.items():
        arg, held = block.args[index], plan.stored[value]
        if arg.type != slice_of(value.type):
            arg = rewriter.replace_value_with_new_type(arg, slice_of(value.type))
            changed = True
        scale_arg = None
        if held.scale is not None:
            key = (callee.sym_name.data, index)
            if key not in plan.scales:
                new = rewriter.insert_block_argument(block, len(block.args), slice_of(held.scale.type))
                new.name_hint = f"{_base_hint(arg)}_scale"
                plan.scales[key] = new.index
                changed = True
            scale_arg = block.args[plan.scales[key]]
            extra[plan.scales[key]] = held.scale
        if arg not in plan.stored:
            plan.stored[arg] = Stored(scale_arg, held.compute)
            arg.name_hint = _hint(arg, _stored_suffix(plan.dtype))
            changed = True
    if changed:
        callee.function_type = type(callee.function_type).from_lists(
            [a.type for a in block.args], list(callee.function_type.outputs.data))
    missing = {k: v for k, v in extra.items() if k >= passed}
    if sorted(missing) != list(range(passed, passed + len(missing))) or passed + len(missing) != len(block.args):
        raise ValueError(f"mdsl-quantize-frozen: the callers of @{callee.sym_name.data} pass its weights unlike "
                         "each other")
    if not changed and not missing:
        return None
    return [missing[k] for k in sorted(missing)]


class WidenForReader(RewritePattern):
    """A matmul (its ``NT`` weight), or a call of a helper the weight cannot go into (one with a written
    backward, which reads the widened weight), reading a stored weight reads ``dequantize(W, scale)``
    (``cast(W)`` for bf16) in the compute dtype instead, made right before the first such reader of
    its block and marked ``@memory(recompute)``."""

    def __init__(self, plan: Plan):
        self.plan = plan

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> None:
        linear = op.name == "mdsl.graph.matmul" and op_attr(op, "transpose", "NN") == "NT"
        passes_on = isinstance(op, CallOp) and not threadable(self.plan, self.plan.funcs[op.callee.root_reference.data])
        if not (linear or passes_on):
            return
        indices = [i for i, v in enumerate(op.operands) if v in self.plan.stored and (isinstance(op, CallOp) or i == 1)]
        for index in indices:
            value = op.operands[index]
            wide = self.plan.widened.get(value)
            if wide is None or wide.owner.parent_block() is not op.parent_block():
                wide = self.widen(value, op, rewriter)
            op.operands[index] = wide
        if indices:
            rewriter.notify_op_modified(op)

    def widen(self, value: SSAValue, reader: Operation, rewriter: PatternRewriter) -> SSAValue:
        held = self.plan.stored[value]
        build = GraphBuilder.at(InsertPoint.before(reader), rewriter)
        if held.scale is not None:
            wide = build.one("dequantize", value, held.scale, dtype=held.compute)
        else:
            wide = build.one("cast", value, dtype=held.compute)
        kept = [a for a in annotations_of(wide.owner)]
        wide.owner.attributes[ANNOTATIONS_ATTR_NAME] = ArrayAttr([*kept, MemoryAttr.of(mode="recompute")])
        wide.name_hint = _base_hint(value)
        self.plan.widened[value] = wide
        return wide


def _stored_suffix(dtype: DType) -> str:
    """``fp8`` or ``bf16``: what the name of a stored weight's value ends in."""
    return "fp8" if dtype in SCALED else dtype.value


def _layer_slice(t: TensorType) -> TensorType:
    return t.with_shape(t.shape[1:])


def _base_hint(value: SSAValue) -> str | None:
    hint = value.name_hint
    for suffix in ("_fp8", "_bf16"):
        if hint is not None and hint.endswith(suffix):
            return hint.removesuffix(suffix)
    return hint


def _hint(value: SSAValue, suffix: str) -> str | None:
    base = _base_hint(value)
    return f"{base}_{suffix}" if base else None


PATTERNS: dict[str, tuple[type[RewritePattern], ...]] = {
    "store": (StoreParam,),
    "refs": (StoredRef,),
    "stacks": (ThreadScale,),
    "calls": (ThreadIntoCall,),
    "widen": (WidenForReader,),
}


# ----------------------------------------------------------------------------- the pass


@dataclass(frozen=True)
class QuantizeFrozenPass(ModulePass):
    """``mdsl-quantize-frozen``: see the module docstring."""

    name = "mdsl-quantize-frozen"

    dtype: str = "fp8_e4m3"

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise PassOptionError(f"mdsl-quantize-frozen: dtype={self.dtype} is not one of {', '.join(DTYPES)}",
                                  "dtype", "store the frozen base in fp8_e4m3 (a scale per output channel) or bf16")

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for model in [m for m in op.walk() if isinstance(m, ModelOp)]:
            quantize_frozen(model, self.dtype)


def quantize_frozen(model: ModelOp, dtype: str | DType) -> list[str]:
    """Store the frozen linear weights of ``model`` in ``dtype`` (see the module docstring), in
    place; the names of the weights stored."""
    targets = storable_weights(model)
    if not targets:
        return []
    plan = Plan(model, DType(dtype), set(targets))
    patterns: Sequence[RewritePattern] = [cls(plan) for group in PATTERNS.values() for cls in group]
    PatternRewriteWalker(GreedyRewritePatternApplier(list(patterns)), apply_recursively=True).rewrite_module(model)
    return targets
