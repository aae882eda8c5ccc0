"""Coded diagnostics for bad input of any kind: DSL source, checkpoints, configs, flags.

A :class:`Diagnostic` has a code (E001-E027 and W001-W005 of spec 000
Appendix C/D, plus project codes E028-E049 and W006-W013), a message, a
hint and a location. It renders the way compilers print errors::

    model.module:12:5: error[E002]: undefined identifier 'wieght'
       12 |     in -> matmul(wieght) -> out
          |                  ^^^^^^
    hint: did you mean 'weight'?

and as JSON (``{code, severity, message, hint, location}``) for
``--diagnostics-format=json``. Several independent diagnostics are collected
in a :class:`DiagnosticSink` and raised together as a
:class:`DiagnosticError`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

CODES: dict[str, str] = {
    "E001": "Syntax error",
    "E002": "Undefined identifier",
    "E003": "Type mismatch",
    "E004": "Shape mismatch",
    "E005": "Missing required gradient",
    "E006": "Saved tensor not available in backward",
    "E007": "Circular dependency in graph",
    "E008": "Invalid annotation",
    "E009": "Duplicate parameter name",
    "E010": "Invalid weight mapping",
    "E011": "Incompatible inheritance",
    "E012": "Missing required parameter",
    "E013": "Invalid fusion pattern",
    "E014": "Unsupported primitive",
    "E015": "Invalid dtype for operation",
    "E016": "`if` guard must be ConstExpr",
    "E017": "Tensor redefinition in same scope (SSA violation)",
    "E018": "Gradient shape mismatch",
    "E019": "Circular gradient dependency",
    "E020": "Gradient dtype incompatible",
    "E021": "Recompute tensor not derivable from saved tensors",
    "E022": "Circular recompute dependency",
    "E023": "Import name conflict",
    "E024": "Import alias shadows existing name",
    "E025": "Checkpoint spans pipeline stages",
    "E026": "Invalid constraint expression",
    "E027": "Constraint violation",
    "E028": "File not found or unreadable",
    "E029": "Invalid option, flag or binding",
    "E030": "Checkpoint config missing or invalid",
    "E031": "Checkpoint tensor missing",
    "E032": "Checkpoint tensor shape mismatch",
    "E033": "Checkpoint tensor dtype mismatch",
    "E034": "Checkpoint file truncated or corrupt",
    "E035": "CUDA kernel build failed",
    "E036": "Checkpoint architecture not served by the model",
    "E037": "Checkpoint config field not supported by the model",
    "E038": "Model does not fit in memory",
    "E039": "Lock file mismatch",
    "E040": "Unexpected checkpoint tensor",
    "E041": "IR does not verify",
    "E042": "@lifetime names an op that does not run where the tensor lives",
    "E043": "Kernel not available",
    "E044": "Output folder holds files this run did not write",
    "E045": "Output file exists and was not named",
    "E046": "Runtime assertion failed",
    "E047": "Adapter target not found or not adaptable",
    "E048": "Parallel layout does not fit the model or the launched ranks",
    "E049": "Collective failed or timed out",
    "W001": "User definition shadows primitive",
    "W002": "Local definition shadows import",
    "W003": "Suboptimal auto-derived backward",
    "W004": "Unused saved tensor",
    "W005": "Implicit dtype narrowing",
    "W006": "Unexpected checkpoint tensor",
    "W007": "Option has no effect",
    "W008": "Generation stopped at the context limit",
    "W009": "Resumed training reads different data",
    "W010": "Safety check overridden",
    "W011": "Suspicious checkpoint value",
    "W012": "Kernel not available; default kept",
    "W013": "Annotation has no effect",
    "W014": "Training examples cut or left out",
}


@dataclass(frozen=True)
class Source:
    """A named source text (a file, or a string given on the command line)."""

    name: str
    text: str

    def line(self, number: int) -> str:
        lines = self.text.splitlines()
        return lines[number - 1] if 0 < number <= len(lines) else ""


@dataclass(frozen=True)
class Span:
    """A range of a source: 1-based line and column, end exclusive."""

    source: Source
    line: int
    column: int
    end_line: int
    end_column: int

    @property
    def location(self) -> str:
        return f"{self.source.name}:{self.line}:{self.column}"

    def word(self, word: str, last: bool = False) -> "Span":
        """The span of the first (or last) whole-word ``word`` inside this span; itself if absent."""
        matches = []
        for number in range(self.line, self.end_line + 1):
            line = self.source.line(number)
            start = self.column - 1 if number == self.line else 0
            end = self.end_column - 1 if number == self.end_line else len(line)
            matches += [(number, m.start()) for m in re.finditer(rf"(?<!\w){re.escape(word)}(?!\w)", line[:end])
                        if m.start() >= start]
        if not matches:
            return self
        number, index = matches[-1] if last else matches[0]
        return Span(self.source, number, index + 1, number, index + 1 + len(word))

    @property
    def text(self) -> str:
        """The exact source text the span covers."""
        lines = self.source.text.splitlines()[self.line - 1 : self.end_line]
        if not lines:
            return ""
        if len(lines) == 1:
            return lines[0][self.column - 1 : self.end_column - 1]
        return "\n".join([lines[0][self.column - 1 :], *lines[1:-1], lines[-1][: self.end_column - 1]])

    def to_json(self) -> dict:
        return {
            "file": self.source.name,
            "line": self.line,
            "column": self.column,
            "end_line": self.end_line,
            "end_column": self.end_column,
        }

    def caret_lines(self) -> str:
        """The source line and a caret line under the span (first line only); a line longer than
        :data:`SHOWN_COLUMNS` is cut around the span, with ``...`` where it was cut."""
        text = self.source.line(self.line)
        end = self.end_column if self.end_line == self.line else len(text) + 1
        shown, start, width = cut_around(text, self.column - 1, max(self.column, end) - 1)
        gutter = f"{self.line:>5} | "
        return f"{gutter}{shown}\n{' ' * (len(gutter) - 2)}| {' ' * start}{'^' * width}\n"


SHOWN_COLUMNS = 120
ELLIPSIS = "..."


def cut_around(text: str, start: int, end: int, columns: int = SHOWN_COLUMNS) -> tuple[str, int, int]:
    """``text`` cut to about ``columns`` characters around ``text[start:end]`` (0-based, end
    exclusive), as rustc shows long lines: the shown text, where its caret starts and how many
    carets (at least one; a span wider than the window is shown from its start)."""
    if len(text) <= columns:
        return text, start, max(1, end - start)
    room = columns - 2 * len(ELLIPSIS)
    width = max(1, min(end - start, room // 2))
    lo = max(0, min(start - (room - width) // 2, len(text) - room))
    hi = min(len(text), lo + room)
    prefix = ELLIPSIS if lo > 0 else ""
    suffix = ELLIPSIS if hi < len(text) else ""
    return prefix + text[lo:hi] + suffix, len(prefix) + start - lo, width


@dataclass
class Diagnostic:
    code: str
    message: str
    span: Span | None = None
    hint: str = ""
    notes: list[tuple[str, Span]] = field(default_factory=list)

    @property
    def severity(self) -> str:
        return "warning" if self.code.startswith("W") else "error"

    def render(self) -> str:
        where = f"{self.span.location}: " if self.span is not None else ""
        text = f"{where}{self.severity}[{self.code}]: {self.message}\n"
        if self.span is not None:
            text += self.span.caret_lines()
        for note, span in self.notes:
            text += f"{span.location}: note: {note}\n{span.caret_lines()}"
        if self.hint:
            text += f"hint: {self.hint}\n"
        return text

    def to_json(self) -> dict:
        return {
            "code": self.code,
            "severity": self.severity,
            "message": self.message,
            "hint": self.hint,
            "location": self.span.to_json() if self.span is not None else None,
        }


class PassOptionError(ValueError):
    """A pass option whose value the pass refuses (raised while the pass is made, so ``mdsl-opt``
    points at the option in the pipeline text); ``diagnostic()`` is the E029 without a place."""

    def __init__(self, message: str, option: str, hint: str = ""):
        super().__init__(message)
        self.option, self.hint = option, hint

    def diagnostic(self) -> Diagnostic:
        return Diagnostic("E029", str(self), None, self.hint)


class DiagnosticError(Exception):
    """One or more error diagnostics (warnings may ride along)."""

    def __init__(self, diagnostics: list[Diagnostic]):
        self.diagnostics = diagnostics
        super().__init__("\n".join(d.render() for d in diagnostics))

    @property
    def errors(self) -> list[Diagnostic]:
        return [d for d in self.diagnostics if d.severity == "error"]


class DiagnosticSink:
    """Collects diagnostics so that independent errors are all reported in one run."""

    def __init__(self) -> None:
        self.diagnostics: list[Diagnostic] = []

    def error(self, code: str, message: str, span: Span | None = None, hint: str = "") -> Diagnostic:
        return self.add(Diagnostic(code, message, span, hint))

    def warning(self, code: str, message: str, span: Span | None = None, hint: str = "") -> Diagnostic:
        return self.add(Diagnostic(code, message, span, hint))

    def add(self, diagnostic: Diagnostic) -> Diagnostic:
        if diagnostic.code not in CODES:
            raise ValueError(f"unknown diagnostic code {diagnostic.code}")
        self.diagnostics.append(diagnostic)
        return diagnostic

    @property
    def has_errors(self) -> bool:
        return any(d.severity == "error" for d in self.diagnostics)

    def raise_if_errors(self) -> None:
        if self.has_errors:
            raise DiagnosticError(self.diagnostics)


def render_all(diagnostics: list[Diagnostic], fmt: str = "text") -> str:
    """All diagnostics as text (blank line between) or as a JSON list."""
    if fmt == "json":
        return json.dumps([d.to_json() for d in diagnostics], indent=2) + "\n"
    return "\n".join(d.render() for d in diagnostics)
