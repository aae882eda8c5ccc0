"""Compile-time expressions (ConstExpr, spec 3.7): evaluation, `let:` bindings, constraints.

A ConstExpr is built from literals, module/model parameters, `let`-bound
names, arithmetic, comparisons, boolean operators and the pure intrinsics
``sqrt``, ``ceil_div``, ``min``, ``max``, ``abs``, ``int`` (a number
truncated toward zero, as Python's: Phi-3's ``int(head_dim *
partial_rotary_factor)``). Integer parameters whose value is not fixed yet
(a model's config, bound later from a HuggingFace config) are symbols, so
``d_model // num_heads`` evaluates to a symbolic dimension (:class:`modeldsl.symbolic.Expr`).

:func:`symbolic` evaluates a primitive's parameter where some integer has no
value yet (a module parameter without a default, a tensor size such as ``B``):
it gives a :class:`modeldsl.symbolic_scalar.ScalarExpr` (``1.0 / sqrt(d_head)``)
that ``mdsl-specialize`` evaluates once they are bound.

Errors are coded diagnostics: E002 for an undefined name, E016 when an `if`
guard depends on a tensor, E026 for a constraint that is not a boolean
ConstExpr, E027 for a violated constraint (with the user's message).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from modeldsl.diagnostics import DiagnosticSink, Span
from modeldsl.frontend.text import ast
from modeldsl.frontend.text.ast import I64_MAX
from modeldsl.primitives import lookup_primitive
from modeldsl.symbolic import Expr, SymbolicError
from modeldsl.symbolic_scalar import ScalarExpr

Value = Any  # int | float | bool | str | None | Expr (symbolic integer)


class ConstError(Exception):
    """A ConstExpr that cannot be evaluated; carries the diagnostic to report."""

    def __init__(self, code: str, message: str, span: Span | None, hint: str = ""):
        super().__init__(message)
        self.code, self.message, self.span, self.hint = code, message, span, hint


class NotConstant(Exception):
    """The value depends on something not known yet (a symbol in a comparison)."""


@dataclass
class ConstEnv:
    """Names visible to ConstExprs, and names that are tensors (RuntimeExpr)."""

    values: dict[str, Value] = field(default_factory=dict)
    tensors: set[str] = field(default_factory=set)
    sizes: set[str] = field(default_factory=set)  # dimension symbols of tensor shapes (B, T)
    parent: "ConstEnv | None" = None

    def lookup(self, name: str) -> tuple[bool, Value]:
        env: ConstEnv | None = self
        while env is not None:
            if name in env.values:
                return True, env.values[name]
            env = env.parent
        return False, None

    def is_tensor(self, name: str) -> bool:
        env: ConstEnv | None = self
        while env is not None:
            if name in env.tensors:
                return True
            env = env.parent
        return False

    def child(self) -> "ConstEnv":
        return ConstEnv(parent=self)


def _sqrt(x: Value) -> float:
    if isinstance(x, Expr):
        raise NotConstant()
    return math.sqrt(x)


def _ceil_div(a: Value, b: Value) -> Value:
    if isinstance(a, Expr) or isinstance(b, Expr):
        return Expr.of(a).ceildiv(b)
    return -(-a // b)


def _abs(x: Value) -> Value:
    if isinstance(x, Expr):
        raise NotConstant()
    return abs(x)


def _int(x: Value) -> int:
    if isinstance(x, Expr):
        return x  # a symbolic dimension is an integer already
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
        raise TypeError(f"int() takes a finite number, got {x!r}")
    return int(x)


def _minmax(pick: Callable) -> Callable:
    def apply(*args: Value) -> Value:
        if any(isinstance(a, Expr) for a in args):
            raise NotConstant()
        return pick(args)

    return apply


INTRINSICS: dict[str, Callable[..., Value]] = {
    "sqrt": _sqrt,
    "ceil_div": _ceil_div,
    "min": _minmax(min),
    "max": _minmax(max),
    "abs": _abs,
    "int": _int,
}

_ARITH: dict[str, Callable[[Value, Value], Value]] = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "/": operator.truediv,
    "//": operator.floordiv,
    "%": operator.mod,
    "**": operator.pow,
}
_COMPARE: dict[str, Callable[[Value, Value], bool]] = {
    "==": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    ">": operator.gt,
    "<=": operator.le,
    ">=": operator.ge,
}


def evaluate(node: ast.Expr, env: ConstEnv, context: str = "expression") -> Value:
    """The value of a ConstExpr; raises ConstError (coded) or NotConstant."""
    if isinstance(node, (ast.Int, ast.Float, ast.Str, ast.Bool)):
        return node.value
    if isinstance(node, ast.NoneLit):
        return None
    if isinstance(node, ast.Name):
        return _lookup(node, env, context)
    if isinstance(node, ast.Unary):
        value = evaluate(node.operand, env, context)
        if node.op == "not":
            return not _truth(value, node)
        if isinstance(value, bool) or not isinstance(value, (int, float, Expr)):
            raise ConstError("E026", f"'-' needs a number, not {_describe_value(value)}", node.span)
        return -value
    if isinstance(node, ast.Binary):
        return _binary(node, env, context)
    if isinstance(node, ast.Conditional):
        taken = _truth(evaluate(node.condition, env, "if"), node.condition)
        return evaluate(node.then if taken else node.orelse, env, context)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in INTRINSICS:
        if any(a.name is not None for a in node.args):
            raise ConstError("E026", f"{node.func.id}() takes positional arguments only", node.span)
        args = [evaluate(a.value, env, context) for a in node.args]
        try:
            return INTRINSICS[node.func.id](*args)
        except TypeError as err:
            raise ConstError("E026", f"bad arguments to {node.func.id}(): {err}", node.span) from None
    if isinstance(node, (ast.Attribute, ast.Index, ast.Call)) and _mentions_tensor(node, env):
        raise ConstError(
            "E016" if context == "if" else "E026",
            f"{_describe(context)} depends on a tensor value (a RuntimeExpr)", node.span,
            "only literals, parameters, let-bound names and sqrt/ceil_div/min/max/abs/int are known at compile time",
        )
    runtime = _runtime_call(node)
    if runtime is not None:
        raise ConstError(
            "E016" if context == "if" else "E026",
            f"{_describe(context)} {runtime}, which is only known at run time", node.span,
            "branch on parameters and let-bound names; a tensor's values cannot choose the graph",
        )
    raise ConstError("E026", f"{_describe(context)} is not a compile-time expression", node.span,
                     "only literals, parameters, let-bound names and sqrt/ceil_div/min/max/abs/int are allowed")


def symbolic(node: ast.Expr, env: ConstEnv, context: str = "expression") -> Value:
    """The value of a ConstExpr where integer parameters without a value and the sizes of the tensors
    in ``env.sizes`` stay symbols: a number, a dimension ``Expr``, or a ``ScalarExpr`` where arithmetic
    the ``Expr`` form has not (``/``, ``sqrt``, ...) meets a symbol. Whatever holds no symbol is
    :func:`evaluate`'s, with its errors; ConstError (E026) for what has no symbolic value."""
    if isinstance(node, ast.Name):
        found, value = env.lookup(node.id)
        if not found and node.id in env.sizes and not env.is_tensor(node.id):
            return Expr.sym(node.id)
        return evaluate(node, env, context)
    if isinstance(node, ast.Unary) and node.op == "-":
        value = symbolic(node.operand, env, context)
        return -value if isinstance(value, (Expr, ScalarExpr)) else evaluate(node, env, context)
    if isinstance(node, ast.Binary) and node.op in _ARITH:
        lhs, rhs = symbolic(node.lhs, env, context), symbolic(node.rhs, env, context)
        if not any(isinstance(v, (Expr, ScalarExpr)) for v in (lhs, rhs)):
            return evaluate(node, env, context)
        if _intlike(lhs) and _intlike(rhs) and node.op not in ("/", "**"):
            return _symbolic(node, lhs, rhs)
        return _scalar(node, node.op, node.op, lhs, rhs)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in INTRINSICS \
            and not any(a.name is not None for a in node.args):
        args = [symbolic(a.value, env, context) for a in node.args]
        if not any(isinstance(v, (Expr, ScalarExpr)) for v in args):
            return evaluate(node, env, context)
        if node.func.id == "int" and len(args) == 1 and isinstance(args[0], Expr):
            return args[0]
        if node.func.id == "ceil_div" and len(args) == 2 and all(_intlike(a) for a in args):
            return _ceil_div(*args)
        return _scalar(node, node.func.id, f"{node.func.id}()", *args)
    if isinstance(node, ast.Conditional):
        taken = _truth(evaluate(node.condition, env, "if"), node.condition)
        return symbolic(node.then if taken else node.orelse, env, context)
    return evaluate(node, env, context)


def _scalar(node: ast.Expr, op: str, what: str, *args: Value) -> ScalarExpr:
    """A ScalarExpr of ``op`` (an operator or intrinsic) on numbers and symbolic values."""
    for value in args:
        if isinstance(value, bool) or not isinstance(value, (int, float, Expr, ScalarExpr)):
            raise ConstError("E026", f"'{what}' needs numbers, not {_describe_value(value)}", node.span)
    try:
        if op in _ARITH:
            return ScalarExpr.binary(op, *args)
        return ScalarExpr.call(op, *args)
    except SymbolicError as err:
        raise ConstError("E026", f"'{node.span.text}': {err}", node.span) from None


def _describe_value(value: Value) -> str:
    return "None" if value is None else f"the {type(value).__name__} {value!r}"


def _describe(context: str) -> str:
    return {"if": "the if guard", "constraint": "the constraint"}.get(context, f"the {context}")


def _lookup(node: ast.Name, env: ConstEnv, context: str) -> Value:
    found, value = env.lookup(node.id)
    if found:
        return value
    if env.is_tensor(node.id):
        code = "E016" if context == "if" else "E026"
        raise ConstError(code, f"{_describe(context)} uses the tensor '{node.id}', which is only known at run time",
                         node.span, "guards and constraints may use parameters and let-bound names only")
    if node.id in env.sizes:
        raise ConstError("E016" if context == "if" else "E026",
                         f"{_describe(context)} uses the size '{node.id}' of a tensor, which is only known at run time",
                         node.span, "guards and constraints may use parameters and let-bound names only")
    raise ConstError("E002", f"undefined identifier '{node.id}'", node.span,
                     "define it as a parameter of the module or in its let: section")


def _runtime_call(node: ast.Expr) -> str | None:
    """What makes an expression a RuntimeExpr by its form: a primitive applied to a value
    (``reduce_sum(x)``) or a tensor's shape (``x.shape[0]``, spec 3.7.3); None otherwise."""
    base = node.base if isinstance(node, ast.Index) else node
    if isinstance(base, ast.Attribute) and base.attr == "shape":
        return f"reads the shape of '{base.base.span.text}'"
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and lookup_primitive(node.func.id) is not None:
        return f"calls the primitive {node.func.id}()"
    return None


def _mentions_tensor(node: ast.Expr, env: ConstEnv) -> bool:
    """Whether a tensor name occurs in a call, attribute or index chain (walked without recursion)."""
    stack = [node]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Name):
            if env.is_tensor(node.id):
                return True
        elif isinstance(node, ast.Call):
            stack += [node.func, *(a.value for a in node.args)]
        elif isinstance(node, (ast.Attribute, ast.Index)):
            stack.append(node.base)
    return False


def _truth(value: Value, node: ast.Node) -> bool:
    if isinstance(value, Expr):
        raise NotConstant()
    return bool(value)


def _binary(node: ast.Binary, env: ConstEnv, context: str) -> Value:
    if node.op in ("and", "or"):
        left = _truth(evaluate(node.lhs, env, context), node.lhs)
        if (node.op == "and" and not left) or (node.op == "or" and left):
            return left
        return _truth(evaluate(node.rhs, env, context), node.rhs)
    lhs, rhs = evaluate(node.lhs, env, context), evaluate(node.rhs, env, context)
    if node.op in _COMPARE:
        if isinstance(lhs, Expr) or isinstance(rhs, Expr):
            diff = (Expr.of(lhs) - Expr.of(rhs)).const_value() if _intlike(lhs) and _intlike(rhs) else None
            if diff is None:
                raise NotConstant()
            return _COMPARE[node.op](diff, 0)
        try:
            return _COMPARE[node.op](lhs, rhs)
        except TypeError:
            raise ConstError("E026", f"'{node.op}' cannot compare {type(lhs).__name__} and {type(rhs).__name__}",
                             node.span) from None
    try:
        if isinstance(lhs, Expr) or isinstance(rhs, Expr):
            return _symbolic(node, lhs, rhs)
        if node.op == "**" and _intlike(lhs) and _intlike(rhs) and abs(lhs) > 1 and rhs > 64:
            raise OverflowError()  # decided before computing a number of millions of digits
        return _in_range(_ARITH[node.op](lhs, rhs), node)
    except ZeroDivisionError:
        raise ConstError("E026", f"division by zero in '{node.span.text}'", node.span) from None
    except OverflowError:
        raise ConstError("E026", f"'{node.span.text}' is out of range", node.span,
                         "compile-time integers are 64-bit and floats are 64-bit IEEE") from None
    except TypeError:
        raise ConstError("E026", f"'{node.op}' cannot combine {type(lhs).__name__} and {type(rhs).__name__}",
                         node.span) from None


def _in_range(value: Value, node: ast.Binary) -> Value:
    """An integer result within i64 (a float result is finite); OverflowError otherwise."""
    if _intlike(value) and not isinstance(value, Expr) and not -I64_MAX - 1 <= value <= I64_MAX:
        raise OverflowError()
    if isinstance(value, float) and not math.isfinite(value):
        raise OverflowError()
    return value


def _intlike(value: Value) -> bool:
    return isinstance(value, Expr) or (isinstance(value, int) and not isinstance(value, bool))


def _symbolic(node: ast.Binary, lhs: Value, rhs: Value) -> Value:
    if not (_intlike(lhs) and _intlike(rhs)) or node.op in ("/", "**"):
        raise NotConstant()
    try:
        return _ARITH[node.op](Expr.of(lhs), Expr.of(rhs))
    except SymbolicError as err:
        message = f"division by zero in '{node.span.text}'" if "zero" in str(err) else str(err)
        raise ConstError("E026", message, node.span) from None


# ----------------------------------------------------------------------------
# let: sections and constraints
# ----------------------------------------------------------------------------


def evaluate_let(section: ast.Section, env: ConstEnv, sink: DiagnosticSink,
                 choose: Callable[[ast.Expr, ConstEnv], ast.Expr] | None = None) -> None:
    """Bind each ``name = expr`` of a ``let:`` section and check its constraints, in order;
    ``choose`` picks the branch of an ``a if c else b`` whose guard reads config values."""
    for stmt in section.body:
        if isinstance(stmt, ast.Binding):
            try:
                value = choose(stmt.value, env) if choose is not None else stmt.value
                env.values[stmt.name] = evaluate(value, env, "let binding")
            except NotConstant:
                env.values[stmt.name] = None
            except ConstError as err:
                sink.error(err.code, err.message, err.span, err.hint)
        elif isinstance(stmt, ast.Section) and stmt.name == "constraint":
            check_constraints(stmt, env, sink)
        elif isinstance(stmt, ast.Section) and stmt.value is not None and stmt.name is not None:
            # `B: batch_dim` declares a symbolic dimension
            env.values[stmt.name] = Expr.sym(stmt.name)
        else:
            sink.error("E001", "a let: section holds `name = expression` bindings and a constraint: section",
                       stmt.span)


def check_constraints(section: ast.Section, env: ConstEnv, sink: DiagnosticSink) -> None:
    """Each ``condition, "message"`` must be a boolean ConstExpr that holds (E026, E027)."""
    for stmt in section.body:
        if not isinstance(stmt, ast.Constraint):
            sink.error("E026", 'a constraint is written `condition, "message"`', stmt.span)
            continue
        try:
            value = evaluate(stmt.condition, env, "constraint")
        except NotConstant:
            continue  # depends on config values bound later; checked again at specialization
        except ConstError as err:
            code = "E026" if err.code in ("E016",) else err.code
            sink.error(code, err.message, err.span, err.hint)
            continue
        if not isinstance(value, bool):
            sink.error("E026", f"a constraint must be a comparison or boolean, not '{stmt.condition.span.text}'",
                       stmt.condition.span,
                       "write a condition such as `d_model % num_heads == 0`")
        elif not value:
            sink.error("E027", f"constraint violated: {stmt.message}", stmt.condition.span,
                       "change the parameters so that the condition holds")


def guard_value(condition: ast.Expr, env: ConstEnv, sink: DiagnosticSink) -> bool | None:
    """The value of an `if` guard; E016 when it depends on a tensor, None if unknown."""
    try:
        value = evaluate(condition, env, "if")
    except NotConstant:
        sink.error("E016", "the if guard is not known at compile time", condition.span,
                   "guards may use parameters with known values and let-bound names")
        return None
    except ConstError as err:
        sink.error(err.code, err.message, err.span, err.hint)
        return None
    if isinstance(value, Expr):
        sink.error("E016", f"the if guard is the size '{value}', whose value is not known at compile time",
                   condition.span, "guard on a boolean parameter or a comparison with known values")
        return None
    return bool(value)
