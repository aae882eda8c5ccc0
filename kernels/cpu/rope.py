"""CPU kernels of RoPE, both directions: ``out = x C + swap(x) S`` over tiles of positions.

q and k are seen as ``[B, T, H, D]`` (a ``bhtd`` operand through a strided
view). A pair ``(a, b)`` (the two halves of D, HF's ``rotate_half``, or its
even and odd elements, ``interleaved``) turns into ``(a cos - b sin,
b cos + a sin)``. The kernel writes that as full-width products: ``C`` holds
each pair's cosine at both places, ``S`` its sine signed (``-sin`` at ``a``,
``+sin`` at ``b``; the backward's inverse rotation the other way round), and
``swap(x)`` exchanges the elements of each pair; so all but the swap are
passes over contiguous rows of D, not over the strided halves (numpy runs
those an order of magnitude slower per element). ``C`` and ``S`` are built once
per call, for the positions and the widest head count, on the calling thread (for
each row's positions where ``freqs`` is a table per row, ``[B, T, D/2, 2]``: packed
rows, each token at its own position).
``a cos + b (-sin)`` is ``a cos - b sin`` exactly, so the results are bitwise
the reference's; each tile reads all of ``x`` before it writes, so an output
may be its input's buffer (the registry's in-place reuse).

On the compiled path (``jit``, float32, C-contiguous operands) each token's
heads are one C loop of ``compiled.c`` (``rope_rows``); the fused QK-norm +
RoPE runs there as its two unfused compiled steps, so it keeps their bits.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from modeldsl.kernels.cpu import compiled, norm
from modeldsl.kernels.cpu.pool import Pool, carved_bytes, tile_rows
from modeldsl.kernels.cpu.tiles import Step, float_dtype, in_sequence


def _tokens_first(x: np.ndarray, layout: str) -> np.ndarray:
    return x.swapaxes(1, 2) if layout == "bhtd" else x


def _pairs(x: np.ndarray, interleaved: bool) -> tuple[np.ndarray, np.ndarray]:
    if interleaved:
        return x[..., 0::2], x[..., 1::2]
    half = x.shape[-1] // 2
    return x[..., :half], x[..., half:]


def _tensors(outputs, inputs, params) -> list[tuple[np.ndarray, np.ndarray]] | None:
    """``[(q, q_out), (k, k_out)]`` as ``[B, T, H, D]`` views, or None for operands no kernel here takes."""
    (q_out, k_out), (q, k, freqs) = outputs, inputs
    layout = params.get("layout", "bhtd")
    if layout not in ("bhtd", "bthd") or float_dtype(q_out, k_out, q, k, freqs) is None or q.ndim != 4:
        return None
    tensors = [(_tokens_first(x, layout), _tokens_first(out, layout)) for x, out in ((q, q_out), (k, k_out))]
    batch, tokens, _, depth = tensors[0][0].shape
    positions = (batch, tokens) if freqs.ndim == 4 else (tokens,)
    if freqs.ndim not in (3, 4) or freqs.shape[:-2] != positions or freqs.shape[-2:] != (depth // 2, 2) \
            or any(x.shape[:2] != (batch, tokens) or x.shape[3] != depth for x, _ in tensors):
        return None
    return tensors


def _rope(pool: Pool, outputs, inputs, params, inverse: bool, jit: bool = False) -> Step | None:
    fast = _jit_rope(pool, outputs, inputs, params, inverse) if jit else None
    tensors = _tensors(outputs, inputs, params) if fast is None else None
    if tensors is None or (inputs[2].ndim == 4 and not inputs[2].flags.c_contiguous):
        return fast  # a table per row is read through a flat view of its positions
    (q, k, freqs), interleaved = inputs, params.get("interleaved", False)
    batch, tokens, _, depth = tensors[0][0].shape
    heads = max(x.shape[2] for x, _ in tensors)
    dtype, width = q.dtype, heads * depth
    per_tile = tile_rows(width)
    rows = tokens * (batch if freqs.ndim == 4 else 1)  # the table's positions: every row's own, or shared
    angles = freqs.reshape(rows, depth // 2, 2)
    table = [rows * width] * 2
    tile = [per_tile * width] * 2
    pool.workspace.reserve(carved_bytes(dtype, table + tile))
    sign = 1 if inverse else -1  # the sine's sign at the first element of a pair

    def tables() -> tuple[np.ndarray, np.ndarray]:
        """``C`` and ``S`` ``[T, H, D]`` (``[B T, H, D]``: a table per row) of this call's angles, in
        thread 0's scratch."""
        c, s = (a.reshape(rows, heads, depth) for a in pool.workspace.carve(0, dtype, table))
        cos, sin = angles[:, None, :, 0], angles[:, None, :, 1]
        for half in _pairs(c, interleaved):
            np.copyto(half, cos)
        first, second = _pairs(s, interleaved)
        np.multiply(sin, sign, out=first)
        np.multiply(sin, -sign, out=second)
        return c, s

    def block(start: int, stop: int, thread: int, c: np.ndarray, s: np.ndarray) -> None:
        scratch = pool.workspace.carve(thread, dtype, table + tile)[2:]
        for item in range(start, stop):
            b, first = divmod(item, -(-tokens // per_tile))
            lo, hi = first * per_tile, min((first + 1) * per_tile, tokens)
            at = b * tokens if rows > tokens else 0  # the row's first position in the tables
            for x, out in tensors:
                shape = (hi - lo, x.shape[2], depth)
                cosine, swapped = (t[:np.prod(shape)].reshape(shape) for t in scratch)
                xs = x[b, lo:hi]
                np.multiply(xs, c[at + lo:at + hi, :shape[1]], out=cosine)
                for target, source in zip(_pairs(swapped, interleaved), reversed(_pairs(xs, interleaved))):
                    np.copyto(target, source)
                swapped *= s[at + lo:at + hi, :shape[1]]
                np.add(cosine, swapped, out=out[b, lo:hi])

    items = batch * -(-tokens // per_tile)
    work = q.size + k.size

    def step() -> None:
        c, s = tables()
        pool.blocks(lambda start, stop, thread: block(start, stop, thread, c, s), items, work)

    return step


def _jit_rope(pool: Pool, outputs, inputs, params, inverse: bool) -> Step | None:
    """The compiled rotation, the threads splitting the tokens, each rotating q's and k's heads (None:
    operands it does not take: not float32 and C-contiguous in their layout)."""
    (q_out, k_out), (q, k, freqs) = outputs, inputs
    if _tensors(outputs, inputs, params) is None or not compiled.takes(q, k, q_out, k_out, freqs) \
            or q.shape[-1] % 2 or freqs.shape[-2:] != (q.shape[-1] // 2, 2) \
            or not all(a.flags.c_contiguous for a in (q, k, q_out, k_out, freqs)):
        return None
    bthd, interleaved = params.get("layout", "bhtd") == "bthd", bool(params.get("interleaved", False))
    tokens = q.shape[0] * (q.shape[1] if bthd else q.shape[2])
    rotations = [compiled.bind_rope(x, out, freqs, bthd, interleaved, inverse) for x, out in ((q, q_out), (k, k_out))]

    def run(start: int, stop: int) -> None:
        for rotate in rotations:
            rotate(start, stop)

    return compiled.split_rows(pool, run, tokens, q.size + k.size)


def rope(pool: Pool, outputs, inputs, params, jit: bool = False) -> Step | None:
    return _rope(pool, outputs, inputs, params, inverse=False, jit=jit)


def rope_backward(pool: Pool, outputs, inputs, params, jit: bool = False) -> Step | None:
    return _rope(pool, outputs, inputs, params, inverse=True, jit=jit)


def fused_qk_norm_rope(pool: Pool, outputs, inputs, params) -> Step | None:
    """qk_norm then RoPE in place over the outputs, the compiled steps of the two unfused kernels: the
    fused program keeps the unfused one's bits."""
    (q_rot, k_rot, q_rstd, k_rstd), (q, k, q_weight, k_weight, freqs) = outputs, inputs
    normed = norm.qk_norm(pool, [q_rot, k_rot, q_rstd, k_rstd], [q, k, q_weight, k_weight], params)
    rotated = _jit_rope(pool, [q_rot, k_rot], [q_rot, k_rot, freqs], params, inverse=False)
    return in_sequence(normed, rotated)


def fused_qk_norm_rope_backward(pool: Pool, outputs, inputs, params) -> Step | None:
    """RoPE's backward into ``d_q``, ``d_k``, then qk_norm's backward over them in place."""
    (d_q, d_k, _, _), (d_q_rot, d_k_rot, q, k, q_weight, k_weight, q_rstd, k_rstd, freqs) = outputs, inputs
    rotated = _jit_rope(pool, [d_q, d_k], [d_q_rot, d_k_rot, freqs], params, inverse=True)
    normed = norm.qk_norm_backward(pool, outputs, [d_q, d_k, q, k, q_weight, k_weight, q_rstd, k_rstd], params)
    return in_sequence(rotated, normed)


KERNELS = {"rope": rope, "rope_backward": rope_backward}
JIT_KERNELS = {name: partial(fn, jit=True) for name, fn in KERNELS.items()}  # each token in one compiled loop
JIT_KERNELS.update(fused_qk_norm_rope=fused_qk_norm_rope, fused_qk_norm_rope_backward=fused_qk_norm_rope_backward)
