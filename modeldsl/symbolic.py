"""Symbolic dimension arithmetic: integer expressions over named sizes.

Shapes in ``mdsl.graph`` hold, per dimension, an integer or an expression such
as ``B*T``, ``(Hq+2*Hkv)*D`` or ``D//2``. Every expression is kept in one
canonical form so that equal shapes compare equal:

* a polynomial with integer coefficients over *atoms*;
* an atom is a symbol (``B``) or an irreducible floor division or modulo
  (``(T + 1) floordiv 2``) whose operands are themselves canonical;
* simplification folds constants, cancels exact divisions (``(Hq*D) // Hq``
  is ``D``), pulls divisible terms out of floor divisions
  (``(2*T + 1) // 2`` is ``T + 1 // 2`` = ``T``) and reduces modulo.

Division follows Python (floor) semantics; sizes are non-negative integers.
``Expr.parse`` reads the DSL spelling (``//``, ``%``) and the IR spelling
(``floordiv``, ``mod``, ``ceildiv``; ``//`` starts a comment in MLIR text).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import total_ordering
from typing import Mapping, Union

# A monomial: sorted tuple of (atom, power). The constant term has the empty monomial.
Monomial = tuple[tuple["Atom", int], ...]


class SymbolicError(ValueError):
    """Raised for malformed expressions, division by zero and unbound symbols."""


@total_ordering
@dataclass(frozen=True)
class Symbol:
    name: str

    def sort_key(self) -> tuple:
        return (0, self.name)

    def __lt__(self, other: "Atom") -> bool:
        return self.sort_key() < other.sort_key()

    def text(self) -> str:
        return self.name


@total_ordering
@dataclass(frozen=True)
class DivAtom:
    """An irreducible ``num floordiv den`` or ``num mod den``."""

    kind: str  # "floordiv" | "mod"
    num: "Expr"
    den: "Expr"

    def sort_key(self) -> tuple:
        return (1, self.kind, self.num.text(), self.den.text())

    def __lt__(self, other: "Atom") -> bool:
        return self.sort_key() < other.sort_key()

    def text(self) -> str:
        return f"{self.num._operand_text()} {self.kind} {self.den._operand_text()}"


Atom = Union[Symbol, DivAtom]
ExprLike = Union["Expr", int, str]


def _mul_monomials(a: Monomial, b: Monomial) -> Monomial:
    powers: dict[Atom, int] = dict(a)
    for atom, p in b:
        powers[atom] = powers.get(atom, 0) + p
    return tuple(sorted(powers.items()))


def _divide_monomial(a: Monomial, b: Monomial) -> Monomial | None:
    """``a / b`` when ``b`` divides ``a`` exactly, else None."""
    powers: dict[Atom, int] = dict(a)
    for atom, p in b:
        if powers.get(atom, 0) < p:
            return None
        powers[atom] -= p
    return tuple(sorted((at, p) for at, p in powers.items() if p))


def _monomial_text(mono: Monomial, alone: bool) -> str:
    """A product of atoms; a division atom is parenthesized unless it stands alone."""
    factors = []
    for atom, p in mono:
        text = atom.text()
        if isinstance(atom, DivAtom) and not (alone and len(mono) == 1 and p == 1):
            text = f"({text})"
        factors.extend([text] * p)
    return "*".join(factors)


class Expr:
    """An immutable canonical integer expression."""

    __slots__ = ("_terms", "_hash")

    def __init__(self, terms: Mapping[Monomial, int] | None = None):
        clean = {m: c for m, c in (terms or {}).items() if c != 0}
        self._terms: tuple[tuple[Monomial, int], ...] = tuple(
            sorted(clean.items(), key=lambda mc: _term_sort_key(mc[0]))
        )
        self._hash = hash(self._terms)

    # construction -------------------------------------------------------
    @staticmethod
    def const(value: int) -> "Expr":
        return Expr({(): int(value)})

    @staticmethod
    def sym(name: str) -> "Expr":
        return Expr({((Symbol(name), 1),): 1})

    @staticmethod
    def of(value: ExprLike) -> "Expr":
        if isinstance(value, Expr):
            return value
        if isinstance(value, bool):
            raise SymbolicError("a boolean is not a dimension")
        if isinstance(value, int):
            return Expr.const(value)
        if isinstance(value, str):
            return Expr.parse(value)
        raise SymbolicError(f"cannot make a dimension of {value!r}")

    @staticmethod
    def parse(text: str) -> "Expr":
        return _ExprParser(text).parse()

    # queries ------------------------------------------------------------
    @property
    def terms(self) -> dict[Monomial, int]:
        return dict(self._terms)

    def is_const(self) -> bool:
        return all(m == () for m, _ in self._terms)

    def const_value(self) -> int | None:
        """The integer value when the expression has no symbols, else None."""
        if not self.is_const():
            return None
        return self._terms[0][1] if self._terms else 0

    def symbols(self) -> set[str]:
        names: set[str] = set()
        for mono, _ in self._terms:
            for atom, _ in mono:
                if isinstance(atom, Symbol):
                    names.add(atom.name)
                else:
                    names |= atom.num.symbols() | atom.den.symbols()
        return names

    # arithmetic ---------------------------------------------------------
    def __add__(self, other: ExprLike) -> "Expr":
        terms = self.terms
        for m, c in Expr.of(other)._terms:
            terms[m] = terms.get(m, 0) + c
        return Expr(terms)

    __radd__ = __add__

    def __neg__(self) -> "Expr":
        return Expr({m: -c for m, c in self._terms})

    def __sub__(self, other: ExprLike) -> "Expr":
        return self + (-Expr.of(other))

    def __rsub__(self, other: ExprLike) -> "Expr":
        return Expr.of(other) - self

    def __mul__(self, other: ExprLike) -> "Expr":
        terms: dict[Monomial, int] = {}
        for m1, c1 in self._terms:
            for m2, c2 in Expr.of(other)._terms:
                m = _mul_monomials(m1, m2)
                terms[m] = terms.get(m, 0) + c1 * c2
        return Expr(terms)

    __rmul__ = __mul__

    def __floordiv__(self, other: ExprLike) -> "Expr":
        return _floordiv(self, Expr.of(other))

    def __rfloordiv__(self, other: ExprLike) -> "Expr":
        return _floordiv(Expr.of(other), self)

    def __mod__(self, other: ExprLike) -> "Expr":
        return _mod(self, Expr.of(other))

    def __rmod__(self, other: ExprLike) -> "Expr":
        return _mod(Expr.of(other), self)

    def ceildiv(self, other: ExprLike) -> "Expr":
        den = Expr.of(other)
        return _floordiv(self + den - 1, den)

    # evaluation ---------------------------------------------------------
    def subs(self, bindings: Mapping[str, ExprLike]) -> "Expr":
        """Replace bound symbols by their values and re-simplify."""
        result = Expr()
        for mono, coef in self._terms:
            term = Expr.const(coef)
            for atom, p in mono:
                value = _subs_atom(atom, bindings)
                for _ in range(p):
                    term = term * value
            result = result + term
        return result

    def evaluate(self, bindings: Mapping[str, ExprLike] | None = None) -> int:
        """The integer value under ``bindings``; raises if a symbol stays unbound."""
        value = self.subs(bindings or {})
        result = value.const_value()
        if result is None:
            missing = ", ".join(sorted(value.symbols()))
            raise SymbolicError(f"unbound symbol(s) {missing} in '{self}'")
        return result

    # comparison and printing -------------------------------------------
    def __eq__(self, other: object) -> bool:
        if isinstance(other, int) and not isinstance(other, bool):
            other = Expr.const(other)
        return isinstance(other, Expr) and self._terms == other._terms

    def __hash__(self) -> int:
        return self._hash

    def text(self) -> str:
        if not self._terms:
            return "0"
        pieces: list[str] = []
        for i, (mono, coef) in enumerate(self._terms):
            magnitude = abs(coef)
            body = _monomial_text(mono, alone=magnitude == 1 and (coef > 0 or i > 0))
            if not body:
                term = str(magnitude)
            elif magnitude == 1:
                term = body
            else:
                term = f"{magnitude}*{body}"
            if i == 0:
                pieces.append(f"-{term}" if coef < 0 else term)
            else:
                pieces.append(f" - {term}" if coef < 0 else f" + {term}")
        return "".join(pieces)

    def _operand_text(self) -> str:
        """Text for use as an operand of floordiv/mod: parenthesized unless atomic."""
        text = self.text()
        simple = len(self._terms) == 1 and (
            self.is_const() and self._terms[0][1] >= 0
            or (self._terms[0][1] == 1 and len(self._terms[0][0]) == 1
                and self._terms[0][0][0][1] == 1
                and isinstance(self._terms[0][0][0][0], Symbol))
        )
        return text if simple or not self._terms else f"({text})"

    def __str__(self) -> str:
        return self.text()

    def __repr__(self) -> str:
        return f"Expr({self.text()!r})"


def _term_sort_key(mono: Monomial) -> tuple:
    degree = sum(p for _, p in mono)
    return (mono == (), -degree, [(a.sort_key(), -p) for a, p in mono])


def _subs_atom(atom: Atom, bindings: Mapping[str, ExprLike]) -> Expr:
    if isinstance(atom, Symbol):
        if atom.name in bindings:
            return Expr.of(bindings[atom.name])
        return Expr.sym(atom.name)
    num, den = atom.num.subs(bindings), atom.den.subs(bindings)
    return _floordiv(num, den) if atom.kind == "floordiv" else _mod(num, den)


def _single_term(e: Expr) -> tuple[Monomial, int] | None:
    return e._terms[0] if len(e._terms) == 1 else None


def _split_divisible(num: Expr, den: Expr) -> tuple[Expr, Expr]:
    """Split ``num`` into (quotient, remainder) with ``num = quotient*den + remainder``
    where den is a single term; quotient takes every term the divisor divides."""
    den_term = _single_term(den)
    if den_term is None:
        return Expr(), num
    den_mono, den_coef = den_term
    quotient: dict[Monomial, int] = {}
    remainder: dict[Monomial, int] = {}
    for mono, coef in num._terms:
        q_mono = _divide_monomial(mono, den_mono)
        if q_mono is not None and coef % den_coef == 0:
            quotient[q_mono] = coef // den_coef
        else:
            remainder[mono] = coef
    return Expr(quotient), Expr(remainder)


def _floordiv(num: Expr, den: Expr) -> Expr:
    den_value = den.const_value()
    if den_value == 0:
        raise SymbolicError(f"division by zero in '{num._operand_text()} floordiv 0'")
    num_value = num.const_value()
    if num_value is not None and den_value is not None:
        return Expr.const(num_value // den_value)
    quotient, remainder = _split_divisible(num, den)
    if remainder == 0:
        return quotient
    rem_value = remainder.const_value()
    if rem_value is not None and den_value is not None and 0 <= rem_value < den_value:
        return quotient
    return quotient + Expr({((DivAtom("floordiv", remainder, den), 1),): 1})


def _mod(num: Expr, den: Expr) -> Expr:
    den_value = den.const_value()
    if den_value == 0:
        raise SymbolicError(f"division by zero in '{num._operand_text()} mod 0'")
    num_value = num.const_value()
    if num_value is not None and den_value is not None:
        return Expr.const(num_value % den_value)
    _, remainder = _split_divisible(num, den)
    rem_value = remainder.const_value()
    if rem_value is not None and den_value is not None:
        return Expr.const(rem_value % den_value)
    if remainder == 0:
        return Expr()
    return Expr({((DivAtom("mod", remainder, den), 1),): 1})


# ----------------------------------------------------------------------------
# Parsing
# ----------------------------------------------------------------------------

_TOKEN = re.compile(
    r"\s*(?:(?P<int>\d+)|(?P<name>[A-Za-z_][A-Za-z0-9_.$]*)|(?P<op>//|[-+*%()]))"
)
_KEYWORD_OPS = {"floordiv": "//", "mod": "%", "ceildiv": "ceildiv"}


def tokenize(text: str) -> list[tuple[str, str]]:
    """Tokens of an expression: ("int", "12"), ("name", "B"), ("op", "//")."""
    tokens: list[tuple[str, str]] = []
    pos = 0
    text = text.rstrip()
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None or match.end() == pos:
            raise SymbolicError(f"unexpected character {text[pos:].strip()[:1]!r} in '{text}'")
        kind = match.lastgroup
        value = match.group(kind)
        if kind == "name" and value in _KEYWORD_OPS:
            kind, value = "op", _KEYWORD_OPS[value]
        tokens.append((kind, value))
        pos = match.end()
    return tokens


class _ExprParser:
    """Recursive descent over ``sum := product (('+'|'-') product)*``,
    ``product := unary (('*'|'//'|'%'|'ceildiv') unary)*``,
    ``unary := '-' unary | atom``, ``atom := int | name | '(' sum ')'``."""

    MAX_DEPTH = 100  # nested parentheses and unary minus: deeper is refused, not a RecursionError

    def __init__(self, text: str):
        self.text = text
        self.tokens = tokenize(text)
        self.pos = 0
        self.depth = 0

    def parse(self) -> Expr:
        if not self.tokens:
            raise SymbolicError("empty dimension expression")
        divisions = sum(1 for kind, value in self.tokens if kind == "op" and value in ("//", "%", "ceildiv"))
        if divisions > self.MAX_DEPTH:  # each one nests the expression a level deeper
            raise SymbolicError(f"dimension expression has {divisions} divisions, more than {self.MAX_DEPTH}")
        result = self.sum()
        if self.pos != len(self.tokens):
            raise SymbolicError(f"unexpected '{self.tokens[self.pos][1]}' in '{self.text}'")
        return result

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take_op(self, *ops: str) -> str | None:
        tok = self.peek()
        if tok is not None and tok[0] == "op" and tok[1] in ops:
            self.pos += 1
            return tok[1]
        return None

    def sum(self) -> Expr:
        result = self.product()
        while (op := self.take_op("+", "-")) is not None:
            rhs = self.product()
            result = result + rhs if op == "+" else result - rhs
        return result

    def product(self) -> Expr:
        result = self.unary()
        while (op := self.take_op("*", "//", "%", "ceildiv")) is not None:
            rhs = self.unary()
            if op == "*":
                result = result * rhs
            elif op == "//":
                result = result // rhs
            elif op == "%":
                result = result % rhs
            else:
                result = result.ceildiv(rhs)
        return result

    def unary(self) -> Expr:
        self.depth += 1
        if self.depth > self.MAX_DEPTH:
            raise SymbolicError(f"dimension expression nests deeper than {self.MAX_DEPTH} levels")
        try:
            if self.take_op("-") is not None:
                return -self.unary()
            return self.atom()
        finally:
            self.depth -= 1

    def atom(self) -> Expr:
        tok = self.peek()
        if tok is None:
            raise SymbolicError(f"expression '{self.text}' ends early")
        self.pos += 1
        kind, value = tok
        if kind == "int":
            return Expr.const(int(value))
        if kind == "name":
            return Expr.sym(value)
        if value == "(":
            inner = self.sum()
            if self.take_op(")") is None:
                raise SymbolicError(f"missing ')' in '{self.text}'")
            return inner
        raise SymbolicError(f"unexpected '{value}' in '{self.text}'")


# ----------------------------------------------------------------------------
# Shapes
# ----------------------------------------------------------------------------


class _Variadic:
    """The ``*`` marker for variadic leading dimensions."""

    _instance: "_Variadic | None" = None

    def __new__(cls) -> "_Variadic":
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "STAR"

    def __str__(self) -> str:
        return "*"


STAR = _Variadic()
Dim = Union[Expr, _Variadic]


def star_axes(dims: list[int], typed_rank: int, rank: int) -> list[int]:
    """The axes of a value of rank ``rank`` that ``dims`` name in its type ``[*, ...]`` of
    ``typed_rank`` dims: ``*`` (dim 0) is every leading axis it stands for, the dims after it
    shift by as many (``reduce_sum(dims=[0])`` over ``[*, d]`` sums all but the last axis)."""
    width = rank - typed_rank + 1
    axes: set[int] = set()
    for d in dims:
        d = d % typed_rank
        axes.update(range(width) if d == 0 else (d + width - 1,))
    return sorted(axes)


def make_shape(dims: list[ExprLike | _Variadic] | tuple) -> tuple[Dim, ...]:
    """A canonical shape tuple; ``*`` may appear only as the first dimension."""
    shape: list[Dim] = []
    for i, d in enumerate(dims):
        if d is STAR or d == "*":
            if i != 0:
                raise SymbolicError("variadic '*' must be the leading dimension")
            shape.append(STAR)
        else:
            shape.append(Expr.of(d))
    return tuple(shape)


def shape_text(shape: tuple[Dim, ...]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def numel(shape: tuple[Dim, ...]) -> Expr | None:
    """The element count, or None for a variadic shape."""
    total = Expr.const(1)
    for d in shape:
        if d is STAR:
            return None
        total = total * d
    return total


def is_static(shape: tuple[Dim, ...]) -> bool:
    return all(d is not STAR and d.is_const() for d in shape)


def static_shape(shape: tuple[Dim, ...]) -> tuple[int, ...]:
    if not is_static(shape):
        raise SymbolicError(f"shape {shape_text(shape)} is not static")
    return tuple(d.const_value() for d in shape)  # type: ignore[union-attr]


def definitely_different(a: Dim, b: Dim) -> bool:
    """True when two dimensions are provably unequal for all positive sizes.

    Verifiers use this: symbolic dims that merely look different (``B`` vs
    ``T``) may be bound equal later, so only a difference that can never be
    zero (``8`` vs ``16``, ``T + 1`` vs ``T``, ``64*B*T`` vs ``128*B*T``) is
    an error.
    """
    if a is STAR or b is STAR:
        return False
    return _provably_nonzero(a - b)


def _provably_nonzero(e: Expr) -> bool:
    """Sizes are positive integers, so a non-zero polynomial over plain symbols
    whose coefficients all have one sign (``64*B*T``, ``T + 1``) is never 0."""
    terms = e.terms
    if not terms:
        return False
    signs = {c > 0 for c in terms.values()}
    plain = all(isinstance(atom, Symbol) for mono in terms for atom, _ in mono)
    return len(signs) == 1 and plain
