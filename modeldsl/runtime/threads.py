"""How many BLAS threads the CPU executors give a matrix product.

numpy's BLAS (OpenBLAS) threads every product above a tiny size and lets its
threads spin while they wait for each other. On a machine whose cores are busy
with other processes that turns a small GEMM into a wait for the scheduler:
the tiny Llama's training step ran 20-100 times slower with the default
threading than with one thread. So the CPU executors decide per product:
one whose single 2-D BLAS call does fewer than :data:`PARALLEL_MACS`
multiply-adds (about a millisecond on one core) runs on one thread, a larger
one on a pool of :func:`pool_size` threads.

The pool is, in order: what :func:`set_pool_size` set (``mdsl-run --threads``),
the environment variable ``MDSL_NUM_THREADS``, else the cores this process may
run on (``os.sched_getaffinity``). Limits are set with threadpoolctl for the
duration of a call and restored after it; nothing is changed at import time.
"""

from __future__ import annotations

import os
from contextlib import AbstractContextManager, nullcontext
from functools import cache

from modeldsl.diagnostics import Diagnostic, DiagnosticError

ENV_VAR = "MDSL_NUM_THREADS"
PARALLEL_MACS = 1 << 25  # multiply-adds of one BLAS call from which threads pay off

_pool_override: int | None = None


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity), at least 1."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except (AttributeError, OSError):  # no sched_getaffinity (macOS, Windows)
        return max(os.cpu_count() or 1, 1)


def parse_thread_count(text: str, origin: str) -> int:
    """A thread count written by a user (``origin`` names where: a flag or the variable); E029 unless >= 1."""
    try:
        value = int(text.strip())
    except ValueError:
        value = 0
    if value < 1:
        raise DiagnosticError([Diagnostic("E029", f"{origin} must be a whole number of threads >= 1, got '{text}'",
                                          None, f"give a number from 1 to {usable_cores()} (the cores this "
                                          "process may use)")])
    return value


def set_pool_size(threads: int | None) -> None:
    """Make ``threads`` the pool of large products for every CPU executor (None: back to the default)."""
    global _pool_override
    _pool_override = threads


def pool_size() -> int:
    """The threads a large product runs on (see the module docstring for the order)."""
    if _pool_override is not None:
        return _pool_override
    text = os.environ.get(ENV_VAR)
    if text:
        return parse_thread_count(text, ENV_VAR)
    return usable_cores()


def threads_for(macs: int, pool: int) -> int:
    """Threads for one BLAS call of ``macs`` multiply-adds with a pool of ``pool``."""
    return pool if macs >= PARALLEL_MACS else 1


@cache
def _blas():
    """threadpoolctl's controller of the BLAS libraries loaded in this process (numpy's)."""
    import numpy  # noqa: F401 - loads the BLAS the controller looks for
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController().select(user_api="blas")


def blas_threads(threads: int) -> AbstractContextManager:
    """A context in which BLAS runs ``threads`` threads (restored on exit)."""
    controller = _blas()
    if not controller.lib_controllers:
        return nullcontext()
    return controller.limit(limits=threads)


def blas_thread_counts() -> list[int]:
    """The thread count each loaded BLAS library has now (for tests and reports)."""
    return [lib.num_threads for lib in _blas().lib_controllers]
