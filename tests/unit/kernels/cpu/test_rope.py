"""The RoPE CPU kernels give the reference's rotations (the numpy path bitwise, the compiled one within
rounding), in both layouts, in place too."""

import numpy as np
import pytest
from cpu_kernel_harness import FEW_KB, allocation_peak, assert_the_reference, fast_and_reference, random

from modeldsl.kernels.cpu import cpu_kernel
from modeldsl.kernels.cpu.pool import Pool
from modeldsl.kernels.reference import REFERENCES

pytestmark = pytest.mark.usefixtures("kernel_path")  # every test on the numpy and the compiled path


def operands(layout, dtype, batch=2, tokens=37, heads=(4, 2), dim=8):
    shape = (lambda h: (batch, h, tokens, dim)) if layout == "bhtd" else (lambda h: (batch, tokens, h, dim))
    freqs = random((tokens, dim // 2, 2), dtype, 7)
    return [random(shape(heads[0]), dtype, 1), random(shape(heads[1]), dtype, 2), freqs]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("layout", ["bhtd", "bthd"])
@pytest.mark.parametrize("name", ["rope", "rope_backward"])
def test_the_reference(name, layout, interleaved, dtype, threads, kernel_path):
    params = {"layout": layout, "interleaved": interleaved}
    outputs, expected, _ = fast_and_reference(name, operands(layout, dtype), params, threads)
    for got, want in zip(outputs, expected):
        assert_the_reference(got, want, kernel_path)


def test_many_tiles_of_positions(kernel_path):
    params = {"layout": "bthd"}
    inputs = operands("bthd", np.float32, batch=3, tokens=1000, heads=(8, 4), dim=32)
    outputs, expected, step = fast_and_reference("rope", inputs, params, threads=2)
    for got, want in zip(outputs, expected):
        assert_the_reference(got, want, kernel_path)
    assert allocation_peak(step) < FEW_KB


@pytest.mark.parametrize("layout", ["bhtd", "bthd"])
def test_in_place(layout, kernel_path):
    q, k, freqs = operands(layout, np.float32)
    expected = REFERENCES["rope"](q, k, freqs, layout=layout)
    pool = Pool(2)
    step = cpu_kernel("rope")(pool, [q, k], [q, k, freqs], {"layout": layout})
    pool.workspace.prepare()
    step()
    assert_the_reference(q, expected[0], kernel_path)
    assert_the_reference(k, expected[1], kernel_path)


def qk_operands(layout, seed=0):
    q, k, freqs = operands(layout, np.float32, heads=(4, 2), dim=16)
    weights = [random((16,), np.float32, seed + 8) + 1, random((16,), np.float32, seed + 9) + 1]
    return q, k, weights, freqs


@pytest.mark.parametrize("layout", ["bhtd", "bthd"])
def test_the_fused_qk_norm_rope_is_the_reference_and_its_parts_bitwise(layout, kernel_path):
    """On the compiled path (the only one that runs these kernels) the fused kernels are their unfused
    compiled parts bit for bit, so a program that fuses them keeps its bits; all within rounding of
    the references."""
    if kernel_path == "numpy":
        assert cpu_kernel("fused_qk_norm_rope") is None  # the reference runs it
        return
    q, k, (q_weight, k_weight), freqs = qk_operands(layout)
    params = {"layout": layout, "eps": 1e-6}
    fused, expected, _ = fast_and_reference("fused_qk_norm_rope", [q, k, q_weight, k_weight, freqs], params, threads=2)
    for got, want in zip(fused, expected):
        assert_the_reference(got, want, kernel_path, ulps=16)
    normed, _, _ = fast_and_reference("qk_norm", [q, k, q_weight, k_weight], {"eps": 1e-6}, threads=2)
    rotated, _, _ = fast_and_reference("rope", [normed[0], normed[1], freqs], {"layout": layout}, threads=2)
    for a, b in zip(fused, [*rotated, *normed[2:]]):
        np.testing.assert_array_equal(a, b)

    d_q_rot, d_k_rot = random(q.shape, np.float32, 11), random(k.shape, np.float32, 12)
    inputs = [d_q_rot, d_k_rot, q, k, q_weight, k_weight, normed[2], normed[3], freqs]
    grads, expected, _ = fast_and_reference("fused_qk_norm_rope_backward", inputs, {"layout": layout}, threads=2)
    for got, want in zip(grads, expected):
        assert_the_reference(got, want, kernel_path, ulps=64)
    unrotated, _, _ = fast_and_reference("rope_backward", [d_q_rot, d_k_rot, freqs], {"layout": layout}, threads=2)
    parts, _, _ = fast_and_reference("qk_norm_backward", [*unrotated, q, k, q_weight, k_weight, *normed[2:]],
                                     threads=2)
    for a, b in zip(grads, parts):
        np.testing.assert_array_equal(a, b)


def row_tables(batch=2, tokens=37, dim=8, dtype=np.float32):
    """A table per row ``[B, T, D/2, 2]`` (packed rows: each row's tokens at positions of their own)."""
    return random((batch, tokens, dim // 2, 2), dtype, 17)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("layout", ["bhtd", "bthd"])
@pytest.mark.parametrize("name", ["rope", "rope_backward"])
def test_a_table_per_row_is_the_reference(name, layout, interleaved, dtype, threads, kernel_path):
    q, k, _ = operands(layout, dtype)
    params = {"layout": layout, "interleaved": interleaved}
    outputs, expected, step = fast_and_reference(name, [q, k, row_tables(dtype=dtype)], params, threads)
    for got, want in zip(outputs, expected):
        assert_the_reference(got, want, kernel_path)
    assert allocation_peak(step) < FEW_KB


@pytest.mark.parametrize("layout", ["bhtd", "bthd"])
def test_a_table_per_row_rotates_each_row_by_its_own(layout, kernel_path):
    """Row b of a per-row rotation is the shared-table rotation by row b's table, bit for bit."""
    q, k, _ = operands(layout, np.float32)
    tables = row_tables()
    rows, _, _ = fast_and_reference("rope", [q, k, tables], {"layout": layout}, threads=2)
    for b in range(2):
        alone, _, _ = fast_and_reference("rope", [q[b:b + 1], k[b:b + 1], tables[b]], {"layout": layout})
        for got, want in zip(rows, alone):
            np.testing.assert_array_equal(got[b:b + 1], want)


@pytest.mark.parametrize("layout", ["bhtd", "bthd"])
def test_the_fused_qk_norm_rope_takes_a_table_per_row(layout, kernel_path):
    """The fused kernels with per-row tables: the references, and their unfused parts bit for bit."""
    if kernel_path == "numpy":
        return  # the reference runs them (see above)
    q, k, (q_weight, k_weight), _ = qk_operands(layout)
    tables = row_tables(dim=16)
    params = {"layout": layout, "eps": 1e-6}
    fused, expected, _ = fast_and_reference("fused_qk_norm_rope", [q, k, q_weight, k_weight, tables], params, 2)
    for got, want in zip(fused, expected):
        assert_the_reference(got, want, kernel_path, ulps=16)
    normed, _, _ = fast_and_reference("qk_norm", [q, k, q_weight, k_weight], {"eps": 1e-6}, threads=2)
    rotated, _, _ = fast_and_reference("rope", [normed[0], normed[1], tables], {"layout": layout}, threads=2)
    for a, b in zip(fused, [*rotated, *normed[2:]]):
        np.testing.assert_array_equal(a, b)
    d_q_rot, d_k_rot = random(q.shape, np.float32, 11), random(k.shape, np.float32, 12)
    inputs = [d_q_rot, d_k_rot, q, k, q_weight, k_weight, normed[2], normed[3], tables]
    grads, expected, _ = fast_and_reference("fused_qk_norm_rope_backward", inputs, {"layout": layout}, threads=2)
    for got, want in zip(grads, expected):
        assert_the_reference(got, want, kernel_path, ulps=64)
