"""The CPU kernel of ``dequantize``: fp8 values times their row's scale, into the planned output.

Each fp8 value widens to float32 (ml_dtypes' conversion, exact) into the output tile, then one
float32 multiply by the row's scale: the reference's arithmetic (:func:`modeldsl.kernels.reference.dequantize`),
so the result is bitwise the reference's. A 16-bit output is computed a tile at a time in the
thread's workspace and rounded once, to nearest even, as the executor rounds the reference's
float32 result. The rows are split over the pool; nothing is allocated.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from modeldsl.kernels.cpu.pool import Pool, row_tiles, scratch_bytes, tile_rows
from modeldsl.kernels.cpu.tiles import Step, as_rows

CODES = (np.dtype(ml_dtypes.float8_e4m3fn), np.dtype(ml_dtypes.float8_e5m2))
OUTPUTS = (np.dtype(np.float32), np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16))


def dequantize(pool: Pool, outputs, inputs, params) -> Step | None:
    (out,), (q, scale) = outputs, inputs
    if q.dtype not in CODES or scale.dtype != np.float32 or out.dtype not in OUTPUTS or out.shape != q.shape \
            or scale.shape != q.shape[:-1]:
        return None
    out_rows, q_rows, scales = as_rows(out), as_rows(q), as_rows(scale[..., None], 1)
    if out_rows is None or q_rows is None or scales is None:
        return None
    total, width = q_rows.shape
    per_tile = tile_rows(width)
    direct = out.dtype == np.float32
    if not direct:
        pool.workspace.reserve(scratch_bytes(per_tile * width, np.float32))

    def block(start: int, stop: int, thread: int) -> None:
        temp = None if direct else pool.workspace.arrays(thread, per_tile * width, np.float32, 1)[0]
        for lo, hi in row_tiles(start, stop, per_tile):
            wide = out_rows[lo:hi] if direct else temp[:(hi - lo) * width].reshape(hi - lo, width)
            np.copyto(wide, q_rows[lo:hi], casting="unsafe")  # exact: every fp8 value is a float32
            np.multiply(wide, scales[lo:hi], out=wide)
            if not direct:
                np.copyto(out_rows[lo:hi], wide, casting="unsafe")

    def step() -> None:
        pool.blocks(block, total, 2 * total * width)

    return step


KERNELS = {"dequantize": dequantize}
