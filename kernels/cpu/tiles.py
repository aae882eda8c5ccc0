"""Running a kernel over row tiles of its operands, on the pool, with scratch from the workspace.

A CPU kernel is written for one tile: ``body(outputs, inputs, temps)`` where
every operand is a ``[rows, C]`` block of at most :data:`~modeldsl.kernels.cpu.pool.TILE`
elements and ``temps`` are scratch blocks of the same shape. :func:`rowwise`
makes the step that runs it over every tile of the rows, the threads each
taking a contiguous range of rows. Operands are 2-d views of the planned
buffers (``as_rows``, never a copy); a kernel whose operands cannot be viewed
so, or are not all the same float dtype, gets no fast step and the executor
runs the numpy reference instead.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from modeldsl.kernels.cpu.pool import Pool, row_tiles, scratch_bytes, tile_rows

Step = Callable[[], None]
TileBody = Callable[[list[np.ndarray], list[np.ndarray], list[np.ndarray]], None]
FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def as_rows(a: np.ndarray, columns: int | None = None) -> np.ndarray | None:
    """``a`` as a ``[rows, columns]`` view (``columns``: its last dim by default); None when that
    takes a copy."""
    columns = a.shape[-1] if columns is None else columns
    view = a.view()
    try:
        view.shape = (-1, columns) if a.size else (0, columns)
    except AttributeError:
        return None
    return view


def float_dtype(*arrays: np.ndarray | None) -> np.dtype | None:
    """The one float dtype (fp32 or fp64) of every array given; None when they differ or are not."""
    dtypes = {a.dtype for a in arrays if a is not None}
    return next(iter(dtypes)) if len(dtypes) == 1 and next(iter(dtypes)) in FLOATS else None


def rowwise(pool: Pool, body: TileBody, outputs: Sequence[np.ndarray], inputs: Sequence[np.ndarray],
            temps: int = 0, columns: int | None = None, cost: int = 1) -> Step | None:
    """The step running ``body`` over the row tiles of same-shaped ``outputs`` and ``inputs``
    (None when they are not all one float dtype, or not viewable as rows without a copy).
    ``cost``: the work of an element in cheap passes (an exp-heavy body's long calls pay off on
    two threads from half the elements)."""
    dtype = float_dtype(*outputs, *inputs)
    rows = [as_rows(a, columns) for a in (*outputs, *inputs)]
    if dtype is None or any(r is None for r in rows) or len({r.shape for r in rows}) != 1:
        return None
    outs, ins = rows[:len(outputs)], rows[len(outputs):]
    total, width = rows[0].shape
    per_tile = tile_rows(width)
    count = per_tile * width
    pool.workspace.reserve(scratch_bytes(count, dtype, temps))

    def block(start: int, stop: int, thread: int) -> None:
        scratch = pool.workspace.arrays(thread, count, dtype, temps)
        for lo, hi in row_tiles(start, stop, per_tile):
            size = (hi - lo) * width
            body([o[lo:hi] for o in outs], [i[lo:hi] for i in ins],
                 [t[:size].reshape(hi - lo, width) for t in scratch])

    work = total * width * cost

    def step() -> None:
        pool.blocks(block, total, work)

    def single() -> None:  # one tile on the calling thread: no pool, no tiling
        body(outs, ins, [t.reshape(total, width) for t in pool.workspace.arrays(0, total * width, dtype, temps)])

    return single if total <= per_tile and len(pool.split(total, work)) == 1 else step



def in_sequence(*steps: Step | None) -> Step | None:
    """One step running ``steps`` one after the other (None if any is None: the reference runs the launch)."""
    if any(step is None for step in steps):
        return None

    def step() -> None:
        for each in steps:
            each()

    return step
