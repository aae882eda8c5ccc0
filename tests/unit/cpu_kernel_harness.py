"""Running a fast CPU kernel the way the executor does, against its numpy reference."""

from __future__ import annotations

import tracemalloc

import numpy as np

from modeldsl.kernels.cpu import cpu_kernel
from modeldsl.kernels.cpu.pool import BUFSIZE, Pool
from modeldsl.kernels.reference import REFERENCES

FEW_KB = 16 * 1024  # what a warm call may allocate: Python objects and numpy's small ufunc buffers, no arrays


def as_tuple(result) -> tuple[np.ndarray, ...]:
    return result if isinstance(result, tuple) else (result,)


def fast_and_reference(name: str, inputs: list, params: dict | None = None, threads: int = 1,
                       outputs: list[np.ndarray] | None = None):
    """(the fast kernel's outputs, the reference's) for ``inputs``; the outputs are fresh arrays
    shaped and typed as the reference's unless given."""
    params = params or {}
    expected = as_tuple(REFERENCES[name](*inputs, **params))
    if outputs is None:
        outputs = [np.full(e.shape, np.nan, dtype=e.dtype) for e in expected]
    pool = Pool(threads)
    step = cpu_kernel(name)(pool, outputs, inputs, params)
    assert step is not None, f"{name} gave no fast step"
    pool.workspace.prepare()
    step()
    return outputs, expected, step


def assert_the_reference(got: np.ndarray, want: np.ndarray, path: str, ulps: int = 4) -> None:
    """The numpy kernels give the reference's bits; the compiled ones (their exp, their sums' order)
    are within ``ulps`` units of the dtype's rounding of the result's scale."""
    if path == "numpy":
        np.testing.assert_array_equal(got, want)
        return
    eps = float(np.finfo(want.dtype).eps)
    scale = float(np.max(np.abs(want[np.isfinite(want)]), initial=1.0))
    np.testing.assert_allclose(got, want, rtol=ulps * eps, atol=ulps * eps * scale)


def allocation_peak(step) -> int:
    """The traced allocation peak of a warmed-up call of ``step`` (bytes)."""
    buffer = np.setbufsize(BUFSIZE)  # as the executor runs its steps
    try:
        step()
        return traced_peak(step)
    finally:
        np.setbufsize(buffer)


def traced_peak(run) -> int:
    """The traced allocation peak of one call of ``run`` above what was allocated before it (bytes)."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        run()
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


def random(shape, dtype, seed: int = 0, scale: float = 1.0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(dtype)
