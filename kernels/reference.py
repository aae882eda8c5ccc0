"""Numpy reference implementations of every ``mdsl.graph`` primitive.

These are the ground truth for the semantics of each primitive (spec 000
section 6 and the op verifiers of ``dialects/graph_primitives.py``): the CPU
executor runs them and the CUDA kernels are tested against them. They favour
clarity over speed.

Calling convention: ``REFERENCES[name](*inputs, **params)``. ``inputs`` are
numpy arrays in operand order (an absent optional operand is ``None``; the
arrays of a variadic operand group are separate positional arguments);
``params`` are plain Python values keyed by parameter name, each defaulting to
its spec default. The shape-only primitives take ``shape`` (zeros, ones, fill,
view) and ``dtype`` (zeros, ones, fill, cast). One output is returned as an
array, several as a tuple in output order.

Numerics: float inputs (fp8, fp16, bf16, fp32) are computed in float32, or in
float64 when any float input is float64, and float results come back in that
compute dtype (the caller casts to the declared result dtype); statistics
(rstd, mean, lse) likewise. Integer inputs stay integers; index outputs are
int32. Every ``*_backward`` is the exact gradient of its forward, given the
statistics the forward saved.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence

import ml_dtypes
import numpy as np

from modeldsl.kernels import dropout_mask

# ----------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------


def _is_float(a: np.ndarray | None) -> bool:
    return a is not None and np.asarray(a).dtype.kind not in "biu"


def _compute_dtype(*arrays: np.ndarray | None) -> type:
    """float64 when any float input is float64, else float32."""
    return np.float64 if any(_is_float(a) and np.asarray(a).dtype == np.float64 for a in arrays) else np.float32


def _prep(*arrays: np.ndarray | None) -> tuple:
    """Float arrays in the compute dtype; integer arrays and None unchanged."""
    dtype = _compute_dtype(*arrays)
    return tuple(np.asarray(a, dtype=dtype) if _is_float(a) else a for a in arrays)


def _scalar(value, dtype) -> np.ndarray:
    return np.asarray(value, dtype=dtype)


def _rows(a: np.ndarray) -> np.ndarray:
    """``[*, C]`` as ``[rows, C]``."""
    return a.reshape(-1, a.shape[-1])


def _sigmoid(x: np.ndarray) -> np.ndarray:
    """``1 / (1 + exp(-x))`` in four passes over one temporary: an ``exp(-x)`` that overflows gives
    ``1 / inf = 0``, the right limit, and the division keeps the relative precision everywhere
    (the CPU and CUDA kernels compute it the same way)."""
    with np.errstate(over="ignore"):
        s = np.negative(x)
        np.exp(s, out=s)
    s += x.dtype.type(1)
    np.reciprocal(s, out=s)
    return s


def _softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(0.0, x)


_erf_scalar = np.vectorize(math.erf, otypes=[np.float64])


def _erf(x: np.ndarray) -> np.ndarray:
    return _erf_scalar(x).astype(x.dtype)


def _logsumexp(x: np.ndarray, axis: int = -1) -> np.ndarray:
    m = np.max(x, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    return (np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True)) + m).squeeze(axis)


def _softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


def _op(x: np.ndarray, mode: str) -> np.ndarray:
    """``x`` or its transpose over the last two dims (``mode`` is ``N`` or ``T``)."""
    return np.swapaxes(x, -1, -2) if mode == "T" else x


def _groups(offsets: np.ndarray) -> list[tuple[int, int]]:
    off = [int(o) for o in np.asarray(offsets).reshape(-1)]
    return list(zip(off[:-1], off[1:]))


# ----------------------------------------------------------------------------
# 6.1 Linear algebra
# ----------------------------------------------------------------------------


def matmul(a, b, *, transpose="NN", accumulate=False, alpha=1.0, beta=0.0):
    """C = alpha * op(A) @ op(B) (NN A@B, NT A@B^T, TN A^T@B, TT A^T@B^T).

    A may carry leading dims against a matrix B. ``TN`` with A and B sharing
    leading dims contracts them with the rows (``dW = dY^T X`` over all tokens).
    ``accumulate``/``beta`` are not applied here: adding ``beta * C_old`` into
    the existing buffer is the executor's job; this returns the product only.
    """
    a, b = _prep(a, b)
    if transpose == "TN" and a.ndim > 2 and b.ndim > 2:
        return _scaled(_rows(a).T @ _rows(b), alpha)
    if transpose[0] == "N" and a.ndim > 2 and b.ndim == 2:  # x @ op(W): one product over all rows
        product = _rows(a) @ _op(b, transpose[1])
        return _scaled(product.reshape(*a.shape[:-1], product.shape[-1]), alpha)
    return _scaled(_op(a, transpose[0]) @ _op(b, transpose[1]), alpha)


def _scaled(product: np.ndarray, alpha: float) -> np.ndarray:
    """``alpha * product``, in place, and no pass at all for the common ``alpha = 1``."""
    if alpha != 1.0:
        product *= product.dtype.type(alpha)
    return product


def batched_matmul(a, b, *, transpose="NN", accumulate=False, alpha=1.0):
    """C[b] = alpha * op(A[b]) @ op(B[b]) over leading dims; a matrix B broadcasts (no accumulation here)."""
    a, b = _prep(a, b)
    return _scaled(_op(a, transpose[0]) @ _op(b, transpose[1]), alpha)


def _activate(pre: np.ndarray, activation: str) -> np.ndarray:
    """A GEMM epilogue's activation of ``pre`` (GELU in its tanh form, as cuBLASLt's)."""
    if activation == "relu":
        return np.maximum(pre, 0)
    if activation == "gelu":
        return _gelu(pre, True)
    return pre


def linear_bias_act(x, weight, bias, *, transpose="NT", activation="none", alpha=1.0):
    """(out, pre): ``pre = alpha * x @ op(weight) + bias`` (the matmul, then the bias_add) and
    ``out = activation(pre)`` (none, relu, or the tanh GELU): one GEMM with a bias epilogue."""
    pre = bias_add(matmul(x, weight, transpose=transpose, alpha=alpha), bias)
    return _activate(pre, activation), pre


def gemm_epilogue(name: str, pre: np.ndarray, a: np.ndarray, b: np.ndarray, bias: np.ndarray | None,
                  aux: np.ndarray | None, mode: str) -> np.ndarray:
    """cuBLASLt's epilogue ``name`` (``mdsl.sched``'s EPILOGUES) on the GEMM result ``pre``: the
    bias it reads, the pre-activation it saves in ``aux`` (``*_aux*``), the activation, the GELU
    gradient through ``aux`` (``dgelu*``) and the bias gradients it writes into ``bias``
    (``*bgrad*``: row sums of op(A), column sums of op(B) or of the result). Returns C."""
    if name == "bias" or name.endswith("_bias"):
        pre = pre + bias.reshape(-1).astype(pre.dtype)
    if "_aux" in name:
        np.copyto(aux, pre, casting="unsafe")
    if name.startswith(("relu", "gelu")):
        return _activate(pre, name.split("_")[0])
    if name.startswith("dgelu"):
        pre = gelu_backward(pre, aux, approximate=True)
        if name == "dgelu_bgrad":
            np.copyto(bias.reshape(-1), pre.reshape(-1, pre.shape[-1]).sum(axis=0), casting="unsafe")
        return pre
    if name in ("bgrada", "bgradb"):
        np.copyto(bias.reshape(-1), _operand_sums(name, a, b, mode), casting="unsafe")
    return pre


def _operand_sums(name: str, a: np.ndarray, b: np.ndarray, mode: str) -> np.ndarray:
    """``bgrada``: the row sums of op(A) [M, K] (M values); ``bgradb``: the column sums of
    op(B) [K, N] (N values); summed over a batch as well."""
    first = name == "bgrada"
    matrix = _op(a if first else b, mode[0] if first else mode[1])
    sums = matrix.astype(np.float32).sum(axis=-1 if first else -2)
    return sums.reshape(-1, sums.shape[-1]).sum(axis=0)


def gemm(a, b, c, bias=None, aux=None, *, transpose="NN", alpha=1.0, beta=0.0, epilogue="none", scale_b=None):
    """``mdsl.sched.gemm`` in place: ``C = epilogue(alpha * op(A) @ op(B) + beta * C)``, writing
    ``aux`` and a bias gradient where the epilogue does. What both executors run on the CPU.
    A ``C`` with leading dims is a batched GEMM (``TN`` transposes each matrix, as
    ``batched_matmul``); a matrix ``C`` from stacked ``TN`` operands contracts their rows (``matmul``).
    With ``scale_b``, B holds fp8 values and B is their :func:`dequantize` in A's dtype."""
    if scale_b is not None:
        b = dequantize(b, scale_b).astype(np.asarray(a).dtype)
    batched = c.ndim > 2 and np.ndim(a) > 2 and np.ndim(b) > 2
    product = (batched_matmul if batched else matmul)(a, b, transpose=transpose, alpha=alpha)
    pre = product + beta * c.astype(product.dtype) if beta else product
    if epilogue != "none":
        pre = gemm_epilogue(epilogue, pre, a, b, bias, aux, transpose)
    np.copyto(c, pre, casting="unsafe")


def grouped_gemm(input, weights, offsets, *, transpose="TN"):
    """out[o_g:o_g+1] = input_g @ op(W_g); rows outside every group 0.

    The letters are the spec's (6.1.3): the first transposes the weights (``T``: W ``[G, N, K]``,
    ``N``: ``[G, K, N]``), the second the input (``N``: ``[tokens, K]``, ``T``: ``[K, tokens]``).
    """
    x, w = _prep(input, weights)
    x = _op(x, transpose[1])
    w = _op(w, transpose[0])
    out = np.zeros((x.shape[0], w.shape[2]), dtype=x.dtype)
    for g, (lo, hi) in enumerate(_groups(offsets)):
        out[lo:hi] = x[lo:hi] @ w[g]
    return out


def grouped_gemm_weight_grad(input, d_output, offsets):
    """d_weights[g] = d_output_g^T @ input_g ([G, N, K], the weight gradient of TN grouped_gemm)."""
    x, dy = _prep(input, d_output)
    groups = _groups(offsets)
    dw = np.zeros((len(groups), dy.shape[1], x.shape[1]), dtype=x.dtype)
    for g, (lo, hi) in enumerate(groups):
        dw[g] = dy[lo:hi].T @ x[lo:hi]
    return dw


# ----------------------------------------------------------------------------
# 6.2 Normalization
# ----------------------------------------------------------------------------


def _rms_rstd(x: np.ndarray, eps: float) -> np.ndarray:
    return 1.0 / np.sqrt(np.mean(x * x, axis=-1) + eps)


def _rmsnorm_dx(d_y, x, weight, rstd):
    """d_x of y = x * rstd * w: rstd * g - x * rstd^3 * mean(g * x), g = d_y * w."""
    g = d_y * weight
    r = rstd[..., None]
    return r * g - x * r**3 * np.mean(g * x, axis=-1, keepdims=True)


def _rmsnorm_dw(d_y, x, rstd):
    return np.sum(_rows(d_y * x * rstd[..., None]), axis=0)


def rmsnorm(x, weight, *, eps=1e-6):
    """y = x / sqrt(mean(x^2) + eps) * weight; rstd = 1 / sqrt(mean(x^2) + eps)."""
    x, weight = _prep(x, weight)
    rstd = _rms_rstd(x, eps)
    return x * rstd[..., None] * weight, rstd


def rmsnorm_backward(d_y, x, weight, rstd):
    """(d_x, d_weight) of rmsnorm, from the saved rstd."""
    d_y, x, weight, rstd = _prep(d_y, x, weight, rstd)
    return _rmsnorm_dx(d_y, x, weight, rstd), _rmsnorm_dw(d_y, x, rstd)


def fused_residual_rmsnorm(residual, input, weight, *, eps=1e-6):
    """residual_out = residual + input; (y, rstd) = rmsnorm(residual_out, weight)."""
    residual, input, weight = _prep(residual, input, weight)
    residual_out = residual + input
    y, rstd = rmsnorm(residual_out, weight, eps=eps)
    return residual_out, y, rstd


def fused_residual_rmsnorm_backward(d_y, d_residual_next, residual_out, weight, rstd):
    """d_residual = d_input = d_residual_next + d_x of rmsnorm; d_weight of rmsnorm."""
    d_y, d_next, r, weight, rstd = _prep(d_y, d_residual_next, residual_out, weight, rstd)
    d = d_next + _rmsnorm_dx(d_y, r, weight, rstd)
    return d, d.copy(), _rmsnorm_dw(d_y, r, rstd)


def layernorm(x, weight, bias=None, *, eps=1e-5):
    """y = (x - mean) * rstd * weight (+ bias), rstd = 1 / sqrt(biased var + eps)."""
    x, weight, bias = _prep(x, weight, bias)
    mean = np.mean(x, axis=-1)
    xc = x - mean[..., None]
    rstd = 1.0 / np.sqrt(np.mean(xc * xc, axis=-1) + eps)
    y = xc * rstd[..., None] * weight
    return (y if bias is None else y + bias), mean, rstd


def layernorm_backward(d_y, x, weight, mean, rstd):
    """d_x = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = d_y * w; d_weight; d_bias = sum(d_y)."""
    d_y, x, weight, mean, rstd = _prep(d_y, x, weight, mean, rstd)
    xhat = (x - mean[..., None]) * rstd[..., None]
    g = d_y * weight
    d_x = rstd[..., None] * (g - np.mean(g, -1, keepdims=True) - xhat * np.mean(g * xhat, -1, keepdims=True))
    return d_x, np.sum(_rows(d_y * xhat), axis=0), np.sum(_rows(d_y), axis=0)


# ----------------------------------------------------------------------------
# 6.3 Activations
# ----------------------------------------------------------------------------

_GELU_C = math.sqrt(2.0 / math.pi)


def _silu(x):
    return x * _sigmoid(x)


def _silu_grad(x):
    s = _sigmoid(x)
    return s * (1.0 + x * (1.0 - s))


def _gelu(x, approximate):
    if approximate:
        return 0.5 * x * (1.0 + np.tanh(_GELU_C * (x + 0.044715 * x**3)))
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def _gelu_grad(x, approximate):
    if approximate:
        t = np.tanh(_GELU_C * (x + 0.044715 * x**3))
        return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * _GELU_C * (1.0 + 3 * 0.044715 * x * x)
    cdf = 0.5 * (1.0 + _erf(x / math.sqrt(2.0)))
    return cdf + x * np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)


def swiglu(gate, up):
    """silu(gate) * up."""
    gate, up = _prep(gate, up)
    return _silu(gate) * up


def swiglu_backward(d_out, gate, up):
    """d_gate = d_out * up * silu'(gate); d_up = d_out * silu(gate)."""
    d_out, gate, up = _prep(d_out, gate, up)
    return d_out * up * _silu_grad(gate), d_out * _silu(gate)


def geglu(gate, up):
    """gelu(gate) * up = gate * Phi(gate) * up with the exact (erf) GELU (spec 6.3.2)."""
    gate, up = _prep(gate, up)
    return _gelu(gate, False) * up


def geglu_backward(d_out, gate, up):
    """d_gate = d_out * up * gelu'(gate); d_up = d_out * gelu(gate) (exact GELU)."""
    d_out, gate, up = _prep(d_out, gate, up)
    return d_out * up * _gelu_grad(gate, False), d_out * _gelu(gate, False)


def _halves(gate_up):
    """(gate, up): the two halves of the last dim of a packed gate/up projection (views)."""
    width = np.shape(gate_up)[-1] // 2
    return gate_up[..., :width], gate_up[..., width:]


def fused_split_swiglu(gate_up):
    """swiglu of the two halves of ``gate_up`` (the unfused split then swiglu, bit for bit)."""
    return swiglu(*_halves(gate_up))


def fused_split_swiglu_backward(d_out, gate_up):
    """The gradients of both halves, packed along the last dim as ``gate_up`` is."""
    return np.concatenate(swiglu_backward(d_out, *_halves(gate_up)), axis=-1)


def fused_split_geglu(gate_up):
    """geglu (exact GELU) of the two halves of ``gate_up``."""
    return geglu(*_halves(gate_up))


def fused_split_geglu_backward(d_out, gate_up):
    """The gradients of both halves, packed along the last dim as ``gate_up`` is."""
    return np.concatenate(geglu_backward(d_out, *_halves(gate_up)), axis=-1)


def silu(x):
    """x * sigmoid(x)."""
    (x,) = _prep(x)
    return _silu(x)


def silu_backward(d_out, x):
    """d_out * sigmoid(x) * (1 + x * (1 - sigmoid(x)))."""
    d_out, x = _prep(d_out, x)
    return d_out * _silu_grad(x)


def relu(x):
    """max(x, 0)."""
    (x,) = _prep(x)
    return np.maximum(x, 0)


def relu_backward(d_out, x):
    """d_out * (x > 0) (zero gradient at x = 0, as PyTorch)."""
    d_out, x = _prep(d_out, x)
    return np.where(x > 0, d_out, 0).astype(d_out.dtype)


def relu2(x):
    """max(x, 0)^2."""
    (x,) = _prep(x)
    return np.maximum(x, 0) ** 2


def relu2_backward(d_out, x):
    """d_out * 2 * max(x, 0)."""
    d_out, x = _prep(d_out, x)
    return d_out * 2 * np.maximum(x, 0)


def gelu(x, *, approximate=True):
    """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), or x * Phi(x) (erf) when not approximate."""
    (x,) = _prep(x)
    return _gelu(x, approximate)


def gelu_backward(d_out, x, *, approximate=True):
    """d_out * gelu'(x) of the same variant."""
    d_out, x = _prep(d_out, x)
    return d_out * _gelu_grad(x, approximate)


def softmax(x, *, dim=-1):
    """exp(x - max) / sum(exp(x - max)) along dim."""
    (x,) = _prep(x)
    return _softmax(x, dim)


def softmax_backward(d_out, out, *, dim=-1):
    """out * (d_out - sum(d_out * out, dim))."""
    d_out, out = _prep(d_out, out)
    return out * (d_out - np.sum(d_out * out, axis=dim, keepdims=True))


# ----------------------------------------------------------------------------
# 6.4 Attention
# ----------------------------------------------------------------------------


def _attention_allowed(tq: int, tk: int, causal: bool, window_size: int | None) -> np.ndarray:
    """[Tq, Tk] mask of the keys each query sees; queries are the last Tq positions."""
    i = np.arange(tq)[:, None] + (tk - tq)
    j = np.arange(tk)[None, :]
    allowed = (j <= i) if causal else np.ones((tq, tk), dtype=bool)
    if window_size is not None:
        allowed &= (i - j < window_size) if causal else (np.abs(i - j) < window_size)
    return allowed


def _expand_kv(t: np.ndarray, hq: int) -> np.ndarray:
    """[B, Hkv, T, D] -> [B, Hq, T, D]: query head h reads kv head h // (Hq // Hkv) (HF repeat_kv)."""
    return np.repeat(t, hq // t.shape[1], axis=1)


def _reduce_kv(t: np.ndarray, hkv: int) -> np.ndarray:
    """[B, Hq, T, D] -> [B, Hkv, T, D], summing the query heads of each group."""
    b, hq = t.shape[:2]
    return t.reshape(b, hkv, hq // hkv, *t.shape[2:]).sum(axis=2)


def _heads_first(layout: str, *arrays):
    """``[B, T, H, D]`` arrays of ``layout = "bthd"`` as contiguous ``[B, H, T, D]`` (the same values
    in the order of the ``bhtd`` computation, so both layouts round alike); ``bhtd`` ones unchanged."""
    if layout not in ("bhtd", "bthd"):
        raise ValueError(f"attention layout '{layout}' (bhtd or bthd)")
    if layout == "bhtd":
        return arrays
    return tuple(None if a is None else np.ascontiguousarray(np.swapaxes(a, 1, 2)) for a in arrays)


def _same_segment(segments, tq: int) -> np.ndarray | bool:
    """[B, 1, Tq, Tk] mask of the keys of the query's own segment (``segments [B, Tk]``: the keys' ids;
    the queries', those of the last Tq keys); True without segments."""
    if segments is None:
        return True
    ids = np.asarray(segments)
    return (ids[:, ids.shape[1] - tq:, None] == ids[:, None, :])[:, None]


def _attention_scores(q, k, alibi_slopes, causal, softmax_scale, window_size, softcap=0.0, segments=None):
    """scale * q k^T (softcapped: c * tanh(. / c) with ``softcap`` c > 0) (+ ALiBi), masked keys at
    -inf (those of other segments too): [B, Hq, Tq, Tk]."""
    tq, tk, d = q.shape[2], k.shape[2], q.shape[3]
    scale = 1.0 / math.sqrt(d) if softmax_scale is None else softmax_scale
    s = scale * (q @ np.swapaxes(_expand_kv(k, q.shape[1]), -1, -2))
    if softcap:
        s = softcap * np.tanh(s / softcap)  # HF Gemma 2: before the mask (and flash-attn: before ALiBi)
    if alibi_slopes is not None:
        dist = np.abs(np.arange(tq)[:, None] + (tk - tq) - np.arange(tk)[None, :]).astype(s.dtype)
        s = s - alibi_slopes.reshape(1, -1, 1, 1).astype(s.dtype) * dist  # in s's dtype, not promoted to fp64
    allowed = _attention_allowed(tq, tk, causal, window_size) & _same_segment(segments, tq)
    return np.where(allowed, s, -np.inf), scale


def flash_attention(q, k, v, alibi_slopes=None, segments=None, *, causal=True, softmax_scale=None, window_size=None,
                    layout="bhtd", softcap=0.0):
    """out = softmax(scale q k^T + mask) v, lse = logsumexp of the masked scores (GQA by head groups).

    q [B, Hq, Tq, D], k/v [B, Hkv, Tk, D]; query i sits at position i + Tk - Tq.
    causal: key j <= i. window_size w: causal keys with i - w < j (HF Mistral);
    non-causal keys with |i - j| < w (flash-attn's symmetric window).
    ALiBi adds -slope_h * |i - j| (flash-attn). softmax_scale defaults to 1/sqrt(D).
    ``layout = "bthd"``: q, k, v and out are [B, T, H, D]; lse is [B, Hq, Tq] in both layouts.
    ``softcap`` c > 0 caps the scaled scores to c * tanh(s / c) before the mask (Gemma 2's
    attn_logit_softcapping); 0 is none.
    ``segments`` [B, Tk] (integers): the example id of each key of packed rows (a query's, its
    position's): query i sees key j only where their ids are equal (with ``causal``: a
    block-diagonal causal mask; every query sees itself).
    """
    q, k, v, alibi_slopes = _prep(q, k, v, alibi_slopes)
    q, k, v = _heads_first(layout, q, k, v)
    s, _ = _attention_scores(q, k, alibi_slopes, causal, softmax_scale, window_size, softcap, segments)
    lse = _logsumexp(s, axis=-1)
    p = np.exp(s - lse[..., None])
    (out,) = _heads_first(layout, p @ _expand_kv(v, q.shape[1]))
    return out, lse


def kv_cache_attention(q, k, v, k_cache, v_cache, position, *, causal=True, softmax_scale=None, window_size=None,
                       layout="bhtd", softcap=0.0):
    """Attention of the queries at positions p .. p+T-1 (p = ``position[0]``) over a KV cache.

    Writes k and v ([B, Hkv, T, D]) into the caches ([B, Hkv, capacity, D]) at p .. p+T-1,
    then returns ``flash_attention(q, cache[:p+T])`` as (out, lse) and the two caches,
    updated in place (a schedule-level kernel: decoding without growing arrays).
    ``layout = "bthd"``: q, k, v and out are [B, T, H, D]; the caches stay [B, Hkv, capacity, D].
    """
    q, k, v = _heads_first(layout, q, k, v)
    start = int(np.asarray(position).reshape(-1)[0])
    end = start + k.shape[-2]
    if end > k_cache.shape[-2]:
        raise ValueError(f"positions {start}..{end - 1} exceed the cache capacity {k_cache.shape[-2]}")
    k_cache[..., start:end, :] = k
    v_cache[..., start:end, :] = v
    out, lse = flash_attention(q, k_cache[..., :end, :], v_cache[..., :end, :], causal=causal,
                               softmax_scale=softmax_scale, window_size=window_size, softcap=softcap)
    (out,) = _heads_first(layout, out)
    return out, lse, k_cache, v_cache


def flash_attention_backward(d_out, q, k, v, out, lse, alibi_slopes=None, segments=None, *, causal=True,
                             softmax_scale=None, window_size=None, layout="bhtd", softcap=0.0):
    """(d_q, d_k, d_v) of flash_attention, from the saved out and lse.

    P = exp(S - lse); dV = P^T dO; dS = P * (dO V^T - rowsum(dO * O)); dQ = scale dS K; dK = scale dS^T Q;
    d_k and d_v sum the query heads of each kv group. ALiBi only shifts S (the slopes get no gradient).
    With ``softcap`` c, S = c * tanh(s / c) of the scaled scores s, so dS is multiplied by
    1 - tanh(s / c)^2 = 1 - (S / c)^2 before the scale. ``segments`` mask as the forward's (no gradient).
    """
    d_out, q, k, v, out, lse, alibi_slopes = _prep(d_out, q, k, v, out, lse, alibi_slopes)
    d_out, q, k, v, out = _heads_first(layout, d_out, q, k, v, out)
    hkv = k.shape[1]
    s, scale = _attention_scores(q, k, alibi_slopes, causal, softmax_scale, window_size, softcap, segments)
    p = np.exp(s - lse[..., None])
    d_v = np.swapaxes(p, -1, -2) @ d_out
    d_p = d_out @ np.swapaxes(_expand_kv(v, q.shape[1]), -1, -2)
    d_s = p * (d_p - np.sum(d_out * out, axis=-1, keepdims=True))
    if softcap:
        raw, _ = _attention_scores(q, k, None, False, softmax_scale, None)
        d_s = d_s * (1.0 - np.square(np.tanh(raw / softcap)))  # masked keys have p = 0, so d_s = 0 there
    d_q = scale * (d_s @ _expand_kv(k, q.shape[1]))
    d_k = scale * (np.swapaxes(d_s, -1, -2) @ q)
    return _heads_first(layout, d_q, _reduce_kv(d_k, hkv), _reduce_kv(d_v, hkv))


def _rotate(x, cos, sin, interleaved):
    """Rotate pairs of the last dim by the angles whose cos/sin are [T, D/2]."""
    if interleaved:
        x1, x2 = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = x1 * cos - x2 * sin
        out[..., 1::2] = x2 * cos + x1 * sin
        return out
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def rope(q, k, freqs, *, interleaved=False, layout="bhtd"):
    """Rotate q and k ([B, H, T, D]) by freqs [T, D/2, 2] = (cos, sin) per position and pair, or by
    freqs [B, T, D/2, 2], a table per row (packed rows: each token at its own position).

    Pairs are (x[i], x[i + D/2]) (HF rotate_half) or, interleaved, (x[2i], x[2i+1]) (GPT-J):
    (a, b) -> (a cos - b sin, b cos + a sin). ``layout = "bthd"``: q and k are [B, T, H, D].
    """
    q, k, freqs = _prep(q, k, freqs)
    cos, sin = _position_angles(freqs, 1.0, layout)
    return _rotate(q, cos, sin, interleaved), _rotate(k, cos, sin, interleaved)


def _position_angles(freqs, sign, layout):
    """cos and sign * sin of freqs, broadcast over the heads: [T, D/2] (bhtd) or [T, 1, D/2] (bthd);
    a table per row [B, T, D/2, 2] gives [B, 1, T, D/2] (bhtd) or [B, T, 1, D/2] (bthd)."""
    if layout not in ("bhtd", "bthd"):
        raise ValueError(f"rope layout '{layout}' (bhtd or bthd)")
    cos, sin = freqs[..., 0], sign * freqs[..., 1]
    heads = -2 if layout == "bthd" else -3  # where the heads axis goes
    if freqs.ndim == 4 or layout == "bthd":
        return np.expand_dims(cos, heads), np.expand_dims(sin, heads)
    return cos, sin


def rope_backward(d_q_rot, d_k_rot, freqs, *, interleaved=False, layout="bhtd"):
    """The inverse rotation (sin negated) of the incoming gradients."""
    d_q, d_k, freqs = _prep(d_q_rot, d_k_rot, freqs)
    cos, sin = _position_angles(freqs, -1.0, layout)
    return _rotate(d_q, cos, sin, interleaved), _rotate(d_k, cos, sin, interleaved)


def qk_norm(q, k, q_weight, k_weight, *, eps=1e-6):
    """RMSNorm of every q and k head vector over D: (q_norm, k_norm, q_rstd, k_rstd)."""
    q, k, q_weight, k_weight = _prep(q, k, q_weight, k_weight)
    q_norm, q_rstd = rmsnorm(q, q_weight, eps=eps)
    k_norm, k_rstd = rmsnorm(k, k_weight, eps=eps)
    return q_norm, k_norm, q_rstd, k_rstd


def qk_norm_backward(d_q_norm, d_k_norm, q, k, q_weight, k_weight, q_rstd, k_rstd):
    """rmsnorm_backward of q and of k: (d_q, d_k, d_q_weight, d_k_weight)."""
    d_q_norm, d_k_norm, q, k, q_weight, k_weight, q_rstd, k_rstd = _prep(
        d_q_norm, d_k_norm, q, k, q_weight, k_weight, q_rstd, k_rstd)
    d_q, d_qw = rmsnorm_backward(d_q_norm, q, q_weight, q_rstd)
    d_k, d_kw = rmsnorm_backward(d_k_norm, k, k_weight, k_rstd)
    return d_q, d_k, d_qw, d_kw


def fused_qk_norm_rope(q, k, q_weight, k_weight, freqs, *, eps=1e-6, interleaved=False, layout="bhtd"):
    """qk_norm then rope (mdsl-fuse ``qk_norm_rope``): (q_rot, k_rot, q_rstd, k_rstd). The normed q and
    k stay in the compute dtype between the two (the unfused pair rounds them to their dtype)."""
    q, k, q_weight, k_weight, freqs = _prep(q, k, q_weight, k_weight, freqs)
    q_norm, k_norm, q_rstd, k_rstd = qk_norm(q, k, q_weight, k_weight, eps=eps)
    q_rot, k_rot = rope(q_norm, k_norm, freqs, interleaved=interleaved, layout=layout)
    return q_rot, k_rot, q_rstd, k_rstd


def fused_qk_norm_rope_backward(d_q_rot, d_k_rot, q, k, q_weight, k_weight, q_rstd, k_rstd, freqs, *,
                                interleaved=False, layout="bhtd"):
    """rope_backward then qk_norm_backward: (d_q, d_k, d_q_weight, d_k_weight)."""
    d_q_rot, d_k_rot, q, k, q_weight, k_weight, q_rstd, k_rstd, freqs = _prep(
        d_q_rot, d_k_rot, q, k, q_weight, k_weight, q_rstd, k_rstd, freqs)
    d_q_norm, d_k_norm = rope_backward(d_q_rot, d_k_rot, freqs, interleaved=interleaved, layout=layout)
    return qk_norm_backward(d_q_norm, d_k_norm, q, k, q_weight, k_weight, q_rstd, k_rstd)


# ----------------------------------------------------------------------------
# 6.5 Tensor manipulation
# ----------------------------------------------------------------------------


def split(x, *, sizes, dim=-1):
    """Consecutive chunks of x along dim with the given sizes (a tuple, one array per size)."""
    (x,) = _prep(x)
    cuts = list(itertools.accumulate(int(s) for s in sizes))[:-1]
    return tuple(part.copy() for part in np.split(x, cuts, axis=dim))


def concat(*inputs, dim=-1):
    """The inputs concatenated along dim."""
    return np.concatenate(_prep(*inputs), axis=dim)


def view(x, *, shape):
    """x reshaped to shape (one -1 allowed)."""
    (x,) = _prep(x)
    return x.reshape(tuple(shape)).copy()


def transpose(x, *, dim0, dim1):
    """x with dims dim0 and dim1 swapped."""
    (x,) = _prep(x)
    return np.ascontiguousarray(np.swapaxes(x, dim0, dim1))


def permute(x, *, dims):
    """Result dim i is input dim dims[i]."""
    (x,) = _prep(x)
    return np.ascontiguousarray(np.transpose(x, tuple(dims)))


def contiguous(x):
    """A contiguous copy of x."""
    (x,) = _prep(x)
    return np.array(x, copy=True, order="C")


# ----------------------------------------------------------------------------
# 6.6 Elementwise, 6.7 reductions
# ----------------------------------------------------------------------------


def add(a, b):
    """a + b with NumPy broadcasting."""
    a, b = _prep(a, b)
    return a + b


def mul(a, b):
    """a * b with NumPy broadcasting."""
    a, b = _prep(a, b)
    return a * b


def _sum_to(grad: np.ndarray, shape: Sequence[int]) -> np.ndarray:
    """``grad`` summed over the dims broadcasting added (leading) or stretched (size 1) to ``shape``."""
    shape = tuple(shape)
    lead = grad.ndim - len(shape)
    stretched = tuple(lead + i for i, d in enumerate(shape) if d == 1 and grad.shape[lead + i] != 1)
    return grad.sum(axis=tuple(range(lead)) + stretched).reshape(shape)


def add_backward(d_out, *, shapes):
    """(d_a, d_b) of c = a + b: d_out summed back to each operand's shape (``shapes``: of a and b)."""
    (d_out,) = _prep(d_out)
    a_shape, b_shape = shapes
    return _sum_to(d_out, a_shape), _sum_to(d_out, b_shape)


def mul_backward(d_out, a, b):
    """(d_a, d_b) of c = a * b: d_out * b and d_out * a, summed back to the shapes of a and b."""
    d_out, a, b = _prep(d_out, a, b)
    return _sum_to(d_out * b, a.shape), _sum_to(d_out * a, b.shape)


def bias_add(x, bias):
    """x + bias, bias [N] along the last dim of x [*, N]."""
    x, bias = _prep(x, bias)
    return x + bias


def scale(x, *, factor):
    """x * factor."""
    (x,) = _prep(x)
    return x * factor


def add_scalar(x, *, value):
    """x + value."""
    (x,) = _prep(x)
    return x + x.dtype.type(value)


def dropout(x, step=None, *, p=0.5, seed=0, offset=0, training=False, layers=()):
    """x * mask / (1 - p) in training, the mask drawn from (seed, offset, layers, the step counter,
    element index) by :mod:`modeldsl.kernels.dropout_mask` (so a recompute and the backward draw it
    again); x itself outside training or with p = 0. ``step`` is the int64 ``[1]`` counter (None:
    0); ``layers`` the layer indices of the layer loops around the launch, which the executors
    give. Its gradient is the same op on the upstream gradient."""
    (x,) = _prep(x)
    if not dropout_mask.active(p, training):
        return x.copy()
    key = dropout_mask.key(seed, offset, layers, dropout_mask.step_of(step))
    keep = dropout_mask.keep_mask(x.size, p, key).reshape(x.shape)
    return np.where(keep, x * x.dtype.type(1.0 / (1.0 - p)), x.dtype.type(0))


def causal_mask(x, *, offset=0, window_size=None, fill="neg_inf"):
    """x [*, Tq, Tk] with key j of query i set to ``fill`` (-inf or 0) where j > i + offset, or
    with a window w where j <= i + offset - w."""
    (x,) = _prep(x)
    i = np.arange(x.shape[-2])[:, None] + offset
    j = np.arange(x.shape[-1])[None, :]
    masked = j > i if window_size is None else (j > i) | (j <= i - window_size)
    return np.where(masked, x.dtype.type(-np.inf if fill == "neg_inf" else 0.0), x)


def sub(a, b):
    """a - b with NumPy broadcasting."""
    a, b = _prep(a, b)
    return a - b


def div(a, b):
    """a / b with NumPy broadcasting."""
    a, b = _prep(a, b)
    return a / b


def exp(x):
    """exp(x)."""
    (x,) = _prep(x)
    return np.exp(x)


def log(x):
    """log(x)."""
    (x,) = _prep(x)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.log(x)


def tanh(x):
    """tanh(x)."""
    (x,) = _prep(x)
    return np.tanh(x)


def sigmoid(x):
    """1 / (1 + exp(-x)), without overflow for large |x|."""
    (x,) = _prep(x)
    return _sigmoid(x)


def rsqrt(x):
    """1 / sqrt(x)."""
    (x,) = _prep(x)
    return x.dtype.type(1) / np.sqrt(x)


def add3(a, b, c):
    """a + b + c."""
    a, b, c = _prep(a, b, c)
    return a + b + c


def reduce_sum(x, *, dims, keepdim=False):
    """Sum over dims (NumPy axes of the concrete array)."""
    (x,) = _prep(x)
    return np.asarray(np.sum(x, axis=tuple(dims), keepdims=keepdim))


def reduce_mean(x, *, dims, keepdim=False):
    """Mean over dims (NumPy axes of the concrete array)."""
    (x,) = _prep(x)
    return np.asarray(np.mean(x, axis=tuple(dims), keepdims=keepdim))


def reduce_max(x, *, dim, keepdim=False):
    """(max over dim, int32 index of the first maximum)."""
    (x,) = _prep(x)
    values = np.max(x, axis=dim, keepdims=keepdim)
    indices = np.argmax(x, axis=dim, keepdims=keepdim).astype(np.int32)
    return np.asarray(values), np.asarray(indices)


def reduce_max_backward(d_values, indices, *, dim, keepdim=False, shape):
    """d_x: d_values at the indices reduce_max returned along dim, 0 elsewhere.

    ``shape`` is the shape of x (the operands do not carry the size of dim).
    """
    (d_values,) = _prep(d_values)
    axis = dim % len(shape)
    idx = np.asarray(indices).astype(np.intp)
    if not keepdim:
        d_values, idx = np.expand_dims(d_values, axis), np.expand_dims(idx, axis)
    d_x = np.zeros(tuple(shape), dtype=d_values.dtype)
    np.put_along_axis(d_x, idx, d_values, axis=axis)
    return d_x


# ----------------------------------------------------------------------------
# 6.8 Embedding
# ----------------------------------------------------------------------------


def embedding(indices, weight):
    """weight[indices]: ([*], [V, D]) -> [*, D]."""
    (weight,) = _prep(weight)
    return weight[np.asarray(indices)]


def embedding_backward(d_out, indices, *, shape=None):
    """d_weight[v] = sum of d_out rows whose index is v.

    ``shape`` is the ``[V, D]`` shape of d_weight (the operands do not carry
    V); without it V is ``max(indices) + 1``.
    """
    (d_out,) = _prep(d_out)
    idx = np.asarray(indices).reshape(-1)
    rows = tuple(shape) if shape is not None else (int(idx.max()) + 1 if idx.size else 0, d_out.shape[-1])
    d_weight = np.zeros(rows, dtype=d_out.dtype)
    np.add.at(d_weight, idx, _rows(d_out))
    return d_weight


# ----------------------------------------------------------------------------
# 6.9 MoE
# ----------------------------------------------------------------------------


def _router_scores(x, gate, use_sigmoid):
    logits = x @ gate.T
    return _sigmoid(logits) if use_sigmoid else _softmax(logits)


def _router_probs(scores, use_sigmoid):
    """Scores as a distribution over experts (sigmoid scores renormalized, DeepSeek)."""
    return scores / np.sum(scores, axis=-1, keepdims=True) if use_sigmoid else scores


def _expert_fractions(indices, num_experts):
    """f_e = (top-k assignments to expert e) / tokens (HF load_balancing_loss_func)."""
    counts = np.bincount(np.asarray(indices).reshape(-1), minlength=num_experts)
    return counts / np.asarray(indices).shape[0]


def moe_router(x, gate, *, top_k, normalize=True, aux_loss_coef=0.01, use_sigmoid=False):
    """scores = softmax (or sigmoid) of x gate^T; top_k experts by score; weights = their scores
    (renormalized to sum 1 if normalize); aux_loss = coef * E * sum_e f_e * P_e.

    f_e counts top-k assignments per token (HF Mixtral/Qwen-MoE ``load_balancing_loss_func``,
    not divided by top_k); P_e is the mean routing probability (sigmoid scores renormalized
    over experts). Indices are in descending score order (torch.topk), int32.
    """
    x, gate = _prep(x, gate)
    scores = _router_scores(x, gate, use_sigmoid)
    indices = np.argsort(-scores, axis=-1, kind="stable")[:, :top_k]
    weights = np.take_along_axis(scores, indices, axis=-1)
    if normalize:
        weights = weights / np.sum(weights, axis=-1, keepdims=True)
    probs = _router_probs(scores, use_sigmoid)
    aux = aux_loss_coef * gate.shape[0] * np.sum(_expert_fractions(indices, gate.shape[0]) * probs.mean(axis=0))
    return weights, indices.astype(np.int32), _scalar(aux, x.dtype)


def _router_d_scores_from_weights(d_weights, scores, indices, normalize):
    sel = np.take_along_axis(scores, indices, axis=-1)
    d_sel = d_weights
    if normalize:
        total = np.sum(sel, axis=-1, keepdims=True)
        d_sel = (d_weights - np.sum(d_weights * sel / total, axis=-1, keepdims=True)) / total
    d_scores = np.zeros_like(scores)
    np.put_along_axis(d_scores, indices, d_sel, axis=-1)
    return d_scores


def _router_d_scores_from_aux(scores, indices, aux_loss_coef, use_sigmoid):
    n, e = scores.shape
    d_probs = np.broadcast_to(aux_loss_coef * e * _expert_fractions(indices, e) / n, scores.shape)
    if not use_sigmoid:
        return d_probs
    total = np.sum(scores, axis=-1, keepdims=True)
    return (d_probs - np.sum(d_probs * scores / total, axis=-1, keepdims=True)) / total


def moe_router_backward(d_weights, x, gate, indices, *, normalize=True, aux_loss_coef=0.01, use_sigmoid=False):
    """(d_x, d_gate) of sum(d_weights * weights) + aux_loss (aux_loss enters the loss with
    gradient 1; set aux_loss_coef=0 for the weights alone); indices are constants."""
    d_weights, x, gate = _prep(d_weights, x, gate)
    idx = np.asarray(indices).astype(np.int64)
    scores = _router_scores(x, gate, use_sigmoid)
    d_scores = _router_d_scores_from_weights(d_weights, scores, idx, normalize)
    d_scores = d_scores + _router_d_scores_from_aux(scores, idx, aux_loss_coef, use_sigmoid)
    if use_sigmoid:
        d_logits = d_scores * scores * (1.0 - scores)
    else:
        d_logits = scores * (d_scores - np.sum(d_scores * scores, axis=-1, keepdims=True))
    return d_logits @ gate, d_logits.T @ x


def moe_compute_offsets(indices, *, num_experts):
    """offsets[e] = the number of (token, k) assignments to experts below e; offsets[E] = N * top_k.
    An index outside [0, num_experts) is a ValueError (the router never gives one)."""
    flat = np.asarray(indices).reshape(-1).astype(np.int64)
    if flat.size and (flat.min() < 0 or flat.max() >= num_experts):
        raise ValueError(f"moe_compute_offsets: expert index {int(flat.min() if flat.min() < 0 else flat.max())} "
                         f"is outside [0, {num_experts})")
    counts = np.bincount(flat, minlength=num_experts)
    return np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)


def moe_permute(x, indices, expert_offsets):
    """Token copies grouped by expert: the assignment a = n*top_k + k of token n to expert
    e = indices[n, k] goes to row offsets[e] + (its rank among e's assignments, in a order).

    Returns (permuted [N*top_k, C], scatter_indices [N*top_k] int32) with
    scatter_indices[a] = the permuted row of assignment a (Surogate's convention).
    """
    (x,) = _prep(x)
    n, top_k = np.asarray(indices).shape
    flat = np.asarray(indices).reshape(-1).astype(np.int64)
    order = np.argsort(flat, kind="stable")
    first = np.searchsorted(flat[order], flat[order], side="left")
    rank = np.arange(flat.size) - first
    scatter = np.empty(flat.size, dtype=np.int64)
    scatter[order] = np.asarray(expert_offsets).astype(np.int64)[flat[order]] + rank
    permuted = np.zeros((flat.size, x.shape[1]), dtype=x.dtype)
    permuted[scatter] = x[np.arange(flat.size) // top_k]
    return permuted, scatter.astype(np.int32)


def _gather_expert_rows(expert_outputs, scatter_indices, n, top_k):
    return expert_outputs[np.asarray(scatter_indices).reshape(n, top_k)]


def moe_unpermute(expert_outputs, weights, scatter_indices):
    """combined[n] = sum_k weights[n, k] * expert_outputs[scatter_indices[n*top_k + k]]."""
    eo, w = _prep(expert_outputs, weights)
    rows = _gather_expert_rows(eo, scatter_indices, *w.shape)
    return np.einsum("nk,nkc->nc", w, rows)


def moe_unpermute_backward(d_combined, expert_outputs, weights, scatter_indices):
    """d_expert_outputs[s(n,k)] = weights[n,k] d_combined[n]; d_weights[n,k] = <d_combined[n], eo[s(n,k)]>."""
    dc, eo, w = _prep(d_combined, expert_outputs, weights)
    n, top_k = w.shape
    rows = _gather_expert_rows(eo, scatter_indices, n, top_k)
    d_eo = np.zeros_like(eo)
    np.add.at(d_eo, np.asarray(scatter_indices).reshape(-1), (w[..., None] * dc[:, None, :]).reshape(n * top_k, -1))
    return d_eo, np.einsum("nc,nkc->nk", dc, rows)


# ----------------------------------------------------------------------------
# 6.10 Mamba
# ----------------------------------------------------------------------------


def _conv_padded(x, conv_state, kernel_size):
    """[state or zeros (K-1 steps), x] along time: [B, D, T + K - 1]."""
    b, d, _ = x.shape
    prefix = conv_state if conv_state is not None else np.zeros((b, d, kernel_size - 1), dtype=x.dtype)
    return np.concatenate([prefix.astype(x.dtype), x], axis=-1)


def _conv_pre(xp, weight, bias, steps, kernel_size):
    """pre[b, d, t] = bias[d] + sum_k weight[d, 0, k] * xp[b, d, t + k]."""
    pre = sum(weight[None, :, 0, k, None] * xp[..., k : k + steps] for k in range(kernel_size))
    return pre if bias is None else pre + bias[None, :, None]


def mamba_conv1d(x, weight, bias=None, conv_state=None, *, kernel_size=4, activation="silu"):
    """Causal depthwise conv over time, y[t] = act(bias + sum_k w[k] x[t - K + 1 + k]) (x [B, D, T]).

    Steps before t = 0 come from conv_state (zeros without one), as causal-conv1d.
    Returns y, or (y, conv_state_out = the last K-1 steps of [state, x]) when a conv_state is given
    (the op has the conv_state_out result exactly then).
    """
    x, weight, bias, conv_state = _prep(x, weight, bias, conv_state)
    xp = _conv_padded(x, conv_state, kernel_size)
    pre = _conv_pre(xp, weight, bias, x.shape[-1], kernel_size)
    y = _silu(pre) if activation == "silu" else pre
    return y if conv_state is None else (y, xp[..., x.shape[-1] :].copy())


def mamba_conv1d_backward(d_y, x, weight, bias=None, *, kernel_size=4, activation="silu"):
    """(d_x, d_weight, d_bias) of mamba_conv1d with a zero initial state; (d_x, d_weight) without a bias."""
    d_y, x, weight, bias = _prep(d_y, x, weight, bias)
    steps = x.shape[-1]
    xp = _conv_padded(x, None, kernel_size)
    pre = _conv_pre(xp, weight, bias, steps, kernel_size)
    d_pre = d_y * _silu_grad(pre) if activation == "silu" else d_y
    d_xp = np.zeros_like(xp)
    d_w = np.zeros_like(weight)
    for k in range(kernel_size):
        d_xp[..., k : k + steps] += weight[None, :, 0, k, None] * d_pre
        d_w[:, 0, k] = np.sum(d_pre * xp[..., k : k + steps], axis=(0, 2))
    d_x = d_xp[..., kernel_size - 1 :]
    return (d_x, d_w) if bias is None else (d_x, d_w, np.sum(d_pre, axis=(0, 2)))


def _expand_groups(t, channels):
    """[B, G, N, T] -> [B, D, N, T]: channel d reads group d // (D // G) (mamba_ssm)."""
    return np.repeat(t, channels // t.shape[1], axis=1)


def _reduce_groups(t, groups):
    b, d = t.shape[:2]
    return t.reshape(b, groups, d // groups, *t.shape[2:]).sum(axis=2)


def _scan_setup(u, delta, a_log, b_proj, c_proj, dt_bias):
    dt = _softplus(delta + dt_bias[None, :, None])
    a = -np.exp(a_log)
    return dt, a, _expand_groups(b_proj, u.shape[1]), _expand_groups(c_proj, u.shape[1])


def _scan_states(u, dt, a, bd, h0):
    """h[t] = exp(dt[t] A) h[t-1] + dt[t] B[t] u[t], all steps: [B, D, T, N]."""
    states = np.empty((*u.shape, a.shape[1]), dtype=u.dtype)
    h = h0
    for t in range(u.shape[-1]):
        h = np.exp(dt[..., t, None] * a) * h + (dt[..., t] * u[..., t])[..., None] * bd[..., t]
        states[:, :, t] = h
    return states


def _initial_state(u, n, ssm_state):
    return np.zeros((*u.shape[:2], n), dtype=u.dtype) if ssm_state is None else ssm_state


def mamba_selective_scan(u, delta, a_log, b_proj, c_proj, d_skip, dt_bias, ssm_state=None, *, chunk_size=256):
    """Selective scan (mamba_ssm, delta_softplus=True): dt = softplus(delta + dt_bias), A = -exp(a_log),
    h[t] = exp(dt[t] A) h[t-1] + dt[t] B[t] u[t], y[t] = C[t] . h[t] + D u[t].

    u, delta [B, D, T]; a_log [D, N]; b_proj, c_proj [B, G, N, T] (channel d uses group
    d // (D/G)); h[-1] = ssm_state or 0. Returns (y, ssm_state_out = h[T-1]).
    chunk_size only tiles the kernel; the result does not depend on it.
    """
    y, states = _scan_outputs(*_prep(u, delta, a_log, b_proj, c_proj, d_skip, dt_bias, ssm_state))
    return y, states[:, :, -1].copy()


def _scan_outputs(u, delta, a_log, b_proj, c_proj, d_skip, dt_bias, ssm_state):
    """y and the state after every step ([B, D, T, N]) of the selective scan from ssm_state (or 0)."""
    dt, a, bd, cd = _scan_setup(u, delta, a_log, b_proj, c_proj, dt_bias)
    states = _scan_states(u, dt, a, bd, _initial_state(u, a.shape[1], ssm_state))
    # C[t] . h[t] summed over the states of each (batch, channel, step) alone: the same bits in any batch
    y = np.sum(states * np.swapaxes(cd, -1, -2), axis=-1) + d_skip[None, :, None] * u
    return y, states


def mamba_selective_scan_backward(d_y, u, delta, a_log, b_proj, c_proj, d_skip, dt_bias, ssm_state, y, *,
                                  chunk_size=256):
    """Gradients of sum(d_y * y) of mamba_selective_scan w.r.t. (u, delta, a_log, b_proj, c_proj, d_skip,
    dt_bias), by reverse recurrence over the recomputed states (y itself is not needed)."""
    d_y, u, delta, a_log, b_proj, c_proj, d_skip, dt_bias, ssm_state = _prep(
        d_y, u, delta, a_log, b_proj, c_proj, d_skip, dt_bias, ssm_state)
    dt, a, bd, cd = _scan_setup(u, delta, a_log, b_proj, c_proj, dt_bias)
    h0 = _initial_state(u, a.shape[1], ssm_state)
    states = _scan_states(u, dt, a, bd, h0)
    d_u = d_y * d_skip[None, :, None]
    d_dt, d_a = np.zeros_like(dt), np.zeros_like(a)
    d_bd, d_cd = np.zeros_like(bd), np.zeros_like(cd)
    dh = np.zeros_like(h0)
    for t in reversed(range(u.shape[-1])):
        h_prev = states[:, :, t - 1] if t > 0 else h0
        d_cd[..., t] = d_y[..., t, None] * states[:, :, t]
        dh = dh + d_y[..., t, None] * cd[..., t]
        decay = np.exp(dt[..., t, None] * a)
        d_exponent = dh * h_prev * decay
        dh_b = np.sum(dh * bd[..., t], axis=-1)
        d_dt[..., t] = np.sum(d_exponent * a, axis=-1) + dh_b * u[..., t]
        d_a += np.sum(d_exponent * dt[..., t, None], axis=0)
        d_bd[..., t] = dh * (dt[..., t] * u[..., t])[..., None]
        d_u[..., t] += dh_b * dt[..., t]
        dh = dh * decay
    d_delta = d_dt * _sigmoid(delta + dt_bias[None, :, None])
    groups = b_proj.shape[1]
    return (d_u, d_delta, d_a * a, _reduce_groups(d_bd, groups), _reduce_groups(d_cd, groups),
            np.sum(d_y * u, axis=(0, 2)), np.sum(d_delta, axis=(0, 2)))


def _decode_steps(position, valid, steps):
    """(start, count): the run starts at position ``start`` (0: a fresh sequence, the carried state
    is zero), and its first ``count`` of ``steps`` steps are real (the rest pad a shape bucket)."""
    start = int(np.asarray(position).reshape(-1)[0])
    count = int(np.asarray(valid).reshape(-1)[0])
    if not 0 < count <= steps:
        raise ValueError(f"{count} real steps of a run of {steps}")
    return start, count


def mamba_conv1d_step(x, weight, conv_state, position, valid, bias=None, *, kernel_size=4, activation="silu"):
    """mamba_conv1d of the steps at ``position[0]`` .. over a carried state (decoding).

    ``conv_state [B, D, K-1]`` holds the K-1 inputs before the run (taken as zeros at position 0);
    it is updated in place to the K-1 inputs before step ``valid[0]`` of the run (the steps after
    it pad a shape bucket and leave no trace). Returns (y, conv_state)."""
    x, weight, bias = _prep(x, weight, bias)
    start, count = _decode_steps(position, valid, x.shape[-1])
    carried = conv_state if start > 0 else np.zeros_like(conv_state)
    y, _ = mamba_conv1d(x, weight, bias, carried, kernel_size=kernel_size, activation=activation)
    conv_state[...] = _conv_padded(x[..., :count], carried, kernel_size)[..., count:]
    return y, conv_state


def mamba_selective_scan_step(u, delta, a_log, b_proj, c_proj, d_skip, dt_bias, ssm_state, position, valid, *,
                              chunk_size=256):
    """mamba_selective_scan of the steps at ``position[0]`` .. from a carried state (decoding).

    ``ssm_state [B, D, N]`` is h before the run (zeros at position 0); it is updated in place to
    h after step ``valid[0]`` of the run (the steps after it pad a shape bucket). Returns (y, ssm_state)."""
    args = _prep(u, delta, a_log, b_proj, c_proj, d_skip, dt_bias)
    start, count = _decode_steps(position, valid, args[0].shape[-1])
    y, states = _scan_outputs(*args, ssm_state.astype(args[0].dtype) if start > 0 else None)
    ssm_state[...] = states[:, :, count - 1]
    return y, ssm_state


# ----------------------------------------------------------------------------
# 6.11 Utility
# ----------------------------------------------------------------------------


def zeros(*, shape, dtype=ml_dtypes.bfloat16):
    """A tensor of zeros."""
    return np.zeros(tuple(shape), dtype=dtype)


def ones(*, shape, dtype=ml_dtypes.bfloat16):
    """A tensor of ones."""
    return np.ones(tuple(shape), dtype=dtype)


def fill(*, shape, value, dtype=ml_dtypes.bfloat16):
    """A tensor filled with value."""
    return np.full(tuple(shape), value, dtype=dtype)


def copy(x):
    """A copy of x."""
    (x,) = _prep(x)
    return np.array(x, copy=True)


def _is_narrow_float(dtype: np.dtype) -> bool:
    """fp16 and the ml_dtypes floats (bf16, fp8, fp4): the floats narrower than float32."""
    return dtype == np.float16 or (dtype.kind == "V" and dtype.type.__module__.startswith("ml_dtypes"))


def cast(x, *, dtype):
    """x converted to dtype, rounding to nearest even as PyTorch does: float64 to a float
    narrower than float32 rounds to float32 first (PyTorch's bf16 and fp16 take a float), so the
    result does not depend on how a numpy or ml_dtypes version rounds float64 directly."""
    x = np.asarray(x)
    target = np.dtype(dtype)
    if x.dtype == np.float64 and _is_narrow_float(target):
        x = x.astype(np.float32)
    return x.astype(target)


# ----------------------------------------------------------------------------
# Quantization (precision recipes)
# ----------------------------------------------------------------------------


def quantize(w, *, dtype=ml_dtypes.float8_e4m3fn) -> tuple[np.ndarray, np.ndarray]:
    """``(q, scale)`` of ``w [*, N]`` in the fp8 ``dtype``, one fp32 scale per row (per output
    channel of a weight ``[out, in]``): ``scale = max|w[row]| / F`` (``F`` the largest finite value
    of ``dtype``: 448 for e4m3, 57344 for e5m2; a row of zeros gets scale 1) and
    ``q = w / scale`` rounded to nearest even in ``dtype``, saturating at ``+-F``. Computed in
    float32 (a float64 ``w`` is rounded to float32 first). No op computes it yet: the loader
    quantizes the frozen weights of ``mdsl-quantize-frozen`` with it, once, and
    :func:`dequantize` is its inverse up to the rounding of ``q`` (a relative error up to
    ``2^-4`` per value in e4m3, which keeps 3 mantissa bits)."""
    target = np.dtype(dtype)
    top = np.float32(ml_dtypes.finfo(target).max)
    w = np.asarray(w)
    w = w if w.dtype == np.float32 else w.astype(np.float32)
    amax = np.max(np.abs(w), axis=-1) if w.shape[-1] else np.zeros(w.shape[:-1], np.float32)
    scale = np.where(amax > 0, amax / top, np.float32(1)).astype(np.float32)
    with np.errstate(invalid="ignore"):  # a NaN or infinite row (the loader warns of it: W011)
        q = np.clip(w / scale[..., None], -top, top).astype(target)
    return q, scale


def dequantize(q, scale):
    """``q * scale[..., None]``: values stored in fp8 (``q [*, N]``) times their row's scale
    (``scale [*]``), in float32 (float64 when ``scale`` is; the caller casts to the result dtype).
    The fp8 values widen exactly, so a float32 result is one correctly rounded product each."""
    q, scale = _prep(q, scale)
    return q * scale[..., None]


# ----------------------------------------------------------------------------
# Losses
# ----------------------------------------------------------------------------


def _reduce_loss(per_row, valid, reduction):
    if reduction == "none":
        return per_row
    total = np.sum(per_row)
    if reduction == "sum":
        return _scalar(total, per_row.dtype)
    with np.errstate(invalid="ignore", divide="ignore"):
        return _scalar(total / np.sum(valid), per_row.dtype)


def _row_grad_scale(d_loss, valid, reduction):
    """d loss / d per_row_loss, zero on ignored rows ([N])."""
    scale = np.broadcast_to(d_loss, valid.shape) * valid
    if reduction == "mean":
        with np.errstate(invalid="ignore", divide="ignore"):
            scale = scale / scale.dtype.type(np.sum(valid))  # the count in the loss's dtype, as a kernel divides
    return scale


def cross_entropy(logits, labels, *, ignore_index=-100, reduction="mean"):
    """per-row loss = lse(logits) - logits[label] (0 where label == ignore_index), reduced by
    mean over counted rows (NaN when none, as PyTorch), sum or none; lse per row."""
    (logits,) = _prep(logits)
    labels = np.asarray(labels)
    lse = _logsumexp(logits, axis=-1)
    valid = labels != ignore_index
    picked = np.take_along_axis(logits, np.where(valid, labels, 0)[:, None].astype(np.int64), axis=-1)[:, 0]
    per_row = np.where(valid, lse - picked, 0).astype(logits.dtype)
    return _reduce_loss(per_row, valid, reduction), lse


def cross_entropy_backward(d_loss, logits, labels, lse, *, ignore_index=-100, reduction="mean"):
    """d_logits = (exp(logits - lse) - onehot(label)) * d(loss)/d(row loss); 0 on ignored rows."""
    d_loss, logits, lse = _prep(d_loss, logits, lse)
    labels = np.asarray(labels)
    valid = labels != ignore_index
    grad = np.exp(logits - lse[:, None])
    rows = np.nonzero(valid)[0]
    grad[rows, labels[rows]] -= 1.0
    return grad * _row_grad_scale(d_loss, valid, reduction)[:, None]


def row_chunks(rows: int, chunk: int) -> list[slice]:
    """The row ranges of ``rows`` rows taken ``chunk`` at a time (0: all at once)."""
    step = chunk if chunk > 0 else max(rows, 1)
    return [slice(start, min(start + step, rows)) for start in range(0, rows, step)]


def chunk_logits(x, weight, rows, storage):
    """``x[rows] @ weight^T``, rounded to x's storage dtype (as a GEMM writes them, fused or not)."""
    return (x[rows] @ weight.T).astype(storage).astype(x.dtype)


def fused_lm_head_loss(x, weight, labels, *, ignore_index=-100, reduction="mean", compute_accuracy=False, chunk=0):
    """cross_entropy(x @ weight^T, labels), the logits (in x's dtype) computed ``chunk`` rows at a
    time and never all held; compute_accuracy has no result here and is ignored."""
    storage = np.asarray(x).dtype
    x, weight = _prep(x, weight)
    labels = np.asarray(labels)
    valid = labels != ignore_index
    per_row = np.zeros(x.shape[0], dtype=x.dtype)
    lse = np.zeros(x.shape[0], dtype=x.dtype)
    for rows in row_chunks(x.shape[0], chunk):
        per_row[rows], lse[rows] = cross_entropy(chunk_logits(x, weight, rows, storage), labels[rows],
                                                 ignore_index=ignore_index, reduction="none")
    return _reduce_loss(per_row, valid, reduction), lse


def fused_lm_head_loss_backward(d_loss, x, weight, labels, lse, *, ignore_index=-100, reduction="mean", chunk=0):
    """d_logits of cross_entropy at x @ weight^T, one chunk of rows at a time, rounded to x's storage dtype
    (as the unfused graph stores it): d_x[rows] = d_logits @ weight, d_weight = sum over the chunks of
    d_logits^T @ x[rows]."""
    storage = np.asarray(x).dtype
    d_loss, x, weight, lse = _prep(d_loss, x, weight, lse)
    labels = np.asarray(labels)
    scale = _row_grad_scale(d_loss, labels != ignore_index, reduction)
    d_x = np.zeros_like(x)
    d_weight = np.zeros_like(weight)
    for rows in row_chunks(x.shape[0], chunk):
        _chunk_grads(chunk_logits(x, weight, rows, storage), x, weight, labels, lse[rows], scale, rows, storage,
                     ignore_index, d_x, d_weight)
    return d_x, d_weight


def _chunk_grads(logits, x, weight, labels, lse_rows, scale, rows, storage, ignore_index, d_x, d_weight):
    """One chunk's d_logits from its ``logits``, rounded to x's storage dtype (as the unfused graph
    stores it), into ``d_x[rows]`` and added to ``d_weight``."""
    d_logits = cross_entropy_backward(np.ones((), x.dtype), logits, labels[rows], lse_rows,
                                      ignore_index=ignore_index, reduction="none") * scale[rows, None]
    d_logits = d_logits.astype(storage).astype(x.dtype)  # the GEMMs read it as x is stored (as unfused)
    d_x[rows] = d_logits @ weight
    d_weight += d_logits.T @ x[rows]


def fused_lm_head_loss_grad(d_loss, x, weight, labels, *, ignore_index=-100, reduction="mean", chunk=0):
    """fused_lm_head_loss and its backward in one pass: each chunk's logits computed once give the
    chunk's per-row losses and lse, then its gradients (the mean's count is known up front); the
    loss is fused_lm_head_loss's, d_x and d_weight fused_lm_head_loss_backward's."""
    storage = np.asarray(x).dtype
    d_loss, x, weight = _prep(d_loss, x, weight)
    labels = np.asarray(labels)
    valid = labels != ignore_index
    scale = _row_grad_scale(d_loss, valid, reduction)
    per_row = np.zeros(x.shape[0], dtype=x.dtype)
    d_x, d_weight = np.zeros_like(x), np.zeros_like(weight)
    for rows in row_chunks(x.shape[0], chunk):
        logits = chunk_logits(x, weight, rows, storage)
        per_row[rows], lse = cross_entropy(logits, labels[rows], ignore_index=ignore_index, reduction="none")
        _chunk_grads(logits, x, weight, labels, lse, scale, rows, storage, ignore_index, d_x, d_weight)
    return _reduce_loss(per_row, valid, reduction), d_x, d_weight


# ----------------------------------------------------------------------------
# The registry
# ----------------------------------------------------------------------------

# ----------------------------------------------------------------------------
# Optimizer (schedule-level kernels: they update their state in place)
# ----------------------------------------------------------------------------


def adamw(param, grad, exp_avg, exp_avg_sq, lr, step, grad_scale=None, *, beta1=0.9, beta2=0.999, eps=1e-8,
          weight_decay=0.01, lr_scale=1.0):
    """One AdamW step (decoupled weight decay, bias correction), in the order of
    torch.optim.AdamW's single-tensor update; updates param, exp_avg and exp_avg_sq
    in place and returns them. ``lr`` (the step's scheduled rate, scaled here by the
    parameter's ``lr_scale``), ``step`` (1-based, for the bias correction) and the
    optional ``grad_scale`` (the clipping factor the gradient is multiplied by) are
    scalars or one-element arrays, as the schedule passes runtime values."""
    dtype = exp_avg.dtype.type
    lr = float(np.asarray(lr).reshape(-1)[0]) * lr_scale
    step = float(np.asarray(step).reshape(-1)[0])
    g = np.asarray(grad, dtype=exp_avg.dtype)
    if grad_scale is not None:
        g = g * dtype(np.asarray(grad_scale).reshape(-1)[0])
    param *= param.dtype.type(1 - lr * weight_decay)
    exp_avg += (g - exp_avg) * dtype(1 - beta1)
    exp_avg_sq *= dtype(beta2)
    exp_avg_sq += dtype(1 - beta2) * g * g
    step_size = lr / (1 - beta1 ** step)
    denom = np.sqrt(exp_avg_sq) / dtype(math.sqrt(1 - beta2 ** step)) + dtype(eps)
    param -= (exp_avg / denom * dtype(step_size)).astype(param.dtype)
    return param, exp_avg, exp_avg_sq


def global_norm(*grads, squared=False, plus=0):
    """The L2 norm of all the gradients together (fp32 accumulation; float64 when fed float64).
    ``plus=K``: the last K inputs are sums of squares already (other ranks' shares, summed), added
    to the total; ``squared``: the sum of squares itself, not its root (a share to sum over ranks)."""
    grads = _prep(*grads)
    count = len(grads) - plus
    total = sum(np.sum(np.square(g)) for g in grads[:count])
    for extra in grads[count:]:
        total = total + extra.reshape(())
    total = np.asarray(total, dtype=grads[0].dtype)
    return total if squared else np.sqrt(total)


def clip_factor(norm, *, max_norm):
    """What gradients with global norm ``norm`` are multiplied by so their norm is at most
    ``max_norm`` (torch.nn.utils.clip_grad_norm_'s rule: ``min(1, max_norm / (norm + 1e-6))``)."""
    norm = np.asarray(norm)
    return np.minimum(np.asarray(1.0, norm.dtype), np.asarray(max_norm, norm.dtype) / (norm + norm.dtype.type(1e-6)))


def clip_norm(x, *, max_norm):
    """``x`` rescaled so its L2 norm is at most ``max_norm``: what ``mdsl-lower-to-sched`` makes of it,
    :func:`global_norm`, :func:`clip_factor` (torch's ``clip_grad_norm_`` rule), the factor cast to
    ``x``'s dtype, and :func:`mul`."""
    x = np.asarray(x)
    factor = clip_factor(global_norm(x), max_norm=max_norm)
    return mul(x, cast(factor, dtype=x.dtype))



# ----------------------------------------------------------------------------
# Collectives (a group of one rank: the executors send larger groups through the process's communicator)
# ----------------------------------------------------------------------------


def _one_rank(name: str, size: int) -> None:
    if size != 1:
        raise ValueError(f"{name} over {size} ranks runs through the process's communicator, not a reference")


def all_reduce(x, *, group="world", size=1, op="sum"):
    """The reduction of one rank's value: the value."""
    _one_rank("all_reduce", size)
    return np.array(x, copy=True)


def all_gather(x, *, group="world", size=1, dim=0):
    _one_rank("all_gather", size)
    return np.array(x, copy=True)


def reduce_scatter(x, *, group="world", size=1, dim=0, op="sum"):
    _one_rank("reduce_scatter", size)
    return np.array(x, copy=True)


REFERENCES: dict[str, Callable[..., np.ndarray | tuple[np.ndarray, ...]]] = {
    fn.__name__: fn
    for fn in (
        matmul, batched_matmul, grouped_gemm, grouped_gemm_weight_grad, linear_bias_act,
        rmsnorm, rmsnorm_backward, fused_residual_rmsnorm, fused_residual_rmsnorm_backward,
        layernorm, layernorm_backward,
        swiglu, swiglu_backward, geglu, geglu_backward, silu, silu_backward,
        fused_split_swiglu, fused_split_swiglu_backward, fused_split_geglu, fused_split_geglu_backward,
        relu, relu_backward, relu2, relu2_backward, gelu, gelu_backward,
        softmax, softmax_backward,
        flash_attention, flash_attention_backward, kv_cache_attention, rope, rope_backward, qk_norm, qk_norm_backward,
        fused_qk_norm_rope, fused_qk_norm_rope_backward,
        split, concat, view, transpose, permute, contiguous,
        add, add_backward, mul, mul_backward, bias_add, scale, clip_norm, add3,
        add_scalar, causal_mask, dropout, sub, div, exp, log, tanh, sigmoid, rsqrt,
        reduce_sum, reduce_mean, reduce_max, reduce_max_backward,
        embedding, embedding_backward,
        moe_router, moe_router_backward, moe_compute_offsets, moe_permute, moe_unpermute, moe_unpermute_backward,
        mamba_conv1d, mamba_conv1d_backward, mamba_selective_scan, mamba_selective_scan_backward,
        mamba_conv1d_step, mamba_selective_scan_step,
        zeros, ones, fill, copy, cast, dequantize, adamw, global_norm, clip_factor,
        cross_entropy, cross_entropy_backward, fused_lm_head_loss, fused_lm_head_loss_backward,
        fused_lm_head_loss_grad, all_reduce, all_gather, reduce_scatter,
    )
}


def reference(name: str) -> Callable[..., np.ndarray | tuple[np.ndarray, ...]]:
    """The numpy reference of primitive ``name``; KeyError for an unknown name."""
    try:
        return REFERENCES[name]
    except KeyError:
        raise KeyError(f"no numpy reference for primitive '{name}' (known: {', '.join(sorted(REFERENCES))})") from None
