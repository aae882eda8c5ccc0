"""CPU attention: blocked causal/windowed/GQA attention, its backward, and attention over a KV cache.

The queries go in blocks of ``rows`` rows (16 to 128, fewer the longer the
keys, so a block's score strip ``[rows, keys]`` stays in cache); a block
multiplies only the contiguous range of keys it can see (causal: up to its
last query; a sliding window: from its first query's window on), so fully
masked key blocks are never computed and the ``T x T`` score matrix never
exists. The masked corner of a strip is set to ``-inf`` through a strided
view of one 1-d mask over the query-key distance ``d = i - j`` (the element
``[r, c]`` of a strip is ``mask[shift + r - c]``): no per-block mask arrays.
ALiBi subtracts ``slope_h |d|`` the same way. Query head ``h`` reads kv head
``h // (Hq / Hkv)`` directly, without repeating K and V. Attention-logit
softcapping (``softcap`` c > 0, Gemma 2) caps the scaled scores to ``c tanh(s /
c)`` before ALiBi and the mask, as the reference; the backward keeps ``tanh(s /
c)`` of its strip and multiplies ``dS`` by ``1 - tanh^2`` (without a cap, every
step is the one it was).

A work item is a stack of query heads: some heads of one kv group, or the
whole groups of some kv heads, of one batch row, as many as fit
:data:`STACK` scores (short keys: all the heads of a batch row; long keys:
one head), as 4-d views ``[kv heads, query heads, rows, D]`` against
``[kv heads, 1, span, D]`` (broadcast, no repeat). Every step is then one
numpy call over the whole stack (one stacked ``np.matmul(out=)``, one ufunc
for each softmax step, the masks broadcast over it): each call is large, so
the pool's threads, which take the GIL between calls, hand it over seldom
(small calls serialize them on the GIL's wake-ups).

The forward computes a strip's scores, its row max ``m``, ``lse = m + log sum
exp(s - m)`` and ``P = exp(s - lse)`` (the whole strip at once, no online
rescale; a strip of whole rows in the reference's very steps, so it gives its
bits), and writes ``out = P V`` and ``lse`` straight into their views
(``bthd`` operands are strided views of ``[B, T, H, D]``; no copies).
Work items are the (batch, head stack, query block) triples, split over the
pool. The backward recomputes ``P = exp(s - lse)`` per strip and runs over
(batch, kv head stack) pairs: each thread sums ``dK`` and ``dV`` of its kv
heads over the group's query heads (a stack's heads first, in their order,
as the reference) and query blocks, in a fixed order that depends on the
shapes only, in scratch accumulators, so no two threads write the same rows
and the result is the same on every run and thread count. Every product is
one ``np.matmul(out=)`` on a one-thread BLAS.

Packed rows (``segments [B, Tk]``, the example id of every key; the queries' are
those of the last Tq keys): a query sees only the keys of its own example. Each
run first copies the ids (int32) and, per batch row, where the ids never
decrease (examples one after another, as packing lays them out), the first key of
every query's example: a block's key range then starts at its first query's
(:meth:`Segments.narrow`), so the examples before it are never multiplied. A strip
that holds more than one example gets the keys of the others masked to ``-inf``
(numpy: a boolean ``[rows, span]`` mask of unequal ids, in per-thread scratch;
compiled: the strip kernels compare the ids), one that holds a single example
runs as without segments. Without segments nothing of this runs: the same steps
and bits as before.
"""

from __future__ import annotations

import math
from functools import partial

import numpy as np
from numpy.lib.stride_tricks import as_strided

from modeldsl.kernels.cpu import compiled
from modeldsl.kernels.cpu.pool import Pool, carved_bytes
from modeldsl.kernels.cpu.tiles import Step, float_dtype

STRIP = 1 << 16  # elements of one block's score strip: the backward's three strips stay in a 1 MB L2
STACK = 1 << 17  # elements of a work item's stacked strips (short rows): numpy calls of ~100 us, few GIL handoffs
MIN_ROWS, MAX_ROWS = 16, 128
LAYOUTS = ("bhtd", "bthd")


def _heads_first(layout: str, *arrays: np.ndarray | None) -> tuple:
    """``[B, H, T, D]`` views of ``layout``'s operands (``bthd``: swapped axes, no copy)."""
    return tuple(a.swapaxes(1, 2) if a is not None and layout == "bthd" else a for a in arrays)


def _block_rows(tk: int, window: int | None, causal: bool) -> int:
    reach = tk if window is None else min(tk, MAX_ROWS + 2 * window)
    return max(MIN_ROWS, min(MAX_ROWS, STRIP // max(reach, 1)))


def _windows(line: np.ndarray, rows: int) -> np.ndarray:
    """The read-only view ``[rows, len(line)]`` whose ``[r, x]`` is ``line[r + x]`` (``line`` padded
    at its end), made once: :func:`_diagonal` then only slices it."""
    padded = np.concatenate([line, np.zeros(rows, line.dtype)])
    step = padded.strides[0]
    return as_strided(padded, shape=(rows, line.shape[0]), strides=(step, step), writeable=False)


def _diagonal(windows: np.ndarray, center: int, rows: int, cols: int) -> np.ndarray:
    """The ``[rows, cols]`` view whose ``[r, c]`` is ``line[center + r - c]``."""
    return windows[:rows, center - cols + 1:center + 1][:, ::-1]


class Segments:
    """The example ids of packed rows, read at the start of each run (:meth:`load`): the ids as int32
    ``[B, Tk]``, per batch row whether they never decrease and the first key of each key's run of
    equal ids; all in arrays made once, with per-thread boolean masks ``[rows x span]``."""

    def __init__(self, segments: np.ndarray, g: Attention):
        self.view, self.g = segments, g
        batch, keys = segments.shape
        self.ids = np.empty((batch, keys), np.int32)
        self.first = np.empty((batch, keys), np.int64)
        self.steps = np.empty((batch, max(keys - 1, 0)), bool)
        self.sorted = np.empty(batch, bool)
        self.index = np.arange(keys, dtype=np.int64)
        self.masks = np.empty((g.pool.threads, g.rows * g.span), bool)

    def load(self) -> None:
        """This run's ids, their rows' order and each key's first key of its run."""
        np.copyto(self.ids, self.view, casting="unsafe")
        ids, steps = self.ids, self.steps
        np.less(ids[:, 1:], ids[:, :-1], out=steps)
        np.logical_not(np.any(steps, axis=1, out=self.sorted), out=self.sorted)
        np.not_equal(ids[:, 1:], ids[:, :-1], out=steps)
        self.first[:, 0] = 0
        np.multiply(steps, self.index[1:], out=self.first[:, 1:])
        np.maximum.accumulate(self.first, axis=1, out=self.first)

    def narrow(self, b: int, i0: int, i1: int, j_lo: int, j_hi: int) -> tuple[int, bool]:
        """(the first key queries ``i0 .. i1 - 1`` of row ``b`` may see, whether their strip of keys
        ``.. j_hi`` holds another example than theirs: it needs the mask)."""
        g, ids = self.g, self.ids[b]
        first_q, last_q = i0 + g.tk - g.tq, i1 - 1 + g.tk - g.tq
        if not self.sorted[b]:
            return j_lo, True
        j_lo = max(j_lo, int(self.first[b, first_q]))
        lo, hi = min(j_lo, first_q), max(j_hi - 1, last_q)
        return j_lo, bool(ids[lo] != ids[hi])

    def mask(self, s: np.ndarray, b: int, i0: int, i1: int, j_lo: int, j_hi: int, thread: int,
             minus_inf: np.ndarray) -> None:
        """``s [..., rows, span]`` at ``-inf`` where a key's id is not its query's."""
        g, ids = self.g, self.ids[b]
        rows, span = i1 - i0, j_hi - j_lo
        other = self.masks[thread, :rows * span].reshape(rows, span)
        np.not_equal(ids[i0 + g.tk - g.tq:i1 + g.tk - g.tq, None], ids[None, j_lo:j_hi], out=other)
        np.copyto(s, minus_inf, where=other)

    def strip(self, b: int, i0: int, i1: int, j_lo: int, j_hi: int) -> tuple[np.ndarray, np.ndarray]:
        """The compiled strip kernels' ids: of the block's queries and of the strip's keys."""
        ids, shift = self.ids[b], self.g.tk - self.g.tq
        return ids[i0 + shift:i1 + shift], ids[j_lo:j_hi]


class Attention:
    """The shapes, masks and scratch of one attention launch; ``tk`` may change per run (a KV cache).
    With ``jit``, a strip's elementwise work (scale, ALiBi, mask, softmax; the backward's ``dS``) is
    one call of a compiled kernel (:mod:`~modeldsl.kernels.cpu.compiled`) instead of numpy passes.
    ``segments`` (packed rows, :class:`Segments`) where the launch has them."""

    segments: Segments | None = None

    def __init__(self, pool: Pool, q, k, v, dtype: np.dtype, causal: bool, softmax_scale, window: int | None,
                 alibi: bool, jit: bool = False, softcap: float = 0.0):
        self.pool, self.dtype, self.jit = pool, dtype, jit
        self.softcap = dtype.type(softcap) if softcap else None  # c of c tanh(s / c); None: no cap
        self.batch, self.heads, self.tq, self.depth = q.shape
        self.kv_heads, self.capacity = k.shape[1], k.shape[2]
        self.group = self.heads // self.kv_heads
        self.value_depth = v.shape[-1]
        self.tk = self.capacity
        self.causal, self.window = causal, window
        self.scale = dtype.type(1.0 / math.sqrt(self.depth) if softmax_scale is None else softmax_scale)
        self.rows = min(_block_rows(self.capacity, window, causal), max(self.tq, 1))
        self.blocks = -(-self.tq // self.rows)
        self.span = self.capacity if window is None else min(self.capacity, self.rows + 2 * window)
        self.stack_kv, self.stack_q = _stack(self.kv_heads, self.group, STACK // (self.rows * self.span),
                                             -(-pool.threads // self.batch))
        self.stack = self.stack_kv * self.stack_q
        distance = np.arange(-(self.capacity - 1), self.capacity)  # d = i - j at index d + capacity - 1
        self.masked = _windows(~self._allowed(distance), self.rows)
        self.distance = _windows(np.abs(distance).astype(dtype), self.rows) if alibi else None
        self.minus_inf = np.array(-np.inf, dtype)

    def _allowed(self, d: np.ndarray) -> np.ndarray:
        allowed = d >= 0 if self.causal else np.ones(d.shape, bool)
        if self.window is not None:
            allowed &= (d < self.window) if self.causal else (np.abs(d) < self.window)
        return allowed

    def keys(self, i0: int, i1: int) -> tuple[int, int]:
        """The keys ``[j_lo, j_hi)`` queries ``i0 .. i1 - 1`` see (positions ``i + tk - tq``)."""
        first, last = i0 + self.tk - self.tq, i1 - 1 + self.tk - self.tq
        hi = last + 1 if self.causal else self.tk
        lo = 0
        if self.window is not None:
            lo = max(0, first - self.window + 1)
            if not self.causal:
                hi = min(self.tk, last + self.window)
        return lo, hi

    def scores(self, s: np.ndarray, wide: np.ndarray, q_block, k_span, i0: int, j_lo: int, slope,
               tanh: np.ndarray | None = None) -> None:
        """``s = cap(scale q k^T) - slope |d|``, masked keys at ``-inf``, for a stack ``[kv, heads, rows,
        span]`` (``k_span``: ``[kv, 1, span, D]``; ``slope``: ``[kv, heads, 1, 1]`` or None; ``wide``:
        scratch of ``s``'s size). With a softcap c, ``cap(x) = c tanh(x / c)`` (the reference's steps),
        and ``tanh`` (an array of ``s``'s shape, or None) gets ``tanh(x / c)``."""
        np.matmul(q_block, k_span.swapaxes(-1, -2), out=s)
        if self.scale != 1:
            s *= self.scale
        if self.softcap is not None:
            t = s if tanh is None else tanh
            np.divide(s, self.softcap, out=t)
            np.tanh(t, out=t)
            np.multiply(self.softcap, t, out=s)
        rows, span = s.shape[-2:]
        shift = i0 + self.tk - self.tq - j_lo  # d at [0, 0]
        center = shift + self.capacity - 1
        if slope is not None:
            bias = wide[:s.size].reshape(s.shape)
            np.multiply(_diagonal(self.distance, center, rows, span), slope, out=bias)
            s -= bias
        right = shift + 1 if self.causal else (shift + self.window if self.window is not None else span)
        left = shift + rows - self.window if self.window is not None else 0
        if left > 0 and left >= right:
            left, right = span, span  # the two masked corners meet: mask the whole strip once
        for a, b in ((0, min(left, span)), (max(right, 0), span)):
            if b > a:
                np.copyto(s[..., a:b], self.minus_inf, where=_diagonal(self.masked, center, rows, span)[:, a:b])


    def shift(self, i0: int, j_lo: int) -> int:
        """The distance ``i - j`` at the first row and column of a strip."""
        return i0 + self.tk - self.tq - j_lo

    def window_or_0(self) -> int:
        return self.window or 0

    def softcap_or_0(self) -> float:
        return 0.0 if self.softcap is None else float(self.softcap)

    def work(self) -> int:
        return self.batch * self.heads * self.tq * self.tk * self.depth // 64

    def block(self, block: int) -> tuple[int, int, int, int]:
        """Query block ``block``'s rows ``[i0, i1)`` and the keys ``[j_lo, j_hi)`` they see."""
        i0, i1 = block * self.rows, min(block * self.rows + self.rows, self.tq)
        return (i0, i1, *self.keys(i0, i1))

    def row_block(self, b: int, block: int) -> tuple[int, int, int, int, bool]:
        """:meth:`block` in batch row ``b``, its keys narrowed to its queries' examples (packed rows), and
        whether its strip needs the segment mask."""
        i0, i1, j_lo, j_hi = self.block(block)
        if self.segments is None:
            return i0, i1, j_lo, j_hi, False
        j_lo, masked = self.segments.narrow(b, i0, i1, j_lo, j_hi)
        return i0, i1, j_lo, j_hi, masked


def _stack(kv_heads: int, group: int, fit: int, parts: int) -> tuple[int, int]:
    """``(kv heads, query heads of each)`` that one work item stacks: at most ``fit`` query heads, a
    divisor of the group, or whole groups of a divisor of the kv heads that leaves ``parts`` stacks per
    batch row (numpy calls then cover the whole stack, fewer and larger: the threads hand the GIL
    over less often). The query heads depend on the shapes only, so ``dK``, ``dV`` sum in the same
    order on any number of threads."""
    if fit < group:
        return 1, max(n for n in range(1, max(fit, 1) + 1) if group % n == 0)
    stacks = min(parts, kv_heads)  # per batch row
    return max(n for n in range(1, fit // group + 1) if kv_heads % n == 0 and kv_heads // n >= stacks), group


def _grouped(a: np.ndarray | None, kv_heads: int) -> np.ndarray | None:
    """The query-head operand ``[B, H, ...]`` as the view ``[B, kv_heads, H / kv_heads, ...]`` (query
    head ``h`` at ``[:, h // group, h % group]``), never a copy."""
    if a is None:
        return None
    group = a.shape[1] // kv_heads
    shape = (a.shape[0], kv_heads, group, *a.shape[2:])
    strides = (a.strides[0], group * a.strides[1], a.strides[1], *a.strides[2:])
    return as_strided(a, shape=shape, strides=strides, writeable=a.flags.writeable)


def _by_rows(ufunc: np.ufunc, a: np.ndarray, column: np.ndarray, wide: np.ndarray, into_wide: bool = False) -> None:
    """``a = ufunc(a, column[:, None])`` (into ``wide`` with ``into_wide``) for a contiguous ``a``: the
    column is spread into ``wide`` first, since a broadcasting ufunc call allocates iteration buffers."""
    spread = wide[:a.size].reshape(a.shape)
    np.copyto(spread, column[:, None])
    ufunc(a, spread, out=spread if into_wide else a)


def _counts(sizes: list[tuple[int, int]]) -> list[int]:
    """``number`` arrays of ``count`` elements for each ``(count, number)``, as element counts."""
    return [count for count, number in sizes for _ in range(number)]


def _reserve(g: Attention, sizes: list[tuple[int, int]]) -> None:
    g.pool.workspace.reserve(carved_bytes(g.dtype, _counts(sizes)))


def _carve(g: Attention, thread: int, sizes: list[tuple[int, int]]) -> list[np.ndarray]:
    """``thread``'s scratch as ``number`` 1-d arrays of ``count`` elements for each ``(count, number)``."""
    return g.pool.workspace.carve(thread, g.dtype, _counts(sizes))


class Forward:
    """``out, lse`` of one attention, written into their views."""

    def __init__(self, geometry: Attention, q, k, v, out, lse, slopes):
        g = geometry
        self.g = g
        self.q, self.out, self.lse = (_grouped(a, g.kv_heads) for a in (q, out, lse))
        self.k, self.v = k[:, :, None], v[:, :, None]
        self.slopes = None if slopes is None else slopes.reshape(g.kv_heads, g.group, 1, 1)
        self.flat_slopes = _flat_slopes(slopes, g)
        self.sizes = [(g.stack * g.rows * g.span, 2), (g.stack * g.rows, 3)]
        _reserve(g, self.sizes)

    def items(self, start: int, stop: int, thread: int) -> None:
        g = self.g
        strip, wide, m_all, lse_all, inverse_all = _carve(g, thread, self.sizes)
        for item in range(start, stop):
            b, kv, h, block = _item(g, item)
            i0, i1, j_lo, j_hi, masked = g.row_block(b, block)
            rows, span = i1 - i0, j_hi - j_lo
            heads, stack_rows = (g.stack_kv, g.stack_q), g.stack * rows
            kvs, hs = slice(kv, kv + g.stack_kv), slice(h, h + g.stack_q)
            s = strip[:stack_rows * span].reshape(*heads, rows, span)
            if g.jit:
                np.matmul(self.q[b, kvs, hs, i0:i1], self.k[b, kvs, :, j_lo:j_hi].swapaxes(-1, -2), out=s)
                compiled.softmax_strip(s.reshape(stack_rows, span), lse_all[:stack_rows], g.scale,
                                       self.flat_slopes[kvs, hs], rows, g.shift(i0, j_lo), g.causal, g.window_or_0(),
                                       g.softcap_or_0(), g.segments.strip(b, i0, i1, j_lo, j_hi) if masked else None)
            else:
                g.scores(s, wide, self.q[b, kvs, hs, i0:i1], self.k[b, kvs, :, j_lo:j_hi], i0, j_lo,
                         None if self.slopes is None else self.slopes[kvs, hs])
                if masked:
                    g.segments.mask(s, b, i0, i1, j_lo, j_hi, thread, g.minus_inf)
                self.softmax(s.reshape(stack_rows, span), wide, m_all[:stack_rows], lse_all[:stack_rows],
                             inverse_all[:stack_rows], whole_rows=span == g.tk)
            np.matmul(s, self.v[b, kvs, :, j_lo:j_hi], out=self.out[b, kvs, hs, i0:i1])
            np.copyto(self.lse[b, kvs, hs, i0:i1], lse_all[:stack_rows].reshape(*heads, rows), casting="unsafe")

    @staticmethod
    def softmax(s: np.ndarray, wide: np.ndarray, m: np.ndarray, lse: np.ndarray, inverse: np.ndarray,
                whole_rows: bool) -> None:
        """``s = exp(s - lse)``, ``lse = m + log(sum exp(s - m))``, ``m`` the row max. A strip of
        whole rows takes the reference's steps (two exps: bitwise its values); a shorter one,
        which sums its rows in another order anyway, one exp and a product by ``1 / l``."""
        np.max(s, axis=1, out=m)
        if whole_rows:
            _by_rows(np.subtract, s, m, wide, into_wide=True)
            e = wide[:s.size].reshape(s.shape)
            np.exp(e, out=e)
            np.sum(e, axis=1, out=lse)
            np.log(lse, out=lse)
            lse += m
            _by_rows(np.subtract, s, lse, wide)
            np.exp(s, out=s)
            return
        _by_rows(np.subtract, s, m, wide)
        np.exp(s, out=s)
        np.sum(s, axis=1, out=lse)
        np.reciprocal(lse, out=inverse)
        _by_rows(np.multiply, s, inverse, wide)
        np.log(lse, out=lse)
        lse += m

    def __call__(self) -> None:
        g = self.g
        if g.segments is not None:
            g.segments.load()
        g.pool.blocks(self.items, g.batch * (g.heads // g.stack) * g.blocks, g.work())


def _item(g: Attention, item: int) -> tuple[int, int, int, int]:
    """Forward work item ``item`` as (batch, its first kv head, its first query head within the
    group, query block)."""
    stack, block = divmod(item, g.blocks)
    b, stack = divmod(stack, g.heads // g.stack)
    kv, h = divmod(stack, g.group // g.stack_q)
    return b, kv * g.stack_kv, h * g.stack_q, block


class Backward:
    """``d_q, d_k, d_v`` of one attention from its saved ``out`` and ``lse``."""

    def __init__(self, geometry: Attention, d_out, q, k, v, out, lse, slopes, d_q, d_k, d_v):
        g = geometry
        self.g = g
        self.d_out, self.q, self.out, self.lse, self.d_q = (_grouped(a, g.kv_heads) for a in (d_out, q, out, lse, d_q))
        self.k, self.v = k[:, :, None], v[:, :, None]
        self.slopes = None if slopes is None else slopes.reshape(g.kv_heads, g.group, 1, 1)
        self.flat_slopes = _flat_slopes(slopes, g)
        self.d_k, self.d_v = d_k, d_v
        depth = max(g.depth, g.value_depth)
        self.sizes = [(g.stack * g.rows * g.span, 3), (g.stack * g.span * depth, 1), (g.stack_kv * g.span * depth, 1),
                      (g.stack * g.rows * depth, 1), (g.stack * g.rows, 2), (g.stack_kv * g.capacity * g.depth, 1),
                      (g.stack_kv * g.capacity * g.value_depth, 1)]
        if g.softcap is not None:  # a strip for tanh(s / c) (the compiled path: 1 - tanh^2)
            self.sizes.append((g.stack * g.rows * g.span, 1))
        _reserve(g, self.sizes)

    def pairs(self, start: int, stop: int, thread: int) -> None:
        """The kv heads ``stack_kv * start .. stack_kv * stop - 1`` of every batch row (flattened):
        ``dK``, ``dV`` summed over their query heads and blocks in scratch, in a fixed order."""
        g = self.g
        scratch = _carve(g, thread, self.sizes)
        tanh_all = scratch.pop() if g.softcap is not None else None
        dk_all, dv_all = scratch[-2:]
        dk = dk_all[:g.stack_kv * g.tk * g.depth].reshape(g.stack_kv, g.tk, g.depth)
        dv = dv_all[:g.stack_kv * g.tk * g.value_depth].reshape(g.stack_kv, g.tk, g.value_depth)
        for pair in range(start, stop):
            b, kv = divmod(pair, g.kv_heads // g.stack_kv)
            kvs = slice(kv * g.stack_kv, (kv + 1) * g.stack_kv)
            dk.fill(0)
            dv.fill(0)
            for h in range(0, g.group, g.stack_q):
                for block in range(g.blocks):
                    self.block(b, kvs, slice(h, h + g.stack_q), block, scratch[:-2], dk, dv, tanh_all, thread)
            np.copyto(self.d_k[b, kvs], dk)
            np.copyto(self.d_v[b, kvs], dv)

    def block(self, b: int, kvs: slice, hs: slice, block: int, scratch, dk, dv, tanh_all=None, thread: int = 0) -> None:
        """One query block of the query heads ``hs`` of the kv heads ``kvs``: their ``d_q`` rows, and
        their share of ``dk``, ``dv`` added in (``tanh_all``: a strip's scratch, with a softcap)."""
        g = self.g
        p_all, dp_all, wide, part_all, sum_all, od_all, di_all, lse_all = scratch
        i0, i1, j_lo, j_hi, masked = g.row_block(b, block)
        rows, span = i1 - i0, j_hi - j_lo
        heads, stack_rows = (g.stack_kv, g.stack_q), g.stack * rows
        q, k_span, v_span = self.q[b, kvs, hs, i0:i1], self.k[b, kvs, :, j_lo:j_hi], self.v[b, kvs, :, j_lo:j_hi]
        d_out = self.d_out[b, kvs, hs, i0:i1]
        p = p_all[:stack_rows * span].reshape(*heads, rows, span)
        lse = lse_all[:stack_rows]
        np.copyto(lse.reshape(*heads, rows), self.lse[b, kvs, hs, i0:i1], casting="unsafe")
        p_rows = p.reshape(stack_rows, span)
        tanh = None if tanh_all is None else tanh_all[:stack_rows * span].reshape(*heads, rows, span)
        if g.jit:  # P in one compiled call (and with a softcap, its derivatives 1 - tanh^2 into tanh)
            np.matmul(q, k_span.swapaxes(-1, -2), out=p)
            compiled.probabilities_strip(p_rows, lse, g.scale, self.flat_slopes[kvs, hs], rows,
                                         g.shift(i0, j_lo), g.causal, g.window_or_0(), g.softcap_or_0(),
                                         None if tanh is None else tanh.reshape(stack_rows, span),
                                         g.segments.strip(b, i0, i1, j_lo, j_hi) if masked else None)
        else:
            g.scores(p, wide, q, k_span, i0, j_lo, None if self.slopes is None else self.slopes[kvs, hs], tanh)
            if masked:
                g.segments.mask(p, b, i0, i1, j_lo, j_hi, thread, g.minus_inf)
            _by_rows(np.subtract, p_rows, lse, wide)
            np.exp(p_rows, out=p_rows)
        part = part_all[:g.stack * span * g.value_depth].reshape(*heads, span, g.value_depth)
        np.matmul(p.swapaxes(-1, -2), d_out, out=part)
        _add_heads(dv[:, j_lo:j_hi], part, sum_all)
        d_s = dp_all[:stack_rows * span].reshape(*heads, rows, span)
        np.matmul(d_out, v_span.swapaxes(-1, -2), out=d_s)
        d_s_rows = d_s.reshape(stack_rows, span)
        if g.jit:  # dS, its scale (and softcap factor) included, in one compiled call
            compiled.score_grads_strip(d_s_rows, p_rows, _stacked(d_out), _stacked(self.out[b, kvs, hs, i0:i1]),
                                       g.scale, None if tanh is None else tanh.reshape(stack_rows, span))
        else:
            od = od_all[:stack_rows * g.value_depth].reshape(*heads, rows, g.value_depth)
            np.multiply(d_out, self.out[b, kvs, hs, i0:i1], out=od)
            di = di_all[:stack_rows]
            np.sum(od.reshape(stack_rows, g.value_depth), axis=1, out=di)
            _by_rows(np.subtract, d_s_rows, di, wide)
            d_s *= p
            if tanh is not None:  # the reference's d_s (1 - tanh(s / c)^2)
                np.square(tanh, out=tanh)
                np.subtract(1.0, tanh, out=tanh)
                d_s *= tanh
        part = part_all[:g.stack * span * g.depth].reshape(*heads, span, g.depth)
        np.matmul(d_s.swapaxes(-1, -2), q, out=part)
        if not g.jit:
            part *= g.scale
        _add_heads(dk[:, j_lo:j_hi], part, sum_all)
        if g.jit:
            np.matmul(d_s, k_span, out=self.d_q[b, kvs, hs, i0:i1])
            return
        d_q = od_all[:stack_rows * g.depth].reshape(*heads, rows, g.depth)
        np.matmul(d_s, k_span, out=d_q)
        np.multiply(d_q, g.scale, out=self.d_q[b, kvs, hs, i0:i1])

    def __call__(self) -> None:
        g = self.g
        if g.segments is not None:
            g.segments.load()
        g.pool.blocks(self.pairs, g.batch * (g.kv_heads // g.stack_kv), 3 * g.work())


def _flat_slopes(slopes: np.ndarray | None, g: Attention) -> np.ndarray:
    """The ALiBi slopes as ``[kv heads, query heads of each]`` (``[0, 0]`` without)."""
    return np.zeros((0, 0), g.dtype) if slopes is None else slopes.reshape(g.kv_heads, g.group)


def _stacked(a: np.ndarray) -> np.ndarray:
    """``[kv heads, query heads, rows, D]`` as the view ``[kv heads x query heads, rows, D]``."""
    view = a.view()
    view.shape = (a.shape[0] * a.shape[1], *a.shape[2:])
    return view


def _add_heads(acc: np.ndarray, part: np.ndarray, scratch: np.ndarray) -> None:
    """``acc [kv, span, D] += part [kv, heads, span, D]`` summed over its heads in their order (one
    head: added as it is; several: their sum first, as the reference sums a group's heads)."""
    if part.shape[1] == 1:
        acc += part[:, 0]
        return
    total = scratch[:acc.size].reshape(acc.shape)
    np.sum(part, axis=1, out=total)
    acc += total


def _geometry(pool: Pool, q, k, v, operands, params, alibi: bool, jit: bool) -> Attention | None:
    """The launch's :class:`Attention`, or None when the reference must run it."""
    dtype = float_dtype(*operands)
    window = params.get("window_size")
    if dtype is None or q.ndim != 4 or k.ndim != 4 or v.shape[:3] != k.shape[:3]:
        return None
    if (window is not None and window <= 0) or k.shape[1] == 0 or q.shape[1] % k.shape[1]:
        return None
    softcap = float(params.get("softcap") or 0.0)
    if softcap and not 0 < dtype.type(softcap) < math.inf:
        return None  # a softcap c must be positive and finite in the operands' dtype (0: none)
    if q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3] or q.shape[2] > k.shape[2]:
        return None
    scale = params.get("softmax_scale")
    jit = jit and compiled.takes(*operands)
    return Attention(pool, q, k, v, dtype, bool(params.get("causal", True)),
                     None if scale is None else float(scale), window, alibi, jit, softcap)


def _slopes(slopes, heads: int):
    if slopes is None:
        return None
    flat = slopes.reshape(-1)
    return flat if flat.shape[0] == heads else False


def _with_segments(geometry: Attention | None, segments: np.ndarray | None) -> Attention | None:
    """The geometry with the launch's segment ids (None: the reference runs the launch: ids that are not
    integers ``[B, Tk]``)."""
    if geometry is None or segments is None:
        return geometry
    if segments.dtype.kind not in "iu" or segments.shape != (geometry.batch, geometry.capacity):
        return None
    geometry.segments = Segments(segments, geometry)
    return geometry


def flash_attention(pool: Pool, outputs, inputs, params, jit: bool = False) -> Step | None:
    """``out, lse = flash_attention(q, k, v, alibi_slopes, segments)``."""
    layout = params.get("layout", "bhtd")
    if layout not in LAYOUTS:
        return None
    q, k, v, slopes, segments = (*inputs, None, None)[:5]
    out, lse = outputs
    q, k, v, out = _heads_first(layout, q, k, v, out)
    if lse.dtype not in (np.float32, np.float64) or lse.shape != q.shape[:3] or out.shape[:3] != q.shape[:3]:
        return None
    slopes = _slopes(slopes, q.shape[1])
    if slopes is False:
        return None
    geometry = _geometry(pool, q, k, v, (q, k, v, out, slopes), params, slopes is not None, jit)
    geometry = _with_segments(geometry, segments)
    return None if geometry is None else Forward(geometry, q, k, v, out, lse, slopes)


def flash_attention_backward(pool: Pool, outputs, inputs, params, jit: bool = False) -> Step | None:
    """``d_q, d_k, d_v = flash_attention_backward(d_out, q, k, v, out, lse, alibi_slopes, segments)``."""
    layout = params.get("layout", "bhtd")
    if layout not in LAYOUTS:
        return None
    d_out, q, k, v, out, lse, slopes, segments = (*inputs, None, None)[:8]
    d_q, d_k, d_v = outputs
    d_out, q, k, v, out, d_q, d_k, d_v = _heads_first(layout, d_out, q, k, v, out, d_q, d_k, d_v)
    if lse.dtype not in (np.float32, np.float64) or lse.shape != q.shape[:3]:
        return None
    if d_q.shape != q.shape or d_k.shape != k.shape or d_v.shape != v.shape or d_out.shape != out.shape:
        return None
    slopes = _slopes(slopes, q.shape[1])
    if slopes is False:
        return None
    geometry = _geometry(pool, q, k, v, (d_out, q, k, v, out, d_q, d_k, d_v, slopes), params, slopes is not None,
                         jit)
    if geometry is None or out.shape != (*q.shape[:3], v.shape[3]):
        return None
    geometry = _with_segments(geometry, segments)
    if geometry is None:
        return None
    return Backward(geometry, d_out, q, k, v, out, lse, slopes, d_q, d_k, d_v)


def kv_cache_attention(pool: Pool, outputs, inputs, params, jit: bool = False) -> Step | None:
    """``out, lse, k_cache, v_cache = kv_cache_attention(q, k, v, k_cache, v_cache, position)``: k and v
    written into the caches at the runtime ``position``, then attention over the cache up to them."""
    layout = params.get("layout", "bhtd")
    if layout not in LAYOUTS or len(inputs) != 6:
        return None
    q, k, v, k_cache, v_cache, position = inputs
    out, lse = outputs[:2]
    q, k, v, out = _heads_first(layout, q, k, v, out)
    if k_cache.ndim != 4 or k_cache.shape[:2] != k.shape[:2] or v_cache.shape[:2] != v.shape[:2] \
            or k_cache.shape[2] != v_cache.shape[2] or k.shape[2] != q.shape[2]:
        return None
    if lse.dtype not in (np.float32, np.float64) or lse.shape != q.shape[:3]:
        return None
    geometry = _geometry(pool, q, k_cache, v_cache, (q, k, v, k_cache, v_cache, out), params, False, jit)
    if geometry is None:
        return None
    forward = Forward(geometry, q, k_cache, v_cache, out, lse, None)
    where = position.reshape(-1)
    length, capacity = k.shape[2], k_cache.shape[2]

    def step() -> None:
        start = int(where[0])
        end = start + length
        if end > capacity:
            raise ValueError(f"positions {start}..{end - 1} exceed the cache capacity {capacity}")
        np.copyto(k_cache[:, :, start:end], k)
        np.copyto(v_cache[:, :, start:end], v)
        geometry.tk = end
        forward()

    return step


KERNELS = {fn.__name__: fn for fn in (flash_attention, flash_attention_backward, kv_cache_attention)}
JIT_KERNELS = {name: partial(fn, jit=True) for name, fn in KERNELS.items()}  # the compiled strips
