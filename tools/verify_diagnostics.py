"""``mdsl-opt --verify-diagnostics``: match diagnostics against ``expected-*`` annotations.

As mlir-opt does: a comment ``// expected-error {{message}}`` (``#`` in a
``.module`` file) expects an error whose message contains ``message`` on the
comment's own line; ``@+N`` / ``@-N`` move that line, ``@above`` / ``@below``
are ``@-1`` / ``@+1``. ``expected-warning``, ``expected-note`` and
``expected-remark`` work the same way (notes are those attached to a
diagnostic). Every produced diagnostic must be expected and every expectation
met; each failure is reported as an error at its line and the exit code is 1.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from modeldsl.diagnostics import Diagnostic, Source, Span

_ANNOTATION = re.compile(
    r"(?://|#)\s*expected-(?P<kind>error|warning|note|remark)"
    r"\s*(?:@(?P<where>[+-]\d+|above|below))?\s*\{\{(?P<text>.*?)\}\}"
)


@dataclass
class Expected:
    """One ``expected-*`` annotation: the severity, message text and line it expects."""

    severity: str
    text: str
    line: int
    span: Span
    met: bool = False


@dataclass(frozen=True)
class Produced:
    """A diagnostic (or a note of one) as the check sees it."""

    severity: str
    message: str
    span: Span | None
    diagnostic: Diagnostic


def expectations(source: Source, first_line: int = 1, last_line: int | None = None) -> list[Expected]:
    """The annotations on lines ``first_line..last_line`` of a source (1-based)."""
    found = []
    lines = source.text.splitlines()
    last = len(lines) if last_line is None else min(last_line, len(lines))
    for number in range(first_line, last + 1):
        for match in _ANNOTATION.finditer(lines[number - 1]):
            offset = _line_offset(match.group("where"))
            span = Span(source, number, match.start() + 1, number, match.end() + 1)
            found.append(Expected(match.group("kind"), match.group("text"), number + offset, span))
    return found


def _line_offset(where: str | None) -> int:
    if where is None:
        return 0
    return {"above": -1, "below": 1}.get(where) or int(where)


def produced(diagnostics: list[Diagnostic]) -> list[Produced]:
    """The diagnostics and their notes, flattened."""
    out = []
    for diag in diagnostics:
        out.append(Produced(diag.severity, diag.message, diag.span, diag))
        for note, span in diag.notes:
            out.append(Produced("note", note, span, diag))
    return out


def check(expected: list[Expected], diagnostics: list[Diagnostic], file: str) -> list[Diagnostic]:
    """The failures of the check: unexpected diagnostics and expectations not met."""
    failures = []
    for item in produced(diagnostics):
        match = next((e for e in expected if not e.met and _matches(e, item, file)), None)
        if match is None:
            match = next((e for e in expected if _matches(e, item, file)), None)
        if match is not None:
            match.met = True
        else:
            failures.append(_unexpected(item))
    for item in expected:
        if not item.met:
            failures.append(Diagnostic("E029", f"expected {item.severity} \"{item.text}\" was not produced",
                                       item.span, _not_produced_hint(item)))
    return failures


def _matches(expected: Expected, item: Produced, file: str) -> bool:
    return (expected.severity == item.severity and item.span is not None and item.span.source.name == file
            and item.span.line == expected.line and expected.text in item.message)


def _unexpected(item: Produced) -> Diagnostic:
    diag = item.diagnostic
    return Diagnostic(diag.code if diag.code.startswith("E") else "E029",
                      f"unexpected {item.severity}: {item.message}", item.span,
                      "add an expected-" + item.severity + " {{...}} annotation on that line, or fix the input")


def _not_produced_hint(item: Expected) -> str:
    return (f"no {item.severity} on line {item.line} contains this text; the annotation's @+N/@-N "
            "offset counts from its own line")
