"""Symbolic scalar expressions: the value of an attribute computed from module parameters and sizes.

A primitive's parameter may be a compile-time expression of integer module
parameters that have no value yet and of tensor sizes (spec 3.7: parameters are
compile-time constants, bound by ``mdsl-specialize``): ``scale(1.0 /
sqrt(d_head))``, ``moe_compute_offsets(num_experts)``, ``scale(1.0 / (B * T))``.
:class:`ScalarExpr` holds such an expression as a tree until the symbols are
bound; its value then follows the ConstExpr rules of
:mod:`modeldsl.resolve.consts` (Python's arithmetic: ``/`` is a float, ``//``
floors, the intrinsics ``sqrt``, ``ceil_div``, ``min``, ``max``, ``abs``,
``int``). Symbols stand for positive integers (sizes and integer parameters).

Constants fold as a tree is built, so a tree has at least one symbol unless it
is a number. Text comes in two spellings, both parsed back by :meth:`ScalarExpr.parse`:

* IR (``#mdsl.graph.sym<1.0 / sqrt(d_head) : f64>``): ``floordiv``, ``mod``
  and ``pow(a, b)``, because ``//`` starts a comment in MLIR text and ``%`` a
  value name; floats always carry a ``.`` (``1.0e-06``) so that they lex as floats;
* DSL (diagnostics): ``//``, ``%``, ``**``.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Union

from modeldsl.symbolic import Expr, SymbolicError

Number = Union[int, float]
ScalarLike = Union["ScalarExpr", Expr, int, float]
MAX_DEPTH = 100  # nesting a parsed or built expression may have


def _ceil_div(a: Number, b: Number) -> Number:
    return -(-a // b)


def _int(x: Number) -> int:
    if not math.isfinite(x):
        raise ValueError(f"int() of {x!r}")
    return int(x)


BINARY: dict[str, Callable[[Number, Number], Number]] = {
    "+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv,
    "//": operator.floordiv, "%": operator.mod, "**": operator.pow,
}
CALLS: dict[str, tuple[int | None, Callable[..., Number]]] = {  # name -> (arity, None: one or more)
    "sqrt": (1, math.sqrt), "abs": (1, abs), "int": (1, _int), "ceil_div": (2, _ceil_div),
    "min": (None, min), "max": (None, max),
}
_PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2, "//": 2, "%": 2, "**": 4}
_IR_SPELLING = {"//": "floordiv", "%": "mod"}


@dataclass(frozen=True)
class ScalarExpr:
    """An expression tree: ``kind`` is ``num`` (``value``, ``name`` its type: ``int`` or ``float``), ``sym``
    (``name``), ``neg`` (``args[0]``), ``bin`` (operator ``name`` of ``args``) or ``call`` (intrinsic
    ``name`` of ``args``)."""

    kind: str
    name: str = ""
    value: Number = 0
    args: tuple["ScalarExpr", ...] = ()

    # construction -------------------------------------------------------
    @staticmethod
    def num(value: Number) -> "ScalarExpr":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SymbolicError(f"{value!r} is not a number")
        if isinstance(value, float) and not math.isfinite(value):
            raise SymbolicError(f"{value!r} is not a finite number")
        return ScalarExpr("num", name=type(value).__name__, value=value)  # the name keeps 1 and 1.0 apart

    @staticmethod
    def sym(name: str) -> "ScalarExpr":
        return ScalarExpr("sym", name=name)

    @staticmethod
    def of(value: ScalarLike) -> "ScalarExpr":
        """A tree of a number, a dimension expression (``2*D + 1``) or a tree."""
        if isinstance(value, ScalarExpr):
            return value
        if isinstance(value, Expr):
            known = value.const_value()
            return ScalarExpr.num(known) if known is not None else ScalarExpr.parse(value.text())
        return ScalarExpr.num(value)

    @staticmethod
    def binary(op: str, lhs: ScalarLike, rhs: ScalarLike) -> "ScalarExpr":
        a, b = ScalarExpr.of(lhs), ScalarExpr.of(rhs)
        if op not in BINARY:
            raise SymbolicError(f"unknown operator '{op}'")
        if a.kind == "num" and b.kind == "num":
            return ScalarExpr.num(_compute(BINARY[op], (a.value, b.value), f"{a} {op} {b}"))
        return ScalarExpr("bin", name=op, args=(a, b))._checked()

    @staticmethod
    def call(name: str, *args: ScalarLike) -> "ScalarExpr":
        if name not in CALLS:
            raise SymbolicError(f"unknown function '{name}'")
        arity, fn = CALLS[name]
        if (arity is not None and len(args) != arity) or not args:
            raise SymbolicError(f"{name}() takes {arity or 'one or more'} argument(s), got {len(args)}")
        trees = tuple(ScalarExpr.of(a) for a in args)
        if all(t.kind == "num" for t in trees):
            return ScalarExpr.num(_compute(fn, tuple(t.value for t in trees), f"{name}(...)"))
        return ScalarExpr("call", name=name, args=trees)._checked()

    def __neg__(self) -> "ScalarExpr":
        if self.kind == "num":
            return ScalarExpr.num(-self.value)
        return ScalarExpr("neg", args=(self,))._checked()

    def _checked(self) -> "ScalarExpr":
        if self.depth() > MAX_DEPTH:
            raise SymbolicError(f"expression nests deeper than {MAX_DEPTH} levels")
        return self

    @staticmethod
    def parse(text: str) -> "ScalarExpr":
        return _Parser(text).parse()

    # queries ------------------------------------------------------------
    @cached_property
    def _depth(self) -> int:
        return 1 + max((a._depth for a in self.args), default=0)

    def depth(self) -> int:
        return self._depth

    def symbols(self) -> set[str]:
        if self.kind == "sym":
            return {self.name}
        return set().union(*(a.symbols() for a in self.args)) if self.args else set()

    def is_int(self) -> bool:
        """Whether the value is an integer whatever positive integers the symbols stand for."""
        if self.kind == "num":
            return isinstance(self.value, int)
        if self.kind == "sym":
            return True
        if self.kind == "neg":
            return self.args[0].is_int()
        if self.kind == "call":
            return self.name == "int" or (self.name != "sqrt" and all(a.is_int() for a in self.args))
        if self.name == "/":
            return False
        if self.name == "**":  # an integer power only with a known non-negative exponent
            exponent = self.args[1]
            return self.args[0].is_int() and exponent.kind == "num" and isinstance(exponent.value, int) \
                and exponent.value >= 0
        return all(a.is_int() for a in self.args)

    def as_dim(self) -> Expr | None:
        """The same value as a dimension expression (``num_experts + 1``), None where it is no
        integer polynomial with floor divisions (``/``, ``sqrt``, ``min``, a negative power)."""
        if not self.is_int():
            return None
        if self.kind == "num":
            return Expr.const(self.value)
        if self.kind == "sym":
            return Expr.sym(self.name)
        parts = [a.as_dim() for a in self.args]
        if any(p is None for p in parts):
            return None
        try:
            if self.kind == "neg":
                return -parts[0]
            if self.kind == "call":
                return parts[0].ceildiv(parts[1]) if self.name == "ceil_div" else None
            if self.name == "**":
                if self.args[1].value > 64:
                    return None
                result = Expr.const(1)
                for _ in range(self.args[1].value):
                    result = result * parts[0]
                return result
            return BINARY[self.name](parts[0], parts[1])
        except SymbolicError:
            return None

    # evaluation ---------------------------------------------------------
    def subs(self, bindings: Mapping[str, Number]) -> "ScalarExpr":
        """Bound symbols replaced by their values, constants folded (SymbolicError where a
        folded part has no value: a division by zero, sqrt of a negative number)."""
        if self.kind == "num":
            return self
        if self.kind == "sym":
            return ScalarExpr.num(bindings[self.name]) if self.name in bindings else self
        args = [a.subs(bindings) for a in self.args]
        if self.kind == "neg":
            return -args[0]
        if self.kind == "call":
            return ScalarExpr.call(self.name, *args)
        return ScalarExpr.binary(self.name, *args)

    def evaluate(self, bindings: Mapping[str, Number] | None = None) -> Number:
        """The value under ``bindings``; SymbolicError for an unbound symbol or no value."""
        result = self.subs(bindings or {})
        if result.kind != "num":
            raise SymbolicError(f"unbound symbol(s) {', '.join(sorted(result.symbols()))} in '{self}'")
        return result.value

    # printing -----------------------------------------------------------
    def text(self, ir: bool = True) -> str:
        return self._text(ir)[0]

    def _text(self, ir: bool) -> tuple[str, int]:
        """(text, precedence): 1 sums, 2 products, 3 negation, 4 powers, 5 atoms."""
        if self.kind == "num":
            text = _number_text(self.value)
            return text, 3 if self.value < 0 else 5
        if self.kind == "sym":
            return self.name, 5
        if self.kind == "neg":
            inner, prec = self.args[0]._text(ir)
            return "-" + (inner if prec >= 3 else f"({inner})"), 3
        if self.kind == "call":
            return f"{self.name}({', '.join(a.text(ir) for a in self.args)})", 5
        (lhs, lp), (rhs, rp) = (a._text(ir) for a in self.args)
        if self.name == "**" and ir:
            return f"pow({lhs}, {rhs})", 5
        prec = _PRECEDENCE[self.name]
        if self.name == "**":  # right-associative, binds tighter than a negation on its left
            lhs = lhs if lp > prec else f"({lhs})"
            rhs = rhs if rp >= 3 else f"({rhs})"
        else:  # left-associative
            lhs = lhs if lp >= prec else f"({lhs})"
            rhs = rhs if rp > prec else f"({rhs})"
        op = _IR_SPELLING.get(self.name, self.name) if ir else self.name
        return f"{lhs} {op} {rhs}", prec

    def __str__(self) -> str:
        return self.text(ir=False)

    def __repr__(self) -> str:
        return f"ScalarExpr({self.text(ir=False)!r})"


def _compute(fn: Callable[..., Number], args: tuple[Number, ...], what: str) -> Number:
    try:
        if fn is operator.pow and all(isinstance(a, int) for a in args) and abs(args[0]) > 1 and args[1] > 64:
            raise OverflowError()  # decided before computing a number of millions of digits
        result = fn(*args)
    except ZeroDivisionError:
        raise SymbolicError(f"division by zero in '{what}'") from None
    except OverflowError:
        raise SymbolicError(f"'{what}' is out of range") from None
    except (ValueError, TypeError) as err:
        raise SymbolicError(f"'{what}' has no value: {err}") from None
    if isinstance(result, complex) or isinstance(result, float) and not math.isfinite(result):
        raise SymbolicError(f"'{what}' has no finite real value")
    return result


def _number_text(value: Number) -> str:
    if isinstance(value, int):
        return str(value)
    text = repr(float(value))
    mantissa, _, exponent = text.partition("e")
    if "." not in mantissa:
        mantissa += ".0"
    return mantissa + ("e" + exponent if exponent else "")


# ----------------------------------------------------------------------------
# Parsing
# ----------------------------------------------------------------------------

_TOKEN = re.compile(r"\s*(?:(?P<num>\d+\.\d*(?:[eE][-+]?\d+)?|\d+[eE][-+]?\d+|\d+)"
                    r"|(?P<name>[A-Za-z_][A-Za-z0-9_.$]*)|(?P<op>\*\*|//|[-+*/%(),]))")
_WORD_OPS = {"floordiv": "//", "mod": "%"}


class _Parser:
    """``sum := product (('+'|'-') product)*``, ``product := unary (('*'|'/'|'//'|'%') unary)*``,
    ``unary := '-' unary | power``, ``power := atom ('**' unary)?``,
    ``atom := number | name | name '(' sum (',' sum)* ')' | '(' sum ')'``; ``pow(a, b)`` is ``a ** b``."""

    def __init__(self, text: str):
        self.text = text
        self.tokens: list[tuple[str, str]] = []
        pos, text = 0, text.rstrip()
        while pos < len(text):
            match = _TOKEN.match(text, pos)
            if match is None or match.end() == pos:
                raise SymbolicError(f"unexpected character {text[pos:].strip()[:1]!r} in '{self.text}'")
            kind = match.lastgroup
            value = match.group(kind)
            if kind == "name" and value in _WORD_OPS:
                kind, value = "op", _WORD_OPS[value]
            self.tokens.append((kind, value))
            pos = match.end()
        self.pos = 0
        self.depth = 0

    def parse(self) -> ScalarExpr:
        if not self.tokens:
            raise SymbolicError("empty expression")
        result = self.sum()
        if self.pos != len(self.tokens):
            raise SymbolicError(f"unexpected '{self.tokens[self.pos][1]}' in '{self.text}'")
        return result

    def take(self, *ops: str) -> str | None:
        if self.pos < len(self.tokens) and self.tokens[self.pos][0] == "op" and self.tokens[self.pos][1] in ops:
            self.pos += 1
            return self.tokens[self.pos - 1][1]
        return None

    def expect(self, op: str) -> None:
        if self.take(op) is None:
            raise SymbolicError(f"expected '{op}' in '{self.text}'")

    def sum(self) -> ScalarExpr:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise SymbolicError(f"expression nests deeper than {MAX_DEPTH} levels")
        try:
            result = self.product()
            while (op := self.take("+", "-")) is not None:
                result = ScalarExpr.binary(op, result, self.product())
            return result
        finally:
            self.depth -= 1

    def product(self) -> ScalarExpr:
        result = self.unary()
        while (op := self.take("*", "/", "//", "%")) is not None:
            result = ScalarExpr.binary(op, result, self.unary())
        return result

    def unary(self) -> ScalarExpr:
        if self.take("-") is not None:
            self.depth += 1
            if self.depth > MAX_DEPTH:
                raise SymbolicError(f"expression nests deeper than {MAX_DEPTH} levels")
            try:
                return -self.unary()
            finally:
                self.depth -= 1
        base = self.atom()
        if self.take("**") is not None:
            return ScalarExpr.binary("**", base, self.unary())
        return base

    def atom(self) -> ScalarExpr:
        if self.pos >= len(self.tokens):
            raise SymbolicError(f"expression '{self.text}' ends early")
        kind, value = self.tokens[self.pos]
        self.pos += 1
        if kind == "num":
            return ScalarExpr.num(float(value) if any(c in value for c in ".eE") else int(value))
        if kind == "name":
            if self.take("(") is None:
                return ScalarExpr.sym(value)
            args = [self.sum()]
            while self.take(",") is not None:
                args.append(self.sum())
            self.expect(")")
            if value == "pow":
                if len(args) != 2:
                    raise SymbolicError(f"pow() takes 2 arguments, got {len(args)}")
                return ScalarExpr.binary("**", *args)
            return ScalarExpr.call(value, *args)
        if value == "(":
            inner = self.sum()
            self.expect(")")
            return inner
        raise SymbolicError(f"unexpected '{value}' in '{self.text}'")
