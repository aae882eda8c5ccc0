"""The benchmarks without torch or transformers: a coded error naming the install, no traceback."""

import sys

import pytest

from modeldsl.tools import bench, bench_memory
from modeldsl.tools.bench_deps import missing_packages


@pytest.fixture
def without_torch(monkeypatch):
    """Imports of torch and transformers fail, as where they are not installed."""
    for name in ("torch", "transformers"):
        monkeypatch.setitem(sys.modules, name, None)  # `import name` raises ImportError


def test_missing_packages_are_found_by_importing(without_torch):
    assert missing_packages(["numpy", "torch", "transformers"]) == ["torch", "transformers"]


@pytest.mark.parametrize("run", [
    lambda: bench.main(["--device", "cpu", "--shapes", "tiny"]),
    lambda: bench.main(["--device", "cpu", "--shapes", "tiny", "--runners", "compile"]),
    lambda: bench_memory.main(),
])
def test_the_benchmarks_without_torch_are_e029_naming_the_install(without_torch, run, capsys):
    assert run() == 1
    err = capsys.readouterr().err
    assert "error[E029]" in err and "needs torch and transformers" in err and "are not installed" in err
    assert "pip install -e '.[test]'" in err and "Traceback" not in err


def test_the_modeldsl_runner_needs_no_torch(without_torch, capsys):
    assert bench.main(["--device", "cpu", "--shapes", "tiny", "--runners", "modeldsl", "--batch", "1", "--seq", "8",
                       "--steps", "1", "--warmup", "0"]) == 0
    out = capsys.readouterr().out
    assert "tiny modeldsl:" in out and "tokens/s" in out
