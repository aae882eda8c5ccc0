"""LoRA on an fp8 base on the CUDA executor: the GEMMs that read a stored weight with its scale
(``mdsl.sched.gemm ... scale``) run on the emulated device to the CPU schedule's loss and adapter
gradients bit for bit (both the reference), and on a GPU (the weight widened by cast.cu's dequantize
kernel into one shared buffer, then cuBLASLt) within fp32 GEMM rounding, with no host fallback;
skipped there without one."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from training_step import cpu_step, device_step

from modeldsl.dialects.sched import GemmOp
from modeldsl.resolve.imports import STD_ROOT
from modeldsl.runtime.cuda_device import CudaDevice, EmulatedDevice
from modeldsl.runtime.train import compile_training_step

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def model():
    import modeldsl

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
    from hf_checkpoints import cached_checkpoint

    return modeldsl.load(STD_ROOT / "models" / "llama.module", hf=cached_checkpoint("llama"), dtype="fp32",
                         lora=dict(r=4, lora_alpha=8, target_modules="all-linear"), base_dtype="fp8")


@pytest.fixture(scope="module")
def program(model):
    program = compile_training_step(model.model, 2, 8, "fp32")
    assert sum(isinstance(op, GemmOp) and op.scale_b is not None for op in program.walk()) >= 8
    return program


VOCAB = 64


def test_the_emulated_device_runs_the_scaled_gemms_bitwise(model, program):
    loss, grads = cpu_step(model, program, VOCAB)
    device_loss, device_grads, _ = device_step(model, program, EmulatedDevice(), VOCAB)
    assert device_loss == loss
    np.testing.assert_array_equal(device_grads, grads)
    assert np.abs(grads).max() > 0


@pytest.mark.skipif(CudaDevice.unavailable() is not None, reason="no CUDA device")
def test_the_gpu_widens_the_fp8_base_and_runs_cublaslt(model, program):
    loss, grads = cpu_step(model, program, VOCAB)
    device_loss, device_grads, fallbacks = device_step(model, program, CudaDevice(), VOCAB)
    assert fallbacks == []
    np.testing.assert_allclose(device_loss, loss, rtol=1e-5)
    np.testing.assert_allclose(device_grads, grads, rtol=1e-4, atol=1e-6)
