"""A model given as a file of either frontend, or as a class of the Python DSL, read into the text
DSL's AST."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def read_model(model: Any, top: str | None = None) -> tuple[Any, str | None]:
    """The AST of a model given as a ``.module`` or ``.py`` file, or as a class of the Python DSL
    (its file; ``top`` defaults to the class), with the declaration to lower."""
    from modeldsl.frontend.python.classes import FILE

    if isinstance(model, type) and hasattr(model, FILE):
        if getattr(model, FILE) is None:
            from modeldsl.diagnostics import Diagnostic, DiagnosticError

            raise DiagnosticError([Diagnostic("E028", f"the source of class {model.__name__} is in no file", None,
                                              "modeldsl reads a Python DSL class from its file: define it in a .py "
                                              "file and import it")])
        model, top = getattr(model, FILE), top or model.__name__
    if str(model).endswith(".py"):
        from modeldsl.frontend.python import parse_python_file

        return parse_python_file(Path(model)), top
    from modeldsl.frontend.text.parser import parse_file

    return parse_file(model), top
