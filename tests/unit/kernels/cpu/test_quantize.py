"""The CPU kernel of ``dequantize`` against its numpy reference: bit for bit, split over threads, without allocating."""

import ml_dtypes
import numpy as np
import pytest
from cpu_kernel_harness import FEW_KB, allocation_peak, fast_and_reference, random

from modeldsl.kernels.cpu import cpu_kernel
from modeldsl.kernels.cpu.pool import TILE, Pool
from modeldsl.kernels.reference import REFERENCES, quantize

E4M3, E5M2 = np.dtype(ml_dtypes.float8_e4m3fn), np.dtype(ml_dtypes.float8_e5m2)


def stored(shape, dtype=E4M3, seed: int = 0) -> list[np.ndarray]:
    """``[q, scale]`` of a random weight (magnitudes over a few binades, one row of zeros), as the loader stores it."""
    w = random(shape, np.float32, seed) * np.exp(random(shape, np.float32, seed + 1))
    w.reshape(-1, shape[-1])[0] = 0.0
    return list(quantize(w, dtype=dtype))


def numpy_dequantize(q: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """Written out independently of the reference: each fp8 value widened by ml_dtypes, times its row's scale."""
    return q.astype(np.float32) * scale[..., None]


@pytest.mark.parametrize("shape, threads", [((7, 33), 1), ((2, 64, 48), 1), ((2, 600, 512), 2)])
@pytest.mark.parametrize("dtype", [E4M3, E5M2], ids=["e4m3", "e5m2"])
def test_the_dequantized_weight_is_the_reference_bit_for_bit(kernel_path, shape, threads, dtype):
    inputs = stored(shape, dtype)
    (got,), (want,), step = fast_and_reference("dequantize", inputs, threads=threads)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    np.testing.assert_array_equal(got.view(np.uint32), numpy_dequantize(*inputs).view(np.uint32))
    step()  # again into the same buffer
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("out_dtype", [ml_dtypes.bfloat16, np.float16])
def test_a_16_bit_result_is_the_reference_rounded_once(kernel_path, out_dtype):
    """In a bf16 (or fp16) program the float32 product is rounded once, to nearest even, as the
    executor stores the reference's float32 result."""
    inputs = stored((3, 300, 1000), seed=4)  # more than one tile of rows
    assert 300 * 1000 > TILE
    out = np.zeros((3, 300, 1000), out_dtype)
    (got,), (want,), _ = fast_and_reference("dequantize", inputs, outputs=[out], threads=2)
    np.testing.assert_array_equal(got.view(np.uint16), want.astype(out_dtype).view(np.uint16))


def test_operands_it_does_not_take_go_to_the_reference():
    q, scale = stored((4, 8))
    out = np.zeros((4, 8), np.float32)
    kernel = cpu_kernel("dequantize")
    assert kernel(Pool(1), [out], [q.astype(np.float32), scale], {}) is None  # not fp8
    assert kernel(Pool(1), [out], [q, scale.astype(np.float64)], {}) is None  # a float64 scale
    assert kernel(Pool(1), [out.astype(np.float64)], [q, scale], {}) is None  # a float64 result
    assert kernel(Pool(1), [out], [q, scale[:2]], {}) is None  # not one scale per row
    assert REFERENCES["dequantize"](q, scale).shape == (4, 8)


@pytest.mark.parametrize("out_dtype", [np.float32, ml_dtypes.bfloat16])
def test_a_warm_call_allocates_nothing(out_dtype):
    q, scale = stored((4, 512, 256), seed=7)
    out = np.zeros(q.shape, out_dtype)
    pool = Pool(1)
    step = cpu_kernel("dequantize")(pool, [out], [q, scale], {})
    pool.workspace.prepare()
    assert allocation_peak(step) < FEW_KB
