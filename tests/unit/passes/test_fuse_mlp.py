"""mdsl-fuse's gated_mlp pattern on whole training steps: the std Llama, Qwen3 and Mistral steps
with gated_mlp alone give bitwise the gradients of fusion off (the fused kernels do the unfused
arithmetic, and the tiny shapes' one GEMM over both halves rounds as the two over each), the MLP's
gradient concat, swiglu launches and one projection GEMM per half are gone (forward and recompute
replay), and the fused ops' verifier refuses a gate_up that is not twice the gated width."""

from collections import Counter

import numpy as np
import pytest
from xdsl.dialects import test as xdsl_test
from xdsl.utils.exceptions import VerifyException

import modeldsl
from hf_checkpoints import cached_checkpoint
from modeldsl.dialects.graph_primitives import FusedSplitSwigluOp
from modeldsl.dialects.graph_types import TensorType
from modeldsl.dialects.sched import GemmOp, LaunchOp
from modeldsl.passes.fuse import PATTERNS, FusePass
from modeldsl.resolve.imports import STD_ROOT
from modeldsl.runtime.train import compile_training_step

pytest.importorskip("transformers")

FAMILIES = [("llama", "llama.module", {}), ("qwen3", "qwen.module", {"head_dim": 16}),
            ("mistral", "mistral.module", {"sliding_window": 5})]
BATCH, TOKENS = 2, 8

GATED_MLP_ONLY = FusePass(disable=tuple(name for name in PATTERNS if name != "gated_mlp"))


def load(arch: str, module: str, config: dict):
    return modeldsl.load(STD_ROOT / "models" / module, hf=cached_checkpoint(arch, **config), dtype="fp32")


def gradients(model, program) -> tuple[float, np.ndarray]:
    """The loss and the fp32 gradients arena of one step on fixed tokens (labels partly ignored)."""
    executor = model.schedule.executor(program)
    executor.arenas["grads"][:] = 0
    rng = np.random.default_rng(0)
    vocab = model.config("vocab_size")
    tokens = rng.integers(0, vocab, size=(BATCH, TOKENS)).astype(np.int32)
    labels = rng.integers(0, vocab, size=(BATCH, TOKENS)).astype(np.int64)
    labels[0, :3] = -100
    (loss, *_) = executor.execute(*model.inputs(tokens, 0), labels, np.array(1.0, dtype=np.float32))
    return float(loss), executor.arenas["grads"].copy().view(np.float32)


def launches(program) -> Counter:
    return Counter(op.kernel.data for op in program.walk() if isinstance(op, LaunchOp))


def gemms(program) -> int:
    return sum(isinstance(op, GemmOp) for op in program.walk())


@pytest.mark.parametrize("arch, module, config", FAMILIES, ids=[f[0] for f in FAMILIES])
def test_gated_mlp_alone_is_bitwise_and_drops_the_concat(arch, module, config):
    model = load(arch, module, config)
    off = compile_training_step(model.model, BATCH, TOKENS, fuse=False)
    fused = compile_training_step(model.model, BATCH, TOKENS, fuse=GATED_MLP_ONLY)
    before, after = launches(off), launches(fused)
    assert after["fused_split_swiglu"] == 2 and after["fused_split_swiglu_backward"] == 1  # forward, replay; backward
    assert after["swiglu"] == after["swiglu_backward"] == after["split"] == 0
    assert after["concat"] == before["concat"] - 1  # the layer body's d_gate_up concat
    assert gemms(fused) == gemms(off) - 2  # the projection: one GEMM instead of one per half, twice
    (loss, grads), (fused_loss, fused_grads) = gradients(model, off), gradients(model, fused)
    assert fused_loss == loss and np.array_equal(fused_grads, grads)


def test_the_fused_op_refuses_a_gate_up_that_is_not_twice_the_gated_width():
    gate_up = xdsl_test.TestOp(result_types=[TensorType([4, 10], "fp32")]).results[0]
    op = FusedSplitSwigluOp(operands=[gate_up], result_types=[TensorType([4, 6], "fp32")])
    with pytest.raises(VerifyException, match="twice the gated width"):
        op.verify()
