"""The CPU kernel of ``dropout``: the counter-based mask drawn tile by tile, never stored.

Each thread takes a contiguous block of the flattened elements and, per tile of
:data:`~modeldsl.kernels.cpu.pool.TILE` elements, hashes the tile's element indices with the
launch's key (seed, offset, layers and the step counter read from the ``step`` operand when the
step runs: :mod:`modeldsl.kernels.dropout_mask`) in two uint32 scratch arrays of the pool's
workspace, marks the dropped elements in a third (bool), multiplies by ``1 / (1 - p)`` in the
operands' dtype and zeroes the dropped elements: the reference's operations, so the result is
bitwise the reference's, and a warm step allocates nothing. The tile reads its input before
writing, so the output may take over the input's buffer. Outside training (or with p = 0) it is
a copy.
"""

from __future__ import annotations

from functools import cache

import numpy as np

from modeldsl.kernels import dropout_mask
from modeldsl.kernels.cpu.pool import TILE, Pool, carved_bytes
from modeldsl.kernels.cpu.tiles import Step, float_dtype

HASH_COST = 12  # an element's work in cheap passes: the hash's shifts, multiplies and xors


def _flat(a: np.ndarray) -> np.ndarray | None:
    """``a`` as a 1-d view; None when that takes a copy."""
    flat = a.view()
    try:
        flat.shape = (a.size,)
    except AttributeError:
        return None
    return flat


@cache
def _iota() -> np.ndarray:
    """0 .. TILE - 1 as uint32, made once (read only): a tile's element indices are it plus the tile's start."""
    iota = np.arange(TILE, dtype=np.uint32)
    iota.setflags(write=False)
    return iota


def _mix32(x: np.ndarray, t: np.ndarray) -> None:
    """:func:`~modeldsl.kernels.dropout_mask.mix32` on ``x`` in place, ``t`` its scratch."""
    np.right_shift(x, np.uint32(16), out=t)
    np.bitwise_xor(x, t, out=x)
    np.multiply(x, np.uint32(dropout_mask.M1), out=x)
    np.right_shift(x, np.uint32(15), out=t)
    np.bitwise_xor(x, t, out=x)
    np.multiply(x, np.uint32(dropout_mask.M2), out=x)
    np.right_shift(x, np.uint32(16), out=t)
    np.bitwise_xor(x, t, out=x)


def _drop_range(out: np.ndarray, x: np.ndarray, start: int, stop: int, key: int, p: float,
                scratch: tuple[np.ndarray, np.ndarray, np.ndarray]) -> None:
    """Elements ``start .. stop - 1`` under the 32-bit ``key``, a tile at a time, in ``scratch``."""
    draws, temp, dropped = scratch
    scale, below, zero = x.dtype.type(1.0 / (1.0 - p)), np.uint32(dropout_mask.threshold(p)), x.dtype.type(0)
    shift = np.uint32(32 - dropout_mask.UNIFORM_BITS)
    for lo in range(start, stop, TILE):
        n = min(lo + TILE, stop) - lo
        r, t, d = draws[:n], temp[:n], dropped[:n]
        np.add(_iota()[:n], np.uint32(lo & dropout_mask.MASK32), out=r)  # the index mod 2^32
        np.bitwise_xor(r, np.uint32(key), out=r)
        _mix32(r, t)
        np.right_shift(r, shift, out=t)
        np.less(t, below, out=d)
        np.multiply(x[lo:lo + n], scale, out=out[lo:lo + n])
        np.copyto(out[lo:lo + n], zero, where=d)


def dropout(pool: Pool, outputs, inputs, params) -> Step | None:
    (out,), (x, *rest) = outputs, inputs
    step = rest[0] if rest else None
    if float_dtype(out, x) is None or out.shape != x.shape:
        return None
    flat_out, flat_x = _flat(out), _flat(x)
    if flat_out is None or flat_x is None:
        return None
    p = float(params.get("p", 0.5))
    if not dropout_mask.active(p, bool(params.get("training", False))):
        return lambda: np.copyto(flat_out, flat_x)
    total = x.size
    launch = dropout_mask.launch_key(int(params.get("seed", 0)), int(params.get("offset", 0)),
                                     tuple(params.get("layers", ())))
    tile = min(TILE, total)
    pool.workspace.reserve(carved_bytes(np.uint32, [tile, tile, -(-tile // 4)]))
    _iota()

    def block(start: int, stop: int, thread: int) -> None:
        draws, temp, dropped = pool.workspace.carve(thread, np.uint32, [tile, tile, -(-tile // 4)])
        key = dropout_mask.step_key(launch, dropout_mask.step_of(step))  # the counter as it is now
        _drop_range(flat_out, flat_x, start, stop, key, p, (draws, temp, dropped.view(np.bool_)))

    return lambda: pool.blocks(block, total, total * HASH_COST)


KERNELS = {"dropout": dropout}
