"""The blocked CPU attention of packed rows (segment ids: a query sees its own example's keys only)
against the numpy references, forward and backward, on the numpy and the compiled path.

Within fp32 rounding (fp64: 1e-10) on causal, windowed and full attention, GQA, fewer queries than
keys, several query blocks per example and examples per block, ids that run in order (packing's) and
ids in any order (the general mask), both layouts and 1 or 2 threads; one example per row keeps the
bits of attention without segments; a block's keys start at its first query's example; the same bits
on every run and thread count; and a warm call allocates nothing.
"""

from __future__ import annotations

import numpy as np
import pytest
from cpu_kernel_harness import FEW_KB, allocation_peak, random

from modeldsl.kernels.cpu import cpu_kernel
from modeldsl.kernels.cpu.attention import Attention, Segments
from modeldsl.kernels.cpu.pool import Pool
from modeldsl.kernels.reference import REFERENCES

from .test_attention import close, operands, params, run

pytestmark = pytest.mark.usefixtures("kernel_path")  # every test on the numpy and the compiled path

CASES = [  # (Hq, Hkv, Tq, Tk, causal, window)
    (8, 4, 37, 37, True, None),
    (4, 1, 300, 300, True, None),  # several query blocks, examples across them
    (4, 2, 300, 300, True, 50),  # a sliding window inside each example
    (4, 4, 200, 200, False, None),  # block-diagonal without the causal mask
    (8, 4, 20, 45, True, None),  # queries are the last Tq keys (their ids too)
]
LENGTHS = [[7, 60, 3, 110, 1], [150, 2, 48]]  # examples of each row, the rest of the row one more example


def packed_ids(tk: int, rows: list[list[int]] = LENGTHS) -> np.ndarray:
    """Examples one after another, as packing lays them out (the padding after them one more id)."""
    ids = np.empty((len(rows), tk), np.int64)
    for b, lengths in enumerate(rows):
        cuts = np.cumsum(lengths)
        ids[b] = np.searchsorted(cuts, np.arange(tk), side="right")
    return ids


def shuffled_ids(tk: int) -> np.ndarray:
    """Ids in no order (an example's tokens need not be contiguous): the general mask."""
    return np.random.default_rng(5).integers(0, 3, size=(2, tk)).astype(np.int32)


SEGMENTS = {"packed": packed_ids, "shuffled": shuffled_ids, "one": lambda tk: np.zeros((2, tk), np.int32)}


def forward(case, dtype, layout, segments, threads=1, softcap=0.0):
    q, k, v, _ = operands(case, dtype, layout)
    p = params(case, layout, softcap=softcap)
    want = REFERENCES["flash_attention"](q, k, v, None, segments, **p)
    out, lse = np.full(q.shape, np.nan, dtype), np.full(want[1].shape, np.nan, np.float32)
    step = run("flash_attention", [out, lse], [q, k, v, None, segments], p, threads)
    return (out, lse), want, step


def backward(case, dtype, layout, segments, threads=1, softcap=0.0):
    q, k, v, _ = operands(case, dtype, layout)
    p = params(case, layout, softcap=softcap)
    out, lse = (x.astype(dtype if x.ndim == 4 else np.float32) for x in
                REFERENCES["flash_attention"](q, k, v, None, segments, **p))
    inputs = [random(out.shape, dtype, 7), q, k, v, out, lse, None, segments]
    want = REFERENCES["flash_attention_backward"](*inputs, **p)
    got = [np.full(x.shape, np.nan, dtype) for x in (q, k, v)]
    step = run("flash_attention_backward", got, inputs, p, threads)
    return got, want, step


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("layout", ["bhtd", "bthd"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("ids", ["packed", "shuffled"])
@pytest.mark.parametrize("case", CASES)
def test_the_forward_and_backward_are_the_reference(case, ids, dtype, layout, threads):
    segments = SEGMENTS[ids](case[3])
    (out, lse), (want_out, want_lse), _ = forward(case, dtype, layout, segments, threads)
    close(out, want_out, dtype)
    close(lse, want_lse, np.float32)
    got, want, _ = backward(case, dtype, layout, segments, threads)
    for g, w in zip(got, want):
        close(g, w, dtype)


@pytest.mark.parametrize("case", [CASES[1], CASES[2]])
def test_softcapped_packed_rows_are_the_reference(case):
    segments = packed_ids(case[3])
    (out, lse), (want_out, want_lse), _ = forward(case, np.float32, "bthd", segments, 2, softcap=2.0)
    close(out, want_out, np.float32)
    close(lse, want_lse, np.float32)
    got, want, _ = backward(case, np.float32, "bhtd", segments, 2, softcap=2.0)
    for g, w in zip(got, want):
        close(g, w, np.float32)


def test_the_segments_mask_what_they_say():
    """The reference's mask: a packed row's out is the out of each example alone (at its positions 0..)."""
    case = (4, 2, 300, 300, True, None)
    q, k, v, _ = operands(case, np.float64, "bhtd")
    segments = packed_ids(300)
    out, lse = REFERENCES["flash_attention"](q, k, v, None, segments)
    start = 0
    for length in LENGTHS[1]:
        alone, alone_lse = REFERENCES["flash_attention"](*(x[1:2, :, start:start + length] for x in (q, k, v)))
        np.testing.assert_allclose(out[1:2, :, start:start + length], alone, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(lse[1:2, :, start:start + length], alone_lse, rtol=1e-12, atol=1e-12)
        start += length


@pytest.mark.parametrize("layout", ["bhtd", "bthd"])
@pytest.mark.parametrize("case", [CASES[0], CASES[1], CASES[2], CASES[4]])
def test_one_example_per_row_keeps_the_bits_of_attention_without_segments(case, layout):
    """Every strip then holds one example: it runs the steps of attention without segments."""
    segments = SEGMENTS["one"](case[3])
    (out, lse), _, _ = forward(case, np.float32, layout, segments, 2)
    (plain_out, plain_lse), _, _ = forward(case, np.float32, layout, None, 2)
    np.testing.assert_array_equal(out, plain_out)
    np.testing.assert_array_equal(lse, plain_lse)
    got, _, _ = backward(case, np.float32, layout, segments, 2)
    plain, _, _ = backward(case, np.float32, layout, None, 2)
    for a, b in zip(got, plain):
        np.testing.assert_array_equal(a, b)


def test_a_blocks_keys_start_at_its_first_querys_example():
    q, k = np.zeros((2, 2, 300, 16), np.float32), np.zeros((2, 1, 300, 16), np.float32)
    geometry = Attention(Pool(1), q, k, k, np.dtype(np.float32), True, None, None, False)
    ids = packed_ids(300, [[100, 60], [300]])
    segments = Segments(ids, geometry)
    segments.load()
    rows = geometry.rows
    assert segments.narrow(0, 0, rows, 0, rows) == (0, rows > 100)
    i0 = (100 // rows + 1) * rows  # a block inside the second example
    assert segments.narrow(0, i0, i0 + rows, 0, i0 + rows) == (100, i0 + rows > 160)
    assert segments.narrow(1, i0, i0 + rows, 0, i0 + rows) == (0, False)  # one example: no mask
    segments.view = shuffled_ids(300)  # ids out of order: every key, masked
    segments.load()
    assert segments.narrow(0, i0, i0 + rows, 0, i0 + rows) == (0, True)


def test_the_same_bits_on_every_run_and_thread_count():
    case, segments = CASES[1], packed_ids(300)
    results = []
    for threads in (1, 2, 2):
        got, _, step = backward(case, np.float32, "bthd", segments, threads)
        step()
        (out, lse), _, _ = forward(case, np.float32, "bthd", segments, threads)
        results.append([*got, out, lse])
    for other in results[1:]:
        for a, b in zip(results[0], other):
            np.testing.assert_array_equal(a, b)


def test_new_ids_on_every_run():
    """The ids are read when the step runs: the same step on the next batch's rows."""
    case = CASES[1]
    q, k, v, _ = operands(case, np.float32, "bthd")
    segments = packed_ids(300).astype(np.int32)
    out, lse = np.empty_like(q), np.empty((2, 4, 300), np.float32)
    step = run("flash_attention", [out, lse], [q, k, v, None, segments], params(case, "bthd"), 2)
    for ids in (shuffled_ids(300), packed_ids(300, [[10, 20], [299]])):
        segments[:] = ids
        step()
        want_out, want_lse = REFERENCES["flash_attention"](q, k, v, None, ids, **params(case, "bthd"))
        close(out, want_out, np.float32)
        close(lse, want_lse, np.float32)


@pytest.mark.parametrize("kind", ["forward", "backward", "shuffled"])
def test_a_warm_call_allocates_nothing(kind):
    case = (8, 4, 300, 300, True, None)
    segments = (shuffled_ids if kind == "shuffled" else packed_ids)(300)
    step = (backward if kind == "backward" else forward)(case, np.float32, "bthd", segments, 2)[2]
    assert allocation_peak(step) < FEW_KB


def test_ids_that_are_no_integers_of_the_rows_go_to_the_reference():
    q = np.zeros((2, 2, 8, 4), np.float32)
    out, lse = np.zeros_like(q), np.zeros((2, 2, 8), np.float32)
    kernel = cpu_kernel("flash_attention")
    for ids in (np.zeros((2, 8), np.float32), np.zeros((2, 7), np.int32), np.zeros((1, 8), np.int32)):
        assert kernel(Pool(1), [out, lse], [q, q, q, None, ids], {"causal": True}) is None
    assert kernel(Pool(1), [out, lse], [q, q, q, None, np.zeros((2, 8), np.int64)], {"causal": True}) is not None
