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
