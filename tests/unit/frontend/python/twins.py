"""Helpers of the Python DSL tests: lowering a source, comparing it with its Module DSL twin, and
the first diagnostic of a source, with where a text lies in it."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from modeldsl.diagnostics import Diagnostic, DiagnosticError, DiagnosticSink
from modeldsl.frontend.python import parse_python_source
from modeldsl.frontend.read import read_model
from modeldsl.ir import print_ir
from modeldsl.lower import lower_program


def without_locations(ir: str) -> str:
    """The IR without the places it was written at (``*_at`` attributes, ``"file:line:col"``)."""
    return re.sub(r'"[^"]*\.(module|py):\d+:\d+"', '"LOC"', ir)


def lowered_file(path: Path, top: str, config: dict | None = None) -> str:
    return print_ir(lower_program(read_model(path)[0], top, config, DiagnosticSink()))


def assert_twins(folder: Path, python: str, text: str, top: str, config: dict | None = None) -> str:
    """The Python source and the Module DSL source lower ``top`` to the same IR (but for locations);
    the IR."""
    (folder / "twin.py").write_text(textwrap.dedent(python))
    (folder / "twin.module").write_text(textwrap.dedent(text))
    irs = [without_locations(lowered_file(folder / name, top, config)) for name in ("twin.py", "twin.module")]
    assert irs[0] == irs[1]
    return irs[0]


def first_problem(source: str, top: str | None = None, config: dict | None = None) -> Diagnostic:
    """The first diagnostic of reading and lowering a Python DSL source (``bad.py``)."""
    with pytest.raises(DiagnosticError) as err:
        lower_program(parse_python_source(source, "bad.py"), top, config, DiagnosticSink())
    return err.value.diagnostics[0]


def where(source: str, text: str, occurrence: int = 1) -> tuple[int, int]:
    """The line and column (1-based) of the ``occurrence``-th ``text`` in ``source``."""
    at = -1
    for _ in range(occurrence):
        at = source.index(text, at + 1)
    return source.count("\n", 0, at) + 1, at - (source.rfind("\n", 0, at) + 1) + 1


def at(diagnostic: Diagnostic, source: str, text: str) -> bool:
    """Whether ``diagnostic`` is located at ``text`` in ``source``, with a caret under it."""
    located = (diagnostic.span.line, diagnostic.span.column) == where(source, text)
    return located and "^" in diagnostic.render() and diagnostic.span.source.name == "bad.py"
