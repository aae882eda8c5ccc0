"""The CPU kernel tests run each kernel on both paths: numpy, and compiled where its library builds."""

import pytest

from modeldsl.kernels.cpu import compiled


@pytest.fixture(params=["numpy", "compiled"])
def kernel_path(request, monkeypatch):
    """Which CPU kernels ``cpu_kernel`` gives for the test: ``MDSL_CPU_JIT`` set for it."""
    if request.param == "compiled" and compiled.library() is None:
        pytest.skip("the compiled kernels do not build here (is ziglang installed?)")
    monkeypatch.setenv(compiled.ENV_VAR, "1" if request.param == "compiled" else "0")
    return request.param
