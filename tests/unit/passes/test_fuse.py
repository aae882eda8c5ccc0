"""mdsl-fuse changes launches, not results: a training step of the std Llama, Qwen3 and Mistral
models with every pattern on gives bitwise the gradients of fusion off, with recompute on or off,
on the CPU schedule executor; and the forward with fusion (what modeldsl.load runs) runs the
fused kernel."""

import numpy as np
import pytest

import modeldsl
from hf_checkpoints import cached_checkpoint
from modeldsl.dialects.sched import LaunchOp
from modeldsl.resolve.imports import STD_ROOT
from modeldsl.runtime.profiles import compile_profile
from modeldsl.runtime.train import compile_training_step

pytest.importorskip("transformers")

FAMILIES = [("llama", "llama.module", {}), ("qwen3", "qwen.module", {"head_dim": 16}),
            ("mistral", "mistral.module", {"sliding_window": 5})]


def kernels(program) -> set[str]:
    return {op.kernel.data for op in program.walk() if isinstance(op, LaunchOp)}


def gradients(model, program) -> tuple[float, np.ndarray]:
    executor = model.schedule.executor(program)
    executor.arenas["grads"][:] = 0
    rng = np.random.default_rng(0)
    vocab = model.config("vocab_size")
    tokens = rng.integers(0, vocab, size=(2, 8)).astype(np.int32)
    labels = rng.integers(0, vocab, size=(2, 8)).astype(np.int64)
    (loss, *_) = executor.execute(*model.inputs(tokens, 0), labels, np.array(1.0, dtype=np.float32))
    return float(loss), executor.arenas["grads"].copy()


@pytest.mark.parametrize("arch, module, config", FAMILIES, ids=[f[0] for f in FAMILIES])
def test_fusion_leaves_the_gradients_bitwise_equal(arch, module, config):
    model = modeldsl.load(STD_ROOT / "models" / module, hf=cached_checkpoint(arch, **config), dtype="fp32")
    loss, grads = gradients(model, compile_training_step(model.model, 2, 8, fuse=False))
    for recompute in ("annotated", "full"):
        program = compile_training_step(model.model, 2, 8, recompute=recompute, fuse=True)
        assert "fused_residual_rmsnorm" in kernels(program)
        fused_loss, fused_grads = gradients(model, program)
        assert fused_loss == loss and np.array_equal(fused_grads, grads), recompute


def test_the_forward_profile_runs_the_fused_residual_norm():
    model = modeldsl.load(STD_ROOT / "models" / "llama.module", hf=cached_checkpoint("llama"), dtype="fp32")
    program = compile_profile(model.model, 1, 8, "fp32")
    assert "fused_residual_rmsnorm" in kernels(program)
    assert sum(op.kernel.data == "add" for op in program.walk() if isinstance(op, LaunchOp)) == 1  # per layer
