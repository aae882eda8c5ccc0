"""The params arena's pages: reserved without touching them, and backed by a checkpoint file's
pages where the bytes line up.

On Linux the arena is anonymous memory the kernel gives out page by page on first touch. A
tensor the checkpoint stores in the arena's dtype, whose bytes lie at the same offset within a
page in the file and in the arena, need not be copied: :meth:`PagedArena.map_file` maps the file
over the arena's whole pages it covers (``MAP_PRIVATE | MAP_FIXED``), copy-on-write, so the
weights are the page cache's pages (as transformers' safetensors loading keeps them) and a write
to a weight (training) copies only that page, never the file. :func:`best_shift` picks the one
offset within the first page where the arena starts that lines up the most bytes; the other bytes
are read as before. Elsewhere (not Linux, a file system that cannot map) nothing is mapped."""

from __future__ import annotations

import ctypes
import mmap
import sys
from collections import Counter
from collections.abc import Iterable

import numpy as np

PAGE = mmap.PAGESIZE
POPULATE_FROM = 1 << 24  # bytes: smaller arenas are plain numpy zeros
_MAPPABLE = sys.platform.startswith("linux") and hasattr(mmap, "MAP_POPULATE")


def _libc_mmap():
    if not _MAPPABLE:
        return None
    call = ctypes.CDLL(None, use_errno=True).mmap
    call.restype = ctypes.c_void_p
    call.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    return call


_MMAP = _libc_mmap()
MAP_FIXED = 0x10


class PagedArena:
    """``nbytes`` zero bytes (:attr:`array`) starting ``shift`` bytes into a page. ``populate``:
    the kernel gives out every page at once (``MAP_POPULATE``), 4-5x faster than a fault per page
    where pages are fresh (a virtual machine's first touch of its memory); otherwise pages are
    given out as they are touched, and those a file is mapped over are never given out."""

    def __init__(self, nbytes: int, shift: int = 0, populate: bool = True):
        if not 0 <= shift < PAGE:
            raise ValueError(f"shift {shift} is not within a page")
        self.mapped = 0  # bytes backed by a file's pages
        if not _MAPPABLE or (nbytes < POPULATE_FROM and populate):
            self.pages: mmap.mmap | None = None
            self.array = np.zeros(nbytes, dtype=np.uint8)
            return
        flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | (mmap.MAP_POPULATE if populate else 0)
        self.pages = mmap.mmap(-1, max(nbytes + shift, 1), flags=flags)
        self.array = np.frombuffer(self.pages, dtype=np.uint8)[shift:shift + nbytes]
        self.start = np.frombuffer(self.pages, dtype=np.uint8).ctypes.data
        self.end = self.start + len(self.pages)

    def map_file(self, fd: int, offset: int, view: np.ndarray) -> tuple[int, int]:
        """Back the whole pages of ``view`` (C-contiguous, in this arena) with the file ``fd``'s
        bytes from ``offset`` on, where the two line up; returns the byte range of ``view``
        (start, end) that now holds the file's bytes, (0, 0) when none does."""
        if self.pages is None or _MMAP is None or not view.flags.c_contiguous:
            return 0, 0
        address = view.ctypes.data
        if (address - offset) % PAGE or address < self.start or address + view.nbytes > self.end:
            return 0, 0
        lo = -address % PAGE
        hi = lo + (view.nbytes - lo) // PAGE * PAGE if view.nbytes > lo else lo
        if hi - lo < PAGE:
            return 0, 0
        got = _MMAP(address + lo, hi - lo, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE | MAP_FIXED,
                    fd, offset + lo)
        if got != address + lo:  # MAP_FAILED: the range keeps its anonymous pages
            return 0, 0
        self.mapped += hi - lo
        return lo, hi


def best_shift(pieces: Iterable[tuple[int, int, int]]) -> tuple[int, int]:
    """The offset within a page at which to start an arena so that the most bytes of ``pieces``
    (file offset, offset in the arena, bytes) line up with their file, and how many whole pages'
    bytes that lines up."""
    votes: Counter[int] = Counter()
    for file_offset, arena_offset, nbytes in pieces:
        if nbytes >= 2 * PAGE:
            votes[(file_offset - arena_offset) % PAGE] += nbytes - PAGE
    if not votes:
        return 0, 0
    shift, lined_up = votes.most_common(1)[0]
    return shift, lined_up
