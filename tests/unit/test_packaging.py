"""The built wheel installs into a fresh virtualenv and every subpackage imports from it."""

import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SUBPACKAGES = [
    "modeldsl",
    "modeldsl.symbolic",
    "modeldsl.ir",
    "modeldsl.dialects.graph",
    "modeldsl.dialects.sched",
    "modeldsl.passes.registry",
    "modeldsl.kernels",
    "modeldsl.tools.opt",
    "modeldsl.frontend.text.parser",
]


def run(*cmd, **kwargs):
    result = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    assert result.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


NOT_SOURCES = shutil.ignore_patterns(".git", ".venv", ".ci-venv", "build", "dist", "*.egg-info", "__pycache__",
                                     ".pytest_cache", ".hypothesis", ".ruff_cache", "Output")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """The wheel built from a copy of the sources: setuptools writes build/ and egg-info beside what it builds."""
    source = tmp_path_factory.mktemp("source") / "modeldsl"
    shutil.copytree(ROOT, source, ignore=NOT_SOURCES)
    out = tmp_path_factory.mktemp("wheel")
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(out), str(source))
    (built,) = out.glob("modeldsl-*.whl")
    return built


def test_wheel_installs_into_a_fresh_venv_and_imports_every_subpackage(wheel, tmp_path):
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    # The project's dependencies come from this environment; modeldsl itself only from the wheel.
    site = run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").strip()
    (Path(site) / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    run(python, "-m", "pip", "install", "--no-deps", "--quiet", str(wheel))
    code = "import importlib, modeldsl; [importlib.import_module(m) for m in {!r}]; print(modeldsl.__file__)".format(
        SUBPACKAGES
    )
    location = run(python, "-c", code, cwd=tmp_path).strip()
    assert location.startswith(site), f"modeldsl imported from {location}, not the wheel"
    help_text = run(env_dir / "bin" / "mdsl-opt", "--help", cwd=tmp_path, env={**os.environ, "PYTHONPATH": ""})
    assert "--pass-pipeline" in help_text


def test_wheel_contains_the_mapped_folders(wheel):
    import zipfile

    names = zipfile.ZipFile(wheel).namelist()
    for path in ("modeldsl/frontend/text/grammar.lark", "modeldsl/dialects/graph.py", "modeldsl/passes/registry.py",
                 "modeldsl/tools/opt.py", "modeldsl/kernels/__init__.py", "modeldsl/kernels/cpu/compiled.c"):
        assert path in names
    # the whole standard library, std/primitives/*.module included
    std = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "modeldsl" / "std").rglob("*.module"))
    assert "modeldsl/std/primitives/rmsnorm.module" in std
    assert [p for p in std if p not in names] == []
