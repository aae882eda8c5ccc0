"""CPU kernels that move, add or gather values: written straight into the output views.

Each is one numpy call with ``out=`` (or ``np.copyto``) per output, on the
calling thread: they are a pass over memory and the GIL handoff of the pool
costs more than it saves. Values are copied in their own dtype (the reference
computes in fp32 and the executor casts back: the same values).
"""

from __future__ import annotations

import itertools

import numpy as np

from modeldsl.kernels.cpu.pool import Pool
from modeldsl.kernels.cpu.tiles import Step, as_rows, float_dtype, in_sequence


def _same_float(*arrays: np.ndarray) -> bool:
    return float_dtype(*arrays) is not None


def add(pool: Pool, outputs, inputs, params) -> Step | None:
    (out,), (a, b) = outputs, inputs
    if not _same_float(out, a, b) or np.broadcast_shapes(a.shape, b.shape) != out.shape:
        return None
    return lambda: np.add(a, b, out=out)


def mul(pool: Pool, outputs, inputs, params) -> Step | None:
    (out,), (a, b) = outputs, inputs
    if not _same_float(out, a, b) or np.broadcast_shapes(a.shape, b.shape) != out.shape:
        return None
    return lambda: np.multiply(a, b, out=out)


def _copy(out: np.ndarray, source: np.ndarray) -> Step | None:
    """The step copying ``source`` into ``out`` (same element count and dtype kind)."""
    if out.shape != source.shape or out.dtype != source.dtype:
        return None
    return lambda: np.copyto(out, source)


def view(pool: Pool, outputs, inputs, params) -> Step | None:
    (out,), (x,) = outputs, inputs
    target = out.view()
    try:
        target.shape = x.shape
    except AttributeError:
        return None
    return _copy(target, x)


def copy(pool: Pool, outputs, inputs, params) -> Step | None:
    return _copy(outputs[0], inputs[0])


contiguous = copy


def transpose(pool: Pool, outputs, inputs, params) -> Step | None:
    return _copy(outputs[0], np.swapaxes(inputs[0], params["dim0"], params["dim1"]))


def permute(pool: Pool, outputs, inputs, params) -> Step | None:
    return _copy(outputs[0], np.transpose(inputs[0], tuple(params["dims"])))


def concat(pool: Pool, outputs, inputs, params) -> Step | None:
    (out,), dim = outputs, params.get("dim", -1)
    cuts = [0, *itertools.accumulate(x.shape[dim] for x in inputs)]
    index = [slice(None)] * out.ndim
    steps = []
    for x, lo, hi in zip(inputs, cuts[:-1], cuts[1:]):
        index[dim] = slice(lo, hi)
        steps.append(_copy(out[tuple(index)], x))
    return in_sequence(*steps)


def split(pool: Pool, outputs, inputs, params) -> Step | None:
    (x,), dim = inputs, params.get("dim", -1)
    cuts = [0, *itertools.accumulate(int(s) for s in params["sizes"])]
    index = [slice(None)] * x.ndim
    steps = []
    for out, lo, hi in zip(outputs, cuts[:-1], cuts[1:]):
        index[dim] = slice(lo, hi)
        steps.append(_copy(out, x[tuple(index)]))
    return in_sequence(*steps)


def cast(pool: Pool, outputs, inputs, params) -> Step | None:
    (out,), (x,) = outputs, inputs
    if out.shape != x.shape:
        return None
    return lambda: np.copyto(out, x, casting="unsafe")



def embedding(pool: Pool, outputs, inputs, params) -> Step | None:
    (out,), (indices, weight) = outputs, inputs
    rows, flat = as_rows(out), indices.reshape(-1)
    if rows is None or out.dtype != weight.dtype or rows.shape[0] != flat.size:
        return None
    # token ids are checked where they come in; "clip" takes no bounds-checking copy of the result
    return lambda: np.take(weight, flat, axis=0, out=rows, mode="clip")


def embedding_backward(pool: Pool, outputs, inputs, params) -> Step | None:
    """``d_weight[v] += d_out rows of index v`` (zeroed first unless the launch accumulates)."""
    (d_weight,), (d_out, indices) = outputs, inputs
    rows, flat = as_rows(d_out), indices.reshape(-1)
    if rows is None or not _same_float(d_weight, d_out) or d_weight.ndim != 2:
        return None
    accumulate = params.get("accumulate", False)

    def step() -> None:
        if not accumulate:
            d_weight.fill(0)
        np.add.at(d_weight, flat, rows)

    return step


KERNELS = {fn.__name__: fn for fn in (add, mul, view, copy, transpose, permute, concat, split, cast,
                                      embedding, embedding_backward)}
KERNELS["contiguous"] = contiguous
