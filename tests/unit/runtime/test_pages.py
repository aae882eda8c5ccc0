"""The params arena's pages: a checkpoint file's pages mapped copy-on-write where the bytes line up
(modeldsl.runtime.pages)."""

import sys

import numpy as np
import pytest

from modeldsl.runtime import pages
from modeldsl.runtime.pages import PAGE, PagedArena, best_shift

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="file pages are mapped on Linux only")


@pytest.fixture
def file_of_bytes(tmp_path):
    data = np.random.default_rng(0).integers(0, 256, 8 * PAGE, dtype=np.uint8)
    path = tmp_path / "bytes.bin"
    path.write_bytes(data.tobytes())
    with open(path, "rb") as f:
        yield f.fileno(), data, path


@linux
def test_whole_pages_of_a_lined_up_view_hold_the_file_bytes_and_the_rest_is_left_alone(file_of_bytes):
    fd, data, _ = file_of_bytes
    arena = PagedArena(6 * PAGE, shift=100, populate=False)
    view = arena.array[PAGE - 100 + 7:5 * PAGE]  # starts 7 bytes into a page
    lo, hi = arena.map_file(fd, 7, view)
    assert (lo, hi) == (PAGE - 7, PAGE - 7 + 3 * PAGE)
    np.testing.assert_array_equal(view[lo:hi], data[PAGE:4 * PAGE])
    assert not view[:lo].any() and not view[hi:].any()  # the partial pages are the caller's to read
    assert arena.mapped == 3 * PAGE


@linux
def test_writes_to_mapped_pages_never_reach_the_file(file_of_bytes):
    fd, data, path = file_of_bytes
    arena = PagedArena(4 * PAGE, populate=False)
    assert arena.map_file(fd, 0, arena.array) == (0, 4 * PAGE)
    arena.array[:] = 0
    assert path.read_bytes() == data.tobytes()


@linux
def test_nothing_is_mapped_where_the_bytes_do_not_line_up_or_lie_outside_the_arena(file_of_bytes):
    fd, _, _ = file_of_bytes
    arena = PagedArena(4 * PAGE, populate=False)
    assert arena.map_file(fd, 4, arena.array) == (0, 0)  # 4 bytes off
    assert arena.map_file(fd, 8, arena.array[8:2 * PAGE - 8]) == (0, 0)  # no whole page
    assert arena.map_file(fd, PAGE, arena.array[:2 * PAGE]) == (0, 2 * PAGE)
    outside = np.zeros(4 * PAGE, np.uint8)
    assert arena.map_file(fd, outside.ctypes.data % PAGE, outside) == (0, 0)
    assert arena.mapped == 2 * PAGE and not outside.any()


def test_without_mmap_nothing_is_mapped(file_of_bytes, monkeypatch):
    monkeypatch.setattr(pages, "_MMAP", None)
    fd, _, _ = file_of_bytes
    arena = PagedArena(4 * PAGE, populate=False)
    assert arena.map_file(fd, 0, arena.array) == (0, 0) and not arena.array.any()


def test_the_shift_lines_up_the_most_bytes():
    pieces = [(8 + 64, 0, 10 * PAGE), (8 + 64 + 10 * PAGE, 10 * PAGE, 10 * PAGE),  # shift 72: 2 x 9 pages
              (4096 * 50 + 16, 0, 12 * PAGE),  # shift 16: 11 pages
              (3, 0, PAGE)]  # too small to hold a whole page wherever it starts
    assert best_shift(pieces) == (72, 18 * PAGE)
    assert best_shift([]) == (0, 0)


def test_an_arena_is_zero_and_starts_at_its_shift():
    arena = PagedArena(3 * PAGE, shift=40, populate=False)
    assert arena.array.nbytes == 3 * PAGE and not arena.array.any()
    if arena.pages is not None:
        assert arena.array.ctypes.data % PAGE == 40
    with pytest.raises(ValueError):
        PagedArena(PAGE, shift=PAGE)
