"""The CPU ``mdsl.sched.gemm``: ``C = epilogue(alpha op(A) op(B) + beta C)`` written into C, over the pool.

A GEMM becomes a list of 2-d products, made once at compile time, each one
``np.matmul(out=)`` call on a one-thread BLAS, and the pool's threads take
contiguous runs of the list. The list makes the BLAS calls the reference
makes (one call over all rows of ``x [B, T, K] @ W^T`` and of a stacked
``TN`` pair, one per matrix of a batched product), so the results are bitwise
the reference's:
BLAS picks its kernels by size (OpenBLAS has a small-matrix path), so the
same product cut into other shapes may round differently. Only a product too
large for one thread and with fewer matrices than threads is cut further, into
column blocks of C where it is wider than tall, else row blocks (OpenBLAS sums
each element over K in the same order however C is cut).
``alpha`` and ``beta`` cost a pass only when they are not 1 and 0; with
``beta`` the product goes through scratch first. Epilogues other than none and
the bias (with its saved pre-activation) return no step: the reference runs
them.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from modeldsl.kernels.cpu import compiled
from modeldsl.kernels.cpu.pool import PARALLEL_ELEMENTS, TILE, Pool, scratch_bytes
from modeldsl.kernels.cpu.quantize import CODES
from modeldsl.kernels.cpu.tiles import Step, as_rows, float_dtype

EPILOGUES = ("none", "bias")
Block = tuple[np.ndarray, np.ndarray, np.ndarray, slice]  # op(A), op(B), C and the bias's columns


def _op(x: np.ndarray, transposed: bool) -> np.ndarray:
    return np.swapaxes(x, -1, -2) if transposed else x


def _matrices(a, b, c, mode: str) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]] | None:
    """The reference's BLAS calls as 2-d (op(A), op(B), C) views, or None for operands it does not take."""
    ta, tb = mode[0] == "T", mode[1] == "T"
    if c.ndim == 2 and a.ndim > 2 and b.ndim > 2 and ta and not tb:  # dW = dY^T X over all rows: one call
        rows_a, rows_b = as_rows(a), as_rows(b)
        return None if rows_a is None or rows_b is None else iter([(rows_a.T, rows_b, c)])
    if c.ndim == 2:
        return iter([(_op(a, ta), _op(b, tb), c)]) if a.ndim == 2 and b.ndim == 2 else None
    if b.ndim == 2:  # x @ op(W) over all rows of x: one call
        rows_a, rows_c = as_rows(a), as_rows(c)
        if ta or a.shape[:-1] != c.shape[:-1] or rows_a is None or rows_c is None:
            return None
        return iter([(rows_a, _op(b, tb), rows_c)])
    if a.shape[:-2] != c.shape[:-2] or b.shape[:-2] != c.shape[:-2]:
        return None
    flat = [x.reshape(-1, *x.shape[-2:]) for x in (a, b, c)]
    return ((_op(x, ta), _op(y, tb), z) for x, y, z in zip(*flat))


def _cut(a2: np.ndarray, b2: np.ndarray, c2: np.ndarray, parts: int) -> list[Block]:
    """One product as up to ``parts`` column blocks of C where it has more columns than rows, else
    row blocks: each thread packs all of the operand it does not cut, so the smaller one is shared
    (``x @ W^T`` of a prompt cuts the weight: 1.2-1.8x faster on two threads than cutting x's rows)."""
    m, n = c2.shape
    if m >= parts and m >= n:
        bounds = [m * i // parts for i in range(parts + 1)]
        return [(a2[lo:hi], b2, c2[lo:hi], slice(None)) for lo, hi in zip(bounds[:-1], bounds[1:])]
    parts = min(parts, n)
    bounds = [n * i // parts for i in range(parts + 1)]
    return [(a2, b2[:, lo:hi], c2[:, lo:hi], slice(lo, hi)) for lo, hi in zip(bounds[:-1], bounds[1:])]


def _work(products) -> int:
    """The pool's measure of some products' work: their multiply-adds / 64."""
    return sum(x.shape[0] * x.shape[1] * y.shape[1] for x, y, *_ in products) // 64


def blocks(a, b, c, mode: str, threads: int) -> list[Block] | None:
    """The products one GEMM runs, cut for ``threads`` threads where it has fewer than that."""
    matrices = _matrices(a, b, c, mode)
    if matrices is None:
        return None
    products = list(matrices)
    if any(x.shape[-1] != y.shape[0] or (x.shape[0], y.shape[1]) != z.shape for x, y, z in products):
        return None
    if len(products) < threads and _work(products) >= PARALLEL_ELEMENTS:
        return [block for x, y, z in products for block in _cut(x, y, z, threads)]
    return [(x, y, z, slice(None)) for x, y, z in products]


def gemm(pool: Pool, a, b, c, bias=None, aux=None, *, transpose="NN", alpha=1.0, beta=0.0,
         epilogue="none", jit: bool = False, scale_b=None) -> Step | None:
    """The step of one ``mdsl.sched.gemm`` (None: the reference runs it). With ``jit`` (and float32,
    no bias) the products of a GEMM cut over the threads run on the compiled library's spinning
    threads (:func:`~modeldsl.kernels.cpu.compiled.gemm_step`), ``alpha`` and ``beta`` in BLAS's
    call; one product stays an ``np.matmul`` on the calling thread, and so do products with one row
    or column (numpy runs those as the faster GEMV). With ``scale_b``: :func:`scaled_gemm`."""
    if scale_b is not None:
        return scaled_gemm(pool, a, b, scale_b, c, bias, transpose=transpose, alpha=alpha, beta=beta,
                           epilogue=epilogue)
    dtype = float_dtype(a, b, c, bias)
    if dtype is None or epilogue not in EPILOGUES or aux is not None:
        return None
    work = blocks(a, b, c, transpose, pool.threads)
    if work is None:
        return None
    if jit and dtype == np.float32 and bias is None and len(work) > 1 and all(min(z.shape) > 1 for *_, z, _ in work):
        step = compiled.gemm_step([(x, y, z) for x, y, z, _ in work], float(alpha), float(beta),
                                  min(pool.threads, len(work)))
        if step is not None:
            return step
    if beta:
        pool.workspace.reserve(scratch_bytes(max(z.size for _, _, z, _ in work), dtype))
    row_bias = bias.reshape(-1) if bias is not None and epilogue == "bias" else None
    alpha, beta = dtype.type(alpha), dtype.type(beta)

    def product(x: np.ndarray, y: np.ndarray, z: np.ndarray, columns: slice, thread: int) -> None:
        if beta:
            out = pool.workspace.arrays(thread, z.size, dtype, 1)[0].reshape(z.shape)
        else:
            out = z
        np.matmul(x, y, out=out)
        if alpha != 1:
            out *= alpha
        if beta:
            if beta != 1:
                z *= beta
            np.add(out, z, out=z)
        if row_bias is not None:
            z += row_bias[columns]

    def run(start: int, stop: int, thread: int) -> None:
        for x, y, z, columns in work[start:stop]:
            product(x, y, z, columns, thread)

    total = _work(work)
    if len(work) == 1 and not beta and alpha == 1 and row_bias is None:  # one product on the calling thread: no pool
        x, y, z, _ = work[0]
        return lambda: np.matmul(x, y, out=z)

    def step() -> None:
        pool.blocks(run, len(work), total)

    return step


def column_tiles(rows: int, columns: int, threads: int) -> list[tuple[int, int]]:
    """``[lo, hi)`` column ranges of a widened B ``[rows, columns]``: at most a tile of elements each
    (TILE: it stays in a core's L2 while BLAS reads it), and at least one per thread where the
    product is large enough to split."""
    width = min(max(TILE // max(rows, 1), 1), columns)
    if threads > 1 and rows * columns >= PARALLEL_ELEMENTS:
        width = min(width, -(-columns // threads))
    return [(lo, min(lo + width, columns)) for lo in range(0, columns, max(width, 1))]


def scaled_gemm(pool: Pool, a, q, scale, c, bias=None, *, transpose="NN", alpha=1.0, beta=0.0,
                epilogue="none") -> Step | None:
    """``C = alpha * op(A) @ op(B) (+ bias)`` where B is ``dequantize(q, scale)``: fp8 values ``q``
    times their row's fp32 ``scale``, widened a tile of C's columns at a time into the thread's
    workspace (exactly the reference dequantize's float32 products: each fp8 value widens exactly,
    then one multiply) and multiplied there, so the widened B is never held whole. A tile of C's
    columns is ``q``'s rows ``lo:hi`` for a transposed B (``x @ W^T``), its columns ``lo:hi`` for a
    plain one (``dy @ W``). Only a float32 A and C, a 2-d ``q`` and no ``beta``; else None (the
    reference widens B whole)."""
    if float_dtype(a, c, bias) != np.float32 or q.ndim != 2 or q.dtype not in CODES or beta or \
            scale.dtype != np.float32 or scale.shape != q.shape[:-1] or epilogue not in EPILOGUES:
        return None
    transposed = transpose[1] == "T"
    matrices = _matrices(a, q, c, transpose)
    products = list(matrices) if matrices is not None else []
    if len(products) != 1:
        return None
    x, y, z = products[0]
    if x.shape[-1] != y.shape[0] or (x.shape[0], y.shape[1]) != z.shape:
        return None
    depth = y.shape[0]
    tiles = column_tiles(depth, y.shape[1], pool.threads)
    width = max(hi - lo for lo, hi in tiles) if tiles else 0
    pool.workspace.reserve(scratch_bytes(depth * width, np.float32))
    row_bias = bias.reshape(-1) if bias is not None and epilogue == "bias" else None
    alpha = np.float32(alpha)

    def widen(lo: int, hi: int, thread: int) -> np.ndarray:
        """op(B)[:, lo:hi] in float32, in the thread's workspace."""
        temp = pool.workspace.arrays(thread, depth * (hi - lo), np.float32, 1)[0]
        if transposed:  # B's rows lo:hi, contiguous, read transposed
            wide = temp.reshape(hi - lo, depth)
            np.copyto(wide, q[lo:hi], casting="unsafe")  # exact: every fp8 value is a float32
            np.multiply(wide, scale[lo:hi, None], out=wide)
            return wide.T
        wide = temp.reshape(depth, hi - lo)
        np.copyto(wide, q[:, lo:hi], casting="unsafe")
        np.multiply(wide, scale[:, None], out=wide)
        return wide

    def run(start: int, stop: int, thread: int) -> None:
        for lo, hi in tiles[start:stop]:
            out = z[:, lo:hi]
            np.matmul(x, widen(lo, hi, thread), out=out)
            if alpha != 1:
                out *= alpha
            if row_bias is not None:
                out += row_bias[lo:hi]

    total = z.shape[0] * z.shape[1] * depth // 64 + q.size

    def step() -> None:
        pool.blocks(run, len(tiles), total)

    return step
