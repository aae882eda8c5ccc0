"""The fused GEMM epilogues on the CUDA executor: the training step of a bias + GELU / bias + ReLU
MLP (tests/unit/passes/bias_mlp.module) with ``linear_bias_act`` fused runs its cuBLASLt epilogues
(gelu_aux_bias, relu_bias, dgelu_bgrad, bgrada) on the emulated device to the CPU schedule
executor's loss and gradients bit for bit (both run the numpy GEMM of kernels/reference.py), and
on a GPU (cuBLASLt) within fp32 GEMM rounding; skipped there without one."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import modeldsl
from modeldsl.dialects.sched import GemmOp
from modeldsl.passes.fuse import PATTERNS, FusePass
from modeldsl.runtime.cuda_device import CudaDevice, EmulatedDevice
from modeldsl.runtime.cuda_executor import CudaExecutor
from modeldsl.runtime.sched_executor import ScheduleExecutor
from modeldsl.runtime.train import compile_training_step

pytestmark = pytest.mark.gpu

MLP = Path(__file__).resolve().parents[1] / "unit" / "passes" / "bias_mlp.module"
EPILOGUES_ONLY = FusePass(disable=tuple(p for p in PATTERNS if p not in ("linear_bias_act", "bias_activation")))


@pytest.fixture(scope="module")
def model():
    return modeldsl.load(MLP, dtype="fp32")


@pytest.fixture(scope="module")
def program(model):
    program = compile_training_step(model.model, 2, 8, "fp32", fuse=EPILOGUES_ONLY)
    found = {op.epilogue.data for op in program.walk() if isinstance(op, GemmOp)}
    assert {"gelu_aux_bias", "relu_bias", "dgelu_bgrad", "bgrada"} <= found
    return program


def inputs(model) -> list[np.ndarray]:
    rng = np.random.default_rng(5)
    tokens = rng.integers(0, 32, (2, 8)).astype(np.int32)
    labels = rng.integers(0, 32, (2, 8)).astype(np.int64)
    return [*model.inputs(tokens, 0), labels, np.array(1.0, np.float32)]


def cpu_step(model, program) -> tuple[np.ndarray, np.ndarray]:
    cpu = ScheduleExecutor(program, model.weights)
    cpu.arenas["grads"][:] = 0
    (loss,) = cpu.execute(*inputs(model))
    return loss.copy(), cpu.arenas["grads"].view(np.float32).copy()


def device_step(model, program, device) -> tuple[np.ndarray, np.ndarray]:
    executor = CudaExecutor(program, model.weights, device=device)
    assert executor.fallbacks == []
    grads = executor.arenas["grads"]
    executor.device.upload(grads.address, np.zeros(grads.nbytes, np.uint8))
    (loss,) = executor.execute(*inputs(model))
    return np.asarray(loss).copy(), executor.device.download(grads.address, grads.nbytes).view(np.float32)


def test_the_emulated_device_runs_the_fused_step_bitwise(model, program):
    loss, grads = cpu_step(model, program)
    device_loss, device_grads = device_step(model, program, EmulatedDevice())
    assert device_loss == loss
    np.testing.assert_array_equal(device_grads, grads)
    assert np.abs(grads).max() > 0


@pytest.mark.skipif(CudaDevice.unavailable() is not None, reason="no CUDA device")
def test_cublaslt_runs_the_fused_step(model, program):
    loss, grads = cpu_step(model, program)
    device_loss, device_grads = device_step(model, program, CudaDevice())
    np.testing.assert_allclose(device_loss, loss, rtol=1e-5)
    np.testing.assert_allclose(device_grads, grads, rtol=1e-4, atol=1e-6)
