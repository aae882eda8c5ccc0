"""Runs the CUDA kernels on the CPU: each kernels/<family>.cu is compiled with g++ against a small
stand-in for the CUDA device runtime (include/cuda_emu.h: threads for a block's threads, barriers
for __syncthreads and warp shuffles, bf16/fp16 by bit manipulation), with one launcher per exported
kernel generated from the kernels/cuda.py table (which so gets its parameter kinds checked too).

For developing kernels without a GPU: ``MDSL_KERNEL_RUNNER=emulator python -m pytest tests/gpu``.
It checks the kernels' logic (indexing, reductions, vector and scalar paths, the table's argument
order); it says nothing of speed, of register or shared-memory limits, or of alignment faults.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from modeldsl.kernels import cuda

HERE = Path(__file__).resolve().parent
CTYPES = {"ptr": ctypes.c_void_p, "i32": ctypes.c_int32, "i64": ctypes.c_int64, "f32": ctypes.c_float,
          "f64": ctypes.c_double}
CDECL = {"ptr": "void*", "i32": "int", "i64": "long long", "f32": "float", "f64": "double"}
FLAGS = ["-std=c++20", "-O1", "-shared", "-fPIC", "-pthread", "-ffp-contract=off", "-w"]


def launchers(family: str) -> str:
    """C++ launchers of every kernel of a family: emu_launch_SYMBOL(grid, block, void** args)."""
    lines = ["#include <functional>", "namespace emu { int run(const unsigned*, const unsigned*, "
             "const std::function<void()>&); }"]
    for kernel in cuda.KERNELS.values():
        if kernel.family != family:
            continue
        decl = ", ".join(CDECL[kind] for _, kind in kernel.params)
        call = ", ".join(f"*({CDECL[kind]}*) args[{i}]" for i, (_, kind) in enumerate(kernel.params))
        for symbol in kernel.symbols.values():
            lines += [f'extern "C" void {symbol}({decl});',
                      f'extern "C" int emu_launch_{symbol}(const unsigned* grid, const unsigned* block, void** args) '
                      f'{{ return emu::run(grid, block, [&] {{ {symbol}({call}); }}); }}']
    return "\n".join(lines) + "\n"


def build(family: str, cache: Path) -> ctypes.CDLL:
    """The shared library of one family (cached by the hash of everything it is made of)."""
    source = cuda.SOURCE_DIR / f"{family}.cu"
    glue = launchers(family)
    digest = hashlib.sha256(glue.encode())
    for path in [source, *cuda.SOURCE_DIR.glob("*.cuh"), *HERE.glob("*.cpp"), *(HERE / "include").glob("*.h")]:
        digest.update(path.read_bytes())
    target = cache / f"{family}.{digest.hexdigest()[:16]}.so"
    if not target.exists():
        cache.mkdir(parents=True, exist_ok=True)
        glue_file = cache / f"{family}_launchers.cpp"
        glue_file.write_text(glue)
        tmp = target.with_suffix(".tmp.so")
        command = ["g++", *FLAGS, "-I", str(HERE / "include"), "-I", str(cuda.SOURCE_DIR), "-x", "c++", str(source),
                   str(glue_file), str(HERE / "emu.cpp"), "-o", str(tmp)]
        done = subprocess.run(command, check=False, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"g++ failed on {source.name}:\n{done.stderr[-4000:]}")
        os.replace(tmp, target)
    return ctypes.CDLL(str(target))


class EmulatorRunner:
    """The tests' runner interface (harness.Runner) over host memory and the emulated kernels."""

    name = "emulator"

    def __init__(self, cache: Path | None = None) -> None:
        self.cache = cache or Path(os.environ.get("MDSL_EMULATOR_CACHE", Path(tempfile.gettempdir()) / "mdsl-emu"))
        self.libraries: dict[str, ctypes.CDLL] = {}

    def alloc(self, nbytes: int, fill_byte: int) -> np.ndarray:
        return np.full(max(nbytes, 1) + 16, fill_byte, np.uint8)[:max(nbytes, 1)]  # 16 spare: unaligned offsets

    def upload(self, host: np.ndarray) -> np.ndarray:
        return np.array(host.view(np.uint8).reshape(-1), copy=True)

    def download(self, buffer: np.ndarray, shape: Sequence[int], dtype: np.dtype) -> np.ndarray:
        return buffer[: int(np.prod(shape)) * dtype.itemsize].copy().view(dtype).reshape(shape)

    def address(self, buffer: np.ndarray) -> int:
        return buffer.ctypes.data

    def memset0(self, buffer: np.ndarray, nbytes: int) -> None:
        buffer[:nbytes] = 0

    def launch(self, launch: cuda.Launch, args: list[Any]) -> None:
        family = launch.family
        if family not in self.libraries:
            self.libraries[family] = build(family, self.cache)
        fn = getattr(self.libraries[family], f"emu_launch_{launch.symbol}")
        values = [CTYPES[kind](int(a) if kind in ("ptr", "i32", "i64") else float(a))
                  for a, (_, kind) in zip(args, launch.kernel.params)]
        pointers = (ctypes.c_void_p * len(values))(*[ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in values])
        grid = (ctypes.c_uint * 3)(*launch.grid)
        block = (ctypes.c_uint * 3)(*launch.block)
        fn(grid, block, pointers)

    def sync(self) -> None:
        pass
