"""Types and attributes of ``mdsl.graph``: symbolic shapes, tensors, dimension lists.

* ``!mdsl.graph.tensor<[B, T, 2*D*Hkv + D*Hq], bf16>`` — a tensor whose
  dimensions are integers or canonical symbolic expressions
  (:mod:`modeldsl.symbolic`); ``*`` marks variadic leading dimensions.
* ``#mdsl.graph.dims<[d_ff, d_ff]>`` — a list of dimensions as an attribute
  (split sizes, view shapes).
* ``#mdsl.graph.expr<n_layers>`` — one dimension expression (stack counts).
* ``#mdsl.graph.sym<1.0 / sqrt(d_head) : f64>`` — a primitive's parameter
  computed from module parameters and sizes that have no value yet
  (:mod:`modeldsl.symbolic_scalar`), of the kind the op expects (``f64`` a
  float, ``i64`` an integer); ``mdsl-specialize`` evaluates it to that
  attribute once its symbols are bound.

In IR text floor division and modulo are spelled ``floordiv`` and ``mod``
(``//`` starts a comment in MLIR syntax); the DSL spells them ``//`` and ``%``.
"""

from __future__ import annotations

from collections.abc import Sequence

from xdsl.dialects.builtin import FloatAttr, IntegerAttr, StringAttr, f64, i64
from xdsl.ir import Attribute, Data, ParametrizedAttribute, TypeAttribute
from xdsl.irdl import irdl_attr_definition
from xdsl.parser import AttrParser
from xdsl.printer import Printer
from xdsl.utils.exceptions import VerifyException

from modeldsl.dialects.dtypes import DType, parse_dtype_spelling, verify_dtype_spelling
from modeldsl.symbolic import (
    STAR,
    Dim,
    Expr,
    ExprLike,
    SymbolicError,
    make_shape,
    numel,
    shape_text,
)
from modeldsl.symbolic_scalar import Number, ScalarExpr, ScalarLike

_EXPR_PUNCTUATION = ("+", "-", "*", "(", ")")


def parse_dim_expr(parser: AttrParser, allow_star: bool = False) -> Dim:
    """Parse one dimension (an expression, or ``*`` where allowed) from IR text."""
    start = parser.pos
    pieces: list[str] = []
    depth = 0
    while True:
        if depth == 0 and pieces and _at_dim_end(parser):
            break
        if (value := parser.parse_optional_integer(allow_boolean=False, allow_negative=False)) is not None:
            pieces.append(str(value))
        elif (name := parser.parse_optional_identifier()) is not None:
            pieces.append(name)
        elif (punct := _parse_optional_expr_punctuation(parser)) is not None:
            depth += {"(": 1, ")": -1}.get(punct, 0)
            pieces.append(punct)
        elif not pieces:
            parser.raise_error("expected a dimension expression")
        else:
            break
    if pieces == ["*"]:
        if not allow_star:
            parser.raise_error("'*' is only allowed as a leading tensor dimension", start, parser.pos)
        return STAR
    try:
        return Expr.parse(" ".join(pieces))
    except SymbolicError as err:
        parser.raise_error(f"invalid dimension expression: {err}", start, parser.pos)


def _at_dim_end(parser: AttrParser) -> bool:
    text = parser._current_token.text  # noqa: SLF001 - a lookahead the parser API lacks
    return text in (",", "]", ">")


def _parse_optional_expr_punctuation(parser: AttrParser) -> str | None:
    for punct in _EXPR_PUNCTUATION:
        if parser.parse_optional_punctuation(punct) is not None:  # type: ignore[arg-type]
            return punct
    return None


def parse_dims(parser: AttrParser, allow_star: bool = True) -> tuple[Dim, ...]:
    """Parse ``[d0, d1, ...]``."""
    start = parser.pos
    dims = parser.parse_comma_separated_list(
        parser.Delimiter.SQUARE, lambda: parse_dim_expr(parser, allow_star)
    )
    try:
        return make_shape(dims)
    except SymbolicError as err:
        parser.raise_error(str(err), start, parser.pos)


@irdl_attr_definition
class DimsAttr(Data[tuple[Dim, ...]]):
    """A list of (symbolic) dimensions: ``#mdsl.graph.dims<[d_ff, d_ff]>``."""

    name = "mdsl.graph.dims"

    @classmethod
    def parse_parameter(cls, parser: AttrParser) -> tuple[Dim, ...]:
        with parser.in_angle_brackets():
            return parse_dims(parser)

    def print_parameter(self, printer: Printer) -> None:
        printer.print_string(f"<{shape_text(self.data)}>")

    @staticmethod
    def from_list(dims: Sequence[ExprLike]) -> "DimsAttr":
        return DimsAttr(make_shape(list(dims)))


@irdl_attr_definition
class ExprAttr(Data[Expr]):
    """One dimension expression: ``#mdsl.graph.expr<n_layers>``."""

    name = "mdsl.graph.expr"

    @classmethod
    def parse_parameter(cls, parser: AttrParser) -> Expr:
        with parser.in_angle_brackets():
            return parse_dim_expr(parser)  # type: ignore[return-value]

    def print_parameter(self, printer: Printer) -> None:
        printer.print_string(f"<{self.data}>")

    @staticmethod
    def of(value: ExprLike) -> "ExprAttr":
        return ExprAttr(Expr.of(value))


SYMBOLIC_KINDS = {"f64": "float", "i64": "int"}


@irdl_attr_definition
class SymbolicAttr(Data[tuple[ScalarExpr, str]]):
    """A parameter's value as an expression of unbound symbols: ``#mdsl.graph.sym<1.0 / sqrt(d_head) : f64>``.

    ``f64`` stands for a float attribute, ``i64`` for an integer one (an integer expression:
    ``#mdsl.graph.sym<num_experts : i64>``). It always has a symbol: a known value is the
    plain attribute. :meth:`bind` gives that attribute once the symbols are bound.
    """

    name = "mdsl.graph.sym"

    def __init__(self, expr: ScalarLike | tuple[ScalarExpr, str], kind: str | None = None):
        if kind is None and isinstance(expr, tuple):  # the parsed parameter
            expr, kind = expr
        super().__init__((ScalarExpr.of(expr), kind))

    @property
    def expr(self) -> ScalarExpr:
        return self.data[0]

    @property
    def kind(self) -> str:
        """``f64`` or ``i64``."""
        return self.data[1]

    def value(self) -> ScalarExpr | Expr:
        """As a Python value of an attribute: an integer one as a dimension expression where it is
        one (``num_experts + 1`` then works in shape rules), else the tree."""
        if self.kind == "i64":
            dim = self.expr.as_dim()
            if dim is not None:
                return dim
        return self.expr

    def bind(self, bindings: dict[str, Number]) -> Attribute:
        """The attribute with ``bindings`` substituted: the plain ``FloatAttr``/``IntegerAttr`` once
        no symbol is left (SymbolicError where the value is none: a division by zero, ...)."""
        expr = self.expr.subs(bindings)
        if expr.symbols():
            return self if expr == self.expr else SymbolicAttr(expr, self.kind)
        return concrete_attribute(expr.value, self.kind)

    def verify(self) -> None:
        expr, kind = self.data
        if not isinstance(expr, ScalarExpr) or kind not in SYMBOLIC_KINDS:
            raise VerifyException(f"#{self.name} holds an expression and f64 or i64, got {self.data!r}")
        if not expr.symbols():
            raise VerifyException(f"#{self.name}<{expr.text()}> has no symbol: write the value as a plain attribute")
        if kind == "i64" and not expr.is_int():
            raise VerifyException(f"#{self.name}<{expr.text()} : i64> is not an integer expression")

    @classmethod
    def parse_parameter(cls, parser: AttrParser) -> tuple[ScalarExpr, str]:
        with parser.in_angle_brackets():
            start = parser.pos
            pieces: list[str] = []
            depth = 0
            while True:
                token = parser._current_token  # noqa: SLF001 - the expression's tokens, as they come
                if token.text in (":", ">") and depth == 0 or token.kind.name == "EOF":
                    break
                depth += {"(": 1, ")": -1}.get(token.text, 0)
                pieces.append(token.text)
                parser._consume_token()  # noqa: SLF001
            end = parser.pos
            parser.parse_punctuation(":")
            kind = parser.parse_identifier()
            if kind not in SYMBOLIC_KINDS:
                parser.raise_error(f"expected f64 or i64 after the expression, got '{kind}'")
            try:
                expr = ScalarExpr.parse(" ".join(pieces))
            except SymbolicError as err:
                parser.raise_error(f"invalid symbolic expression: {err}", start, end)
            if not expr.symbols():
                parser.raise_error("a symbolic attribute needs a symbol: write the value as a plain attribute",
                                   start, end)
            if kind == "i64" and not expr.is_int():
                parser.raise_error(f"'{expr.text()}' is not an integer expression", start, end)
            return expr, kind

    def print_parameter(self, printer: Printer) -> None:
        printer.print_string(f"<{self.expr.text()} : {self.kind}>")


def concrete_attribute(value: Number, kind: str) -> Attribute:
    """The plain attribute of a value of a symbolic attribute's kind (SymbolicError where an ``i64``
    one is no integer or out of range)."""
    if kind == "f64":
        return FloatAttr(float(value), f64)
    if not isinstance(value, int) or not -2**63 <= value < 2**63:
        raise SymbolicError(f"{value!r} is not a 64-bit integer")
    return IntegerAttr(value, i64)


@irdl_attr_definition
class TensorType(ParametrizedAttribute, TypeAttribute):
    """A tensor with a symbolic shape and an element type."""

    name = "mdsl.graph.tensor"

    dims: DimsAttr
    dtype_name: StringAttr

    def __init__(self, shape: Sequence[ExprLike] | DimsAttr, dtype: DType | str):
        dims = shape if isinstance(shape, DimsAttr) else DimsAttr(make_shape(list(shape)))
        spelling = dtype.value if isinstance(dtype, DType) else dtype
        super().__init__(dims, StringAttr(spelling))

    @property
    def shape(self) -> tuple[Dim, ...]:
        return self.dims.data

    @property
    def dtype(self) -> DType:
        return DType(self.dtype_name.data)

    @property
    def rank(self) -> int:
        """Number of dimensions (a variadic ``*`` counts as one)."""
        return len(self.shape)

    @property
    def is_variadic(self) -> bool:
        return bool(self.shape) and self.shape[0] is STAR

    def numel(self) -> Expr | None:
        return numel(self.shape)

    def with_shape(self, shape: Sequence[ExprLike]) -> "TensorType":
        return TensorType(shape, self.dtype)

    def with_dtype(self, dtype: DType | str) -> "TensorType":
        return TensorType(self.dims, dtype)

    def verify(self) -> None:
        verify_dtype_spelling(self.dtype_name.data)

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> list[Attribute]:
        with parser.in_angle_brackets():
            dims = parse_dims(parser)
            parser.parse_punctuation(",")
            spelling = parse_dtype_spelling(parser)
        return [DimsAttr(dims), StringAttr(spelling)]

    def print_parameters(self, printer: Printer) -> None:
        printer.print_string(f"<{shape_text(self.shape)}, {self.dtype_name.data}>")


GRAPH_TYPES_AND_ATTRS: tuple[type[Attribute], ...] = (TensorType, DimsAttr, ExprAttr, SymbolicAttr)
