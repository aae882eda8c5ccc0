"""Reading, verifying and printing modeldsl IR text.

One place that knows which dialects make up the project's IR, how to parse it
while remembering where every op came from, and how to report verifier
failures as ``file:line:col`` diagnostics with a caret (never a traceback).

It also hardens xDSL's parsing for any input: the string-literal pattern of
xDSL's lexer (which backtracks exponentially on an unterminated string) is
replaced by an equivalent linear one, integer types wider than 64 bits are a
located E001, and the verifier checks that every operand is defined before
its use (E017). IR lowered from a ``.module`` carries ``loc("file":line:col)``
locations (:func:`located`) that diagnostics point back at.
"""

from __future__ import annotations

import io
import os
import re
import stat
import sys
from contextlib import contextmanager
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import Builtin, FileLineColLoc, IntAttr, ModuleOp, StringAttr
from xdsl.ir import Block, BlockArgument, Operation, OpResult, SSAValue
from xdsl.parser import Parser
from xdsl.pattern_rewriter import PatternRewriter
from xdsl.printer import Printer
from xdsl.rewriter import Rewriter
from xdsl.utils.exceptions import DiagnosticException, ParseError, VerifyException
from xdsl.utils.lexer import Span
from xdsl.utils.mlir_lexer import MLIRLexer, MLIRTokenKind

from modeldsl.diagnostics import Diagnostic, Source
from modeldsl.diagnostics import Span as SourceSpan

MAX_INTEGER_WIDTH = 64

# xDSL 0.74 lexes strings with '"(?:[^"\\...]+|\\...)*"': a run of plain characters
# splits in exponentially many ways when the closing quote is missing. One
# character per repetition (possessive) matches the same strings in linear time.
MLIRLexer._unescaped_characters_regex = re.compile(  # noqa: SLF001
    r'"(?:[^"\\\n\v\f]|\\(?:["nt\\]|[0-9A-Fa-f]{2}))*+"'
)


_xdsl_int_value = MLIRTokenKind.get_int_value


def _int_value(kind: MLIRTokenKind, span: Span) -> int:
    """xDSL's integer literal value; a literal past Python's digit limit is a located parse
    error (xDSL lets ``int()``'s ValueError escape)."""
    limit = sys.get_int_max_str_digits()
    if kind == MLIRTokenKind.INTEGER_LIT and limit and len(span.text) > limit:
        raise ParseError(span, f"integer literal of {len(span.text)} digits is too long (at most {limit})")
    return _xdsl_int_value(kind, span)


MLIRTokenKind.get_int_value = _int_value


def _pass_on_location(op: Operation, new_ops) -> None:
    """New ops without a source location take the one of the op they replace (as xDSL
    already passes on result names): a rewritten op still points at its source."""
    if not isinstance(op.location, FileLineColLoc):
        return
    for new in [new_ops] if isinstance(new_ops, Operation) else new_ops:
        if not isinstance(new.location, FileLineColLoc):
            new.location = op.location


_xdsl_pattern_replace = PatternRewriter.replace
_xdsl_replace_op = Rewriter.replace_op


def _pattern_replace(self, op, new_ops, *args, **kwargs):
    _pass_on_location(op, new_ops)
    return _xdsl_pattern_replace(self, op, new_ops, *args, **kwargs)


def _replace_op(op, new_ops, *args, **kwargs):
    _pass_on_location(op, new_ops)
    return _xdsl_replace_op(op, new_ops, *args, **kwargs)


_xdsl_replace_value_with_new_type = Rewriter.replace_value_with_new_type


def _replace_value_with_new_type(val, new_type):
    """A block argument retyped (``mdsl-specialize`` binding its shape) keeps its location."""
    new_value = _xdsl_replace_value_with_new_type(val, new_type)
    if isinstance(val, BlockArgument) and isinstance(new_value, BlockArgument):
        new_value.location = val.location
    return new_value


PatternRewriter.replace = _pattern_replace
Rewriter.replace_op = staticmethod(_replace_op)
Rewriter.replace_value_with_new_type = staticmethod(_replace_value_with_new_type)


def load_dialects(ctx: Context) -> Context:
    """Load builtin, func and the project's dialects eagerly (dotted names need it)."""
    from xdsl.dialects.func import Func

    from modeldsl.dialects.graph import Graph
    from modeldsl.dialects.sched import Sched

    for dialect in (Builtin, Func, Graph, Sched):
        if dialect.name not in ctx.registered_dialect_names:
            ctx.load_dialect(dialect)
    return ctx


def make_context() -> Context:
    return load_dialects(Context())


class LocatingParser(Parser):
    """An xDSL parser that remembers the source span where each op starts and, as
    MLIR's parser does, gives an op without an explicit ``loc(...)`` the location
    ``loc("file":line:col)`` of its text (lines counted from ``line_offset``, for
    ``--split-input-file`` chunks)."""

    def __init__(self, ctx: Context, text: str, name: str = "<input>", line_offset: int = 0):
        super().__init__(ctx, text, name)
        self.line_offset = line_offset
        self._location_ends_at = -1  # where the last loc(...) parsed ends
        self._line_mark = (0, 1)  # a position and its line, for _line_and_column
        self.op_spans: dict[Operation, Span] = {}
        self.first_uses: dict[str, Span] = {}  # values used before any definition

    def parse_optional_location(self):
        location = super().parse_optional_location()
        if location is not None:
            self._location_ends_at = self.pos
        return location

    def resolve_operand(self, operand, type):
        if operand.operand_name not in self.ssa_values:
            self.first_uses.setdefault(operand.operand_name, operand.span)
        return super().resolve_operand(operand, type)

    def parse_module(self, allow_implicit_module: bool = True) -> ModuleOp:
        """xDSL's parse, with a value that is never defined reported at its first use; empty
        input (or only comments) is an empty module, as for mlir-opt."""
        if allow_implicit_module and self._current_token.kind == MLIRTokenKind.EOF:
            return ModuleOp([])
        try:
            return super().parse_module(allow_implicit_module)
        except RecursionError:
            raise ParseError(self._current_token.span, "the IR nests too deeply to parse (regions, attributes "
                             "or types more than about a hundred levels deep)") from None
        except ParseError as err:
            undefined = [n for n in self.forward_ssa_references if n in self.first_uses]
            if not err.msg.startswith("values used but not defined") or not undefined:
                raise
            names = ", ".join(f"%{n}" for n in undefined)
            raise ParseError(self.first_uses[undefined[0]], f"value %{undefined[0]} is used but not defined "
                             f"where it is visible (undefined: {names})") from None

    def parse_operation(self) -> Operation:
        start = self._current_token.span
        line, column = self._line_and_column(start.start)  # before the nested ops: in text order
        with self._failures_located_from(start.start):
            op = super().parse_operation()
        self.op_spans[op] = _through_op_name(start, op.name)
        if self._location_ends_at != self.pos:  # the op has no loc(...) of its own
            op.location = FileLineColLoc(StringAttr(self.lexer.input.name), IntAttr(line + self.line_offset),
                                         IntAttr(column))
        return op

    def _line_and_column(self, pos: int) -> tuple[int, int]:
        """What ``Span.get_location`` gives for ``pos``, counting newlines only from the
        position asked last (it counts from the start of the text: quadratic over a file)."""
        text, newline = self.lexer.input.content, self.lexer.input.newline
        last_pos, last_line = self._line_mark
        if pos >= last_pos:
            line = last_line + text.count(newline, last_pos, pos)
        else:
            line = last_line - text.count(newline, pos, last_pos)
        self._line_mark = (pos, line)
        return line, pos - (text.rfind(newline, 0, pos) + 1) + 1

    def parse_optional_attribute(self):
        with self._failures_located_from(self.pos):
            return super().parse_optional_attribute()

    @contextmanager
    def _failures_located_from(self, start: int):
        """An attribute or op that xDSL refuses while building it (a value out of its
        type's range, a bad property) is a parse error spanning its text, not a bare exception."""
        try:
            yield
        except (VerifyException, DiagnosticException, ValueError, OverflowError) as err:
            if isinstance(err, ParseError):
                raise
            end = max(self._current_token.span.start, start + 1)
            text = self.lexer.input.content[start:end].rstrip()
            span = Span(start, start + max(1, len(text)), self.lexer.input)
            raise ParseError(span, _error_message(err).split("\n", 1)[0]) from None

    def _parse_optional_integer_or_float_type(self):
        token = self._current_token
        match = self._builtin_integer_type_regex.match(token.text)
        if match is not None and int(match.group(1)) > MAX_INTEGER_WIDTH:
            self.raise_error(f"integer type '{token.text}' is wider than {MAX_INTEGER_WIDTH} bits, "
                             "the widest integer modeldsl's IR holds", token.span.start, token.span.end)
        return super()._parse_optional_integer_or_float_type()


def _through_op_name(start: Span, op_name: str) -> Span:
    """Widen the span of an op's first token to end after its name on that line."""
    text = start.input.content
    line_end = text.find("\n", start.start)
    found = text.find(op_name, start.start, len(text) if line_end < 0 else line_end)
    if found < 0:
        return start
    return Span(start.start, found + len(op_name), start.input)


@dataclass
class IRDiagnostic:
    """A verifier failure located at the op that caused it: at its span in the IR
    text it was parsed from, else at its ``loc("file":line:col)`` location."""

    op_name: str
    message: str
    span: Span | None
    code: str = "E041"
    location: object = None

    @property
    def text(self) -> str:
        return f"'{self.op_name}' op {self.message}"

    def diagnostic(self) -> Diagnostic:
        """As a coded diagnostic (E041 unless the failure has its own code)."""
        if self.span is not None:
            where = source_span(self.span)
        else:
            where = span_of_location(self.location, self.op_name)
        return Diagnostic(self.code, self.text, where)

    def render(self) -> str:
        return self.diagnostic().render()


def source_span(span: Span) -> SourceSpan:
    """An xDSL lexer span as a diagnostics span (its lines counted across split chunks)."""
    location = span.get_location()
    start = span.input.get_start_of_line(span.start)
    text = span.input.content
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    padded = "\n" * span.line_offset + text  # lines before a --split-input-file chunk
    end_line_start = span.input.get_start_of_line(max(span.start, span.end - 1))
    end_line = location.line + span.input.content.count(span.input.newline, start, end_line_start)
    end_column = span.end - end_line_start + 1 if span.end > span.start else location.col + 1
    return SourceSpan(Source(span.input.name, padded), location.line, location.col, end_line, end_column)


class LocatedParseError(ParseError):
    """A parse error printed the way compilers print them: ``file:line:col: error[E001]:
    message``, then the source line and a caret under the span."""

    def diagnostic(self) -> Diagnostic:
        return Diagnostic("E001", self.msg, source_span(self.span))

    def __str__(self) -> str:
        return self.diagnostic().render()


# ----------------------------------------------------------------------------- source locations


def replace_with_twin(old: Operation, new: Operation, rewriter: PatternRewriter | None = None) -> None:
    """``new`` (``old`` rebuilt, with other operands or types) in place of ``old``: ``old``'s attributes
    on it, each result's name on the result that replaces it (xDSL passes on the first one's alone),
    and its location (:func:`_pass_on_location`); through ``rewriter`` where a pattern replaces it."""
    new.attributes.update(old.attributes)
    for before, after in zip(old.results, new.results):
        after.name_hint = before.name_hint
    if rewriter is not None:
        rewriter.replace(old, new)
    else:
        Rewriter.replace_op(old, new)


def located(op: Operation, span: SourceSpan | None) -> Operation:
    """Give ``op`` the DSL location ``loc("file":line:col)`` of ``span`` unless it has one."""
    if span is not None and not isinstance(op.location, FileLineColLoc):
        op.location = FileLineColLoc(StringAttr(span.source.name), IntAttr(span.line), IntAttr(span.column))
    return op


def located_argument(arg: BlockArgument, span: SourceSpan | None) -> BlockArgument:
    """Give a function argument the DSL location of ``span`` (the input or parameter it stands
    for), which ``--print-debuginfo`` prints after its type, unless it has one."""
    if span is not None and not isinstance(arg.location, FileLineColLoc):
        arg.location = FileLineColLoc(StringAttr(span.source.name), IntAttr(span.line), IntAttr(span.column))
    return arg


def locate_new_ops(block: Block | None, before: Operation | None, span: SourceSpan | None) -> None:
    """Give the ops added to ``block`` after ``before`` (all, when None) the location of
    ``span``, and every op nested in them that has none yet."""
    if block is None or span is None:
        return
    op = block.first_op if before is None else before.next_op
    while op is not None:
        for inner in op.walk():
            located(inner, span)
        op = op.next_op


def span_of_location(location: object, word: str = "") -> SourceSpan | None:
    """The source span of a ``loc("file":line:col)`` location (the identifier there
    underlined), or None for an unknown location or a file that cannot be read."""
    if not isinstance(location, FileLineColLoc):
        return None
    name, line, column = location.filename.data, location.line.data, location.column.data
    source = Source(name, _file_text(name))
    text = source.line(line)
    match = re.compile(r"[A-Za-z_][\w.]*|\S").match(text, column - 1) if text else None
    end = match.end() + 1 if match is not None else column + 1
    return SourceSpan(source, line, column, line, end)


def span_of_annotation(location: object, annotation: str) -> SourceSpan | None:
    """The span of ``annotation`` (``@lifetime``, with its arguments) on the line of a ``loc(...)``
    at or after its column; the location's own span where the line has no such annotation."""
    span = span_of_location(location)
    if span is None:
        return None
    text = span.source.line(span.line)
    start = text.find(annotation, span.column - 1)
    if start < 0:
        return span
    end = start + len(annotation)
    if text[end:end + 1] == "(":
        end = _after_closing_paren(text, end)
    return SourceSpan(span.source, span.line, start + 1, span.line, end + 1)


def _after_closing_paren(text: str, opening: int) -> int:
    """The index after the parenthesis that closes the one at ``opening`` (the text's end when none does)."""
    depth = 0
    for at in range(opening, len(text)):
        depth += {"(": 1, ")": -1}.get(text[at], 0)
        if depth == 0:
            return at + 1
    return len(text) - 1


_SOURCES: dict[str, str] = {}


def remember_source(name: str, text: str) -> None:
    """Keep a source's text (stdin, an edited buffer) for the diagnostics that point into it."""
    _SOURCES[name] = text


def _file_text(name: str) -> str:
    """The text of the file a ``loc(...)`` names, to show its line ("" when it is not a readable
    regular file: a FIFO or device named there is never opened, so nothing blocks)."""
    if name not in _SOURCES:
        try:
            if not stat.S_ISREG(os.stat(name).st_mode):
                return ""
            with open(name, "rb") as f:
                _SOURCES[name] = f.read(1 << 24).decode("utf-8", "replace")
        except OSError:
            return ""
    return _SOURCES[name]


def _error_message(err: Exception) -> str:
    """The verifier's own words, without xDSL's dump of the whole module."""
    cause = err.__cause__ if isinstance(err, DiagnosticException) else None
    message = str(cause if isinstance(cause, VerifyException) else err)
    return message.removeprefix("Operation does not verify: ").strip()


def verify_module(module: Operation, spans: dict[Operation, Span] | None = None) -> list[IRDiagnostic]:
    """Verify every op on its own, collecting one diagnostic per failing op; an
    operand used before its definition is one too (and the op is not verified further)."""
    spans = spans or {}
    diagnostics: list[IRDiagnostic] = []
    order = _OpOrder()
    for op in module.walk():
        problem = _undominated_operand(op, order)
        if problem is not None:
            diagnostics.append(IRDiagnostic(op.name, problem, spans.get(op), code="E017", location=op.location))
            continue
        try:
            op.verify(verify_nested_ops=False)
        except (VerifyException, DiagnosticException) as err:
            diagnostics.append(IRDiagnostic(op.name, _error_message(err), spans.get(op), location=op.location))
        except Exception as err:  # noqa: BLE001 - a verifier that trips on odd IR is still a verifier failure
            diagnostics.append(IRDiagnostic(op.name, f"does not verify ({type(err).__name__}: {err})",
                                            spans.get(op), location=op.location))
    return diagnostics


class _OpOrder:
    """The index of each op in its block, computed once per block."""

    def __init__(self) -> None:
        self.index: dict[Operation, int] = {}
        self.blocks: set[Block] = set()

    def of(self, op: Operation) -> int:
        block = op.parent_block()
        if block is not None and block not in self.blocks:
            self.blocks.add(block)
            self.index.update((o, k) for k, o in enumerate(block.ops))
        return self.index.get(op, -1)


def _undominated_operand(op: Operation, order: _OpOrder) -> str | None:
    """Why an operand of ``op`` is not visible there (used before its definition, or
    defined in a region that does not enclose it); None when all are."""
    for number, operand in enumerate(op.operands):
        where = _definition_block(operand)
        user = op
        while user is not None and user.parent_block() is not where:
            user = user.parent_op()
        name = f"%{operand.name_hint}" if operand.name_hint else f"operand #{number}"
        if user is None:
            return f"{name} is used outside the region that defines it"
        if isinstance(operand, OpResult) and order.of(user) <= order.of(operand.op):
            return f"{name} is used before its definition"
    return None


def _definition_block(value: SSAValue) -> Block | None:
    if isinstance(value, BlockArgument):
        return value.block
    if isinstance(value, OpResult):
        return value.op.parent_block()
    return None


def parse_module(ctx: Context, text: str, name: str = "<input>") -> tuple[ModuleOp, dict[Operation, Span]]:
    """Parse IR text; parse errors come out as :class:`LocatedParseError`."""
    parser = LocatingParser(ctx, text, name)
    try:
        module = parser.parse_module()
    except ParseError as err:
        raise LocatedParseError(err.span, err.msg) from None
    return module, parser.op_spans


def print_ir(op: Operation, generic: bool = False, debuginfo: bool = False) -> str:
    stream = io.StringIO()
    Printer(stream=stream, print_generic_format=generic, print_debuginfo=debuginfo).print_op(op)
    stream.write("\n")
    return stream.getvalue()
