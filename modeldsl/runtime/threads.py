"""How many threads the CPU executors use, and BLAS's threads while they run.

The CPU kernels (:mod:`modeldsl.kernels.cpu.pool`) split each kernel's rows
over a pool of threads, matrix products included, and run BLAS on one thread
inside each block: numpy's BLAS (OpenBLAS) threads spin while they wait, and
on a machine whose cores are busy two thread pools fighting for them turn a
millisecond into a wait for the scheduler. So the executors hold BLAS at one
thread (:func:`blas_threads`) while their steps run, and the graph
interpreter runs on one thread.

The pool is, in order: what :func:`set_pool_size` set (``mdsl-run --threads``),
the environment variable ``MDSL_NUM_THREADS``, else the cores this process may
run on (``os.sched_getaffinity``). Limits are set with threadpoolctl for the
duration of a call and restored after it; nothing is changed at import time.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from functools import cache

from modeldsl.diagnostics import Diagnostic, DiagnosticError

ENV_VAR = "MDSL_NUM_THREADS"

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
    if value < 1 or value > max_threads():
        raise DiagnosticError([Diagnostic("E029", f"{origin} must be a whole number of threads from 1 to "
                                          f"{max_threads()}, got '{text}'",
                                          None, f"give a number from 1 to {usable_cores()} (the cores this "
                                          "process may use)")])
    return value


def max_threads() -> int:
    """The most threads a pool may have: four per usable core, at least 64 (more only oversubscribes)."""
    return max(64, 4 * usable_cores())


def set_pool_size(threads: int | None) -> None:
    """Make ``threads`` the pool of every CPU executor made from now on (None: back to the default)."""
    global _pool_override
    _pool_override = threads


def pool_size() -> int:
    """The threads of the CPU executors' pool (see the module docstring for the order)."""
    if _pool_override is not None:
        return _pool_override
    text = os.environ.get(ENV_VAR)
    if text:
        return parse_thread_count(text, ENV_VAR)
    return usable_cores()


@cache
def _blas():
    """threadpoolctl's controller of the BLAS libraries loaded in this process (numpy's)."""
    import numpy  # noqa: F401 - loads the BLAS the controller looks for
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController().select(user_api="blas")


def blas_threads(threads: int) -> AbstractContextManager:
    """A context in which BLAS runs ``threads`` threads (restored on exit). It sets the libraries'
    counts itself: threadpoolctl's ``limit`` costs ~13 us, a tenth of a small model's decode step."""
    libraries = _blas().lib_controllers
    if not libraries:
        return nullcontext()
    return _held(libraries, threads)


@contextmanager
def _held(libraries: list, threads: int) -> Iterator[None]:
    before = [lib.get_num_threads() for lib in libraries]
    for lib, count in zip(libraries, before):
        if count != threads:
            lib.set_num_threads(threads)
    try:
        yield
    finally:
        for lib, count in zip(libraries, before):
            if count != threads:
                lib.set_num_threads(count)


def blas_thread_counts() -> list[int]:
    """The thread count each loaded BLAS library has now (for tests and reports)."""
    return [lib.num_threads for lib in _blas().lib_controllers]
