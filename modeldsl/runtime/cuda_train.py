"""Training a loaded model on the CUDA executor: :class:`CudaTrainer`, the device twin of
:class:`modeldsl.runtime.train.Trainer`.

The same programs (``compile_training_step`` per micro-batch shape, ``compile_optimizer_step``
once), the same step (each micro-batch adds ``1/K`` of its gradients into the ``grads`` arena,
then the optimizer program reads them, updates the weights and moments in place and zeroes
them; learning rate and step number from the host) and the same state API (``step``,
``grad_norm``, ``state_arrays``, ``restore``, ``sync_weights``), on a
:class:`modeldsl.runtime.cuda_device.Device` (a :class:`CudaDevice` by default; the
:class:`EmulatedDevice` runs the same on the CPU). All programs share one device params arena,
filled once from the model's weights (``fp32``: the fp32 weights; ``bf16``: mixed precision, the
16-bit weights, with fp32 masters in the optimizer arena), and the training and optimizer
programs share the grads arena. After the first step of each micro-batch shape nothing is
allocated; from the second on every program replays its CUDA graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from modeldsl.dialects.sched import ProgramOp
from modeldsl.runtime.cuda_device import Device
from modeldsl.runtime.cuda_executor import CudaExecutor, DeviceArena, TensorRef
from modeldsl.runtime.executor import ExecutionError
from modeldsl.runtime.sched_executor import tagged_layout
from modeldsl.runtime.train import Trainer


class SharedParams:
    """The device params arena every program of a model shares: the first executor made through
    it copies the weights in; the others get its arena. ExecutionError for a program that lays
    out the parameters differently."""

    def __init__(self, weights: dict[str, np.ndarray], device: Device):
        self.weights, self.device = weights, device
        self.arena: DeviceArena | None = None
        self.layout: dict | None = None

    def executor(self, program: ProgramOp, arenas: dict[str, DeviceArena] | None = None,
                 state: dict[str, TensorRef] | None = None) -> CudaExecutor:
        layout = tagged_layout(program, "param")
        if self.layout is None:
            self.layout = layout
        elif layout != self.layout:
            raise ExecutionError(f"@{program.sym_name.data} lays out the parameters unlike the model's other "
                                 "programs (a different storage dtype?)")
        shared = {**(arenas or {}), **({"params": self.arena} if self.arena is not None else {})}
        executor = CudaExecutor(program, self.weights if self.arena is None else None, shared, state,
                                device=self.device)
        self.arena = executor.arenas["params"]
        return executor


@dataclass
class CudaTrainer(Trainer):
    """:class:`Trainer` on a device (mixed precision by default): the same programs, step and state;
    its executors are CudaExecutors on one device params arena."""

    dtype: str = "bf16"
    device: Device | None = None

    def shared_params(self) -> SharedParams:
        if self.device is None:
            from modeldsl.runtime.cuda_device import CudaDevice

            self.device = CudaDevice()
        return SharedParams(self.model.weights, self.device)

    def synchronize(self) -> None:
        """Wait for the device's queued work."""
        self.device.synchronize()

    def peak_bytes(self) -> int:
        """The most device memory the trainer's device held at once: arenas, workspaces, tables."""
        return int(self.device.peak_bytes)
