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

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from modeldsl.dialects.sched import ProgramOp
from modeldsl.runtime.cuda_device import Device
from modeldsl.runtime.cuda_executor import CudaExecutor, DeviceArena, TensorRef
from modeldsl.runtime.executor import ExecutionError
from modeldsl.runtime.optim import AdamWConfig
from modeldsl.runtime.sched_executor import tagged_layout
from modeldsl.runtime.train import MOMENTS, TRAINING_DTYPES, compile_optimizer_step, compile_training_step


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
class CudaTrainer:
    """AdamW training of a loaded :class:`modeldsl.runtime.model.Model` (fp32 weights) on a device."""

    model: Any  # modeldsl.runtime.model.Model
    config: AdamWConfig = field(default_factory=AdamWConfig)
    dtype: str = "bf16"
    device: Device | None = None
    step: int = 0

    def __post_init__(self) -> None:
        if self.model.dtype != "fp32":
            raise ExecutionError(f"the model is loaded as {self.model.dtype}; load it in fp32 (its weights are the "
                                 "master copy) and give the training dtype to the CudaTrainer")
        if self.dtype not in TRAINING_DTYPES:
            raise ExecutionError(f"no training dtype '{self.dtype}' (choose {', '.join(TRAINING_DTYPES)})")
        if self.device is None:
            from modeldsl.runtime.cuda_device import CudaDevice

            self.device = CudaDevice()
        self.storage = "fp32" if self.dtype == "fp32" else None
        self.shared = SharedParams(self.model.weights, self.device)
        self.optimizer = self.shared.executor(compile_optimizer_step(self.model.model, self.config, self.storage))
        for name, master in self.optimizer.masters.items():
            master.write(self.model.weights[name])
        self.programs: dict[tuple[int, int], CudaExecutor] = {}
        self.grad_norm = math.nan  # of the last step, before clipping

    def executor(self, batch: int, tokens: int) -> CudaExecutor:
        """The training step of ``[batch, tokens]`` micro-batches (compiled and bound on first use)."""
        key = (batch, tokens)
        if key not in self.programs:
            program = compile_training_step(self.model.model, batch, tokens, self.storage)
            if tagged_layout(program, "grad") != tagged_layout(self.optimizer.program, "grad"):
                raise ExecutionError("the training step lays out the gradients unlike the optimizer step")
            self.programs[key] = self.shared.executor(program, arenas={"grads": self.optimizer.arenas["grads"]})
        return self.programs[key]

    # ------------------------------------------------------------------ steps
    def accumulate(self, tokens: np.ndarray, labels: np.ndarray, weight: float = 1.0) -> float:
        """Run one micro-batch: its loss; ``weight`` times its gradients are added into the grads arena."""
        executor = self.executor(*tokens.shape)
        inputs = self.model.inputs(tokens, 0)
        (loss, *_) = executor.execute(*inputs, labels.astype(np.int64), np.array(weight, dtype=np.float32))
        return float(loss)

    def train_step(self, micro_batches: list[tuple[np.ndarray, np.ndarray]]) -> float:
        """One optimizer step over micro-batches of (tokens, labels); the mean loss."""
        weight = 1.0 / len(micro_batches)
        losses = [self.accumulate(tokens, labels, weight) for tokens, labels in micro_batches]
        lr = self.config.lr_at(self.step)
        self.step += 1
        (norm,) = self.optimizer.execute(np.array([lr], dtype=np.float32), np.array([self.step], dtype=np.int64))
        self.grad_norm = float(norm)
        return float(np.mean(losses))

    def synchronize(self) -> None:
        """Wait for the device's queued work."""
        self.device.synchronize()

    def peak_bytes(self) -> int:
        """The most device memory the trainer's device held at once: arenas, workspaces, tables."""
        return int(self.device.peak_bytes)

    # ------------------------------------------------------------------ weights and state
    def sync_weights(self) -> None:
        """Make ``model.weights`` the trained weights: the fp32 parameters (fp32) or the fp32 master
        copies (bf16), copied from the device."""
        weights = self.model.weights
        for name in self.optimizer.grads:
            source = self.optimizer.masters.get(name, self.optimizer.params[name]).read()
            if weights[name].flags.writeable:  # a view of the CPU profiles' params arena
                np.copyto(weights[name], source, casting="unsafe")
            else:  # still the loaded (read-only, memory-mapped) array
                weights[name] = np.array(source, dtype=weights[name].dtype)

    def state_arrays(self) -> dict[str, np.ndarray]:
        """The optimizer moments by name, ``exp_avg.PARAM`` and ``exp_avg_sq.PARAM`` (fp32 copies)."""
        return {name: array.read() for name, array in self.optimizer.moments.items()}

    def restore(self, step: int, arrays: dict[str, np.ndarray]) -> None:
        """Continue from :meth:`state_arrays` taken after ``step`` steps (ValueError when the
        moments do not fit the model's trainable parameters)."""
        moments = {k: v for k, v in arrays.items() if k.startswith(MOMENTS)}
        targets = self.optimizer.moments
        unknown = sorted(set(moments) - set(targets))
        if unknown:
            raise ValueError(f"the moments '{unknown[0]}' belong to no trainable parameter of the model")
        missing = sorted(set(targets) - set(moments))
        if missing:
            raise ValueError(f"no moments '{missing[0]}' for a trainable parameter of the model")
        for name, value in moments.items():
            if np.shape(value) != targets[name].shape:
                raise ValueError(f"the moments '{name}' have shape {np.shape(value)}, the parameter "
                                 f"{targets[name].shape}")
        for name, value in moments.items():
            targets[name].write(value)
        self.step = int(step)
