"""The CPU dropout kernel against its reference: the same bits, on one thread and several, across
tile boundaries, in place, with the step counter and the layers in the key, read when the step runs,
allocating nothing once warm, and a copy outside training."""

import numpy as np
import pytest
from cpu_kernel_harness import FEW_KB, allocation_peak, fast_and_reference, random

from modeldsl.kernels.cpu import cpu_kernel
from modeldsl.kernels.cpu.pool import TILE, Pool
from modeldsl.kernels.reference import REFERENCES

SHAPES = [(7,), (3, 33), (2, TILE // 2 + 5)]  # the last spans tiles, and threads split it


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("shape", SHAPES)
def test_the_reference_bit_for_bit(shape, threads, dtype):
    x = random(shape, dtype, 3)
    params = {"p": 0.3, "seed": 9, "offset": 2, "training": True}
    (got,), (want,), _ = fast_and_reference("dropout", [x], params, threads=threads)
    np.testing.assert_array_equal(got, want)
    assert (got == 0).any() or x.size < 8


@pytest.mark.parametrize("params", [{"p": 0.3, "training": False}, {"p": 0.0, "training": True}])
def test_outside_training_or_without_p_it_copies(params):
    x = random((4, 9), np.float32, 4)
    (got,), (want,), _ = fast_and_reference("dropout", [x], params)
    np.testing.assert_array_equal(got, x)
    np.testing.assert_array_equal(want, x)


def test_in_place():
    """The output may take over the input's buffer (the registry's reuse)."""
    x = random((5, 17), np.float32, 5)
    params = {"p": 0.5, "seed": 1, "training": True}
    want = REFERENCES["dropout"](x.copy(), **params)
    buffer = x.copy()
    pool = Pool(1)
    step = cpu_kernel("dropout")(pool, [buffer], [buffer], params)
    pool.workspace.prepare()
    step()
    np.testing.assert_array_equal(buffer, want)


def test_bf16_falls_back_to_the_reference():
    import ml_dtypes

    x = random((4, 4), np.float32, 6).astype(ml_dtypes.bfloat16)
    assert cpu_kernel("dropout")(Pool(1), [x.copy()], [x], {"p": 0.5, "training": True}) is None


def counter(value: int) -> np.ndarray:
    return np.array([value], dtype=np.int64)


@pytest.mark.parametrize("threads", [1, 2])
def test_the_step_counter_and_the_layers_key_the_mask(threads):
    """The reference's bits with a step operand and layers; another step or another layer is another mask."""
    x = random((3, TILE // 2 + 7), np.float32, 7) + np.float32(8)  # no zeros: a drop shows
    params = {"p": 0.5, "seed": 4, "training": True, "layers": [1]}
    masks = {}
    for step, layers in ((0, [1]), (1, [1]), (2**40 + 3, [1]), (1, [0]), (1, [])):
        case = {**params, "layers": layers}
        (got,), (want,), _ = fast_and_reference("dropout", [x, counter(step)], case, threads=threads)
        np.testing.assert_array_equal(got, want)
        masks[step, tuple(layers)] = got != 0
    base = masks[1, (1,)]
    for other in [m for k, m in masks.items() if k != (1, (1,))]:
        assert 0.45 < (other != base).mean() < 0.55  # independent draws disagree on about half


def test_the_counter_is_read_when_the_step_runs():
    """The executor binds the counter's buffer once and copies each run's value in: the step reads it then."""
    x = random((4, 1000), np.float32, 8) + np.float32(8)
    step_input, out = counter(5), np.empty((4, 1000), np.float32)
    params = {"p": 0.3, "seed": 2, "training": True}
    pool = Pool(1)
    step = cpu_kernel("dropout")(pool, [out], [x, step_input], params)
    pool.workspace.prepare()
    for value in (5, 6, 5):
        step_input[0] = value
        step()
        np.testing.assert_array_equal(out, REFERENCES["dropout"](x, counter(value), **params))


@pytest.mark.parametrize("shape", [(3, 33), (4, 3 * TILE // 2 + 1)])
def test_a_warm_call_allocates_nothing(shape):
    """The mask's draws live in the pool's workspace, not in a temporary per tile."""
    x = random(shape, np.float32, 9)
    _, _, step = fast_and_reference("dropout", [x, counter(3)], {"p": 0.25, "seed": 1, "training": True},
                                    threads=2)
    assert allocation_peak(step) < FEW_KB
