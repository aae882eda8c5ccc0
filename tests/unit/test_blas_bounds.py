"""The float bound of a dot that tests use to compare BLAS calls of different shapes: it holds for
any summation order and still catches a dropped term."""

import numpy as np
import pytest
from blas_bounds import assert_within_dot_bound, matmul_magnitude


def sums_in_two_orders(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((8, n)).astype(np.float32), rng.standard_normal((n, 5)).astype(np.float32)
    forward = np.zeros((8, 5), np.float32)
    for k in range(n):
        forward += a[:, k:k + 1] * b[k:k + 1, :]
    pairwise = a @ b
    return a, b, forward, pairwise


def test_any_summation_order_is_within_the_bound():
    a, b, forward, pairwise = sums_in_two_orders(512)
    assert not np.array_equal(forward, pairwise)  # the orders do differ in their last bits
    assert_within_dot_bound(forward, pairwise, matmul_magnitude(a, b), length=512)


def test_a_dropped_term_is_not():
    a, b, _, pairwise = sums_in_two_orders(512)
    dropped = a[:, 1:] @ b[1:, :]
    with pytest.raises(AssertionError, match="float bound of a 512-term dot"):
        assert_within_dot_bound(dropped, pairwise, matmul_magnitude(a, b), length=512)
