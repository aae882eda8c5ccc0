"""The AST of the Module DSL: typed nodes, each with its source span.

The parser's grammar is layered (see grammar.lark): a declaration's body is
a list of statements, and sections (``params:``, ``forward:``, ``graph:``,
``hf_mapping:``, ...) are :class:`Section` nodes whose meaning the resolver
gives by name. :func:`build` turns a Lark tree into these nodes;
:func:`dump` prints them for ``mdsl-opt --emit=ast``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any, Union

from lark import Token, Transformer, Tree, v_args

from modeldsl.diagnostics import Diagnostic, Source, Span

I64_MAX = 2**63 - 1


class LiteralOutOfRange(Exception):
    """A literal past i64 or float64, raised from the builder with its diagnostic."""

    def __init__(self, diagnostic: Diagnostic):
        super().__init__(diagnostic.message)
        self.diagnostic = diagnostic

# ----------------------------------------------------------------------------
# Nodes
# ----------------------------------------------------------------------------


@dataclass
class Node:
    span: Span = field(repr=False, compare=False)


# Expressions ---------------------------------------------------------------


@dataclass
class Name(Node):
    id: str


@dataclass
class Int(Node):
    value: int


@dataclass
class Float(Node):
    value: float


@dataclass
class Str(Node):
    value: str
    long: bool = False


@dataclass
class Bool(Node):
    value: bool


@dataclass
class NoneLit(Node):
    pass


@dataclass
class EllipsisLit(Node):
    pass


@dataclass
class Star(Node):
    """``*`` as a shape dimension (variadic leading dims)."""


@dataclass
class Placeholder(Node):
    """``{i}`` in a weight-mapping key."""

    name: str


@dataclass
class ListExpr(Node):
    items: list["Expr"]


@dataclass
class TupleExpr(Node):
    items: list["Expr"]


@dataclass
class NamedField(Node):
    name: str
    value: "Expr"
    annotations: list["Annotation"] = field(default_factory=list)


@dataclass
class NamedTuple(Node):
    fields: list[NamedField]


@dataclass
class Annotated(Node):
    value: "Expr"
    annotations: list["Annotation"]


@dataclass
class Arg(Node):
    """A call argument: positional (``name`` None), ``name=value``, ``name: value`` or ``"str": value``."""

    value: "Expr"
    name: str | None = None
    style: str = ""  # "" (positional) | "=" | ":" | "str:"


@dataclass
class Call(Node):
    func: "Expr"
    args: list[Arg]


@dataclass
class Slice(Node):
    lower: "Expr | None"
    upper: "Expr | None"


@dataclass
class Index(Node):
    base: "Expr"
    subscripts: list["Expr"]


@dataclass
class Attribute(Node):
    base: "Expr"
    attr: str


@dataclass
class Optional_(Node):
    """``T?``: may be None."""

    base: "Expr"


@dataclass
class Splat(Node):
    """``name...``."""

    base: "Expr"


@dataclass
class ArrayType(Node):
    """``[n] x Block(...)``, ``[n] × Block(...)`` or ``Array<n, Block>``."""

    count: "Expr"
    element: "Expr"


@dataclass
class Conditional(Node):
    """``then if condition else orelse`` (spec 5.8); the condition is a ConstExpr."""

    then: "Expr"
    condition: "Expr"
    orelse: "Expr"


@dataclass
class Unary(Node):
    op: str  # "-" | "not"
    operand: "Expr"


@dataclass
class Binary(Node):
    op: str  # + - * / // % ** == != < > <= >= and or
    lhs: "Expr"
    rhs: "Expr"


Expr = Union[
    Name, Int, Float, Str, Bool, NoneLit, EllipsisLit, Star, Placeholder, ListExpr, TupleExpr,
    NamedTuple, Annotated, Call, Slice, Index, Attribute, Optional_, Splat, ArrayType, Conditional, Unary, Binary,
]


@dataclass
class Annotation(Node):
    name: str
    args: list[Arg]


# Statements ----------------------------------------------------------------


@dataclass
class Value(Node):
    """The inline value of a section: ``expr [= default] [if guard] @annotations``."""

    expr: "Expr | NamedField"
    default: "Expr | None" = None
    guard: "Expr | None" = None
    annotations: list[Annotation] = field(default_factory=list)


@dataclass
class Section(Node):
    """``key: value`` with an optional indented body; ``added`` for ``+name:``."""

    key: Expr
    value: Value | None
    body: list["Stmt"]
    added: bool = False

    @property
    def name(self) -> str | None:
        """The key as text when it is a plain name (``params``, ``forward``, ...)."""
        return self.key.id if isinstance(self.key, Name) else None


@dataclass
class Flow(Node):
    """``source -> op(...) -> ... -> destination @annotations``."""

    chain: list[Expr]
    annotations: list[Annotation] = field(default_factory=list)


@dataclass
class Binding(Node):
    name: str
    value: Expr


@dataclass
class If(Node):
    condition: Expr
    then: list["Stmt"]
    orelse: list["Stmt"] | None = None


@dataclass
class ListItem(Node):
    """``- expr``, ``- key: value`` or ``- a -> b``."""

    value: Expr
    extra: Expr | None = None
    chain: list[Expr] = field(default_factory=list)


@dataclass
class Constraint(Node):
    condition: Expr
    message: str


@dataclass
class ExprStmt(Node):
    """A lone expression: a doc string, the ``...`` placeholder, or an error."""

    expr: Expr


def is_placeholder(stmt: "Stmt") -> bool:
    """The ``...`` statement, which stands for code the source leaves out."""
    return isinstance(stmt, ExprStmt) and isinstance(stmt.expr, EllipsisLit)


@dataclass
class AnnotationStmt(Node):
    annotations: list[Annotation]


Stmt = Union[Section, Flow, Binding, If, ListItem, Constraint, ExprStmt, AnnotationStmt]

# Declarations --------------------------------------------------------------


@dataclass
class Param(Node):
    name: str | None
    type: Expr | None = None
    default: Expr | None = None
    rest: bool = False  # ``name...`` or ``...``


@dataclass
class Decl(Node):
    kind: str  # module | block | model | primitive | recipe | annotation
    name: str
    params: list[Param] | None
    body: list[Stmt]
    extends: str | None = None
    abstract: bool = False

    @property
    def doc(self) -> str | None:
        first = self.body[0] if self.body else None
        if isinstance(first, ExprStmt) and isinstance(first.expr, Str):
            return first.expr.value
        return None

    def sections(self, name: str) -> list[Section]:
        return [s for s in self.body if isinstance(s, Section) and s.name == name]


@dataclass
class Import(Node):
    """``import a.b.c [as x]`` or ``import a.b.{X, Y}``."""

    path: list[str]
    alias: str | None = None
    names: list[str] | None = None


@dataclass
class FromImport(Node):
    path: list[str]
    items: list[tuple[str, str | None]]


@dataclass
class Program(Node):
    source: Source = field(repr=False, compare=False)
    items: list[Union[Import, FromImport, Decl, ExprStmt]]
    # the Python DSL's stacks of an imported block named by a string (``Array["n", "Blk"]``): the
    # element's call and the names it may bind, for the resolver to bind once it knows the imports
    by_name: list[tuple[Call, set[str]]] = field(default_factory=list, repr=False, compare=False)

    @property
    def declarations(self) -> list[Decl]:
        return [i for i in self.items if isinstance(i, Decl)]

    @property
    def imports(self) -> list[Union[Import, FromImport]]:
        return [i for i in self.items if isinstance(i, (Import, FromImport))]


# ----------------------------------------------------------------------------
# Building from the Lark tree
# ----------------------------------------------------------------------------


def _unescape(text: str) -> str:
    return bytes(text, "utf-8").decode("unicode_escape").encode("latin-1").decode("utf-8") if "\\" in text else text


class _Builder(Transformer):
    def __init__(self, source: Source):
        super().__init__()
        self.source = source

    def span(self, meta: Any) -> Span:
        if getattr(meta, "empty", True):
            return Span(self.source, 1, 1, 1, 2)
        return Span(self.source, meta.line, meta.column, meta.end_line, meta.end_column)

    def token_span(self, token: Token) -> Span:
        return Span(self.source, token.line, token.column, token.end_line or token.line,
                    token.end_column or token.column + 1)

    # program and imports ---------------------------------------------------
    @v_args(meta=True)
    def start(self, meta, items):
        return Program(self.span(meta), self.source, [i for i in items if i is not None])

    @v_args(meta=True)
    def docstring(self, meta, items):
        return ExprStmt(self.span(meta), Str(self.span(meta), items[0].value[3:-3], long=True))

    @v_args(meta=True)
    def import_decl(self, meta, items):
        (path, names), alias = items
        return Import(self.span(meta), path, str(alias) if alias else None, names)

    def import_path(self, items):
        names = items[-1]
        return [str(t) for t in items[:-1]], names

    def name_list(self, items):
        return [str(t) for t in items]

    def dotted(self, items):
        return [str(t) for t in items]

    @v_args(meta=True)
    def from_import(self, meta, items):
        return FromImport(self.span(meta), items[0], items[1:])

    def import_item(self, items):
        name, alias = items
        return (str(name), str(alias) if alias else None)

    # declarations -------------------------------------------------------------
    @v_args(meta=True)
    def declaration(self, meta, items):
        abstract, kind, name, params, extends, body = items
        return Decl(self.span(meta), str(kind), str(name), params, body, extends, abstract is not None)

    @v_args(meta=True)
    def annotation_decl(self, meta, items):
        _, name, body = items
        return Decl(self.span(meta), "annotation", str(name), None, body)

    def decl_kind(self, items):
        return items[0]

    def signature(self, items):
        return [p for p in items if p is not None]

    @v_args(meta=True)
    def param(self, meta, items):
        name, type_, default = items
        return Param(self.span(meta), str(name), type_, default)

    @v_args(meta=True)
    def rest_param(self, meta, items):
        return Param(self.span(meta), str(items[0]) if items else None, rest=True)

    def extends(self, items):
        return str(items[0])

    def body(self, items):
        return list(items)

    # statements ---------------------------------------------------------------
    @v_args(meta=True)
    def section(self, meta, items):
        key, value, body = items
        added = isinstance(key, tuple)
        if added:
            key = key[1]
        return Section(self.span(meta), key, value, body or [], added)

    def key(self, items):
        return items[0]

    @v_args(meta=True)
    def added_key(self, meta, items):
        return ("+", Name(self.token_span(items[0]), str(items[0])))

    @v_args(meta=True)
    def value(self, meta, items):
        expr, default, guard, *annotations = items
        return Value(self.span(meta), expr, default, guard, annotations)

    def default(self, items):
        return items[0]

    def guard(self, items):
        return items[0]

    @v_args(meta=True)
    def flow(self, meta, items):
        """Annotations follow the stage they annotate; those of the destination are the flow's."""
        chain: list[Expr] = []
        pending: list[Annotation] = []
        for item in items:
            if isinstance(item, Annotation):
                pending.append(item)
                continue
            if pending:
                chain[-1] = _annotated(chain[-1], pending)
                pending = []
            chain.append(item)
        return Flow(self.span(meta), chain, pending)

    @v_args(meta=True)
    def binding(self, meta, items):
        return Binding(self.span(meta), str(items[0]), items[1])

    @v_args(meta=True)
    def if_stmt(self, meta, items):
        return If(self.span(meta), items[0], items[1], items[2])

    def else_clause(self, items):
        return items[0]

    @v_args(meta=True)
    def list_item(self, meta, items):
        return ListItem(self.span(meta), items[1], items[2])

    @v_args(meta=True)
    def list_flow(self, meta, items):
        return ListItem(self.span(meta), items[1], None, items[2:])

    @v_args(meta=True)
    def constraint(self, meta, items):
        return Constraint(self.span(meta), items[0], _unescape(items[1].value[1:-1]))

    @v_args(meta=True)
    def expr_stmt(self, meta, items):
        return ExprStmt(self.span(meta), items[0])

    @v_args(meta=True)
    def annotation_stmt(self, meta, items):
        return AnnotationStmt(self.span(meta), list(items))

    @v_args(meta=True)
    def annotation(self, meta, items):
        name, args = items
        return Annotation(self.span(meta), str(name), args or [])

    # expressions -------------------------------------------------------------
    @v_args(meta=True)
    def name(self, meta, items):
        return Name(self.span(meta), str(items[0]))

    @v_args(meta=True)
    def int_(self, meta, items):
        digits = str(items[0]).replace("_", "").lstrip("0") or "0"
        if len(digits) > len(str(I64_MAX)) or int(digits) > I64_MAX:
            shown = digits if len(digits) <= 24 else f"{digits[:10]}...({len(digits)} digits)"
            raise LiteralOutOfRange(Diagnostic(
                "E001", f"integer literal {shown} is out of range (the largest is 2**63 - 1)", self.span(meta),
                "integers in the Module DSL are 64-bit"))
        return Int(self.span(meta), int(digits))

    @v_args(meta=True)
    def float_(self, meta, items):
        value = float(items[0])
        if not math.isfinite(value):
            raise LiteralOutOfRange(Diagnostic("E001", f"float literal {items[0]} is out of range", self.span(meta),
                                               "floats in the Module DSL are 64-bit IEEE (at most about 1.8e308)"))
        return Float(self.span(meta), value)

    @v_args(meta=True)
    def string(self, meta, items):
        text = items[0].value
        if text.startswith('"""'):
            return Str(self.span(meta), text[3:-3], long=True)
        return Str(self.span(meta), _unescape(text[1:-1]))

    @v_args(meta=True)
    def true(self, meta, items):
        return Bool(self.span(meta), True)

    @v_args(meta=True)
    def false(self, meta, items):
        return Bool(self.span(meta), False)

    @v_args(meta=True)
    def none(self, meta, items):
        return NoneLit(self.span(meta))

    @v_args(meta=True)
    def ellipsis(self, meta, items):
        return EllipsisLit(self.span(meta))

    @v_args(meta=True)
    def star(self, meta, items):
        return Star(self.span(meta))

    @v_args(meta=True)
    def placeholder_name(self, meta, items):
        return Placeholder(self.span(meta), str(items[0]))

    @v_args(meta=True)
    def list_(self, meta, items):
        return ListExpr(self.span(meta), [i for i in items if i is not None])

    @v_args(meta=True)
    def tuple_(self, meta, items):
        return TupleExpr(self.span(meta), [i for i in items if i is not None])

    @v_args(meta=True)
    def named_tuple(self, meta, items):
        return NamedTuple(self.span(meta), [i for i in items if i is not None])

    @v_args(meta=True)
    def named(self, meta, items):
        return NamedField(self.span(meta), str(items[0]), items[1], list(items[2:]))

    @v_args(meta=True)
    def annotated(self, meta, items):
        return Annotated(self.span(meta), items[0], list(items[1:]))

    def arguments(self, items):
        return [a if isinstance(a, Arg) else Arg(a.span, a, None, "") for a in items if a is not None]

    @v_args(meta=True)
    def keyword_arg(self, meta, items):
        return Arg(self.span(meta), items[1], str(items[0]), "=")

    @v_args(meta=True)
    def colon_arg(self, meta, items):
        return Arg(self.span(meta), items[1], str(items[0]), ":")

    @v_args(meta=True)
    def string_arg(self, meta, items):
        return Arg(self.span(meta), items[1], _unescape(items[0].value[1:-1]), "str:")

    @v_args(meta=True)
    def call(self, meta, items):
        return Call(self.span(meta), items[0], items[1] or [])

    @v_args(meta=True)
    def index(self, meta, items):
        return Index(self.span(meta), items[0], items[1])

    def subscripts(self, items):
        return list(items)

    @v_args(meta=True)
    def slice(self, meta, items):
        return Slice(self.span(meta), items[0], items[1])

    @v_args(meta=True)
    def attribute(self, meta, items):
        return Attribute(self.span(meta), items[0], str(items[1]))

    @v_args(meta=True)
    def optional(self, meta, items):
        return Optional_(self.span(meta), items[0])

    @v_args(meta=True)
    def splat(self, meta, items):
        return Splat(self.span(meta), items[0])

    @v_args(meta=True)
    def array_type(self, meta, items):
        count_list, _, element = items
        count = count_list.items[0] if isinstance(count_list, ListExpr) and len(count_list.items) == 1 else count_list
        return ArrayType(self.span(meta), count, element)

    @v_args(meta=True)
    def array_generic(self, meta, items):
        count, element = (i for i in items if not isinstance(i, Token))
        return ArrayType(self.span(meta), count, element)

    @v_args(meta=True)
    def conditional(self, meta, items):
        then, condition, orelse = items
        return Conditional(self.span(meta), then, condition, orelse)

    @v_args(meta=True)
    def neg(self, meta, items):
        return Unary(self.span(meta), "-", items[0])

    @v_args(meta=True)
    def not_(self, meta, items):
        return Unary(self.span(meta), "not", items[0])

    def _binary(op):  # noqa: N805 - a factory used in the class body
        @v_args(meta=True)
        def build(self, meta, items):
            return Binary(self.span(meta), op, items[0], items[-1])

        return build

    or_ = _binary("or")
    and_ = _binary("and")
    add = _binary("+")
    sub = _binary("-")
    mul = _binary("*")
    truediv = _binary("/")
    floordiv = _binary("//")
    mod = _binary("%")
    pow = _binary("**")

    @v_args(meta=True)
    def compare(self, meta, items):
        return Binary(self.span(meta), str(items[1]), items[0], items[2])


def _annotated(stage: Expr, annotations: list[Annotation]) -> Annotated:
    """A mid-chain stage with its annotations (``-> blocks[0:8]() @partition(0) ->``)."""
    last = annotations[-1].span
    span = Span(stage.span.source, stage.span.line, stage.span.column, last.end_line, last.end_column)
    return Annotated(span, stage, list(annotations))


def build(tree: Tree, source: Source) -> Program:
    return _Builder(source).transform(tree)


# ----------------------------------------------------------------------------
# Printing
# ----------------------------------------------------------------------------


def dump(node: Any, indent: int = 0) -> str:
    """An indented, line-per-node rendering with ``@line:col`` positions."""
    pad = "  " * indent
    if isinstance(node, list):
        return "".join(dump(n, indent) for n in node)
    if not isinstance(node, Node):
        return f"{pad}{node!r}\n"
    scalars, children = [], []
    for f in fields(node):
        if f.name in ("span", "source", "by_name"):
            continue
        value = getattr(node, f.name)
        holds_nodes = not isinstance(value, list) or any(isinstance(v, (Node, tuple)) for v in value)
        if isinstance(value, (Node, list)) and holds_nodes:
            children.append((f.name, value))
        elif value not in (None, [], False) or f.name in ("value",):
            scalars.append(f"{f.name}={value!r}")
    where = f" @{node.span.line}:{node.span.column}"
    text = f"{pad}{type(node).__name__}{where}{' ' + ' '.join(scalars) if scalars else ''}\n"
    for name, value in children:
        text += f"{pad}  .{name}\n{dump(value, indent + 2)}"
    return text
