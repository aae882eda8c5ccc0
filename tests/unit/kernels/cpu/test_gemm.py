"""The CPU GEMM makes the reference's BLAS calls (bitwise its results), cuts a large one over the
threads (within rounding, the same bits run to run), and allocates nothing."""

import numpy as np
import pytest
from blas_bounds import assert_within_dot_bound, matmul_magnitude
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
    # each thread's BLAS call has other shapes than the whole product's: other sums' orders
    assert_within_dot_bound(got, expected, matmul_magnitude(a, b.T), length=256)
    first = got.copy()
    step()
    np.testing.assert_array_equal(got, first)
    assert allocation_peak(step) < FEW_KB


def test_beta_takes_scratch_not_an_allocation():
    a, b, c = (random((4, 128, 256), np.float32, 1), random((256, 256), np.float32, 2),
               random((4, 128, 256), np.float32, 3))
    _, _, step = run(a, b, c, 2, transpose="NN", beta=1.0)
    assert allocation_peak(step) < FEW_KB


@pytest.mark.parametrize("params", [{"epilogue": "gelu"},
                                    {"aux": np.zeros((8, 8), np.float32), "epilogue": "gelu_aux"}])
def test_other_epilogues_get_no_fast_step(params):
    a = np.zeros((8, 4), np.float32)
    assert gemm(Pool(1), a, np.zeros((4, 8), np.float32), np.zeros((8, 8), np.float32), **params) is None


def compiled_or_skip():
    from modeldsl.kernels.cpu import compiled

    if not compiled.enabled() or compiled.blas_sgemm() is None:
        pytest.skip("no compiled library, or numpy's BLAS is not scipy-openblas64")


LARGE = {  # products cut over two threads
    "x @ W^T over a stack": ((2, 64, 256), (512, 256), (2, 64, 512), "NT"),
    "x @ W": ((128, 256), (256, 384), (128, 384), "NN"),
    "dW over stacked rows": ((2, 128, 384), (2, 128, 256), (384, 256), "TN"),
}


@pytest.mark.parametrize("alpha, beta", [(1.0, 0.0), (1.0, 1.0), (2.0, 0.25)])
@pytest.mark.parametrize("case", sorted(LARGE))
def test_the_compiled_path_calls_blas_on_its_own_threads_with_the_same_bits(case, alpha, beta):
    """A GEMM cut over the threads runs on the compiled library's spinning threads: numpy's very
    BLAS calls (bitwise the numpy path where alpha and beta need no pass of their own; within
    rounding where BLAS folds them in), the same bits run to run, and no allocation."""
    compiled_or_skip()
    a_shape, b_shape, c_shape, mode = LARGE[case]
    a, b, c = random(a_shape, np.float32, 1), random(b_shape, np.float32, 2), random(c_shape, np.float32, 3)
    numpy_c, _, _ = run(a, b, c.copy(), 2, transpose=mode, alpha=alpha, beta=beta)
    step = gemm(Pool(2), a, b, c, transpose=mode, alpha=alpha, beta=beta, jit=True)
    assert step is not None and "compiled" in step.__code__.co_filename
    start = c.copy()
    step()
    if (alpha, beta) == (1.0, 0.0):
        np.testing.assert_array_equal(c, numpy_c)
    else:
        np.testing.assert_allclose(c, numpy_c, rtol=1e-5, atol=1e-5)
    first = c.copy()
    np.copyto(c, start)
    step()
    np.testing.assert_array_equal(c, first)
    np.copyto(c, start)
    assert allocation_peak(step) < FEW_KB


@pytest.mark.parametrize("shapes", [((64, 256), (1024, 256), (64, 1024)), ((1, 256), (4096, 256), (1, 4096))])
def test_one_product_or_a_vector_stays_on_numpy(shapes):
    """One thread's product, and a product of one row (numpy's GEMV, a decode step's), keep np.matmul."""
    compiled_or_skip()
    a, b, c = random(shapes[0], np.float32, 1), random(shapes[1], np.float32, 2), np.zeros(shapes[2], np.float32)
    for threads in (1, 2):
        step = gemm(Pool(threads), a, b, c, transpose="NT", jit=True)
        assert "compiled" not in step.__code__.co_filename or shapes[0][0] > 1 and threads == 2


def test_the_compiled_path_cuts_a_large_product_over_its_threads_and_rests_for_the_pool():
    compiled_or_skip()
    from modeldsl.kernels.cpu import compiled
    from modeldsl.kernels.cpu.pool import BEFORE_RUN

    a, b = random((64, 256), np.float32, 1), random((1024, 256), np.float32, 2)
    c, expected = np.zeros((64, 1024), np.float32), a @ b.T
    step = gemm(Pool(2), a, b, c, transpose="NT", jit=True)
    for _ in range(50):  # back to back, and after the workers went to sleep
        step()
    np.testing.assert_allclose(c, expected, rtol=1e-5, atol=1e-5)
    assert compiled.library().gemm_rest in BEFORE_RUN
    assert gemm(Pool(2), a, b, c, transpose="NT", bias=random((1024,), np.float32, 3), epilogue="bias",
                jit=True).__code__.co_filename != step.__code__.co_filename  # the bias: the numpy path


def test_the_compiled_threads_survive_a_fork_and_a_second_caller():
    """A forked child (no workers there) and another Python thread's calls run their products on
    their caller: the same results, no wait for a worker that is not coming."""
    compiled_or_skip()
    import os
    import threading

    from threadpoolctl import threadpool_limits

    a, b = random((256, 256), np.float32, 1), random((1024, 256), np.float32, 2)
    c, d = np.zeros((256, 1024), np.float32), np.zeros((256, 1024), np.float32)
    with threadpool_limits(1):
        step, other = (gemm(Pool(2), a, b, out, transpose="NT", jit=True) for out in (c, d))
        step()
        first = c.copy()
        pid = os.fork()
        if pid == 0:  # pragma: no cover (the child)
            c[:] = 0
            step()
            os._exit(0 if np.array_equal(c, first) else 3)
        assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
        thread = threading.Thread(target=lambda: [other() for _ in range(100)])
        thread.start()
        for _ in range(100):
            step()
        thread.join()
    np.testing.assert_array_equal(c, first)
    np.testing.assert_array_equal(d, first)


# ----------------------------------------------------------------------------- a scaled fp8 B


def stored_weight(shape, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``(q, scale)``: a random weight in fp8 e4m3 with one scale per row, as the loader stores it."""
    return reference.quantize(random(shape, np.float32, seed))


SCALED = {  # (a shape, stored B shape, c shape, transpose): the forward x @ W^T and the backward dy @ W
    "x @ W^T": ((2, 8, 48), (96, 48), (2, 8, 96), "NT"),
    "dy @ W": ((2, 8, 96), (96, 48), (2, 8, 48), "NN"),
}


@pytest.mark.parametrize("tile", [1 << 18, 512])  # one tile of columns; many (48 or 96 columns each)
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("params", [{}, {"alpha": 0.5}, {"bias": True}], ids=["plain", "alpha", "bias"])
@pytest.mark.parametrize("case", sorted(SCALED))
def test_a_scaled_b_is_the_gemm_of_its_dequantized_values(case, params, threads, tile, monkeypatch):
    """Widened a tile of C's columns at a time, B is bitwise the reference's dequantize (each fp8
    value times its row's scale, in float32), so C is its GEMM within the rounding of other BLAS
    shapes (bitwise where one tile is the whole product)."""
    import modeldsl.kernels.cpu.gemm as cpu_gemm

    monkeypatch.setattr(cpu_gemm, "TILE", tile)
    a_shape, b_shape, c_shape, mode = SCALED[case]
    if params.get("bias") and mode == "NN":
        pytest.skip("a bias is the forward's")
    a, (q, scale) = random(a_shape, np.float32, 1), stored_weight(b_shape, 2)
    extra = {**params, "bias": random((c_shape[-1],), np.float32, 4), "epilogue": "bias"} if params.get("bias") \
        else params
    c = np.zeros(c_shape, np.float32)
    got, expected, step = run(a, q, c, threads, transpose=mode, scale_b=scale, **extra)
    widened, unfused = reference.dequantize(q, scale), np.zeros(c_shape, np.float32)
    reference.gemm(a, widened, unfused, transpose=mode, **extra)
    np.testing.assert_array_equal(expected, unfused)
    if tile > 1 << 17 and threads == 1:
        np.testing.assert_array_equal(got, expected)
    else:
        b_op = widened.T if mode == "NT" else widened
        assert_within_dot_bound(got, expected, matmul_magnitude(a.reshape(-1, a.shape[-1]), b_op).reshape(c_shape)
                                * abs(extra.get("alpha", 1.0)), length=a_shape[-1])
    first = got.copy()
    step()
    np.testing.assert_array_equal(got, first)
    assert allocation_peak(step) < FEW_KB


def test_the_reference_widens_a_scaled_b_into_as_dtype():
    """In a bf16 program the widened B is rounded to bf16 once, as the dequantize launch's output was."""
    import ml_dtypes

    a = random((4, 48), np.float32, 1).astype(ml_dtypes.bfloat16)
    q, scale = stored_weight((16, 48), 2)
    c = np.zeros((4, 16), ml_dtypes.bfloat16)
    reference.gemm(a, q, c, transpose="NT", scale_b=scale)
    want = np.zeros_like(c)
    reference.gemm(a, reference.dequantize(q, scale).astype(ml_dtypes.bfloat16), want, transpose="NT")
    np.testing.assert_array_equal(c.view(np.uint16), want.view(np.uint16))


def test_column_tiles_stay_within_a_tile_and_split_over_the_threads():
    from modeldsl.kernels.cpu.gemm import column_tiles
    from modeldsl.kernels.cpu.pool import TILE

    assert column_tiles(1024, 3072, 1) == [(lo, lo + 256) for lo in range(0, 3072, 256)]  # 256 x 1024 = TILE
    assert column_tiles(256, 96, 2) == [(0, 96)]  # small: one tile on one thread
    assert column_tiles(512, 1024, 2) == [(0, 512), (512, 1024)]
    assert all((hi - lo) * 1000 <= TILE for lo, hi in column_tiles(1000, 5000, 2))


@pytest.mark.parametrize("params", [{"beta": 1.0}, {"epilogue": "gelu"}])
def test_a_scaled_b_it_does_not_take_goes_to_the_reference(params):
    q, scale = stored_weight((8, 4), 2)
    assert gemm(Pool(1), np.zeros((8, 4), np.float32), q, np.zeros((8, 8), np.float32), transpose="NT",
                scale_b=scale, **params) is None
