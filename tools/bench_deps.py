"""The packages a benchmark needs besides modeldsl's own: missing ones are a coded error
(E029) that names the install, never an ImportError traceback."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from modeldsl.diagnostics import Diagnostic, DiagnosticError, render_all

INSTALL_HINT = "install them with: pip install -e '.[test]' (torch for the CPU and transformers)"


def missing_packages(packages: Sequence[str]) -> list[str]:
    """The packages of ``packages`` that cannot be imported here."""
    missing = []
    for name in packages:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    return missing


def require_packages(packages: Sequence[str], tool: str, purpose: str) -> None:
    """E029 when a package of ``packages`` is missing: ``tool`` needs it for ``purpose``."""
    missing = missing_packages(packages)
    if missing:
        names = " and ".join(missing)
        raise DiagnosticError([Diagnostic("E029", f"{tool} needs {names} ({purpose}), which "
                                          f"{'is' if len(missing) == 1 else 'are'} not installed", None,
                                          INSTALL_HINT)])


def reporting_diagnostics(main: Callable[[], int]) -> int:
    """Run a benchmark's ``main``; a diagnostic is printed (exit status 1) instead of raised."""
    try:
        return main()
    except DiagnosticError as err:
        sys.stderr.write(render_all(err.diagnostics) + "\n")
        return 1


def run_child(tool: str, marker: str, spec: dict[str, Any], env: Mapping[str, str]) -> dict[str, Any]:
    """One measurement of ``python -m <tool> --child SPEC`` in a fresh process: the JSON after
    ``marker`` on its last result line, or ``{"note": why it failed}``."""
    proc = subprocess.run([sys.executable, "-m", tool, "--child", json.dumps(spec)],
                          capture_output=True, text=True, env=dict(env))
    results = [line[len(marker):] for line in proc.stdout.splitlines() if line.startswith(marker)]
    if proc.returncode == 0 and results:
        return json.loads(results[-1])
    last = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
    return {"note": f"failed: {last[:200]}"}
