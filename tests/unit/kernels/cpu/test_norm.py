"""The RMSNorm CPU kernels against their numpy references, on the numpy path (the forward bitwise, the
backward within rounding) and the compiled one (within rounding)."""

import numpy as np
import pytest
from cpu_kernel_harness import FEW_KB, allocation_peak, assert_the_reference, fast_and_reference, random

pytestmark = pytest.mark.usefixtures("kernel_path")  # every test on the numpy and the compiled path

SHAPES = [(5, 7), (2, 200, 700)]


def operands(name, shape, dtype):
    rows, width = shape[:-1], shape[-1]
    weight = random((width,), dtype, 9) + 1
    rstd = np.abs(random(rows, dtype, 8)) + 0.5
    return {
        "rmsnorm": [random(shape, dtype, 1), weight],
        "fused_residual_rmsnorm": [random(shape, dtype, 1), random(shape, dtype, 2), weight],
        "rmsnorm_backward": [random(shape, dtype, 3), random(shape, dtype, 1), weight, rstd],
        "fused_residual_rmsnorm_backward": [random(shape, dtype, 3), random(shape, dtype, 4), random(shape, dtype, 1),
                                            weight, rstd],
    }[name]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("name", ["rmsnorm", "fused_residual_rmsnorm"])
def test_the_forward_is_the_reference(name, shape, dtype, threads, kernel_path):
    outputs, expected, _ = fast_and_reference(name, operands(name, shape, dtype), {"eps": 1e-5}, threads)
    for got, want in zip(outputs, expected):
        assert_the_reference(got, want, kernel_path)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("name", ["rmsnorm_backward", "fused_residual_rmsnorm_backward"])
def test_the_backward_is_the_reference(name, shape, dtype, threads, kernel_path):
    outputs, expected, _ = fast_and_reference(name, operands(name, shape, dtype), threads=threads)
    for got, want in zip(outputs[:-1], expected[:-1]):  # d_x: the reference's order (numpy: bitwise)
        assert_the_reference(got, want, kernel_path, ulps=16)
    # d_weight: its rows summed in another order; the rounding of a sum scales with its partial sums
    tolerance = (1e-5 if dtype == np.float32 else 1e-12) * max(np.abs(expected[-1]).max(), 1)
    np.testing.assert_allclose(outputs[-1], expected[-1], rtol=0, atol=tolerance)


def test_the_backward_is_the_same_run_to_run():
    inputs = operands("rmsnorm_backward", (3, 70, 700), np.float32)
    first, _, step = fast_and_reference("rmsnorm_backward", inputs, threads=2)
    copies = [o.copy() for o in first]
    step()
    for got, want in zip(first, copies):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("name", ["fused_residual_rmsnorm", "fused_residual_rmsnorm_backward"])
def test_a_warm_call_allocates_nothing(name):
    _, _, step = fast_and_reference(name, operands(name, (4, 128, 256), np.float32), threads=2)
    assert allocation_peak(step) < FEW_KB
