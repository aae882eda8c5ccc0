"""Parsing Module DSL source into a Lark tree (and, via ``ast.build``, into the AST).

The post-lexer does three things before Lark's indentation handling:

* a line that starts with ``->`` or with an annotation ``@`` continues the
  previous statement (unless that statement opened a section with ``:``);
* a ``-`` that starts a line is a list-item marker (``ITEM_DASH``), not a minus;
* ``x`` between ``]`` and a name is the array operator of ``[n] x Block(...)``.

Syntax errors become E001 diagnostics with the location, the offending line
and a hint listing what was expected. So do inputs no later stage could take:
bytes that are not UTF-8 (at the byte's line and column), expressions nested
deeper than :data:`MAX_DEPTH` (every stage after the parser recurses over the
tree) and integer literals outside i64. Lark's LALR tables are built once and
kept in the user's cache folder (:mod:`modeldsl.frontend.text.parser_cache`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path

from lark import Lark, Token, Tree
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken, VisitError
from lark.indenter import DedentError, Indenter

from modeldsl.diagnostics import Diagnostic, DiagnosticError, Source, Span
from modeldsl.files import read_regular_file
from modeldsl.frontend.text.parser_cache import cached_parser

GRAMMAR = Path(__file__).with_name("grammar.lark")
OPEN = {"LPAR", "LSQB", "LBRACE"}
CLOSE = {"RPAR", "RSQB", "RBRACE"}
# Deepest parse tree accepted. Real models stay under 30 levels; the AST builder,
# the constant evaluator and the lowering recurse once or twice per level.
MAX_DEPTH = 150


class ModuleDslIndenter(Indenter):
    NL_type = "_NL"
    OPEN_PAREN_types = sorted(OPEN)
    CLOSE_PAREN_types = sorted(CLOSE)
    INDENT_type = "_INDENT"
    DEDENT_type = "_DEDENT"
    tab_len = 8

    def process(self, stream: Iterator[Token]) -> Iterator[Token]:
        return super().process(_rewrite(stream))

    def handle_NL(self, token: Token) -> Iterator[Token]:  # noqa: N802 - Lark's name
        try:
            yield from super().handle_NL(token)
        except DedentError as err:
            raise IndentationProblem(token.end_line, token.end_column, str(err)) from None


class IndentationProblem(Exception):
    """A dedent to a column that no enclosing block started at."""

    def __init__(self, line: int, column: int, detail: str):
        super().__init__(detail)
        self.line, self.column = line, column


def _rewrite(stream: Iterator[Token]) -> Iterator[Token]:
    """Join continuation lines and retype line-start dashes and array ``x``."""
    depth = 0
    previous: Token | None = None
    at_line_start = True
    pending: Token | None = None
    tokens = iter(stream)
    while True:
        token = pending if pending is not None else next(tokens, None)
        pending = None
        if token is None:
            return
        if token.type == "_NL" and depth == 0:
            following = next(tokens, None)
            continues = (
                following is not None
                and following.value in ("->", "@")
                and previous is not None
                and previous.type not in ("COLON", "LONG_STRING")  # a doc string takes no annotations
            )
            pending = following
            if continues:
                continue
            at_line_start = True
            previous = token
            yield token
            continue
        if token.type in OPEN:
            depth += 1
        elif token.type in CLOSE:
            depth = max(0, depth - 1)
        if at_line_start and depth == 0 and token.type == "MINUS":
            token = Token.new_borrow_pos("ITEM_DASH", token.value, token)
        elif token.type == "NAME" and token.value == "x" and previous is not None and previous.type == "RSQB":
            following = next(tokens, None)
            if following is not None and following.type == "NAME":
                token = Token.new_borrow_pos("TIMES", token.value, token)
            pending = following
        at_line_start = False
        previous = token
        yield token


@lru_cache(maxsize=1)
def _parser() -> Lark:
    """The LALR parser of the grammar, built once per user cache (:mod:`.parser_cache`)."""
    grammar = GRAMMAR.read_text()
    return cached_parser(grammar, Path(__file__).read_bytes(), lambda: _build_parser(grammar))


def _build_parser(grammar: str) -> Lark:
    return Lark(
        grammar,
        parser="lalr",
        lexer="basic",
        postlex=ModuleDslIndenter(),
        propagate_positions=True,
        maybe_placeholders=True,
    )


PROSE_SECTIONS = re.compile(r"^([ \t]*)(compiler_behavior|runtime_behavior):[ \t]*$")


def quote_prose(text: str) -> str:
    """The indented body of a ``compiler_behavior:``/``runtime_behavior:`` section of an
    annotation declaration is prose (spec 7): quote it as a long string, on the same
    lines so that positions stay right."""
    lines = text.split("\n")
    index = 0
    while index < len(lines):
        match = PROSE_SECTIONS.match(lines[index])
        if match is None:
            index += 1
            continue
        indent, last = len(match.group(1).expandtabs(8)), index
        for following in range(index + 1, len(lines)):
            stripped = lines[following].strip()
            if stripped and len(lines[following]) - len(lines[following].lstrip()) <= indent:
                break
            if stripped:
                last = following
        body = lines[index + 1: last + 1]
        if last > index and not any('"""' in line for line in body):
            lines[index] += ' """'
            lines[last] += '"""'
        index = last + 1
    return "\n".join(lines)


def parse_tree(text: str, name: str = "<input>") -> Tree:
    """The Lark parse tree of a source; syntax errors raise DiagnosticError(E001)."""
    source = Source(name, text)
    if "_behavior:" in text:
        text = quote_prose(text)
    if not text.endswith("\n"):
        text += "\n"
    try:
        tree = _parser().parse(text)
    except UnexpectedInput as err:
        raise DiagnosticError([_syntax_error(source, err)]) from None
    except IndentationProblem as err:
        span = Span(source, err.line, err.column, err.line, err.column + 1)
        raise DiagnosticError([Diagnostic(
            "E001", "syntax error: inconsistent indentation: this line is not aligned with any enclosing block",
            span, "indent each line like the other lines of its block")]) from None
    _check_depth(tree, source)
    return tree


def _check_depth(tree: Tree, source: Source) -> None:
    """E001 at the start of the first expression nested deeper than MAX_DEPTH (walked
    without recursion)."""
    stack: list[tuple[Tree, int, Tree]] = [(tree, 1, tree)]
    while stack:
        node, depth, outermost = stack.pop()
        if depth > MAX_DEPTH:
            meta = outermost.meta
            line, column = (meta.line, meta.column) if not meta.empty else (1, 1)
            span = Span(source, line, column, line, column + 1)
            what = "blocks" if outermost.data in _STATEMENT_RULES else "expression"
            raise DiagnosticError([Diagnostic(
                "E001", f"{what} nested too deeply (more than {MAX_DEPTH} levels)", span,
                "split it into named steps (let: bindings, separate flows or modules)")])
        for child in node.children:
            if isinstance(child, Tree):
                stack.append((child, depth + 1, child if node.data in _STATEMENT_RULES else outermost))


# Rules whose children start a new expression (where a too-deep expression is reported).
_STATEMENT_RULES = {"start", "declaration", "body", "section", "key", "value", "default", "guard", "flow",
                    "binding", "if_stmt", "else_clause", "list_item", "list_flow", "constraint", "expr_stmt",
                    "annotation_stmt", "signature", "param", "docstring"}


def _syntax_error(source: Source, err: UnexpectedInput) -> Diagnostic:
    line = getattr(err, "line", None) or 1
    column = getattr(err, "column", None) or 1
    if isinstance(err, UnexpectedEOF) or line < 1:
        lines = source.text.splitlines() or [""]
        line, column = len(lines), len(lines[-1]) + 1
    width = 1
    hint = ""
    if isinstance(err, UnexpectedToken):
        what = _describe(err.token)
        width = max(1, len(str(err.token.value).split("\n")[0]))
        if err.token.type in ("_INDENT", "_DEDENT"):
            line, column = err.token.end_line or line, err.token.end_column or column
            width = 1
            if err.token.type == "_INDENT":
                hint = "the line before an indented block must end with ':' (a section such as 'params:')"
        message = f"unexpected {what}"
        expected = sorted(_pretty(t) for t in err.accepts or err.expected)
        if err.token.type in ("$END", "_DEDENT") and _at_end(source, line):
            line, column, width = _end_position(source)
            message = "unexpected end of input"
            if {"')'", "']'", "'}'"} & set(expected):
                hint = "a bracket opened earlier is never closed"
    elif isinstance(err, UnexpectedCharacters):
        message = (f"unexpected character {source.text[err.pos_in_stream]!r}"
                   if err.pos_in_stream < len(source.text) else "unexpected end of input")
        expected = sorted(_pretty(t) for t in err.allowed or [])
    else:
        message = "unexpected end of input"
        expected = sorted(_pretty(t) for t in getattr(err, "expected", []) or [])
    if expected and not hint:
        hint = f"expected {', '.join(expected[:10])}{', ...' if len(expected) > 10 else ''}"
    span = Span(source, line, column, line, column + width)
    return Diagnostic("E001", f"syntax error: {message}", span, hint)


def _at_end(source: Source, line: int) -> bool:
    return line > len(source.text.rstrip("\n").splitlines())


def _end_position(source: Source) -> tuple[int, int, int]:
    """Line, column and width of the end of the last non-blank line."""
    lines = source.text.rstrip().splitlines() or [""]
    return len(lines), len(lines[-1]) + 1, 1


_TOKEN_NAMES = {
    "_NL": "end of line", "_INDENT": "indentation", "_DEDENT": "end of the block",
    "NAME": "a name", "INT": "an integer", "FLOAT": "a number", "STRING": "a string",
    "LONG_STRING": "a doc string", "COLON": "':'", "LPAR": "'('", "RPAR": "')'", "LSQB": "'['",
    "RSQB": "']'", "COMMA": "','", "EQUAL": "'='", "ITEM_DASH": "'-'", "$END": "end of input",
}


def _pretty(terminal: str) -> str:
    if terminal in _TOKEN_NAMES:
        return _TOKEN_NAMES[terminal]
    literal = _literals().get(terminal)
    return f"'{literal}'" if literal is not None else terminal.lower()


@lru_cache(maxsize=1)
def _literals() -> dict[str, str]:
    """Terminal name -> its literal text, for the string terminals of the grammar."""
    return {t.name: t.pattern.value for t in _parser().terminals if t.pattern.type == "str"}


def _describe(token: Token) -> str:
    if token.type == "$END" or (token.type in ("_DEDENT",) and not token.value):
        return "end of input" if token.type == "$END" else _TOKEN_NAMES[token.type]
    if token.type in ("_NL", "_INDENT", "_DEDENT") or token.value == "":
        return _TOKEN_NAMES[token.type]
    return f"'{token.value}'"


def parse_source(text: str, name: str = "<input>"):
    """Parse source text into the AST (see ``modeldsl.frontend.text.ast``)."""
    from modeldsl.frontend.text.ast import LiteralOutOfRange, build

    source = Source(name, text)
    try:
        return build(parse_tree(text, name), source)
    except VisitError as err:
        if isinstance(err.orig_exc, LiteralOutOfRange):
            raise DiagnosticError([err.orig_exc.diagnostic]) from None
        raise


def decode_source(data: bytes, name: str) -> str:
    """The text of a source file; bytes that are not UTF-8 are E001 at their line:col."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        before = data[: err.start].decode("utf-8", errors="replace")
        line = before.count("\n") + 1
        column = len(before) - (before.rfind("\n") + 1) + 1
        text = data.decode("utf-8", errors="replace")
        span = Span(Source(name, text), line, column, line, column + 1)
        raise DiagnosticError([Diagnostic(
            "E001", f"the byte 0x{data[err.start]:02x} is not UTF-8 text", span,
            "Module DSL files are UTF-8; re-save the file as UTF-8")]) from None


def read_source(path) -> str:
    """The UTF-8 text of a ``.module`` file; E028 when it cannot be read (a folder, a
    missing file; a FIFO or device is refused rather than read), E001 for non-UTF-8 bytes."""
    return decode_source(read_regular_file(path, "check the path of the .module file"), str(path))


def parse_file(path) -> "object":
    """Parse a ``.module`` file (see :func:`read_source` for the errors)."""
    return parse_source(read_source(path), str(path))
