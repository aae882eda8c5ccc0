"""``mdsl-specialize``: bind symbolic dimensions and config values to integers.

``mdsl-specialize{B=2 T=64}`` binds the batch and sequence symbols;
``mdsl-specialize{hf="DIR"}`` takes them from a checkpoint's config.json
(through the model's ``hf_config``).
Bindings are checked where the pass is made (``__post_init__``: a value that is
not an integer or a boolean, or a size that is not positive, is a
``PassOptionError`` at the option). ``mdsl-specialize{d_model=64 n_layers=2}`` overrides integer config values
that only shapes use (the model's ``config`` is updated); values that
lowering fixed into attributes or ``if`` choices (the model's ``baked``
list), and float or boolean ones, can only change by lowering again. Every config integer of the model is bound
too, so afterwards shapes are concrete wherever all their symbols are known
and the verifiers check them exactly. Symbols left unbound stay symbolic.

Shapes in types, ``#mdsl.graph.dims`` and ``#mdsl.graph.expr`` attributes
(split sizes, view shapes, stack counts) are all rewritten by one type
conversion pattern.

A primitive's parameter computed from symbols without a value
(``#mdsl.graph.sym<1.0 / sqrt(d_head) : f64>``, the lowering's
``scale(1.0 / sqrt(d_head))``) is evaluated once its symbols are bound, to the
attribute the op expects (``FloatAttr``, ``IntegerAttr``), and the op is
verified again with it (``moe_compute_offsets`` with ``num_experts=0`` is E029
here); one with a symbol left unbound stays symbolic, and ``mdsl-lower-to-sched``
refuses it (E029). Its value follows the ConstExpr rules: a division by zero or
``sqrt`` of a negative number is E026.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from xdsl.context import Context
from xdsl.dialects.builtin import DictionaryAttr, FloatAttr, IntegerAttr, ModuleOp, i64
from xdsl.ir import Attribute
from xdsl.passes import ModulePass
from xdsl.pattern_rewriter import PatternRewriteWalker, TypeConversionPattern
from xdsl.utils.arg_spec import ArgSpec
from xdsl.utils.exceptions import VerifyException

from modeldsl.diagnostics import Diagnostic, DiagnosticError, PassOptionError
from modeldsl.dialects.graph import ModelOp
from modeldsl.dialects.graph_types import DimsAttr, ExprAttr, SymbolicAttr, TensorType
from modeldsl.ir import span_of_location
from modeldsl.symbolic import STAR, Expr, SymbolicError


class BindSymbols(TypeConversionPattern):
    """Substitute bound symbols in tensor types, dims and expr attributes."""

    def __init__(self, bindings: Mapping[str, int]):
        super().__init__(recursive=True)
        self.bindings = dict(bindings)

    def dim(self, dim):
        return dim if dim is STAR else dim.subs(self.bindings)

    def convert_type(self, typ: Attribute, /) -> Attribute | None:
        if isinstance(typ, TensorType):
            return TensorType([self.dim(d) for d in typ.shape], typ.dtype)
        if isinstance(typ, DimsAttr):
            return DimsAttr(tuple(self.dim(d) for d in typ.data))
        if isinstance(typ, ExprAttr):
            return ExprAttr(typ.data.subs(self.bindings))
        return None


@dataclass(frozen=True)
class SpecializePass(ModulePass):
    """Options are ``name=value`` pairs: symbols (``B``, ``T``) or config names."""

    name = "mdsl-specialize"

    bindings: tuple[tuple[str, Any], ...] = field(default=())
    hf: str | None = None

    def __post_init__(self) -> None:
        for key, value in self.bindings:
            _check_binding(key, value)
        if self.hf is not None and not isinstance(self.hf, str):
            raise PassOptionError(f"mdsl-specialize: hf={self.hf} is not a folder", "hf", 'hf="DIR"')

    @classmethod
    def from_spec(cls, spec: ArgSpec) -> "SpecializePass":
        pairs, hf = [], None
        for key, values in spec.normalize_parameter_names().parameters.items():
            if key == "hf" and len(values) == 1 and isinstance(values[0], str):
                hf = values[0]
            else:
                pairs.append((key, values[0] if len(values) == 1 else tuple(values)))
        return cls(tuple(pairs), hf)

    @classmethod
    def of(cls, **bindings: Any) -> "SpecializePass":
        return cls(tuple(bindings.items()))

    def spec(self, *, include_default: bool = False) -> ArgSpec:
        """As the pipeline spells it: ``mdsl-specialize{B=2 T=16 hf="DIR"}``."""
        args = {key: (value,) for key, value in self.bindings}
        if self.hf is not None:
            args["hf"] = (self.hf,)
        return ArgSpec(self.name, args)

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for model in [m for m in op.walk() if isinstance(m, ModelOp)]:
            bindings = dict(self.bindings)
            if self.hf is not None:
                bindings = {**hf_bindings(model, self.hf), **bindings}
            specialize_model(model, bindings)


def hf_bindings(model: ModelOp, directory: str) -> dict[str, Any]:
    """The model's config values as a checkpoint's config.json gives them (through hf_config)."""
    from modeldsl.hf.config import check_lists, list_fields, model_rules, read_config
    from modeldsl.hf.safetensors_io import CheckpointError

    rules = {name: rule for name, rule in model_rules(model).items() if name in model.config_values}
    try:
        hf = read_config(directory)
        check_lists(hf, rules, list_fields(rules))
    except CheckpointError as err:
        raise DiagnosticError([Diagnostic(err.code, err.message, None, err.hint)]) from None
    given = {name: hf[rule.field] if rule.index is None or hf[rule.field] is None else hf[rule.field][rule.index]
             for name, rule in rules.items() if rule.field in hf}
    nulls = sorted(rules[name].shown for name, value in given.items() if value is None)
    if nulls:
        raise DiagnosticError([Diagnostic(
            "E030", f"mdsl-specialize{{hf}}: config.json sets {', '.join(nulls)} to null", None,
            "what null means is a rule of the model's hf_config; lower the model with the checkpoint instead: "
            "mdsl-opt MODEL.module --hf DIR (or modeldsl.load)")])
    return given


def specialize_model(model: ModelOp, bindings: dict[str, Any]) -> None:
    config = model.config_values
    baked = {a.data for a in model.attributes["baked"].data} if "baked" in model.attributes else set()
    overrides = {k: v for k, v in bindings.items() if k in config and _value_of(config[k]) != v}
    fixed = sorted(k for k in overrides if k in baked or not _is_int(config[k]))
    if fixed:
        raise DiagnosticError([Diagnostic(
            "E029", f"mdsl-specialize: {', '.join(fixed)} was fixed when @{model.sym_name.data} was lowered",
            None, "lower the model with this configuration instead: mdsl-opt --hf DIR (or modeldsl.load) "
                  "lowers it with the checkpoint's config")])
    for name, value in overrides.items():
        config[name] = _config_attribute(name, value)
    if overrides:
        model.config = DictionaryAttr(config)
    integers = {k: v.value.data for k, v in config.items() if _is_int(v)}
    symbols = {k: v for k, v in bindings.items() if k not in config}
    for name, value in symbols.items():
        _check_size(name, value)
    unknown = sorted(set(symbols) - _symbols_of(model))
    if unknown:
        symbols_of_model = ", ".join(sorted(_symbols_of(model))) or "none"
        raise DiagnosticError([Diagnostic(
            "E029", f"mdsl-specialize: {', '.join(unknown)} is neither a config value nor a symbol of "
            f"@{model.sym_name.data}", None,
            "config: " + (", ".join(config) or "none") + "; symbols: " + symbols_of_model,
        )])
    PatternRewriteWalker(BindSymbols({**integers, **symbols}), apply_recursively=False).rewrite_module(model)
    bind_attributes(model, {**integers, **symbols})


def bind_attributes(model: ModelOp, bindings: dict[str, int]) -> None:
    """Evaluate every ``#mdsl.graph.sym`` parameter whose symbols are bound, and verify its op again."""
    for op in model.walk():
        changed = []
        for name, attr in list(op.attributes.items()):
            if not isinstance(attr, SymbolicAttr) or not attr.expr.symbols() & bindings.keys():
                continue
            given = _given(attr, bindings)
            try:
                op.attributes[name] = attr.bind(bindings)
            except SymbolicError as err:
                raise DiagnosticError([Diagnostic(
                    "E026", f"mdsl-specialize: {_op_name(op)}'s {name} = {attr.expr} has no value with {given}: {err}",
                    span_of_location(op.location), "bind sizes for which the parameter has a value")]) from None
            changed.append(f"{name} = {attr.expr} ({given})")
        if changed:
            try:
                op.verify_()
            except VerifyException as err:
                raise DiagnosticError([Diagnostic(
                    "E029", f"mdsl-specialize: {_op_name(op)} with {', '.join(changed)} does not verify: {err}",
                    span_of_location(op.location), "bind values the primitive takes")]) from None


def require_bound_attributes(model: ModelOp, pass_name: str) -> None:
    """E029 at the first op of ``model`` with a ``#mdsl.graph.sym`` parameter: ``pass_name`` needs its
    value (kernels and executors only ever see concrete parameters)."""
    for op in model.walk():
        for name, attr in op.attributes.items():
            if isinstance(attr, SymbolicAttr):
                unbound = sorted(attr.expr.symbols())
                raise DiagnosticError([Diagnostic(
                    "E029", f"{pass_name}: {_op_name(op)}'s {name} is {attr.expr}, which needs "
                    f"{', '.join(unbound)} bound", span_of_location(op.location),
                    "bind " + ("it" if len(unbound) == 1 else "them") + " first: mdsl-specialize{"
                    + " ".join(f"{n}=..." for n in unbound) + "}")])


def _op_name(op) -> str:
    return op.name.removeprefix("mdsl.graph.")


def _given(attr: SymbolicAttr, bindings: dict[str, int]) -> str:
    return " ".join(f"{name}={bindings[name]}" for name in sorted(attr.expr.symbols() & bindings.keys()))


def _is_bool(attr: IntegerAttr) -> bool:
    return attr.type.width.data == 1


def _is_int(attr: Attribute) -> bool:
    return isinstance(attr, IntegerAttr) and not _is_bool(attr)


def _value_of(attr: Attribute) -> Any:
    if isinstance(attr, IntegerAttr):
        return bool(attr.value.data) if _is_bool(attr) else attr.value.data
    return attr.value.data if isinstance(attr, FloatAttr) else None


def _check_binding(name: str, value: Any) -> None:
    """A binding is a boolean (a config flag) or a size: PassOptionError naming it otherwise."""
    if isinstance(value, bool):
        return
    if not isinstance(value, int):
        given = " ".join(map(str, value)) if isinstance(value, tuple) else value
        raise PassOptionError(f"mdsl-specialize: {name}={given} is not an integer or a boolean", name,
                              "bind integers (B=2 T=64 d_model=64); float config values change by lowering again")
    if not 0 < value < 2**63:
        raise PassOptionError(f"mdsl-specialize: {name}={value} is not a positive integer that fits in 64 bits",
                              name, "sizes are positive: B=2 T=64")


def _check_size(name: str, value: Any) -> None:
    """Symbols and the config integers shapes use bind to positive integers that fit in i64."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise DiagnosticError([Diagnostic("E029", f"mdsl-specialize: {name} is an integer, got {value!r}", None,
                                          "bind integers: B=2 T=64 d_model=64")])
    if not 0 < value < 2**63:
        raise DiagnosticError([Diagnostic("E029", f"mdsl-specialize: {name}={value} is not a positive integer "
                                          "that fits in 64 bits", None, "sizes are positive: B=2 T=64")])


def _config_attribute(name: str, value: Any) -> Attribute:
    _check_size(name, value)
    return IntegerAttr(value, i64)


def _symbols_of(model: ModelOp) -> set[str]:
    """Every symbol in the model's tensor types and shape attributes."""
    found: set[str] = set()

    def visit(attr: Attribute) -> None:
        if isinstance(attr, TensorType):
            for d in attr.shape:
                if d is not STAR:
                    found.update(d.symbols())
        elif isinstance(attr, DimsAttr):
            for d in attr.data:
                if isinstance(d, Expr):
                    found.update(d.symbols())
        elif isinstance(attr, ExprAttr):
            found.update(attr.data.symbols())
        elif isinstance(attr, SymbolicAttr):
            found.update(attr.expr.symbols())
        for child in getattr(attr, "parameters", ()) or ():
            if isinstance(child, Attribute):
                visit(child)
        if hasattr(attr, "data") and isinstance(attr.data, (tuple, list)):
            for child in attr.data:
                if isinstance(child, Attribute):
                    visit(child)

    for op in model.walk():
        for value in [*op.results, *(a for r in op.regions for b in r.blocks for a in b.args)]:
            visit(value.type)
        for attr in [*op.attributes.values(), *op.properties.values()]:
            visit(attr)
    return found
