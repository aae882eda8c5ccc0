"""The CPU kernel tests run each kernel on both paths: numpy, and compiled (numba) where it imports."""

import pytest

from modeldsl.kernels.cpu import compiled


@pytest.fixture(params=["numpy", "compiled"])
def kernel_path(request, monkeypatch):
    """Which CPU kernels ``cpu_kernel`` gives for the test: ``MDSL_CPU_JIT`` set for it."""
    if request.param == "compiled" and compiled.numba_module() is None:
        pytest.skip("numba is not installed: no compiled path")
    monkeypatch.setenv(compiled.ENV_VAR, "1" if request.param == "compiled" else "0")
    return request.param
