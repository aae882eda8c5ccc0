"""The kernel registry: one entry per kernel a ``mdsl.sched.launch`` may name.

``mdsl.sched.launch`` names its kernel by the primitive's name, so
``entry(launch.kernel.data)`` finds it. An entry holds what the schedule layer
needs to know about the kernel: the numpy reference (the oracle; the CPU
executor runs the fast kernel of :mod:`modeldsl.kernels.cpu` where it has one
for the operands), the scratch memory it asks the planner for, which outputs
may take over the buffer of an input that dies at that launch (in-place
reuse), and whether it can add into its output. For a graph primitive the
scratch, reuse and accumulation are those of its record in
:mod:`modeldsl.prims` (keyed by the op class, one module per family); the
schedule's kernels without a graph op (the optimizer's, the KV-cache attention,
the Mamba decoding steps) have a reference only. The CUDA launch plans are in
:mod:`modeldsl.kernels.cuda` under the same names.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from modeldsl.prims import USER_REFERENCES, by_name
from modeldsl.prims.base import ScratchRule, Shape


@dataclass(frozen=True)
class KernelEntry:
    """What the planner and the executors know about one kernel."""

    name: str
    reference: Callable
    scratch: ScratchRule | None = None
    # output index -> input index whose buffer the output may reuse when that input
    # is last read by this launch (elementwise kernels read each element before writing it)
    reuse: Mapping[int, int] = field(default_factory=dict)
    # the kernel can add its result into its one output (a launch marked ``accumulate``)
    accumulates: bool = False

    def scratch_bytes(self, inputs: Sequence[Shape], outputs: Sequence[Shape],
                      params: Mapping[str, Any] | None = None) -> int:
        return 0 if self.scratch is None else int(self.scratch(inputs, outputs, params or {}))


def kernel_entry(name: str, reference: Callable) -> KernelEntry:
    """The entry of kernel ``name``: its primitive's scratch, reuse and accumulation, if it is one."""
    primitive = by_name().get(name)
    if primitive is None:
        return KernelEntry(name, reference)
    return KernelEntry(name, reference, primitive.scratch, dict(primitive.reuse), primitive.accumulates)


@lru_cache(maxsize=1)
def registry() -> dict[str, KernelEntry]:
    """Every kernel with a reference (the numpy references, and ml_dtypes with them, load on the
    first call: choosing a kernel or listing implementations needs none of them)."""
    from modeldsl.kernels.reference import REFERENCES

    return {name: kernel_entry(name, reference) for name, reference in REFERENCES.items()}


def entry(name: str) -> KernelEntry:
    """The entry of kernel ``name`` (a user primitive's: its registered reference, :mod:`modeldsl.prims.user`);
    KeyError naming the known kernels for an unknown one."""
    found = registry().get(name)
    if found is not None:
        return found
    reference = USER_REFERENCES.get(name)
    if reference is not None:
        return kernel_entry(name, reference)
    raise KeyError(f"no kernel '{name}' in the registry (known: {', '.join(sorted(registry()))})")


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
