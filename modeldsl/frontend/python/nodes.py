"""The Python DSL translator's base: spans in the Python file, coded errors, and expressions of the
parameters (Python expressions, or DSL expressions held in strings) as Module DSL AST nodes."""

from __future__ import annotations

import ast as py
from typing import Any

from modeldsl.diagnostics import Diagnostic, DiagnosticError, Source, Span
from modeldsl.dialects.annotations import ANNOTATION_BY_NAME
from modeldsl.frontend.text import ast

KEYWORD_NAMES = {"in_": "in"}  # Python keywords the text DSL uses as names
ANNOTATION_KEYWORDS = {"assert_": "assert"}  # annotations named by a Python keyword
DTYPE_STEPS = ("cast", "zeros", "ones", "fill")  # their dtype= is the primitive's, not the @dtype annotation

OPERATORS = {py.Add: "+", py.Sub: "-", py.Mult: "*", py.Div: "/", py.FloorDiv: "//", py.Mod: "%", py.Pow: "**",
             py.Eq: "==", py.NotEq: "!=", py.Lt: "<", py.Gt: ">", py.LtE: "<=", py.GtE: ">=",
             py.And: "and", py.Or: "or"}


class Nodes:
    """Python AST nodes of one file to Module DSL AST expressions, spanned in that file."""

    def __init__(self, source: Source):
        self.source = source
        self.aliases: dict[str, ast.Expr] = {}

    # ------------------------------------------------------------------ spans and errors
    def span(self, node: Any) -> Span:
        line, column = getattr(node, "lineno", 1), getattr(node, "col_offset", 0) + 1
        end_line = getattr(node, "end_lineno", None) or line
        end_column = (getattr(node, "end_col_offset", None) or column - 1) + 1
        return Span(self.source, line, column, end_line, end_column)

    def inner(self, literal: py.Constant) -> Span:
        """The span of a one-line string literal's text, inside its quotes."""
        raw = self.source.line(literal.lineno)[literal.col_offset:]
        quote = len(raw) - len(raw.lstrip("rbuRBUfF"))
        quote += len(raw[quote:]) - len(raw[quote:].lstrip("\"'")) if raw[quote:quote + 3] in ('"""', "'''") \
            else 1
        column = literal.col_offset + quote + 1
        if literal.end_lineno != literal.lineno:
            return self.span(literal)
        return Span(self.source, literal.lineno, column, literal.lineno, column + len(literal.value))

    def error(self, node: Any, message: str, hint: str = "") -> DiagnosticError:
        return DiagnosticError([Diagnostic("E001", message, self.span(node), hint)])

    def section(self, node: Any, name: str, body: list[ast.Stmt], value: ast.Value | None = None) -> ast.Section:
        return ast.Section(self.span(node), ast.Name(self.span(node), name), value, body)

    def entry(self, node: Any, name: str, expr: ast.Expr, guard: ast.Expr | None = None,
              annotations: list[ast.Annotation] | None = None) -> ast.Section:
        """``name: expr [if guard] @annotations``."""
        value = ast.Value(expr.span, expr, guard=guard, annotations=annotations or [])
        return ast.Section(self.span(node), ast.Name(self.span(node), name), value, [])

    def word(self, node: py.expr) -> ast.Expr:
        """An annotation argument: an identifier string is the bare word the text DSL writes."""
        if is_string(node) and node.value.isidentifier():
            return ast.Name(self.inner(node), node.value)
        return self.value(node)

    # ------------------------------------------------------------------ expressions
    def tensor_type(self, node: py.expr) -> ast.Expr:
        """``Tensor["B", "T", "d"]`` (a dtype last: ``Tensor["T", "fp32"]``) as the shape ``[B, T, d]``."""
        if not subscript_of(node, "Tensor"):
            raise self.error(node, "a tensor type is Tensor[dims...]", "e.g. Tensor[\"B\", \"T\", \"d_model\"]")
        return ast.ListExpr(self.span(node), [self.dimension(d) for d in subscripts(node)])

    def dimension(self, node: py.expr) -> ast.Expr:
        if is_string(node) and node.value.strip() == "*":
            return ast.Star(self.inner(node))
        return self.value(node)

    def value(self, node: py.expr) -> ast.Expr:
        """An expression of the parameters, where a string holds one (``"D // 2"``)."""
        if not is_string(node):
            return self.expr(node)
        try:
            inner = py.parse(node.value.strip(), mode="eval").body
        except SyntaxError:
            raise self.error(node, f"'{node.value}' is not an expression of the parameters") from None
        return _InString(self, node).expr(inner)

    def expr(self, node: py.expr) -> ast.Expr:
        span = self.span(node)
        if isinstance(node, py.Constant):
            return constant(node.value, span, self, node)
        if isinstance(node, py.Name):
            return self.aliases.get(node.id, ast.Name(span, node.id))
        if self_attribute(node):
            return self.aliases.get(node.attr, ast.Name(span, node.attr))
        if isinstance(node, py.BinOp) and type(node.op) in OPERATORS:
            return ast.Binary(span, OPERATORS[type(node.op)], self.expr(node.left), self.expr(node.right))
        if isinstance(node, py.UnaryOp) and isinstance(node.op, py.USub) and isinstance(node.operand, py.Constant):
            return ast.Unary(span, "-", self.expr(node.operand))
        if isinstance(node, py.UnaryOp) and isinstance(node.op, (py.USub, py.Not)):
            return ast.Unary(span, "-" if isinstance(node.op, py.USub) else "not", self.expr(node.operand))
        if isinstance(node, py.BoolOp):
            result = self.expr(node.values[0])
            for value in node.values[1:]:
                result = ast.Binary(span, OPERATORS[type(node.op)], result, self.expr(value))
            return result
        if isinstance(node, py.Compare) and len(node.ops) == 1 and type(node.ops[0]) in OPERATORS:
            return ast.Binary(span, OPERATORS[type(node.ops[0])], self.expr(node.left), self.expr(node.comparators[0]))
        if isinstance(node, py.IfExp):  # spec 5.8's `a if c else b`
            return ast.Conditional(span, self.expr(node.body), self.expr(node.test), self.expr(node.orelse))
        if isinstance(node, (py.List, py.Tuple)):
            items = [self.value(e) for e in node.elts]
            return ast.ListExpr(span, items) if isinstance(node, py.List) else ast.TupleExpr(span, items)
        if isinstance(node, py.Call) and isinstance(node.func, py.Name):
            args = [ast.Arg(self.span(a), self.value(a)) for a in node.args]
            return ast.Call(span, ast.Name(self.span(node.func), node.func.id), args)
        raise self.error(node, "not an expression the DSL takes here (names, numbers, strings, arithmetic, "
                         "comparisons, a if c else b, lists)")


class _InString(Nodes):
    """An expression parsed from inside a string literal, spanned where it lies in the file."""

    def __init__(self, outer: Nodes, literal: py.Constant):
        super().__init__(outer.source)
        self.aliases = outer.aliases
        inner = outer.inner(literal)
        self.line, self.column = inner.line, inner.column + (len(literal.value) - len(literal.value.lstrip()))
        self.single_line = literal.end_lineno == literal.lineno

    def span(self, node: Any) -> Span:
        if not self.single_line:
            return super().span(node)
        start = getattr(node, "col_offset", 0)
        end = getattr(node, "end_col_offset", None) or start
        return Span(self.source, self.line, self.column + start, self.line, self.column + end)


def constant(value: Any, span: Span, translator: Nodes, node: py.expr) -> ast.Expr:
    if isinstance(value, bool):
        return ast.Bool(span, value)
    if isinstance(value, int):
        return ast.Int(span, value)
    if isinstance(value, float):
        return ast.Float(span, value)
    if isinstance(value, str):
        return ast.Str(span, value)
    if value is None:
        return ast.NoneLit(span)
    raise translator.error(node, f"{value!r} is not a value the DSL takes")


def called_name(node: py.expr) -> str | None:
    target = node.func if isinstance(node, py.Call) else node
    if isinstance(target, py.Name):
        return target.id
    if isinstance(target, py.Attribute):
        return target.attr
    return None


def is_string(node: Any) -> bool:
    return isinstance(node, py.Constant) and isinstance(node.value, str)


def self_attribute(node: py.expr) -> bool:
    return isinstance(node, py.Attribute) and isinstance(node.value, py.Name) and node.value.id == "self"


def subscript_of(node: Any, name: str) -> bool:
    return isinstance(node, py.Subscript) and isinstance(node.value, py.Name) and node.value.id == name


def subscripts(node: py.Subscript) -> list[py.expr]:
    return list(node.slice.elts) if isinstance(node.slice, py.Tuple) else [node.slice]


def is_docstring(stmt: py.stmt) -> bool:
    return isinstance(stmt, py.Expr) and isinstance(stmt.value, py.Constant)


def is_annotation(keyword: py.keyword, call: py.Call) -> bool:
    """Whether a step's keyword is an annotation (``hook=``, ``dtype=``, ``assert_=``) rather than a parameter."""
    steps_dtype = isinstance(call.func, py.Attribute) and call.func.attr in DTYPE_STEPS
    name = annotation_name(keyword.arg)
    return name in ANNOTATION_BY_NAME and not (steps_dtype and name == "dtype")


def annotation_name(keyword: str | None) -> str | None:
    """The annotation a keyword spells: its own name, ``assert_`` for ``@assert`` (a Python keyword)."""
    return ANNOTATION_KEYWORDS.get(keyword, keyword)
