"""A table of diagnostic tests: one small `.module` case (or more) per error and warning code.

Each file in ``cases/`` is named ``<code>_<short_name>.module`` and starts with
its expectation::

    # expect: E005 11:3 missing required gradient 'd_w'

that is the code, the ``line:column`` of the diagnostic's caret and a
substring of its message. The case is parsed and lowered like a top-level
program (imports resolve from the case's folder, so helpers live in
``cases/lib/``); the diagnostic must be reported exactly there, and render
as ``file:line:col``, the source line and a caret under the offending token.
Error cases must fail to lower; warning cases must lower, leaving the warning
in the sink.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from modeldsl.diagnostics import CODES, Diagnostic, DiagnosticError, DiagnosticSink, cut_around
from modeldsl.frontend.text.parser import parse_source
from modeldsl.lower import lower_program

CASES = Path(__file__).resolve().parent / "cases"

# every code the table must cover (spec Appendix C/D)
REQUIRED_CODES = (
    "E001 E002 E003 E004 E005 E006 E007 E008 E009 E010 E011 E012 E013 E014 E015 E016 E017 E018 E019 E020 "
    "E021 E022 E023 E024 E025 E026 E027 W001 W002 W003 W004 W005"
).split()

EXPECT = re.compile(r"^# expect: (?P<code>[EW]\d{3}) (?P<line>\d+):(?P<column>\d+) (?P<message>\S.*)$")


@dataclass(frozen=True)
class Case:
    path: Path
    code: str
    line: int
    column: int
    message: str


def read_case(path: Path) -> Case:
    first = path.read_text(encoding="utf-8").splitlines()[0]
    match = EXPECT.match(first)
    assert match, f"{path.name}: the first line must be '# expect: CODE LINE:COL message', got {first!r}"
    return Case(path, match["code"], int(match["line"]), int(match["column"]), match["message"])


CASE_FILES = sorted(CASES.glob("*.module"))


def diagnostics_of(path: Path) -> tuple[bool, list[Diagnostic]]:
    """(lowered, diagnostics): errors raise, warnings stay in the sink."""
    sink = DiagnosticSink()
    try:
        lower_program(parse_source(path.read_text(encoding="utf-8"), str(path)), top=None, config=None, sink=sink)
    except DiagnosticError as err:
        return False, err.diagnostics
    return True, sink.diagnostics


def describe(diagnostics: list[Diagnostic]) -> str:
    return "\n".join(d.render() for d in diagnostics) or "(no diagnostics)"


@pytest.mark.parametrize("path", CASE_FILES, ids=[p.stem for p in CASE_FILES])
def test_case_reports_its_diagnostic_at_the_offending_token(path: Path):
    case = read_case(path)
    assert path.name.startswith(f"{case.code}_"), f"{path.name} is named for a different code than {case.code}"
    lowered, diagnostics = diagnostics_of(path)
    if case.code.startswith("E"):
        assert not lowered, f"{path.name}: lowering succeeded, expected {case.code}\n{describe(diagnostics)}"
    else:
        assert lowered, f"{path.name}: a warning case must lower\n{describe(diagnostics)}"

    found = [d for d in diagnostics
             if d.code == case.code and d.span is not None and (d.span.line, d.span.column) == (case.line, case.column)]
    assert found, f"no {case.code} at {case.line}:{case.column}; got:\n{describe(diagnostics)}"
    (diagnostic,) = found[:1]
    assert case.message in diagnostic.message, diagnostic.render()

    rendered = diagnostic.render()
    severity = "warning" if case.code.startswith("W") else "error"
    assert rendered.startswith(f"{path}:{case.line}:{case.column}: {severity}[{case.code}]: "), rendered
    source_line = path.read_text(encoding="utf-8").splitlines()[case.line - 1]
    shown, caret_at, _ = cut_around(source_line, case.column - 1, case.column)  # the whole line up to 120 columns
    lines = rendered.splitlines()
    assert lines[1] == f"{case.line:>5} | {shown}", rendered
    caret = lines[2].split("| ", 1)[1]
    assert caret.startswith(" " * caret_at + "^") and set(caret.strip()) == {"^"}, rendered


def test_cases_cover_every_required_code():
    covered = {read_case(path).code for path in CASE_FILES}
    missing = sorted(set(REQUIRED_CODES) - covered)
    assert not missing, f"no case file for {', '.join(missing)}"
    assert covered <= set(CODES)


def test_helper_modules_are_not_cases():
    """``cases/lib/`` only holds modules the cases import; they lower without diagnostics."""
    helpers = sorted((CASES / "lib").glob("*.module"))
    assert helpers
    for helper in helpers:
        program = parse_source(helper.read_text(encoding="utf-8"), str(helper))
        for decl in program.declarations:
            sink = DiagnosticSink()
            config = {param.name: 8 for param in decl.params or [] if param.name}
            lower_program(program, top=decl.name, config=config, sink=sink)
            assert sink.diagnostics == [], describe(sink.diagnostics)
