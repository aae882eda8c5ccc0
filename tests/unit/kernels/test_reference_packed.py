"""The numpy references on packed rows against PyTorch (float64): ``flash_attention`` and its backward
with segment ids (autograd through a block-diagonal causal mask, and SDPA with that mask), and
``rope``/``rope_backward`` with a table per row (HF's ``apply_rotary_pos_emb`` at each row's
``position_ids``)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from modeldsl.kernels.reference import REFERENCES

torch = pytest.importorskip("torch")
F = torch.nn.functional

RTOL, ATOL = 1e-9, 1e-10


def tt(a):
    return torch.tensor(np.asarray(a, dtype=np.float64), requires_grad=True)


def close(got, want) -> None:
    np.testing.assert_allclose(np.asarray(got), want.detach().numpy(), rtol=RTOL, atol=ATOL)


def packed_bias(segments: np.ndarray, tq: int, causal: bool, window: int | None) -> torch.Tensor:
    """[B, 1, Tq, Tk] additive mask: -inf where a key is in another example, in the future or out of
    the window (the queries are the last Tq keys)."""
    ids = torch.from_numpy(np.asarray(segments, dtype=np.int64))
    tk = ids.shape[1]
    i = torch.arange(tq)[:, None] + tk - tq
    j = torch.arange(tk)[None, :]
    allowed = (j <= i) if causal else torch.ones(tq, tk, dtype=torch.bool)
    if window is not None:
        allowed = allowed & ((i - j < window) if causal else ((i - j).abs() < window))
    allowed = allowed[None] & (ids[:, tk - tq:, None] == ids[:, None, :])
    return torch.zeros(allowed.shape, dtype=torch.float64).masked_fill(~allowed, -math.inf)[:, None]


def torch_attention(q, k, v, bias, softmax_scale=None, softcap=0.0):
    hq = q.shape[1]
    k, v = (t.repeat_interleave(hq // t.shape[1], dim=1) for t in (k, v))
    scale = 1.0 / math.sqrt(q.shape[-1]) if softmax_scale is None else softmax_scale
    s = scale * (q @ k.mT)
    if softcap:
        s = torch.tanh(s / softcap) * softcap
    s = s + bias
    return torch.softmax(s, -1) @ v, torch.logsumexp(s, -1)


# (B, Hq, Hkv, Tq, Tk, D, segments, params)
CASES = {
    "causal-two-examples": (1, 2, 2, 7, 7, 8, [[0, 0, 0, 1, 1, 1, 1]], {}),
    "gqa-three-examples": (2, 4, 2, 9, 9, 4, [[0, 0, 1, 1, 1, 2, 2, 2, 2], [0, 1, 2, 3, 3, 3, 3, 4, 4]], {}),
    "window-scale": (1, 2, 1, 9, 9, 4, [[0, 0, 0, 0, 0, 0, 1, 1, 1]], {"window_size": 3, "softmax_scale": 0.4}),
    "softcap": (1, 2, 2, 6, 6, 4, [[0, 0, 0, 1, 1, 1]], {"softcap": 0.8}),
    "noncausal-block-diagonal": (1, 2, 2, 6, 6, 4, [[0, 0, 1, 1, 1, 2]], {"causal": False}),
    "ids-in-no-order": (1, 2, 1, 6, 6, 4, [[1, 0, 1, 0, 2, 1]], {}),
    "decode-queries-last": (1, 2, 2, 3, 7, 4, [[0, 0, 0, 1, 1, 1, 1]], {}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_flash_attention_with_segments_is_torch_autograd(case):
    b, hq, hkv, tq, tk, d, segments, params = CASES[case]
    rng = np.random.default_rng(3)
    q, k, v, d_out = (rng.standard_normal(s) for s in ((b, hq, tq, d), (b, hkv, tk, d), (b, hkv, tk, d),
                                                        (b, hq, tq, d)))
    segments = np.asarray(segments, dtype=np.int32)
    torch_params = {n: params[n] for n in ("softmax_scale", "softcap") if n in params}
    bias = packed_bias(segments, tq, params.get("causal", True), params.get("window_size"))
    tq_, tk_, tv_ = tt(q), tt(k), tt(v)
    want_out, want_lse = torch_attention(tq_, tk_, tv_, bias, **torch_params)
    out, lse = REFERENCES["flash_attention"](q, k, v, None, segments, **params)
    close(out, want_out)
    close(lse, want_lse)
    want_out.backward(torch.from_numpy(d_out))
    grads = REFERENCES["flash_attention_backward"](d_out, q, k, v, out, lse, None, segments, **params)
    for got, want in zip(grads, (tq_.grad, tk_.grad, tv_.grad)):
        close(got, want)
    if not torch_params:  # and SDPA with the same mask
        sdpa = F.scaled_dot_product_attention(tt(q), tt(k), tt(v), attn_mask=bias, enable_gqa=True)
        close(out, sdpa)


@pytest.mark.parametrize("layout", ["bhtd", "bthd"])
def test_segments_in_the_bthd_layout(layout):
    b, hq, hkv, tq, tk, d, segments, params = CASES["gqa-three-examples"]
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal(s) for s in ((b, hq, tq, d), (b, hkv, tk, d), (b, hkv, tk, d)))
    out, lse = REFERENCES["flash_attention"](q, k, v, None, np.asarray(segments), **params)
    t_out, t_lse = REFERENCES["flash_attention"](*(x.swapaxes(1, 2) for x in (q, k, v)), None, np.asarray(segments),
                                                 layout="bthd", **params)
    np.testing.assert_array_equal(t_out.swapaxes(1, 2), out)
    np.testing.assert_array_equal(t_lse, lse)


@pytest.mark.parametrize("layout", ["bhtd", "bthd"])
@pytest.mark.parametrize("interleaved", [False, True])
def test_rope_with_a_table_per_row_is_hf_at_each_rows_positions(layout, interleaved):
    """Rows at their own positions (packed: restarting with each example): HF's apply_rotary_pos_emb with
    per-row position_ids (the half split), or the complex rotation (interleaved); backward by autograd."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    b, hq, hkv, t, d = 2, 4, 2, 7, 8
    positions = np.array([[0, 1, 2, 0, 1, 2, 3], [0, 1, 2, 3, 4, 0, 1]])
    inv = 1.0 / 10000 ** (np.arange(0, d, 2) / d)
    angles = positions[..., None] * inv  # [B, T, D/2]
    freqs = np.stack([np.cos(angles), np.sin(angles)], axis=-1)
    rng = np.random.default_rng(5)
    q, k, d_q, d_k = (rng.standard_normal(s) for s in ((b, hq, t, d), (b, hkv, t, d), (b, hq, t, d), (b, hkv, t, d)))
    tq_, tk_ = tt(q), tt(k)
    theta = torch.from_numpy(angles)
    if interleaved:
        rotation = torch.polar(torch.ones_like(theta), theta)[:, None]

        def rotate(x):
            return torch.view_as_real(torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2)) * rotation).flatten(-2)

        want = rotate(tq_), rotate(tk_)
    else:
        emb = torch.cat([theta, theta], dim=-1)  # [B, T, D]
        want = apply_rotary_pos_emb(tq_, tk_, emb.cos(), emb.sin(), unsqueeze_dim=1)
    swap = (lambda x: x.swapaxes(1, 2)) if layout == "bthd" else (lambda x: x)
    got = REFERENCES["rope"](swap(q), swap(k), freqs, interleaved=interleaved, layout=layout)
    for g, w in zip(got, want):
        close(swap(g), w)
    torch.autograd.backward(want, (torch.from_numpy(d_q), torch.from_numpy(d_k)))
    grads = REFERENCES["rope_backward"](swap(d_q), swap(d_k), freqs, interleaved=interleaved, layout=layout)
    for g, w in zip(grads, (tq_.grad, tk_.grad)):
        close(swap(g), w)
