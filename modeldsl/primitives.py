"""The primitives the DSL can call, with their signatures read off the graph ops.

Each ``mdsl.graph`` primitive op already declares, in IRDL, its operands
(tensor inputs, in order, some optional or variadic), its results and its
attributes with their defaults. This module derives the DSL view of the same
facts (the signature is read off the op, never written twice) and converts DSL
argument values into the op's attributes. Everything else known about a
primitive (its shape rule, VJP rule, FLOPs, scratch, in-place reuse,
inference parameters, the kernels it must have) is its record in
:mod:`modeldsl.prims`, keyed by the same op class; its kernels are in
:mod:`modeldsl.kernels` under its name.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

from xdsl.dialects.builtin import DenseArrayBase, FloatAttr, IntegerAttr, IntegerType, StringAttr, i64
from xdsl.ir import Attribute, Operation
from xdsl.irdl import OptOperandDef, OptResultDef, VarOperandDef, VarResultDef

from modeldsl.dialects.graph_custom import CustomOp
from modeldsl.dialects.graph_primitives import (
    PRIMITIVE_OPS,
    OrSymbolic,
    PrimitiveOp,
    bool_attr,
    float_attr,
    int_attr,
)
from modeldsl.dialects.graph_types import DimsAttr, SymbolicAttr
from modeldsl.symbolic import Expr, SymbolicError, star_axes
from modeldsl.symbolic_scalar import ScalarExpr


@dataclass(frozen=True)
class TensorSlot:
    """A tensor input or output of a primitive."""

    name: str
    optional: bool = False
    variadic: bool = False
    # passed by keyword, written under params: (spec 6.4.1's alibi_slopes: [H]? = None)
    keyword: bool = False


@dataclass(frozen=True)
class ParamSpec:
    """A compile-time parameter: kind is float, int, bool, enum, dims or ints. A ``symbolic`` one
    may be an expression of symbols without a value yet (a ``#mdsl.graph.sym``, bound by
    ``mdsl-specialize``): ``scale(1.0 / sqrt(d_head))``, ``moe_compute_offsets(num_experts)``."""

    name: str
    kind: str
    default: Any = None
    required: bool = False
    choices: tuple[str, ...] = ()
    symbolic: bool = False

    def python_value(self, value: Any) -> Any:
        """A list of integers written as sizes (``dims=[0, 1]``) becomes plain ints."""
        if self.kind == "ints" and isinstance(value, (list, tuple)):
            return [v.const_value() if isinstance(v, Expr) and v.is_const() else v for v in value]
        return value

    def to_attribute(self, value: Any) -> Attribute:
        """The op attribute for a DSL value; ValueError with a message when it does not fit."""
        if self.kind == "enum":
            text = str(value)
            if text not in self.choices:
                raise ValueError(f"'{text}' is not one of {', '.join(self.choices)}")
            return StringAttr(text)
        if self.kind == "bool":
            if not isinstance(value, bool):
                raise ValueError(f"expects true or false, got {value!r}")
            return bool_attr(value)
        if self.kind in ("float", "int") and isinstance(value, (Expr, ScalarExpr)):
            return self.symbolic_attribute(value)
        if self.kind == "float":
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"expects a number, got {value!r}")
            return float_attr(value)
        if self.kind == "int":
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"expects an integer, got {value!r}")
            return int_attr(value)
        if self.kind == "ints":
            value = self.python_value(value)
            if not isinstance(value, (list, tuple)) or not all(
                isinstance(v, int) and not isinstance(v, bool) for v in value
            ):
                raise ValueError(f"expects a list of integers, got {value!r}")
            return DenseArrayBase.from_list(i64, list(value))
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"expects a list of sizes, got {value!r}")
        if any(isinstance(v, ScalarExpr) for v in value):
            raise ValueError(f"expects a list of sizes, got {', '.join(map(str, value))}")
        try:
            return DimsAttr.from_list([Expr.of(v) if not isinstance(v, Expr) else v for v in value])
        except SymbolicError as err:
            raise ValueError(str(err)) from None


    def symbolic_attribute(self, value: Expr | ScalarExpr) -> Attribute:
        """A value computed from symbols without a value yet (``1.0 / sqrt(d_head)``): the plain
        attribute where it is known after all, a ``#mdsl.graph.sym`` where the op takes one."""
        expr = ScalarExpr.of(value)
        if not expr.symbols():
            return self.to_attribute(expr.value)
        if self.kind == "int" and not expr.is_int():
            raise ValueError(f"expects an integer, got the float expression '{expr}'")
        if self.kind == "int" and expr.as_dim() is None:
            raise ValueError(f"expects an integer, got '{expr}', which is no size expression")
        if not self.symbolic:
            unbound = ", ".join(f"'{name}'" for name in sorted(expr.symbols()))
            raise ValueError(f"expects {'an integer' if self.kind == 'int' else 'a number'} known when the "
                             f"program is lowered, got '{expr}' ({unbound} has no value here)")
        return SymbolicAttr(expr, "i64" if self.kind == "int" else "f64")


# Outputs that hold statistics a forward saves for its backward (spec 6.2, 6.4):
# a flow may leave them unnamed, and a chained stage passes on only the others.
STATISTICS = frozenset({"rstd", "mean", "lse", "q_rstd", "k_rstd"})


@dataclass(frozen=True)
class PrimitiveSignature:
    name: str
    op: type[PrimitiveOp]
    inputs: tuple[TensorSlot, ...]
    outputs: tuple[TensorSlot, ...]
    params: tuple[ParamSpec, ...]

    def param(self, name: str) -> ParamSpec | None:
        return next((p for p in self.params if p.name == name), None)

    def group_operands(self, values: Sequence[Any], absent: Collection[int] = ()) -> list[Any]:
        """Operands given in order, one entry per input slot (see :func:`distribute`);
        ``absent`` names optional slots known to be empty (a later optional is present)."""
        return distribute(self.name, self.inputs, values, "tensor input", absent)

    def absent_inputs(self, op: Operation) -> tuple[int, ...]:
        """The optional input slots of graph op ``op`` that are empty where grouping its
        operands in order would fill them (an absent bias before a present state)."""
        if not any(slot.optional for slot in self.inputs):
            return ()
        present = [getattr(op, slot.name) is not None for slot in self.inputs]
        optional = [i for i, slot in enumerate(self.inputs) if slot.optional]
        empty = [i for i in optional if not present[i]]
        if empty and any(present[i] for i in optional if i > empty[0]):
            return tuple(empty)
        return ()

    @property
    def custom(self) -> bool:
        """A user primitive (:mod:`modeldsl.prims.user`): every call is an ``mdsl.graph.custom`` op."""
        return self.op is CustomOp

    def make(self, operands: Sequence[Any], result_types: Sequence[Any],
             attributes: dict[str, Attribute] | None = None) -> Operation:
        """The op of a call: one entry per input slot and output slot (as :meth:`group_operands`
        and :meth:`group_results` give them) and the parameters' attributes. A user primitive's
        call is ``mdsl.graph.custom "name"`` with every parameter written out (defaults too)."""
        if not self.custom:
            return self.op.make(operands, result_types, attributes)
        attrs = {p.name: p.to_attribute(p.default) for p in self.params if not p.required and p.default is not None}
        attrs.update(attributes or {})
        flat = [v for entry in operands for v in (entry if isinstance(entry, (list, tuple)) else [entry])
                if v is not None]
        types = [t for entry in result_types for t in (entry if isinstance(entry, (list, tuple)) else [entry])]
        return CustomOp.make_custom(self.name, flat, types, attrs)

    @property
    def positional_inputs(self) -> tuple[TensorSlot, ...]:
        """The tensor inputs a flow passes in its tuple (the ``in:`` of a declaration)."""
        return tuple(s for s in self.inputs if not s.keyword)

    @property
    def keyword_inputs(self) -> tuple[TensorSlot, ...]:
        """Optional tensor inputs passed by keyword (declared under ``params:``)."""
        return tuple(s for s in self.inputs if s.keyword)

    def group_results(self, types: Sequence[Any]) -> list[Any]:
        """Result types given in order, one entry per output slot."""
        return distribute(self.name, self.outputs, types, "result")

    @property
    def reference(self):
        """The numpy reference kernel, from the primitive's entry in :mod:`modeldsl.kernels.registry`."""
        from modeldsl.kernels.registry import entry

        return entry(self.name).reference

    @property
    def primary_outputs(self) -> int:
        """How many leading outputs are not statistics (``rmsnorm -> y`` leaves ``rstd`` unnamed)."""
        return sum(1 for slot in self.outputs if slot.name not in STATISTICS)

    @property
    def is_backward(self) -> bool:
        return self.name.endswith("_backward") or self.name.endswith("_weight_grad")


def distribute(op_name: str, slots: Sequence[TensorSlot], values: Sequence[Any], what: str,
               absent: Collection[int] = ()) -> list[Any]:
    """Distribute values given in order over slots: a required slot takes one, an
    optional slot takes one while there are spare values (in slot order), a
    variadic slot takes the rest. One entry per slot (None for an absent optional);
    the slots in ``absent`` take nothing."""
    if absent:
        kept = iter(distribute(op_name, [s for i, s in enumerate(slots) if i not in absent], values, what))
        return [None if i in absent else next(kept) for i in range(len(slots))]
    required = sum(1 for s in slots if not (s.optional or s.variadic))
    spare = len(values) - required
    if spare < 0 or (spare and not any(s.optional or s.variadic for s in slots)):
        raise ValueError(f"{op_name} takes {required} {what}(s), got {len(values)}")
    grouped, rest = [], list(values)
    for index, slot in enumerate(slots):
        if slot.variadic:
            later = sum(1 for s in slots[index + 1 :] if not (s.optional or s.variadic))
            take = len(rest) - later
            grouped.append(rest[:take])
            rest = rest[take:]
        elif slot.optional and spare <= 0:
            grouped.append(None)
        else:
            spare -= slot.optional
            grouped.append(rest.pop(0))
    return grouped


def _slot(name: str, definition: Any, optional_types: tuple, variadic_types: tuple) -> TensorSlot:
    optional = isinstance(definition, optional_types)
    variadic = isinstance(definition, variadic_types) and not optional
    return TensorSlot(name, optional, variadic)


def _python_default(attr: Attribute | None) -> Any:
    if isinstance(attr, StringAttr):
        return attr.data
    if isinstance(attr, FloatAttr):
        return attr.value.data
    if isinstance(attr, IntegerAttr):
        if isinstance(attr.type, IntegerType) and attr.type.width.data == 1:
            return bool(attr.value.data)
        return attr.value.data
    return None


def _param_kind(op: type[PrimitiveOp], name: str, definition: Any) -> str:
    if name in op.ENUMS:
        return "enum"
    default = definition.default_value
    if isinstance(default, IntegerAttr) and isinstance(default.type, IntegerType) and default.type.width.data == 1:
        return "bool"
    base = getattr(definition.constr, "attr", None)
    for cls, kind in ((FloatAttr, "float"), (IntegerAttr, "int"), (DenseArrayBase, "ints"), (DimsAttr, "dims"),
                      (StringAttr, "enum")):
        if base is cls or isinstance(default, cls):
            return kind
    raise AssertionError(f"cannot tell the kind of {op.name}.{name}")


def signature_of(op: type[PrimitiveOp]) -> PrimitiveSignature:
    definition = op.get_irdl_definition()
    inputs = tuple(_slot(n, d, (OptOperandDef,), (VarOperandDef,)) for n, d in definition.operands)
    inputs = tuple(replace(s, keyword=s.name in op.KEYWORD_OPERANDS) for s in inputs)
    outputs = tuple(_slot(n, d, (OptResultDef,), (VarResultDef,)) for n, d in definition.results)
    params = []
    for name, attr_def in definition.attributes.items():
        if name == "annotations":
            continue
        default = attr_def.default_value
        optional = type(attr_def).__name__.startswith("Opt")
        params.append(ParamSpec(
            name,
            _param_kind(op, name, attr_def),
            _python_default(default),
            required=default is None and not optional,
            choices=op.ENUMS.get(name, ()),
            symbolic=isinstance(attr_def.constr, OrSymbolic),
        ))
    return PrimitiveSignature(op.name.removeprefix("mdsl.graph."), op, inputs, outputs, tuple(params))


# the user primitives (modeldsl.register_primitive), by their registered names; filled by
# modeldsl.prims.user, which keeps every table of a user primitive
USER_SIGNATURES: dict[str, PrimitiveSignature] = {}


@lru_cache(maxsize=1)
def builtin_primitives() -> dict[str, PrimitiveSignature]:
    """Every ``mdsl.graph`` primitive op by its DSL name (``matmul``, ``rmsnorm_backward``, ...)."""
    return {sig.name: sig for sig in map(signature_of, PRIMITIVE_OPS)}


def primitives() -> dict[str, PrimitiveSignature]:
    """Every primitive by its DSL name: the ops', then the user primitives registered in this process."""
    return {**builtin_primitives(), **USER_SIGNATURES} if USER_SIGNATURES else builtin_primitives()


def primitive_name(op: Operation) -> str:
    """The primitive a graph op runs: its op name without ``mdsl.graph.``, or the callee of an
    ``mdsl.graph.custom`` (a user primitive's registered name)."""
    return op.primitive if isinstance(op, CustomOp) else op.name.removeprefix("mdsl.graph.")


def signature_of_op(op: Operation) -> PrimitiveSignature | None:
    """The signature of the primitive graph op ``op`` runs (None for a structure op, or a custom op
    of a primitive not registered in this process)."""
    if isinstance(op, CustomOp):
        return USER_SIGNATURES.get(op.primitive)
    sig = builtin_primitives().get(op.name.removeprefix("mdsl.graph."))
    return sig if sig is not None and sig.op.name == op.name else None


# reductions whose dims index the operand's type, where a leading '*' is one dim (spec 10.2's Linear
# writes its bias gradient over [*, out_dim] as reduce_sum(dims=[0]))
STAR_REDUCTIONS = {"reduce_sum", "reduce_mean", "reduce_max"}


def star_reduction(params: dict[str, Any], typed_rank: int, rank: int) -> dict[str, Any]:
    """A reduction's parameters for a value of rank ``rank`` typed ``[*, ...]`` with ``typed_rank``
    dims: ``*`` is all the leading axes it stands for (ValueError where ``reduce_max``'s one
    ``dim`` would be several axes)."""
    if "dims" in params:
        return {**params, "dims": star_axes(list(params["dims"]), typed_rank, rank)}
    axes = star_axes([params["dim"]], typed_rank, rank)
    if len(axes) != 1:
        raise ValueError(f"reduce_max(dim={params['dim']}) over '*', which stands for {len(axes)} axes here")
    return {**params, "dim": axes[0]}


def lookup_primitive(name: str) -> PrimitiveSignature | None:
    return primitives().get(name)
