"""The numpy reference kernels (``kernels/reference.py``) against independent PyTorch implementations.

Every entry of ``REFERENCES`` is checked on random float64 inputs (fixed seeds, at least two
shapes, ragged sizes such as 7 rows or 33 channels) against ``torch.nn.functional`` or plain
torch ops in float64; every ``*_backward`` / ``*_weight_grad`` against ``torch.autograd`` on
the float64 torch forward, fed the statistics (rstd, mean, lse, out, ...) the reference
forward produced. Where the math is the same the tolerance is rtol 1e-9 / atol 1e-10.
``test_every_reference_is_covered`` fails when a reference has no test here.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from modeldsl.kernels.reference import REFERENCES, gemm, quantize

torch = pytest.importorskip("torch")
F = torch.nn.functional

RTOL, ATOL = 1e-9, 1e-10
COVERED: set[str] = set()


def covers(*names: str):
    """Mark a test as checking the references ``names`` (see test_every_reference_is_covered)."""
    COVERED.update(names)
    return lambda test: test


# ----------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------


def ref(name: str, *inputs, **params):
    return REFERENCES[name](*inputs, **params)


def randn(seed: int, *shapes: tuple[int, ...]) -> list[np.ndarray]:
    """One float64 standard-normal array per shape, from one seeded generator."""
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape) for shape in shapes]


def tt(a: np.ndarray | None, grad: bool = False):
    """A float64 (or integer) torch copy of ``a``; None stays None."""
    if a is None:
        return None
    a = np.asarray(a)
    if a.dtype.kind in "biu":
        return torch.from_numpy(a.astype(np.int64))
    return torch.tensor(a.astype(np.float64), requires_grad=grad)


def check(actual, expected, rtol: float = RTOL, atol: float = ATOL) -> None:
    """Same shape, float64 for float results, and close values."""
    if isinstance(expected, torch.Tensor):
        expected = expected.detach().numpy()
    expected, actual = np.asarray(expected), np.asarray(actual)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    if expected.dtype.kind == "f":
        assert actual.dtype == np.float64, actual.dtype
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol)


def check_all(actual: tuple, expected, rtol: float = RTOL, atol: float = ATOL) -> None:
    assert isinstance(actual, tuple) and len(actual) == len(expected), (type(actual), len(expected))
    for a, e in zip(actual, expected, strict=True):
        check(a, e, rtol, atol)


def vjp(fn, inputs: list[np.ndarray], upstream: list[np.ndarray | None], constants: tuple = ()) -> list:
    """Gradients of ``sum_i <fn(*inputs, *constants)[i], upstream[i]>`` w.r.t. ``inputs`` (torch autograd)."""
    leaves = [tt(a, grad=True) for a in inputs]
    outs = fn(*leaves, *constants)
    outs = outs if isinstance(outs, tuple) else (outs,)
    loss = sum((o * tt(g)).sum() for o, g in zip(outs, upstream, strict=True) if g is not None)
    return list(torch.autograd.grad(loss, leaves))


def mt(x, mode: str):
    """``x`` or its transpose over the last two dims (``mode`` N or T)."""
    return x.mT if mode == "T" else x


# ----------------------------------------------------------------------------
# 6.1 Linear algebra
# ----------------------------------------------------------------------------

MODES = ("NN", "NT", "TN", "TT")


def operand_shape(mode: str, rows: int, cols: int) -> tuple[int, int]:
    """The stored shape of an operand whose op() is [rows, cols]."""
    return (cols, rows) if mode == "T" else (rows, cols)


@covers("matmul")
@pytest.mark.parametrize("transpose", MODES)
@pytest.mark.parametrize("m, k, n", [(3, 4, 5), (7, 33, 1)])
@pytest.mark.parametrize("alpha", [1.0, -0.75])
def test_matmul(transpose, m, k, n, alpha):
    a, b = randn(1, operand_shape(transpose[0], m, k), operand_shape(transpose[1], k, n))
    expected = alpha * (mt(tt(a), transpose[0]) @ mt(tt(b), transpose[1]))
    check(ref("matmul", a, b, transpose=transpose, alpha=alpha), expected)


@covers("linear_bias_act")
@pytest.mark.parametrize("transpose", ["NN", "NT"])
@pytest.mark.parametrize("activation", ["none", "relu", "gelu"])
def test_linear_bias_act(transpose, activation):
    """torch's linear, bias and activation (tanh GELU); pre is the biased product."""
    x, w, bias = randn(5, (2, 3, 7), operand_shape(transpose[1], 7, 5), (5,))
    pre = 0.5 * (tt(x) @ mt(tt(w), transpose[1])) + tt(bias)
    act = {"none": lambda t: t, "relu": torch.relu,
           "gelu": lambda t: torch.nn.functional.gelu(t, approximate="tanh")}[activation]
    out, got_pre = ref("linear_bias_act", x, w, bias, transpose=transpose, activation=activation, alpha=0.5)
    check(out, act(pre))
    check(got_pre, pre)


@pytest.mark.parametrize("accumulate, beta", [(True, 0.0), (True, 1.0), (False, 0.5)])
def test_matmul_returns_the_product_only(accumulate, beta):
    """accumulate/beta add into the existing buffer in the executor; the reference returns alpha A B."""
    a, b = randn(2, (7, 5), (5, 3))
    check(ref("matmul", a, b, accumulate=accumulate, beta=beta, alpha=2.0), 2.0 * tt(a) @ tt(b))


@pytest.mark.parametrize("transpose", ["NN", "NT"])
@pytest.mark.parametrize("lead", [(2,), (2, 3)])
def test_matmul_leading_dims_of_a(transpose, lead):
    a, b = randn(3, (*lead, 7, 33), operand_shape(transpose[1], 33, 5))
    check(ref("matmul", a, b, transpose=transpose), tt(a) @ mt(tt(b), transpose[1]))


@pytest.mark.parametrize("lead", [(7,), (2, 5)])
def test_matmul_tn_contracts_shared_leading_dims(lead):
    """TN with A [*, K] and B [*, N]: dW = dY^T X summed over all tokens."""
    a, b = randn(4, (*lead, 6), (*lead, 33))
    check(ref("matmul", a, b, transpose="TN"), torch.einsum("...k,...n->kn", tt(a), tt(b)))


@covers("batched_matmul")
@pytest.mark.parametrize("transpose", MODES)
@pytest.mark.parametrize("batch, m, k, n", [((2,), 3, 4, 5), ((2, 3), 7, 33, 2)])
def test_batched_matmul(transpose, batch, m, k, n):
    a, b = randn(5, (*batch, *operand_shape(transpose[0], m, k)), (*batch, *operand_shape(transpose[1], k, n)))
    check(ref("batched_matmul", a, b, transpose=transpose), mt(tt(a), transpose[0]) @ mt(tt(b), transpose[1]))


@pytest.mark.parametrize("transpose", ["NN", "NT"])
def test_batched_matmul_alpha_scales_the_product(transpose):
    a, b = randn(8, (2, 3, 7, 5), (2, 3, *operand_shape(transpose[1], 5, 4)))
    check(ref("batched_matmul", a, b, transpose=transpose, alpha=0.125), 0.125 * (tt(a) @ mt(tt(b), transpose[1])))


@pytest.mark.parametrize("transpose", MODES)
def test_batched_matmul_broadcasts_a_matrix_b(transpose):
    a, b = randn(6, (3, *operand_shape(transpose[0], 7, 5)), operand_shape(transpose[1], 5, 4))
    check(ref("batched_matmul", a, b, transpose=transpose), mt(tt(a), transpose[0]) @ mt(tt(b), transpose[1]))


def torch_grouped_gemm(x, w, offsets, transpose="TN"):
    """Group g (tokens offsets[g]:offsets[g+1]) times W_g, torch-side: the first letter says W is
    [G, N, K] (T, F.linear) or [G, K, N] (N), the second that x is [K, tokens] (T); other rows 0."""
    x = x.T if transpose[1] == "T" else x
    parts, off = [], [int(o) for o in offsets]
    for g in range(w.shape[0]):
        rows = x[off[g] : off[g + 1]]
        parts.append(F.linear(rows, w[g]) if transpose[0] == "T" else rows @ w[g])
    n = w.shape[1] if transpose[0] == "T" else w.shape[2]
    tail = x.new_zeros((x.shape[0] - off[-1], n))
    return torch.cat([x.new_zeros((off[0], n)), *parts, tail])


# (tokens, K, N, offsets): an empty group, a first group not at row 0, rows after the last group
GROUPED_CASES = [(7, 5, 3, [0, 2, 2, 7]), (9, 33, 4, [1, 4, 8]), (6, 3, 2, [0, 6])]


def grouped_gemm_operands(seed, transpose, tokens, k, n, offsets):
    """input ([tokens, K], or [K, tokens] for a second letter T) and weights ([G, N, K] or [G, K, N])."""
    groups = len(offsets) - 1
    x_shape = (k, tokens) if transpose[1] == "T" else (tokens, k)
    w_shape = (groups, n, k) if transpose[0] == "T" else (groups, k, n)
    return randn(seed, x_shape, w_shape)


@covers("grouped_gemm")
@pytest.mark.parametrize("transpose", MODES)
@pytest.mark.parametrize("tokens, k, n, offsets", GROUPED_CASES)
def test_grouped_gemm(transpose, tokens, k, n, offsets):
    x, w = grouped_gemm_operands(7, transpose, tokens, k, n, offsets)
    off = np.asarray(offsets, dtype=np.int32)
    check(ref("grouped_gemm", x, w, off, transpose=transpose), torch_grouped_gemm(tt(x), tt(w), offsets, transpose))


def test_grouped_gemm_defaults_to_the_spec_mode_tn():
    """Spec 6.1.3: C_g[n_g, N] = A_g[n_g, K] @ B_g[K, N]^T with weights [num_groups, N, K] by default."""
    x, w = randn(9, (5, 4), (2, 3, 4))
    off = np.asarray([0, 2, 5], dtype=np.int32)
    expected = np.concatenate([x[:2] @ w[0].T, x[2:] @ w[1].T])
    np.testing.assert_allclose(ref("grouped_gemm", x, w, off), expected, rtol=1e-6)


@covers("grouped_gemm_weight_grad")
@pytest.mark.parametrize("tokens, k, n, offsets", GROUPED_CASES)
def test_grouped_gemm_weight_grad(tokens, k, n, offsets):
    x, w, d_out = randn(8, (tokens, k), (len(offsets) - 1, n, k), (tokens, n))
    (d_w,) = vjp(lambda w_: torch_grouped_gemm(tt(x), w_, offsets), [w], [d_out])
    check(ref("grouped_gemm_weight_grad", x, d_out, np.asarray(offsets, dtype=np.int32)), d_w)


# ----------------------------------------------------------------------------
# 6.2 Normalization
# ----------------------------------------------------------------------------

NORM_SHAPES = [(2, 3, 8), (7, 33)]


def torch_rmsnorm(x, w, eps):
    return F.rms_norm(x, (x.shape[-1],), w, eps)


def torch_rstd(x, eps):
    return torch.rsqrt(x.pow(2).mean(-1) + eps)


@covers("rmsnorm", "rmsnorm_backward")
@pytest.mark.parametrize("shape", NORM_SHAPES)
@pytest.mark.parametrize("eps", [1e-6, 0.5])
def test_rmsnorm(shape, eps):
    x, w, d_y = randn(10, shape, shape[-1:], shape)
    y, rstd = ref("rmsnorm", x, w, eps=eps)
    check_all((y, rstd), (torch_rmsnorm(tt(x), tt(w), eps), torch_rstd(tt(x), eps)))
    expected = vjp(lambda x_, w_: torch_rmsnorm(x_, w_, eps), [x, w], [d_y])
    check_all(ref("rmsnorm_backward", d_y, x, w, rstd), expected)


def torch_fused_residual_rmsnorm(residual, inp, w, eps):
    r = residual + inp
    return r, torch_rmsnorm(r, w, eps)


@covers("fused_residual_rmsnorm", "fused_residual_rmsnorm_backward")
@pytest.mark.parametrize("shape", NORM_SHAPES)
def test_fused_residual_rmsnorm(shape):
    eps = 1e-5
    res, inp, w, d_y, d_next = randn(11, shape, shape, shape[-1:], shape, shape)
    r_out, y, rstd = ref("fused_residual_rmsnorm", res, inp, w, eps=eps)
    r_expected, y_expected = torch_fused_residual_rmsnorm(tt(res), tt(inp), tt(w), eps)
    check_all((r_out, y, rstd), (r_expected, y_expected, torch_rstd(r_expected, eps)))
    # d_residual_next is the gradient reaching residual_out from further down the stream
    expected = vjp(lambda a, b, c: torch_fused_residual_rmsnorm(a, b, c, eps), [res, inp, w], [d_next, d_y])
    check_all(ref("fused_residual_rmsnorm_backward", d_y, d_next, r_out, w, rstd), expected)


@covers("layernorm", "layernorm_backward")
@pytest.mark.parametrize("shape", NORM_SHAPES)
@pytest.mark.parametrize("with_bias", [True, False])
def test_layernorm(shape, with_bias):
    eps = 1e-5
    x, w, b, d_y = randn(12, shape, shape[-1:], shape[-1:], shape)
    b = b if with_bias else None
    y, mean, rstd = ref("layernorm", x, w, b, eps=eps)
    tx = tt(x)
    expected_y = F.layer_norm(tx, (shape[-1],), tt(w), tt(b), eps)
    expected_rstd = torch.rsqrt(tx.var(-1, unbiased=False) + eps)
    check_all((y, mean, rstd), (expected_y, tx.mean(-1), expected_rstd))
    # d_bias is the gradient a bias would get (sum of d_y), also when the forward had none
    zero_bias = np.zeros(shape[-1:]) if b is None else b
    expected = vjp(lambda x_, w_, b_: F.layer_norm(x_, (shape[-1],), w_, b_, eps), [x, w, zero_bias], [d_y])
    check_all(ref("layernorm_backward", d_y, x, w, mean, rstd), expected)


# ----------------------------------------------------------------------------
# 6.3 Activations
# ----------------------------------------------------------------------------

ACT_SHAPES = [(2, 3, 8), (7, 33)]
UNARY = {  # case: (reference name, params, torch forward)
    "silu": ("silu", {}, F.silu),
    "relu": ("relu", {}, F.relu),
    "relu2": ("relu2", {}, lambda x: F.relu(x) ** 2),
    "gelu-tanh": ("gelu", {"approximate": True}, lambda x: F.gelu(x, approximate="tanh")),
    "gelu-erf": ("gelu", {"approximate": False}, lambda x: F.gelu(x, approximate="none")),
    "gelu-default": ("gelu", {}, lambda x: F.gelu(x, approximate="tanh")),  # spec default: approximate = true
}
GATED = {
    "swiglu": ("swiglu", {}, lambda g, u: F.silu(g) * u),
    "geglu": ("geglu", {}, lambda g, u: F.gelu(g, approximate="none") * u),  # spec 6.3.2: exact GELU
}


def activation_input(seed: int, shape) -> np.ndarray:
    """Normal values spread to +-12, with exact zeros (the relu kink: zero gradient there, as torch)."""
    (x,) = randn(seed, shape)
    x = 3.0 * x
    x.reshape(-1)[::5] = 0.0
    return x


@covers("silu", "silu_backward", "relu", "relu_backward", "relu2", "relu2_backward", "gelu", "gelu_backward")
@pytest.mark.parametrize("shape", ACT_SHAPES)
@pytest.mark.parametrize("case", sorted(UNARY))
def test_unary_activation(case, shape):
    name, params, fn = UNARY[case]
    x, (d_out,) = activation_input(20, shape), randn(21, shape)
    check(ref(name, x, **params), fn(tt(x)))
    (expected,) = vjp(fn, [x], [d_out])
    check(ref(f"{name}_backward", d_out, x, **params), expected)


@covers("swiglu", "swiglu_backward", "geglu", "geglu_backward")
@pytest.mark.parametrize("shape", ACT_SHAPES)
@pytest.mark.parametrize("case", sorted(GATED))
def test_gated_activation(case, shape):
    name, params, fn = GATED[case]
    gate, (up, d_out) = activation_input(22, shape), randn(23, shape, shape)
    check(ref(name, gate, up, **params), fn(tt(gate), tt(up)))
    check_all(ref(f"{name}_backward", d_out, gate, up, **params), vjp(fn, [gate, up], [d_out]))


@covers("fused_split_swiglu", "fused_split_swiglu_backward", "fused_split_geglu", "fused_split_geglu_backward")
@pytest.mark.parametrize("shape", ACT_SHAPES)
@pytest.mark.parametrize("case", sorted(GATED))
def test_fused_split_gated_activation(case, shape):
    """The packed forms against torch on the halves of gate_up, and bit for bit the unfused
    split -> gated -> (backward) -> concat composition in fp32."""
    name, _, fn = GATED[case]
    packed = (*shape[:-1], 2 * shape[-1])
    gate_up, (d_out,) = activation_input(25, packed), randn(26, shape)
    halves = lambda gu: fn(*torch.chunk(gu, 2, dim=-1))  # noqa: E731
    check(ref(f"fused_split_{name}", gate_up), halves(tt(gate_up)))
    (expected,) = vjp(halves, [gate_up], [d_out])
    check(ref(f"fused_split_{name}_backward", d_out, gate_up), expected)
    gate_up32, d_out32 = gate_up.astype(np.float32), d_out.astype(np.float32)
    gate, up = ref("split", gate_up32, sizes=[shape[-1]] * 2, dim=-1)
    assert np.array_equal(ref(f"fused_split_{name}", gate_up32), ref(name, gate, up))
    unfused = ref("concat", *ref(f"{name}_backward", d_out32, gate, up), dim=-1)
    fused = ref(f"fused_split_{name}_backward", d_out32, gate_up32)
    assert fused.dtype == np.float32 and np.array_equal(fused, unfused)


@covers("softmax", "softmax_backward")
@pytest.mark.parametrize("shape, dim", [((7, 33), -1), ((7, 33), 0), ((2, 3, 5), 1), ((2, 3, 5), -1), ((2, 3, 5), 0)])
def test_softmax(shape, dim):
    x, d_out = randn(24, shape, shape)
    x = 4.0 * x
    out = ref("softmax", x, dim=dim)
    check(out, torch.softmax(tt(x), dim))
    (expected,) = vjp(lambda x_: torch.softmax(x_, dim), [x], [d_out])
    check(ref("softmax_backward", d_out, out, dim=dim), expected)


def test_softmax_default_dim_is_last():
    (x,) = randn(25, (3, 4, 5))
    check(ref("softmax", x), torch.softmax(tt(x), -1))


# ----------------------------------------------------------------------------
# 6.4 Attention
# ----------------------------------------------------------------------------


def attention_mask(tq: int, tk: int, causal: bool, window_size: int | None):
    """[Tq, Tk] allowed keys; query i sits at position i + Tk - Tq (built with tril/triu bands).

    causal: key j <= the query position; a window w keeps the w most recent keys (HF Mistral:
    position - j < w), or without causal the keys within distance w - 1 on both sides (flash-attn).
    """
    ones, off = torch.ones(tq, tk, dtype=torch.bool), tk - tq
    mask = ones.tril(off) if causal else ones
    if window_size is not None:
        mask = mask & ones.triu(off - window_size + 1)
        if not causal:
            mask = mask & ones.tril(off + window_size - 1)
    return mask


def attention_bias(tq, tk, causal, window_size, slopes, hq):
    """Additive [Hq, Tq, Tk] bias: -slope_h |pos_i - j| (ALiBi, flash-attn) and -inf on masked keys."""
    bias = torch.zeros(hq, tq, tk, dtype=torch.float64)
    if slopes is not None:
        dist = (torch.arange(tq)[:, None] + tk - tq - torch.arange(tk)[None, :]).abs()
        bias = bias - slopes[:, None, None] * dist
    return bias.masked_fill(~attention_mask(tq, tk, causal, window_size), -math.inf)


def torch_attention(q, k, v, slopes=None, causal=True, softmax_scale=None, window_size=None, softcap=0.0):
    """Plain masked attention: (out, lse); GQA repeats each kv head for Hq // Hkv query heads (HF repeat_kv).
    ``softcap``: the scaled scores capped as HF Gemma 2's eager attention caps them, before the mask."""
    hq, tq, tk = q.shape[1], q.shape[2], k.shape[2]
    k, v = (t.repeat_interleave(hq // t.shape[1], dim=1) for t in (k, v))
    scale = 1.0 / math.sqrt(q.shape[-1]) if softmax_scale is None else softmax_scale
    s = scale * (q @ k.mT)
    if softcap:
        s = torch.tanh(s / softcap) * softcap
    s = s + attention_bias(tq, tk, causal, window_size, slopes, hq)
    return torch.softmax(s, -1) @ v, torch.logsumexp(s, -1)


# (B, Hq, Hkv, Tq, Tk, D, params)
ATTENTION_CASES = {
    "causal": (2, 2, 2, 7, 7, 8, {}),
    "causal-gqa": (1, 6, 2, 5, 5, 4, {"causal": True}),
    "noncausal-gqa": (2, 4, 1, 7, 7, 6, {"causal": False}),
    "decode-one-query": (1, 4, 2, 1, 9, 8, {}),
    "decode-chunk-noncausal": (1, 2, 2, 3, 8, 5, {"causal": False}),
    "scale": (1, 3, 3, 6, 6, 4, {"softmax_scale": 0.3}),
    "sliding-window": (1, 4, 2, 9, 9, 4, {"window_size": 3}),
    "sliding-window-decode": (1, 2, 1, 2, 9, 4, {"window_size": 4}),
    "window-noncausal": (1, 2, 2, 7, 7, 4, {"causal": False, "window_size": 2}),
    "window-one": (1, 2, 2, 5, 5, 4, {"window_size": 1}),
}
# attention-logit softcapping (Gemma 2), with caps small enough to bend the scores of randn inputs
SOFTCAP_CASES = {
    "softcap-causal-gqa": (1, 6, 2, 5, 5, 4, {"softcap": 0.7}),
    "softcap-window-scale": (2, 4, 2, 9, 9, 8, {"softcap": 1.5, "window_size": 3, "softmax_scale": 0.6}),
    "softcap-noncausal-decode": (1, 2, 1, 3, 8, 4, {"softcap": 0.5, "causal": False}),
}
ALIBI_CASES = {
    "alibi-causal": (1, 4, 2, 7, 7, 4, {}),
    "alibi-noncausal-decode": (2, 2, 2, 3, 6, 4, {"causal": False}),
    "alibi-window-scale": (1, 2, 1, 7, 7, 8, {"window_size": 3, "softmax_scale": 0.5}),
}


def attention_inputs(seed, b, hq, hkv, tq, tk, d):
    return randn(seed, (b, hq, tq, d), (b, hkv, tk, d), (b, hkv, tk, d), (b, hq, tq, d))


@covers("flash_attention", "flash_attention_backward")
@pytest.mark.parametrize("case", sorted(ATTENTION_CASES) + sorted(SOFTCAP_CASES))
def test_flash_attention(case):
    b, hq, hkv, tq, tk, d, params = {**ATTENTION_CASES, **SOFTCAP_CASES}[case]
    q, k, v, d_out = attention_inputs(30, b, hq, hkv, tq, tk, d)
    out, lse = ref("flash_attention", q, k, v, **params)
    check_all((out, lse), torch_attention(tt(q), tt(k), tt(v), **params))
    expected = vjp(lambda *t: torch_attention(*t, **params)[0], [q, k, v], [d_out])
    check_all(ref("flash_attention_backward", d_out, q, k, v, out, lse, **params), expected)


@pytest.mark.parametrize("case", sorted(ALIBI_CASES))
def test_flash_attention_alibi(case):
    """Forward and backward with ALiBi slopes against torch autograd (the slopes get no gradient)."""
    b, hq, hkv, tq, tk, d, params = ALIBI_CASES[case]
    q, k, v, d_out = attention_inputs(31, b, hq, hkv, tq, tk, d)
    slopes = 2.0 ** -np.arange(1, hq + 1, dtype=np.float64)
    out, lse = ref("flash_attention", q, k, v, slopes, **params)
    check_all((out, lse), torch_attention(tt(q), tt(k), tt(v), tt(slopes), **params))
    expected = vjp(lambda *t: torch_attention(*t, tt(slopes), **params)[0], [q, k, v], [d_out])
    check_all(ref("flash_attention_backward", d_out, q, k, v, out, lse, slopes, **params), expected)


@covers("kv_cache_attention")
@pytest.mark.parametrize("case", ["causal-gqa", "sliding-window", "scale", "softcap-causal-gqa",
                                  "softcap-window-scale"])
def test_kv_cache_attention_feeds_a_cache_step_by_step(case):
    """A prompt then one-token steps through a cache of spare capacity: each step's out and lse are
    torch attention of its queries over every key so far, and the cache holds the keys and values."""
    b, hq, hkv, t, _, d, params = {**ATTENTION_CASES, **SOFTCAP_CASES}[case]
    q, k, v, _ = attention_inputs(33, b, hq, hkv, t, t, d)
    k_cache, v_cache = np.zeros((b, hkv, t + 3, d)), np.zeros((b, hkv, t + 3, d))
    for start, end in [(0, t - 2), (t - 2, t - 1), (t - 1, t)]:
        piece = (slice(None), slice(None), slice(start, end))
        out, lse, kc, vc = ref("kv_cache_attention", q[piece], k[piece], v[piece], k_cache, v_cache,
                               np.array([start], dtype=np.int32), **params)
        assert kc is k_cache and vc is v_cache
        check_all((out, lse), torch_attention(tt(q[piece]), tt(k[:, :, :end]), tt(v[:, :, :end]), **params))
    check(k_cache[:, :, :t], tt(k))
    check(v_cache[:, :, :t], tt(v))
    with pytest.raises(ValueError, match="capacity"):
        ref("kv_cache_attention", q, k, v, k_cache, v_cache, np.array([4], dtype=np.int32), **params)


@pytest.mark.parametrize("case", sorted(ATTENTION_CASES) + sorted(ALIBI_CASES))
def test_flash_attention_out_matches_sdpa(case):
    """A second, independent check of out: torch's scaled_dot_product_attention with the same mask."""
    b, hq, hkv, tq, tk, d, params = {**ATTENTION_CASES, **ALIBI_CASES}[case]
    q, k, v, _ = attention_inputs(32, b, hq, hkv, tq, tk, d)
    slopes = 2.0 ** -np.arange(1, hq + 1, dtype=np.float64) if case.startswith("alibi") else None
    bias = attention_bias(tq, tk, params.get("causal", True), params.get("window_size"), tt(slopes), hq)
    expected = F.scaled_dot_product_attention(tt(q), tt(k), tt(v), attn_mask=bias, scale=params.get("softmax_scale"),
                                              enable_gqa=True)
    check(ref("flash_attention", q, k, v, slopes, **params)[0], expected)


def rope_freqs(seed: int, t: int, d: int) -> tuple[np.ndarray, np.ndarray]:
    """freqs [T, D/2, 2] = (cos, sin) of random angles, and the angles."""
    angles = np.random.default_rng(seed).uniform(-math.pi, math.pi, (t, d // 2))
    return np.stack([np.cos(angles), np.sin(angles)], axis=-1), angles


def rope_half_split_hf(q, k, angles):
    """HuggingFace Llama apply_rotary_pos_emb (rotate_half; cos/sin repeated over the two halves)."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    emb = torch.cat([angles, angles], dim=-1)[None]  # [1, T, D]
    return apply_rotary_pos_emb(q, k, emb.cos(), emb.sin(), unsqueeze_dim=1)


def rope_interleaved_complex(q, k, angles):
    """GPT-J / Meta Llama: (x[2i], x[2i+1]) as a complex number times e^{i theta}."""
    rotation = torch.polar(torch.ones_like(angles), angles)

    def rotate(x):
        pairs = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(pairs * rotation).flatten(-2)

    return rotate(q), rotate(k)


@covers("rope", "rope_backward")
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("b, hq, hkv, t, d", [(2, 4, 2, 7, 8), (1, 3, 1, 5, 6)])
def test_rope(interleaved, b, hq, hkv, t, d):
    q, k, d_q, d_k = randn(40, (b, hq, t, d), (b, hkv, t, d), (b, hq, t, d), (b, hkv, t, d))
    freqs, angles = rope_freqs(41, t, d)
    torch_rope = rope_interleaved_complex if interleaved else rope_half_split_hf
    expected = torch_rope(tt(q), tt(k), tt(angles))
    check_all(ref("rope", q, k, freqs, interleaved=interleaved), expected)
    grads = vjp(lambda q_, k_: torch_rope(q_, k_, tt(angles)), [q, k], [d_q, d_k])
    check_all(ref("rope_backward", d_q, d_k, freqs, interleaved=interleaved), grads)


def test_rope_default_is_half_split():
    q, k = randn(42, (1, 2, 3, 4), (1, 2, 3, 4))
    freqs, angles = rope_freqs(43, 3, 4)
    check_all(ref("rope", q, k, freqs), rope_half_split_hf(tt(q), tt(k), tt(angles)))


@covers("qk_norm", "qk_norm_backward")
@pytest.mark.parametrize("b, hq, hkv, t, d", [(2, 4, 2, 7, 8), (1, 3, 1, 5, 33)])
def test_qk_norm(b, hq, hkv, t, d):
    eps = 1e-6
    q, k, qw, kw, d_qn, d_kn = randn(44, (b, hq, t, d), (b, hkv, t, d), (d,), (d,), (b, hq, t, d), (b, hkv, t, d))
    q_norm, k_norm, q_rstd, k_rstd = ref("qk_norm", q, k, qw, kw, eps=eps)
    tq, tk = tt(q), tt(k)
    expected = (torch_rmsnorm(tq, tt(qw), eps), torch_rmsnorm(tk, tt(kw), eps),
                torch_rstd(tq, eps), torch_rstd(tk, eps))
    check_all((q_norm, k_norm, q_rstd, k_rstd), expected)

    def fn(q_, k_, qw_, kw_):
        return torch_rmsnorm(q_, qw_, eps), torch_rmsnorm(k_, kw_, eps)

    d_q, d_k, d_qw, d_kw = vjp(fn, [q, k, qw, kw], [d_qn, d_kn])
    check_all(ref("qk_norm_backward", d_qn, d_kn, q, k, qw, kw, q_rstd, k_rstd), (d_q, d_k, d_qw, d_kw))



@covers("fused_qk_norm_rope", "fused_qk_norm_rope_backward")
@pytest.mark.parametrize("layout", ["bhtd", "bthd"])
@pytest.mark.parametrize("interleaved", [False, True])
def test_fused_qk_norm_rope(layout, interleaved):
    """Bitwise the unfused qk_norm + rope pair in fp32 (same arithmetic), and PyTorch's RMSNorm + rope."""
    b, hq, hkv, t, d = 2, 4, 2, 5, 8
    q_shape, k_shape = ((b, t, hq, d), (b, t, hkv, d)) if layout == "bthd" else ((b, hq, t, d), (b, hkv, t, d))
    inputs = randn(45, q_shape, k_shape, (d,), (d,), q_shape, k_shape)
    freqs, angles = rope_freqs(46, t, d)
    params = {"interleaved": interleaved, "layout": layout}
    check_same_as_unfused_fp32(*(a.astype(np.float32) for a in (*inputs, freqs)), params)
    q, k, qw, kw, d_qr, d_kr = inputs
    fused = ref("fused_qk_norm_rope", q, k, qw, kw, freqs, eps=1e-6, **params)
    heads_first = (lambda x: x.transpose(1, 2)) if layout == "bthd" else (lambda x: x)
    torch_rope = rope_interleaved_complex if interleaved else rope_half_split_hf

    def fn(q_, k_, qw_, kw_):
        rotated = torch_rope(torch_rmsnorm(heads_first(q_), qw_, 1e-6), torch_rmsnorm(heads_first(k_), kw_, 1e-6),
                             tt(angles))
        return tuple(heads_first(x) for x in rotated)

    check_all(fused[:2], fn(tt(q), tt(k), tt(qw), tt(kw)))
    grads = ref("fused_qk_norm_rope_backward", d_qr, d_kr, q, k, qw, kw, fused[2], fused[3], freqs, **params)
    check_all(grads, vjp(fn, [q, k, qw, kw], [d_qr, d_kr]))


def check_same_as_unfused_fp32(q, k, qw, kw, d_qr, d_kr, freqs, params):
    """fused_qk_norm_rope and its backward bitwise the qk_norm/rope references composed."""
    fused = ref("fused_qk_norm_rope", q, k, qw, kw, freqs, eps=1e-6, **params)
    q_norm, k_norm, q_rstd, k_rstd = ref("qk_norm", q, k, qw, kw, eps=1e-6)
    for got, want in zip(fused, (*ref("rope", q_norm, k_norm, freqs, **params), q_rstd, k_rstd)):
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got, want)
    d_q_norm, d_k_norm = ref("rope_backward", d_qr, d_kr, freqs, **params)
    unfused = ref("qk_norm_backward", d_q_norm, d_k_norm, q, k, qw, kw, q_rstd, k_rstd)
    fused_grads = ref("fused_qk_norm_rope_backward", d_qr, d_kr, q, k, qw, kw, q_rstd, k_rstd, freqs, **params)
    for got, want in zip(fused_grads, unfused):
        np.testing.assert_array_equal(got, want)

# ----------------------------------------------------------------------------
# 6.5 Tensor manipulation
# ----------------------------------------------------------------------------


@covers("split")
@pytest.mark.parametrize("shape, sizes, dim",
                         [((2, 33), [3, 7, 23], -1), ((7, 4), [2, 5], 0), ((2, 9, 3), [4, 4, 1], 1)])
def test_split(shape, sizes, dim):
    (x,) = randn(50, shape)
    parts = ref("split", x, sizes=sizes, dim=dim)
    check_all(parts, torch.split(tt(x), sizes, dim))
    assert not any(np.shares_memory(p, x) for p in parts)


@covers("concat")
@pytest.mark.parametrize("shapes, dim",
                         [([(2, 3), (2, 30)], -1), ([(1, 4), (7, 4), (2, 4)], 0), ([(2, 1, 3), (2, 5, 3)], 1)])
def test_concat(shapes, dim):
    xs = randn(51, *shapes)
    check(ref("concat", *xs, dim=dim), torch.cat([tt(x) for x in xs], dim))


@covers("view")
@pytest.mark.parametrize("shape, new", [((2, 3, 8), (6, 8)), ((7, 33), (33, -1)), ((2, 3, 4), (2, 3, 2, 2))])
def test_view(shape, new):
    (x,) = randn(52, shape)
    out = ref("view", x, shape=new)
    check(out, tt(x).view(new))
    assert not np.shares_memory(out, x)


@covers("transpose")
@pytest.mark.parametrize("shape, dim0, dim1", [((2, 7, 3, 5), 1, 2), ((7, 33), 0, 1), ((2, 3, 4), -1, 0)])
def test_transpose(shape, dim0, dim1):
    (x,) = randn(53, shape)
    out = ref("transpose", x, dim0=dim0, dim1=dim1)
    check(out, tt(x).transpose(dim0, dim1))
    assert out.flags.c_contiguous


@covers("permute")
@pytest.mark.parametrize("shape, dims", [((2, 7, 3, 5), [0, 2, 1, 3]), ((2, 5, 7), [0, 2, 1]), ((3, 4, 5), [2, 0, 1])])
def test_permute(shape, dims):
    (x,) = randn(54, shape)
    out = ref("permute", x, dims=dims)
    check(out, tt(x).permute(dims))
    assert out.flags.c_contiguous


@covers("contiguous")
@pytest.mark.parametrize("shape", [(7, 33), (2, 3, 5)])
def test_contiguous(shape):
    (x,) = randn(55, shape)
    strided = np.swapaxes(x, 0, -1)
    out = ref("contiguous", strided)
    check(out, tt(x).transpose(0, -1).contiguous())
    assert out.flags.c_contiguous and not np.shares_memory(out, x)


# ----------------------------------------------------------------------------
# 6.6 Elementwise, 6.7 reductions
# ----------------------------------------------------------------------------

BROADCASTS = [((7, 33), (7, 33)), ((2, 3, 4), (4,)), ((2, 1, 4), (3, 1)), ((1,), (2, 5))]


@covers("add", "mul")
@pytest.mark.parametrize("name, fn", [("add", torch.add), ("mul", torch.mul)])
@pytest.mark.parametrize("a_shape, b_shape", BROADCASTS)
def test_binary_broadcast(name, fn, a_shape, b_shape):
    a, b = randn(60, a_shape, b_shape)
    check(ref(name, a, b), fn(tt(a), tt(b)))


@covers("add_backward", "mul_backward")
@pytest.mark.parametrize("name, fn", [("add", torch.add), ("mul", torch.mul)])
@pytest.mark.parametrize("a_shape, b_shape", [*BROADCASTS, ((3, 4), ())])
def test_binary_backward_sums_over_broadcast_dims(name, fn, a_shape, b_shape):
    """torch autograd of a + b and a * b: each gradient summed back to its operand's shape."""
    a, b = randn(63, a_shape, b_shape)
    (d_out,) = randn(64, np.broadcast_shapes(a_shape, b_shape))
    expected = vjp(fn, [a, b], [d_out])
    if name == "add":
        got = ref("add_backward", d_out, shapes=(a_shape, b_shape))
    else:
        got = ref("mul_backward", d_out, a, b)
    check_all(got, expected)


@covers("bias_add")
@pytest.mark.parametrize("shape", [(7, 33), (2, 3, 5)])
def test_bias_add(shape):
    x, bias = randn(61, shape, shape[-1:])
    check(ref("bias_add", x, bias), tt(x) + tt(bias))


@covers("scale")
@pytest.mark.parametrize("shape, factor", [((7, 33), -0.37), ((2, 3, 5), 8.0), ((4,), 0.0)])
def test_scale(shape, factor):
    (x,) = randn(62, shape)
    check(ref("scale", x, factor=factor), torch.mul(tt(x), factor))


@covers("sub", "div")
@pytest.mark.parametrize("name, fn", [("sub", torch.sub), ("div", torch.div)])
@pytest.mark.parametrize("a_shape, b_shape", [*BROADCASTS, ((2, 3, 8), (2, 3, 1))])
def test_sub_div_broadcast(name, fn, a_shape, b_shape):
    a, b = randn(65, a_shape, b_shape)
    check(ref(name, a, b), fn(tt(a), tt(b)))


@covers("add_scalar")
@pytest.mark.parametrize("shape, value", [((7, 33), 1e-6), ((2, 3, 5), -2.5)])
def test_add_scalar(shape, value):
    (x,) = randn(66, shape)
    check(ref("add_scalar", x, value=value), torch.add(tt(x), value))


@pytest.mark.parametrize("a_shape, b_shape, c_shape, want", [
    ((2, 3, 5, 4), (2, 3, 5, 6), (2, 3, 4, 6), lambda a, b: a.transpose(-1, -2) @ b),  # batched: d_v = p^T d_o
    ((2, 5, 4), (2, 5, 6), (4, 6), lambda a, b: a.reshape(-1, 4).T @ b.reshape(-1, 6)),  # dW = dY^T X over rows
])
def test_sched_gemm_tn_is_batched_when_c_has_leading_dims(a_shape, b_shape, c_shape, want):
    """The schedule's gemm (both CPU executors): a TN product into a batched C transposes each
    matrix; into a matrix C it contracts the stacked rows."""
    a, b = randn(69, a_shape, b_shape)
    c = np.zeros(c_shape)
    gemm(a, b, c, transpose="TN", alpha=0.5)
    check(c, 0.5 * want(tt(a), tt(b)))


def torch_causal_mask(x: np.ndarray, offset: int, window_size: int | None, fill: float) -> torch.Tensor:
    """PyTorch's written-out mask: keys past ``query + offset`` (and, with a window, keys
    ``window_size`` or more behind it) filled."""
    tq, tk = x.shape[-2:]
    masked = torch.ones(tq, tk).triu(offset + 1).bool()
    if window_size is not None:
        masked |= torch.ones(tq, tk).tril(offset - window_size).bool()
    return tt(x).masked_fill(masked, fill)


@covers("causal_mask")
@pytest.mark.parametrize("shape, offset, window_size", [
    ((2, 3, 5, 5), 0, None), ((2, 3, 7), 4, None), ((6, 4), -2, None), ((2, 5, 9), 4, 3), ((5, 5), 0, 1),
])
@pytest.mark.parametrize("fill", ["neg_inf", "zero"])
def test_causal_mask(shape, offset, window_size, fill):
    (x,) = randn(68, shape)
    expected = torch_causal_mask(x, offset, window_size, float("-inf") if fill == "neg_inf" else 0.0)
    check(ref("causal_mask", x, offset=offset, window_size=window_size, fill=fill), expected)


def test_causal_mask_keeps_float32():
    out = ref("causal_mask", np.ones((3, 3), dtype=np.float32))
    assert out.dtype == np.float32 and np.isneginf(out[0, 1]) and out[1, 0] == 1.0


def torch_mix32(x: torch.Tensor) -> torch.Tensor:
    """The low-bias 32-bit finalizer in int64 arithmetic, masked to 32 bits after each step."""
    m = 0xFFFFFFFF
    x = x & m
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & m
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & m
    return x ^ (x >> 16)


def torch_fold(h: torch.Tensor, value: int) -> torch.Tensor:
    return torch_mix32(h ^ torch_mix32(torch.tensor(value & 0xFFFFFFFF) ^ 0x9E3779B9))


def torch_dropout(x: np.ndarray, p: float, seed: int, offset: int, layers=(), step: int = 0) -> torch.Tensor:
    """The counter-based dropout written again in PyTorch: key = mix32(seed ^ mix32(offset ^ 0x9E3779B9)),
    folded (fold(h, v) = mix32(h ^ mix32(v ^ 0x9E3779B9))) with each layer, then the step's low and
    high halves; element e kept where the top 24 bits of mix32(e ^ key) reach ceil(p 2^24), kept
    ones times 1 / (1 - p)."""
    key = torch_mix32(torch.tensor(seed) ^ torch_mix32(torch.tensor(offset) ^ 0x9E3779B9))
    for layer in layers:
        key = torch_fold(key, layer)
    key = torch_fold(torch_fold(key, step & 0xFFFFFFFF), step >> 32)
    index = torch.arange(x.size, dtype=torch.int64)
    draws = torch_mix32(index ^ key) >> 8
    keep = (draws >= math.ceil(p * 2**24)).reshape(x.shape)
    return torch.where(keep, tt(x) * (1.0 / (1.0 - p)), torch.zeros((), dtype=torch.float64))


def counter(step: int) -> np.ndarray:
    return np.array([step], dtype=np.int64)


DROPOUTS = [((5,), 0.5, 0, 0, (), 0), ((4, 33), 0.1, 7, 0, (3,), 1), ((2, 3, 64), 0.9, 2**32 - 1, 3, (), 2**33 + 9),
            ((8, 8), 0.25, 5, 2**32 - 1, (1, 2), 12)]


@covers("dropout")
@pytest.mark.parametrize("shape, p, seed, offset, layers, step", DROPOUTS)
def test_dropout_draws_the_counter_hash_mask(shape, p, seed, offset, layers, step):
    (x,) = randn(69, shape)
    got = ref("dropout", x, counter(step), p=p, seed=seed, offset=offset, training=True, layers=layers)
    np.testing.assert_array_equal(got, torch_dropout(x, p, seed, offset, layers, step).numpy())


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_dropout_keeps_1_minus_p_and_scales_exactly(p):
    """Over 2^18 elements the keep rate is 1 - p within 5 standard deviations; a kept element is
    exactly x / (1 - p) (x * the fp64 scale), so the mean is kept in expectation."""
    n = 1 << 18
    x = 1.0 + np.random.default_rng(70).random(n)  # in [1, 2): no element is 0
    got = ref("dropout", x, p=p, seed=11, training=True)
    kept = got != 0
    assert abs(kept.mean() - (1 - p)) < 5 * math.sqrt(p * (1 - p) / n)
    np.testing.assert_array_equal(got[kept], x[kept] * (1.0 / (1.0 - p)))
    assert abs(got.mean() - x.mean()) < 5 * x.std() * math.sqrt(p / ((1 - p) * n)) + 0.01


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5, 0.8])
def test_dropout_statistics_match_torch(p):
    """Against torch.nn.functional.dropout (its own generator) on the same 2^20 elements: both keep
    1 - p of them within 5 standard deviations of it (so of each other), over every step and layer
    drawn; both scale a kept element to x / (1 - p) (torch in float32 rounding) and drop to 0; the
    second moments of the outputs, E[y^2] = E[x^2] / (1 - p), agree within 5 of their standard errors."""
    n = 1 << 20
    x = 1.0 + np.random.default_rng(72).random(n)
    torch.manual_seed(0)
    theirs = torch.nn.functional.dropout(tt(x), p=p, training=True).numpy()
    sigma = math.sqrt(p * (1 - p) / n)
    for layers, step in (((), 0), ((), 1), ((3,), 1), ((0, 5), 2**32 + 1)):
        ours = ref("dropout", x, counter(step), p=p, seed=1, training=True, layers=layers)
        for y in (ours, theirs):
            assert abs((y != 0).mean() - (1 - p)) < 5 * sigma
            np.testing.assert_allclose(y[y != 0], x[y != 0] / (1 - p), rtol=1e-12)
        second = [float(np.mean(y * y)) for y in (ours, theirs)]
        spread = float(np.std(ours * ours)) / math.sqrt(n)
        assert abs(second[0] - second[1]) < 5 * math.sqrt(2) * spread
        assert abs(second[0] - np.mean(x * x) / (1 - p)) < 5 * spread


def test_dropout_steps_and_layers_draw_independent_masks():
    """Masks of other steps (the counter) and other layers keep each element independently: any two
    agree on p^2 + (1 - p)^2 of the elements, within 5 standard deviations; the same step and layer
    give the same mask, whatever else runs."""
    p, n = 0.5, 1 << 16
    x = 1.0 + np.random.default_rng(73).random(n)
    masks = {(layers, step): ref("dropout", x, counter(step), p=p, seed=4, training=True, layers=layers) != 0
             for layers in ((), (0,), (1,), (0, 1), (1, 0)) for step in (0, 1, 2, 2**32)}
    agree = p * p + (1 - p) ** 2
    keys = sorted(masks)
    for i, a in enumerate(keys):
        for b in keys[i + 1:]:
            assert abs((masks[a] == masks[b]).mean() - agree) < 5 * math.sqrt(agree * (1 - agree) / n), (a, b)
    np.testing.assert_array_equal(masks[(1,), 2], ref("dropout", x, counter(2), p=p, seed=4, training=True,
                                                       layers=(1,)) != 0)
    np.testing.assert_array_equal(masks[(), 0], ref("dropout", x, p=p, seed=4, training=True) != 0)  # no counter: 0


def test_dropout_masks_differ_by_seed_and_offset_and_the_identity_otherwise():
    (x,) = randn(71, (64, 64))
    base = ref("dropout", x, p=0.5, seed=1, training=True) != 0
    for other in ({"seed": 2}, {"seed": 1, "offset": 1}):
        mask = ref("dropout", x, p=0.5, training=True, **other) != 0
        assert 0.4 < (mask != base).mean() < 0.6  # independent draws disagree on about half
    for identity in ({"p": 0.0, "training": True}, {"p": 0.5, "training": False}):
        np.testing.assert_array_equal(ref("dropout", x, **identity), x)
    out = ref("dropout", x.astype(np.float32), p=0.5, training=True)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out[out != 0], x.astype(np.float32)[out != 0] * np.float32(2.0))


MATH = {"exp": torch.exp, "log": torch.log, "tanh": torch.tanh, "sigmoid": torch.sigmoid, "rsqrt": torch.rsqrt}
POSITIVE = ("log", "rsqrt")  # their domain


@covers(*MATH)
@pytest.mark.parametrize("shape", [(7, 33), (2, 3, 5)])
@pytest.mark.parametrize("name", sorted(MATH))
def test_elementwise_math(name, shape):
    """Against torch over +-12 (sigmoid's both tails), log and rsqrt over positive values."""
    x = activation_input(67, shape)
    x = np.abs(x) + 0.1 if name in POSITIVE else x
    check(ref(name, x), MATH[name](tt(x)))


def test_elementwise_math_keeps_float32():
    x = np.linspace(-30, 30, 13, dtype=np.float32)
    for name in MATH:
        assert ref(name, np.abs(x) + 1 if name in POSITIVE else x).dtype == np.float32, name
    assert ref("add_scalar", x, value=1e-6).dtype == np.float32


@covers("add3")
@pytest.mark.parametrize("shape", [(7, 33), (2, 3, 5)])
def test_add3(shape):
    a, b, c = randn(63, shape, shape, shape)
    check(ref("add3", a, b, c), tt(a) + tt(b) + tt(c))


REDUCE_DIMS = [((7, 33), [0]), ((7, 33), [-1]), ((2, 3, 5), [0, 2]), ((2, 3, 5), [1]), ((2, 3, 5), [0, 1, 2])]


@covers("reduce_sum", "reduce_mean")
@pytest.mark.parametrize("name, fn", [("reduce_sum", torch.sum), ("reduce_mean", torch.mean)])
@pytest.mark.parametrize("shape, dims", REDUCE_DIMS)
@pytest.mark.parametrize("keepdim", [False, True])
def test_reduce_sum_mean(name, fn, shape, dims, keepdim):
    (x,) = randn(64, shape)
    check(ref(name, x, dims=dims, keepdim=keepdim), fn(tt(x), dim=dims, keepdim=keepdim))


@covers("reduce_max")
@pytest.mark.parametrize("shape, dim", [((7, 33), 0), ((7, 33), -1), ((2, 3, 5), 1)])
@pytest.mark.parametrize("keepdim", [False, True])
def test_reduce_max(shape, dim, keepdim):
    (x,) = randn(65, shape)
    x = np.round(x)  # ties: the index is the first maximum (torch.argmax documents the same)
    values, indices = ref("reduce_max", x, dim=dim, keepdim=keepdim)
    expected = torch.max(tt(x), dim=dim, keepdim=keepdim).values
    check(values, expected)
    assert indices.dtype == np.int32
    check(indices, torch.argmax(tt(x), dim=dim, keepdim=keepdim))


@covers("reduce_max_backward")
@pytest.mark.parametrize("shape, dim", [((7, 33), 0), ((7, 33), -1), ((2, 3, 5), 1), ((2, 3, 5), -3)])
@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("ties", [False, True])
def test_reduce_max_backward(shape, dim, keepdim, ties):
    """torch.max(x, dim)'s gradient goes to the index it returned (the first maximum on ties)."""
    (x,) = randn(66, shape)
    x = np.round(x) if ties else x
    _, indices = ref("reduce_max", x, dim=dim, keepdim=keepdim)
    (d_values,) = randn(67, indices.shape)
    (expected,) = vjp(lambda x_: torch.max(x_, dim=dim, keepdim=keepdim).values, [x], [d_values])
    check(ref("reduce_max_backward", d_values, indices, dim=dim, keepdim=keepdim, shape=shape), expected)


# ----------------------------------------------------------------------------
# 6.8 Embedding
# ----------------------------------------------------------------------------


@covers("embedding", "embedding_backward")
@pytest.mark.parametrize("idx_shape, vocab, d", [((2, 7), 11, 5), ((13,), 4, 33)])
def test_embedding(idx_shape, vocab, d):
    rng = np.random.default_rng(70)
    idx = rng.integers(0, vocab, idx_shape).astype(np.int32)  # repeats: the backward must add them up
    w, d_out = randn(71, (vocab, d), (*idx_shape, d))
    check(ref("embedding", idx, w), F.embedding(tt(idx), tt(w)))
    (expected,) = vjp(lambda w_: F.embedding(tt(idx), w_), [w], [d_out])
    check(ref("embedding_backward", d_out, idx, shape=(vocab, d)), expected)


def test_embedding_backward_without_shape_sizes_by_the_largest_index():
    idx = np.array([[0, 3], [3, 1]], dtype=np.int32)
    (d_out,) = randn(72, (2, 2, 4))
    (expected,) = vjp(lambda w_: F.embedding(tt(idx), w_), [np.zeros((4, 4))], [d_out])
    check(ref("embedding_backward", d_out, idx), expected)


# ----------------------------------------------------------------------------
# 6.9 MoE
# ----------------------------------------------------------------------------


def torch_router(x, gate, top_k, normalize=True, aux_loss_coef=0.01, use_sigmoid=False, indices=None):
    """(weights, indices, aux_loss); indices from torch.topk unless given (then constants, as the backward).

    aux_loss = coef * E * sum_e f_e P_e with f_e the fraction of tokens choosing e among their top k
    (HF Mixtral load_balancing_loss_func: one_hot(top-k).mean over tokens, summed over k) and P_e the
    mean routing probability (sigmoid scores renormalized over the experts, as DeepSeek-V3).
    """
    e = gate.shape[0]
    logits = x @ gate.T
    scores = torch.sigmoid(logits) if use_sigmoid else torch.softmax(logits, -1)
    if indices is None:
        indices = torch.topk(scores, top_k, dim=-1).indices
    weights = scores.gather(-1, indices)
    if normalize:
        weights = weights / weights.sum(-1, keepdim=True)
    probs = scores / scores.sum(-1, keepdim=True) if use_sigmoid else scores
    tokens_per_expert = F.one_hot(indices, e).to(torch.float64).mean(0)  # [top_k, E]
    aux = aux_loss_coef * e * (tokens_per_expert * probs.mean(0)).sum()
    return weights, indices, aux


ROUTER_CASES = [(7, 6, 5, 2), (9, 33, 8, 3), (4, 3, 4, 1)]  # (tokens, C, E, top_k)


@covers("moe_router", "moe_router_backward")
@pytest.mark.parametrize("tokens, c, e, top_k", ROUTER_CASES)
@pytest.mark.parametrize("use_sigmoid", [False, True])
@pytest.mark.parametrize("normalize", [True, False])
def test_moe_router(tokens, c, e, top_k, use_sigmoid, normalize):
    coef = 0.05
    x, gate, d_w = randn(80, (tokens, c), (e, c), (tokens, top_k))
    params = {"normalize": normalize, "aux_loss_coef": coef, "use_sigmoid": use_sigmoid}
    weights, indices, aux = ref("moe_router", x, gate, top_k=top_k, **params)
    w_expected, idx_expected, aux_expected = torch_router(tt(x), tt(gate), top_k, **params)
    assert indices.dtype == np.int32
    check_all((weights, indices, aux), (w_expected, idx_expected, aux_expected))
    # the backward: d(sum(d_weights * weights) + aux_loss) with the forward's indices held fixed
    fixed = torch.from_numpy(indices.astype(np.int64))

    def loss_terms(x_, gate_):
        w_, _, aux_ = torch_router(x_, gate_, top_k, indices=fixed, **params)
        return w_, aux_

    expected = vjp(loss_terms, [x, gate], [d_w, np.ones(())])
    check_all(ref("moe_router_backward", d_w, x, gate, indices, **params), expected)


def test_moe_router_aux_loss_matches_hf_mixtral():
    """The softmax aux loss is HF's load_balancing_loss_func times the coefficient (HF computes it in fp32)."""
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

    x, gate = randn(81, (9, 6), (5, 6))
    _, _, aux = ref("moe_router", x, gate, top_k=2, aux_loss_coef=0.02)
    hf = load_balancing_loss_func((tt(x) @ tt(gate).T,), num_experts=5, top_k=2)
    check(aux, 0.02 * hf.to(torch.float64), rtol=1e-6)


def routing(seed: int, tokens: int, experts: int, top_k: int) -> tuple[np.ndarray, np.ndarray]:
    """int32 indices [N, top_k] (distinct experts per token) and the expert offsets [E + 1]."""
    rng = np.random.default_rng(seed)
    idx = np.stack([rng.permutation(experts)[:top_k] for _ in range(tokens)]).astype(np.int32)
    counts = np.bincount(idx.reshape(-1), minlength=experts)
    return idx, np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)


PERMUTE_CASES = [(7, 5, 4, 2), (9, 33, 6, 3), (3, 4, 5, 1)]  # (tokens, C, E, top_k)


@covers("moe_permute")
@pytest.mark.parametrize("tokens, c, e, top_k", PERMUTE_CASES)
def test_moe_permute(tokens, c, e, top_k):
    """Expert-grouped order is the stable sort of the flat assignments (a = n * top_k + k) by expert."""
    idx, offsets = routing(90, tokens, e, top_k)
    (x,) = randn(91, (tokens, c))
    order = torch.argsort(tt(idx).reshape(-1), stable=True)
    scatter = torch.empty_like(order)
    scatter[order] = torch.arange(order.numel())
    permuted, scatter_indices = ref("moe_permute", x, idx, offsets)
    assert scatter_indices.dtype == np.int32
    check_all((permuted, scatter_indices), (tt(x)[order // top_k], scatter))


@covers("moe_compute_offsets")
@pytest.mark.parametrize("tokens, c, e, top_k", PERMUTE_CASES)
def test_moe_compute_offsets_count_each_experts_assignments_like_torch(tokens, c, e, top_k):
    idx, _ = routing(94, tokens, e, top_k)
    idx[0, 0] = e - 1  # the last expert has assignments in every case
    counts = torch.bincount(tt(idx).reshape(-1).long(), minlength=e)
    expected = torch.cat([torch.zeros(1, dtype=torch.long), torch.cumsum(counts, 0)])
    offsets = ref("moe_compute_offsets", idx, num_experts=e)
    assert offsets.dtype == np.int32 and offsets.shape == (e + 1,)
    np.testing.assert_array_equal(offsets, expected.numpy())
    with pytest.raises(ValueError, match="outside"):
        ref("moe_compute_offsets", idx, num_experts=e - 1)


def torch_unpermute(expert_outputs, weights, scatter):
    n, top_k = weights.shape
    rows = expert_outputs[scatter].reshape(n, top_k, -1)
    return (weights[..., None] * rows).sum(1)


@covers("moe_unpermute", "moe_unpermute_backward")
@pytest.mark.parametrize("tokens, c, e, top_k", PERMUTE_CASES)
def test_moe_unpermute(tokens, c, e, top_k):
    idx, offsets = routing(92, tokens, e, top_k)
    x, eo, w, d_c = randn(93, (tokens, c), (tokens * top_k, c), (tokens, top_k), (tokens, c))
    _, scatter = ref("moe_permute", x, idx, offsets)
    check(ref("moe_unpermute", eo, w, scatter), torch_unpermute(tt(eo), tt(w), tt(scatter)))
    expected = vjp(lambda eo_, w_: torch_unpermute(eo_, w_, tt(scatter)), [eo, w], [d_c])
    check_all(ref("moe_unpermute_backward", d_c, eo, w, scatter), expected)
    # unpermute undoes permute: identity experts give x times the summed weights
    permuted, _ = ref("moe_permute", x, idx, offsets)
    check(ref("moe_unpermute", permuted, w, scatter), tt(x) * tt(w).sum(-1, keepdim=True))


# ----------------------------------------------------------------------------
# 6.10 Mamba
# ----------------------------------------------------------------------------


def torch_conv1d(x, weight, bias=None, conv_state=None, kernel_size=4, activation="silu"):
    """causal-conv1d's reference: the state (or zeros) prepended, a depthwise conv1d, silu; the new state
    is the last K-1 steps of [state, x]."""
    prefix = x.new_zeros((*x.shape[:2], kernel_size - 1)) if conv_state is None else conv_state
    xp = torch.cat([prefix, x], dim=-1)
    pre = F.conv1d(xp, weight, bias, groups=x.shape[1])
    y = F.silu(pre) if activation == "silu" else pre
    return y, xp[..., xp.shape[-1] - (kernel_size - 1) :]


CONV_CASES = [(2, 5, 7, 4), (1, 33, 2, 4), (2, 3, 6, 3)]  # (B, D, T, K); T = 2 < K - 1 keeps old state


@covers("mamba_conv1d")
@pytest.mark.parametrize("b, d, t, k", CONV_CASES)
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("with_state", [True, False])
@pytest.mark.parametrize("activation", ["silu", "none"])
def test_mamba_conv1d(b, d, t, k, with_bias, with_state, activation):
    x, w, bias, state = randn(100, (b, d, t), (d, 1, k), (d,), (b, d, k - 1))
    bias, state = (bias if with_bias else None), (state if with_state else None)
    params = {"kernel_size": k, "activation": activation}
    out = ref("mamba_conv1d", x, w, bias, state, **params)
    y, state_out = torch_conv1d(tt(x), tt(w), tt(bias), tt(state), **params)
    if with_state:
        check_all(out, (y, state_out))
    else:  # conv_state_out is a result exactly when a conv_state is given (the op, spec 6.10.1)
        check(out, y)


@covers("mamba_conv1d_backward")
@pytest.mark.parametrize("b, d, t, k", CONV_CASES)
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("activation", ["silu", "none"])
def test_mamba_conv1d_backward(b, d, t, k, with_bias, activation):
    x, w, bias, d_y = randn(101, (b, d, t), (d, 1, k), (d,), (b, d, t))
    params = {"kernel_size": k, "activation": activation}
    if with_bias:
        expected = vjp(lambda *a: torch_conv1d(*a, **params)[0], [x, w, bias], [d_y])
    else:  # d_bias is a result exactly when a bias is given
        expected = vjp(lambda *a: torch_conv1d(*a, **params)[0], [x, w], [d_y])
    check_all(ref("mamba_conv1d_backward", d_y, x, w, bias if with_bias else None, **params), expected)


def torch_selective_scan(u, delta, a_log, b_proj, c_proj, d_skip, dt_bias, ssm_state=None):
    """mamba_ssm's selective_scan_ref (delta_softplus=True) as a sequential loop over time."""
    batch, channels, steps = u.shape
    dt = F.softplus(delta + dt_bias[:, None])
    a = -torch.exp(a_log)
    bx = b_proj.repeat_interleave(channels // b_proj.shape[1], dim=1)  # [B, D, N, T]
    cx = c_proj.repeat_interleave(channels // c_proj.shape[1], dim=1)
    h = u.new_zeros((batch, channels, a.shape[1])) if ssm_state is None else ssm_state
    ys = []
    for t in range(steps):
        h = torch.exp(dt[..., t, None] * a) * h + (dt[..., t] * u[..., t])[..., None] * bx[..., t]
        ys.append((h * cx[..., t]).sum(-1))
    return torch.stack(ys, dim=-1) + d_skip[:, None] * u, h


SCAN_CASES = [(2, 4, 3, 7, 1), (1, 6, 5, 9, 2), (2, 33, 2, 4, 3)]  # (B, D, N, T, G)


def scan_inputs(seed, b, d, n, t, g):
    u, delta, a_log, bp, cp, d_skip, dt_bias, state, d_y = randn(
        seed, (b, d, t), (b, d, t), (d, n), (b, g, n, t), (b, g, n, t), (d,), (d,), (b, d, n), (b, d, t))
    return [u, delta, 0.5 * a_log, bp, cp, d_skip, dt_bias], state, d_y


@covers("mamba_selective_scan", "mamba_selective_scan_backward")
@pytest.mark.parametrize("b, d, n, t, g", SCAN_CASES)
@pytest.mark.parametrize("with_state", [False, True])
def test_mamba_selective_scan(b, d, n, t, g, with_state):
    inputs, state, d_y = scan_inputs(110, b, d, n, t, g)
    state = state if with_state else None
    y, state_out = ref("mamba_selective_scan", *inputs, state, chunk_size=2)
    check_all((y, state_out), torch_selective_scan(*map(tt, inputs), tt(state)))
    expected = vjp(lambda *a: torch_selective_scan(*a, tt(state))[0], inputs, [d_y])
    check_all(ref("mamba_selective_scan_backward", d_y, *inputs, state, y, chunk_size=2), expected)


def pieces_of_a_run(t):
    """A prompt of all but two steps (padded by two junk steps to a bucket), then one-step runs."""
    return [(0, t - 2, 2), (t - 2, t - 1, 0), (t - 1, t, 0)]  # (start, end, padding)


def padded(a, pad, seed):
    junk = np.random.default_rng(seed).standard_normal((*a.shape[:-1], pad))
    return np.concatenate([a, junk], axis=-1)


@covers("mamba_conv1d_step")
@pytest.mark.parametrize("b, d, t, k", [(2, 5, 7, 4), (2, 3, 6, 3)])
@pytest.mark.parametrize("with_bias", [True, False])
def test_mamba_conv1d_step_carries_the_state_past_padding(b, d, t, k, with_bias):
    """Runs over a carried state equal torch's conv of the whole sequence; junk steps padding a run
    past its valid ones never reach the state; a run at position 0 ignores what the state held."""
    x, w, bias = randn(102, (b, d, t), (d, 1, k), (d,))
    bias = bias if with_bias else None
    params = {"kernel_size": k, "activation": "silu"}
    whole, _ = torch_conv1d(tt(x), tt(w), tt(bias), None, **params)
    state = np.full((b, d, k - 1), 7.0)  # stale: position 0 starts from zeros
    for start, end, pad in pieces_of_a_run(t):
        piece = padded(x[..., start:end], pad, start)
        y, out = ref("mamba_conv1d_step", piece, w, state, np.array([start], np.int32),
                     np.array([end - start], np.int32), bias, **params)
        assert out is state
        check(y[..., :end - start], whole[..., start:end])
    check(state, tt(x[..., t - k + 1:]))
    with pytest.raises(ValueError, match="real steps"):
        ref("mamba_conv1d_step", x, w, state, np.array([0], np.int32), np.array([t + 1], np.int32), **params)


@covers("mamba_selective_scan_step")
@pytest.mark.parametrize("b, d, n, t, g", SCAN_CASES[:2])
def test_mamba_selective_scan_step_carries_the_state_past_padding(b, d, n, t, g):
    inputs, stale, _ = scan_inputs(111, b, d, n, t, g)
    whole, final = torch_selective_scan(*map(tt, inputs))
    state = stale.copy()
    for start, end, pad in pieces_of_a_run(t):
        piece = [padded(a[..., start:end], pad, start) if a.ndim in (3, 4) else a for a in inputs]
        y, out = ref("mamba_selective_scan_step", *piece, state, np.array([start], np.int32),
                     np.array([end - start], np.int32))
        assert out is state
        check(y[..., :end - start], whole[..., start:end])
    check(state, final)


# ----------------------------------------------------------------------------
# 6.11 Utility
# ----------------------------------------------------------------------------


@covers("zeros", "ones", "fill")
@pytest.mark.parametrize("shape", [(7, 33), (2, 3, 1)])
def test_constants(shape):
    for name, params, expected in [("zeros", {}, torch.zeros(shape)), ("ones", {}, torch.ones(shape)),
                                   ("fill", {"value": -2.5}, torch.full(shape, -2.5))]:
        out = ref(name, shape=shape, **params)  # default dtype bf16 (spec 6.11)
        assert out.dtype == ml_dtypes.bfloat16 and out.shape == shape
        np.testing.assert_array_equal(out.astype(np.float32), expected.numpy())
        out = ref(name, shape=list(shape), dtype=np.float64, **params)
        check(out, expected.to(torch.float64))


@covers("copy")
@pytest.mark.parametrize("shape", [(7, 33), (2, 3, 5)])
def test_copy(shape):
    (x,) = randn(120, shape)
    out = ref("copy", x)
    check(out, tt(x).clone())
    assert not np.shares_memory(out, x)


def as_bits(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint16)


@covers("cast")
@pytest.mark.parametrize("shape", [(7, 33), (3, 4, 5)])
def test_cast(shape):
    (x,) = randn(121, shape)
    x32 = (x * 1000).astype(np.float32)
    t32 = torch.from_numpy(x32)
    # float32 -> bf16 / fp16: round to nearest even, bit for bit as torch
    bf = ref("cast", x32, dtype=ml_dtypes.bfloat16)
    assert bf.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(as_bits(bf), t32.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16))
    half = ref("cast", x32, dtype=np.float16)
    np.testing.assert_array_equal(as_bits(half), t32.to(torch.float16).view(torch.int16).numpy().view(np.uint16))
    # back up exactly, and float -> int truncates toward zero as torch
    np.testing.assert_array_equal(ref("cast", bf, dtype=np.float32), t32.to(torch.bfloat16).float().numpy())
    np.testing.assert_array_equal(ref("cast", x * 10, dtype=np.int32), tt(x * 10).to(torch.int32).numpy())
    check(ref("cast", x32, dtype=np.float64), t32.double())
    # float64 -> bf16 rounds through float32 as torch: 1 + 2^-8 + 2^-40 becomes 1, not 1 + 2^-7
    x64 = np.array([1 + 2.0**-8 + 2.0**-40, -3.0 - 2.0**-7 - 2.0**-35])
    np.testing.assert_array_equal(ref("cast", x64, dtype=ml_dtypes.bfloat16).astype(np.float64),
                                  torch.from_numpy(x64).to(torch.bfloat16).double().numpy())


# ----------------------------------------------------------------------------
# Quantization
# ----------------------------------------------------------------------------


def torch_quantize(w32: np.ndarray, dtype) -> tuple[np.ndarray, np.ndarray]:
    """Per-output-channel absmax fp8 quantization in torch: scale = amax / fmax (1 for a zero row),
    q = w / scale saturated at +-fmax and rounded to nearest even by torch's conversion."""
    t = torch.from_numpy(w32)
    top = torch.finfo(dtype).max
    amax = t.abs().amax(dim=-1)
    scale = torch.where(amax > 0, amax / top, torch.ones_like(amax))
    q = (t / scale[..., None]).clamp(-top, top).to(dtype)
    return q.view(torch.uint8).numpy(), scale.numpy()


@covers("all_reduce", "all_gather", "reduce_scatter")
@pytest.mark.parametrize("name", ["all_reduce", "all_gather", "reduce_scatter"])
def test_a_collective_over_one_rank_is_the_value_and_a_larger_group_is_the_communicators(name):
    """One rank's reduction, gather or scatter is its own value (a copy); a group of several runs
    through the process's communicator (tests/unit/runtime/test_data_parallel.py), not a reference."""
    (x,) = randn(131, (3, 4))
    got = ref(name, x, group="tp", size=1)
    np.testing.assert_array_equal(got, x)
    assert got is not x
    with pytest.raises(ValueError, match=f"{name} over 2 ranks runs through the process's communicator"):
        ref(name, x, group="tp", size=2)


@covers("dequantize")
@pytest.mark.parametrize("shape", [(7, 33), (3, 4, 5)])
@pytest.mark.parametrize("fp8", ["e4m3", "e5m2"])
def test_quantize_and_dequantize_are_torch_fp8_bit_for_bit(shape, fp8):
    """``quantize`` (the loader's, no primitive) gives torch's fp8 codes and scales bit for bit; a
    zero row gets scale 1; ``dequantize`` is torch's ``q.float() * scale`` bit for bit, within 2^-4
    (e4m3) or 2^-3 (e5m2) of each value in the normal range (3 or 2 mantissa bits, round to nearest)."""
    ours_dtype = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}[fp8]
    torch_dtype = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}[fp8]
    (x,) = randn(131, shape)
    w = (x * np.exp(randn(132, shape)[0])).astype(np.float32)  # magnitudes over a few binades
    w[(0,) * (len(shape) - 1)] = 0.0  # a row of zeros
    q, scale = quantize(w, dtype=ours_dtype)
    codes, scales = torch_quantize(w, torch_dtype)
    assert q.dtype == ours_dtype and scale.dtype == np.float32 and scale.shape == shape[:-1]
    np.testing.assert_array_equal(q.view(np.uint8), codes)
    np.testing.assert_array_equal(scale, scales)
    assert scale[(0,) * (len(shape) - 1)] == 1.0
    wide = ref("dequantize", q, scale)
    assert wide.dtype == np.float32
    expected = torch.from_numpy(codes).view(torch_dtype).float() * torch.from_numpy(scales)[..., None]
    np.testing.assert_array_equal(wide, expected.numpy())
    normal = np.abs(w) >= scale[..., None] * ml_dtypes.finfo(ours_dtype).smallest_normal
    bound = 2.0 ** -(ml_dtypes.finfo(ours_dtype).nmant + 1)
    assert np.all(np.abs(wide - w)[normal] <= bound * np.abs(w)[normal])
    assert np.abs(wide - w).max() <= bound * np.abs(w).max()
    widened = torch.from_numpy(codes).view(torch_dtype).double() * torch.from_numpy(scales).double()[..., None]
    check(ref("dequantize", q, scale.astype(np.float64)), widened)


# ----------------------------------------------------------------------------
# Losses
# ----------------------------------------------------------------------------


def labels_for(seed: int, rows: int, vocab: int, ignored: int, dtype=np.int64) -> np.ndarray:
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, vocab, rows)
    labels[rng.permutation(rows)[:ignored]] = -100
    return labels.astype(dtype)


def torch_ce(logits, labels, reduction):
    return F.cross_entropy(logits, labels, ignore_index=-100, reduction=reduction), torch.logsumexp(logits, -1)


def d_loss_for(seed: int, rows: int, reduction: str) -> np.ndarray:
    (d,) = randn(seed, (rows,) if reduction == "none" else ())
    return d


LOSS_CASES = [(7, 33, 2, np.int64), (9, 5, 0, np.int32), (4, 3, 3, np.int32)]  # (rows, V, ignored, label dtype)


@covers("cross_entropy", "cross_entropy_backward")
@pytest.mark.parametrize("rows, vocab, ignored, label_dtype", LOSS_CASES)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy(rows, vocab, ignored, label_dtype, reduction):
    (logits,) = randn(130, (rows, vocab))
    logits = 3.0 * logits
    labels = labels_for(131, rows, vocab, ignored, label_dtype)
    loss, lse = ref("cross_entropy", logits, labels, reduction=reduction)
    check_all((loss, lse), torch_ce(tt(logits), tt(labels), reduction))
    d_loss = d_loss_for(132, rows, reduction)
    (expected,) = vjp(lambda z: torch_ce(z, tt(labels), reduction)[0], [logits], [d_loss])
    check(ref("cross_entropy_backward", d_loss, logits, labels, lse, reduction=reduction), expected)


def test_cross_entropy_mean_of_no_counted_rows_is_nan():
    (logits,) = randn(133, (3, 5))
    labels = np.full(3, -100)
    loss, _ = ref("cross_entropy", logits, labels)
    assert np.isnan(loss) and torch.isnan(torch_ce(tt(logits), tt(labels), "mean")[0])


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_other_ignore_index(reduction):
    (logits,) = randn(134, (7, 6))
    labels = np.array([0, 5, 3, 3, 1, 3, 2])
    loss, _ = ref("cross_entropy", logits, labels, ignore_index=3, reduction=reduction)
    check(loss, F.cross_entropy(tt(logits), tt(labels), ignore_index=3, reduction=reduction))


def torch_lm_head_loss(x, weight, labels, reduction):
    return torch_ce(x @ weight.T, labels, reduction)


@covers("fused_lm_head_loss", "fused_lm_head_loss_backward")
@pytest.mark.parametrize("rows, vocab, ignored, label_dtype", LOSS_CASES)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("chunk", [0, 1, 3])
def test_fused_lm_head_loss(rows, vocab, ignored, label_dtype, reduction, chunk):
    """Chunk by chunk (0: all rows at once; 3 leaves a short last chunk) as PyTorch does it whole."""
    x, w = randn(140, (rows, 6), (vocab, 6))
    labels = labels_for(141, rows, vocab, ignored, label_dtype)
    loss, lse = ref("fused_lm_head_loss", x, w, labels, reduction=reduction, compute_accuracy=True, chunk=chunk)
    check_all((loss, lse), torch_lm_head_loss(tt(x), tt(w), tt(labels), reduction))
    d_loss = d_loss_for(142, rows, reduction)
    expected = vjp(lambda x_, w_: torch_lm_head_loss(x_, w_, tt(labels), reduction)[0], [x, w], [d_loss])
    check_all(ref("fused_lm_head_loss_backward", d_loss, x, w, labels, lse, reduction=reduction, chunk=chunk),
              expected)


@covers("fused_lm_head_loss_grad")
@pytest.mark.parametrize("rows, vocab, ignored, label_dtype", LOSS_CASES)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("chunk", [0, 1, 3])
@pytest.mark.parametrize("storage", [np.float32, ml_dtypes.bfloat16], ids=["fp32", "bf16"])
def test_fused_lm_head_loss_grad_is_the_forward_and_backward_in_one_pass(rows, vocab, ignored, label_dtype,
                                                                        reduction, chunk, storage):
    """Its loss is fused_lm_head_loss's and its gradients fused_lm_head_loss_backward's, bit for bit
    (the same arithmetic per chunk, fp32 and bf16 storage); and PyTorch's."""
    x64, w64 = randn(143, (rows, 6), (vocab, 6))
    x, w = x64.astype(storage), w64.astype(storage)
    labels = labels_for(144, rows, vocab, ignored, label_dtype)
    d_loss64 = d_loss_for(145, rows, reduction)
    d_loss = d_loss64.astype(np.float32)
    params = {"reduction": reduction, "chunk": chunk}
    loss, d_x, d_w = ref("fused_lm_head_loss_grad", d_loss, x, w, labels, **params)
    separate_loss, lse = ref("fused_lm_head_loss", x, w, labels, **params)
    separate = ref("fused_lm_head_loss_backward", d_loss, x, w, labels, lse, **params)
    for got, want in zip((loss, d_x, d_w), (separate_loss, *separate)):
        assert got.dtype == want.dtype == np.float32 and np.array_equal(got, want)
    expected = vjp(lambda x_, w_: torch_lm_head_loss(x_, w_, tt(labels), reduction)[0], [x64, w64], [d_loss64])
    check_all(ref("fused_lm_head_loss_grad", d_loss64, x64, w64, labels, **params),
              (torch_lm_head_loss(tt(x64), tt(w64), tt(labels), reduction)[0], *expected))


# ----------------------------------------------------------------------------
# bf16 inputs are computed in fp32
# ----------------------------------------------------------------------------


def bf16_inputs(seed: int, *shapes: tuple[int, ...]) -> list[np.ndarray]:
    return [a.astype(ml_dtypes.bfloat16) for a in randn(seed, *shapes)]


BF16_CASES = {  # name: (input shapes, params, float64 torch forward)
    "matmul": ([(7, 33), (5, 33)], {"transpose": "NT"}, lambda a, b: a @ b.T),
    "rmsnorm": ([(7, 33), (33,)], {}, lambda x, w: (torch_rmsnorm(x, w, 1e-6), torch_rstd(x, 1e-6))),
    "swiglu": ([(7, 33), (7, 33)], {}, lambda g, u: F.silu(g) * u),
    "softmax": ([(7, 33)], {}, lambda x: torch.softmax(x, -1)),
    "flash_attention": ([(1, 4, 7, 8), (1, 2, 7, 8), (1, 2, 7, 8)], {}, torch_attention),
    "cross_entropy": ([(7, 33)], {}, lambda z: torch_ce(z, tt(labels_for(155, 7, 33, 2)), "mean")),
}


@pytest.mark.parametrize("name", sorted(BF16_CASES))
def test_bf16_inputs_compute_in_fp32(name):
    """fp32 results within ~1e-6 of float64 math on the same bf16-rounded inputs (bf16 math: ~1e-2)."""
    shapes, params, fn = BF16_CASES[name]
    inputs = bf16_inputs(150, *shapes)
    extra = (labels_for(155, 7, 33, 2),) if name == "cross_entropy" else ()
    out = ref(name, *inputs, *extra, **params)
    expected = fn(*map(tt, inputs))
    outs, expected = (out, expected) if isinstance(out, tuple) else ((out,), (expected,))
    for actual, e in zip(outs, expected, strict=True):
        assert actual.dtype == np.float32
        e = e.detach().numpy()
        np.testing.assert_allclose(actual, e, rtol=1e-6, atol=1e-6 * np.abs(e).max())


# ----------------------------------------------------------------------------
# Coverage
# ----------------------------------------------------------------------------


@covers("adamw")
@pytest.mark.parametrize("weight_decay, betas", [(0.1, (0.9, 0.95)), (0.0, (0.8, 0.999))])
def test_adamw_follows_torch_adamw_for_20_steps(weight_decay, betas):
    """fp32 state, as torch keeps it; the update order differs (torch lerps), so ulps, not bits."""
    rng = np.random.default_rng(40)
    start = rng.standard_normal((7, 33)).astype(np.float32)
    theirs = torch.nn.Parameter(torch.tensor(start.copy()))
    optimizer = torch.optim.AdamW([theirs], lr=3e-3, betas=betas, eps=1e-8, weight_decay=weight_decay,
                                  foreach=False)
    param, exp_avg, exp_avg_sq = start.copy(), np.zeros_like(start), np.zeros_like(start)
    for step in range(1, 21):
        grad = rng.standard_normal(start.shape).astype(np.float32)
        theirs.grad = torch.tensor(grad)
        optimizer.step()
        out = ref("adamw", param, grad, exp_avg, exp_avg_sq, np.float32(3e-3), np.array([step]), beta1=betas[0],
                  beta2=betas[1], eps=1e-8, weight_decay=weight_decay)
        assert out[0] is param and out[1] is exp_avg and out[2] is exp_avg_sq  # updated in place
    np.testing.assert_allclose(param, theirs.detach().numpy(), rtol=1e-6, atol=1e-6)
    state = optimizer.state[theirs]
    np.testing.assert_allclose(exp_avg, state["exp_avg"].numpy(), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(exp_avg_sq, state["exp_avg_sq"].numpy(), rtol=1e-6, atol=1e-7)


@covers("global_norm")
def test_global_norm_is_torchs_total_norm():
    grads = randn(41, (3, 4), (5,), (2, 2, 2))
    expected = torch.linalg.vector_norm(torch.cat([tt(g).reshape(-1) for g in grads]))
    check(ref("global_norm", *grads), expected)


@covers("adamw")
def test_adamw_scales_the_learning_rate_and_the_gradient():
    """lr_scale multiplies the runtime rate; grad_scale (the clipping factor) the gradient."""
    rng = np.random.default_rng(41)
    start, grad = rng.standard_normal((2, 5, 3)).astype(np.float32)
    plain = [start.copy(), np.zeros_like(start), np.zeros_like(start)]
    ref("adamw", plain[0], grad * np.float32(0.5), plain[1], plain[2], 2e-3, 1, weight_decay=0.05)
    scaled = [start.copy(), np.zeros_like(start), np.zeros_like(start)]
    ref("adamw", scaled[0], grad, scaled[1], scaled[2], np.array([4e-3], np.float32), np.array([1]),
        np.array([0.5], np.float32), weight_decay=0.05, lr_scale=0.5)
    for a, b in zip(plain, scaled):
        np.testing.assert_array_equal(a, b)


@covers("clip_factor")
@pytest.mark.parametrize("max_norm", [1.0, 100.0])
def test_clip_factor_scales_like_torch_clip_grad_norm(max_norm):
    grad = np.random.default_rng(0).standard_normal((4, 4))
    param = torch.nn.Parameter(torch.zeros(4, 4, dtype=torch.float64))
    param.grad = torch.tensor(grad)
    torch.nn.utils.clip_grad_norm_([param], max_norm=max_norm)
    factor = ref("clip_factor", np.linalg.norm(grad), max_norm=max_norm)
    np.testing.assert_allclose(grad * factor, param.grad.numpy(), rtol=1e-12)


@covers("clip_norm")
@pytest.mark.parametrize("max_norm", [0.5, 100.0])
def test_clip_norm_is_torch_clip_grad_norm_of_one_tensor(max_norm):
    grad = np.random.default_rng(3).standard_normal((3, 4))
    param = torch.nn.Parameter(torch.zeros(3, 4, dtype=torch.float64))
    param.grad = torch.tensor(grad)
    torch.nn.utils.clip_grad_norm_([param], max_norm=max_norm)
    np.testing.assert_allclose(ref("clip_norm", grad, max_norm=max_norm), param.grad.numpy(), rtol=1e-12)


def test_every_reference_is_covered():
    """A new reference kernel needs a test here (and a test of a removed one must go)."""
    assert COVERED == set(REFERENCES), (sorted(set(REFERENCES) - COVERED), sorted(COVERED - set(REFERENCES)))
