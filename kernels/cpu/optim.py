"""CPU kernels of the optimizer step: ``global_norm``, ``clip_factor`` and a multi-tensor ``adamw``.

``global_norm`` squares and sums the gradients in pieces of at most
:data:`~modeldsl.kernels.cpu.pool.TILE` elements cut where numpy's pairwise
summation halves a run, the threads taking contiguous ranges of the pieces;
each piece's sum lands in its own slot and the slots are added in numpy's
order, so the norm is bitwise the reference's whatever the thread count.

``adamw`` runs torch.optim.AdamW's single-tensor update exactly as the
reference does, operation for operation in the same dtype (so the results are
bitwise the reference's), over cache-sized tiles with two or three scratch
tiles from the workspace. The runtime learning rate, step and clipping factor
are read from their arrays at every run.

The optimizer program launches one ``adamw`` per parameter and then zeroes
every gradient with a memset. :func:`fuse_optimizer_steps` (the executor's
hook) runs each run of consecutive ``adamw`` launches as ONE step: the tiles
of all their parameters make one work list split over the pool in one
dispatch, and a gradient that a later memset zeroes (nothing touching it in
between) is zeroed tile by tile right after its last read, the memset step
then dropped.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from xdsl.dialects.builtin import FloatAttr
from xdsl.ir import Operation

from modeldsl.kernels.cpu.pool import TILE, Pool, scratch_bytes
from modeldsl.kernels.cpu.tiles import FLOATS, Step

ADAMW_PARAMS = {"beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.01, "lr_scale": 1.0}
# one row of run-time coefficients, in the launch's dtype (see AdamwLaunch.coefficients)
DECAY, ONE_MINUS_BETA1, BETA2, ONE_MINUS_BETA2, BIAS2, EPS, STEP_SIZE, GRAD_SCALE = range(8)


def flat(a: np.ndarray | None) -> np.ndarray | None:
    """A contiguous array as a 1-d view (None for anything else)."""
    if a is None or not a.flags.c_contiguous:
        return None
    return a.reshape(-1)


def tiles_of(size: int, tile: int = TILE) -> list[tuple[int, int]]:
    return [(lo, min(lo + tile, size)) for lo in range(0, size, tile)]


# ---------------------------------------------------------------------------- global_norm, clip_factor
def pairwise(size: int, leaf: int = TILE) -> tuple[list[tuple[int, int]], list[tuple[int, int, int]]]:
    """numpy's pairwise summation of ``size`` elements cut into pieces of at most ``leaf``: the
    pieces ``(lo, hi)`` (slot i: piece i's sum) and the additions ``(slot, left, right)`` in an
    order that computes each sum before it is used; the last slot is the total. numpy halves a
    run of more than 128 elements at ``n // 2`` rounded down to a multiple of 8, so summing the
    pieces with ``np.sum`` and adding them up so gives bitwise ``np.sum`` of the whole."""
    pieces: list[tuple[int, int]] = []
    splits: list[tuple[int, int]] = []  # (start, count) of each run that is halved, post-order

    def walk(lo: int, count: int) -> None:
        if count <= leaf:
            pieces.append((lo, lo + count))
            return
        half = count // 2
        half -= half % 8
        walk(lo, half)
        walk(lo + half, count - half)
        splits.append((lo, count))

    walk(0, size)
    slots = {(lo, hi - lo): index for index, (lo, hi) in enumerate(pieces)}
    additions = []
    for lo, count in splits:
        half = count // 2 - (count // 2) % 8
        slots[(lo, count)] = len(pieces) + len(additions)
        additions.append((slots[(lo, count)], slots[(lo, half)], slots[(lo + half, count - half)]))
    return pieces, additions


def global_norm(pool: Pool, outputs, inputs, params) -> Step | None:
    """``sqrt(sum of g^2)`` over all the gradients, bitwise the reference: each gradient's sum of
    squares in numpy's pairwise order (pieces on the pool, their sums added as numpy would), the
    gradients' sums added one after the other in the dtype; then (``plus=K``) the last K inputs,
    sums of squares already, and (``squared``) no root."""
    (out,) = outputs
    plus, squared = int(params.get("plus", 0)), bool(params.get("squared", False))
    extras = [flat(g) for g in inputs[len(inputs) - plus:]]
    grads = [flat(g) for g in inputs[:len(inputs) - plus]]
    dtypes = {g.dtype for g in inputs}
    if not grads + extras or any(g is None for g in grads + extras) or len(dtypes) != 1 or out.dtype not in dtypes \
            or out.dtype not in FLOATS or any(e.size != 1 for e in extras):
        return None
    dtype = out.dtype.type
    work: list[tuple[np.ndarray, int, int, int]] = []  # (gradient, lo, hi, slot)
    additions: list[tuple[int, int, int]] = []
    totals: list[int] = []  # each gradient's slot of its sum
    for g in grads:
        pieces, adds = pairwise(g.size)
        base = len(work) + len(additions)
        for index, (lo, hi) in enumerate(pieces):
            work.append((g, lo, hi, base + index))
        additions += [(base + a, base + b, base + c) for a, b, c in adds]
        totals.append(base + len(pieces) + len(adds) - 1)
    slots = np.zeros(len(work) + len(additions), out.dtype)
    target, elements = out.reshape(()), sum(g.size for g in grads)
    pool.workspace.reserve(scratch_bytes(TILE, out.dtype, 1))

    def block(start: int, stop: int, thread: int) -> None:
        (scratch,) = pool.workspace.arrays(thread, TILE, out.dtype, 1)
        for index in range(start, stop):
            g, lo, hi, slot = work[index]
            square = np.square(g[lo:hi], out=scratch[:hi - lo])
            slots[slot] = np.sum(square)

    def step() -> None:
        pool.blocks(block, len(work), elements)
        for slot, left, right in additions:
            slots[slot] = slots[left] + slots[right]
        total = dtype(0)
        for slot in totals:
            total = total + slots[slot]
        for extra in extras:
            total = total + extra[0]
        target[()] = total if squared else np.sqrt(total)

    return step


def clip_factor(pool: Pool, outputs, inputs, params) -> Step | None:
    """torch's ``clip_grad_norm_`` coefficient ``min(1, max_norm / (norm + 1e-6))`` in the norm's dtype."""
    (out,), (norm,) = outputs, inputs
    if norm.size != 1 or out.size != 1 or norm.dtype not in FLOATS:
        return None
    dtype, source, target = norm.dtype.type, norm.reshape(()), out.reshape(())
    max_norm, one, tiny = dtype(params["max_norm"]), dtype(1.0), dtype(1e-6)

    def step() -> None:
        target[()] = np.minimum(one, max_norm / (source[()] + tiny))

    return step


# ---------------------------------------------------------------------------- adamw
@dataclass
class AdamwLaunch:
    """One ``adamw`` launch: 1-d views of its tensors, its runtime arrays, its hyper-parameters."""

    param: np.ndarray
    grad: np.ndarray
    exp_avg: np.ndarray
    exp_avg_sq: np.ndarray
    lr: np.ndarray
    step: np.ndarray
    grad_scale: np.ndarray | None
    hyper: dict[str, float]
    zero_grad: bool = False  # zero each gradient tile after its last read (a memset folded in)

    @classmethod
    def of(cls, outputs: Sequence[np.ndarray], inputs: Sequence[np.ndarray | None],
           params: dict) -> AdamwLaunch | None:
        """The launch of these operands, or None when the fast kernel does not run them (dtypes
        other than one fp32/fp64, non-contiguous tensors, outputs that are not the inputs)."""
        if len(inputs) not in (6, 7) or len(outputs) != 3 or set(params) - set(ADAMW_PARAMS):
            return None
        param, grad, exp_avg, exp_avg_sq, lr, step = inputs[:6]
        grad_scale = inputs[6] if len(inputs) == 7 else None
        tensors = [flat(a) for a in (param, grad, exp_avg, exp_avg_sq)]
        if any(t is None for t in tensors) or len({t.dtype for t in tensors}) != 1 \
                or tensors[0].dtype not in FLOATS or len({t.size for t in tensors}) != 1:
            return None
        if any(not same_memory(o, i) for o, i in zip(outputs, (param, exp_avg, exp_avg_sq))):
            return None
        runtime = [flat(np.asarray(a)) for a in (lr, step, grad_scale) if a is not None]
        if any(r is None or r.size < 1 for r in runtime):
            return None
        return cls(*tensors, *runtime[:2], runtime[2] if grad_scale is not None else None,
                   {k: float(params.get(k, v)) for k, v in ADAMW_PARAMS.items()})

    @property
    def dtype(self) -> np.dtype:
        return self.param.dtype

    @property
    def tensors(self) -> tuple[np.ndarray, ...]:
        return self.param, self.grad, self.exp_avg, self.exp_avg_sq

    @property
    def runtime(self) -> tuple[np.ndarray, ...]:
        return tuple(a for a in (self.lr, self.step, self.grad_scale) if a is not None)

    def coefficients(self, row: np.ndarray) -> None:
        """This step's scalars, computed as the reference computes them, rounded into ``row``."""
        hyper = self.hyper
        lr = float(self.lr[0]) * hyper["lr_scale"]
        step = float(self.step[0])
        beta1, beta2 = hyper["beta1"], hyper["beta2"]
        row[DECAY] = 1 - lr * hyper["weight_decay"]
        row[ONE_MINUS_BETA1] = 1 - beta1
        row[BETA2] = beta2
        row[ONE_MINUS_BETA2] = 1 - beta2
        row[BIAS2] = math.sqrt(1 - beta2 ** step)
        row[EPS] = hyper["eps"]
        row[STEP_SIZE] = lr / (1 - beta1 ** step)
        row[GRAD_SCALE] = self.grad_scale[0] if self.grad_scale is not None else 1

    def update(self, lo: int, hi: int, row: np.ndarray, scratch: list[np.ndarray]) -> None:
        """The reference's update of elements ``[lo, hi)`` (the same ops in the same order)."""
        p, g, m, v = (t[lo:hi] for t in self.tensors)
        size = hi - lo
        a, s = scratch[0][:size], scratch[1][:size]
        if self.grad_scale is not None:
            g = np.multiply(g, row[GRAD_SCALE], out=s)
            if self.zero_grad:
                self.grad[lo:hi] = 0
        decay = row[DECAY]
        if decay != 1:  # x * 1 is x: the reference's multiply changes nothing then
            p *= decay
        np.subtract(g, m, out=a)
        a *= row[ONE_MINUS_BETA1]
        m += a
        v *= row[BETA2]
        np.multiply(g, row[ONE_MINUS_BETA2], out=a)
        a *= g
        v += a
        if self.zero_grad and self.grad_scale is None:
            g[...] = 0
        np.sqrt(v, out=a)
        a /= row[BIAS2]
        a += row[EPS]
        np.divide(m, a, out=a)
        a *= row[STEP_SIZE]
        p -= a


class AdamwGroup:
    """Consecutive ``adamw`` launches run as one step: all their tiles, one dispatch over the pool."""

    def __init__(self, pool: Pool, launches: list[AdamwLaunch], tile: int = TILE):
        self.pool, self.launches, self.tile = pool, launches, tile
        rows: dict[tuple, int] = {}  # launches with the same scalars share one row
        self.row_of = [rows.setdefault(scalar_key(launch), len(rows)) for launch in launches]
        self.leaders = [launches[self.row_of.index(r)] for r in range(len(rows))]
        self.rows = [np.zeros(8, launch.dtype) for launch in self.leaders]
        self.work = [(index, lo, hi) for index, launch in enumerate(launches)
                     for lo, hi in tiles_of(launch.param.size, tile)]
        self.elements = sum(launch.param.size for launch in launches)
        self.dtypes = sorted({launch.dtype for launch in launches}, key=lambda d: d.itemsize)
        pool.workspace.reserve(scratch_bytes(tile, self.dtypes[-1], 2))

    def block(self, start: int, stop: int, thread: int) -> None:
        scratch = {dtype: self.pool.workspace.arrays(thread, self.tile, dtype, 2) for dtype in self.dtypes}
        launches, rows, row_of = self.launches, self.rows, self.row_of
        for index in range(start, stop):
            which, lo, hi = self.work[index]
            launch = launches[which]
            launch.update(lo, hi, rows[row_of[which]], scratch[launch.dtype])

    def __call__(self) -> None:
        for launch, row in zip(self.leaders, self.rows):
            launch.coefficients(row)
        self.pool.blocks(self.block, len(self.work), self.elements)


def scalar_key(launch: AdamwLaunch) -> tuple:
    runtime = tuple((span(a), a.dtype.str) for a in launch.runtime)
    return launch.dtype, tuple(sorted(launch.hyper.items())), runtime, launch.grad_scale is None


def adamw(pool: Pool, outputs, inputs, params) -> Step | None:
    launch = AdamwLaunch.of(outputs, inputs, params)
    return AdamwGroup(pool, [launch]) if launch is not None else None


# ---------------------------------------------------------------------------- the executor's hook
def fuse_optimizer_steps(pool: Pool, compiled: list[tuple[Operation, list[Step]]],
                         views: dict) -> list[Step]:
    """The executor's steps, each run of consecutive top-level ``adamw`` launches made one
    :class:`AdamwGroup`, and the memsets zeroing their gradients folded into it where nothing
    between the group and the memset touches the gradient. ``compiled``: each top-level op with
    the steps the executor compiled for it; ``views``: the top-level buffers' views."""
    steps: list[Step] = []
    dropped: set[int] = set()  # positions of memsets folded into a group
    position = 0
    while position < len(compiled):
        end = position
        launches: list[AdamwLaunch] = []
        while end < len(compiled) and (launch := adamw_launch(compiled[end][0], views)) is not None:
            launches.append(launch)
            end += 1
        if launches and disjoint(launches):
            dropped |= fold_zeroing(launches, compiled, end, views)
            steps.append(AdamwGroup(pool, launches))
            position = end
            continue
        end = max(end, position + 1)
        for index in range(position, end):
            if index not in dropped:
                steps += compiled[index][1]
        position = end
    return steps


def adamw_launch(op: Operation, views: dict) -> AdamwLaunch | None:
    """The fast form of a top-level ``adamw`` launch (None for any other op, or one it cannot run)."""
    from modeldsl.dialects.sched import LAUNCH_ATTRIBUTES, LaunchOp

    if not isinstance(op, LaunchOp) or op.kernel.data != "adamw" or op.accumulate is not None:
        return None
    if any(v not in views for v in (*op.inputs, *op.outputs)):
        return None
    params = {}
    for key, attr in op.attributes.items():
        if key in LAUNCH_ATTRIBUTES:
            continue
        if not isinstance(attr, FloatAttr):
            return None
        params[key] = attr.value.data
    return AdamwLaunch.of([views[v] for v in op.outputs], [views[v] for v in op.inputs], params)


def fold_zeroing(launches: list[AdamwLaunch], compiled: list[tuple[Operation, list[Step]]], end: int,
                 views: dict) -> set[int]:
    """Mark the launches whose gradient a later zero memset clears, nothing reading or writing it
    in between; the positions of those memsets (their steps are dropped)."""
    from modeldsl.dialects.sched import MemsetOp

    folded: set[int] = set()
    pending = {id(launch): launch for launch in launches}
    for index in range(end, len(compiled)):
        op = compiled[index][0]
        operands = [views.get(v) for v in op.operands]
        if op.regions or any(o is None for o in operands) or len(op.results):
            break  # beyond this op nothing is provable
        target = operands[0] if isinstance(op, MemsetOp) and float(op.value.value.data) == 0.0 else None
        for key, launch in list(pending.items()):
            if target is not None and same_memory(target.reshape(-1), launch.grad):
                launch.zero_grad = True
                folded.add(index)
                del pending[key]
            elif any(np.may_share_memory(o, launch.grad) for o in operands):
                del pending[key]  # read or written before its memset: keep both as they are
        if not pending:
            break
    return folded


def disjoint(launches: list[AdamwLaunch]) -> bool:
    """No launch's tensors overlap another's tensors or any runtime array (the group runs the
    tiles of all launches in any order)."""
    spans = sorted((span(t), index) for index, launch in enumerate(launches) for t in launch.tensors)
    for (first, _), (second, _) in zip(spans, spans[1:]):
        if second[0] < first[1]:
            return False
    runtime = {span(r) for launch in launches for r in launch.runtime}
    return not any(lo < hi_t and lo_t < hi for lo, hi in runtime for (lo_t, hi_t), _ in spans)


def span(a: np.ndarray) -> tuple[int, int]:
    start = a.__array_interface__["data"][0]
    return start, start + a.nbytes


def same_memory(a: np.ndarray, b: np.ndarray) -> bool:
    """The same elements in the same order (an in-place output, a memset's target)."""
    return a.dtype == b.dtype and a.size == b.size and a.flags.c_contiguous and b.flags.c_contiguous \
        and span(a) == span(b)


KERNELS: dict[str, Callable[..., Step | None]] = {
    "global_norm": global_norm,
    "clip_factor": clip_factor,
    "adamw": adamw,
}
