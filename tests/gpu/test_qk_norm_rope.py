"""The fused qk_norm + rope kernels (fused_qk_norm_rope and its backward, kernels/rope.cu) against
their numpy references, on a GPU or the CPU emulator (``MDSL_KERNEL_RUNNER=emulator``).

As tests/gpu/test_kernels.py: inputs rounded to the variant's storage, every output and the
scratch poisoned with NaN, rtol 1e-5 (fp32) / 1e-2 (bf16); both layouts, both pairings, head dims
from 2 to 1024 (one pair per thread up to four, row groups of more than a warp), GQA, and rows that
do not fill the last block. The backward reads the forward's statistics from the reference. A Qwen3
training step whose fused launches run the kernels follows the CPU trainer.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from harness import GPU, ids, rounded, skip_without_runner
from test_kernels import check, rope_inputs, runner  # noqa: F401 - runner is a fixture

from modeldsl.kernels import cuda
from modeldsl.kernels.reference import REFERENCES
from modeldsl.runtime.cuda_device import EmulatedDevice
from modeldsl.runtime.cuda_train import CudaTrainer
from modeldsl.runtime.optim import AdamWConfig
from modeldsl.runtime.train import Trainer

pytestmark = pytest.mark.gpu

skip_without_runner()
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from training_steps import load_std  # noqa: E402 - tests/unit's helpers, on the path just above

QWEN3 = ("qwen3", "qwen.module", {"head_dim": 16})
SHAPES = [(1, 1, 1, 2), (2, 4, 7, 64), (1, 3, 5, 6), (2, 4, 9, 128), (1, 2, 3, 10), (2, 2, 37, 16), (1, 2, 3, 1024)]
if GPU:
    SHAPES += [(8, 16, 1024, 128)]


@pytest.mark.parametrize("layout", ["bhtd", "bthd"])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("variant", ["fp32", "bf16"])
@pytest.mark.parametrize("shape", SHAPES, ids=ids(SHAPES))
def test_fused_qk_norm_rope(runner, shape, variant, interleaved, layout):  # noqa: F811
    rng = np.random.default_rng(17)
    q, k, freqs = rope_inputs(rng, shape)
    if layout == "bthd":
        q, k = (np.ascontiguousarray(np.swapaxes(x, 1, 2)) for x in (q, k))
    qw, kw = 1 + 0.1 * rng.standard_normal(shape[-1]), 1 + 0.1 * rng.standard_normal(shape[-1])
    attrs = {"interleaved": interleaved, "layout": layout}
    check(runner, "fused_qk_norm_rope", [q, k, qw, kw, freqs], {"eps": 1e-6, **attrs}, variant)
    _, _, q_rstd, k_rstd = REFERENCES["fused_qk_norm_rope"](*(rounded(a, variant) for a in (q, k, qw, kw)),
                                                            rounded(freqs, "fp32"), **attrs)
    d_q, d_k = rng.standard_normal(q.shape), rng.standard_normal(k.shape)
    check(runner, "fused_qk_norm_rope_backward", [d_q, d_k, q, k, qw, kw, q_rstd, k_rstd, freqs], attrs, variant)


@pytest.mark.parametrize("variant", ["fp32", "bf16"])
@pytest.mark.parametrize("shape", SHAPES[:6], ids=ids(SHAPES[:6]))
def test_fused_qk_norm_rope_with_a_table_per_row(runner, shape, variant):  # noqa: F811
    """Packed rows' tables [B, T, D/2, 2] in the bthd layout (T = B T for the kernels)."""
    from test_kernels import row_tables

    rng = np.random.default_rng(18)
    q, k, _ = rope_inputs(rng, shape)
    q, k = (np.ascontiguousarray(np.swapaxes(x, 1, 2)) for x in (q, k))
    freqs = row_tables(rng, shape[0], shape[2], shape[3])
    qw, kw = 1 + 0.1 * rng.standard_normal(shape[-1]), 1 + 0.1 * rng.standard_normal(shape[-1])
    attrs = {"layout": "bthd"}
    check(runner, "fused_qk_norm_rope", [q, k, qw, kw, freqs], {"eps": 1e-6, **attrs}, variant)
    _, _, q_rstd, k_rstd = REFERENCES["fused_qk_norm_rope"](*(rounded(a, variant) for a in (q, k, qw, kw)),
                                                            rounded(freqs, "fp32"), **attrs)
    d_q, d_k = rng.standard_normal(q.shape), rng.standard_normal(k.shape)
    check(runner, "fused_qk_norm_rope_backward", [d_q, d_k, q, k, qw, kw, q_rstd, k_rstd, freqs], attrs, variant)


def test_the_launch_gives_each_thread_at_most_four_pairs():
    for d, group in ((2, 1), (8, 1), (64, 8), (128, 16), (1024, 128)):
        step = cuda.plan("fused_qk_norm_rope", [(1, 2, 3, d), (1, 1, 3, d), (d,), (d,), (3, d // 2, 2)],
                         [(1, 2, 3, d), (1, 1, 3, d), (1, 2, 3), (1, 1, 3)], {}, "fp32").steps[0]
        assert step.block[0] == group and step.grid[1] == 2
    with pytest.raises(cuda.NotCovered):
        cuda.plan("fused_qk_norm_rope", [(1, 1, 1, 8192), (1, 1, 1, 8192), (8192,), (8192,), (1, 4096, 2)],
                  [(1, 1, 1, 8192), (1, 1, 1, 8192), (1, 1, 1), (1, 1, 1)], {}, "fp32")


@pytest.mark.skipif(shutil.which("g++") is None, reason="the kernel emulator needs g++")
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_a_qwen3_step_runs_the_fused_kernels_and_follows_the_cpu_trainer(dtype):
    """The CUDA executor's launches of fused_qk_norm_rope(_backward) run the kernels (g++ emulator; the
    other commands the references): two steps give the CPU trainer's losses and gradient norms."""
    from test_lm_head_loss import KernelEmulatorDevice

    class FusedKernelsEmulated(KernelEmulatorDevice):
        """Runs the fused launches' kernels in order with the rest (recorded while a graph is captured)."""

        def run_kernel(self, command):
            if command.kernel.startswith("fused_qk_norm_rope"):
                self._submit(lambda: KernelEmulatorDevice.run_kernel(self, command))
            else:
                EmulatedDevice.run_kernel(self, command)

    config = AdamWConfig(lr=3e-3, warmup_steps=2, total_steps=4, clip_norm=1.0)
    device = FusedKernelsEmulated()
    cpu = Trainer(load_std(*QWEN3), config, dtype=dtype)
    gpu = CudaTrainer(load_std(*QWEN3), config, dtype=dtype, device=device)
    rng = np.random.default_rng(3)
    for _ in range(2):
        tokens = rng.integers(0, 64, (2, 8))
        batch = [(tokens, np.roll(tokens, -1, axis=1))]
        assert gpu.train_step(batch) == pytest.approx(cpu.train_step(batch), rel=1e-5 if dtype == "fp32" else 1e-2)
        assert gpu.grad_norm == pytest.approx(cpu.grad_norm, rel=1e-5 if dtype == "fp32" else 1e-2)
    assert device.captures >= 1 and device.replays >= 1  # the second step replays the captured program
    layers = gpu.model.config("n_layers")
    assert device.kernel_launches == 2 * 3 * layers  # per step and layer: the forward, the backward's two launches
