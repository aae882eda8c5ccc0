"""Devices for the CUDA executor: device memory, copies, and the work of the executor's commands.

:class:`Device` is what :class:`modeldsl.runtime.cuda_executor.CudaExecutor` needs of a machine:
memory addressed by integer device pointers (allocate, free, host<->device copies, memset,
device copy, strided copy), running its commands (a kernel launch with its ``kernels/cuda.py``
plan, a GEMM, attention forward and backward, a reference fallback on host copies), and CUDA
graphs (begin and end a capture, replay). Two implementations:

- :class:`EmulatedDevice`: the CPU. Memory is numpy byte arrays at integer "device pointers"
  (with unmapped gaps between allocations, so a wrong address fails loudly). A launch command
  runs as a whole through the primitive's numpy reference on views decoded from the command's
  pointers (its plan's pointer arguments are checked to lie inside allocated memory, scratch
  segments and tables included), a GEMM through the reference matmul, attention through the
  reference ``flash_attention`` (and its backward). A graph capture records the work, a replay
  runs it. This checks on any machine everything the executor computes: addresses, aliases,
  layer slices, in-place launches, ordering, scratch sizing and the fallbacks.
- :class:`CudaDevice`: an NVIDIA GPU. Kernels from the cubins of
  :func:`modeldsl.tools.build_kernels.cubin_path`, loaded and launched with ``cuda.core``
  (``ObjectCode.from_cubin``, ``get_kernel``, ``launch``; the strided-copy kernel is compiled
  with ``Program``); memory, copies and graphs (stream capture) through the driver API of
  ``cuda.bindings``; GEMMs through nvmath-python's cuBLASLt bindings (one planned descriptor
  set per GEMM command, D written in place into C, one shared workspace); attention through
  the cuDNN frontend's SDPA graphs (one built per attention command), or where cuDNN cannot
  (fp32) through the plain CUDA attention kernel of ``kernels/cuda.py``. Every GPU package is
  imported lazily, inside the class, so this module imports where none is installed.

Both count allocations (``allocations``, ``allocated_bytes``, ``peak_bytes``) and graph
``captures`` and ``replays``. What a device cannot run (attention neither cuDNN nor the plain
kernel covers, a GEMM cuBLASLt finds no algorithm for) raises
:class:`modeldsl.kernels.cuda.NotCovered` from :meth:`Device.prepare`, and the executor runs
that command through :meth:`Device.fallback` instead.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from modeldsl.diagnostics import Diagnostic
from modeldsl.kernels import cuda as cuda_kernels
from modeldsl.kernels.cuda import NotCovered
from modeldsl.runtime.executor import ExecutionError
from modeldsl.runtime.fits import available_bytes

if TYPE_CHECKING:  # the commands (cuda_commands) run on the devices: they import this module
    from modeldsl.runtime.cuda_commands import (
        AttentionBackwardCommand,
        AttentionCommand,
        BoundLaunch,
        Command,
        GemmCommand,
        KernelCommand,
        StridedCopyCommand,
        TensorRef,
    )

ALIGNMENT = 256  # bytes: every allocation starts on it (as cuMemAlloc's do)
EMULATED_BASE = 1 << 24  # the first emulated device pointer
EMULATED_GUARD = 1 << 16  # unmapped bytes after every emulated allocation
MAX_COPY_RANK = 6  # dims of the strided-copy kernel
GEMM_WORKSPACE = 32 << 20  # bytes of the cuBLASLt workspace all GEMMs of a device share


class DeviceError(RuntimeError):
    """A device operation failed (an address outside device memory, a CUDA error)."""


class KernelUnavailable(ExecutionError):
    """E043: the kernel a ``@kernel`` chose cannot run a command, and nothing else may (the choice
    is binding: ``fallback = false``), or its ``workspace`` is smaller than the kernel needs."""

    code = "E043"

    def diagnostic(self) -> Diagnostic:
        return Diagnostic(self.code, str(self), None,
                          "allow another kernel with fallback=true, or choose one that runs here")


class Device(Protocol):
    """What the CUDA executor needs of a device."""

    name: str
    supports_graphs: bool
    allocations: int  # calls of allocate
    allocated_bytes: int  # bytes held now
    peak_bytes: int  # the most bytes held at once
    captures: int
    replays: int

    def allocate(self, nbytes: int) -> int: ...  # a device pointer, ALIGNMENT-aligned

    def free_bytes(self) -> int: ...  # device memory that can still be allocated

    def free(self, address: int) -> None: ...

    def upload(self, address: int, data: np.ndarray) -> None: ...  # the bytes of a host array

    def download(self, address: int, nbytes: int) -> np.ndarray: ...  # a uint8 host copy

    def memset(self, address: int, nbytes: int, pattern: bytes) -> None: ...  # pattern: 1, 2 or 4 bytes

    def copy(self, dst: int, src: int, nbytes: int) -> None: ...

    def strided_copy(self, command: StridedCopyCommand) -> None: ...

    def prepare(self, command: Command) -> None: ...  # once per command; NotCovered: run it as a fallback

    def run_kernel(self, command: KernelCommand) -> None: ...

    def launch(self, step: BoundLaunch) -> None: ...

    def gemm(self, command: GemmCommand) -> None: ...

    def attention(self, command: AttentionCommand) -> None: ...

    def attention_backward(self, command: AttentionBackwardCommand) -> None: ...

    def fallback(self, command: Command) -> None: ...

    def synchronize(self) -> None: ...

    def begin_capture(self) -> None: ...

    def end_capture(self) -> Any: ...

    def replay(self, graph: Any) -> None: ...


def aligned(nbytes: int, alignment: int = ALIGNMENT) -> int:
    return -(-nbytes // alignment) * alignment


def fill_pattern(value: float, dtype: np.dtype) -> bytes:
    """The shortest byte pattern (1, 2 or 4 bytes) whose repetition is ``value`` stored as ``dtype``
    (as ``ndarray.fill`` stores it); NotCovered when there is none (an 8-byte value whose halves differ)."""
    cell = np.empty((), dtype=dtype)
    cell.fill(value)
    raw = cell.tobytes()
    for width in (1, 2, 4):
        if len(raw) % width == 0 and raw == raw[:width] * (len(raw) // width):
            return raw[:width]
    raise NotCovered(f"no 1-, 2- or 4-byte memset pattern for {value} as {np.dtype(dtype).name}")


def ref_views(refs: Sequence[TensorRef | None], raw: Callable[[TensorRef], np.ndarray]) -> list[np.ndarray | None]:
    """Typed numpy views of ``refs`` over the bytes ``raw`` gives; one view object per distinct
    (address, shape, dtype), so a kernel that updates a buffer in place sees one array."""
    made: dict[tuple, np.ndarray] = {}
    views: list[np.ndarray | None] = []
    for ref in refs:
        if ref is None:
            views.append(None)
            continue
        key = (ref.address, ref.shape, ref.dtype)
        if key not in made:
            made[key] = raw(ref).view(ref.dtype).reshape(ref.shape)
        views.append(made[key])
    return views


class DeviceBase:
    """Allocation bookkeeping and the reference fallback on host copies, shared by both devices."""

    name = "device"
    supports_graphs = True

    def __init__(self) -> None:
        self.allocations = 0
        self.allocated_bytes = 0
        self.peak_bytes = 0
        self.captures = 0
        self.replays = 0
        self.capturing = False
        self._sizes: dict[int, int] = {}  # base -> bytes, every live allocation
        self._bases: list[int] = []

    # ------------------------------------------------------------------ bookkeeping
    def _track(self, base: int, nbytes: int) -> None:
        self.allocations += 1
        self._sizes[base] = nbytes
        bisect.insort(self._bases, base)
        self.allocated_bytes += nbytes
        self.peak_bytes = max(self.peak_bytes, self.allocated_bytes)

    def _untrack(self, base: int) -> None:
        self.allocated_bytes -= self._sizes.pop(base)
        self._bases.remove(base)

    def allocation_of(self, address: int, nbytes: int = 0) -> tuple[int, int]:
        """(base, size) of the allocation holding ``[address, address + nbytes)``; DeviceError otherwise."""
        at = bisect.bisect_right(self._bases, address) - 1
        if at >= 0:
            base = self._bases[at]
            if address + nbytes <= base + self._sizes[base]:
                return base, self._sizes[base]
        raise DeviceError(f"[{address:#x}, {address + nbytes:#x}) lies in no allocation of the {self.name} device")

    def _not_capturing(self, what: str) -> None:
        if self.capturing:
            raise DeviceError(f"{what} cannot be part of a CUDA graph")

    # ------------------------------------------------------------------ the reference on host copies
    def fallback(self, command: Command) -> None:
        """Run ``command`` through its numpy reference on host copies of its buffers: the bytes each
        allocation holds for them are downloaded once (so aliased buffers stay aliased), the
        reference runs on views of those copies, and what it writes is uploaded back."""
        self._not_capturing(f"the reference fallback of {command.label}")
        spans: dict[int, list[int]] = {}
        for ref in command.refs:
            if ref is not None and ref.nbytes:
                span = spans.setdefault(self.allocation_of(ref.address, ref.nbytes)[0], [ref.address, ref.address])
                span[0], span[1] = min(span[0], ref.address), max(span[1], ref.address + ref.nbytes)
        copies = {base: (start, self.download(start, end - start)) for base, (start, end) in spans.items()}

        def host_bytes(ref: TensorRef) -> np.ndarray:
            if not ref.nbytes:
                return np.zeros(0, dtype=np.uint8)
            start, data = copies[self.allocation_of(ref.address, ref.nbytes)[0]]
            return data[ref.address - start:ref.address - start + ref.nbytes]

        command.compute(ref_views(command.refs, host_bytes))
        for ref in command.written:
            if ref is not None and ref.nbytes:
                self.upload(ref.address, host_bytes(ref))


# ----------------------------------------------------------------------------
# The emulated device (CPU, numpy)
# ----------------------------------------------------------------------------


@dataclass(frozen=True)
class EmulatedGraph:
    """A captured sequence of device work."""

    work: tuple[Callable[[], None], ...]


class EmulatedDevice(DeviceBase):
    """Device memory as numpy byte arrays; launches, GEMMs and attention through the numpy references."""

    name = "emulated"

    def __init__(self) -> None:
        super().__init__()
        self._memory: dict[int, np.ndarray] = {}
        self._next = EMULATED_BASE
        self._recording: list[Callable[[], None]] | None = None
        self.checked_launches = 0  # plan launches whose pointer arguments were checked

    # ------------------------------------------------------------------ memory
    def allocate(self, nbytes: int) -> int:
        self._not_capturing("an allocation")
        base = self._next
        self._next += aligned(max(nbytes, 1)) + EMULATED_GUARD
        self._memory[base] = np.zeros(nbytes, dtype=np.uint8)
        self._track(base, nbytes)
        return base

    def free(self, address: int) -> None:
        self._untrack(address)
        del self._memory[address]

    def free_bytes(self) -> int:
        return available_bytes()  # emulated device memory is host memory

    def raw(self, address: int, nbytes: int) -> np.ndarray:
        """The bytes ``[address, address + nbytes)`` as a writable uint8 view."""
        base, _ = self.allocation_of(address, nbytes)
        return self._memory[base][address - base:address - base + nbytes]

    def view(self, ref: TensorRef) -> np.ndarray:
        return self.raw(ref.address, ref.nbytes).view(ref.dtype).reshape(ref.shape)

    def upload(self, address: int, data: np.ndarray) -> None:
        self._not_capturing("a host-to-device copy")
        source = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        self.raw(address, source.nbytes)[:] = source

    def download(self, address: int, nbytes: int) -> np.ndarray:
        self._not_capturing("a device-to-host copy")
        return self.raw(address, nbytes).copy()

    def memset(self, address: int, nbytes: int, pattern: bytes) -> None:
        word = np.frombuffer(pattern, dtype={1: np.uint8, 2: np.uint16, 4: np.uint32}[len(pattern)])[0]
        target = self.raw(address, nbytes).view(word.dtype)
        self._submit(lambda: target.fill(word))

    def copy(self, dst: int, src: int, nbytes: int) -> None:
        target, source = self.raw(dst, nbytes), self.raw(src, nbytes)
        self._submit(lambda: np.copyto(target, source))

    def strided(self, address: int, shape: Sequence[int], strides: Sequence[int], itemsize: int) -> np.ndarray:
        """The elements at ``address + sum(i_k * strides_k) * itemsize`` as a [*shape, itemsize] byte view
        (every byte of it checked to lie in one allocation)."""
        if any(s < 0 for s in strides):
            raise DeviceError(f"negative strides {tuple(strides)}")
        extent = (itemsize + sum((n - 1) * s for n, s in zip(shape, strides)) * itemsize) if all(shape) else 0
        flat = self.raw(address, extent)
        return np.lib.stride_tricks.as_strided(flat, shape=(*shape, itemsize),
                                               strides=(*(s * itemsize for s in strides), 1))

    def strided_copy(self, command: StridedCopyCommand) -> None:
        source = self.strided(command.src, command.shape, command.src_strides, command.itemsize)
        target = self.strided(command.dst, command.shape, command.dst_strides, command.itemsize)
        self._submit(lambda: np.copyto(target, source))

    # ------------------------------------------------------------------ work
    def prepare(self, command: Command) -> None:
        """Check that every pointer a launch plan passes covers allocated memory: the bytes of its
        input or output buffer, its scratch segment, its table."""
        for step in command.plan_steps():
            for address, nbytes in step.extents:
                if address:
                    self.raw(address, nbytes)
            self.checked_launches += hasattr(step, "launch")

    def _compute(self, command: Command) -> None:
        self._submit(lambda: command.compute(ref_views(command.refs, self._ref_bytes)))

    def _ref_bytes(self, ref: TensorRef) -> np.ndarray:
        return self.raw(ref.address, ref.nbytes)

    def run_kernel(self, command: KernelCommand) -> None:
        self._compute(command)

    def launch(self, step: BoundLaunch) -> None:
        raise DeviceError(f"the emulated device runs whole launch commands, not the kernel {step.launch.symbol}")

    def gemm(self, command: GemmCommand) -> None:
        self._compute(command)

    def attention(self, command: AttentionCommand) -> None:
        self._compute(command)

    def attention_backward(self, command: AttentionBackwardCommand) -> None:
        self._compute(command)

    def synchronize(self) -> None:
        pass

    # ------------------------------------------------------------------ graphs
    def _submit(self, work: Callable[[], None]) -> None:
        if self._recording is not None:
            self._recording.append(work)
        else:
            work()

    def begin_capture(self) -> None:
        self._recording, self.capturing = [], True

    def end_capture(self) -> EmulatedGraph:
        graph = EmulatedGraph(tuple(self._recording or ()))
        self._recording, self.capturing = None, False
        self.captures += 1
        return graph

    def replay(self, graph: EmulatedGraph) -> None:
        for work in graph.work:
            work()
        self.replays += 1


# ----------------------------------------------------------------------------
# The CUDA device
# ----------------------------------------------------------------------------


def cubin_arch(major: int, minor: int) -> str:
    """The cubin architecture a device of compute capability (major, minor) loads (sm_80 cubins run
    on every 8.x device; sm_90a needs exactly 9.0)."""
    if (major, minor) == (9, 0):
        return "sm_90a"
    if major == 8:
        return "sm_80"
    return f"sm_{major}{minor}"


def import_core() -> Any:
    """``cuda.core`` (1.x), else the older ``cuda.core.experimental`` (0.x)."""
    from cuda import core

    if hasattr(core, "Device") and hasattr(core, "launch"):
        return core
    from cuda.core import experimental

    return experimental


# Element copy between two strided layouts (the executor's transposes, concatenations, splits):
# element i of the row-major index space of shape[0..rank) moves from src + sum(i_k * ss_k) to
# dst + sum(i_k * ds_k) (strides in elements). One kernel per element size.
STRIDED_COPY_SOURCE = r"""
template <typename T>
__device__ void strided_copy(const T* __restrict__ src, T* __restrict__ dst, long long n, int rank,
                             const long long* shape, const long long* ss, const long long* ds) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x) {
    long long rest = i, from = 0, to = 0;
    for (int k = rank - 1; k >= 0; --k) {
      long long c = rest % shape[k];
      rest /= shape[k];
      from += c * ss[k];
      to += c * ds[k];
    }
    dst[to] = src[from];
  }
}
#define MDSL_COPY(NAME, T)                                                                          \
  extern "C" __global__ void NAME(const T* src, T* dst, long long n, int rank,                      \
      long long n0, long long n1, long long n2, long long n3, long long n4, long long n5,            \
      long long s0, long long s1, long long s2, long long s3, long long s4, long long s5,            \
      long long d0, long long d1, long long d2, long long d3, long long d4, long long d5) {           \
    const long long shape[6] = {n0, n1, n2, n3, n4, n5};                                            \
    const long long ss[6] = {s0, s1, s2, s3, s4, s5};                                               \
    const long long ds[6] = {d0, d1, d2, d3, d4, d5};                                               \
    strided_copy<T>(src, dst, n, rank, shape, ss, ds);                                              \
  }
MDSL_COPY(mdsl_strided_copy_1, unsigned char)
MDSL_COPY(mdsl_strided_copy_2, unsigned short)
MDSL_COPY(mdsl_strided_copy_4, unsigned int)
MDSL_COPY(mdsl_strided_copy_8, unsigned long long)
"""

# The widening of a GEMM's fp8 B (mdsl.sched.gemm's scale): cast.cu's dequantize kernel, in the
# variant of B's and the GEMM's dtypes, into the device's one widening buffer.
WIDEN_VARIANTS = {("float8_e4m3fn", "float32"): "e4m3_to_f32", ("float8_e4m3fn", "bfloat16"): "e4m3_to_bf16",
                  ("float8_e5m2", "float32"): "e5m2_to_f32", ("float8_e5m2", "bfloat16"): "e5m2_to_bf16"}


def sdpa_workspace(command: AttentionCommand, needed: int) -> int:
    """The bytes of cuDNN workspace an attention command gets: ``needed``, or the size its
    ``@kernel(workspace=)`` gives when that is enough (KernelUnavailable, E043, when it is not)."""
    given = command.choice.workspace if command.choice is not None else None
    if given is None:
        return needed
    if given < needed:
        raise KernelUnavailable(f"{command.label}: @kernel(workspace={given}) is less than the {needed} bytes "
                                "cuDNN's SDPA needs")
    return given


@dataclass
class CudaGraph:
    """A captured, instantiated CUDA graph."""

    graph: Any
    executable: Any


@dataclass
class GemmPlan:
    """What one cuBLASLt matmul call needs, made once per GEMM command (kept alive with it)."""

    desc: int
    layouts: tuple[int, int, int]  # A', B', C (= D) layouts, column-major
    operands: tuple[int, int]  # device pointers of A' and B'
    heuristic: Any  # cublasLtMatmulHeuristicResult_t; its algo sits at offset 0
    scalars: np.ndarray = field(default_factory=lambda: np.zeros(2, np.float32))  # alpha, beta (host)


class CudaDevice(DeviceBase):
    """An NVIDIA GPU: cubin kernels through cuda.core, memory and graphs through the driver API,
    GEMMs through cuBLASLt (nvmath-python's bindings), attention through the cuDNN frontend."""

    name = "cuda"

    def __init__(self, device_id: int = 0, attention: str = "cudnn"):
        """``attention``: "cudnn" (cuDNN's SDPA, else the plain CUDA attention kernel of
        kernels/cuda.py) or "kernel" (always the plain kernel)."""
        super().__init__()
        if attention not in ("cudnn", "kernel"):
            raise ValueError(f"attention '{attention}' (choose cudnn or kernel)")
        from cuda.bindings import driver

        from modeldsl.tools.build_kernels import cubin_path

        self._driver = driver
        self._core = import_core()
        self._cubin_path = cubin_path
        self._device = self._core.Device(device_id)
        self._device.set_current()
        self._stream = self._device.create_stream()
        self.stream_handle = int(self._stream.handle)
        major, minor = (int(v) for v in self._device.compute_capability)
        self.compute_capability = (major, minor)
        self.arch = cubin_arch(major, minor)
        self._modules: dict[str, Any] = {}
        self._kernels: dict[str, Any] = {}
        self._copy_kernels: dict[int, Any] = {}
        self._gemms: dict[int, GemmPlan] = {}  # id(command) -> its cuBLASLt plan
        self.attention_backend = attention
        self._sdpa: dict[int, tuple[Any, dict, int]] = {}  # id(command) -> (cuDNN graph, variant pack, workspace)
        self._attention_kernels: dict[int, KernelCommand] = {}  # id(command) -> its plain kernel launch
        self._cublaslt: Any = None  # (bindings module, handle, workspace pointer)
        self._widenings: dict[int, Any] = {}  # id(command) -> the dequantize launch widening its B
        self._widened: tuple[int, int] = (0, 0)  # (address, bytes) of the one buffer scaled GEMMs widen B into
        self._cudnn_handle: Any = None

    @staticmethod
    def unavailable() -> str | None:
        """Why no CudaDevice can be made here (None: one can)."""
        try:
            from cuda.bindings import driver

            import_core()
        except ImportError as err:
            return f"cuda-python is not installed ({err})"
        try:
            (err,) = driver.cuInit(0)
            count = driver.cuDeviceGetCount()[1] if err == driver.CUresult.CUDA_SUCCESS else 0
        except Exception as err:  # noqa: BLE001 - no driver library at all
            return f"no CUDA driver ({err})"
        return None if count else "no CUDA device"

    # ------------------------------------------------------------------ driver calls
    def _call(self, name: str, *args: Any) -> Any:
        result = getattr(self._driver, name)(*args)
        err, rest = (result[0], result[1:]) if isinstance(result, tuple) else (result, ())
        if err != self._driver.CUresult.CUDA_SUCCESS:
            raise DeviceError(f"{name} failed: {err}")
        return rest[0] if len(rest) == 1 else rest

    # ------------------------------------------------------------------ memory
    def allocate(self, nbytes: int) -> int:
        self._not_capturing("an allocation")
        base = int(self._call("cuMemAlloc", max(nbytes, 1)))
        self._track(base, nbytes)
        return base

    def free(self, address: int) -> None:
        self._untrack(address)
        self._call("cuMemFree", address)

    def free_bytes(self) -> int:
        free, _total = self._call("cuMemGetInfo")
        return int(free)

    def upload(self, address: int, data: np.ndarray) -> None:
        self._not_capturing("a host-to-device copy")
        host = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        self.allocation_of(address, host.nbytes)
        if host.nbytes:
            self._call("cuMemcpyHtoDAsync", address, host.ctypes.data, host.nbytes, self.stream_handle)
            self.synchronize()  # the host array may go away

    def download(self, address: int, nbytes: int) -> np.ndarray:
        self._not_capturing("a device-to-host copy")
        self.allocation_of(address, nbytes)
        host = np.empty(nbytes, dtype=np.uint8)
        if nbytes:
            self._call("cuMemcpyDtoHAsync", host.ctypes.data, address, nbytes, self.stream_handle)
            self.synchronize()
        return host

    def memset(self, address: int, nbytes: int, pattern: bytes) -> None:
        width = len(pattern)
        if nbytes % width:
            raise DeviceError(f"a memset of {nbytes} bytes with a {width}-byte pattern")
        if nbytes:
            name = {1: "cuMemsetD8Async", 2: "cuMemsetD16Async", 4: "cuMemsetD32Async"}[width]
            self._call(name, address, int.from_bytes(pattern, "little"), nbytes // width, self.stream_handle)

    def copy(self, dst: int, src: int, nbytes: int) -> None:
        if nbytes:
            self._call("cuMemcpyDtoDAsync", dst, src, nbytes, self.stream_handle)

    def strided_copy(self, command: StridedCopyCommand) -> None:
        rank, pad = len(command.shape), MAX_COPY_RANK - len(command.shape)
        n = math.prod(command.shape)
        config = self._core.LaunchConfig(grid=(max(1, min(-(-n // 256), 65535)), 1, 1), block=(256, 1, 1))
        scalars = (*command.shape, *(1,) * pad, *command.src_strides, *(0,) * pad, *command.dst_strides, *(0,) * pad)
        self._core.launch(self._stream, config, self._copy_kernel(command.itemsize), np.uint64(command.src),
                          np.uint64(command.dst), np.int64(n), np.int32(rank), *(np.int64(v) for v in scalars))

    def _copy_kernel(self, itemsize: int) -> Any:
        if itemsize not in self._copy_kernels:
            major, minor = self.compute_capability
            options = self._core.ProgramOptions(arch=f"sm_{major}{minor}", std="c++17")
            code = self._core.Program(STRIDED_COPY_SOURCE, "c++", options).compile("cubin")
            self._copy_kernels[itemsize] = code.get_kernel(f"mdsl_strided_copy_{itemsize}")
        return self._copy_kernels[itemsize]

    # ------------------------------------------------------------------ kernels
    def _kernel(self, family: str, symbol: str) -> Any:
        if symbol not in self._kernels:
            if family not in self._modules:
                path = self._cubin_path(family, self.arch)
                self._modules[family] = self._core.ObjectCode.from_cubin(path.read_bytes())
            self._kernels[symbol] = self._modules[family].get_kernel(symbol)
        return self._kernels[symbol]

    def launch(self, step: BoundLaunch) -> None:
        launch = step.launch
        # cuda.core 0.3.2 does not raise a kernel's dynamic shared memory limit: a plan asking for more
        # than 48 KiB would need cuKernelSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES) first (none does now)
        config = self._core.LaunchConfig(grid=launch.grid, block=launch.block, shmem_size=launch.shared)
        self._core.launch(self._stream, config, self._kernel(launch.family, launch.symbol), *step.args)

    def run_kernel(self, command: KernelCommand) -> None:
        for step in command.steps:
            if hasattr(step, "launch"):
                self.launch(step)
            else:
                self.memset(step.address, step.nbytes, b"\0")

    # ------------------------------------------------------------------ preparing commands
    def prepare(self, command: Command) -> None:
        """Load a launch's kernels, plan a GEMM, build an attention graph, compile the copy kernel
        (each part of a composite): all a command needs, before any capture. NotCovered when it
        cannot run here."""
        kind = type(command).__name__
        if kind == "KernelCommand":
            for step in command.launches:
                self._kernel(step.launch.family, step.launch.symbol)
        elif kind == "GemmCommand":
            self._gemms[id(command)] = self._plan_gemm(command)
        elif kind in ("AttentionCommand", "AttentionBackwardCommand"):
            self._prepare_attention(command)
        elif kind == "StridedCopyCommand":
            self._copy_kernel(command.itemsize)
        elif kind == "CompositeCommand":
            command.plan_steps()  # NotCovered when a part cannot run here
            for part in command.parts:
                self.prepare(part)

    # ------------------------------------------------------------------ GEMMs (cuBLASLt)
    def _lt(self) -> tuple[Any, int, int]:
        """nvmath's cuBLASLt bindings, a handle and the shared workspace (made on first use)."""
        if self._cublaslt is None:
            try:
                from nvmath.bindings import cublasLt
            except ImportError as err:
                raise NotCovered(f"nvmath-python (cuBLASLt) is not installed ({err})") from None
            try:  # nvmath loads libcublasLt lazily: a missing library fails here (NotSupportedError)
                handle = cublasLt.create()
            except Exception as err:  # noqa: BLE001
                raise NotCovered(f"cuBLASLt cannot be loaded ({type(err).__name__}: {err})") from None
            self._cublaslt = (cublasLt, handle, self.allocate(GEMM_WORKSPACE))
        return self._cublaslt

    def _plan_gemm(self, command: GemmCommand) -> GemmPlan:
        """cuBLASLt is column-major: row-major ``C = op(A) op(B)`` is column-major
        ``C^T = op(B)^T op(A)^T``, so B's memory is cuBLASLt's A and A's memory its B."""
        if command.scale_b is not None:
            return self._plan_scaled_gemm(command)
        lt, handle, _ = self._lt()
        problem = gemm_problem(command)
        desc = lt.matmul_desc_create(COMPUTE_32F, cuda_type("float32"))
        attribute = lt.MatmulDescAttribute
        set_attribute(lt, "matmul_desc", desc, attribute.TRANSA, OPERATIONS[command.transb])
        set_attribute(lt, "matmul_desc", desc, attribute.TRANSB, OPERATIONS[command.transa])
        self._set_epilogue(lt, desc, command)
        layouts = tuple(self._layout(lt, *spec) for spec in problem.layouts)
        preference = lt.matmul_preference_create()
        set_attribute(lt, "matmul_preference", preference, lt.MatmulPreferenceAttribute.MAX_WORKSPACE_BYTES,
                      GEMM_WORKSPACE)
        heuristic = lt.MatmulHeuristicResult(1)
        found = np.zeros(1, dtype=np.int32)
        try:  # no algorithm is CUBLAS_STATUS_NOT_SUPPORTED, which nvmath raises as cuBLASLtError
            lt.matmul_algo_get_heuristic(handle, desc, *layouts, layouts[2], preference, 1, heuristic.ptr,
                                         found.ctypes.data)
        except lt.cuBLASLtError as err:
            found[0] = 0
            reason = f": {err}"
        else:
            reason = ""
        finally:
            lt.matmul_preference_destroy(preference)
        if not found[0]:
            raise NotCovered(f"cuBLASLt has no algorithm for {command.label}{reason}")
        plan = GemmPlan(desc, layouts, (command.b.address, command.a.address), heuristic)
        plan.scalars[:] = (command.alpha, command.beta)
        return plan

    def _layout(self, lt: Any, dtype: str, rows: int, cols: int, ld: int, batch: int, stride: int) -> int:
        layout = lt.matrix_layout_create(cuda_type(dtype), rows, cols, ld)
        if batch > 1:
            set_attribute(lt, "matrix_layout", layout, lt.MatrixLayoutAttribute.BATCH_COUNT, batch)
            set_attribute(lt, "matrix_layout", layout, lt.MatrixLayoutAttribute.STRIDED_BATCH_OFFSET, stride)
        return layout

    def _set_epilogue(self, lt: Any, desc: int, command: GemmCommand) -> None:
        if command.epilogue == "none":
            return
        attribute = lt.MatmulDescAttribute
        epilogue = getattr(lt.Epilogue, CUBLASLT_EPILOGUES[command.epilogue])
        set_attribute(lt, "matmul_desc", desc, attribute.EPILOGUE, epilogue)
        if command.bias is not None:
            set_attribute(lt, "matmul_desc", desc, attribute.BIAS_POINTER, command.bias.address)
            bias_type = cuda_type(np.dtype(command.bias.dtype).name)
            set_attribute(lt, "matmul_desc", desc, attribute.BIAS_DATA_TYPE, bias_type)
        if command.aux is not None:
            set_attribute(lt, "matmul_desc", desc, attribute.EPILOGUE_AUX_POINTER, command.aux.address)
            set_attribute(lt, "matmul_desc", desc, attribute.EPILOGUE_AUX_LD, command.c.shape[-1])
            rows = math.prod(command.c.shape[-2:])
            set_attribute(lt, "matmul_desc", desc, attribute.EPILOGUE_AUX_BATCH_STRIDE, rows)

    # a GEMM of an fp8 B with a scale per row: B widened by the dequantize kernel into the device's
    # one widening buffer (the largest such B of the programs), then cuBLASLt's GEMM of it
    def _plan_scaled_gemm(self, command: GemmCommand) -> GemmPlan:
        a, q = command.a, command.b
        dtype = np.dtype(a.dtype)
        variant = WIDEN_VARIANTS.get((np.dtype(q.dtype).name, dtype.name))
        if variant is None:
            raise NotCovered(f"widening {np.dtype(q.dtype).name} into {dtype.name}")
        (launch,) = cuda_kernels.plan("dequantize", [q.shape, command.scale_b.shape], [q.shape], {}, variant).steps
        self._kernel(launch.family, launch.symbol)
        address = self._widening_buffer(q.numel * dtype.itemsize)
        plan = self._plan_gemm(replace(command, b=replace(q, address=address, dtype=dtype), scale_b=None))
        self._widenings[id(command)] = launch
        return plan

    def _widening_buffer(self, nbytes: int) -> int:
        """The widening buffer, grown to ``nbytes`` where it is smaller (the GEMMs planned on the old
        one read the new one)."""
        address, held = self._widened
        if nbytes <= held:
            return address
        new = self.allocate(nbytes)
        for key in self._widenings:
            plan = self._gemms[key]
            plan.operands = (new, plan.operands[1])
        if held:
            self.free(address)
        self._widened = (new, nbytes)
        return new

    def _widen(self, command: GemmCommand) -> None:
        launch, q = self._widenings[id(command)], command.b
        config = self._core.LaunchConfig(grid=launch.grid, block=launch.block, shmem_size=launch.shared)
        self._core.launch(self._stream, config, self._kernel(launch.family, launch.symbol), np.uint64(q.address),
                          np.uint64(command.scale_b.address), np.uint64(self._widened[0]), np.int64(q.numel),
                          np.int64(q.shape[-1]))

    def gemm(self, command: GemmCommand) -> None:
        lt, handle, workspace = self._lt()
        plan = self._gemms[id(command)]
        if command.scale_b is not None:
            self._widen(command)
        a_layout, b_layout, c_layout = plan.layouts
        alpha, beta = plan.scalars.ctypes.data, plan.scalars.ctypes.data + 4
        lt.matmul(handle, plan.desc, alpha, plan.operands[0], a_layout, plan.operands[1], b_layout, beta,
                  command.c.address, c_layout, command.c.address, c_layout, plan.heuristic.ptr, workspace,
                  GEMM_WORKSPACE, self.stream_handle)

    # ------------------------------------------------------------------ attention (cuDNN frontend SDPA)
    def _cudnn(self) -> Any:
        try:
            import cudnn
        except (ImportError, OSError) as err:  # OSError: the frontend dlopens libcudnn at import
            raise NotCovered(f"the cuDNN frontend or libcudnn is not installed ({err})") from None
        if self._cudnn_handle is None:
            try:
                self._cudnn_handle = cudnn.create_handle()
            except Exception as err:  # noqa: BLE001 - e.g. a libcudnn too old for the frontend
                raise NotCovered(f"no cuDNN handle ({type(err).__name__}: {err})") from None
            cudnn.set_stream(handle=self._cudnn_handle, stream=self.stream_handle)
        return cudnn

    def _build_sdpa(self, command: AttentionCommand | AttentionBackwardCommand) -> tuple[Any, dict, int]:
        """cuDNN's SDPA graph of an attention command, its variant pack and its workspace (the size
        cuDNN asks for, or a ``@kernel(workspace=)`` at least that large: E043 where it is smaller)."""
        io = np.dtype(command.q.dtype).name
        if io not in ("bfloat16", "float16"):
            raise NotCovered(f"attention in {io}: cuDNN's SDPA takes bf16 or fp16")
        if command.softcap:
            raise NotCovered(f"attention softcap {command.softcap}: not built into the cuDNN SDPA graph")
        cudnn = self._cudnn()
        io_type = cudnn.data_type.BFLOAT16 if io == "bfloat16" else cudnn.data_type.HALF
        graph = cudnn.pygraph(io_data_type=io_type, intermediate_data_type=cudnn.data_type.FLOAT,
                              compute_data_type=cudnn.data_type.FLOAT, handle=self._cudnn_handle)
        try:
            tensors = sdpa_tensors(graph, cudnn, command, io_type)
            graph.validate()
            graph.build_operation_graph()
            graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
            graph.check_support()
            graph.build_plans()
        except Exception as err:  # noqa: BLE001 - cuDNN says why it cannot (cudnnGraphNotSupportedError, ...)
            raise NotCovered(f"cuDNN cannot run {command.label}: {err}") from None
        # the frontend's execute takes a pointer only as an exact Python int (numpy ints go through dlpack)
        pack = {tensor: int(getattr(command, name).address) for name, tensor in tensors.items()}
        workspace = self.allocate(max(1, sdpa_workspace(command, int(graph.get_workspace_size()))))
        return graph, pack, workspace

    def _prepare_attention(self, command: AttentionCommand) -> None:
        """cuDNN's SDPA where it runs the command (and is asked for), else the plain CUDA kernel.
        A ``@kernel`` choice overrides the device's ``attention`` setting: ``cudnn_sdpa`` asks for
        cuDNN, ``flash_attention`` for the plain kernel only; a binding ``cudnn_sdpa`` (``fallback =
        false``) that cuDNN cannot run is NotCovered, which the executor makes E043."""
        reasons = []
        chosen = command.choice.name if command.choice is not None else None
        if chosen == "cudnn_sdpa" or (chosen is None and self.attention_backend == "cudnn"):
            try:
                self._sdpa[id(command)] = self._build_sdpa(command)
                return
            except NotCovered as err:
                if command.binding:
                    raise
                reasons.append(str(err))
        kernel = command.kernel
        if kernel is not None and kernel.plan is not None:
            self.prepare(kernel)
            self._attention_kernels[id(command)] = kernel
            return
        reasons.append(kernel.fallback if kernel is not None else "no attention kernel")
        raise NotCovered("; ".join(reasons))

    def attention(self, command: AttentionCommand) -> None:
        kernel = self._attention_kernels.get(id(command))
        if kernel is not None:
            self.run_kernel(kernel)
            return
        graph, pack, workspace = self._sdpa[id(command)]
        graph.execute(pack, workspace, handle=self._cudnn_handle)

    def attention_backward(self, command: AttentionBackwardCommand) -> None:
        self.attention(command)

    # ------------------------------------------------------------------ streams and graphs
    def synchronize(self) -> None:
        self._call("cuStreamSynchronize", self.stream_handle)

    def begin_capture(self) -> None:
        mode = self._driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED
        self._call("cuStreamBeginCapture", self.stream_handle, mode)
        self.capturing = True

    def end_capture(self) -> CudaGraph:
        self.capturing = False
        graph = self._call("cuStreamEndCapture", self.stream_handle)
        executable = self._call("cuGraphInstantiate", graph, 0)
        self.captures += 1
        return CudaGraph(graph, executable)

    def replay(self, graph: CudaGraph) -> None:
        self._call("cuGraphLaunch", graph.executable, self.stream_handle)
        self.replays += 1


# ----------------------------------------------------------------------------
# cuBLASLt and cuDNN helpers
# ----------------------------------------------------------------------------

COMPUTE_32F = 68  # cublasComputeType_t CUBLAS_COMPUTE_32F: fp32 accumulation, no TF32
CUDA_TYPES = {"float32": 0, "float16": 2, "bfloat16": 14}  # cudaDataType_t: CUDA_R_32F, CUDA_R_16F, CUDA_R_16BF
OPERATIONS = {False: 0, True: 1}  # cublasOperation_t: CUBLAS_OP_N, CUBLAS_OP_T

# The sched epilogues as cuBLASLt computes them on the column-major C^T = op(B)^T op(A)^T, where
# cuBLASLt's A is our B: a bias of N values is cuBLASLt's per-row bias, our bias gradient of op(A)
# (M row sums) is cuBLASLt's BGRADB and that of op(B) (N values) its BGRADA.
CUBLASLT_EPILOGUES = {
    "bias": "BIAS", "relu": "RELU", "relu_bias": "RELU_BIAS", "gelu": "GELU", "gelu_bias": "GELU_BIAS",
    "gelu_aux": "GELU_AUX", "gelu_aux_bias": "GELU_AUX_BIAS", "dgelu": "DGELU", "dgelu_bgrad": "DGELU_BGRAD",
    "bgrada": "BGRADB", "bgradb": "BGRADA",
}


def cuda_type(dtype_name: str) -> int:
    try:
        return CUDA_TYPES[dtype_name]
    except KeyError:
        raise NotCovered(f"cuBLASLt GEMM in {dtype_name}") from None


def set_attribute(lt: Any, kind: str, handle: int, attribute: Any, value: float) -> None:
    """Set one attribute of a cuBLASLt descriptor (``kind``: matmul_desc, matrix_layout,
    matmul_preference) with the C type the bindings give for it."""
    dtype = getattr(lt, f"get_{kind}_attribute_dtype")(attribute)
    cell = np.array(value, dtype=dtype)
    getattr(lt, f"{kind}_set_attribute")(handle, attribute, cell.ctypes.data, cell.nbytes)


@dataclass(frozen=True)
class GemmProblem:
    """The column-major cuBLASLt problem of a row-major GEMM command: each layout is
    (dtype, rows, cols, leading dim, batch count, batch stride in elements) of A' (= B's memory),
    B' (= A's memory) and C."""

    layouts: tuple[tuple[str, int, int, int, int, int], ...]


def gemm_problem(command: GemmCommand) -> GemmProblem:
    a, b, c = command.a, command.b, command.c
    (ar, ac), (br, bc), (m, n) = a.shape[-2:], b.shape[-2:], c.shape[-2:]
    batch = math.prod(c.shape[:-2])
    if batch > 1 and len(b.shape) == 2 and not command.transa:  # fold the batch into M
        ar, m, batch = ar * batch, m * batch, 1
    b_stride = br * bc if len(b.shape) > 2 else 0
    a_type, b_type, c_type = (np.dtype(ref.dtype).name for ref in (a, b, c))
    return GemmProblem(((b_type, bc, br, bc, batch, b_stride), (a_type, ac, ar, ac, batch, ar * ac),
                        (c_type, n, m, n, batch, m * n)))


def attention_dims(shape: Sequence[int], layout: str) -> tuple[list[int], list[int]]:
    """cuDNN's (dims, strides) of a [B, H, T, D] tensor stored in ``layout`` (bhtd or bthd)."""
    if layout == "bhtd":
        b, h, t, d = shape
        return [b, h, t, d], [h * t * d, t * d, d, 1]
    b, t, h, d = shape
    return [b, h, t, d], [t * h * d, d, h * d, 1]


def mask_arguments(cudnn: Any, causal: bool, window: int) -> dict[str, Any]:
    """cuDNN's diagonal band for our masks: the queries are the last positions (bottom-right
    alignment); causal keeps keys j <= i, a window keeps i - j < w (causal) or |i - j| < w."""
    arguments: dict[str, Any] = {}
    # to confirm on a GPU: that the installed libcudnn supports a left bound with BOTTOM_RIGHT (and in
    # sdpa_backward); unsupported combinations fail in check_support, so they fall back, not go wrong
    if causal or window:
        arguments["diagonal_alignment"] = cudnn.diagonal_alignment.BOTTOM_RIGHT
    if causal:
        arguments["diagonal_band_right_bound"] = 0
    elif window:
        arguments["diagonal_band_right_bound"] = window - 1
    if window:
        arguments["diagonal_band_left_bound"] = window
    return arguments


def sdpa_tensors(graph: Any, cudnn: Any, command: Any, io_type: Any) -> dict[str, Any]:
    """Declare the command's tensors in a cuDNN graph and add its SDPA, forward or backward;
    returns the graph tensor of each of the command's buffers (by field name)."""

    def dims(name: str) -> tuple[list[int], list[int]]:
        return attention_dims(getattr(command, name).shape, command.layout)

    def declare(name: str) -> Any:
        shape, strides = dims(name)
        return graph.tensor(name=name, dim=shape, stride=strides, data_type=io_type)

    def output(tensor: Any, name: str) -> Any:
        shape, strides = dims(name)
        return tensor.set_output(True).set_dim(shape).set_stride(strides).set_data_type(io_type)

    b, h, t = command.lse.shape
    stats = ([b, h, t, 1], [h * t, t, 1, 1])
    tensors = {name: declare(name) for name in ("q", "k", "v")}
    mask = mask_arguments(cudnn, command.causal, command.window)
    if type(command).__name__ == "AttentionCommand":
        out, lse = graph.sdpa(name="sdpa", q=tensors["q"], k=tensors["k"], v=tensors["v"], generate_stats=True,
                              attn_scale=command.scale, **mask)
        tensors["out"] = output(out, "out")
        # to confirm on a GPU: cuDNN's stats are the natural-log logsumexp of the scaled scores, as our lse
        tensors["lse"] = lse.set_output(True).set_dim(stats[0]).set_stride(stats[1]).set_data_type(
            cudnn.data_type.FLOAT)
        return tensors
    tensors["out"], tensors["d_out"] = declare("out"), declare("d_out")
    tensors["lse"] = graph.tensor(name="lse", dim=stats[0], stride=stats[1], data_type=cudnn.data_type.FLOAT)
    d_q, d_k, d_v = graph.sdpa_backward(name="sdpa_backward", q=tensors["q"], k=tensors["k"], v=tensors["v"],
                                        o=tensors["out"], dO=tensors["d_out"], stats=tensors["lse"],
                                        attn_scale=command.scale, **mask)
    tensors.update(d_q=output(d_q, "d_q"), d_k=output(d_k, "d_k"), d_v=output(d_v, "d_v"))
    return tensors


DEVICES = ("cuda", "emulated")


def make_device(kind: str) -> Device:
    """A device by name: ``cuda`` (the GPU, through cuda-python) or ``emulated`` (numpy, for tests).
    RuntimeError saying why when there is no usable GPU or no cuda-python."""
    if kind == "emulated":
        return EmulatedDevice()
    if kind != "cuda":
        raise ValueError(f"no device '{kind}' (choose {', '.join(DEVICES)})")
    try:
        return CudaDevice()
    except ImportError as err:
        raise RuntimeError(f"cuda-python is not installed ({err}); pip install 'modeldsl[cuda]'") from None
    except Exception as err:  # the driver's own errors: no GPU, no driver, a device in use
        raise RuntimeError(f"no usable CUDA device ({type(err).__name__}: {err})") from None

