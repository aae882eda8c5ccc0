"""Whether a model fits in the machine's memory, checked before anything is allocated.

:func:`parameter_bytes` sizes the parameters from the symbolic shapes of the
model as declared (``[n_layers, d_ff, d_model]``) and the configuration's
values, in Python integers, so an absurd ``config.json`` (10^9 layers, a
10^12-wide MLP) is refused in microseconds, before the IR is built or
specialized. :func:`check_fits` compares what a step needs with
:func:`available_bytes` (``MemAvailable``, or the free pages, capped by the
cgroup's limit when one is set) and raises E038 with both numbers in GiB.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from modeldsl.diagnostics import Diagnostic, DiagnosticError
from modeldsl.dialects.graph import ModelOp, ParamOp
from modeldsl.symbolic import Expr, SymbolicError

GIB = 1 << 30
CGROUP_LIMITS = (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                 ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"))


def available_bytes() -> int:
    """Memory this process can still allocate: the kernel's estimate of available memory,
    no more than what the cgroup's limit leaves."""
    available = _meminfo_available()
    if available is None:
        available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    for limit_file, usage_file in CGROUP_LIMITS:
        limit, usage = _read_int(limit_file), _read_int(usage_file)
        if limit is not None and usage is not None and limit < 1 << 60:
            available = min(available, max(limit - usage, 0))
            break
    return available


def _meminfo_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _read_int(path: str) -> int | None:
    try:
        return int(Path(path).read_text().strip())
    except (OSError, ValueError):  # absent, or "max" (no limit)
        return None


def parameter_bytes(model: ModelOp, values: dict[str, Any], itemsize: int) -> int | None:
    """Bytes of the model's parameters under ``values`` (None when a shape is not determined
    by them), ``itemsize`` bytes each but where ``mdsl-quantize-frozen`` stores a parameter (its
    ``quantized`` dictionary): in its stored dtype. ``model`` may be unspecialized: its shapes are
    evaluated symbolically."""
    sizes = {k: v for k, v in values.items() if isinstance(v, int) and not isinstance(v, bool)}
    total = 0
    for param in (op for op in model.walk() if isinstance(op, ParamOp)):
        count = 1
        for dim in param.param_type.shape:
            try:
                extent = dim.evaluate(sizes) if isinstance(dim, Expr) else int(dim)
            except (SymbolicError, ZeroDivisionError, ValueError, TypeError):
                return None
            count *= max(extent, 0)
        total += param.param_type.dtype.byte_size(count) if param.quantized is not None else count * itemsize
    return total


def check_fits(needs: dict[str, int], hint: str, available: int | None = None, where: str = "memory") -> None:
    """E038 when the parts of ``needs`` (what -> bytes) add up to more than is available
    (``available`` bytes of ``where``; by default the host's :func:`available_bytes`)."""
    free = available_bytes() if available is None else available
    total = sum(needs.values())
    if total <= free:
        return
    parts = ", ".join(f"{what} {gib(size)}" for what, size in needs.items())
    raise DiagnosticError([Diagnostic("E038", f"the model needs {gib(total)} ({parts}), but only {gib(free)} "
                                      f"of {where} is available", None, hint)])


def check_fits_on(device: Any, needs: dict[str, int], advice: str) -> None:
    """E038 when ``needs`` exceed the memory available on ``device`` (a CUDA executor's device; None:
    the host), with ``advice`` in the hint."""
    if device is None:
        check_fits(needs, f"{advice}, or a machine with more memory")
    else:
        check_fits(needs, f"{advice}, or a GPU with more memory", device.free_bytes(), f"{device.name} device memory")


def gib(size: int) -> str:
    value = size / GIB
    if value >= 1e6:
        return f"{value:.3g} GiB"
    return f"{value:.2f} GiB" if value >= 0.01 else f"{value:.4f} GiB"
