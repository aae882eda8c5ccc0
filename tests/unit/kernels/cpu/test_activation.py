"""The SiLU-family CPU kernels give their numpy references' results (the numpy path bitwise), in place too,
allocating nothing."""

import numpy as np
import pytest
from cpu_kernel_harness import FEW_KB, allocation_peak, assert_the_reference, fast_and_reference, random

from modeldsl.kernels.cpu import compiled, cpu_kernel
from modeldsl.kernels.cpu.pool import Pool
from modeldsl.kernels.reference import REFERENCES

SHAPES = [(5, 7), (2, 200, 700)]  # one tile, and two tiles of rows (one thread) or a block per thread


def operands(name, shape, dtype):
    width = shape[-1]
    if name.startswith("fused_split"):
        gate_up = random((*shape[:-1], 2 * width), dtype, 1, 4.0)
        return [gate_up] if "backward" not in name else [random(shape, dtype, 2), gate_up]
    count = {"silu": 1, "swiglu": 2, "silu_backward": 2, "swiglu_backward": 3}[name]
    return [random(shape, dtype, seed, 4.0) for seed in range(count)]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("name", ["silu", "silu_backward", "swiglu", "swiglu_backward", "fused_split_swiglu",
                                  "fused_split_swiglu_backward"])
def test_the_reference(name, shape, dtype, threads, kernel_path):
    outputs, expected, _ = fast_and_reference(name, operands(name, shape, dtype), threads=threads)
    for got, want in zip(outputs, expected):
        assert_the_reference(got, want, kernel_path)


def test_overflowing_exp_gives_the_limits(kernel_path):
    gate = np.array([[-1000.0, -103.0, -90.0, 0.0, 90.0, 1000.0, np.inf, -np.inf]], np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        outputs, expected, _ = fast_and_reference("silu", [gate])
    assert_the_reference(outputs[0], expected[0], kernel_path)
    assert outputs[0][0, 0] == 0 and outputs[0][0, 4] == 90 and outputs[0][0, 5] == 1000


def test_the_compiled_exp_is_within_an_ulp_of_the_rounded_exp(kernel_path):
    """Over every float32 exponent the exp can give (normal results), and its limits as numpy's."""
    if kernel_path == "numpy":
        pytest.skip("the compiled path's exp")
    x = np.concatenate([np.linspace(-87.3, 88.7, 1 << 21, dtype=np.float32),
                        np.clip(random((4096,), np.float32, 5, 30.0), -87.3, 88.7)])
    got, want = compiled.fast_exp(x), np.exp(x.astype(np.float64)).astype(np.float32)
    ulps = np.abs(got.view(np.int32).astype(np.int64) - want.view(np.int32).astype(np.int64))
    assert ulps.max() <= 1
    limits = np.array([-np.inf, -200.0, -104.0, 88.8, 1000.0, np.inf, np.nan], np.float32)
    np.testing.assert_array_equal(compiled.fast_exp(limits), [0, 0, 0, np.inf, np.inf, np.inf, np.nan])


def test_the_split_backward_may_write_over_its_gate_up(kernel_path):
    d_out, gate_up = operands("fused_split_swiglu_backward", (3, 70, 700), np.float32)
    expected = REFERENCES["fused_split_swiglu_backward"](d_out, gate_up)
    pool = Pool(2)
    step = cpu_kernel("fused_split_swiglu_backward")(pool, [gate_up], [d_out, gate_up], {})
    pool.workspace.prepare()
    step()
    assert_the_reference(gate_up, expected, kernel_path)


@pytest.mark.parametrize("name", ["swiglu_backward", "fused_split_swiglu"])
def test_a_warm_call_allocates_nothing(name, kernel_path):
    _, _, step = fast_and_reference(name, operands(name, (4, 128, 688), np.float32), threads=2)
    assert allocation_peak(step) < FEW_KB


def test_bf16_operands_get_no_fast_step(kernel_path):
    import ml_dtypes

    gate = np.zeros((2, 4), ml_dtypes.bfloat16)
    assert cpu_kernel("silu")(Pool(1), [gate.copy()], [gate], {}) is None
