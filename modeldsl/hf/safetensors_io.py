"""Reading and writing ``.safetensors`` files as memory-mapped numpy arrays.

The ``safetensors`` package's numpy backend cannot represent bfloat16, the
usual dtype of checkpoints, so tensors are read here straight from the
documented format (an 8-byte little-endian header length, a JSON header of
``name -> {dtype, shape, data_offsets}``, then the raw data) with
``numpy.memmap`` and ``ml_dtypes.bfloat16``: no copy until a tensor is used,
and nothing is ever unpickled. :meth:`SafetensorsFile.read_into` reads a tensor
straight into an array the caller owns (the model's params arena), converting
its dtype in bounded chunks (or has the caller back it with the file's pages,
which it then leaves untouched); :meth:`SafetensorsFile.row_chunks` reads a
tensor's rows a bounded chunk at a time, for a caller that moves them.
Every inconsistency (short file, bad header, offsets outside the data) is a
:class:`CheckpointError` naming file and tensor.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import mmap
import os
import stat
import struct
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype(np.float64),
    "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
    "I64": np.dtype(np.int64),
    "I32": np.dtype(np.int32),
    "I16": np.dtype(np.int16),
    "I8": np.dtype(np.int8),
    "U8": np.dtype(np.uint8),
    "BOOL": np.dtype(np.bool_),
}
NAMES = {v: k for k, v in DTYPES.items()}
MAX_HEADER = 100 * 1024 * 1024
READ_CHUNK = 16 * 1024 * 1024  # bytes of the file read (and converted) at a time, per thread: the bound of a
# load's temporaries
OWN_PAGES_FROM = 1 << 20  # bytes from which a chunk buffer is mapped anonymous memory of its own
PRIVATE = {"flags": mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS} if hasattr(mmap, "MAP_PRIVATE") else {}
MAX_READ = 1 << 30  # bytes one read call asks for (Linux returns at most 2 GiB - 4 KiB)
# (file descriptor, file offset, the bytes of an array) -> the range of those bytes now backed by the file
Mapper = Callable[[int, int, np.ndarray], tuple[int, int]]


class CheckpointError(Exception):
    """A problem with checkpoint files or their contents, with its diagnostic code (and, for a
    config field, the ``field`` and its ``span`` in config.json)."""

    def __init__(self, code: str, message: str, hint: str = "", tensor: str | None = None,
                 field: str | None = None):
        super().__init__(message)
        self.code, self.message, self.hint, self.tensor, self.field = code, message, hint, tensor, field
        self.span = None  # where in config.json, once known (a modeldsl.diagnostics.Span)


FILE_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
              (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def regular_file(path: str | os.PathLike, what: str, required: bool = True) -> os.stat_result | None:
    """The ``stat`` of ``path`` when it is a regular file (following links), so that nothing
    ever blocks reading a FIFO or reads a device without end; None when it does not exist
    and is not ``required``; E028 naming what it is otherwise."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        if not required:
            return None
        raise CheckpointError("E028", f"{what} '{path}' does not exist") from None
    except OSError as err:
        raise CheckpointError("E028", f"cannot read {what} '{path}': {err.strerror or err}") from None
    if not stat.S_ISREG(info.st_mode):
        kind = next((name for test, name in FILE_KINDS if test(info.st_mode)), "not a regular file")
        raise CheckpointError("E028", f"{what} '{path}' is {kind}, not a file",
                              f"replace it with the checkpoint's own {Path(path).name}")
    return info


class SafetensorsFile:
    """One ``.safetensors`` file: its tensor names, shapes, dtypes and lazy arrays."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        size = regular_file(self.path, "the checkpoint file").st_size
        with open(self.path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise self.corrupt("the file is shorter than its 8-byte header length")
            (length,) = struct.unpack("<Q", head)
            if length > size - 8:
                raise self.corrupt(f"the header claims {length} bytes but the file has {size - 8}")
            if length > MAX_HEADER:
                raise self.corrupt(f"the header claims {length} bytes, more than the {MAX_HEADER} a safetensors "
                                   "header may have")
            try:
                header = json.loads(f.read(length))
            except (UnicodeDecodeError, ValueError, RecursionError) as err:  # ValueError: ints past 4300 digits too
                reason = "nested too deeply" if isinstance(err, RecursionError) else str(err)
                raise self.corrupt(f"the header is not valid JSON ({reason})") from None
        if not isinstance(header, dict):
            raise self.corrupt("the header is not a JSON object")
        metadata = header.pop("__metadata__", None) or {}
        if not isinstance(metadata, dict):
            raise self.corrupt("the header's __metadata__ is not a JSON object")
        self.metadata: dict[str, str] = metadata
        self.data_start = 8 + length
        self.data_size = size - self.data_start
        self.entries: dict[str, tuple[np.dtype, tuple[int, ...], int, int]] = {}
        for name, entry in header.items():
            self.entries[name] = self.check_entry(name, entry)
        self._map: np.memmap | None = None
        # name -> (first column, end column, the whole shape): a tensor read as a range of its columns
        self.windows: dict[str, tuple[int, int, tuple[int, ...]]] = {}

    def narrow(self, name: str, dim: int, index: int, parts: int) -> None:
        """Present tensor ``name`` as its ``index``-th of ``parts`` equal slices along ``dim`` (one
        tensor-parallel rank's share): along dim 0 a byte range of the file, along dim 1 of a matrix
        a range of columns of each row; only that slice is read from then on."""
        dtype, shape, start, end = self.entries[name]
        if not 0 <= dim < min(len(shape), 2) or shape[dim] % parts:
            raise CheckpointError("E048", f"tensor '{name}' {list(shape)} does not split into {parts} equal slices "
                                  f"along dim {dim}", "choose a tp that divides the dimension", name)
        size = shape[dim] // parts
        if dim == 0:
            row = math.prod(shape[1:]) * dtype.itemsize
            self.entries[name] = (dtype, (size, *shape[1:]), start + index * size * row,
                                  start + (index + 1) * size * row)
            return
        if len(shape) != 2:
            raise CheckpointError("E048", f"tensor '{name}' {list(shape)}: only a matrix splits along dim 1",
                                  "declare the parameter @shard(column) or replicated", name)
        self.windows[name] = (index * size, (index + 1) * size, shape)
        self.entries[name] = (dtype, (shape[0], size), start, end)

    def corrupt(self, problem: str, tensor: str | None = None) -> CheckpointError:
        return CheckpointError("E034", f"{self.path.name}: {problem}", "the file is truncated or corrupt; "
                               "download or save the checkpoint again", tensor)

    def check_entry(self, name: str, entry: object) -> tuple[np.dtype, tuple[int, ...], int, int]:
        """An entry's dtype, shape and byte range, all checked in Python integers (a shape
        whose byte count overflows int64 is refused, never wrapped around)."""
        fields = entry if isinstance(entry, dict) else {}
        dtype = DTYPES.get(fields.get("dtype")) if isinstance(fields.get("dtype"), str) else None
        shape, offsets = fields.get("shape"), fields.get("data_offsets")
        if dtype is None or not _naturals(shape) or not _naturals(offsets) or len(offsets) != 2:
            raise self.corrupt(f"tensor '{name}' has a malformed header entry {_short(entry)} (a dtype of "
                               f"{', '.join(DTYPES)}, a shape and two data_offsets of non-negative integers)", name)
        start, end = offsets
        expected = math.prod(shape) * dtype.itemsize
        if end - start != expected:
            raise self.corrupt(f"tensor '{name}' spans {end - start} bytes, its shape {tuple(shape)} needs {expected}",
                               name)
        if end > self.data_size:
            raise self.corrupt(f"tensor '{name}' ends at byte {end} but the data has {self.data_size}", name)
        return dtype, tuple(shape), start, end

    def keys(self) -> list[str]:
        return list(self.entries)

    def shape(self, name: str) -> tuple[int, ...]:
        return self.entries[name][1]

    def dtype(self, name: str) -> np.dtype:
        return self.entries[name][0]

    def array(self, name: str) -> np.ndarray:
        """The tensor as a read-only view into the memory-mapped file."""
        dtype, shape, start, end = self.entries[name]
        if end == start:
            return np.zeros(shape, dtype)
        if self._map is None:
            self._map = np.memmap(self.path, dtype=np.uint8, mode="r", offset=self.data_start)
        if name in self.windows:
            first, stop, whole = self.windows[name]
            return self._map[start:end].view(dtype).reshape(whole)[:, first:stop]
        return self._map[start:end].view(dtype).reshape(shape)

    def read_into(self, name: str, out: np.ndarray, inspect: Callable[[np.ndarray], Any] | None = None,
                  chunk_bytes: int = READ_CHUNK, threads: int = 1, mapper: Mapper | None = None) -> list[Any]:
        """Read the tensor's bytes from the file straight into ``out`` (C-contiguous, as many
        elements, any float dtype), converting to ``out``'s dtype in chunks of at most
        ``chunk_bytes`` of the file, so no full-size temporary is made. The chunks are read on
        up to ``threads`` threads (the kernel copies and numpy converts without the GIL).
        ``mapper`` (``out`` in the file's dtype) may first back ``out``'s bytes with the file's
        pages (see :class:`modeldsl.runtime.pages.PagedArena`); only the bytes it does not map are
        read into ``out``, and the mapped pages are not touched: ``inspect`` sees a chunk that has
        mapped bytes in a bounded buffer read from the file, so they stay out of this process's
        memory until they are used. Returns what ``inspect`` gives for each chunk as the file
        stores it, in order."""
        dtype, shape, start, _ = self.entries[name]
        if not out.flags.c_contiguous or out.size != math.prod(shape):
            raise ValueError(f"read_into '{name}': a C-contiguous array of {math.prod(shape)} elements is needed")
        if name in self.windows:
            return self.read_window_into(name, out.reshape(shape), inspect, chunk_bytes)
        flat = out.reshape(-1)
        step = max(chunk_bytes // dtype.itemsize, 1)
        convert = out.dtype != dtype
        with open(self.path, "rb", buffering=0) as f:
            mapped = (0, 0)
            if mapper is not None and not convert:
                mapped = mapper(f.fileno(), self.data_start + start, flat.view(np.uint8))

            def chunk(begin: int) -> Any:
                count, first = min(step, flat.size - begin), begin * dtype.itemsize
                covered = _covered(mapped, first, count * dtype.itemsize)
                buffered = convert or (inspect is not None and covered[0] < covered[1])
                target = scratch((count,), dtype) if buffered else flat[begin:begin + count]
                raw = target.view(np.uint8)
                for lo, hi in ((0, raw.size),) if buffered else _around(covered, raw.size):
                    self.read_bytes(f, self.data_start + start + first + lo, raw[lo:hi], name)
                seen = inspect(target) if inspect is not None else None
                if convert:
                    np.copyto(flat[begin:begin + count], target, casting="unsafe")
                elif buffered:  # the file's pages back the covered bytes: only the others are copied in
                    into = flat[begin:begin + count].view(np.uint8)
                    for lo, hi in _around(covered, raw.size):
                        into[lo:hi] = raw[lo:hi]
                return seen

            begins = range(0, flat.size, step)
            if threads <= 1 or len(begins) <= 1:
                return [chunk(b) for b in begins]
            with ThreadPoolExecutor(min(threads, len(begins))) as pool:
                return list(pool.map(chunk, begins))

    def read_window_into(self, name: str, out: np.ndarray, inspect: Callable[[np.ndarray], Any] | None,
                         chunk_bytes: int) -> list[Any]:
        """A tensor read as a range of its columns (:meth:`narrow`), a chunk of whole rows at a time."""
        seen = []
        for first, rows in self.row_chunks(name, 0, out.shape[0], chunk_bytes=chunk_bytes):
            rows = np.ascontiguousarray(rows)
            seen.append(inspect(rows.reshape(-1)) if inspect is not None else None)
            np.copyto(out[first:first + rows.shape[0]], rows, casting="unsafe")
        return seen

    def row_chunks(self, name: str, start: int, stop: int, block: int = 1,
                   chunk_bytes: int = READ_CHUNK) -> Iterator[tuple[int, np.ndarray]]:
        """Rows ``start..stop`` of the tensor (along dim 0) as (first row, those rows as the file
        stores them), read from the file about ``chunk_bytes`` at a time (a whole number of
        ``block`` rows, at least one block) into one buffer every chunk reuses: a caller that
        places each chunk before taking the next holds no more than that buffer."""
        dtype, shape, begin, _ = self.entries[name]
        first_column, stop_column, whole = self.windows.get(name, (0, None, shape))
        row_bytes = math.prod(whole[1:]) * dtype.itemsize
        rows = max(chunk_bytes // max(row_bytes, 1) // block, 1) * block
        buffer = scratch((min(rows, max(stop - start, 0)), *whole[1:]), dtype)
        with open(self.path, "rb", buffering=0) as f:
            for first in range(start, stop, rows):
                chunk = buffer[:min(rows, stop - first)]
                self.read_bytes(f, self.data_start + begin + first * row_bytes, chunk, name)
                yield first, chunk if stop_column is None else chunk[:, first_column:stop_column]

    def read_bytes(self, f: io.RawIOBase, offset: int, target: np.ndarray, name: str) -> None:
        """Fill ``target`` with the file's bytes from ``offset`` (E034 if the file ends first)."""
        view = memoryview(target.reshape(-1).view(np.uint8))
        done = 0
        while done < len(view):
            read = os.preadv(f.fileno(), [view[done:done + MAX_READ]], offset + done)
            if read <= 0:
                raise self.corrupt(f"tensor '{name}' ends past the end of the file (was it truncated?)", name)
            done += read


def scratch(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A buffer of ``shape`` for chunks of a read: above :data:`OWN_PAGES_FROM` bytes in anonymous
    pages of its own, given back to the system when the array goes (malloc keeps freed blocks below
    its mmap threshold, up to 32 MiB, for later allocations, so a load's chunk buffers would stay in
    the process's memory beside the weights)."""
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes < OWN_PAGES_FROM:
        return np.empty(shape, dtype)
    pages = mmap.mmap(-1, nbytes, **PRIVATE)
    if hasattr(mmap, "MADV_HUGEPAGE"):  # a fault per 2 MiB, not per 4 KiB: as fast as malloc's recycled blocks
        with contextlib.suppress(OSError):  # a kernel without transparent huge pages
            pages.madvise(mmap.MADV_HUGEPAGE)
    return np.frombuffer(pages, dtype).reshape(shape)


def _covered(mapped: tuple[int, int], first: int, size: int) -> tuple[int, int]:
    """The part (lo, hi) of the ``size`` bytes from ``first`` that the ``mapped`` byte range
    covers, relative to ``first`` (lo == hi where it covers none)."""
    lo = min(max(mapped[0] - first, 0), size)
    return lo, max(min(mapped[1] - first, size), lo)


def _around(covered: tuple[int, int], size: int) -> Iterator[tuple[int, int]]:
    """The non-empty byte ranges of ``0..size`` outside ``covered``."""
    for lo, hi in ((0, covered[0]), (covered[1], size)):
        if lo < hi:
            yield lo, hi


def _naturals(value: object) -> bool:
    """Whether ``value`` is a JSON list of non-negative integers (not floats, not booleans)."""
    return isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)


def _short(value: object, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def write_safetensors(path: str | os.PathLike, tensors: dict[str, np.ndarray],
                      metadata: dict[str, str] | None = None) -> None:
    """Write tensors in the safetensors layout (sorted by name, data 8-byte aligned)."""
    header: dict[str, object] = {}
    if metadata:
        header["__metadata__"] = dict(metadata)
    offset = 0
    ordered = sorted(tensors)
    for name in ordered:
        array = np.ascontiguousarray(tensors[name])
        if array.dtype not in NAMES:
            raise ValueError(f"tensor '{name}' has dtype {array.dtype}, which safetensors cannot store")
        header[name] = {"dtype": NAMES[array.dtype], "shape": list(array.shape),
                        "data_offsets": [offset, offset + array.nbytes]}
        offset += array.nbytes
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(encoded)))
        f.write(encoded)
        for name in ordered:
            f.write(np.ascontiguousarray(tensors[name]).tobytes())
