"""The threads and the scratch memory of the CPU kernels.

The threading model of the CPU executor: one :class:`Pool` of ``N`` threads
(the calling thread and ``N - 1`` workers) runs every kernel that is large
enough, each thread over its own contiguous block of the kernel's output rows;
numpy releases the GIL inside its loops (ufuncs, reductions, BLAS), so the
blocks run at once. BLAS itself always runs on one thread (the executor holds
the BLAS libraries at one thread while it runs), so the two never fight: a
matrix product is split by output rows over the pool like any other kernel. A
kernel takes as many threads as give each :data:`PARALLEL_ELEMENTS` of its work
(one below that): between numpy calls a thread holds the GIL, and handing it
over wakes the other thread through the OS, so threads pay off only when
their calls are long (on the 2-core CI VM, two threads making numpy calls of
64K cheap elements ran no faster than one, of 256K 1.8 times faster). The
split of a kernel depends only on its shapes and ``N``, so a result is
bitwise the same run to run.

numpy gives a ufunc over strided operands (the halves of a packed gate/up
projection) a buffer of ``np.getbufsize()`` elements per call; the pool's
threads, and the executor while it runs, use :data:`BUFSIZE`, so those
buffers stay a few KB.

Temporaries come from a :class:`Workspace`: per thread one byte buffer, sized
while the executor compiles its steps (each kernel reserves what one thread
needs) and allocated at the first run, so a warmed-up ``execute`` allocates
nothing. The pool and its workspace belong to the process: executors take
turns on them, one ``execute`` at a time (two Python threads executing at once
would share the scratch). Kernels compute in tiles of at most :data:`TILE` elements, so the
temporaries of a tile stay in the core's L2 between the passes over it.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable, Iterator
from functools import cache

import numpy as np

TILE = 1 << 18  # elements of one tile: long numpy calls (see PARALLEL_ELEMENTS), a few tiles fit a core's L2
BUFSIZE = 256  # numpy's ufunc buffer (elements) while kernels run: strided operands allocate no 64 KB
PARALLEL_ELEMENTS = 1 << 17  # work (elements, or multiply-adds / 64) each thread of a kernel gets at least

Task = Callable[[int, int, int], None]  # (start, stop, thread index)
BEFORE_RUN: list[Callable[[], None]] = []  # called before the pool's threads start a kernel (the compiled GEMMs' rest)


class Pool:
    """``threads`` threads running the blocks of one kernel at a time."""

    def __init__(self, threads: int):
        self.threads = max(int(threads), 1)
        self.workspace = Workspace(self.threads)
        self._tasks = [queue.SimpleQueue() for _ in range(self.threads - 1)]
        self._done: queue.SimpleQueue = queue.SimpleQueue()
        for index, tasks in enumerate(self._tasks, start=1):
            threading.Thread(target=self._work, args=(index, tasks), daemon=True,
                             name=f"mdsl-cpu-{index}").start()

    def _work(self, index: int, tasks: queue.SimpleQueue) -> None:
        np.setbufsize(BUFSIZE)
        np.seterr(all="ignore")  # as the executor's thread runs its steps
        while True:
            task, start, stop = tasks.get()
            try:
                task(start, stop, index)
                self._done.put(None)
            except BaseException as err:  # re-raised on the calling thread
                self._done.put(err)

    def split(self, total: int, work: int) -> list[tuple[int, int]]:
        """``[0, total)`` as contiguous ranges, one per thread that gets any: as many threads as
        ``work``, the kernel's size, gives :data:`PARALLEL_ELEMENTS` each (so one below that)."""
        parts = max(min(self.threads, total, work // PARALLEL_ELEMENTS), 1)
        bounds = [total * i // max(parts, 1) for i in range(parts + 1)]
        return [(lo, hi) for lo, hi in zip(bounds[:-1], bounds[1:]) if hi > lo]

    def run(self, task: Task, ranges: list[tuple[int, int]]) -> None:
        """``task(start, stop, thread)`` for each range, the first on the calling thread."""
        if len(ranges) > 1:
            for hook in BEFORE_RUN:
                hook()
        for (start, stop), tasks in zip(ranges[1:], self._tasks):
            tasks.put((task, start, stop))
        error = None
        try:
            if ranges:
                task(*ranges[0], 0)
        finally:
            for _ in ranges[1:]:
                error = self._done.get() or error
        if error is not None:
            raise error

    def blocks(self, task: Task, total: int, work: int) -> None:
        """``task`` over ``[0, total)`` split by :meth:`split`."""
        self.run(task, self.split(total, work))


class Workspace:
    """One scratch buffer per thread: reserved while steps compile, allocated at the first run."""

    def __init__(self, threads: int):
        self.need = 0
        self.buffers: list[np.ndarray] = [np.empty(0, np.uint8) for _ in range(threads)]

    def reserve(self, nbytes: int) -> None:
        self.need = max(self.need, int(nbytes))

    def prepare(self) -> None:
        """Grow the buffers to what the compiled kernels reserved (a no-op once warmed up)."""
        if self.buffers[0].nbytes < self.need:
            self.buffers = [np.empty(self.need, np.uint8) for _ in self.buffers]

    def arrays(self, thread: int, count: int, dtype: np.dtype, number: int) -> list[np.ndarray]:
        """``number`` 1-d arrays of ``count`` elements of ``dtype`` in ``thread``'s buffer."""
        return self.carve(thread, dtype, [count] * number)

    def carve(self, thread: int, dtype: np.dtype, counts: list[int]) -> list[np.ndarray]:
        """1-d arrays of ``dtype`` with the given element counts, one after another in ``thread``'s buffer."""
        dtype = np.dtype(dtype)
        buffer, start, arrays = self.buffers[thread], 0, []
        for count in counts:
            arrays.append(buffer[start:start + count * dtype.itemsize].view(dtype))
            start += aligned(count * dtype.itemsize)
        return arrays


def aligned(nbytes: int, alignment: int = 64) -> int:
    return -(-nbytes // alignment) * alignment


def scratch_bytes(count: int, dtype: np.dtype, number: int = 1) -> int:
    """What :meth:`Workspace.arrays` of ``number`` arrays of ``count`` elements needs."""
    return number * aligned(count * np.dtype(dtype).itemsize)


def carved_bytes(dtype: np.dtype, counts: list[int]) -> int:
    """What :meth:`Workspace.carve` of ``counts`` needs."""
    return sum(scratch_bytes(count, dtype) for count in counts)


def tile_rows(columns: int, tile: int = TILE) -> int:
    """Rows of ``columns`` elements in one tile (at least one)."""
    return max(tile // max(columns, 1), 1)


def row_tiles(start: int, stop: int, rows: int) -> Iterator[tuple[int, int]]:
    """``[start, stop)`` in tiles of ``rows`` rows."""
    for lo in range(start, stop, rows):
        yield lo, min(lo + rows, stop)


def pool_of(threads: int) -> Pool:
    """The process's pool of ``threads`` threads (created once, shared by every executor; a forked
    child, which has none of its parent's threads, makes its own)."""
    return _pool(threads, os.getpid())


@cache
def _pool(threads: int, process: int) -> Pool:
    return Pool(threads)
