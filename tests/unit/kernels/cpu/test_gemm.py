"""The CPU GEMM makes the reference's BLAS calls (bitwise its results), cuts a large one over the
threads (within rounding, the same bits run to run), and allocates nothing."""

import numpy as np
import pytest

from cpu_kernel_harness import FEW_KB, allocation_peak, random
from modeldsl.kernels import reference
from modeldsl.kernels.cpu.gemm import gemm
from modeldsl.kernels.cpu.pool import Pool

CASES = {  # (a shape, b shape, c shape, transpose)
    "x @ W^T over a stack": ((2, 8, 32), (96, 32), (2, 8, 96), "NT"),
    "x @ W": ((2, 3, 8, 32), (32, 40), (2, 3, 8, 40), "NN"),
    "matrices": ((24, 32), (24, 40), (32, 40), "TN"),
    "dW over stacked rows": ((2, 8, 24), (2, 8, 32), (24, 32), "TN"),
    "batched": ((2, 4, 16, 8), (2, 4, 8, 16), (2, 4, 8, 8), "TT"),
}


def run(a, b, c, threads=1, **params):
    """(the fast GEMM's C, the reference's C, the step) from the same starting C."""
    expected = c.copy()
    reference.gemm(a, b, expected, params.get("bias"), **{k: v for k, v in params.items() if k != "bias"})
    pool = Pool(threads)
    step = gemm(pool, a, b, c, **params)
    assert step is not None
    pool.workspace.prepare()
    step()
    return c, expected, step


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("alpha, beta", [(1.0, 0.0), (0.5, 0.0), (1.0, 1.0), (2.0, 0.25)])
@pytest.mark.parametrize("case", sorted(CASES))
def test_bitwise_the_reference(case, alpha, beta, dtype, threads):
    a_shape, b_shape, c_shape, mode = CASES[case]
    a, b, c = random(a_shape, dtype, 1), random(b_shape, dtype, 2), random(c_shape, dtype, 3)
    got, expected, _ = run(a, b, c, threads, transpose=mode, alpha=alpha, beta=beta)
    np.testing.assert_array_equal(got, expected)


def test_the_bias_epilogue():
    a, b, c, bias = random((2, 8, 32), np.float32, 1), random((96, 32), np.float32, 2), \
        np.zeros((2, 8, 96), np.float32), random((96,), np.float32, 4)
    got, expected, _ = run(a, b, c, transpose="NT", bias=bias, epilogue="bias")
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("m", [512, 1])  # rows of C cut over the threads; one row: its columns
def test_a_large_product_is_cut_over_the_threads(m):
    a, b = random((m, 256), np.float32, 1), random((1024, 256), np.float32, 2)
    c = np.zeros((m, 1024), np.float32)
    got, expected, step = run(a, b, c, 2, transpose="NT")
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    first = got.copy()
    step()
    np.testing.assert_array_equal(got, first)
    assert allocation_peak(step) < FEW_KB


def test_beta_takes_scratch_not_an_allocation():
    a, b, c = random((4, 128, 256), np.float32, 1), random((256, 256), np.float32, 2), random((4, 128, 256), np.float32, 3)
    _, _, step = run(a, b, c, 2, transpose="NN", beta=1.0)
    assert allocation_peak(step) < FEW_KB


@pytest.mark.parametrize("params", [{"epilogue": "gelu"}, {"aux": np.zeros((8, 8), np.float32), "epilogue": "gelu_aux"}])
def test_other_epilogues_get_no_fast_step(params):
    a = np.zeros((8, 4), np.float32)
    assert gemm(Pool(1), a, np.zeros((4, 8), np.float32), np.zeros((8, 8), np.float32), **params) is None
