"""Fused primitives the CUDA executor runs as several device commands (a :class:`CompositeCommand`).

**The chunked LM-head loss** (mdsl-fuse's ``lm_head_loss`` pattern): ``fused_lm_head_loss(x [N, C],
weight [V, C], labels [N]) -> (loss, lse [N])`` and ``fused_lm_head_loss_backward(d_loss, x, weight,
labels, lse) -> (d_x, d_weight)`` never hold all ``N x V`` logits. For each chunk of rows of ``x``:

- forward: a cuBLASLt GEMM of the chunk's logits (``x[rows] @ weight^T``, in ``x``'s dtype, as the
  unfused GEMM writes them) into the scratch, the cross-entropy kernel (reduction none) writing the chunk's per-row
  losses and ``lse[rows]``; after the last chunk one reduction of all ``N`` per-row losses (sum, or
  the mean over every counted row: the same division as the unchunked loss);
- backward: the same GEMM, the cross-entropy backward kernel turning the logits into d_logits in
  place (scaled by ``d_loss``, per row for reduction none, or by ``d_loss`` over all counted rows,
  computed once, for the mean), then ``d_x[rows] = d_logits @ weight`` and ``d_weight +=
  d_logits^T @ x[rows]`` (beta 0 for the first chunk, 1 after: a 16-bit ``d_weight`` is rounded
  once per chunk).
- ``fused_lm_head_loss_grad(d_loss, x, weight, labels) -> (loss, d_x, d_weight)`` (the two merged
  where ``d_loss`` is known before the forward): per chunk the forward's GEMM and cross-entropy (the
  chunk's lse into the scratch) and the backward's steps on those logits; one logits GEMM per chunk.

The launch's planned scratch (its last output) holds, from its start, each segment aligned to 256
bytes: ``logits`` (``x``'s dtype ``[m, V]``; the planner sizes it for fp32), ``lse`` (merged: fp32
``[m]``), ``loss_rows`` (forward and merged, reduction sum or mean: fp32 ``[N]``), ``d_scale``
(backward and merged, mean: one fp32).
``m``, the rows per chunk, is the launch's ``chunk`` (0: all ``N``), or the most rows whose segments
fit where the scratch is smaller (the results do not depend on it beyond rounding). A launch these
commands cannot run (no scratch, accumulate, mixed dtypes) falls back to the numpy reference.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from modeldsl.kernels import cuda
from modeldsl.kernels.registry import entry
from modeldsl.runtime.cuda_commands import (
    Command,
    CompositeCommand,
    GemmCommand,
    KernelCommand,
    TensorRef,
    plan_kernel,
)

FP32 = np.dtype(np.float32)
Segment = tuple[str, tuple[int, ...], np.dtype]  # name, shape, dtype of one piece of the scratch
INDEX_DTYPES = {"int32": 0, "int64": 1}  # labels dtype -> the kernels' idx64


# ----------------------------------------------------------------------------
# The scratch
# ----------------------------------------------------------------------------


def placed(address: int, segments: Sequence[Segment]) -> tuple[dict[str, TensorRef], int]:
    """The segments laid out from ``address``, each aligned to 256 bytes, and the bytes they span."""
    at, refs = 0, {}
    for name, shape, dtype in segments:
        at = -(-at // cuda.SCRATCH_ALIGN) * cuda.SCRATCH_ALIGN
        refs[name] = TensorRef(address + at, tuple(shape), np.dtype(dtype))
        at += refs[name].nbytes
    return refs, at


def raw_bytes(segments: Sequence[Segment]) -> int:
    return sum(math.prod(shape) * np.dtype(dtype).itemsize for _, shape, dtype in segments)


def chunked_scratch(scratch: TensorRef | None, rows: int, chunk: int,
                    segments_of: Callable[[int], list[Segment]]) -> tuple[int, dict[str, TensorRef]]:
    """The rows per chunk (``chunk``, all ``rows`` for 0, or the most whose segments fit in the
    scratch) and the segments in the scratch; NotCovered when not even one row fits."""
    if scratch is None:
        raise cuda.NotCovered("the launch has no scratch for the logits")
    if rows < 1:
        raise cuda.NotCovered("no rows")
    per_row = raw_bytes(segments_of(1)) - raw_bytes(segments_of(0))
    m = min(chunk if chunk > 0 else rows, rows, max(0, (scratch.nbytes - raw_bytes(segments_of(0))) // per_row))
    while m > 0 and placed(scratch.address, segments_of(m))[1] > scratch.nbytes:
        m -= 1
    if m == 0:
        raise cuda.NotCovered(f"the scratch of {scratch.nbytes} bytes holds no row of the {segments_of(1)[0][1][-1]} "
                              "logits and what goes with them")
    return m, placed(scratch.address, segments_of(m))[0]


def row_chunks(rows: int, m: int) -> list[tuple[int, int]]:
    """(first row, rows) of each chunk."""
    return [(start, min(m, rows - start)) for start in range(0, rows, m)]


# ----------------------------------------------------------------------------
# The parts
# ----------------------------------------------------------------------------


def planned(name: str, arguments: Sequence[TensorRef], outputs: Sequence[TensorRef],
            params: dict[str, Any]) -> KernelCommand:
    """A launch of primitive ``name``'s CUDA plan (and its reference, for the host)."""
    command = KernelCommand(kernel=name, arguments=tuple(arguments), outputs=tuple(outputs), params=params,
                            reference=entry(name).reference)
    plan_kernel(command)
    return command


def index_flag(labels: TensorRef) -> int:
    try:
        return INDEX_DTYPES[np.dtype(labels.dtype).name]
    except KeyError:
        raise cuda.NotCovered(f"labels of dtype {np.dtype(labels.dtype).name}") from None


def require_fp32(*refs: TensorRef) -> None:
    for ref in refs:
        if np.dtype(ref.dtype) != FP32:
            raise cuda.NotCovered(f"a {np.dtype(ref.dtype).name} {list(ref.shape)} where the kernel writes fp32")


def summed_losses(loss_rows: np.ndarray, labels: np.ndarray, *, ignore_index: int, mean: bool) -> np.ndarray:
    """The reduction kernel's result: the sum of the per-row losses, over the counted rows for the
    mean (NaN when none counts)."""
    total = np.sum(loss_rows)
    if not mean:
        return total
    with np.errstate(invalid="ignore", divide="ignore"):
        return total / np.sum(labels != ignore_index)


def mean_scale(d_loss: np.ndarray, labels: np.ndarray, *, ignore_index: int) -> np.ndarray:
    """The mean's gradient scale: ``d_loss`` over the counted rows."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.float32(d_loss) / np.float32(np.sum(labels != ignore_index))


def loss_reduction(loss_rows: TensorRef, labels: TensorRef, loss: TensorRef, ignore_index: int,
                   mean: bool) -> KernelCommand:
    """``loss`` = the sum (``mean``: the mean over the counted rows) of all per-row losses."""
    require_fp32(loss)
    launch = cuda.cross_entropy_reduce_launch(loss_rows.shape[0], ignore_index, index_flag(labels), mean,
                                              "in:loss_rows")
    return KernelCommand(kernel="cross_entropy_reduce", arguments=(loss_rows, labels), outputs=(loss,),
                         params={"ignore_index": ignore_index, "mean": mean}, reference=summed_losses,
                         primitive="cross_entropy", variant="fp32", plan=cuda.Plan((launch,)),
                         names={"in:loss_rows": loss_rows, "in:labels": labels, "out:loss": loss})


def scale_of_mean(d_loss: TensorRef, labels: TensorRef, d_scale: TensorRef, ignore_index: int) -> KernelCommand:
    """``d_scale`` = ``d_loss`` over the counted rows of all ``labels``."""
    require_fp32(d_loss)
    launch = cuda.cross_entropy_mean_scale_launch(labels.shape[0], ignore_index, index_flag(labels), "out:d_scale")
    return KernelCommand(kernel="cross_entropy_mean_scale", arguments=(d_loss, labels), outputs=(d_scale,),
                         params={"ignore_index": ignore_index}, reference=mean_scale, primitive="cross_entropy",
                         variant="fp32", plan=cuda.Plan((launch,)),
                         names={"in:d_loss": d_loss, "in:labels": labels, "out:d_scale": d_scale})


def chunk_logits(x_rows: TensorRef, weight: TensorRef, logits: TensorRef) -> GemmCommand:
    """``logits = x[rows] @ weight^T`` (in ``x``'s dtype)."""
    return GemmCommand(a=x_rows, b=weight, c=logits, transb=True)


# ----------------------------------------------------------------------------
# The LM-head loss
# ----------------------------------------------------------------------------


def loss_options(launch: KernelCommand) -> tuple[int, str, int]:
    """(ignore_index, reduction, chunk) of a launch; NotCovered for what the commands do not run."""
    reduction = str(launch.params.get("reduction", "mean"))
    if reduction not in ("none", "sum", "mean"):
        raise cuda.NotCovered(f"reduction '{reduction}'")
    if launch.accumulate:
        raise cuda.NotCovered("an accumulating launch")
    return int(launch.params.get("ignore_index", -100)), reduction, int(launch.params.get("chunk", 0) or 0)


def same_dtype(x: TensorRef, weight: TensorRef) -> None:
    if np.dtype(x.dtype) != np.dtype(weight.dtype):
        raise cuda.NotCovered(f"x in {np.dtype(x.dtype).name} and the weight in {np.dtype(weight.dtype).name}")


def logits_and_losses(x: TensorRef, weight: TensorRef, labels: TensorRef, start: int, n: int, logits: TensorRef,
                      per_row: TensorRef, lse: TensorRef, ignore: int) -> list[Command]:
    """One chunk's logits GEMM and its per-row cross-entropy into ``per_row`` and ``lse`` (``n`` rows each)."""
    return [chunk_logits(x.rows(start, n), weight, logits),
            planned("cross_entropy", (logits, labels.rows(start, n)), (per_row, lse),
                    {"ignore_index": ignore, "reduction": "none"})]


def logits_segment(m: int, vocab: int, x: TensorRef) -> Segment:
    return ("logits", (m, vocab), np.dtype(x.dtype))


def gradient_segments(m: int, vocab: int, x: TensorRef, reduction: str) -> list[Segment]:
    """The backward's scratch: the logits (their gradients in place) and the mean's scale."""
    return [logits_segment(m, vocab, x)] + ([("d_scale", (), FP32)] if reduction == "mean" else [])


def gradient_scale(d_loss: TensorRef, labels: TensorRef, work: dict[str, TensorRef], ignore: int,
                   reduction: str) -> tuple[list[Command], TensorRef, str]:
    """(the commands before the chunks, what scales d_logits, the chunks' reduction): for the mean
    ``d_loss`` over all counted rows, computed once; else ``d_loss`` (per row for none)."""
    if reduction != "mean":
        return [], d_loss, reduction
    return [scale_of_mean(d_loss, labels, work["d_scale"], ignore)], work["d_scale"], "sum"


def chunk_gradients(x: TensorRef, weight: TensorRef, labels: TensorRef, lse: TensorRef, scale: TensorRef,
                    chunk_reduction: str, start: int, n: int, work: dict[str, TensorRef], d_x: TensorRef,
                    d_weight: TensorRef, ignore: int) -> list[Command]:
    """One chunk's d_logits in place of its logits (``work["logits"]``), ``d_x[rows]`` and
    ``d_weight +=`` (beta 0 for the first chunk)."""
    x_rows, logits = x.rows(start, n), work["logits"].rows(0, n)
    row_scale = scale.rows(start, n) if chunk_reduction == "none" else scale
    parts: list[Command] = [planned("cross_entropy_backward", (row_scale, logits, labels.rows(start, n), lse),
                                    (logits,), {"ignore_index": ignore, "reduction": chunk_reduction})]
    return parts + [GemmCommand(a=logits, b=weight, c=d_x.rows(start, n)),
                    GemmCommand(a=logits, b=x_rows, c=d_weight, transa=True, beta=0.0 if start == 0 else 1.0)]


def lm_head_loss(launch: KernelCommand, scratch: TensorRef | None) -> CompositeCommand:
    """``fused_lm_head_loss``: per chunk the logits GEMM and the per-row cross-entropy, then the reduction."""
    x, weight, labels = launch.arguments[:3]
    loss, lse = launch.outputs
    ignore, reduction, chunk = loss_options(launch)
    same_dtype(x, weight)
    rows, vocab = x.shape[0], weight.shape[0]

    def segments(m: int) -> list[Segment]:
        return [logits_segment(m, vocab, x)] + ([("loss_rows", (rows,), FP32)] if reduction != "none" else [])

    m, work = chunked_scratch(scratch, rows, chunk, segments)
    per_row = loss if reduction == "none" else work["loss_rows"]
    parts: list[Command] = []
    for start, n in row_chunks(rows, m):
        parts += logits_and_losses(x, weight, labels, start, n, work["logits"].rows(0, n), per_row.rows(start, n),
                                   lse.rows(start, n), ignore)
    if reduction != "none":
        parts.append(loss_reduction(work["loss_rows"], labels, loss, ignore, reduction == "mean"))
    return CompositeCommand(kernel=launch.kernel, parts=tuple(parts))


def lm_head_loss_backward(launch: KernelCommand, scratch: TensorRef | None) -> CompositeCommand:
    """``fused_lm_head_loss_backward``: per chunk the logits GEMM, d_logits in place, the d_x and
    d_weight GEMMs."""
    d_loss, x, weight, labels, lse = launch.arguments[:5]
    d_x, d_weight = launch.outputs
    ignore, reduction, chunk = loss_options(launch)
    same_dtype(x, weight)
    rows, vocab = x.shape[0], weight.shape[0]
    m, work = chunked_scratch(scratch, rows, chunk, lambda m: gradient_segments(m, vocab, x, reduction))
    parts, scale, chunk_reduction = gradient_scale(d_loss, labels, work, ignore, reduction)
    for start, n in row_chunks(rows, m):
        parts += [chunk_logits(x.rows(start, n), weight, work["logits"].rows(0, n)),
                  *chunk_gradients(x, weight, labels, lse.rows(start, n), scale, chunk_reduction, start, n, work,
                                   d_x, d_weight, ignore)]
    return CompositeCommand(kernel=launch.kernel, parts=tuple(parts))


def lm_head_loss_grad(launch: KernelCommand, scratch: TensorRef | None) -> CompositeCommand:
    """``fused_lm_head_loss_grad``: per chunk the forward's logits GEMM and per-row cross-entropy (the
    chunk's lse into the scratch), then the backward's steps on the same logits; the loss's reduction
    after the last chunk. The mean's scale is computed before the first."""
    d_loss, x, weight, labels = launch.arguments[:4]
    loss, d_x, d_weight = launch.outputs
    ignore, reduction, chunk = loss_options(launch)
    same_dtype(x, weight)
    rows, vocab = x.shape[0], weight.shape[0]

    def segments(m: int) -> list[Segment]:
        grads = gradient_segments(m, vocab, x, reduction)
        losses = [("lse", (m,), FP32)] + ([("loss_rows", (rows,), FP32)] if reduction != "none" else [])
        return [s for s in grads if s[0] != "d_scale"] + losses + [s for s in grads if s[0] == "d_scale"]

    m, work = chunked_scratch(scratch, rows, chunk, segments)
    per_row = loss if reduction == "none" else work["loss_rows"]
    parts, scale, chunk_reduction = gradient_scale(d_loss, labels, work, ignore, reduction)
    for start, n in row_chunks(rows, m):
        lse = work["lse"].rows(0, n)
        parts += [*logits_and_losses(x, weight, labels, start, n, work["logits"].rows(0, n), per_row.rows(start, n),
                                     lse, ignore),
                  *chunk_gradients(x, weight, labels, lse, scale, chunk_reduction, start, n, work, d_x, d_weight,
                                   ignore)]
    if reduction != "none":
        parts.append(loss_reduction(work["loss_rows"], labels, loss, ignore, reduction == "mean"))
    return CompositeCommand(kernel=launch.kernel, parts=tuple(parts))


# primitive -> its lowering: (the launch as one kernel command, the launch's planned scratch) -> composite
COMPOSITES: dict[str, Callable[[KernelCommand, TensorRef | None], CompositeCommand]] = {
    "fused_lm_head_loss": lm_head_loss,
    "fused_lm_head_loss_backward": lm_head_loss_backward,
    "fused_lm_head_loss_grad": lm_head_loss_grad,
}
