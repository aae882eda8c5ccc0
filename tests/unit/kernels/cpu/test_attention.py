"""The blocked CPU attention (forward, backward, KV cache) against the numpy references.

Within fp32 rounding (fp64: 1e-10) on causal, full and windowed attention, grouped-query heads
(8/4, 8/1), fewer queries than keys, lengths that are no multiple of the query block, ALiBi,
attention-logit softcapping (caps of 2 to 50 on scores large enough that they bend them), both
layouts and 1 or 2 threads, on the numpy and the compiled path; on the numpy path bitwise the
reference where one query block covers every row; the same bits on every run and thread count;
and a warm call allocates nothing.
"""

from __future__ import annotations

import numpy as np
import pytest
from cpu_kernel_harness import FEW_KB, allocation_peak, assert_the_reference, random

from modeldsl.kernels.cpu import cpu_kernel
from modeldsl.kernels.cpu.attention import STRIP
from modeldsl.kernels.cpu.pool import Pool
from modeldsl.kernels.reference import REFERENCES

pytestmark = pytest.mark.usefixtures("kernel_path")  # every test on the numpy and the compiled path

TOLERANCE = {np.float32: 2e-5, np.float64: 1e-10}
CASES = [  # (Hq, Hkv, Tq, Tk, causal, window)
    (8, 4, 37, 37, True, None),
    (8, 1, 300, 300, True, None),  # several query blocks, the last one short
    (8, 4, 300, 300, False, None),
    (4, 2, 300, 300, True, 50),  # a sliding window skips the keys left of it
    (4, 4, 200, 200, False, 30),  # the symmetric window of non-causal attention
    (8, 4, 20, 45, True, None),  # queries are the last Tq positions
    (2, 1, 130, 700, False, 9),
]


def heads_layout(shape, layout):
    b, h, t, d = shape
    return (b, h, t, d) if layout == "bhtd" else (b, t, h, d)


def operands(case, dtype, layout, alibi=False, seed=0, q_scale=1.0):
    hq, hkv, tq, tk, _, _ = case
    q = random(heads_layout((2, hq, tq, 16), layout), dtype, seed, q_scale)
    k = random(heads_layout((2, hkv, tk, 16), layout), dtype, seed + 1)
    v = random(heads_layout((2, hkv, tk, 16), layout), dtype, seed + 2)
    slopes = (np.arange(1, hq + 1) / (2 * hq)).astype(dtype) if alibi else None
    return q, k, v, slopes


def params(case, layout, scale=None, softcap=0.0):
    p = {"causal": case[4], "window_size": case[5], "softmax_scale": scale, "layout": layout}
    return {**p, "softcap": softcap} if softcap else p


def q_scale(softcap):
    """With a softcap c, q times 2 c: scores (of std about |q|, D = 16 at the default scale) of about
    twice the cap, which it bends into a few near c (a softmax of them spreads; one without the cap
    is nearly one-hot)."""
    return 2 * softcap if softcap else 1.0


def run(name, outputs, inputs, params_, threads=1):
    pool = Pool(threads)
    step = cpu_kernel(name)(pool, outputs, inputs, params_)
    assert step is not None, f"{name} gave no fast step"
    pool.workspace.prepare()
    step()
    return step


def forward(case, dtype, layout, threads=1, alibi=False, scale=None, softcap=0.0):
    q, k, v, slopes = operands(case, dtype, layout, alibi, q_scale=q_scale(softcap))
    p = params(case, layout, scale, softcap)
    want_out, want_lse = REFERENCES["flash_attention"](q, k, v, slopes, **p)
    out, lse = np.full(q.shape, np.nan, dtype), np.full(want_lse.shape, np.nan, np.float32)
    step = run("flash_attention", [out, lse], [q, k, v, slopes], p, threads)
    return (out, lse), (want_out, want_lse), step


def backward(case, dtype, layout, threads=1, alibi=False, softcap=0.0):
    q, k, v, slopes = operands(case, dtype, layout, alibi, q_scale=q_scale(softcap))
    p = params(case, layout, softcap=softcap)
    out, lse = (x.astype(dtype if x.ndim == 4 else np.float32) for x in
                REFERENCES["flash_attention"](q, k, v, slopes, **p))
    d_out = random(out.shape, dtype, 7)
    inputs = [d_out, q, k, v, out, lse, slopes]
    expected = REFERENCES["flash_attention_backward"](*inputs, **p)
    got = [np.full(x.shape, np.nan, dtype) for x in (q, k, v)]
    step = run("flash_attention_backward", got, inputs, p, threads)
    return got, expected, step


def close(got, want, dtype):
    np.testing.assert_allclose(got, want, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("layout", ["bhtd", "bthd"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", CASES)
def test_the_forward_is_the_reference(case, dtype, layout, threads):
    (out, lse), (want_out, want_lse), _ = forward(case, dtype, layout, threads)
    close(out, want_out, dtype)
    close(lse, want_lse, np.float32)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("layout", ["bhtd", "bthd"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", CASES)
def test_the_backward_is_the_reference(case, dtype, layout, threads):
    got, expected, _ = backward(case, dtype, layout, threads)
    for g, want in zip(got, expected):
        close(g, want, dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", [CASES[1], CASES[4]])
def test_alibi_and_a_given_scale(case, dtype):
    (out, lse), (want_out, want_lse), _ = forward(case, dtype, "bthd", 2, alibi=True, scale=0.3)
    close(out, want_out, dtype)
    close(lse, want_lse, np.float32)
    got, expected, _ = backward(case, dtype, "bhtd", 2, alibi=True)
    for g, want in zip(got, expected):
        close(g, want, dtype)


@pytest.mark.parametrize("layout", ["bhtd", "bthd"])
def test_one_query_block_is_bitwise_the_reference(layout, kernel_path):
    """One block sees every key of its rows, so the numpy path does the reference's arithmetic in its
    order (the compiled one within a few ulps: its exp, its sums)."""
    case = (8, 4, 24, 24, True, None)
    (out, lse), (want_out, want_lse), _ = forward(case, np.float32, layout)
    assert_the_reference(out, want_out, kernel_path, ulps=8)
    assert_the_reference(lse, want_lse, kernel_path, ulps=8)
    got, expected, _ = backward(case, np.float32, layout)
    for g, want in zip(got, expected):
        assert_the_reference(g, want, kernel_path, ulps=16)


def test_the_same_bits_on_every_run_and_thread_count():
    case = (8, 2, 300, 300, True, None)
    results = []
    for threads in (1, 2, 2):
        got, _, step = backward(case, np.float32, "bthd", threads)
        step()
        (out, lse), _, _ = forward(case, np.float32, "bthd", threads)
        results.append([*got, out, lse])
    for other in results[1:]:
        for a, b in zip(results[0], other):
            np.testing.assert_array_equal(a, b)


def test_one_batch_row_stacks_fewer_kv_heads_on_two_threads_with_the_same_bits():
    """A short sequence stacks every head of a batch row; with one batch row and two threads each
    thread takes half its kv heads: the results keep their bits."""
    from modeldsl.kernels.cpu.attention import Attention

    hq, hkv, t = 8, 4, 40
    q, d_out = random((1, t, hq, 16), np.float32, 1), random((1, t, hq, 16), np.float32, 4)
    k, v = random((1, t, hkv, 16), np.float32, 2), random((1, t, hkv, 16), np.float32, 3)
    p = {"causal": True, "layout": "bthd"}
    out, lse = (x.astype(np.float32) for x in REFERENCES["flash_attention"](q, k, v, None, **p))
    stacks, results = [], []
    for threads in (1, 2):
        stacks.append(Attention(Pool(threads), *(a.swapaxes(1, 2) for a in (q, k, v)), np.dtype(np.float32), True,
                                None, None, False).stack_kv)
        got_out, got_lse = np.empty_like(out), np.empty_like(lse)
        run("flash_attention", [got_out, got_lse], [q, k, v, None], p, threads)
        grads = [np.empty_like(x) for x in (q, k, v)]
        run("flash_attention_backward", grads, [d_out, q, k, v, out, lse, None], p, threads)
        results.append([got_out, got_lse, *grads])
    assert stacks == [4, 2]
    for a, b in zip(*results):
        np.testing.assert_array_equal(a, b)
    close(results[0][0], out, np.float32)


def test_the_query_block_fits_the_strip():
    """Long keys take short query blocks: a block's scores stay within STRIP elements."""
    from modeldsl.kernels.cpu.attention import Attention

    q, k = np.zeros((1, 2, 4096, 8), np.float32), np.zeros((1, 1, 4096, 8), np.float32)
    geometry = Attention(Pool(1), q, k, k, np.dtype(np.float32), True, None, None, False)
    assert geometry.rows * geometry.span <= STRIP and geometry.rows < 128


@pytest.mark.parametrize("layout", ["bhtd", "bthd"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_kv_cache_attention_is_the_reference(dtype, layout):
    b, hq, hkv, t, d, capacity = 2, 8, 4, 5, 16, 60
    q = random(heads_layout((b, hq, t, d), layout), dtype, 1)
    k, v = (random(heads_layout((b, hkv, t, d), layout), dtype, seed) for seed in (2, 3))
    caches = [random((b, hkv, capacity, d), dtype, seed) for seed in (4, 5)]
    reference_caches = [c.copy() for c in caches]
    position = np.zeros(1, np.int64)
    p = {"causal": True, "softmax_scale": None, "window_size": 7, "layout": layout}
    out, lse = np.zeros(q.shape, dtype), np.zeros((b, hq, t), np.float32)
    step = run("kv_cache_attention", [out, lse, *caches], [q, k, v, *caches, position], p, threads=2)
    for start in (0, 5, 23, capacity - t):
        position[0] = start
        step()
        want_out, want_lse, *_ = REFERENCES["kv_cache_attention"](q, k, v, *reference_caches, position, **p)
        close(out, want_out, dtype)
        close(lse, want_lse, np.float32)
        for cache, want in zip(caches, reference_caches):
            np.testing.assert_array_equal(cache, want)
    position[0] = capacity - t + 1
    with pytest.raises(ValueError, match="exceed the cache capacity"):
        step()


@pytest.mark.parametrize("kind", ["forward", "backward", "alibi", "kv_cache", "softcap", "softcap_backward"])
def test_a_warm_call_allocates_nothing(kind):
    case = (8, 4, 300, 300, True, None)
    if kind == "forward":
        step = forward(case, np.float32, "bthd", 2)[2]
    elif kind == "alibi":
        step = forward(case, np.float32, "bhtd", 2, alibi=True)[2]
    elif kind == "softcap":
        step = forward(case, np.float32, "bhtd", 2, softcap=5.0)[2]
    elif kind == "softcap_backward":
        step = backward(case, np.float32, "bthd", 2, softcap=5.0)[2]
    elif kind == "backward":
        step = backward(case, np.float32, "bthd", 2)[2]
    else:
        q = random((2, 1, 8, 32), np.float32)
        k = random((2, 1, 4, 32), np.float32)
        caches = [np.zeros((2, 4, 128, 32), np.float32) for _ in range(2)]
        out, lse = np.zeros_like(q), np.zeros((2, 8, 1), np.float32)
        step = run("kv_cache_attention", [out, lse, *caches], [q, k, k, *caches, np.array([9])],
                   {"causal": True, "layout": "bthd"}, threads=2)
    assert allocation_peak(step) < FEW_KB


# softcapping: GQA causal, a sliding window, the symmetric window, Tq < Tk, several short query blocks
SOFTCAP_CASES = [CASES[0], CASES[3], CASES[4], CASES[5], CASES[6]]
# (dtype, softcap): in fp32, scores of about a large cap carry its rounding (c 2^-24, then amplified
# by q's magnitude in d_k) past the fp32 tolerance, in the float32 reference as in the kernels; so fp32
# takes small caps, fp64 a large one too
SOFTCAP_DTYPES = [(np.float32, 2.0), (np.float32, 5.0), (np.float64, 5.0), (np.float64, 50.0)]


def assert_the_cap_bites(case, dtype, layout, softcap, alibi=False):
    """The reference's out with the cap is far from the one without it (beyond any tolerance here),
    so a kernel that ignored the cap would fail."""
    q, k, v, slopes = operands(case, dtype, layout, alibi, q_scale=q_scale(softcap))
    capped, _ = REFERENCES["flash_attention"](q, k, v, slopes, **params(case, layout, softcap=softcap))
    plain, _ = REFERENCES["flash_attention"](q, k, v, slopes, **params(case, layout))
    assert np.max(np.abs(capped - plain)) > 0.1


@pytest.mark.parametrize("layout", ["bhtd", "bthd"])
@pytest.mark.parametrize("dtype, softcap", SOFTCAP_DTYPES, ids=[f"{d.__name__}-{c}" for d, c in SOFTCAP_DTYPES])
@pytest.mark.parametrize("case", SOFTCAP_CASES)
def test_the_softcapped_forward_and_backward_are_the_reference(case, dtype, softcap, layout):
    assert_the_cap_bites(case, dtype, layout, softcap)
    (out, lse), (want_out, want_lse), _ = forward(case, dtype, layout, 2, softcap=softcap)
    close(out, want_out, dtype)
    close(lse, want_lse, np.float32)
    got, expected, _ = backward(case, dtype, layout, 2, softcap=softcap)
    for g, want in zip(got, expected):
        close(g, want, dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", [CASES[1], CASES[4]])
def test_softcap_with_alibi_and_a_given_scale(case, dtype):
    """The cap bends the scaled scores before ALiBi's bias (the reference's and flash-attn's order)."""
    assert_the_cap_bites(case, dtype, "bthd", 5.0, alibi=True)
    (out, lse), (want_out, want_lse), _ = forward(case, dtype, "bthd", 2, alibi=True, scale=0.3, softcap=5.0)
    close(out, want_out, dtype)
    close(lse, want_lse, np.float32)
    got, expected, _ = backward(case, dtype, "bhtd", 2, alibi=True, softcap=5.0)
    for g, want in zip(got, expected):
        close(g, want, dtype)


@pytest.mark.parametrize("softcap", [2.0, 5.0])
@pytest.mark.parametrize("layout", ["bhtd", "bthd"])
def test_one_softcapped_query_block_is_bitwise_the_reference(layout, softcap, kernel_path):
    """The numpy path caps in the reference's steps (c tanh(s / c), d_s (1 - tanh^2)): its bits where
    one block covers every row; the compiled one within a few ulps (its tanh and exp)."""
    case = (8, 4, 24, 24, True, None)
    assert_the_cap_bites(case, np.float32, layout, softcap)
    (out, lse), (want_out, want_lse), _ = forward(case, np.float32, layout, softcap=softcap)
    assert_the_reference(out, want_out, kernel_path, ulps=8)
    assert_the_reference(lse, want_lse, kernel_path, ulps=8)
    got, expected, _ = backward(case, np.float32, layout, softcap=softcap)
    for g, want in zip(got, expected):
        assert_the_reference(g, want, kernel_path, ulps=16)


def test_softcapped_results_keep_their_bits_on_every_run_and_thread_count():
    case = (8, 2, 300, 300, True, None)
    results = []
    for threads in (1, 2, 2):
        got, _, step = backward(case, np.float32, "bthd", threads, softcap=5.0)
        step()
        (out, lse), _, _ = forward(case, np.float32, "bthd", threads, softcap=5.0)
        results.append([*got, out, lse])
    for other in results[1:]:
        for a, b in zip(results[0], other):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("layout", ["bhtd", "bthd"])
def test_the_softcapped_kv_cache_attention_is_the_reference(layout):
    b, hq, hkv, t, d, capacity = 2, 8, 4, 5, 16, 60
    q = random(heads_layout((b, hq, t, d), layout), np.float32, 1, scale=20.0)
    k, v = (random(heads_layout((b, hkv, t, d), layout), np.float32, seed) for seed in (2, 3))
    caches = [random((b, hkv, capacity, d), np.float32, seed) for seed in (4, 5)]
    reference_caches = [c.copy() for c in caches]
    position = np.zeros(1, np.int64)
    p = {"causal": True, "softmax_scale": None, "window_size": 7, "layout": layout, "softcap": 10.0}
    out, lse = np.zeros(q.shape, np.float32), np.zeros((b, hq, t), np.float32)
    step = run("kv_cache_attention", [out, lse, *caches], [q, k, v, *caches, position], p, threads=2)
    for start in (0, 23, capacity - t):
        position[0] = start
        step()
        want_out, want_lse, *_ = REFERENCES["kv_cache_attention"](q, k, v, *reference_caches, position, **p)
        plain, *_ = REFERENCES["kv_cache_attention"](q, k, v, *(c.copy() for c in reference_caches), position,
                                                     **{**p, "softcap": 0.0})
        assert np.max(np.abs(want_out - plain)) > 0.1  # the cap bites
        close(out, want_out, np.float32)
        close(lse, want_lse, np.float32)


def test_what_it_does_not_run_falls_back_to_the_reference():
    import ml_dtypes

    q = np.zeros((1, 2, 4, 8), ml_dtypes.bfloat16)
    lse = np.zeros((1, 2, 4), np.float32)
    kernel = cpu_kernel("flash_attention")
    assert kernel(Pool(1), [q.copy(), lse], [q, q, q, None], {"causal": True}) is None
    f32 = q.astype(np.float32)
    assert kernel(Pool(1), [f32.copy(), lse], [f32, f32, f32, None], {"layout": "thbd"}) is None
    more_queries = np.zeros((1, 2, 6, 8), np.float32)
    assert kernel(Pool(1), [more_queries.copy(), np.zeros((1, 2, 6), np.float32)], [more_queries, f32, f32, None],
                  {"causal": True}) is None
    for softcap in (-1.0, np.inf, np.nan, 1e-50):  # not a positive finite cap (1e-50: 0 in float32)
        assert kernel(Pool(1), [f32.copy(), lse], [f32, f32, f32, None], {"softcap": softcap}) is None
    assert kernel(Pool(1), [f32.copy(), lse], [f32, f32, f32, None], {"softcap": 50.0}) is not None
