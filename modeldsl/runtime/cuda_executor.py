"""The CUDA executor of a planned ``mdsl.sched`` program.

:class:`CudaExecutor` allocates its arenas once (or shares the ones it is given), binds the
program to device commands (:func:`modeldsl.runtime.cuda_binding.bind_program`; the commands are
:mod:`modeldsl.runtime.cuda_commands`), lets the device (:mod:`modeldsl.runtime.cuda_device`: the
GPU and a numpy emulation) prepare every command (GEMM plans, attention graphs, kernel modules),
and then ``execute`` copies the inputs in, runs the commands (the first call eagerly, the second
captured as a CUDA graph and replayed, later calls replayed) and copies the outputs out.

Semantics are the CPU :class:`modeldsl.runtime.sched_executor.ScheduleExecutor`'s: the same
inputs, outputs, state buffers, tagged parameters, gradients, moments and master weights
(here :class:`DeviceArray` accessors that copy to and from the device), the same shared arenas
between programs, the same reference kernels and launch parameters.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from modeldsl.dialects.sched import ProgramOp
from modeldsl.kernels import cuda
from modeldsl.runtime.cuda_binding import TAGS, bind_program
from modeldsl.runtime.cuda_commands import Command, Fallback, TensorRef, warn_fallback
from modeldsl.runtime.cuda_device import Device, KernelUnavailable, aligned
from modeldsl.runtime.executor import ExecutionError


@dataclass(frozen=True)
class DeviceArena:
    """An arena's device memory."""

    address: int
    nbytes: int


class DeviceArray:
    """A tagged buffer of an executor: ``read()`` copies it to the host, ``write(value)`` copies a
    host value in (cast and broadcast as ``numpy.copyto`` does); ``numpy.asarray`` reads it."""

    def __init__(self, device: Device, ref: TensorRef):
        self.device, self.ref = device, ref

    @property
    def shape(self) -> tuple[int, ...]:
        return self.ref.shape

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.ref.dtype)

    def read(self) -> np.ndarray:
        return self.device.download(self.ref.address, self.ref.nbytes).view(self.ref.dtype).reshape(self.ref.shape)

    def write(self, value: Any) -> None:
        host = np.empty(self.ref.shape, dtype=self.ref.dtype)
        np.copyto(host, np.asarray(value), casting="unsafe")
        self.device.upload(self.ref.address, host)

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        value = self.read()
        return value if dtype is None else value.astype(dtype)

    def __repr__(self) -> str:
        return f"DeviceArray({list(self.shape)}, {self.dtype.name}, at {self.ref.address:#x})"


class CudaExecutor:
    """Runs one planned program on a device; the CPU :class:`ScheduleExecutor`'s API, with host
    copies in and out."""

    def __init__(self, program: ProgramOp, params: dict[str, np.ndarray] | None = None,
                 arenas: dict[str, DeviceArena] | None = None, state: dict[str, TensorRef] | None = None,
                 device: Device | None = None, graphs: bool = True):
        """``arenas`` may give arenas shared with other programs (the params arena of every program
        of a model, the grads arena of the training and optimizer programs); the others are
        allocated here, once, and zeroed. ``state`` gives the buffers of state names (KV caches)
        another program placed. ``graphs``: capture the commands as a CUDA graph on the second
        ``execute`` and replay it after (when no command falls back to the host)."""
        if device is None:
            from modeldsl.runtime.cuda_device import CudaDevice

            device = CudaDevice()
        self.program, self.device, self.graphs = program, device, graphs
        self.own: list[int] = []  # device allocations of this executor
        self.arenas = self._arenas(program, arenas or {})
        self.bound = bind_program(program, {name: arena.address for name, arena in self.arenas.items()}, state)
        self.workspace = self._bind_plans()
        self.fallbacks = self._prepare()
        self.inputs, self.outputs, self.state = self.bound.inputs, self.bound.outputs, self.bound.state
        self.params, self.grads, self.moments, self.masters = (
            {name: DeviceArray(device, ref) for name, ref in self.bound.tagged[tag].items()} for tag in TAGS)
        self.runs = 0
        self.graph: Any = None
        if params is not None:
            self.bind_params(params)

    @property
    def commands(self) -> list[Command]:
        return self.bound.commands

    @property
    def allocations(self) -> int:
        """Device allocations this executor made (arenas, workspace and tables)."""
        return len(self.own)

    # ------------------------------------------------------------------ memory
    def _allocate(self, nbytes: int) -> int:
        address = self.device.allocate(nbytes)
        self.own.append(address)
        return address

    def _arenas(self, program: ProgramOp, shared: dict[str, DeviceArena]) -> dict[str, DeviceArena]:
        arenas = {}
        for name, size in program.arenas.items():
            if name in shared:
                if shared[name].nbytes < size:
                    raise ExecutionError(f"the shared {name} arena has {shared[name].nbytes} bytes, the program "
                                         f"needs {size}")
                arenas[name] = shared[name]
            elif size:
                arenas[name] = DeviceArena(self._allocate(size), size)
                self.device.memset(arenas[name].address, size, b"\0")  # as the CPU executor's np.zeros
            else:
                arenas[name] = DeviceArena(0, 0)
        return arenas

    def _bind_plans(self) -> DeviceArena:
        """One allocation for the scratch of every plan (the largest plan's) and the device tables
        after it; resolve the plans' arguments, upload the tables."""
        scratch = aligned(self.bound.scratch_bytes)
        blobs = [(command, name, blob) for command in self.bound.kernels for name, blob in command.tables.items()]
        offsets, size = [], scratch
        for _, _, blob in blobs:
            offsets.append(size)
            size += aligned(len(blob))
        base = self._allocate(size) if size else 0
        tables: dict[int, dict[str, int]] = {}
        for (command, name, blob), offset in zip(blobs, offsets):
            tables.setdefault(id(command), {})[name] = base + offset
            self.device.upload(base + offset, np.frombuffer(blob, dtype=np.uint8))
        for command in self.bound.kernels:
            try:
                command.resolve(base, tables.get(id(command), {}))
            except cuda.NotCovered as err:
                command.plan, command.fallback = None, str(err)
        return DeviceArena(base, size)

    def _prepare(self) -> list[Fallback]:
        """Let the device prepare every command; collect (and warn once per primitive about) those
        that run on host copies. A command whose ``@kernel`` choice is binding (``fallback = false``)
        and cannot run as chosen is KernelUnavailable (E043) instead."""
        fallbacks = []
        for command in self.commands:
            if command.fallback is None:
                try:
                    self.device.prepare(command)
                except cuda.NotCovered as err:
                    command.fallback = str(err)
            if command.fallback is not None and command.binding:
                raise KernelUnavailable(f"@kernel(\"{command.choice.name}\", fallback=false): {command.label} cannot "
                                        f"run as chosen: {command.fallback}")
            if command.fallback is not None:
                fallbacks.append(Fallback(command.kind, command.fallback))
                warn_fallback(command.kind, command.fallback)
        return fallbacks

    def bind_params(self, weights: dict[str, np.ndarray]) -> None:
        """Copy each parameter into its place in the params arena."""
        missing = sorted(set(self.params) - set(weights))
        if missing:
            raise ExecutionError(f"no weights for the parameters {', '.join(missing)}")
        for name, array in self.params.items():
            array.write(np.asarray(weights[name]).reshape(array.shape))

    def close(self) -> None:
        """Free the device memory this executor allocated (not the shared arenas it was given)."""
        for address in self.own:
            self.device.free(address)
        self.own.clear()

    # ------------------------------------------------------------------ running
    @property
    def capturable(self) -> bool:
        return self.graphs and self.device.supports_graphs and not self.fallbacks and \
            not any(getattr(c, "host", False) for c in self.commands)  # (an @assert reads on the host)

    def execute(self, *inputs: np.ndarray) -> list[np.ndarray]:
        """Copy the inputs in, run every command, copy the outputs out."""
        if len(inputs) != len(self.inputs):
            raise ExecutionError(f"the program takes {len(self.inputs)} inputs, got {len(inputs)}")
        for index, (ref, value) in enumerate(zip(self.inputs, inputs)):
            if np.shape(value) != ref.shape:
                raise ExecutionError(f"input {index}: expected shape {ref.shape}, got {np.shape(value)}")
            host = np.empty(ref.shape, dtype=ref.dtype)
            np.copyto(host, value, casting="unsafe")
            self.device.upload(ref.address, host)
        self.run()
        return [DeviceArray(self.device, ref).read() for ref in self.outputs]

    def run(self) -> None:
        """Run the commands: eagerly the first time, captured as a graph the second, replayed after."""
        self.runs += 1
        if self.graph is None and self.runs >= 2 and self.capturable:
            self.device.begin_capture()
            try:
                self.run_commands()
            finally:
                self.graph = self.device.end_capture()
        if self.graph is not None:
            self.device.replay(self.graph)
        else:
            self.run_commands()

    def run_commands(self) -> None:
        for command in self.commands:
            command.run(self.device)
