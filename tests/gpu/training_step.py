"""One training step of a program on the CPU schedule executor and on a CUDA executor's device, from
the same seeded batch: what the GPU tests of whole steps compare (the loss and the grads arena)."""

from __future__ import annotations

import numpy as np

from modeldsl.runtime.cuda_executor import CudaExecutor
from modeldsl.runtime.sched_executor import ScheduleExecutor


def step_inputs(model, vocab: int) -> list[np.ndarray]:
    """A [2, 8] batch of token ids below ``vocab`` (seed 5), its labels, and the loss seed 1."""
    rng = np.random.default_rng(5)
    tokens = rng.integers(0, vocab, (2, 8)).astype(np.int32)
    labels = rng.integers(0, vocab, (2, 8)).astype(np.int64)
    return [*model.inputs(tokens, 0), labels, np.array(1.0, np.float32)]


def cpu_step(model, program, vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """(the loss, the grads arena as fp32) of one step on the CPU schedule executor."""
    cpu = ScheduleExecutor(program, model.weights)
    cpu.arenas["grads"][:] = 0
    (loss,) = cpu.execute(*step_inputs(model, vocab))
    return loss.copy(), cpu.arenas["grads"].view(np.float32).copy()


def device_step(model, program, device, vocab: int) -> tuple[np.ndarray, np.ndarray, list]:
    """(the loss, the grads arena as fp32, the executor's fallbacks) of one step on ``device``."""
    executor = CudaExecutor(program, model.weights, device=device)
    grads = executor.arenas["grads"]
    executor.device.upload(grads.address, np.zeros(grads.nbytes, np.uint8))
    (loss,) = executor.execute(*step_inputs(model, vocab))
    return (np.asarray(loss).copy(), executor.device.download(grads.address, grads.nbytes).view(np.float32),
            executor.fallbacks)
