"""Make the shared test helpers of tests/unit importable from every test folder."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


import pytest  # noqa: E402


@pytest.fixture
def numpy_cpu_kernels(monkeypatch):
    """The CPU executor on its numpy kernels, which give the numpy references' bits: for tests that
    hold it bitwise to the graph interpreter or to the emulated device (both run the references).
    The compiled kernels (modeldsl.kernels.cpu.compiled) round within a few ulps of them."""
    monkeypatch.setenv("MDSL_CPU_JIT", "0")


ROOT = Path(__file__).resolve().parents[2]
TOOL_LEFTOVERS = {".pytest_cache", ".hypothesis", "__pycache__"}


def _top_level_names() -> set[str]:
    return {p.name for p in ROOT.iterdir()} - TOOL_LEFTOVERS


@pytest.fixture(autouse=True, scope="session")
def the_suite_writes_nothing_into_the_repository():
    """No test leaves a file in the working folder (a run's ./loss.png, a plot, a lock file): a user's
    folder is theirs, and a leftover would change what a later test of the writers sees."""
    before = _top_level_names()
    yield
    left = sorted(_top_level_names() - before)
    assert not left, f"the tests left {left} in {ROOT}"
