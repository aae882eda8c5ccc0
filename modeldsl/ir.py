"""Reading, verifying and printing modeldsl IR text.

One place that knows which dialects make up the project's IR, how to parse it
while remembering where every op came from, and how to report verifier
failures as ``file:line:col`` diagnostics with a caret (never a traceback).
"""

from __future__ import annotations

import io
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import Builtin, ModuleOp
from xdsl.dialects.func import Func
from xdsl.ir import Operation
from xdsl.parser import Parser
from xdsl.printer import Printer
from xdsl.utils.exceptions import DiagnosticException, ParseError, VerifyException
from xdsl.utils.lexer import Span


def load_dialects(ctx: Context) -> Context:
    """Load builtin, func and the project's dialects eagerly (dotted names need it)."""
    from modeldsl.dialects.graph import Graph
    from modeldsl.dialects.sched import Sched

    for dialect in (Builtin, Func, Graph, Sched):
        if dialect.name not in ctx.registered_dialect_names:
            ctx.load_dialect(dialect)
    return ctx


def make_context() -> Context:
    return load_dialects(Context())


class LocatingParser(Parser):
    """An xDSL parser that remembers the source span where each op starts."""

    def __init__(self, ctx: Context, text: str, name: str = "<input>"):
        super().__init__(ctx, text, name)
        self.op_spans: dict[Operation, Span] = {}

    def parse_operation(self) -> Operation:
        start = self._current_token.span
        op = super().parse_operation()
        self.op_spans[op] = _through_op_name(start, op.name)
        return op


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
    """A verifier failure located at the op that caused it."""

    op_name: str
    message: str
    span: Span | None

    def render(self) -> str:
        text = f"'{self.op_name}' op {self.message}"
        if self.span is None:
            return f"<unknown>: error: {text}\n"
        return render_located(self.span, text)


def render_located(span: Span, message: str) -> str:
    """``file:line:col: error: message``, then the source line and a caret under the span."""
    context = span.print_with_context().split("\n", 1)[1]
    return f"{span.get_location()}: error: {message}\n{context}"


class LocatedParseError(ParseError):
    """A parse error printed the way compilers print them (see :func:`render_located`)."""

    def __str__(self) -> str:
        return render_located(self.span, self.msg)


def _error_message(err: Exception) -> str:
    """The verifier's own words, without xDSL's dump of the whole module."""
    cause = err.__cause__ if isinstance(err, DiagnosticException) else None
    message = str(cause if isinstance(cause, VerifyException) else err)
    return message.removeprefix("Operation does not verify: ").strip()


def verify_module(module: Operation, spans: dict[Operation, Span] | None = None) -> list[IRDiagnostic]:
    """Verify every op on its own, collecting one diagnostic per failing op."""
    spans = spans or {}
    diagnostics: list[IRDiagnostic] = []
    for op in module.walk():
        try:
            op.verify(verify_nested_ops=False)
        except (VerifyException, DiagnosticException) as err:
            diagnostics.append(IRDiagnostic(op.name, _error_message(err), spans.get(op)))
    return diagnostics


def parse_module(ctx: Context, text: str, name: str = "<input>") -> tuple[ModuleOp, dict[Operation, Span]]:
    """Parse IR text; parse errors come out as :class:`LocatedParseError`."""
    parser = LocatingParser(ctx, text, name)
    try:
        module = parser.parse_module()
    except ParseError as err:
        raise LocatedParseError(err.span, err.msg) from None
    return module, parser.op_spans


def print_ir(op: Operation, generic: bool = False) -> str:
    stream = io.StringIO()
    Printer(stream=stream, print_generic_format=generic).print_op(op)
    stream.write("\n")
    return stream.getvalue()
