"""The CUDA attention kernels (kernels/attention.cu) against the numpy references
(kernels/reference.py: flash_attention, flash_attention_backward), on a GPU or the CPU emulator.

Random inputs on several shapes: ragged T and S (not multiples of any tile), T < S (queries at
the end), one query, GQA and MQA, head dims 2..256 (ragged ones take the scalar load paths; over
128 the "_d256" kernels, on smaller tiles);
non-causal, causal, causal with a sliding window and the symmetric (non-causal) window; both
layouts of mdsl.sched.attention ("bhtd", "bthd"); attention-logit softcapping (caps of 5 and 50 on
scores large enough that both bend them); bf16 and fp32; every output starts as NaN
(poisoned), so an element a kernel forgets to write fails. The reference runs in float64 on the
values the kernels read (inputs rounded to the variant's storage type, lse to fp32). Tolerances,
relative and, for elements near zero, relative to the tensor's largest value: bf16 outputs 1e-2;
fp32 outputs (and lse in both variants) 1e-4 -- looser than the 1e-5 of the other kernels
because every output sums exponentials over a whole row of keys with a different order and
exp2f instead of exp (the observed errors are a few 1e-7).

``MDSL_KERNEL_RUNNER=emulator python -m pytest -m gpu tests/gpu/test_attention.py`` runs them
on the CPU; on a GPU machine they run with the other GPU tests (larger shapes too).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from harness import GPU, close, ids, make_runner, rounded, run_plan, skip_without_runner

from modeldsl.kernels import cuda
from modeldsl.kernels.reference import REFERENCES

pytestmark = pytest.mark.gpu

skip_without_runner()
TOL = {"fp32": 1e-4, "bf16": 1e-2}
VARIANTS = ("fp32", "bf16")
MISALIGN = {"fp32": 4, "bf16": 2}  # byte shifts that keep elements aligned but not 4-element vectors

# (B, H, Hkv, T, S, D)
SHAPES = [
    (1, 1, 1, 1, 1, 2),  # one query, one key
    (2, 4, 2, 37, 37, 64),  # ragged T, GQA
    (1, 4, 1, 70, 70, 128),  # MQA, the wide tiles, ragged
    (1, 2, 2, 33, 50, 10),  # T < S, a ragged head dim (scalar loads)
    (2, 2, 1, 5, 40, 6),  # a few queries over many keys
    (1, 2, 1, 65, 65, 100),  # D not a multiple of 32
    (1, 2, 2, 130, 130, 64),  # several tiles of every kernel
    # head dims over 128 (the "_d256" kernels: tiles of 16 and 8 rows; Gemma 2's 256)
    (1, 2, 1, 37, 37, 256),  # MQA, ragged: several tiles of every kernel, the last one partial
    (1, 2, 2, 19, 33, 160),  # T < S, D not a multiple of 32
    (2, 4, 2, 9, 9, 192),  # GQA, T and S below one tile
    (1, 1, 1, 13, 20, 250),  # a ragged head dim (scalar loads)
]
# GPU only, on fewer masks and layouts (the float64 reference takes seconds on these):
# (shape, causal, window, layout)
LARGE = [((2, 16, 8, 1024, 1024, 128), True, None, "bhtd"), ((2, 16, 8, 1024, 1024, 128), True, 256, "bthd"),
         ((1, 8, 8, 1000, 1000, 64), False, None, "bhtd"), ((1, 8, 8, 1000, 1000, 64), False, 100, "bthd"),
         ((4, 32, 8, 256, 256, 64), True, None, "bthd"), ((1, 8, 4, 1000, 1000, 256), True, None, "bhtd"),
         ((2, 8, 4, 1024, 1024, 256), True, 256, "bthd")] if GPU else []

# (causal, window_size)
MASKS = [(False, None), (True, None), (True, 16), (False, 9)]
LAYOUTS = ("bhtd", "bthd")


@pytest.fixture(scope="module")
def runner():
    return make_runner()





def inputs(rng, shape, layout, spread=1.0):
    """q, k, v in ``layout``: [B, H, T, D] / [B, Hkv, S, D] or [B, T, H, D] / [B, S, Hkv, D]."""
    b, h, hkv, t, s, d = shape
    if layout == "bhtd":
        q_shape, k_shape = (b, h, t, d), (b, hkv, s, d)
    else:
        q_shape, k_shape = (b, t, h, d), (b, s, hkv, d)
    return (spread * rng.standard_normal(q_shape), spread * rng.standard_normal(k_shape),
            rng.standard_normal(k_shape))


def heads_first(x: np.ndarray, layout: str) -> np.ndarray:
    """A "bthd" tensor as "bhtd" and back (swapping T and H is its own inverse); "bhtd" unchanged."""
    return np.swapaxes(x, 1, 2) if layout == "bthd" else x


def check_attention(runner, q, k, v, attrs, variant, layout, rng, offset=0, backward=True):
    """Forward, then (unless told not to) backward from the reference's out and lse, against the references."""
    what = f"{variant} {layout} q {q.shape} k {k.shape} {attrs} offset {offset}"
    rq, rk, rv = (heads_first(rounded(x, variant), layout) for x in (q, k, v))
    with np.errstate(divide="ignore", invalid="ignore"):  # queries that see no key: lse -inf, out NaN
        out, lse = REFERENCES["flash_attention"](rq, rk, rv, **attrs)
    out = heads_first(out, layout)
    full = {**attrs, "layout": layout}
    result = run_plan(runner, "flash_attention", [q, k, v], [q.shape, lse.shape], full, variant, offset=offset)
    close(result.outputs["out"], out, TOL[variant], f"flash_attention out {what}")
    close(result.outputs["lse"], lse, TOL["fp32"], f"flash_attention lse {what}")
    if not backward:
        return result
    d_out = rng.standard_normal(q.shape)
    saved_out, saved_lse = rounded(out, variant), rounded(lse, "fp32")
    want = REFERENCES["flash_attention_backward"](heads_first(rounded(d_out, variant), layout), rq, rk, rv,
                                                  heads_first(saved_out, layout), saved_lse, **attrs)
    grads = run_plan(runner, "flash_attention_backward", [d_out, q, k, v, saved_out, saved_lse],
                     [q.shape, k.shape, v.shape], full, variant, offset=offset)
    # the absolute bound is relative to the largest of the three gradients: where every query sees
    # one key, d_q and d_k are 0 (softmax of one score) and only rounding is left of them
    largest = max(float(np.abs(w).max()) for w in want)
    for name, expected in zip(("d_q", "d_k", "d_v"), want):
        close(grads.outputs[name], heads_first(expected, layout), TOL[variant],
              f"flash_attention_backward {name} {what}", floor=largest)
    return result


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("causal, window", MASKS, ids=ids(MASKS))
@pytest.mark.parametrize("shape", SHAPES, ids=ids(SHAPES))
def test_flash_attention(runner, shape, causal, window, variant, layout):
    rng = np.random.default_rng(31)
    q, k, v = inputs(rng, shape, layout)
    check_attention(runner, q, k, v, {"causal": causal, "window_size": window}, variant, layout, rng)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("shape, causal, window, layout", LARGE, ids=ids(LARGE))
def test_flash_attention_large(runner, shape, causal, window, variant, layout):
    rng = np.random.default_rng(36)
    q, k, v = inputs(rng, shape, layout)
    check_attention(runner, q, k, v, {"causal": causal, "window_size": window}, variant, layout, rng)


# S - T = 0 and 8 (tile-aligned positions), 1 and 9 (k0 - (S - T) just below a tile edge); D = 256 on
# the tiles of 16 and 8 rows (windows 31 and 33 straddle two of 16)
EDGES = [(1, 2, 1, 96, 96, 64), (1, 2, 1, 95, 96, 64), (1, 2, 2, 72, 80, 128), (1, 2, 2, 71, 80, 128),
         (1, 1, 1, 48, 48, 256), (1, 1, 1, 40, 48, 256), (1, 1, 1, 39, 48, 256)]


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("window", [1, 2, 31, 33])
@pytest.mark.parametrize("shape", EDGES, ids=ids(EDGES))
def test_windows_at_tile_edges(runner, shape, window, causal):
    """Windows whose first or last visible key falls on a tile edge: the tiles each kernel skips
    (window 1: every query sees only its own position)."""
    rng = np.random.default_rng(35)
    q, k, v = inputs(rng, shape, "bhtd")
    check_attention(runner, q, k, v, {"causal": causal, "window_size": window}, "fp32", "bhtd", rng)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("shape", [(1, 2, 1, 50, 90, 64), (1, 2, 1, 30, 70, 256)], ids=ids)
def test_flash_attention_softmax_scale_and_peaked_scores(runner, shape, variant):
    """An explicit softmax_scale, and scores large enough that the running max changes a lot
    between key tiles (the online softmax's rescaling)."""
    rng = np.random.default_rng(32)
    q, k, v = inputs(rng, shape, "bhtd", spread=3.0)
    check_attention(runner, q, k, v, {"causal": True, "softmax_scale": 0.7, "window_size": None}, variant, "bhtd",
                    rng)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("shape", [(1, 4, 2, 37, 37, 64), (1, 4, 2, 21, 21, 256)], ids=ids)
def test_flash_attention_on_misaligned_buffers(runner, shape, variant, layout):
    """Buffers off their 4-element alignment: the kernels' one-element loads and stores."""
    rng = np.random.default_rng(33)
    q, k, v = inputs(rng, shape, layout)
    check_attention(runner, q, k, v, {"causal": True, "window_size": None}, variant, layout, rng,
                    offset=MISALIGN[variant])


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("d", [16, 256])
def test_queries_that_see_no_key(runner, d, variant):
    """Causal with more queries than keys: the first queries see nothing; as the reference, their
    lse is -inf and their output NaN (the outputs start as 0 here, so the NaN was written). The
    backward is not covered there (the reference's gradients are NaN)."""
    rng = np.random.default_rng(34)
    q, k, v = inputs(rng, (1, 2, 1, 9, 5, d), "bhtd")
    result = check_attention(runner, q, k, v, {"causal": True, "window_size": None}, variant, "bhtd", rng,
                             backward=False)
    assert np.isneginf(result.outputs["lse"][:, :, :4]).all() and np.isfinite(result.outputs["lse"][:, :, 4:]).all()
    assert np.isnan(result.outputs["out"].astype(np.float32)[:, :, :4]).all()
    with pytest.raises(cuda.NotCovered):
        cuda.plan("flash_attention_backward", [q.shape, q.shape, k.shape, k.shape, q.shape, q.shape[:3]],
                  [q.shape, k.shape, k.shape], {"causal": True}, variant)


@pytest.mark.parametrize("d", [64, 256])
def test_the_default_scale_is_one_over_sqrt_d(d):
    plan = cuda.plan("flash_attention", [(1, 2, 8, d), (1, 2, 8, d), (1, 2, 8, d)], [], {}, "fp32")
    (launch,) = plan.launches
    params = dict(zip((name for name, _ in launch.kernel.params), (a.value for a in launch.args)))
    assert math.isclose(params["scale"], 1 / math.sqrt(d)) and params["causal"] == 1 and params["window"] == 0
    assert params["softcap"] == 0.0


# Softcapping (Gemma 2's attn_logit_softcapping): (B, H, Hkv, T, S, D) with GQA, MQA on the wide
# tiles, T < S with a ragged head dim, several tiles of every kernel, and Gemma 2's head dim 256
# (GQA, ragged) and 192 (T < S) on the "_d256" kernels
SOFTCAP_SHAPES = [(2, 4, 2, 37, 37, 64), (1, 4, 1, 70, 70, 128), (1, 2, 2, 33, 50, 10), (1, 2, 1, 130, 130, 64),
                  (1, 4, 2, 37, 37, 256), (1, 2, 1, 21, 30, 192)]
SOFTCAPS = (5.0, 50.0)


def capped_inputs(rng, shape, layout, softcap, attrs):
    """q (times 2 c), k, v: scores of about twice the cap c, which it bends into a few near c (a
    softmax of the capped scores spreads over them; without the cap it is nearly one-hot). Checked:
    the reference's out with the cap is not within bf16's tolerance of the one without it, so a
    kernel that ignored the cap would fail."""
    q, k, v = inputs(rng, shape, layout)
    q = 2 * softcap * q
    rq, rk, rv = (heads_first(rounded(x, "bf16"), layout) for x in (q, k, v))
    with np.errstate(divide="ignore", invalid="ignore"):
        capped, _ = REFERENCES["flash_attention"](rq, rk, rv, **attrs, softcap=softcap)
        plain, _ = REFERENCES["flash_attention"](rq, rk, rv, **attrs)
    with pytest.raises(AssertionError):
        close(plain, capped, TOL["bf16"], "the cap does not bite")
    return q, k, v


@pytest.mark.parametrize("softcap", SOFTCAPS)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("causal, window", MASKS, ids=ids(MASKS))
@pytest.mark.parametrize("shape", SOFTCAP_SHAPES, ids=ids(SOFTCAP_SHAPES))
def test_flash_attention_softcap(runner, shape, causal, window, variant, layout, softcap):
    """Forward and backward with the scaled scores capped to c tanh(s / c) before the mask."""
    rng = np.random.default_rng(37)
    attrs = {"causal": causal, "window_size": window}
    q, k, v = capped_inputs(rng, shape, layout, softcap, attrs)
    check_attention(runner, q, k, v, {**attrs, "softcap": softcap}, variant, layout, rng)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("shape", [(1, 4, 2, 45, 45, 32), (1, 4, 2, 27, 27, 256)], ids=ids)
def test_flash_attention_softcap_with_a_scale_on_misaligned_buffers(runner, shape, variant):
    """An explicit softmax_scale under the cap, through the one-element loads and stores."""
    rng = np.random.default_rng(38)
    attrs = {"causal": True, "window_size": 20, "softmax_scale": 0.5}
    q, k, v = capped_inputs(rng, shape, "bthd", 5.0, attrs)
    check_attention(runner, q, k, v, {**attrs, "softcap": 5.0}, variant, "bthd", rng, offset=MISALIGN[variant])


LARGE_SOFTCAP = [*LARGE[:2], *LARGE[-2:]]  # D = 128 and Gemma 2's 256


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("shape, causal, window, layout", LARGE_SOFTCAP, ids=ids(LARGE_SOFTCAP))
def test_flash_attention_softcap_large(runner, shape, causal, window, variant, layout):
    rng = np.random.default_rng(39)
    attrs = {"causal": causal, "window_size": window}
    q, k, v = capped_inputs(rng, shape, layout, 50.0, attrs)
    check_attention(runner, q, k, v, {**attrs, "softcap": 50.0}, variant, layout, rng)


# Packed rows: segment ids [B, S] (the *_seg kernels). (B, H, Hkv, T, S, D): examples across key tiles,
# GQA, T < S (queries at the end: their ids are those of the last T keys), the wide tiles, D > 128
SEGMENT_SHAPES = [(2, 4, 2, 37, 37, 64), (1, 2, 1, 130, 130, 64), (1, 4, 1, 70, 70, 128), (1, 2, 2, 33, 50, 10),
                  (1, 2, 1, 37, 37, 256), (1, 2, 2, 19, 33, 160)]
SEGMENT_MASKS = [(True, None), (True, 16), (False, None)]


def packed_segments(rng, b: int, s: int) -> np.ndarray:
    """Examples of random lengths one after another in each row (as packing lays them out)."""
    lengths = rng.integers(1, max(2, s // 2), size=(b, s))
    return np.stack([np.searchsorted(np.cumsum(row), np.arange(s), side="right") for row in lengths])


def check_packed_attention(runner, q, k, v, segments, attrs, variant, layout, index_dtype, rng):
    what = f"{variant} {layout} q {q.shape} k {k.shape} {attrs} segments {index_dtype}"
    rq, rk, rv = (heads_first(rounded(x, variant), layout) for x in (q, k, v))
    out, lse = REFERENCES["flash_attention"](rq, rk, rv, None, segments, **attrs)
    out = heads_first(out, layout)
    full = {**attrs, "layout": layout}
    plan = cuda.plan("flash_attention", [q.shape, k.shape, v.shape, None, segments.shape], [q.shape, lse.shape],
                     full, variant, index_dtype)
    (launch,) = plan.launches
    assert launch.symbol.startswith("mdsl_attention_fwd_") and "_seg_" in launch.symbol
    result = run_plan(runner, "flash_attention", [q, k, v, None, segments], [q.shape, lse.shape], full, variant,
                      index_dtype=index_dtype)
    close(result.outputs["out"], out, TOL[variant], f"flash_attention out {what}")
    close(result.outputs["lse"], lse, TOL["fp32"], f"flash_attention lse {what}")
    d_out = rng.standard_normal(q.shape)
    saved_out, saved_lse = rounded(out, variant), rounded(lse, "fp32")
    want = REFERENCES["flash_attention_backward"](heads_first(rounded(d_out, variant), layout), rq, rk, rv,
                                                  heads_first(saved_out, layout), saved_lse, None, segments, **attrs)
    grads = run_plan(runner, "flash_attention_backward", [d_out, q, k, v, saved_out, saved_lse, None, segments],
                     [q.shape, k.shape, v.shape], full, variant, index_dtype=index_dtype)
    largest = max(float(np.abs(w).max()) for w in want)
    for name, expected in zip(("d_q", "d_k", "d_v"), want):
        close(grads.outputs[name], heads_first(expected, layout), TOL[variant],
              f"flash_attention_backward {name} {what}", floor=largest)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("causal, window", SEGMENT_MASKS, ids=ids(SEGMENT_MASKS))
@pytest.mark.parametrize("shape", SEGMENT_SHAPES, ids=ids(SEGMENT_SHAPES))
def test_flash_attention_of_packed_rows(runner, shape, causal, window, variant, layout):
    rng = np.random.default_rng(37)
    q, k, v = inputs(rng, shape, layout)
    segments = packed_segments(rng, shape[0], shape[4])
    check_packed_attention(runner, q, k, v, segments, {"causal": causal, "window_size": window}, variant, layout,
                           "int32", rng)


def test_packed_rows_with_a_softcap_and_ids_in_no_order(runner):
    """Ids that are not runs (the mask compares them whatever their order) and a softcap."""
    rng = np.random.default_rng(38)
    shape = (1, 2, 1, 45, 45, 64)
    q, k, v = inputs(rng, shape, "bthd", spread=3.0)
    segments = rng.integers(0, 3, size=(1, 45))
    check_packed_attention(runner, q, k, v, segments, {"causal": True, "window_size": None, "softcap": 5.0}, "fp32",
                           "bthd", "int32", rng)


def test_ids_of_another_shape_or_int64_ones_are_not_covered():
    shapes = [(1, 2, 8, 16), (1, 2, 8, 16), (1, 2, 8, 16), None]
    with pytest.raises(cuda.NotCovered, match="segment ids"):
        cuda.plan("flash_attention", [*shapes, (1, 7)], [], {}, "fp32")
    with pytest.raises(cuda.NotCovered, match="int64"):
        cuda.plan("flash_attention", [*shapes, (1, 8)], [], {}, "fp32", "int64")
    (launch,) = cuda.plan("flash_attention", [*shapes, (1, 8)], [], {}, "fp32").launches
    assert launch.symbol == "mdsl_attention_fwd_seg_f32" and launch.args[-1].value == "in:segments"
