"""The import graph of the command-line tools' start-up: what ``--help``, ``--list-passes`` and
lowering a model without a pipeline load, each in a fresh interpreter.

Start-up time is mostly imports (ml_dtypes alone took a second), so these tests guard the
graph rather than a time: the numerics (ml_dtypes, numpy, the numpy reference kernels, the CPU
kernels), the runtime, torch, transformers, matplotlib and tqdm load only when a pass or a command
needs them, and ``mdsl-opt --help`` imports no pass and no dialect.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "residual_mlp.module"

NUMERICS = ("ml_dtypes", "numpy", "modeldsl.kernels.reference", "modeldsl.kernels.cpu")
HEAVY = ("torch", "transformers", "matplotlib", "tqdm", "safetensors", "tokenizers")
RUNTIME = ("modeldsl.runtime",)
# mdsl-opt --help lists the passes from the registry's listings and loads the dialects after the flags
PASSES_AND_DIALECTS = ("modeldsl.passes.", "modeldsl.dialects.", "modeldsl.frontend", "modeldsl.lower")
PASS_REGISTRY = "modeldsl.passes.registry"

# mdsl-run needs the thread settings' names and parser for its flags: a module of the standard library only
RUN_ALLOWED = ("modeldsl.runtime", "modeldsl.runtime.threads")

OPT_HELP = """
import contextlib, io
from modeldsl.tools.opt import main
with contextlib.redirect_stdout(io.StringIO()) as out:
    try:
        main(["--help"])
    except SystemExit:
        pass
assert "Available passes:" in out.getvalue()
"""

OPT_LIST = """
import contextlib, io
from modeldsl.tools.opt import main
with contextlib.redirect_stdout(io.StringIO()) as out:
    assert main(["--list-passes"]) == 0
assert "mdsl-lower-to-sched" in out.getvalue()
"""

RUN_HELP = """
from modeldsl.tools.run import build_parser
assert "--train" in build_parser().format_help()
"""

OPT_LOWER = f"""
import contextlib, io
from modeldsl.tools.opt import main
with contextlib.redirect_stdout(io.StringIO()) as out:
    assert main([{str(EXAMPLE)!r}]) == 0
assert "mdsl.graph.model" in out.getvalue()
"""


def modules_after(script: str) -> list[str]:
    """The names in ``sys.modules`` after ``script`` runs in a fresh interpreter."""
    report = "\nimport json, sys\nprint('MODULES ' + json.dumps(sorted(sys.modules)))\n"
    done = subprocess.run([sys.executable, "-c", script + report], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    line = next(text for text in done.stdout.splitlines() if text.startswith("MODULES "))
    return json.loads(line.removeprefix("MODULES "))


def loaded(modules: list[str], prefixes: tuple[str, ...], allowed: tuple[str, ...] = ()) -> list[str]:
    """The modules of ``prefixes`` but not ``allowed``: ``numpy`` is the package and its modules,
    ``modeldsl.passes.`` (a trailing dot) only the modules under the package."""
    return [m for m in modules if m not in allowed and any(_within(m, p) for p in prefixes)]


def _within(module: str, prefix: str) -> bool:
    if prefix.endswith("."):
        return module.startswith(prefix)
    return module == prefix or module.startswith(prefix + ".")


def test_loaded_matches_packages_and_their_modules_only():
    modules = ["numpy", "numpy.linalg", "numpyro", "modeldsl.passes.fuse", "modeldsl.passes.registry"]
    assert loaded(modules, ("numpy",)) == ["numpy", "numpy.linalg"]
    assert loaded(modules, ("modeldsl.passes.",), (PASS_REGISTRY,)) == ["modeldsl.passes.fuse"]
    assert loaded(["modeldsl.passes"], ("modeldsl.passes.",)) == []


def test_mdsl_opt_help_imports_no_pass_dialect_frontend_or_numerics():
    modules = modules_after(OPT_HELP)
    assert loaded(modules, NUMERICS + HEAVY + RUNTIME) == []
    assert loaded(modules, PASSES_AND_DIALECTS, (PASS_REGISTRY,)) == []
    assert PASS_REGISTRY in modules  # the listing came from the registry, as the passes would


def test_mdsl_opt_list_passes_imports_no_pass_or_numerics():
    modules = modules_after(OPT_LIST)
    assert loaded(modules, NUMERICS + HEAVY + RUNTIME) == []
    assert loaded(modules, ("modeldsl.passes.",), (PASS_REGISTRY,)) == []


def test_mdsl_run_help_imports_no_runtime_numerics_or_compiler():
    modules = modules_after(RUN_HELP)
    assert loaded(modules, NUMERICS + HEAVY + RUNTIME + ("xdsl", "lark"), RUN_ALLOWED) == []
    assert "modeldsl.tools.run" in modules


def test_lowering_a_model_without_a_pipeline_imports_no_pass_runtime_or_numerics():
    modules = modules_after(OPT_LOWER)
    assert loaded(modules, NUMERICS + HEAVY + RUNTIME) == []
    assert loaded(modules, ("modeldsl.passes.",), (PASS_REGISTRY,)) == []
    assert "modeldsl.lower" in modules and "modeldsl.dialects.graph" in modules
