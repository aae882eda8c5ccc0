"""The copying, adding and gathering CPU kernels against their references, without allocating."""

import numpy as np
import pytest
from cpu_kernel_harness import FEW_KB, allocation_peak, fast_and_reference, random

from modeldsl.kernels.cpu import cpu_kernel
from modeldsl.kernels.cpu.pool import Pool
from modeldsl.kernels.reference import REFERENCES

X = random((2, 3, 8), np.float32, 1)
CASES = {
    "add": ([X, random((2, 3, 8), np.float32, 2)], {}),
    "add_broadcast": ([X, random((8,), np.float32, 2)], {}),
    "mul": ([X, random((3, 8), np.float32, 2)], {}),
    "view": ([X], {"shape": (6, 8)}),
    "copy": ([X], {}),
    "contiguous": ([X.swapaxes(0, 1)], {}),
    "transpose": ([X], {"dim0": 1, "dim1": 2}),
    "permute": ([X], {"dims": (2, 0, 1)}),
    "concat": ([X, random((2, 3, 5), np.float32, 3)], {"dim": -1}),
    "split": ([X], {"sizes": (3, 5), "dim": -1}),
    "embedding": ([np.array([[3, 0, 3], [1, 2, 4]]), random((5, 8), np.float32, 4)], {}),
    "embedding_backward": ([random((2, 3, 8), np.float32, 5), np.array([[3, 0, 3], [1, 2, 4]])],
                           {"shape": (6, 8)}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_reference(case):
    inputs, params = CASES[case]
    name = case.split("_broadcast")[0]
    outputs, expected, step = fast_and_reference(name, inputs, params)
    for got, want in zip(outputs, expected):
        np.testing.assert_array_equal(got, want)
    step()  # runs again into the same buffers (embedding_backward zeroes first)
    for got, want in zip(outputs, expected):
        np.testing.assert_array_equal(got, want)


def test_the_accumulating_embedding_backward_adds():
    inputs, params = CASES["embedding_backward"]
    expected = REFERENCES["embedding_backward"](*inputs, **params)
    d_weight = np.ones((6, 8), np.float32)
    cpu_kernel("embedding_backward")(Pool(1), [d_weight], inputs, {**params, "accumulate": True})()
    np.testing.assert_allclose(d_weight, expected + 1, rtol=1e-6)  # added into the ones row by row


def test_cast_rounds_as_the_reference():
    import ml_dtypes

    x = random((4, 9), np.float32, 6)
    outputs, expected, _ = fast_and_reference("cast", [x], {"dtype": ml_dtypes.bfloat16},
                                              outputs=[np.zeros((4, 9), ml_dtypes.bfloat16)])
    np.testing.assert_array_equal(outputs[0], expected[0])


@pytest.mark.parametrize("case", ["embedding", "concat", "add"])
def test_a_warm_call_allocates_nothing(case):
    big = {"embedding": [np.arange(512).reshape(4, 128) % 4096, random((4096, 256), np.float32, 1)],
           "concat": [random((512, 256), np.float32, 1), random((512, 256), np.float32, 2)],
           "add": [random((512, 256), np.float32, 1), random((512, 256), np.float32, 2)]}[case]
    _, _, step = fast_and_reference(case, big, {"dim": -1} if case == "concat" else {})
    assert allocation_peak(step) < FEW_KB
