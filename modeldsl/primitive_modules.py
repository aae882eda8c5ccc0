"""The modules that register user primitives, named by ``MDSL_PRIMITIVES`` (comma-separated module
names or ``.py`` paths): the tools import them before reading a program. Kept apart from
:mod:`modeldsl.prims.user` so a tool's start-up loads no primitive table unless it is asked to."""

from __future__ import annotations

import importlib
import importlib.util
import os
from pathlib import Path

from modeldsl.diagnostics import Diagnostic, DiagnosticError

ENVIRONMENT = "MDSL_PRIMITIVES"


def load_from_environment() -> None:
    """Import the modules and ``.py`` files ``MDSL_PRIMITIVES`` names (each once), which register
    user primitives; E028 for one that cannot be loaded."""
    for spelling in filter(None, (s.strip() for s in os.environ.get(ENVIRONMENT, "").split(","))):
        if spelling in _LOADED:
            continue
        try:
            if spelling.endswith(".py"):
                path = Path(spelling)
                spec = importlib.util.spec_from_file_location(f"mdsl_primitives_{path.stem}", path)
                if spec is None or spec.loader is None:
                    raise ImportError(f"not a Python file: {spelling}")
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
            else:
                importlib.import_module(spelling)
        except Exception as err:  # noqa: BLE001 - whatever stops the module: say which one
            raise DiagnosticError([Diagnostic("E028", f"{ENVIRONMENT}: cannot load '{spelling}': {err}", None,
                                              "name importable modules or .py files, separated by commas")]) from None
        _LOADED.add(spelling)


_LOADED: set[str] = set()
