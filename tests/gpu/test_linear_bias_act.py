"""The fused GEMM epilogues on the CUDA executor: the training step of a bias + GELU / bias + ReLU
MLP (tests/unit/passes/bias_mlp.module) with ``linear_bias_act`` fused runs its cuBLASLt epilogues
(gelu_aux_bias, relu_bias, dgelu_bgrad, bgrada) on the emulated device to the CPU schedule
executor's loss and gradients bit for bit (both run the numpy GEMM of kernels/reference.py), and
on a GPU (cuBLASLt) within fp32 GEMM rounding; skipped there without one."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from training_step import cpu_step, device_step

import modeldsl
from modeldsl.dialects.sched import GemmOp
from modeldsl.passes.fuse import PATTERNS, FusePass
from modeldsl.runtime.cuda_device import CudaDevice, EmulatedDevice
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


VOCAB = 32


def test_the_emulated_device_runs_the_fused_step_bitwise(model, program):
    loss, grads = cpu_step(model, program, VOCAB)
    device_loss, device_grads, fallbacks = device_step(model, program, EmulatedDevice(), VOCAB)
    assert fallbacks == [] and device_loss == loss
    np.testing.assert_array_equal(device_grads, grads)
    assert np.abs(grads).max() > 0


@pytest.mark.skipif(CudaDevice.unavailable() is not None, reason="no CUDA device")
def test_cublaslt_runs_the_fused_step(model, program):
    loss, grads = cpu_step(model, program, VOCAB)
    device_loss, device_grads, fallbacks = device_step(model, program, CudaDevice(), VOCAB)
    assert fallbacks == []
    np.testing.assert_allclose(device_loss, loss, rtol=1e-5)
    np.testing.assert_allclose(device_grads, grads, rtol=1e-4, atol=1e-6)
