"""Training a loaded model on the CUDA executor: :class:`CudaTrainer`, the device twin of
:class:`modeldsl.runtime.train.Trainer`.

The same programs (``compile_training_step`` per micro-batch shape, ``compile_optimizer_step``
once), the same step (each micro-batch adds ``1/K`` of its gradients into the ``grads`` arena,
then the optimizer program reads them, updates the weights and moments in place and zeroes
them; learning rate and step number from the host) and the same state API (``step``,
``grad_norm``, ``state_arrays``, ``restore``, ``sync_weights``), on a
:class:`modeldsl.runtime.cuda_device.Device` (a :class:`CudaDevice` by default; the
:class:`EmulatedDevice` runs the same on the CPU). All programs share one device params arena (a
:class:`modeldsl.runtime.profiles.ProfiledForward` on the device), filled once from the model's
weights (``fp32``: the fp32 weights; ``bf16``: mixed precision, the 16-bit weights, with fp32
masters in the optimizer arena), and the training and optimizer
programs share the grads arena. After the first step of each micro-batch shape nothing is
allocated; from the second on every program replays its CUDA graph.
"""

from __future__ import annotations

from dataclasses import dataclass

from modeldsl.runtime.train import Trainer


@dataclass
class CudaTrainer(Trainer):
    """:class:`Trainer` on a device (mixed precision by default; a :class:`CudaDevice` unless
    ``device`` gives one): the same programs, step and state, on CUDA executors."""

    dtype: str = "bf16"

    def __post_init__(self) -> None:
        if self.device is None:
            from modeldsl.runtime.cuda_device import CudaDevice

            self.device = CudaDevice()
        super().__post_init__()

    def synchronize(self) -> None:
        """Wait for the device's queued work."""
        self.device.synchronize()

    def peak_bytes(self) -> int:
        """The most device memory the trainer's device held at once: arenas, workspaces, tables."""
        return int(self.device.peak_bytes)
