"""The CPU ``mdsl.sched.gemm``: ``C = epilogue(alpha op(A) op(B) + beta C)`` written into C, over the pool.

The operands are seen as 2-d views (``op(A)`` ``[M, K]``, ``op(B)`` ``[K, N]``,
``C`` ``[M, N]``; leading dims flattened into rows, a stacked ``TN`` pair
contracting its rows), and each thread multiplies its block of C's rows (its
block of columns when C has fewer rows than threads) with ``np.matmul(out=)``
on a one-thread BLAS. ``alpha`` and ``beta`` cost a pass only when they are
not 1 and 0; with ``beta`` the product goes through a scratch block first.
Epilogues other than none and the bias (with its saved pre-activation), and
batched products, return no step: the executor runs the reference.
"""

from __future__ import annotations

import numpy as np

from modeldsl.kernels.cpu.pool import Pool, row_tiles, scratch_bytes
from modeldsl.kernels.cpu.tiles import Step, as_rows, float_dtype

PRODUCT_TILE = 1 << 16  # elements of one scratch block of the product (with beta)
EPILOGUES = ("none", "bias", "bias_aux")


def _operand(x: np.ndarray, transposed: bool, stacked: bool) -> np.ndarray | None:
    """``op(x)`` as a 2-d view: rows of x (``N``), or their transpose (``T``; a stacked x
    contracts its rows)."""
    if x.ndim == 2:
        return x.T if transposed else x
    if not stacked and transposed:
        return None
    rows = as_rows(x)
    return None if rows is None else (rows.T if transposed else rows)


def matrices(a, b, c, mode: str) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(op(A), op(B), C) as 2-d views whose shapes chain, or None."""
    if c.ndim > 2 and a.ndim > 2 and b.ndim > 2:
        return None  # a batched product
    stacked = c.ndim == 2 and a.ndim > 2 and b.ndim > 2
    a2, b2, c2 = _operand(a, mode[0] == "T", stacked), _operand(b, mode[1] == "T", stacked), as_rows(c)
    if a2 is None or b2 is None or c2 is None:
        return None
    if a2.shape[0] != c2.shape[0] or b2.shape[1] != c2.shape[1] or a2.shape[1] != b2.shape[0]:
        return None
    return a2, b2, c2


def gemm(pool: Pool, a, b, c, bias=None, aux=None, *, transpose="NN", alpha=1.0, beta=0.0,
         epilogue="none") -> Step | None:
    """The step of one ``mdsl.sched.gemm`` (None: the reference runs it)."""
    views = matrices(a, b, c, transpose)
    dtype = float_dtype(a, b, c, bias, aux)
    if views is None or dtype is None or epilogue not in EPILOGUES:
        return None
    a2, b2, c2 = views
    aux2 = as_rows(aux) if aux is not None else None
    if aux is not None and (aux2 is None or aux2.shape != c2.shape):
        return None
    m, n = c2.shape
    by_rows = m >= pool.threads
    width = n if by_rows else 1
    tile = max(PRODUCT_TILE // max(width, 1), 1) if by_rows else m
    if beta:
        pool.workspace.reserve(scratch_bytes(tile * n if by_rows else m * n, dtype, 1))
    row_bias = bias.reshape(-1) if bias is not None else None
    alpha, beta = dtype.type(alpha), dtype.type(beta)

    def finish(block: np.ndarray, lo: int, hi: int) -> None:
        if row_bias is not None and epilogue != "none":
            block += row_bias if by_rows else row_bias[lo:hi]
        if aux2 is not None:
            np.copyto(aux2[lo:hi] if by_rows else aux2[:, lo:hi], block)

    def product(a_block, b_block, out, thread: int) -> None:
        if not beta:
            np.matmul(a_block, b_block, out=out)
            if alpha != 1:
                out *= alpha
            return
        (scratch,) = pool.workspace.arrays(thread, out.size, dtype, 1)
        scratch = scratch.reshape(out.shape)
        np.matmul(a_block, b_block, out=scratch)
        if alpha != 1:
            scratch *= alpha
        if beta != 1:
            out *= beta
        np.add(scratch, out, out=out)

    def rows_block(start: int, stop: int, thread: int) -> None:
        for lo, hi in row_tiles(start, stop, tile if beta else stop - start):
            product(a2[lo:hi], b2, c2[lo:hi], thread)
            finish(c2[lo:hi], lo, hi)

    def columns_block(start: int, stop: int, thread: int) -> None:
        product(a2, b2[:, start:stop], c2[:, start:stop], thread)
        finish(c2[:, start:stop], start, stop)

    work = m * n * a2.shape[1] // 64

    def step() -> None:
        if by_rows:
            pool.blocks(rows_block, m, work)
        else:
            pool.blocks(columns_block, n, work)

    return step
