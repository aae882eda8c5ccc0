"""CPU kernels of RMSNorm (plain and with the residual add), both directions.

Each thread takes a block of rows and walks it in tiles; the statistics of a
tile's rows (``rstd``, the mean of ``g x``) are written straight into the rstd
output or a per-thread scratch row vector. The forward keeps the reference's
order of operations, so its results are bitwise the reference's. The weight
gradient is a sum over all rows: each thread adds its tiles' column sums into
its own fp32 partial, and the partials are added in thread order after the
threads join (deterministic for a given thread count; the reference sums the
rows in one sweep, so the last bits may differ from it).

On the compiled path (``jit``, float32) each row is one C loop of ``compiled.c``
(``rmsnorm_rows``, ``rmsnorm_backward_rows``), and the QK-norm runs there too
(it has no numpy kernel: the reference runs it otherwise).
"""

from __future__ import annotations

from functools import partial

import numpy as np

from modeldsl.kernels.cpu import compiled
from modeldsl.kernels.cpu.pool import Pool, carved_bytes, row_tiles, tile_rows
from modeldsl.kernels.cpu.tiles import Step, as_rows, float_dtype, in_sequence


class RowBlocks:
    """The frame of a row kernel over ``[R, C]`` views: tiles, per-thread scratch (``temps`` tiles,
    ``vectors`` row vectors of a tile, ``columns`` column vectors); a thread's first column vectors
    may hold its column sums, added up in thread order after the threads join."""

    def __init__(self, pool: Pool, rows: list[np.ndarray], temps: int, vectors: int = 0, columns: int = 0):
        self.pool = pool
        self.rows, self.width = rows[0].shape
        self.dtype = rows[0].dtype
        self.per_tile = tile_rows(self.width)
        self.counts = [self.per_tile * self.width] * temps + [self.per_tile] * vectors + [self.width] * columns
        self.shape = (temps, vectors, columns)
        pool.workspace.reserve(carved_bytes(self.dtype, self.counts))

    def scratch(self, thread: int) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
        """(tile temporaries, row vectors, column vectors) in ``thread``'s buffer."""
        arrays = self.pool.workspace.carve(thread, self.dtype, self.counts)
        temps, vectors, _ = self.shape
        return arrays[:temps], arrays[temps:temps + vectors], arrays[temps + vectors:]

    def tiles(self, start: int, stop: int, temps: list[np.ndarray]):
        """``(lo, hi, tile temporaries shaped [hi - lo, C])`` over the rows ``[start, stop)``."""
        for lo, hi in row_tiles(start, stop, self.per_tile):
            yield lo, hi, [t[:(hi - lo) * self.width].reshape(hi - lo, self.width) for t in temps]

    def single_tile(self) -> bool:
        """Whether the rows are one tile that one thread runs (the pool would add only its cost)."""
        return self.rows <= self.per_tile and len(self.pool.split(self.rows, self.rows * self.width)) == 1

    def run(self, block, totals: tuple[np.ndarray, ...] = ()) -> None:
        """``block(start, stop, thread)`` over the rows; the threads' column sums into ``totals``."""
        ranges = self.pool.split(self.rows, self.rows * self.width)
        self.pool.run(block, ranges)
        for index, total in enumerate(totals):
            parts = [self.scratch(thread)[2][index] for thread in range(len(ranges))]
            np.copyto(total, parts[0], casting="unsafe")
            for part in parts[1:]:
                np.add(total, part, out=total, casting="unsafe")


def _view_rows(*arrays: np.ndarray) -> list[np.ndarray] | None:
    rows = [as_rows(a) for a in arrays]
    return None if any(r is None for r in rows) or len({r.shape for r in rows}) != 1 else rows


def _rstd_into(x: np.ndarray, eps: float, square: np.ndarray, rstd: np.ndarray) -> None:
    """``rstd = 1 / sqrt(mean(x^2) + eps)`` of each row of the tile, as the reference computes it."""
    np.multiply(x, x, out=square)
    np.add.reduce(square, axis=-1, out=rstd)
    rstd /= x.shape[-1]
    rstd += eps
    np.sqrt(rstd, out=rstd)
    np.reciprocal(rstd, out=rstd)


def _forward(pool: Pool, y, rstd, x, weight, eps: float, residual=None, value=None, jit: bool = False
             ) -> Step | None:
    """``y = x rstd w`` with ``rstd`` of each row; with ``residual`` and ``value``, x is first
    written as their sum (the fused residual add)."""
    rows = _view_rows(y, x, *((residual, value) if residual is not None else ()))
    if rows is None or float_dtype(y, rstd, x, weight, residual, value) is None:
        return None
    y2, x2, *summands = rows
    r2 = rstd.reshape(-1)
    if jit and _compiled_operands(*rows, r2, weight):
        run = compiled.bind_rmsnorm(y2, r2, x2, weight, eps, *(summands or (None, None)))
        return compiled.split_rows(pool, run, x2.shape[0], x2.size)
    frame = RowBlocks(pool, rows, temps=1)

    def tile(xs: np.ndarray, r: np.ndarray, r_column: np.ndarray, ys: np.ndarray, pair: list[np.ndarray],
             square: np.ndarray) -> None:
        if pair:
            np.add(pair[0], pair[1], out=xs)
        _rstd_into(xs, eps, square, r)
        np.multiply(xs, r_column, out=ys)
        ys *= weight

    def block(start: int, stop: int, thread: int) -> None:
        temps, _, _ = frame.scratch(thread)
        for lo, hi, (square,) in frame.tiles(start, stop, temps):
            r = r2[lo:hi]
            tile(x2[lo:hi], r, r[:, None], y2[lo:hi], [a[lo:hi] for a in summands], square)

    if frame.single_tile():  # a decode step's few rows: no pool, no tiling, the views made once
        count, r_column = frame.rows * frame.width, r2[:, None]

        def single() -> None:
            square = pool.workspace.buffers[0][:count * frame.dtype.itemsize].view(frame.dtype)
            tile(x2, r2, r_column, y2, summands, square.reshape(frame.rows, frame.width))

        return single
    return lambda: frame.run(block)


def _compiled_operands(*arrays: np.ndarray) -> bool:
    """Whether the compiled loops take these operands: float32, C-contiguous, the weight as long as a row."""
    return compiled.takes(*arrays) and all(a.flags.c_contiguous for a in arrays) \
        and arrays[-1].shape == (arrays[0].shape[-1],)


def rmsnorm(pool: Pool, outputs, inputs, params, jit: bool = False) -> Step | None:
    (y, rstd), (x, weight) = outputs, inputs
    return _forward(pool, y, rstd, x, weight, params.get("eps", 1e-6), jit=jit)


def fused_residual_rmsnorm(pool: Pool, outputs, inputs, params, jit: bool = False) -> Step | None:
    (out, y, rstd), (residual, value, weight) = outputs, inputs
    return _forward(pool, y, rstd, out, weight, params.get("eps", 1e-6), residual, value, jit)


def _jit_backward(frame: RowBlocks, outs, dy2, x2, weight, r2, nexts, total) -> Step:
    """The compiled rows of :func:`_backward`: each thread's weight-gradient columns in its scratch,
    added up in thread order."""
    run = compiled.bind_rmsnorm_backward(outs[0], dy2, x2, weight, r2, nexts[0] if nexts else None)

    def block(start: int, stop: int, thread: int) -> None:
        columns = frame.scratch(thread)[2][0]
        columns.fill(0)
        run(start, stop, columns)
        for other in outs[1:]:
            np.copyto(other[start:stop], outs[0][start:stop])

    return lambda: frame.run(block, (total,))


def _backward(pool: Pool, d_xs, d_weight, d_y, d_next, x, weight, rstd, jit: bool = False) -> Step | None:
    """rmsnorm's backward, in the reference's order: ``d_x = r g - x r^3 mean(g x)`` with
    ``g = d_y w`` (plus ``d_next``, the fused residual's gradient) into each of ``d_xs``, and
    ``d_weight`` the column sums of ``d_y x r``."""
    rows = _view_rows(*d_xs, d_y, x, *((d_next,) if d_next is not None else ()))
    if rows is None or float_dtype(*d_xs, d_weight, d_y, d_next, x, weight, rstd) is None:
        return None
    outs, (dy2, x2), nexts = rows[:len(d_xs)], rows[len(d_xs):len(d_xs) + 2], rows[len(d_xs) + 2:]
    r2, total, width = rstd.reshape(-1), d_weight.reshape(-1), x2.shape[-1]
    if jit and _compiled_operands(*rows, r2, weight):
        return _jit_backward(RowBlocks(pool, rows, temps=0, columns=1), outs, dy2, x2, weight, r2, nexts, total)
    frame = RowBlocks(pool, rows, temps=2, vectors=2, columns=2)

    def block(start: int, stop: int, thread: int) -> None:
        temps, (mean, cube), (partial, column_sum) = frame.scratch(thread)
        partial.fill(0)
        for lo, hi, (g, t) in frame.tiles(start, stop, temps):
            dy, xs, r = dy2[lo:hi], x2[lo:hi], r2[lo:hi]
            n = hi - lo
            np.multiply(dy, xs, out=t)
            t *= r[:, None]
            np.add.reduce(t, axis=0, out=column_sum)
            partial += column_sum
            np.multiply(dy, weight, out=g)
            np.multiply(g, xs, out=t)
            np.add.reduce(t, axis=-1, out=mean[:n])
            mean[:n] /= width
            np.power(r, 3, out=cube[:n])
            np.multiply(xs, cube[:n, None], out=t)
            t *= mean[:n, None]
            np.multiply(r[:, None], g, out=g)
            first = outs[0][lo:hi]
            if nexts:
                np.subtract(g, t, out=g)
                np.add(nexts[0][lo:hi], g, out=first)
            else:
                np.subtract(g, t, out=first)
            for other in outs[1:]:
                np.copyto(other[lo:hi], first)

    return lambda: frame.run(block, (total,))


def rmsnorm_backward(pool: Pool, outputs, inputs, params, jit: bool = False) -> Step | None:
    (d_x, d_weight), (d_y, x, weight, rstd) = outputs, inputs
    return _backward(pool, [d_x], d_weight, d_y, None, x, weight, rstd, jit)


def fused_residual_rmsnorm_backward(pool: Pool, outputs, inputs, params, jit: bool = False) -> Step | None:
    (d_residual, d_input, d_weight), (d_y, d_next, residual_out, weight, rstd) = outputs, inputs
    return _backward(pool, [d_residual, d_input], d_weight, d_y, d_next, residual_out, weight, rstd, jit)


def _compiled_heads(*groups: tuple[np.ndarray, ...]) -> bool:
    """Whether each group (the head tensors, the rstd, the weight last) runs on the compiled path; the
    qk-norm kernels run nowhere else (a numpy step would change the bits of the reference composites
    that the numpy path keeps)."""
    return compiled.enabled() and all(_compiled_operands(*group) for group in groups)


def qk_norm(pool: Pool, outputs, inputs, params) -> Step | None:
    """RMSNorm of every q and k head vector: the compiled rows of :func:`rmsnorm`, so a program that
    fuses it with RoPE (``fused_qk_norm_rope``) keeps its bits."""
    (q_norm, k_norm, q_rstd, k_rstd), (q, k, q_weight, k_weight) = outputs, inputs
    eps = params.get("eps", 1e-6)
    if not _compiled_heads((q_norm, q, q_rstd, q_weight), (k_norm, k, k_rstd, k_weight)):
        return None
    return in_sequence(_forward(pool, q_norm, q_rstd, q, q_weight, eps, jit=True),
                       _forward(pool, k_norm, k_rstd, k, k_weight, eps, jit=True))


def qk_norm_backward(pool: Pool, outputs, inputs, params) -> Step | None:
    (d_q, d_k, d_q_weight, d_k_weight), (d_q_norm, d_k_norm, q, k, q_weight, k_weight, q_rstd, k_rstd) = outputs, inputs
    if not _compiled_heads((d_q, d_q_norm, q, q_rstd, q_weight), (d_k, d_k_norm, k, k_rstd, k_weight)) \
            or not compiled.takes(d_q_weight, d_k_weight):
        return None
    return in_sequence(_backward(pool, [d_q], d_q_weight, d_q_norm, None, q, q_weight, q_rstd, jit=True),
                       _backward(pool, [d_k], d_k_weight, d_k_norm, None, k, k_weight, k_rstd, jit=True))


KERNELS = {fn.__name__: fn for fn in (rmsnorm, fused_residual_rmsnorm, rmsnorm_backward,
                                      fused_residual_rmsnorm_backward)}
JIT_KERNELS = {name: partial(fn, jit=True) for name, fn in KERNELS.items()}  # each row in one compiled loop
JIT_KERNELS.update(qk_norm=qk_norm, qk_norm_backward=qk_norm_backward)  # no numpy kernel: the reference runs them
