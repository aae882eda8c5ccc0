"""CPU kernels of the cross-entropy loss and of the chunked LM-head loss (``x @ weight^T`` fused with it).

Cross-entropy runs over row tiles: per tile the row max ``m`` (0 where it is
not finite), ``exp(l - m)`` in a scratch tile, its row sums, ``lse = log(sum)
+ m`` and the loss of the label ``lse - l[label]``; its gradient is ``(exp(l -
lse) - onehot) * scale`` written over the tile in place, ``scale`` being d
loss / d row loss (0 on ignored rows). That is the reference's arithmetic
operation for operation, so fp32 and fp64 results are the reference's bit for
bit (also on several threads); the loss is reduced at the end in the
reference's order (numpy's sum of the per-row losses, the mean's division in
float64).

The LM-head kernels go ``chunk`` rows of ``x`` at a time. Per chunk the
threads split its rows: each computes its rows' logits ``x[rows] @ weight^T``
into its rows of the chunk's logits (one matrix, in the first thread's
workspace), the cross-entropy of each row tile in place, and ``d_x[rows] =
d_logits @ weight``. Then the threads split the vocabulary: each owns a slice
of ``d_weight``'s rows and, tile by tile, adds ``d_logits[:, tile]^T @ x`` of
the whole chunk into it (the first chunk's product is written straight over
``d_weight``), so every sum runs over the chunk's rows in the reference's
order. Every product is one-thread BLAS
``matmul(out=)``, and every result is the reference's bit for bit on any
number of threads (BLAS sums each output element over K in the same order
however the output is tiled). Operands of another dtype than fp32/fp64, or not
contiguous rows, get no step: the executor runs the reference.

On the compiled path (``jit``, float32) a row's lse, loss and gradient are one
pass of ``cross_entropy_rows`` in ``compiled.c`` instead of the numpy passes.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from modeldsl.kernels.cpu import compiled
from modeldsl.kernels.cpu.pool import TILE, Pool, aligned, row_tiles, tile_rows
from modeldsl.kernels.cpu.tiles import Step, as_rows, float_dtype
from modeldsl.kernels.reference import row_chunks

WEIGHT_TILE = 1 << 19  # elements of the d_logits columns of a d_weight tile (fewer, larger tiles pack x fewer times)
REDUCTIONS = ("mean", "sum", "none")


class Layout:
    """Named scratch arrays carved out of one thread's workspace buffer."""

    def __init__(self):
        self.fields: dict[str, tuple[int, int, np.dtype]] = {}
        self.nbytes = 0

    def add(self, name: str, count: int, dtype) -> None:
        dtype = np.dtype(dtype)
        self.fields[name] = (self.nbytes, count, dtype)
        self.nbytes += aligned(max(count, 1) * dtype.itemsize)

    def arrays(self, pool: Pool, thread: int) -> dict[str, np.ndarray]:
        (buffer,) = pool.workspace.arrays(thread, self.nbytes, np.uint8, 1)
        return {name: buffer[start:start + count * dtype.itemsize].view(dtype)
                for name, (start, count, dtype) in self.fields.items()}


def tile_layout(layout: Layout, rows: int, vocab: int, dtype) -> None:
    """The scratch of one row tile of the cross-entropy (``rows`` rows of ``vocab`` logits)."""
    layout.add("temp", rows * vocab, dtype)
    for name in ("top", "picked"):
        layout.add(name, rows, dtype)
    layout.add("odd", rows, np.bool_)
    layout.add("index", rows, np.intp)


class Labels:
    """What the labels say about each row, refreshed at every call: counted or ignored, the label's
    column (0 when ignored), the one-hot's value (1 or 0), d loss / d row loss, and the rows'
    losses and lse in the compute dtype."""

    def __init__(self, labels: np.ndarray, dtype: np.dtype, ignore_index: int, vocab: int, tile: int):
        rows = labels.shape[0]
        self.labels, self.dtype, self.ignore_index = labels, dtype, ignore_index
        self.valid, self.ignored = np.zeros(rows, np.bool_), np.zeros(rows, np.bool_)
        self.column = np.zeros(rows, np.intp)
        self.onehot, self.scale = np.zeros(rows, dtype), np.zeros(rows, dtype)
        self.per_row, self.lse = np.zeros(rows, dtype), np.zeros(rows, dtype)
        self.offsets = np.arange(tile, dtype=np.intp) * vocab  # where each row of a tile starts

    def load(self) -> int:
        """Read the labels; the number of counted rows."""
        np.not_equal(self.labels, self.ignore_index, out=self.valid)
        np.logical_not(self.valid, out=self.ignored)
        np.copyto(self.column, self.labels, casting="unsafe")
        np.copyto(self.column, 0, where=self.ignored)
        np.copyto(self.onehot, self.valid)
        return int(np.count_nonzero(self.valid))

    def grad_scale(self, d_loss: np.ndarray, reduction: str, count: int) -> None:
        """d loss / d row loss: ``d_loss`` on counted rows (divided by their count for the mean)."""
        np.copyto(self.scale, d_loss, casting="unsafe")
        self.scale *= self.onehot
        if reduction == "mean":
            with np.errstate(invalid="ignore", divide="ignore"):
                self.scale /= self.dtype.type(count)

    def index(self, out: np.ndarray, lo: int, hi: int) -> np.ndarray:
        """The flat positions of rows ``lo:hi``'s labels in their tile."""
        return np.add(self.offsets[:hi - lo], self.column[lo:hi], out=out[:hi - lo])

    def write(self, loss: np.ndarray, lse: np.ndarray | None, reduction: str, count: int) -> None:
        """The reduced loss (and the lse) into the outputs, as the reference reduces them."""
        if lse is not None:
            np.copyto(lse, self.lse.reshape(lse.shape), casting="unsafe")
        if reduction == "none":
            np.copyto(loss, self.per_row.reshape(loss.shape), casting="unsafe")
            return
        total = np.sum(self.per_row)
        if reduction == "mean":
            with np.errstate(invalid="ignore", divide="ignore"):
                total = np.float64(total) / count
        np.copyto(loss, self.dtype.type(total), casting="unsafe")


def lse_rows(logits: np.ndarray, lse: np.ndarray, ws: dict, n: int) -> None:
    """``log(sum(exp(l - m))) + m`` of each row, ``m`` its max (0 when not finite)."""
    top, odd = ws["top"][:n], ws["odd"][:n]
    temp = ws["temp"][:logits.size].reshape(logits.shape)
    np.max(logits, axis=1, out=top)
    np.isfinite(top, out=odd)
    np.logical_not(odd, out=odd)
    np.copyto(top, 0, where=odd)
    np.subtract(logits, top[:, None], out=temp)
    np.exp(temp, out=temp)
    np.sum(temp, axis=1, out=lse)
    np.log(lse, out=lse)
    lse += top


def row_losses(logits: np.ndarray, labels: Labels, ws: dict, lo: int, hi: int) -> None:
    """The lse and loss of rows ``lo:hi`` (``logits`` their contiguous rows)."""
    n = hi - lo
    lse, picked, per_row = labels.lse[lo:hi], ws["picked"][:n], labels.per_row[lo:hi]
    lse_rows(logits, lse, ws, n)
    np.take(logits.reshape(-1), labels.index(ws["index"], lo, hi), out=picked)
    per_row.fill(0)
    np.subtract(lse, picked, out=per_row, where=labels.valid[lo:hi])


def row_grads(logits: np.ndarray, out: np.ndarray, labels: Labels, ws: dict, lo: int, hi: int) -> None:
    """``(exp(l - lse) - onehot) * scale`` of rows ``lo:hi`` into ``out`` (which may be ``logits``)."""
    n = hi - lo
    picked, flat = ws["picked"][:n], out.reshape(-1)
    np.subtract(logits, labels.lse[lo:hi, None], out=out)
    np.exp(out, out=out)
    index = labels.index(ws["index"], lo, hi)
    np.take(flat, index, out=picked)
    picked -= labels.onehot[lo:hi]
    np.put(flat, index, picked)
    out *= labels.scale[lo:hi, None]


def flat(a: np.ndarray) -> np.ndarray | None:
    """``a`` as a 1-d view (None when that takes a copy)."""
    view = a.view()
    try:
        view.shape = (-1,)
    except AttributeError:
        return None
    return view


def contiguous_rows(a: np.ndarray) -> np.ndarray | None:
    rows = as_rows(a)
    return rows if rows is not None and rows.flags.c_contiguous else None


def loss_params(params: dict) -> tuple[int, str] | None:
    reduction = params.get("reduction", "mean")
    return (int(params.get("ignore_index", -100)), reduction) if reduction in REDUCTIONS else None


def grad_input(d_loss: np.ndarray, dtype: np.dtype, rows: int) -> np.ndarray | None:
    """``d_loss`` broadcast over the rows (None when it would change the compute dtype)."""
    d_loss = np.asarray(d_loss)
    source = flat(d_loss) if d_loss.size == rows else d_loss
    if d_loss.dtype not in (np.dtype(np.float32), dtype) or source is None:
        return None
    try:
        return np.broadcast_to(source, (rows,))
    except ValueError:
        return None


def integer_labels(labels: np.ndarray, rows: int) -> np.ndarray | None:
    labels = flat(labels)
    return labels if labels is not None and labels.dtype.kind in "iu" and labels.size == rows else None


# ----------------------------------------------------------------------------
# cross_entropy and its backward over row tiles of the logits
# ----------------------------------------------------------------------------


def _row_kernel(pool: Pool, logits: np.ndarray, labels: np.ndarray, params: dict, tile_body, dtype=None):
    """(labels state, step running ``tile_body(rows, labels, ws, lo, hi)`` over the row tiles) or None."""
    options = loss_params(params)
    rows2 = contiguous_rows(logits)
    dtype = dtype or float_dtype(logits)
    if options is None or rows2 is None or dtype is None or rows2.shape[1] == 0:
        return None
    total, vocab = rows2.shape
    labels = integer_labels(labels, total)
    if labels is None:
        return None
    per_tile = min(tile_rows(vocab, TILE), max(total, 1))
    layout = Layout()
    tile_layout(layout, per_tile, vocab, dtype)
    pool.workspace.reserve(layout.nbytes)
    state = Labels(labels, dtype, options[0], vocab, per_tile)

    def block(start: int, stop: int, thread: int) -> None:
        ws = layout.arrays(pool, thread)
        for lo, hi in row_tiles(start, stop, per_tile):
            tile_body(rows2, state, ws, lo, hi)

    return state, options[1], partial(pool.blocks, block, total, total * vocab)


def _jit_losses(rows, state: Labels, ws, lo: int, hi: int) -> None:
    compiled.cross_entropy_rows(rows[lo:hi], lo, state.column, state.valid, state.scale, state.lse, state.per_row,
                                True, False)


def _jit_grads(rows, out, state: Labels, ws, lo: int, hi: int) -> None:
    np.copyto(out[lo:hi], rows[lo:hi])
    compiled.cross_entropy_rows(out[lo:hi], lo, state.column, state.valid, state.scale, state.lse, state.per_row,
                                False, True)


def cross_entropy(pool: Pool, outputs, inputs, params, jit: bool = False) -> Step | None:
    (loss, lse), (logits, labels) = outputs, inputs
    jit = jit and compiled.takes(logits)
    made = _row_kernel(pool, logits, labels, params, _jit_losses if jit else lambda rows, state, ws, lo, hi:
                       row_losses(rows[lo:hi], state, ws, lo, hi))
    if made is None:
        return None
    state, reduction, run = made

    def step() -> None:
        count = state.load()
        run()
        state.write(loss, lse, reduction, count)

    return step


def cross_entropy_backward(pool: Pool, outputs, inputs, params, jit: bool = False) -> Step | None:
    (d_logits,), (d_loss, logits, labels, lse) = outputs, inputs
    dtype = float_dtype(logits, d_logits)
    out = contiguous_rows(d_logits)
    if dtype is None or out is None or logits.size != out.size or lse.size != out.shape[0]:
        return None
    d_rows = grad_input(d_loss, dtype, out.shape[0])
    jit = jit and compiled.takes(logits, out)
    made = _row_kernel(pool, logits, labels, params,
                       (lambda rows, state, ws, lo, hi: _jit_grads(rows, out, state, ws, lo, hi)) if jit
                       else lambda rows, state, ws, lo, hi: row_grads(rows[lo:hi], out[lo:hi], state, ws, lo, hi),
                       dtype)
    if made is None or d_rows is None:
        return None
    state, reduction, run = made
    lse_in = flat(lse)

    def step() -> None:
        count = state.load()
        state.grad_scale(d_rows, reduction, count)
        np.copyto(state.lse, lse_in, casting="unsafe")
        run()

    return step


# ----------------------------------------------------------------------------
# The chunked LM head: logits GEMM, cross-entropy and gradient GEMMs per chunk of rows
# ----------------------------------------------------------------------------


class Head:
    """One chunked LM-head launch: ``x [N, C]``, ``weight [V, C]``, the threads' row blocks of each
    chunk and the vocabulary slices of ``d_weight``, and each thread's scratch."""

    def __init__(self, pool: Pool, x, weight, labels, params, dtype, losses: bool, grads: bool,
                 d_x=None, d_weight=None, jit: bool = False):
        self.pool, self.x, self.weight, self.weight_t, self.jit = pool, x, weight, weight.T, jit
        self.losses, self.grads, self.d_x, self.d_weight = losses, grads, d_x, d_weight
        self.ignore_index, self.reduction = loss_params(params)
        rows, width = x.shape
        self.vocab = vocab = weight.shape[0]
        self.chunks = []
        for chunk in row_chunks(rows, int(params.get("chunk", 0))):
            size = chunk.stop - chunk.start
            blocks = [(chunk.start + lo, chunk.start + hi) for lo, hi in pool.split(size, size * vocab * width // 64)]
            self.chunks.append((blocks, pool.split(vocab, vocab * width * size // 64)))
        most = max((hi - lo for blocks, _ in self.chunks for lo, hi in blocks), default=1)
        self.per_tile = min(tile_rows(vocab, TILE), most)
        longest = max((blocks[-1][1] - blocks[0][0] for blocks, _ in self.chunks), default=1)
        self.vocab_tile = max(WEIGHT_TILE // max(longest, 1), 1)
        self.layout = Layout()
        self.layout.add("logits", longest * vocab, dtype)  # thread 0's holds the whole chunk's
        tile_layout(self.layout, self.per_tile, vocab, dtype)
        if grads:
            self.layout.add("product", self.vocab_tile * width if len(self.chunks) > 1 else 0, dtype)
        pool.workspace.reserve(self.layout.nbytes)
        self.labels = Labels(labels, dtype, self.ignore_index, vocab, self.per_tile)

    def chunk_logits(self, rows: int) -> np.ndarray:
        """The logits of a chunk of ``rows`` rows, in thread 0's workspace: each thread writes its
        row block there, so the weight gradient reads the chunk as one matrix."""
        return self.layout.arrays(self.pool, 0)["logits"][:rows * self.vocab].reshape(rows, self.vocab)

    def row_block(self, first_row: int, rows: int, start: int, stop: int, thread: int) -> None:
        """Rows ``start:stop`` of the chunk from ``first_row``: their logits, losses, logit gradients
        and ``d_x``."""
        ws = self.layout.arrays(self.pool, thread)
        logits = self.chunk_logits(rows)[start - first_row:stop - first_row]
        np.matmul(self.x[start:stop], self.weight_t, out=logits)
        if self.jit:
            labels = self.labels
            compiled.cross_entropy_rows(logits, start, labels.column, labels.valid, labels.scale, labels.lse,
                                        labels.per_row, self.losses, self.grads)
        for lo, hi in row_tiles(start, stop, self.per_tile) if not self.jit else ():
            tile = logits[lo - start:hi - start]
            if self.losses:
                row_losses(tile, self.labels, ws, lo, hi)
            if self.grads:
                row_grads(tile, tile, self.labels, ws, lo, hi)
        if self.grads:
            np.matmul(logits, self.weight, out=self.d_x[start:stop])

    def weight_block(self, first: bool, blocks: list, start: int, stop: int, thread: int) -> None:
        """``d_weight[start:stop] += d_logits^T @ x`` of the chunk (``first``: the first chunk, whose
        product is written, not added): one product over all the chunk's rows per tile."""
        x = self.x[blocks[0][0]:blocks[-1][1]]
        chunk = self.chunk_logits(x.shape[0])
        ws = self.layout.arrays(self.pool, thread)
        for lo, hi in row_tiles(start, stop, stop - start if first else self.vocab_tile):
            d_logits = chunk[:, lo:hi]
            target = self.d_weight[lo:hi]
            if first:
                np.matmul(d_logits.T, x, out=target)
            else:
                product = ws["product"][:target.size].reshape(target.shape)
                np.matmul(d_logits.T, x, out=product)
                target += product

    def run(self) -> None:
        """Every chunk: its row blocks on the threads, then (gradients) its vocabulary slices."""
        if self.grads and not self.chunks:
            self.d_weight.fill(0)
        for index, (blocks, vocab) in enumerate(self.chunks):
            self.pool.run(partial(self.row_block, blocks[0][0], blocks[-1][1] - blocks[0][0]), blocks)
            if self.grads:
                self.pool.run(partial(self.weight_block, index == 0, blocks), vocab)


def _head(pool: Pool, x, weight, labels, params, losses: bool, grads: bool, d_x=None, d_weight=None,
          extra=(), jit: bool = False) -> Head | None:
    """The :class:`Head` of these operands, or None when they need the reference."""
    x2, weight2 = contiguous_rows(x), contiguous_rows(weight)
    grad_views = [contiguous_rows(a) for a in (d_x, d_weight) if a is not None]
    dtype = float_dtype(x, weight, d_x, d_weight, *extra)
    if (dtype is None or x2 is None or weight2 is None or loss_params(params) is None or weight.ndim != 2
            or x2.shape[1] != weight2.shape[1] or weight2.shape[0] == 0 or any(v is None for v in grad_views)):
        return None
    if grads and (grad_views[0].shape != x2.shape or grad_views[1].shape != weight2.shape):
        return None
    labels = integer_labels(labels, x2.shape[0])
    if labels is None:
        return None
    return Head(pool, x2, weight2, labels, params, dtype, losses, grads, *grad_views, jit=jit and compiled.takes(x2))


def fused_lm_head_loss(pool: Pool, outputs, inputs, params, jit: bool = False) -> Step | None:
    (loss, lse), (x, weight, labels) = outputs, inputs
    head = _head(pool, x, weight, labels, params, losses=True, grads=False, jit=jit)
    if head is None:
        return None

    def step() -> None:
        count = head.labels.load()
        head.run()
        head.labels.write(loss, lse, head.reduction, count)

    return step


def fused_lm_head_loss_backward(pool: Pool, outputs, inputs, params, jit: bool = False) -> Step | None:
    (d_x, d_weight), (d_loss, x, weight, labels, lse) = outputs, inputs
    head = _head(pool, x, weight, labels, params, losses=False, grads=True, d_x=d_x, d_weight=d_weight, jit=jit)
    d_rows = grad_input(d_loss, head.labels.dtype, x.size // x.shape[-1]) if head is not None else None
    lse_in = flat(lse)
    if d_rows is None or lse_in is None or lse_in.size != d_rows.size:
        return None

    def step() -> None:
        count = head.labels.load()
        head.labels.grad_scale(d_rows, head.reduction, count)
        np.copyto(head.labels.lse, lse_in, casting="unsafe")
        head.run()

    return step


def fused_lm_head_loss_grad(pool: Pool, outputs, inputs, params, jit: bool = False) -> Step | None:
    (loss, d_x, d_weight), (d_loss, x, weight, labels) = outputs, inputs
    head = _head(pool, x, weight, labels, params, losses=True, grads=True, d_x=d_x, d_weight=d_weight, jit=jit)
    d_rows = grad_input(d_loss, head.labels.dtype, x.size // x.shape[-1]) if head is not None else None
    if d_rows is None:
        return None

    def step() -> None:
        count = head.labels.load()
        head.labels.grad_scale(d_rows, head.reduction, count)
        head.run()
        head.labels.write(loss, None, head.reduction, count)

    return step


KERNELS = {fn.__name__: fn for fn in (cross_entropy, cross_entropy_backward, fused_lm_head_loss,
                                      fused_lm_head_loss_backward, fused_lm_head_loss_grad)}
JIT_KERNELS = {fn.__name__: partial(fn, jit=True) for fn in (  # the rows' cross-entropy compiled
    cross_entropy, cross_entropy_backward, fused_lm_head_loss, fused_lm_head_loss_backward, fused_lm_head_loss_grad)}
