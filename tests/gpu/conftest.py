"""Make the GPU tests' helpers (harness.py, emulator/) importable."""

import sys
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "emulator"))


import pytest  # noqa: E402

from modeldsl.kernels.cpu import compiled  # noqa: E402


@pytest.fixture(autouse=True)
def numpy_cpu_kernels(monkeypatch):
    """The CPU executor on its numpy kernels: the emulated device runs the numpy references, so the
    two agree bit for bit (the compiled CPU kernels round within a few ulps of them)."""
    monkeypatch.setenv(compiled.ENV_VAR, "0")
