"""Comparing two BLAS computations of the same products: within the float error bound of a dot.

Bitwise equality holds only where our own code fixes the order of every operation (numpy
references, our compiled C, the same BLAS call on the same shapes). Two BLAS calls of different
shapes (a tile against the whole slice, a row block against the whole matrix) may sum each dot
in another order: OpenBLAS picks its kernels by CPU (its Haswell kernels on AMD Zen and on
`OPENBLAS_CORETYPE=Haswell`, SkylakeX ones on AVX-512 Intel) and blocks them by shape. Each
result of a dot of length ``n`` then lies within ``gamma_n * sum_i |a_i b_i|`` of the exact value,
``gamma_n = n u / (1 - n u)`` with ``u`` the unit roundoff (Higham, *Accuracy and Stability of
Numerical Algorithms*, 2nd ed., eq. 3.5), whatever the order, so two such results lie within
twice that of each other. The bound is rigorous, so a test that uses it cannot fail on a
correct kernel on any CPU, and still fails on a wrong index, a dropped term or a lost scale.
"""

from __future__ import annotations

import numpy as np


def dot_error_bound(length: int, magnitude: np.ndarray, dtype=np.float32) -> np.ndarray:
    """How far a ``dtype`` dot of ``length`` terms whose absolute values sum to ``magnitude``
    may be from the exact result, in any summation order."""
    unit_roundoff = float(np.finfo(dtype).eps) / 2
    gamma = length * unit_roundoff / (1 - length * unit_roundoff)
    return gamma * np.asarray(magnitude, dtype=np.float64)


def assert_within_dot_bound(got: np.ndarray, want: np.ndarray, magnitude: np.ndarray, length: int,
                            dtype=np.float32) -> None:
    """``got`` and ``want``, the same dots of ``length`` terms summed by two BLAS calls of
    different shapes, differ by at most twice the bound of each (``magnitude``: the sums of the
    terms' absolute values, e.g. ``abs(A) @ abs(B)`` in float64)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    allowed = 2 * dot_error_bound(length, magnitude, dtype)
    excess = np.abs(got - want) - allowed
    worst = np.unravel_index(np.argmax(excess), excess.shape) if excess.size else ()
    assert excess.size == 0 or excess[worst] <= 0, (
        f"{int(np.sum(excess > 0))} of {excess.size} elements differ by more than the float bound of a "
        f"{length}-term dot; worst at {tuple(int(i) for i in worst)}: got {got[worst]!r}, want {want[worst]!r}, "
        f"allowed {allowed[worst]!r}")


def matmul_magnitude(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``abs(a) @ abs(b)`` in float64: the sums of the absolute values of ``a @ b``'s terms."""
    return np.abs(np.asarray(a, np.float64)) @ np.abs(np.asarray(b, np.float64))
