"""Runs one primitive's CUDA plan (kernels/cuda.py) on device buffers: the one helper the GPU tests
launch every kernel through.

A *runner* owns device memory and launches kernels: :class:`CudaRunner` (CuPy memory; launches
through ``cuda.core``, else CuPy's RawModule) on a GPU, or ``emulator.EmulatorRunner`` (the
kernels compiled with g++ and run on the CPU, for checking without a GPU). :func:`run_plan`
uploads the inputs in the dtypes the table gives each buffer, poisons every output and the
scratch with NaN, runs the plan's steps and returns the outputs as numpy arrays.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

from modeldsl.kernels import cuda

STORAGE = {"bf16": ml_dtypes.bfloat16, "fp16": np.float16, "fp32": np.float32, "int32": np.int32, "int64": np.int64,
           "fp8_e4m3": ml_dtypes.float8_e4m3fn, "fp8_e5m2": ml_dtypes.float8_e5m2}
SCALARS = {"i32": np.int32, "i64": np.int64, "f32": np.float32, "f64": np.float64}
POISON_BYTE = 0xFF  # every float made of 0xFF bytes is a NaN; ints become -1
RUNNER = os.environ.get("MDSL_KERNEL_RUNNER", "cuda")  # "emulator": the kernels on the CPU (g++)
GPU = RUNNER != "emulator"


def skip_without_runner() -> None:
    """Skip the calling test module (at import) where its runner cannot run: no g++ for the
    emulator; no CuPy or no CUDA device for the GPU."""
    import pytest

    if not GPU:
        if shutil.which("g++") is None:
            pytest.skip("the CPU emulator needs g++", allow_module_level=True)
        return
    cupy = pytest.importorskip("cupy", reason="CuPy (pip install modeldsl[cuda]) is not installed: no GPU tests")
    try:
        devices = cupy.cuda.runtime.getDeviceCount()
    except Exception:  # noqa: BLE001 - no driver, no device
        devices = 0
    if devices == 0:
        pytest.skip("no CUDA device", allow_module_level=True)


def make_runner() -> Any:
    """The runner of ``MDSL_KERNEL_RUNNER``: the emulator, else :class:`CudaRunner`."""
    if not GPU:
        from emulator import EmulatorRunner

        return EmulatorRunner()
    return CudaRunner()


def rounded(a, dtype: str) -> np.ndarray:
    """The float64 values of ``a`` stored as ``dtype`` (what the kernel reads)."""
    return np.asarray(a).astype(storage(dtype)).astype(np.float64)


def close(got, want, tol: float, what: str, floor: float = 0.0) -> None:
    """Within ``tol`` relative, or ``tol`` times the largest finite |want| (at least ``floor``) absolute."""
    got = np.asarray(got).astype(np.float64)
    want = np.asarray(want).astype(np.float64)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}"
    finite = np.abs(want[np.isfinite(want)])
    scale = max(float(finite.max()) if finite.size else 1.0, floor)
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * max(scale, 1e-30), equal_nan=True, err_msg=what)


def ids(cases) -> list[str]:
    return [str(c).replace(" ", "") for c in cases]


def storage(dtype: str) -> np.dtype:
    return np.dtype(STORAGE[dtype])


class Runner:
    """Device memory and launches (the interface both runners implement)."""

    name = "runner"

    def alloc(self, nbytes: int, fill_byte: int) -> Any: ...  # a device buffer of nbytes, every byte fill_byte

    def upload(self, host: np.ndarray) -> Any: ...

    def download(self, buffer: Any, shape: Sequence[int], dtype: np.dtype) -> np.ndarray: ...

    def address(self, buffer: Any) -> int: ...

    def memset0(self, buffer: Any, nbytes: int) -> None: ...

    def launch(self, launch: cuda.Launch, args: list) -> None: ...  # args: ints (pointers) and numpy scalars

    def sync(self) -> None: ...


@dataclass
class Result:
    outputs: dict[str, np.ndarray]
    plan: cuda.Plan


def run_plan(runner: Runner, name: str, inputs: Sequence[np.ndarray | None], outputs: Sequence[Sequence[int] | None],
             attrs: Mapping[str, Any] | None = None, variant: str = "fp32", index_dtype: str = "int32",
             tables: Mapping[str, Callable[[dict[str, Any]], np.ndarray]] | None = None,
             poison: int = POISON_BYTE, offset: int = 0) -> Result:
    """Run primitive ``name`` on ``inputs`` (host arrays, any float dtype: cast to each buffer's dtype;
    ``None`` for an absent optional one) producing ``outputs`` (shapes; an output named like an input
    is that input, updated in place). ``tables`` build the plan's device tables from the buffer
    addresses (default: the ``tensors`` table of every input). ``offset`` bytes shift every buffer
    whose element size divides it off its 16-byte alignment (an offset that is not a multiple of 16
    makes the kernels take their scalar paths). ``poison`` is the byte every output starts as."""
    prim = cuda.primitive(name)
    shapes_in = [None if a is None else tuple(np.shape(a)) for a in inputs]
    plan = cuda.plan(name, shapes_in, outputs, attrs, variant, index_dtype)
    names_in = [f"{prim.inputs[0]}{i}" for i in range(len(inputs))] if prim.variadic else list(prim.inputs)
    buffers: dict[str, Any] = {}
    shifts: dict[str, int] = {}  # buffer -> its byte offset from an aligned allocation
    keep: list[Any] = []

    def shift(dtype: np.dtype) -> int:
        return offset if offset % dtype.itemsize == 0 else 0

    def device(host: np.ndarray) -> Any:
        at = shift(host.dtype)
        raw = np.zeros(host.nbytes + at, np.uint8)
        raw[at:] = np.ascontiguousarray(host).reshape(-1).view(np.uint8)
        buffer = runner.upload(raw)
        keep.append(buffer)
        return buffer

    sizes: dict[str, tuple[tuple[int, ...], np.dtype]] = {}
    for buffer_name, array in zip(names_in, inputs):
        if array is None:
            continue
        dtype = storage(prim.dtype(prim.inputs[0] if prim.variadic else buffer_name, variant, index_dtype))
        host = np.asarray(array).astype(dtype)
        buffers[f"in:{buffer_name}"] = device(host)
        sizes[f"in:{buffer_name}"] = (host.shape, dtype)
        shifts[f"in:{buffer_name}"] = shift(dtype)
    for buffer_name, shape in zip(prim.outputs, outputs):
        if shape is None:
            continue
        if f"in:{buffer_name}" in buffers:  # updated in place
            for table in (buffers, sizes, shifts):
                table[f"out:{buffer_name}"] = table[f"in:{buffer_name}"]
            continue
        dtype = storage(prim.dtype(buffer_name, variant, index_dtype))
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        buffer = runner.alloc(nbytes + shift(dtype), poison)
        keep.append(buffer)
        buffers[f"out:{buffer_name}"] = buffer
        sizes[f"out:{buffer_name}"] = (tuple(shape), dtype)
        shifts[f"out:{buffer_name}"] = shift(dtype)
    if plan.scratch:
        scratch = runner.alloc(plan.scratch_bytes, POISON_BYTE)
        keep.append(scratch)
        for segment, at in plan.scratch_offsets().items():
            buffers[f"scratch:{segment}"] = (scratch, at)
    addresses = {ref: _address(runner, b, shifts.get(ref, 0)) for ref, b in buffers.items()}
    builders = dict(tables or {})
    for table, kind in plan.tables.items():
        if table in builders:
            host = builders[table](addresses)
        elif kind == "tensors":
            host = cuda.tensor_table([(addresses[f"in:{n}"], int(np.prod(sizes[f"in:{n}"][0], dtype=np.int64)))
                                      for n in names_in])
        else:
            raise ValueError(f"plan needs table '{table}' ({kind}): pass a builder")
        table_buffer = runner.upload(np.frombuffer(host.tobytes(), np.uint8).copy())
        keep.append(table_buffer)
        addresses[f"table:{table}"] = runner.address(table_buffer)
    for step in plan.steps:
        if isinstance(step, cuda.Memset):
            shape, dtype = sizes[step.buffer]
            buffer = buffers[step.buffer]
            runner.memset0(buffer, shifts[step.buffer] + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize)
            continue
        args = []
        for arg in step.args:
            if arg.kind == "ptr":
                args.append(0 if arg.value is None else addresses[arg.value])
            else:
                args.append(SCALARS[arg.kind](arg.value))
        runner.launch(step, args)
    runner.sync()
    result = {}
    for buffer_name in prim.outputs:
        ref = f"out:{buffer_name}"
        if ref not in buffers:
            continue
        shape, dtype = sizes[ref]
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        at = shifts[ref]
        raw = runner.download(buffers[ref], (at + nbytes,), np.dtype(np.uint8))
        result[buffer_name] = raw[at:].view(dtype).reshape(shape)
    return Result(result, plan)


def _address(runner: Runner, buffer: Any, offset: int) -> int:
    if isinstance(buffer, tuple):  # a scratch segment: (the scratch buffer, its offset)
        return runner.address(buffer[0]) + buffer[1]
    return runner.address(buffer) + offset


# ----------------------------------------------------------------------------
# The GPU runner
# ----------------------------------------------------------------------------


def cubin_arch(major: int, minor: int) -> str:
    """The cubin architecture a device of compute capability (major, minor) loads."""
    if (major, minor) == (9, 0):
        return "sm_90a"
    if major == 8:
        return "sm_80"  # sm_80 cubins run on every 8.x device
    return f"sm_{major}{minor}"


class CudaRunner(Runner):
    """CuPy device memory; kernels from the cached cubins, launched with cuda.core (or CuPy's RawModule)."""

    name = "cuda"

    def __init__(self) -> None:
        import cupy

        from modeldsl.tools.build_kernels import cubin_path

        self.cp = cupy
        capability = str(cupy.cuda.Device().compute_capability)  # "90", "86", "100"
        self.arch = cubin_arch(int(capability[:-1]), int(capability[-1]))
        self.cubin_path = cubin_path
        self.kernels: dict[str, Any] = {}
        self.modules: dict[str, Any] = {}
        try:
            try:
                from cuda.core import Device, LaunchConfig, ObjectCode, launch
            except ImportError:
                from cuda.core.experimental import Device, LaunchConfig, ObjectCode, launch
            self.core = (ObjectCode, LaunchConfig, launch)
            self.device = Device()
            self.device.set_current()
            self.stream = self.device.create_stream()
        except ImportError:
            self.core = None

    def alloc(self, nbytes: int, fill_byte: int) -> Any:
        buffer = self.cp.empty(max(nbytes, 1), dtype=self.cp.uint8)
        buffer.fill(fill_byte)
        return buffer

    def upload(self, host: np.ndarray) -> Any:
        return self.cp.asarray(host.view(np.uint8).reshape(-1))

    def download(self, buffer: Any, shape: Sequence[int], dtype: np.dtype) -> np.ndarray:
        self.cp.cuda.Device().synchronize()
        return self.cp.asnumpy(buffer)[: int(np.prod(shape)) * dtype.itemsize].view(dtype).reshape(shape)

    def address(self, buffer: Any) -> int:
        return int(buffer.data.ptr)

    def memset0(self, buffer: Any, nbytes: int) -> None:
        buffer[:nbytes].fill(0)

    def kernel(self, launch: cuda.Launch) -> Any:
        if launch.symbol not in self.kernels:
            family = launch.family
            if family not in self.modules:
                path = self.cubin_path(family, self.arch)
                if self.core is not None:
                    self.modules[family] = self.core[0].from_cubin(path.read_bytes())
                else:
                    self.modules[family] = self.cp.RawModule(path=str(path))
            module = self.modules[family]
            self.kernels[launch.symbol] = (module.get_kernel(launch.symbol) if self.core is not None
                                           else module.get_function(launch.symbol))
        return self.kernels[launch.symbol]

    def launch(self, launch: cuda.Launch, args: list) -> None:
        kernel = self.kernel(launch)
        self.cp.cuda.Device().synchronize()  # CuPy's work (uploads, fills) runs on its own stream
        if self.core is not None:
            _, LaunchConfig, launch_fn = self.core
            config = LaunchConfig(grid=launch.grid, block=launch.block, shmem_size=launch.shared)
            launch_fn(self.stream, config, kernel, *args)
            self.stream.sync()
        else:
            values = tuple(np.uint64(a) if isinstance(a, int) else a for a in args)  # pointers: 8 bytes
            kernel(launch.grid, launch.block, values, shared_mem=launch.shared)
            self.cp.cuda.Device().synchronize()

    def sync(self) -> None:
        self.cp.cuda.Device().synchronize()
