"""Every CUDA kernel (kernels/*.cu) against its numpy reference (kernels/reference.py), on a GPU.

Random inputs on several shapes, ragged ones included, and once more with every buffer shifted
off its 16-byte alignment (the kernels' scalar paths); every output and the scratch start as NaN
(poisoned), so an element a kernel forgets to write fails. The reference runs in float64 on the
very values the kernel reads (inputs rounded to the variant's storage type); a result must match
within rtol 1e-5 when it is stored as fp32 and 1e-2 when bf16 (with the same bound, relative to
the tensor's largest value, for elements near zero). Every launch goes through harness.run_plan,
that is through the kernels/cuda.py table (symbols, launch configurations, argument order).

Skipped without CuPy or without a CUDA device: ``python -m pytest -m gpu tests/gpu`` on a GPU
machine. ``MDSL_KERNEL_RUNNER=emulator`` runs the same tests on the CPU emulator
(tests/gpu/emulator: the kernels compiled with g++; slow, for working without a GPU).
"""

from __future__ import annotations

import math
import os

import ml_dtypes
import numpy as np
import pytest
from harness import GPU, close, ids, make_runner, rounded, run_plan, skip_without_runner, storage

from modeldsl.kernels import cuda
from modeldsl.kernels.reference import REFERENCES

pytestmark = pytest.mark.gpu

skip_without_runner()
TOL = {"fp32": 1e-5, "bf16": 1e-2, "fp16": 1e-2}
VARIANTS = ("fp32", "bf16")
MISALIGN = {"fp32": 4, "bf16": 2}  # byte shifts that keep elements aligned but not vectors


@pytest.fixture(scope="module")
def runner():
    return make_runner()




def check(runner, name, inputs, attrs=None, variant="fp32", index_dtype="int32", ref_attrs=None, offset=0,
          poison=0xFF):
    """Run primitive ``name`` through its CUDA plan and compare every output with the reference."""
    prim = cuda.primitive(name)
    attrs = dict(attrs or {})
    names = [prim.inputs[0]] * len(inputs) if prim.variadic else list(prim.inputs)
    ref_inputs = []
    for buffer, array in zip(names, inputs):
        dtype = prim.dtype(buffer, variant, index_dtype)
        is_float = array is not None and dtype in ("fp32", "bf16", "fp16")
        ref_inputs.append(rounded(array, dtype) if is_float else array)
    want = REFERENCES[name](*[a.copy() if isinstance(a, np.ndarray) else a for a in ref_inputs],
                            **attrs, **(ref_attrs or {}))
    want = want if isinstance(want, tuple) else (want,)
    shapes = [np.shape(w) for w in want]
    result = run_plan(runner, name, inputs, shapes, attrs, variant, index_dtype, offset=offset, poison=poison)
    for buffer, expected in zip(prim.outputs, want):
        got = result.outputs[buffer]
        dtype = prim.dtype(buffer, variant, index_dtype)
        what = f"{name} {variant} output {buffer} (inputs {[np.shape(a) for a in inputs]}, offset {offset})"
        if dtype.startswith("int"):
            np.testing.assert_array_equal(got, expected, err_msg=what)
        else:
            close(got, expected, TOL[dtype], what)
    return result



# ----------------------------------------------------------------------------
# Row kernels: rmsnorm, fused_residual_rmsnorm, softmax (and their backwards)
# ----------------------------------------------------------------------------

# last dims: 1, vector-aligned (64, 1024, 2048), ragged for bf16 (100) or both (33, 4099), and rows
# longer than the registers hold (20480: the overflow paths)
ROWS = [(1, 1), (3, 64), (5, 100), (2, 7, 33), (4, 4099), (6, 2048), (2, 3, 1024), (2, 20480)]
if GPU:
    ROWS += [(8, 1024, 2048), (4096, 4096)]


def rmsnorm_inputs(rng, shape):
    x = rng.standard_normal(shape)
    w = 1.0 + 0.1 * rng.standard_normal(shape[-1])
    return x, w


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("shape", ROWS, ids=ids(ROWS))
def test_rmsnorm(runner, shape, variant):
    rng = np.random.default_rng(1)
    x, w = rmsnorm_inputs(rng, shape)
    check(runner, "rmsnorm", [x, w], {"eps": 1e-5}, variant)
    if shape[-1] == 1:  # d_x = rstd * g * (1 - x^2 rstd^2) cancels to ~eps: no fp32 kernel keeps 1e-5 of it
        return
    dy = rng.standard_normal(shape)
    _, rstd = REFERENCES["rmsnorm"](rounded(x, variant), rounded(w, variant), eps=1e-5)
    check(runner, "rmsnorm_backward", [dy, x, w, rstd], {}, variant)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("shape", ROWS, ids=ids(ROWS))
def test_fused_residual_rmsnorm(runner, shape, variant):
    rng = np.random.default_rng(2)
    residual, w = rmsnorm_inputs(rng, shape)
    inp = rng.standard_normal(shape)
    check(runner, "fused_residual_rmsnorm", [residual, inp, w], {"eps": 1e-6}, variant)
    if shape[-1] == 1:  # see test_rmsnorm
        return
    r = rounded(residual, variant) + rounded(inp, variant)
    _, rstd = REFERENCES["rmsnorm"](rounded(r, variant), rounded(w, variant))
    dy, d_next = rng.standard_normal(shape), rng.standard_normal(shape)
    check(runner, "fused_residual_rmsnorm_backward", [dy, d_next, r, w, rstd], {}, variant)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("shape", ROWS, ids=ids(ROWS))
def test_softmax(runner, shape, variant):
    rng = np.random.default_rng(3)
    x = 3 * rng.standard_normal(shape)
    check(runner, "softmax", [x], {"dim": -1}, variant)
    out = REFERENCES["softmax"](rounded(x, variant))
    check(runner, "softmax_backward", [rng.standard_normal(shape), out], {"dim": -1}, variant)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name", ["rmsnorm", "rmsnorm_backward", "fused_residual_rmsnorm_backward", "softmax"])
def test_row_kernels_on_misaligned_buffers(runner, name, variant):
    rng = np.random.default_rng(4)
    shape = (5, 64)
    x, w = rmsnorm_inputs(rng, shape)
    rstd = REFERENCES["rmsnorm"](rounded(x, variant), rounded(w, variant))[1]
    inputs = {"rmsnorm": [x, w], "rmsnorm_backward": [rng.standard_normal(shape), x, w, rstd],
              "fused_residual_rmsnorm_backward": [rng.standard_normal(shape), rng.standard_normal(shape), x, w, rstd],
              "softmax": [x]}[name]
    check(runner, name, inputs, {}, variant, offset=MISALIGN[variant])


# ----------------------------------------------------------------------------
# Embedding
# ----------------------------------------------------------------------------

EMBEDDING = [((3,), 1), ((2, 5), 64), ((4,), 100), ((3, 7), 33), ((9,), 2048)]
if GPU:
    EMBEDDING += [((8, 1024), 2048)]


@pytest.mark.parametrize("index_dtype", ["int32", "int64"])
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("lead, dim", EMBEDDING, ids=ids(EMBEDDING))
def test_embedding(runner, lead, dim, variant, index_dtype):
    rng = np.random.default_rng(5)
    vocab = 50
    indices = rng.integers(-3, vocab, size=lead)  # a few negative: counted from the end, as numpy
    check(runner, "embedding", [indices, rng.standard_normal((vocab, dim))], {}, variant, index_dtype)
    few = rng.integers(0, 7, size=lead)  # repeated rows: the scatter-add collides
    check(runner, "embedding_backward", [rng.standard_normal(lead + (dim,)), few], {}, variant, index_dtype,
          ref_attrs={"shape": (vocab, dim)})


@pytest.mark.parametrize("variant", VARIANTS)
def test_an_accumulating_embedding_gradient_adds_into_what_d_weight_holds(runner, variant):
    """``accumulate``: no zeroing; the scatter-add lands on the output's old contents (every fp32
    starts as the bytes 0x3F3F3F3F here, about 0.747)."""
    rng = np.random.default_rng(8)
    d_out, indices = rng.standard_normal((3, 5, 40)), rng.integers(0, 7, size=(3, 5))
    want = REFERENCES["embedding_backward"](rounded(d_out, variant), indices, shape=(20, 40))
    result = run_plan(runner, "embedding_backward", [d_out, indices], [(20, 40)], {"accumulate": True}, variant,
                      poison=0x3F)
    start = np.frombuffer(bytes([0x3F] * 4), np.float32)[0]
    close(result.outputs["d_weight"], want + start, TOL["fp32"], f"accumulate {variant}")


# ----------------------------------------------------------------------------
# Cross-entropy
# ----------------------------------------------------------------------------

LOGITS = [(1, 7), (5, 1000), (7, 4096), (3, 32001), (4, 50000)]
if GPU:
    LOGITS += [(64, 151936), (256, 128256)]


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("shape", LOGITS, ids=ids(LOGITS))
def test_cross_entropy(runner, shape, variant, reduction):
    rng = np.random.default_rng(6)
    n, vocab = shape
    logits = 3 * rng.standard_normal(shape)
    labels = rng.integers(0, vocab, size=n)
    labels[rng.random(n) < 0.3] = -100
    if n > 1:
        labels[0] = -100
    index_dtype = "int64" if vocab % 2 else "int32"
    attrs = {"reduction": reduction, "ignore_index": -100}
    check(runner, "cross_entropy", [logits, labels], attrs, variant, index_dtype)
    _, lse = REFERENCES["cross_entropy"](rounded(logits, variant), labels, **attrs)
    d_loss = rng.standard_normal(n) if reduction == "none" else np.asarray(rng.standard_normal())
    check(runner, "cross_entropy_backward", [d_loss, logits, labels, lse], attrs, variant, index_dtype)


def test_cross_entropy_with_every_label_ignored(runner):
    """mean over no counted row is NaN (as PyTorch), and so are the gradients (the reference's 0 / 0);
    outputs start as 0 here, so a NaN was written."""
    rng = np.random.default_rng(7)
    logits, labels = rng.standard_normal((4, 100)), np.full(4, 3)
    attrs = {"reduction": "mean", "ignore_index": 3}
    result = check(runner, "cross_entropy", [logits, labels], attrs, "fp32", poison=0)
    assert np.isnan(result.outputs["loss"]).all()
    _, lse = REFERENCES["cross_entropy"](logits.astype(np.float32).astype(np.float64), labels, **attrs)
    back = check(runner, "cross_entropy_backward", [np.asarray(1.0), logits, labels, lse], attrs, "fp32", poison=0)
    assert np.isnan(back.outputs["d_logits"]).all()


@pytest.mark.parametrize("variant", VARIANTS)
def test_cross_entropy_on_misaligned_buffers(runner, variant):
    rng = np.random.default_rng(8)
    logits, labels = rng.standard_normal((5, 1000)), rng.integers(0, 1000, size=5)
    check(runner, "cross_entropy", [logits, labels], {}, variant, offset=MISALIGN[variant])
    _, lse = REFERENCES["cross_entropy"](rounded(logits, variant), labels)
    check(runner, "cross_entropy_backward", [np.asarray(0.5), logits, labels, lse], {}, variant,
          offset=MISALIGN[variant])


# ----------------------------------------------------------------------------
# Activations
# ----------------------------------------------------------------------------

ELEMENTS = [(1,), (7,), (8,), (3, 33), (1000, 17), (64, 1024), (5, 7, 11)]
if GPU:
    ELEMENTS += [(1024, 4096)]  # (the erf references are slow numpy loops: no larger)
GATED = ["swiglu", "geglu"]
UNARY = ["silu", "relu", "relu2", "gelu"]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("shape", ELEMENTS, ids=ids(ELEMENTS))
@pytest.mark.parametrize("name", GATED + UNARY)
def test_activations(runner, name, shape, variant):
    rng = np.random.default_rng(9)
    x = 2 * rng.standard_normal(shape)
    x.reshape(-1)[:1] = 0.0  # relu's gradient at 0
    d_out = rng.standard_normal(shape)
    for attrs in ({"approximate": True}, {"approximate": False}) if name == "gelu" else ({},):
        if name in GATED:
            up = rng.standard_normal(shape)
            check(runner, name, [x, up], attrs, variant)
            check(runner, f"{name}_backward", [d_out, x, up], attrs, variant)
        else:
            check(runner, name, [x], attrs, variant)
            check(runner, f"{name}_backward", [d_out, x], attrs, variant)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name", ["swiglu_backward", "gelu"])
def test_activations_on_misaligned_buffers(runner, name, variant):
    rng = np.random.default_rng(10)
    shape = (3, 64)
    inputs = [rng.standard_normal(shape) for _ in range(3 if name == "swiglu_backward" else 1)]
    check(runner, name, inputs, {}, variant, offset=MISALIGN[variant])


# ----------------------------------------------------------------------------
# RoPE and qk_norm
# ----------------------------------------------------------------------------

HEADS = [(1, 1, 1, 2), (2, 4, 7, 64), (1, 3, 5, 6), (2, 4, 9, 128), (1, 2, 3, 10), (1, 2, 5, 16)]
if GPU:
    HEADS += [(8, 16, 1024, 128)]


def rope_inputs(rng, shape):
    b, h, t, d = shape
    hk = h // 2 if h % 2 == 0 else h  # GQA where the heads allow
    angles = rng.uniform(-math.pi, math.pi, size=(t, d // 2))
    freqs = np.stack([np.cos(angles), np.sin(angles)], axis=-1)
    return rng.standard_normal(shape), rng.standard_normal((b, hk, t, d)), freqs


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("shape", HEADS, ids=ids(HEADS))
def test_rope(runner, shape, variant, interleaved):
    rng = np.random.default_rng(11)
    q, k, freqs = rope_inputs(rng, shape)
    check(runner, "rope", [q, k, freqs], {"interleaved": interleaved}, variant)
    check(runner, "rope_backward", [q, k, freqs], {"interleaved": interleaved}, variant)
    check(runner, "rope", [q, k, freqs], {"interleaved": interleaved}, variant, offset=MISALIGN[variant])


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("shape", HEADS, ids=ids(HEADS))
def test_rope_bthd(runner, shape, variant, interleaved):
    """layout = "bthd" (mdsl-fuse attention_layout): q and k as [B, T, H, D], the position on dim 1."""
    rng = np.random.default_rng(13)
    q, k, freqs = rope_inputs(rng, shape)
    q, k = (np.ascontiguousarray(np.swapaxes(x, 1, 2)) for x in (q, k))
    attrs = {"interleaved": interleaved, "layout": "bthd"}
    check(runner, "rope", [q, k, freqs], attrs, variant)
    check(runner, "rope_backward", [q, k, freqs], attrs, variant)
    check(runner, "rope", [q, k, freqs], attrs, variant, offset=MISALIGN[variant])


def row_tables(rng, b, t, d):
    """A RoPE table per row [B, T, D/2, 2] (packed rows: each row's tokens at positions of their own)."""
    angles = rng.uniform(-math.pi, math.pi, size=(b, t, d // 2))
    return np.stack([np.cos(angles), np.sin(angles)], axis=-1)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("shape", HEADS, ids=ids(HEADS))
def test_rope_with_a_table_per_row(runner, shape, variant, interleaved):
    """bthd rows index a table per row as (b T + t): the kernels take it with T = B T."""
    rng = np.random.default_rng(14)
    q, k, _ = rope_inputs(rng, shape)
    q, k = (np.ascontiguousarray(np.swapaxes(x, 1, 2)) for x in (q, k))
    freqs = row_tables(rng, shape[0], shape[2], shape[3])
    attrs = {"interleaved": interleaved, "layout": "bthd"}
    check(runner, "rope", [q, k, freqs], attrs, variant)
    check(runner, "rope_backward", [q, k, freqs], attrs, variant)
    check(runner, "rope", [q, k, freqs], attrs, variant, offset=MISALIGN[variant])


def test_a_table_per_row_in_bhtd_is_not_covered():
    with pytest.raises(cuda.NotCovered, match="per row in the bhtd layout"):
        cuda.plan("rope", [(2, 4, 8, 16), (2, 2, 8, 16), (2, 8, 8, 2)], [(2, 4, 8, 16), (2, 2, 8, 16)], {}, "fp32")


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("shape", HEADS, ids=ids(HEADS))
def test_qk_norm(runner, shape, variant):
    rng = np.random.default_rng(12)
    q, k, _ = rope_inputs(rng, shape)
    qw, kw = 1 + 0.1 * rng.standard_normal(shape[-1]), 1 + 0.1 * rng.standard_normal(shape[-1])
    check(runner, "qk_norm", [q, k, qw, kw], {"eps": 1e-6}, variant)
    _, _, q_rstd, k_rstd = REFERENCES["qk_norm"](*(rounded(a, variant) for a in (q, k, qw, kw)))
    d_q, d_k = rng.standard_normal(q.shape), rng.standard_normal(k.shape)
    check(runner, "qk_norm_backward", [d_q, d_k, q, k, qw, kw, q_rstd, k_rstd], {}, variant)


# ----------------------------------------------------------------------------
# Elementwise
# ----------------------------------------------------------------------------

BINARY = [((7,), (7,)), ((3, 33), (33,)), ((4, 5, 8), (5, 8)), ((4, 5, 8), (4, 5, 1)), ((4, 5, 8), (1,)),
          ((2, 3, 64), (2, 3, 1)), ((2, 3, 64), (64,)), ((1000, 17), (1000, 17)), ((2, 3, 4, 5), (3, 4, 1))]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("a_shape, b_shape", BINARY, ids=ids(BINARY))
@pytest.mark.parametrize("name", ["add", "mul"])
def test_add_mul(runner, name, a_shape, b_shape, variant):
    rng = np.random.default_rng(13)
    a, b = rng.standard_normal(a_shape), rng.standard_normal(b_shape)
    check(runner, name, [a, b], {}, variant)
    check(runner, name, [b, a], {}, variant)  # the broadcast operand first


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("shape", ELEMENTS, ids=ids(ELEMENTS))
def test_bias_add_scale_add3(runner, shape, variant):
    rng = np.random.default_rng(14)
    x = rng.standard_normal(shape)
    check(runner, "bias_add", [x, rng.standard_normal(shape[-1])], {}, variant)
    check(runner, "scale", [x], {"factor": 0.37}, variant)
    check(runner, "add3", [x, rng.standard_normal(shape), rng.standard_normal(shape)], {}, variant)
    check(runner, "add", [x, rng.standard_normal(shape)], {}, variant, offset=MISALIGN[variant])


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("a_shape, b_shape", BINARY, ids=ids(BINARY))
@pytest.mark.parametrize("name", ["sub", "div"])
def test_sub_div(runner, name, a_shape, b_shape, variant):
    """The second operand broadcast (the kernel does not swap operands that do not commute)."""
    rng = np.random.default_rng(16)
    a, b = rng.standard_normal(a_shape), rng.standard_normal(b_shape)
    b = np.where(np.abs(b) < 0.25, 0.25, b) if name == "div" else b  # no division by near-zero
    check(runner, name, [a, b], {}, variant)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("shape", ELEMENTS, ids=ids(ELEMENTS))
@pytest.mark.parametrize("name", ["exp", "log", "tanh", "sigmoid", "rsqrt", "add_scalar"])
def test_elementwise_math(runner, name, shape, variant):
    rng = np.random.default_rng(17)
    x = 3 * rng.standard_normal(shape)
    x = np.abs(x) + 0.1 if name in ("log", "rsqrt") else x
    check(runner, name, [x], {"value": 1e-3} if name == "add_scalar" else {}, variant)


CAUSAL_MASKS = [((2, 3, 5, 5), {}), ((2, 3, 7), {"offset": 4}), ((6, 4), {"offset": -2}),
                ((2, 5, 9), {"offset": 4, "window_size": 3}), ((3, 33, 257), {"offset": 224, "fill": "zero"})]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("shape, attrs", CAUSAL_MASKS, ids=[str(i) for i in range(len(CAUSAL_MASKS))])
def test_causal_mask(runner, shape, attrs, variant):
    """-inf (or 0) where the key is past the query + offset or out of the window, x elsewhere."""
    x = np.random.default_rng(18).standard_normal(shape)
    result = check(runner, "causal_mask", [x], {"offset": 0, **attrs}, variant)
    assert np.isneginf(result.outputs["out"]).any() == (attrs.get("fill", "neg_inf") == "neg_inf")


DROPOUTS = [((1,), {"p": 0.5}), ((7, 33), {"p": 0.1, "seed": 3}), ((4, 4099), {"p": 0.9, "seed": 2**32 - 1}),
            ((2, 3, 1024), {"p": 0.25, "seed": 11, "offset": 5, "layers": [2]}), ((5, 100), {"p": 0.0}),
            ((3, 700), {"p": 0.5, "seed": 1, "layers": [1, 0]})]
STEPS = (None, 0, 7, 2**40 + 5)  # the counter operand (None: none, read as 0), 64 bits wide


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("shape, attrs", DROPOUTS, ids=[str(i) for i in range(len(DROPOUTS))])
def test_dropout(runner, shape, attrs, training, variant):
    """The counter-based mask of the reference (the same elements dropped) for each step counter the
    kernel reads from device memory, kept elements scaled by 1 / (1 - p); x itself outside
    training; a misaligned buffer too (the kernel is scalar)."""
    x = np.random.default_rng(19).standard_normal(shape) + 4.0  # no element near zero: a drop shows
    masks = []
    for step in STEPS:
        counter = None if step is None else np.array([step], dtype=np.int64)
        result = check(runner, "dropout", [x, counter], {**attrs, "training": training}, variant)
        dropped = result.outputs["out"] == 0
        if x.size > 8 or not (training and attrs["p"] > 0):  # a few elements may all be kept
            assert dropped.any() == (training and attrs["p"] > 0)
        masks.append(dropped)
    if training and attrs["p"] > 0 and x.size > 64:
        assert (masks[0] == masks[1]).all() and not (masks[1] == masks[2]).all()  # none is step 0
        assert not (masks[2] == masks[3]).all()
    check(runner, "dropout", [x, np.array([3], dtype=np.int64)], {**attrs, "training": training}, variant,
          offset=MISALIGN[variant])


@pytest.mark.parametrize("variant", ["fp32", "bf16", "f32_bf16"])
@pytest.mark.parametrize("shape", ELEMENTS, ids=ids(ELEMENTS))
def test_add_inplace(runner, shape, variant):
    rng = np.random.default_rng(15)
    acc, x = rng.standard_normal(shape), rng.standard_normal(shape)
    prim = cuda.primitive("add_inplace")
    acc_dtype, x_dtype = prim.dtype("acc", variant), prim.dtype("x", variant)
    result = run_plan(runner, "add_inplace", [acc, x], [shape], {}, variant)
    close(result.outputs["acc"], rounded(rounded(acc, acc_dtype) + rounded(x, x_dtype), acc_dtype), TOL[acc_dtype],
          f"add_inplace {variant}")


# ----------------------------------------------------------------------------
# Reductions
# ----------------------------------------------------------------------------

REDUCE = [((5, 100), [-1]), ((5, 100), [0]), ((2, 7, 33), [1]), ((2, 7, 33), [0, 1]), ((4, 4099), [1]),
          ((3, 4, 5, 6), [1, 2]), ((6, 2048), [0]), ((1,), [0]), ((2, 3, 1024), [2])]


@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("shape, dims", REDUCE, ids=ids(REDUCE))
def test_reduce_sum_mean(runner, shape, dims, variant, keepdim):
    rng = np.random.default_rng(16)
    x = rng.standard_normal(shape)
    for name in ("reduce_sum", "reduce_mean"):
        check(runner, name, [x], {"dims": dims, "keepdim": keepdim}, variant)


@pytest.mark.parametrize("index_dtype", ["int32", "int64"])
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("shape, dims", [r for r in REDUCE if len(r[1]) == 1],
                         ids=ids([r for r in REDUCE if len(r[1]) == 1]))
def test_reduce_max(runner, shape, dims, variant, index_dtype):
    rng = np.random.default_rng(17)
    x = rng.integers(-4, 5, size=shape).astype(np.float64)  # many ties: the first index wins
    check(runner, "reduce_max", [x], {"dim": dims[0]}, variant, index_dtype)
    check(runner, "reduce_max", [rng.standard_normal(shape)], {"dim": dims[0], "keepdim": True}, variant, index_dtype)


@pytest.mark.parametrize("variant", VARIANTS)
def test_global_norm_and_clip_factor(runner, variant):
    rng = np.random.default_rng(18)
    grads = [rng.standard_normal(s) for s in [(7,), (33, 5), (1000, 17), (64, 64), (1,)]]
    result = check(runner, "global_norm", grads, {}, variant)
    check(runner, "global_norm", grads[:2], {}, variant, offset=MISALIGN[variant])
    norm = float(result.outputs["norm"])
    for value in (0.5 * norm, 2.0 * norm, 0.0):
        check(runner, "clip_factor", [np.asarray(value)], {"max_norm": norm}, "fp32")


# ----------------------------------------------------------------------------
# Casts
# ----------------------------------------------------------------------------

SPECIAL = np.array([0.0, -0.0, 1.0, -1.5, np.inf, -np.inf, np.nan, 1e-40, 65504.0, 70000.0, 3.0e38, 1.00390625,
                    1.01171875, 2.0 ** -24, 1e-8])


@pytest.mark.parametrize("shape", ELEMENTS, ids=ids(ELEMENTS))
@pytest.mark.parametrize("variant", cuda.CAST_VARIANTS)
def test_cast_rounds_as_numpy(runner, variant, shape):
    rng = np.random.default_rng(19)
    prim = cuda.primitive("cast")
    src, dst = storage(prim.dtype("x", variant)), storage(prim.dtype("out", variant))
    x = (100 * rng.standard_normal(shape)).reshape(-1)
    x[: min(x.size, SPECIAL.size)] = SPECIAL[: x.size]
    with np.errstate(over="ignore"):  # 70000 and 3e38 overflow fp16 to inf, as they should
        x = x.reshape(shape).astype(src)
        want = x.astype(dst)
    result = run_plan(runner, "cast", [x], [shape], {}, variant)
    np.testing.assert_array_equal(result.outputs["out"].view(np.uint8), want.view(np.uint8),
                                  err_msg=f"cast {variant} {shape}")


@pytest.mark.parametrize("shape", [(3, 256), (5, 300), (1, 1)], ids=ids([(3, 256), (5, 300), (1, 1)]))
@pytest.mark.parametrize("variant", cuda.DEQUANTIZE_VARIANTS)
def test_dequantize_is_the_reference_bit_for_bit(runner, variant, shape):
    """Every fp8 code (subnormals, the largest, infinities, NaN) times its row's scale: the
    reference's float32 product, stored as fp32 or rounded once to bf16 (a NaN is a NaN: a GPU's
    multiply returns its canonical one)."""
    prim = cuda.primitive("dequantize")
    codes, out = storage(prim.dtype("q", variant)), storage(prim.dtype("out", variant))
    rng = np.random.default_rng(23)
    q = rng.integers(0, 256, shape, dtype=np.uint8)
    q.reshape(-1)[: min(q.size, 256)] = np.arange(min(q.size, 256))
    q = q.view(codes)
    scale = np.exp(rng.standard_normal(shape[:-1])).astype(np.float32)
    want = REFERENCES["dequantize"](q, scale).astype(out)
    got = run_plan(runner, "dequantize", [q, scale], [shape], {}, variant).outputs["out"]
    nan = np.isnan(want.astype(np.float32))
    np.testing.assert_array_equal(np.isnan(got.astype(np.float32)), nan)
    np.testing.assert_array_equal(got[~nan].view(np.uint8), want[~nan].view(np.uint8),
                                  err_msg=f"dequantize {variant} {shape}")


# ----------------------------------------------------------------------------
# AdamW
# ----------------------------------------------------------------------------


def adamw_state(rng, shape):
    param = rng.standard_normal(shape).astype(np.float32)
    grad = (0.1 * rng.standard_normal(shape)).astype(np.float32)
    exp_avg = (0.01 * rng.standard_normal(shape)).astype(np.float32)
    exp_avg_sq = (1e-4 * rng.random(shape)).astype(np.float32)
    return param, grad, exp_avg, exp_avg_sq


def adamw_reference(param, grad, exp_avg, exp_avg_sq, lr, step, grad_scale, attrs):
    """The reference in fp32 (its own order of operations), on copies."""
    state = [a.astype(np.float32).copy() for a in (param, exp_avg, exp_avg_sq)]
    return REFERENCES["adamw"](state[0], grad.astype(np.float32), state[1], state[2], lr, step, grad_scale, **attrs)


@pytest.mark.parametrize("with_scale", [False, True])
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("shape", ELEMENTS, ids=ids(ELEMENTS))
def test_adamw(runner, shape, variant, with_scale):
    rng = np.random.default_rng(20)
    param, grad, exp_avg, exp_avg_sq = adamw_state(rng, shape)
    grad = rounded(grad, variant)  # the gradient the kernel reads
    lr, step = np.array([1e-3], np.float32), np.array([7], np.int64)
    grad_scale = np.array([0.25], np.float32) if with_scale else None
    attrs = {"beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1, "lr_scale": 2.0}
    result = run_plan(runner, "adamw", [param, grad, exp_avg, exp_avg_sq, lr, step, grad_scale],
                      [shape, shape, shape, shape], attrs, variant)
    want = adamw_reference(param, grad, exp_avg, exp_avg_sq, lr, step, grad_scale, attrs)
    for buffer, expected in zip(("param", "exp_avg", "exp_avg_sq"), want):
        close(result.outputs[buffer], expected, TOL["fp32"], f"adamw {variant} {buffer}")
    close(result.outputs["param_copy"], want[0].astype(ml_dtypes.bfloat16), TOL["bf16"], "adamw param_copy (bf16)")


@pytest.mark.parametrize("variant", VARIANTS)
def test_adamw_multi_updates_every_tensor_of_its_table(runner, variant):
    rng = np.random.default_rng(21)
    shapes = [(7,), (33, 5), (1000, 17), (1,)]
    settings = [(1.0, 0.1), (0.5, 0.0), (2.0, 0.01), (1.0, 0.1)]  # (lr_scale, weight_decay) per tensor
    grad_dtype = storage(variant)
    states = [adamw_state(rng, s) for s in shapes]
    buffers = []
    for param, grad, exp_avg, exp_avg_sq in states:
        buffers.append([runner.upload(param), runner.upload(grad.astype(grad_dtype)), runner.upload(exp_avg),
                        runner.upload(exp_avg_sq), runner.alloc(param.size * 2, 0xFF)])
    entries = [cuda.AdamWEntry(*(runner.address(b) for b in bufs[:4]), n=int(np.prod(shape)), lr_scale=ls,
                               weight_decay=wd, param_copy=runner.address(bufs[4]))
               for bufs, shape, (ls, wd) in zip(buffers, shapes, settings)]
    lr, step, scale = np.array([3e-4], np.float32), np.array([1], np.int64), np.array([0.5], np.float32)
    attrs = {"beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "sizes": [e.n for e in entries]}
    run_plan(runner, "adamw_multi", [lr, step, scale], [], attrs, variant,
             tables={"tensors": lambda addresses: cuda.adamw_table(entries)})
    for (param, grad, exp_avg, exp_avg_sq), bufs, shape, (ls, wd) in zip(states, buffers, shapes, settings):
        want = adamw_reference(param, rounded(grad, variant), exp_avg, exp_avg_sq, lr, step, scale,
                               {"beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": wd, "lr_scale": ls})
        for buffer, expected in zip([bufs[0], bufs[2], bufs[3]], want):
            close(runner.download(buffer, shape, np.dtype(np.float32)), expected, TOL["fp32"], f"adamw_multi {shape}")
        close(runner.download(bufs[4], shape, np.dtype(ml_dtypes.bfloat16)), want[0].astype(ml_dtypes.bfloat16),
              TOL["bf16"], f"adamw_multi param_copy {shape}")


def test_every_primitive_of_the_table_is_tested():
    """Each kernels/cuda.py primitive appears in a test of this file or of the kernel tests beside it
    (by name)."""
    here = os.path.dirname(os.path.abspath(__file__))
    text = ""
    for name in ("test_kernels.py", "test_attention.py", "test_fused_split_gated.py", "test_qk_norm_rope.py",
                 "test_moe_mamba_kernels.py"):
        with open(os.path.join(here, name)) as source:
            text += source.read()
    missing = [name for name in cuda.PRIMITIVES if f'"{name.removesuffix("_backward")}"' not in text]
    assert not missing, missing
