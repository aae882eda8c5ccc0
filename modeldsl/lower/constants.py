"""Compile-time values: the top's configuration (integer parameters stay symbols in
shapes), ConstExprs, ``let:`` sections, ``if`` guards and inline conditionals, which
read integer config values at their configured values (recorded as ``baked``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from xdsl.dialects.builtin import (
    BoolAttr,
    FloatAttr,
    IntegerAttr,
    StringAttr,
    f64,
    i64,
)
from xdsl.ir import Attribute, SSAValue

from modeldsl.diagnostics import DiagnosticSink
from modeldsl.dialects.graph_types import TensorType
from modeldsl.frontend.text import ast
from modeldsl.instances import (
    Instance,
    LoweringFailed,
    ParamSlot,
)
from modeldsl.resolve.consts import ConstEnv, ConstError, NotConstant, evaluate, evaluate_let, guard_value
from modeldsl.resolve.order import expression_names
from modeldsl.resolve.scope import Scope
from modeldsl.symbolic import Expr


class ConstantsMixin:
    """Constants: configuration, ConstExpr evaluation, guards and the graph's constant scope."""

    def config_env(self, decl: ast.Decl, overrides: dict[str, Any]) -> tuple[ConstEnv, dict[str, Attribute]]:
        """Signature parameters: integers stay symbols in shapes; others take their values."""
        env = ConstEnv()
        attrs: dict[str, Attribute] = {}
        known: dict[str, Any] = {}  # configured values, for defaults such as d_model // num_heads
        for param in decl.params or []:
            if param.rest or param.name is None:
                continue
            value = overrides.get(param.name)
            if value is None and param.default is not None:
                try:
                    value = evaluate(param.default, ConstEnv(dict(known)))
                except (ConstError, NotConstant):
                    value = self.const(param.default, env)
                if isinstance(value, float) and type_name(param) == "int":
                    self.sink.error("E003", f"'{param.name}' is an int parameter, but its default is the float "
                                    f"{value!r}", param.default.span, "write an integer (or use // for division)")
                    raise LoweringFailed()
            if value is not None and not isinstance(value, Expr):
                known[param.name] = value
            if isinstance(value, bool):
                env.values[param.name] = value
                attrs[param.name] = BoolAttr.from_bool(value)
            elif isinstance(value, int) or value is None and type_name(param) == "int":
                env.values[param.name] = Expr.sym(param.name)
                if value is not None:
                    attrs[param.name] = IntegerAttr(value, i64)
            elif isinstance(value, float):
                env.values[param.name] = value
                attrs[param.name] = FloatAttr(value, f64)
            elif isinstance(value, str):
                env.values[param.name] = value
                attrs[param.name] = StringAttr(value)
            else:
                env.values[param.name] = Expr.sym(param.name)
        return env, attrs

    def const(self, node: ast.Expr, env: ConstEnv, context: str = "expression") -> Any:
        try:
            return evaluate(node, env, context)
        except NotConstant:
            self.sink.error("E026", f"the {context} is not known at compile time", node.span)
        except ConstError as err:
            self.sink.error(err.code, err.message, err.span, err.hint)
        raise LoweringFailed()

    def check_constraints_on_defaults(self, decl: ast.Decl, overrides: dict[str, Any]) -> None:
        """Constraints on config values wait for specialization, but the defaults
        (and given overrides) must already satisfy them: E027 now, not later."""
        values: dict[str, Any] = {}
        for param in decl.params or []:
            if param.name is None or param.rest:
                continue
            if param.name in overrides:
                values[param.name] = overrides[param.name]
            elif param.default is not None:
                try:
                    values[param.name] = evaluate(param.default, ConstEnv(dict(values)))
                except (ConstError, NotConstant):
                    continue
        self.concrete = {k: v for k, v in values.items() if isinstance(v, int) and not isinstance(v, bool)}
        if not values:
            return
        scratch = DiagnosticSink()
        env = ConstEnv(values)
        for section in decl.sections("let"):
            evaluate_let(section, env, scratch)
        for diagnostic in scratch.diagnostics:
            if diagnostic.code == "E027":
                self.sink.add(diagnostic)

    def namespace_of(self, decl: ast.Decl) -> dict[str, ast.Decl]:
        return self.resolved.namespace_of(decl) if self.resolved is not None else self.decls

    def guard(self, condition: ast.Expr, env: ConstEnv) -> bool | None:
        """An ``if`` guard. Integer config values are symbols in shapes, but a guard
        needs their configured value: ``if sliding_window > 0`` picks a branch
        for this configuration (lowering again with another config may pick the other)."""
        return guard_value(condition, self.concretized(env, condition), self.sink)

    def concretized(self, env: ConstEnv, node: ast.Expr) -> ConstEnv:
        """``env`` with integer config values at their configured values (recorded as
        baked when ``node`` reads them), for what needs a number now: a guard, a float
        parameter such as ``scale(1.0 / sqrt(d_head))``, an annotation argument."""
        concrete = ConstEnv(parent=env, tensors=set(env.tensors), sizes=set(env.sizes))
        used = expression_names(node)
        scope: ConstEnv | None = env
        while scope is not None:
            for name, value in scope.values.items():
                if name not in concrete.values and isinstance(value, Expr):
                    concrete.values[name] = concretize(value, self.concrete)
                    if name in used:
                        self.baked |= value.symbols() & self.concrete.keys()
            scope = scope.parent
        return concrete

    def evaluate_let(self, instance: Instance) -> None:
        for section in instance.decl.sections("let"):
            evaluate_let(section, instance.env, self.sink, self.chosen)

    def chosen(self, node: ast.Expr, env: ConstEnv) -> ast.Expr:
        """The branch of an inline conditional ``a if cond else b`` (spec 5.8) its guard picks
        (a guard: integer config values at their configured values)."""
        while isinstance(node, ast.Conditional):
            taken = self.guard(node.condition, env)
            if taken is None:
                raise LoweringFailed()  # reported
            node = node.then if taken else node.orelse
        return node

    def chosen_args(self, args: list[ast.Arg], instance: Instance, scope: Scope) -> list[ast.Arg]:
        return [replace(a, value=self.chosen(a.value, self.graph_env(instance, scope)))
                if isinstance(a.value, ast.Conditional) else a for a in args]

    def graph_env(self, instance: Instance, scope: Scope) -> ConstEnv:
        """The instance's constants, knowing which names are tensors and sizes (E016). An
        optional input is known at compile time to be given or not: ``if bias:`` tests that."""
        env = instance.env.child()
        env.tensors = set(scope.visible_names()) | {n for n, p in instance.params.items() if isinstance(p, ParamSlot)}
        env.sizes = _shape_symbols(scope)
        for name in scope.visible_names():
            binding = scope.find(name)
            if binding.kind in ("none", "optional"):
                env.values[name] = binding.kind == "optional"
        return env


def concretize(value: Expr, concrete: dict[str, int]) -> Any:
    """A symbolic value with configured integers substituted (an int when fully known)."""
    result = value.subs(concrete)
    known = result.const_value()
    return known if known is not None else result


def type_name(param: ast.Param) -> str | None:
    return param.type.id if isinstance(param.type, ast.Name) else None


def _shape_symbols(scope: Scope) -> set[str]:
    """The dimension symbols in the types of the tensors a scope sees."""
    symbols: set[str] = set()
    for name in scope.visible_names():
        found = scope.find(name)
        if found is not None and isinstance(found.value, SSAValue) and isinstance(found.value.type, TensorType):
            for dim in found.value.type.shape:
                if isinstance(dim, Expr):
                    symbols |= dim.symbols()
    return symbols
