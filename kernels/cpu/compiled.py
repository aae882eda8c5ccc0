"""The compiled twins of the CPU kernels: numba loops that fuse what numpy runs as many passes.

Some kernels are a handful of numpy passes over small arrays (SiLU, RoPE,
RMSNorm, the softmax of an attention strip): there a pass costs more in
dispatch and memory traffic than in arithmetic, and numpy cannot fuse them.
Their twins here are numba functions, one loop over the data, compiled to
machine code on first use (cached on disk next to this file, so a later process
loads them in milliseconds) and run with the GIL released, so the pool's
threads run them truly at once. numba and its LLVM install as wheels from the
package registry: nothing is compiled at install time.

The compiled path is on when numba imports and ``MDSL_CPU_JIT`` is not ``0``
(:func:`enabled`); a kernel here takes a launch first and the numpy kernel
(:mod:`modeldsl.kernels.cpu`) gets what it declines. Both are tested against
the numpy references, the oracle: a compiled kernel rounds differently (its
``exp``, the order of its sums), within a few float32 ulps, and gives the same
bits on every run and on any number of threads (each output row is computed
by one thread, in a fixed order), except the column sums of the RMSNorm weight
gradient, which are added per thread, as the numpy kernel does.

Everything numba compiles lives in this one file: numba's disk cache is
checked against the file of the kernel, not of what it calls.

``fast_exp``: ``exp(x) = 2^k p(r)``, ``k = round(x log2 e)``, ``r = x - k ln 2``
(Cody-Waite, two parts of ln 2), ``p`` a degree-7 polynomial on ``|r| <= ln(2)
/ 2`` and ``2^k`` two powers of two built from their bits: within 1 ulp of the
correctly rounded float32 result (checked in the tests), ``inf`` above 88.72
and ``0`` below -103.97 as numpy's, with no branch and no library call, so LLVM
vectorizes the loops it is in (numba's own ``np.exp`` calls libm one element at
a time). In float64 it is ``np.exp`` (the tests' dtype, where speed does not
matter).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from functools import cache

import numpy as np

from modeldsl.kernels.cpu.pool import Pool
from modeldsl.kernels.cpu.tiles import Step, as_rows, float_dtype

ENV_VAR = "MDSL_CPU_JIT"

# LLVM may contract multiply-adds and reassociate sums (so they vectorize) but keeps inf, nan and
# signed zeros: masks are -inf, and an exp that overflows must give inf.
FASTMATH = {"contract", "reassoc"}


@cache
def numba_module():
    try:
        import numba
    except ImportError:
        return None
    _exp_overload(numba)
    for helper in HELPERS:  # the kernels call them by their global names: from now on, compiled
        globals()[helper.__name__] = numba.njit(inline="always", nogil=True, fastmath=FASTMATH,
                                                error_model="numpy")(helper)
    return numba


def enabled() -> bool:
    """Whether the compiled kernels run: numba imports and ``MDSL_CPU_JIT`` is not ``0``."""
    return os.environ.get(ENV_VAR, "1").strip() != "0" and numba_module() is not None


def compiled(fn: Callable) -> Callable:
    """``fn`` compiled by numba at its first call (nopython, GIL released, cached on disk)."""
    kernels: list[Callable] = []

    def call(*args):
        if not kernels:
            kernels.append(numba_module().njit(cache=True, nogil=True, fastmath=FASTMATH, error_model="numpy")(fn))
        return kernels[0](*args)

    call.__name__ = call.__qualname__ = fn.__name__
    call.__doc__ = fn.__doc__
    call.kernels = kernels  # the numba dispatcher, once compiled
    call.py_func = fn
    return call


HELPERS: list[Callable] = []


def helper(fn: Callable) -> Callable:
    """A function the compiled kernels call: compiled (and inlined into them) with them."""
    HELPERS.append(fn)
    return fn


def fast_exp(x):
    """``exp(x)`` in the compiled kernels (see the module's docstring); numpy's in Python."""
    return np.exp(x)


def row_max(row, lo, hi):
    """``max(row[lo:hi])`` (``-inf`` if empty). In float32 the maximum of integer keys ordered as
    the floats (``bits ^ 0x7fffffff`` for negative ones): LLVM vectorizes an integer maximum, not a
    float one (numba's float ``max`` minds NaNs). In Python, numpy's."""
    return np.max(row[lo:hi], initial=-np.inf)


def _exp_overload(numba) -> None:
    """Teach numba ``fast_exp`` (the polynomial in float32, ``np.exp`` otherwise), ``row_max`` and
    the bit casts ``float_of_bits`` / ``bits_of_float`` between float32 and int32."""
    from llvmlite import ir
    from numba import types
    from numba.extending import intrinsic, overload

    @intrinsic
    def float_of_bits(typingctx, bits):
        def codegen(context, builder, signature, args):
            return builder.bitcast(args[0], ir.FloatType())
        return types.float32(types.int32), codegen

    @intrinsic
    def bits_of_float(typingctx, value):
        def codegen(context, builder, signature, args):
            return builder.bitcast(args[0], ir.IntType(32))
        return types.int32(types.float32), codegen

    globals().update(float_of_bits=float_of_bits, bits_of_float=bits_of_float)

    f32, i32 = np.float32, np.int32
    log2e, ln2_hi, ln2_lo = f32(1.4426950408889634), f32(0.693359375), f32(-2.12194440e-4)
    high, low = f32(88.72283), f32(-103.97208)

    def exp32(x):
        clamped = min(max(x, low), high)
        k = np.floor(clamped * log2e + f32(0.5))
        r = clamped - k * ln2_hi - k * ln2_lo
        p = f32(1.9875691500e-4)
        p = p * r + f32(1.3981999507e-3)
        p = p * r + f32(8.3334519073e-3)
        p = p * r + f32(4.1665795894e-2)
        p = p * r + f32(1.6666665459e-1)
        p = p * r + f32(5.0000001201e-1)
        p = p * r * r + r + f32(1.0)
        half = i32(k) >> 1
        scaled = p * float_of_bits((half + i32(127)) << 23) * float_of_bits((i32(k) - half + i32(127)) << 23)
        return f32(np.inf) if x > high else (f32(0.0) if x < low else (x if x != x else scaled))

    @overload(fast_exp, fastmath=FASTMATH)
    def _fast_exp(x):
        if x == types.float32:
            return exp32
        return lambda x: np.exp(x)

    def max32(row, lo, hi):
        key = i32(-2147483648)
        for c in range(lo, hi):
            bits = bits_of_float(row[c])
            ordered = bits ^ ((bits >> 31) & i32(0x7FFFFFFF))
            key = ordered if ordered > key else key
        return float_of_bits(key ^ ((key >> 31) & i32(0x7FFFFFFF)))

    def max64(row, lo, hi):
        m = -np.inf
        for c in range(lo, hi):
            m = max(m, row[c])
        return m

    @overload(row_max, inline="always", fastmath=FASTMATH)
    def _row_max(row, lo, hi):
        return max32 if row.dtype == types.float32 else max64


# ---------------------------------------------------------------------------------------- running
def over_rows(pool: Pool, kernel: Callable, outputs, inputs, extra=(), cost: int = 1, width: int | None = None
              ) -> Step | None:
    """The step running ``kernel(start, stop, *outputs, *inputs, *extra)`` over the rows of
    ``outputs`` and ``inputs`` viewed as C-contiguous ``[rows, C]`` (``C``: their last dim, or
    ``width`` columns; None: not one float dtype, or no such views), each thread over its block of
    rows. The compiled loops see their rows contiguous, so LLVM vectorizes them."""
    rows = [as_rows(a, width) for a in (*outputs, *inputs)]
    if float_dtype(*outputs, *inputs) is None or any(r is None or not r.flags.c_contiguous for r in rows) \
            or len({r.shape[0] for r in rows}) != 1:
        return None
    total = rows[0].shape[0]
    return split_rows(pool, kernel, total, sum(r.size for r in rows[:1]) * cost, (*rows, *extra))


def split_rows(pool: Pool, kernel: Callable, total: int, work: int, arguments: tuple) -> Step:
    """The step running ``kernel(start, stop, *arguments)`` over ``[0, total)`` split over the pool."""
    ranges = pool.split(total, work)
    if len(ranges) == 1:
        return lambda: kernel(0, total, *arguments)
    return lambda: pool.run(lambda start, stop, thread: kernel(start, stop, *arguments), ranges)


# ---------------------------------------------------------------------------------------- SiLU family
# float32 constants keep float32 arithmetic float32 (and float64 float64)
ONE, ZERO, INF = np.float32(1), np.float32(0), np.float32(np.inf)

# In the reference's order of operations: sigmoid(g) = 1 / (1 + exp(-g)), silu'(g) = s (1 + g (1 - s)).
# The gate and up operands are column ranges [at, at + width) of their arrays: the halves of a packed
# gate_up, or whole arrays.
@compiled
def _silu_rows(start, stop, out, g):
    for r in range(start, stop):
        o, gs = out[r], g[r]
        for c in range(o.shape[0]):
            x = gs[c]
            o[c] = x * (ONE / (ONE + fast_exp(-x)))


@compiled
def _swiglu_rows(start, stop, out, g, u, g_at, u_at):
    width = out.shape[1]
    for r in range(start, stop):
        o, gs, us = out[r], g[r, g_at:g_at + width], u[r, u_at:u_at + width]
        for c in range(width):
            x = gs[c]
            o[c] = (ONE / (ONE + fast_exp(-x))) * x * us[c]


@compiled
def _silu_backward_rows(start, stop, d_x, d_out, g):
    for r in range(start, stop):
        dx, dy, gs = d_x[r], d_out[r], g[r]
        for c in range(dx.shape[0]):
            x = gs[c]
            s = ONE / (ONE + fast_exp(-x))
            dx[c] = dy[c] * (((ONE - s) * x + ONE) * s)


@compiled
def _swiglu_backward_rows(start, stop, d_gate, d_up, d_out, g, u, d_gate_at, d_up_at, g_at, u_at):
    width = d_out.shape[1]
    for r in range(start, stop):
        dg, du = d_gate[r, d_gate_at:d_gate_at + width], d_up[r, d_up_at:d_up_at + width]
        dy, gs, us = d_out[r], g[r, g_at:g_at + width], u[r, u_at:u_at + width]
        for c in range(width):
            x, up, grad = gs[c], us[c], dy[c]
            s = ONE / (ONE + fast_exp(-x))
            dg[c] = grad * up * (((ONE - s) * x + ONE) * s)
            du[c] = grad * (s * x)


EXP_COST = 2


def _same_shapes(*arrays: np.ndarray) -> bool:
    return len({a.shape for a in arrays}) == 1


def silu(pool: Pool, outputs, inputs, params) -> Step | None:
    if not _same_shapes(*outputs, *inputs):
        return None
    return over_rows(pool, _silu_rows, outputs, inputs, cost=EXP_COST)


def silu_backward(pool: Pool, outputs, inputs, params) -> Step | None:
    if not _same_shapes(*outputs, *inputs):
        return None
    return over_rows(pool, _silu_backward_rows, outputs, inputs, cost=EXP_COST)


def swiglu(pool: Pool, outputs, inputs, params) -> Step | None:
    if not _same_shapes(*outputs, *inputs):
        return None
    return over_rows(pool, _swiglu_rows, outputs, inputs, (0, 0), cost=EXP_COST)


def swiglu_backward(pool: Pool, outputs, inputs, params) -> Step | None:
    if not _same_shapes(*outputs, *inputs):
        return None
    return over_rows(pool, _swiglu_backward_rows, outputs, inputs, (0, 0, 0, 0), cost=EXP_COST)


def fused_split_swiglu(pool: Pool, outputs, inputs, params) -> Step | None:
    (out,), (gate_up,) = outputs, inputs
    width = out.shape[-1]
    if gate_up.shape != (*out.shape[:-1], 2 * width):
        return None
    return over_rows(pool, _swiglu_rows, [out], [gate_up, gate_up], (0, width), cost=EXP_COST)


def fused_split_swiglu_backward(pool: Pool, outputs, inputs, params) -> Step | None:
    (d_gate_up,), (d_out, gate_up) = outputs, inputs
    width = d_out.shape[-1]
    if not _same_shapes(d_gate_up, gate_up) or gate_up.shape != (*d_out.shape[:-1], 2 * width):
        return None
    return over_rows(pool, _swiglu_backward_rows, [d_gate_up, d_gate_up], [d_out, gate_up, gate_up],
                     (0, width, 0, width), cost=EXP_COST)


KERNELS: dict[str, Callable] = {fn.__name__: fn for fn in (
    silu, silu_backward, swiglu, swiglu_backward, fused_split_swiglu, fused_split_swiglu_backward)}


# ---------------------------------------------------------------------------------------- attention
# The elementwise work of an attention strip (:mod:`~modeldsl.kernels.cpu.attention` runs its products
# on BLAS): a strip is ``[stacked rows, span]``, its row ``r`` query ``r % rows`` of the block, of the
# stack's head ``r // rows``, its column ``c`` key ``j_lo + c``; ``shift`` is the distance ``i - j``
# of its first row and column. A key is seen where ``0 <= d`` (causal) and ``|d| < window`` (a window).
# ``slopes``: the ALiBi slopes ``[kv heads, query heads]`` of the stack (``[0, 0]``: none).
@helper
def _seen(d0, span, causal, window):
    """The columns ``[lo, hi)`` a row whose distance at column 0 is ``d0`` sees."""
    hi = min(span, d0 + 1) if causal else (min(span, d0 + window) if window > 0 else span)
    lo = max(0, d0 - window + 1) if window > 0 else 0
    return lo, max(hi, lo)


@helper
def _scale_scores(seen, scale, slope, d_first, alibi):
    """``seen = scale seen - slope |d|`` (no ALiBi: ``scale seen``), ``d_first`` the distance at its
    first column."""
    if alibi:
        for c in range(seen.shape[0]):
            seen[c] = seen[c] * scale - slope * np.float32(abs(d_first - c))
    else:
        for c in range(seen.shape[0]):
            seen[c] = seen[c] * scale


@helper
def _slope(slopes, head):
    return slopes[head // slopes.shape[1], head % slopes.shape[1]] if slopes.shape[0] else ZERO


# The loops run over the slice of the keys a row sees, from 0: over range(lo, hi) LLVM vectorizes none.
@compiled
def softmax_strip(s, lse, scale, slopes, rows, shift, causal, window):
    """``s = softmax(scale s - slope |d|)`` over the keys each row sees (the others 0) and ``lse`` its
    log-sum-exp, row by row."""
    span = s.shape[1]
    for r in range(s.shape[0]):
        d0 = shift + r % rows
        lo, hi = _seen(d0, span, causal, window)
        row = s[r]
        seen = row[lo:hi]
        _scale_scores(seen, scale, _slope(slopes, r // rows), d0 - lo, slopes.shape[0] > 0)
        m = row_max(seen, 0, seen.shape[0])
        total = ZERO * scale
        for c in range(seen.shape[0]):
            e = fast_exp(seen[c] - m)
            seen[c] = e
            total += e
        inverse = ONE / total
        for c in range(seen.shape[0]):
            seen[c] *= inverse
        row[:lo] = 0
        row[hi:] = 0
        lse[r] = m + np.log(total)


@compiled
def probabilities_strip(s, lse, scale, slopes, rows, shift, causal, window):
    """``s = exp(scale s - slope |d| - lse)`` over the keys each row sees (the others 0)."""
    span = s.shape[1]
    for r in range(s.shape[0]):
        d0 = shift + r % rows
        lo, hi = _seen(d0, span, causal, window)
        row = s[r]
        seen = row[lo:hi]
        _scale_scores(seen, scale, _slope(slopes, r // rows), d0 - lo, slopes.shape[0] > 0)
        offset = lse[r]
        for c in range(seen.shape[0]):
            seen[c] = fast_exp(seen[c] - offset)
        row[:lo] = 0
        row[hi:] = 0


@compiled
def score_grads_strip(d_s, p, d_out, out, scale):
    """``d_s = scale p (d_s - sum(d_out out))`` row by row (``d_s`` holds ``dP = dO V^T``; ``d_out``,
    ``out``: ``[heads, rows, Dv]``, the strip's rows in order)."""
    rows = d_out.shape[1]
    for r in range(d_s.shape[0]):
        dy, o = d_out[r // rows, r % rows], out[r // rows, r % rows]
        delta = ZERO * scale
        for e in range(dy.shape[0]):
            delta += dy[e] * o[e]
        grad, prob = d_s[r], p[r]
        for c in range(grad.shape[0]):
            grad[c] = prob[c] * (grad[c] - delta) * scale


# ---------------------------------------------------------------------------------------- cross-entropy
@compiled
def cross_entropy_rows(logits, first, column, valid, scale, lse, per_row, losses, grads):
    """Rows ``first + r`` of a cross-entropy for each row ``r`` of ``logits``: with ``losses`` their
    ``lse = log(sum(exp(l - m))) + m`` (``m`` the row max, 0 when not finite) and loss ``lse -
    l[label]`` (0 where not ``valid``); with ``grads`` the row overwritten by ``(exp(l - lse) -
    onehot) scale`` (``lse`` then given, or just computed)."""
    for r in range(logits.shape[0]):
        row, at = logits[r], first + r
        if losses:
            m = row_max(row, 0, row.shape[0])
            if not np.isfinite(m):
                m = ZERO * m
            total = ZERO * m
            for c in range(row.shape[0]):
                total += fast_exp(row[c] - m)
            lse[at] = np.log(total) + m
            per_row[at] = lse[at] - row[column[at]] if valid[at] else ZERO * m
        if grads:
            offset, factor = lse[at], scale[at]
            label = row[column[at]]
            for c in range(row.shape[0]):
                row[c] = fast_exp(row[c] - offset) * factor
            if valid[at]:
                row[column[at]] = (fast_exp(label - offset) - ONE) * factor


# ---------------------------------------------------------------------------------------- RoPE
@compiled
def rope_rows(start, stop, x, out, freqs, bthd, interleaved, inverse):
    """Tokens ``start .. stop - 1`` (flattened ``b * T + t``) of ``out = rope(x)`` (``inverse``: the
    backward's rotation by ``-angle``) for every head; ``x``, ``out`` in their layout (bthd or bhtd),
    ``freqs [T, D / 2, 2]`` the cosines and sines. Each pair is read before it is written (in place)."""
    tokens = x.shape[1] if bthd else x.shape[2]
    heads = x.shape[2] if bthd else x.shape[1]
    half = freqs.shape[1]
    for item in range(start, stop):
        b, t = item // tokens, item % tokens
        angles = freqs[t]
        for h in range(heads):
            xs = x[b, t, h] if bthd else x[b, h, t]
            o = out[b, t, h] if bthd else out[b, h, t]
            for i in range(half):
                cos, sin = angles[i, 0], angles[i, 1]
                if inverse:
                    sin = -sin
                first, second = (2 * i, 2 * i + 1) if interleaved else (i, i + half)
                a, c = xs[first], xs[second]
                o[first] = a * cos - c * sin
                o[second] = c * cos + a * sin


# ---------------------------------------------------------------------------------------- RMSNorm
@compiled
def rmsnorm_rows(start, stop, y, rstd, x, weight, eps, residual, value, fused):
    """Rows ``start .. stop - 1`` of ``y = x rstd w``, ``rstd = 1 / sqrt(mean(x^2) + eps)``; ``fused``:
    ``x`` first written as ``residual + value``."""
    width = x.shape[1]
    for r in range(start, stop):
        xs = x[r]
        if fused:
            a, b = residual[r], value[r]
            for c in range(width):
                xs[c] = a[c] + b[c]
        total = ZERO * eps
        for c in range(width):
            total += xs[c] * xs[c]
        scale = ONE / np.sqrt(total / width + eps)
        rstd[r] = scale
        ys = y[r]
        for c in range(width):
            ys[c] = xs[c] * scale * weight[c]


@compiled
def rmsnorm_backward_rows(start, stop, d_x, d_y, x, weight, rstd, d_next, fused, column_sums):
    """Rows ``start .. stop - 1`` of ``d_x = r g - x r^3 mean(g x)`` (``g = d_y w``, plus ``d_next``
    where ``fused``), and their ``d_y x r`` added into ``column_sums`` (the weight's gradient)."""
    width = x.shape[1]
    for r in range(start, stop):
        dy, xs, scale = d_y[r], x[r], rstd[r]
        mean = ZERO * scale
        for c in range(width):
            column_sums[c] += dy[c] * xs[c] * scale
            mean += dy[c] * weight[c] * xs[c]
        mean /= width
        cube = scale * scale * scale * mean
        dx = d_x[r]
        if fused:
            nxt = d_next[r]
            for c in range(width):
                dx[c] = nxt[c] + (scale * (dy[c] * weight[c]) - xs[c] * cube)
        else:
            for c in range(width):
                dx[c] = scale * (dy[c] * weight[c]) - xs[c] * cube
