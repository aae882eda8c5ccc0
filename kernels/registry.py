"""The kernel registry: one entry per primitive, keyed by its name.

An entry holds what the schedule layer needs to know about a primitive
beyond its graph op (:mod:`modeldsl.primitives` reads that off the op): the
numpy reference kernel (the oracle; the CPU executor runs the fast kernel of
:mod:`modeldsl.kernels.cpu` where it has one for the operands), the scratch memory a kernel
asks the planner for, and which outputs may take over the buffer of an input
that dies at that launch (in-place reuse). ``mdsl.sched.launch`` names its
kernel by the primitive's name, so ``entry(launch.kernel.data)`` finds it.

Later issues add each entry's CUDA kernel and launch configuration here.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from modeldsl.kernels.reference import REFERENCES

Shape = tuple[int, ...]
# (input shapes, output shapes, the launch's parameters) -> bytes of scratch for one launch
ScratchRule = Callable[[Sequence[Shape], Sequence[Shape], Mapping[str, Any]], int]


@dataclass(frozen=True)
class KernelEntry:
    """What the planner and the executors know about one primitive."""

    name: str
    reference: Callable
    scratch: ScratchRule | None = None
    # output index -> input index whose buffer the output may reuse when that input
    # is last read by this launch (elementwise kernels read each element before writing it)
    reuse: dict[int, int] = field(default_factory=dict)
    # the kernel can add its result into its one output (a launch marked ``accumulate``)
    accumulates: bool = False

    def scratch_bytes(self, inputs: Sequence[Shape], outputs: Sequence[Shape],
                      params: Mapping[str, Any] | None = None) -> int:
        return 0 if self.scratch is None else int(self.scratch(inputs, outputs, params or {}))


def _attention_scores(inputs: Sequence[Shape], outputs: Sequence[Shape], params: Mapping[str, Any]) -> int:
    """fp32 scores of every (batch, head) row block: the S x S matrix of a non-flash kernel."""
    q, k = inputs[0], inputs[1]
    return 4 * math.prod(q[:-1]) * k[-2]


def _per_row_stats(inputs: Sequence[Shape], outputs: Sequence[Shape], params: Mapping[str, Any]) -> int:
    """Two fp32 values (running max and sum) per row of the logits."""
    return 8 * math.prod(inputs[0][:-1])


def _aligned(nbytes: int, alignment: int = 256) -> int:
    return -(-nbytes // alignment) * alignment


def _loss_chunk(inputs: Sequence[Shape], params: Mapping[str, Any]) -> tuple[int, int, int]:
    """(rows, rows per chunk, vocab) of a fused LM-head loss (``x [N, C]`` is the first 2-d input,
    the ``[V, C]`` weight the next one)."""
    x = next(i for i, shape in enumerate(inputs) if len(shape) == 2)
    rows, vocab = inputs[x][0], inputs[x + 1][0]
    return rows, min(int(params.get("chunk", 0)) or rows, rows), vocab


def _chunk_logits(inputs: Sequence[Shape], outputs: Sequence[Shape], params: Mapping[str, Any]) -> int:
    """The logits of one chunk of rows (sized for fp32: they take x's dtype) and the fp32 loss of
    every row (before the mean)."""
    rows, chunk, vocab = _loss_chunk(inputs, params)
    return _aligned(4 * chunk * vocab) + 4 * rows


def _chunk_logit_grads(inputs: Sequence[Shape], outputs: Sequence[Shape], params: Mapping[str, Any]) -> int:
    """The logit gradients of one chunk (in place of its logits, sized for fp32) and the mean's scale."""
    _, chunk, vocab = _loss_chunk(inputs, params)
    return _aligned(4 * chunk * vocab) + 4


def _chunk_loss_and_grads(inputs: Sequence[Shape], outputs: Sequence[Shape], params: Mapping[str, Any]) -> int:
    """The backward's scratch (:func:`_chunk_logit_grads`) with, before the mean's scale, the chunk's
    fp32 lse and the fp32 loss of every row (the CUDA composite's layout)."""
    rows, chunk, vocab = _loss_chunk(inputs, params)
    return _aligned(4 * chunk * vocab) + _aligned(4 * chunk) + _aligned(4 * rows) + 4


SCRATCH: dict[str, ScratchRule] = {
    "flash_attention": _attention_scores,
    "cross_entropy": _per_row_stats,
    "fused_lm_head_loss": _chunk_logits,
    "fused_lm_head_loss_backward": _chunk_logit_grads,
    "fused_lm_head_loss_grad": _chunk_loss_and_grads,
}
REUSE: dict[str, dict[int, int]] = {
    **{name: {0: 0} for name in ("silu", "relu", "relu2", "gelu", "scale", "softmax", "add", "mul",
                                 "add3", "bias_add", "swiglu", "geglu")},
    **{name: {0: 0} for name in ("add_scalar", "causal_mask", "exp", "log", "tanh", "sigmoid", "rsqrt", "sub", "div")},
    "rope": {0: 0, 1: 1},
    # each thread reads its gate and up elements before writing their gradients at the same places
    "fused_split_swiglu_backward": {0: 1},
    "fused_split_geglu_backward": {0: 1},
    # one pass over each row of the logits, reading each element before writing its gradient
    "cross_entropy_backward": {0: 1},
}


# kernels whose CUDA version scatter-adds into a zeroed output: without the zeroing they accumulate
ACCUMULATES = {"embedding_backward"}


@lru_cache(maxsize=1)
def registry() -> dict[str, KernelEntry]:
    """Every primitive with a reference kernel."""
    return {
        name: KernelEntry(name, reference, SCRATCH.get(name), REUSE.get(name, {}), name in ACCUMULATES)
        for name, reference in REFERENCES.items()
    }


def entry(name: str) -> KernelEntry:
    """The entry of kernel ``name``; KeyError naming the known kernels for an unknown one."""
    try:
        return registry()[name]
    except KeyError:
        raise KeyError(f"no kernel '{name}' in the registry (known: {', '.join(sorted(registry()))})") from None


# ----------------------------------------------------------------------------
# Implementations: what ``@kernel(name)`` (spec 7.5.3) may choose
# ----------------------------------------------------------------------------

# primitive -> its implementations, the default first; a primitive not listed has one, its own kernel
# (attention: cuDNN's SDPA through the cuDNN frontend where it runs the attention, else the own
# CUDA kernels, ``flash_attention`` in both directions, so one choice names forward and backward;
# the GEMMs: cuBLASLt)
IMPLEMENTATIONS: dict[str, tuple[str, ...]] = {
    "flash_attention": ("cudnn_sdpa", "flash_attention"),
    "flash_attention_backward": ("cudnn_sdpa", "flash_attention"),
    "matmul": ("cublaslt",),
    "linear_bias_act": ("cublaslt",),
    "batched_matmul": ("cublaslt",),
}


def implementations(primitive: str) -> tuple[str, ...]:
    """The kernels that can run ``primitive``, the default first."""
    return IMPLEMENTATIONS.get(primitive, (primitive,))


def unavailable_kernel(primitive: str, name: str) -> str | None:
    """Why ``@kernel(name)`` cannot run ``primitive`` (None when it can)."""
    known = implementations(primitive)
    if name in known:
        return None
    return f"no kernel '{name}' implements {primitive} (its kernels: {', '.join(known)})"
