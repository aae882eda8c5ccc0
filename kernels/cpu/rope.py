"""CPU kernels of RoPE, both directions: the pairs of q and k rotated in tiles of positions.

q and k are seen as ``[B, T, H, D]`` (a ``bhtd`` operand through a strided
view) and walked in tiles of (batch, positions) with the angles of those
positions broadcast over the heads; the pairs are the two halves of D (HF's
``rotate_half``) or its even and odd elements (``interleaved``). Each tile
reads both elements of a pair before it writes them, so an output may be its
input's buffer (the registry's in-place reuse). The operations are the
reference's, in its order: bitwise its results (the backward's negated sine
flips signs exactly).
"""

from __future__ import annotations

import numpy as np

from modeldsl.kernels.cpu.pool import Pool, carved_bytes, tile_rows
from modeldsl.kernels.cpu.tiles import Step, float_dtype


def _tokens_first(x: np.ndarray, layout: str) -> np.ndarray:
    return x.swapaxes(1, 2) if layout == "bhtd" else x


def _pairs(x: np.ndarray, interleaved: bool) -> tuple[np.ndarray, np.ndarray]:
    if interleaved:
        return x[..., 0::2], x[..., 1::2]
    half = x.shape[-1] // 2
    return x[..., :half], x[..., half:]


def _rotate_tile(x1, x2, cos, sin, out1, out2, t0, t1, inverse: bool) -> None:
    """``(x1 cos - x2 sin, x2 cos + x1 sin)`` (``inverse``: the sine negated) into (out1, out2)."""
    np.multiply(x1, cos, out=t0)
    np.multiply(x2, sin, out=t1)
    (np.add if inverse else np.subtract)(t0, t1, out=t0)
    np.multiply(x2, cos, out=t1)
    np.multiply(x1, sin, out=out2)
    (np.subtract if inverse else np.add)(t1, out2, out=out2)
    np.copyto(out1, t0)


def _rope(pool: Pool, outputs, inputs, params, inverse: bool) -> Step | None:
    (q_out, k_out), (q, k, freqs) = outputs, inputs
    layout, interleaved = params.get("layout", "bhtd"), params.get("interleaved", False)
    if layout not in ("bhtd", "bthd") or float_dtype(q_out, k_out, q, k, freqs) is None or q.ndim != 4:
        return None
    tensors = [(_tokens_first(x, layout), _tokens_first(out, layout)) for x, out in ((q, q_out), (k, k_out))]
    batch, tokens = tensors[0][0].shape[:2]
    if freqs.shape[0] != tokens or any(x.shape[:2] != (batch, tokens) for x, _ in tensors):
        return None
    cos, sin = freqs[..., 0], freqs[..., 1]
    per_position = max(x.shape[2] * x.shape[3] // 2 for x, _ in tensors)
    per_tile = tile_rows(per_position)
    pool.workspace.reserve(carved_bytes(q.dtype, [per_tile * per_position] * 2))

    def block(start: int, stop: int, thread: int) -> None:
        for item in range(start, stop):
            b, first = divmod(item, -(-tokens // per_tile))
            lo, hi = first * per_tile, min((first + 1) * per_tile, tokens)
            c, s = cos[lo:hi, None, :], sin[lo:hi, None, :]
            for x, out in tensors:
                shape = (hi - lo, x.shape[2], x.shape[3] // 2)
                t0, t1 = (t[:np.prod(shape)].reshape(shape) for t in
                          pool.workspace.carve(thread, q.dtype, [per_tile * per_position] * 2))
                _rotate_tile(*_pairs(x[b, lo:hi], interleaved), c, s, *_pairs(out[b, lo:hi], interleaved),
                             t0, t1, inverse)

    items = batch * -(-tokens // per_tile)
    work = q.size + k.size

    def step() -> None:
        pool.blocks(block, items, work)

    return step


def rope(pool: Pool, outputs, inputs, params) -> Step | None:
    return _rope(pool, outputs, inputs, params, inverse=False)


def rope_backward(pool: Pool, outputs, inputs, params) -> Step | None:
    return _rope(pool, outputs, inputs, params, inverse=True)


KERNELS = {"rope": rope, "rope_backward": rope_backward}
