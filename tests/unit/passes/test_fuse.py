"""mdsl-fuse changes launches, not what a step learns: a training step of the std Llama, Qwen3 and
Mistral models with every pattern on gives the gradients of fusion off within fp32 rounding (the
chunked LM-head loss sums its weight gradient chunk by chunk), bitwise the same gradients with
recompute on as with it off, and the loss and logits never leave the fused program as a
``[B*T, vocab]`` buffer; the forward with fusion (what modeldsl.load runs) runs the fused kernel."""

import numpy as np
import pytest
from training_steps import BATCH, FAMILIES, FAMILY_IDS, TOKENS, load_std, step_gradients

from modeldsl.dialects.sched import BufferOp, LaunchOp
from modeldsl.passes import fuse
from modeldsl.passes.fuse import FusePass
from modeldsl.passes.fuse.loss import LmHeadLoss, LmHeadLossBackward, LmHeadLossGrad
from modeldsl.runtime.profiles import compile_profile
from modeldsl.runtime.train import compile_training_step

pytest.importorskip("transformers")



def kernels(program) -> set[str]:
    return {op.kernel.data for op in program.walk() if isinstance(op, LaunchOp)}


def gradients(model, program) -> tuple[float, np.ndarray]:
    return step_gradients(model, program, ignored=3)


def aligned(nbytes: int) -> int:
    return -(-nbytes // 256) * 256


@pytest.mark.parametrize("arch, module, config", FAMILIES, ids=FAMILY_IDS)
def test_fusion_keeps_the_gradients_and_recompute_stays_bitwise(arch, module, config):
    model = load_std(arch, module, config)
    loss, grads = gradients(model, compile_training_step(model.model, BATCH, TOKENS, fuse=False))
    fused_loss, fused_grads = gradients(model, compile_training_step(model.model, BATCH, TOKENS, recompute="none"))
    np.testing.assert_allclose(fused_loss, loss, rtol=1e-6)
    np.testing.assert_allclose(fused_grads, grads, rtol=1e-5, atol=1e-7)
    for recompute in ("annotated", "full"):
        program = compile_training_step(model.model, BATCH, TOKENS, recompute=recompute)
        assert {"fused_residual_rmsnorm", "fused_lm_head_loss_grad"} <= kernels(program)
        assert not kernels(program) & {"fused_lm_head_loss", "fused_lm_head_loss_backward"}
        again_loss, again_grads = gradients(model, program)
        assert again_loss == fused_loss and np.array_equal(again_grads, fused_grads), recompute


def test_arithmetic_preserving_patterns_are_bitwise():
    """residual_norm does the same sum and norm (forward) and the same norm gradient plus residual
    gradient (backward): with the rounding-changing patterns off, bitwise."""
    model = load_std("llama", "llama.module", {})
    off = compile_training_step(model.model, BATCH, TOKENS, fuse=False)
    norm_only = compile_training_step(model.model, BATCH, TOKENS,
                                      fuse=FusePass(disable=("scalar_alpha", "lm_head_loss")))
    assert {"fused_residual_rmsnorm", "fused_residual_rmsnorm_backward"} <= kernels(norm_only)
    assert "rmsnorm_backward" in kernels(norm_only)  # the final norm's: no residual gradient joins it
    (loss, grads), (fused_loss, fused_grads) = gradients(model, off), gradients(model, norm_only)
    assert fused_loss == loss and np.array_equal(fused_grads, grads)


def lm_head_readers(program) -> list[LaunchOp]:
    head = next(op.result for op in program.walk() if isinstance(op, BufferOp) and op.result.name_hint == "lm_head")
    return sorted((use.operation for use in head.uses), key=lambda op: op.kernel.data)


@pytest.fixture
def split_lm_head_loss(monkeypatch):
    """mdsl-fuse with lm_head_loss's forward and backward rewrites but not their merge."""
    monkeypatch.setitem(fuse.PATTERNS, "lm_head_loss", (LmHeadLossBackward, LmHeadLoss))


@pytest.mark.parametrize("chunk", [3, 5, 16])
def test_the_chunked_lm_head_loss_never_holds_the_logits(chunk):
    """No GEMM computes logits and no cross-entropy reads them: one launch, the loss and its
    gradients in one pass, reads the LM head, with a scratch of one chunk's logits (sized for
    fp32), the chunk's lse, every row's loss and the mean's scale."""
    model = load_std("llama", "llama.module", {})
    vocab = model.config("vocab_size")
    unfused = compile_training_step(model.model, BATCH, TOKENS, fuse=False)
    program = compile_training_step(model.model, BATCH, TOKENS, fuse=FusePass(lm_head_chunk=chunk))
    assert not kernels(program) & {"cross_entropy", "cross_entropy_backward"}
    (merged,) = lm_head_readers(program)
    assert merged.kernel.data == "fused_lm_head_loss_grad"
    rows = BATCH * TOKENS
    assert merged.outputs[-1].type.shape[0] == (aligned(4 * chunk * vocab) + aligned(4 * chunk)
                                                + aligned(4 * rows) + 4)
    (loss, grads), (fused_loss, fused_grads) = gradients(model, unfused), gradients(model, program)
    np.testing.assert_allclose(fused_loss, loss, rtol=1e-6)
    np.testing.assert_allclose(fused_grads, grads, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("chunk", [3, 16])
def test_the_merged_lm_head_loss_is_the_split_one_bit_for_bit(chunk, split_lm_head_loss):
    """Without the merge the forward and backward launches read the LM head, each with its scratch
    (the logits of one chunk, sized for fp32); with it, the loss and every
    gradient of the step are theirs bit for bit (the same arithmetic per chunk)."""
    model = load_std("llama", "llama.module", {})
    vocab, rows = model.config("vocab_size"), BATCH * TOKENS
    split = compile_training_step(model.model, BATCH, TOKENS, fuse=FusePass(lm_head_chunk=chunk))
    forward, backward = lm_head_readers(split)
    assert (forward.kernel.data, backward.kernel.data) == ("fused_lm_head_loss", "fused_lm_head_loss_backward")
    assert forward.outputs[-1].type.shape[0] == aligned(4 * chunk * vocab) + 4 * rows
    assert backward.outputs[-1].type.shape[0] == aligned(4 * chunk * vocab) + 4
    split_loss, split_grads = gradients(model, split)
    fuse.PATTERNS["lm_head_loss"] = (LmHeadLossBackward, LmHeadLoss, LmHeadLossGrad)
    merged = compile_training_step(model.model, BATCH, TOKENS, fuse=FusePass(lm_head_chunk=chunk))
    assert [op.kernel.data for op in lm_head_readers(merged)] == ["fused_lm_head_loss_grad"]
    merged_loss, merged_grads = gradients(model, merged)
    assert merged_loss == split_loss and np.array_equal(merged_grads, split_grads)


def test_the_forward_profile_runs_the_fused_residual_norm():
    model = load_std("llama", "llama.module", {})
    program = compile_profile(model.model, 1, 8, "fp32")
    assert "fused_residual_rmsnorm" in kernels(program)
    assert sum(op.kernel.data == "add" for op in program.walk() if isinstance(op, LaunchOp)) == 1  # per layer
