"""The CPU executor's fast kernels: numpy or compiled C, written into the planned buffers, over a thread pool.

``CPU_KERNELS[name](pool, outputs, inputs, params)`` is called once, when the
executor compiles a launch of primitive ``name``, with the launch's output
views, its input views (in the reference's calling convention: optional
operands None, variadic groups flattened) and its parameters; it returns the
step that runs the launch, or None when it cannot run these operands (a dtype
or layout it does not handle), and the executor then runs the numpy reference
(:mod:`modeldsl.kernels.reference`, the oracle every kernel here is tested
against) and copies its results in. :mod:`~modeldsl.kernels.cpu.pool` holds
the threading model and the scratch memory.

``JIT_KERNELS`` are the twins on the compiled path (:mod:`~modeldsl.kernels.cpu.compiled`: C loops
for the work numpy runs as many passes); :func:`cpu_kernel` gives a launch to its twin first and to
the numpy kernel what the twin declines.
"""

from __future__ import annotations

from collections.abc import Callable

from modeldsl.kernels.cpu import activation, attention, compiled, dropout, loss, norm, optim, quantize, rope, tensor

CpuKernel = Callable[..., Callable[[], None] | None]

CPU_KERNELS: dict[str, CpuKernel] = {
    **activation.KERNELS,
    **attention.KERNELS,
    **dropout.KERNELS,
    **loss.KERNELS,
    **norm.KERNELS,
    **rope.KERNELS,
    **tensor.KERNELS,
    **optim.KERNELS,
    **quantize.KERNELS,
}


JIT_KERNELS: dict[str, CpuKernel] = {**activation.JIT_KERNELS, **attention.JIT_KERNELS, **loss.JIT_KERNELS,
                                     **norm.JIT_KERNELS, **rope.JIT_KERNELS}


def cpu_kernel(name: str, jit: bool | None = None) -> CpuKernel | None:
    """The fast CPU kernel of primitive ``name``, if it has one: its compiled twin first where
    ``jit`` (default: :func:`compiled.enabled`), the numpy kernel for what that declines."""
    numpy_kernel = CPU_KERNELS.get(name)
    wanted = compiled.enabled() if jit is None else jit and compiled.library() is not None
    twin = JIT_KERNELS.get(name) if wanted else None
    if twin is None or numpy_kernel is None:
        return twin or numpy_kernel

    def either(pool, outputs, inputs, params):
        return twin(pool, outputs, inputs, params) or numpy_kernel(pool, outputs, inputs, params)

    return either
