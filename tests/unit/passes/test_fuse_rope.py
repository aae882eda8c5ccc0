"""mdsl-fuse's qk_norm_rope pattern on the std Qwen3 (qk_norm before rope, in [B, T, H, D]): a fp32
training step with it gives bitwise the gradients and loss of the same step with it disabled (the
fused references do the unfused arithmetic), the fused kernels replace qk_norm, rope and their
backwards (with recompute on, the backward's qk_norm replay stays: a replay is a barrier), and the
forward's logits are bitwise those of the unfused forward."""

from collections import Counter

import numpy as np
import pytest
from training_steps import BATCH, TOKENS, load_std, step_gradients
from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp

from modeldsl.dialects.graph import ModelOp
from modeldsl.dialects.sched import LaunchOp
from modeldsl.passes.fuse import FusePass
from modeldsl.passes.lower_to_sched import lower_function
from modeldsl.passes.specialize import SpecializePass
from modeldsl.runtime.profiles import plan
from modeldsl.runtime.sched_executor import run_program
from modeldsl.runtime.train import compile_training_step

pytest.importorskip("transformers")

QWEN3 = ("qwen3", "qwen.module", {"head_dim": 16})
UNFUSED = FusePass(disable=("qk_norm_rope",))


def launches(program) -> Counter:
    return Counter(op.kernel.data for op in program.walk() if isinstance(op, LaunchOp))


@pytest.mark.parametrize("recompute", ["none", "annotated"])
def test_qwen3_training_step_is_bitwise_with_the_fused_kernels(recompute):
    model = load_std(*QWEN3)
    off = compile_training_step(model.model, BATCH, TOKENS, recompute=recompute, fuse=UNFUSED)
    on = compile_training_step(model.model, BATCH, TOKENS, recompute=recompute)
    before, after = launches(off), launches(on)
    assert before["rope"] == before["qk_norm_backward"] > 0 and before["fused_qk_norm_rope"] == 0
    assert after["rope"] == after["rope_backward"] == after["qk_norm_backward"] == 0
    assert after["fused_qk_norm_rope_backward"] == before["qk_norm_backward"] > 0
    assert after["fused_qk_norm_rope"] == before["rope"] > 0
    assert after["qk_norm"] == before["qk_norm"] - before["rope"]  # what is left: recompute's replays
    (loss, grads), (fused_loss, fused_grads) = step_gradients(model, off, 3), step_gradients(model, on, 3)
    assert fused_loss == loss and np.array_equal(fused_grads, grads)


def forward_program(model: ModelOp, fuse: FusePass):
    module = ModuleOp([model.clone()])
    SpecializePass.of(B=BATCH, T=TOKENS).apply(Context(), module)
    fuse.apply(Context(), module)
    specialized = next(op for op in module.body.block.ops if isinstance(op, ModelOp))
    return plan(lower_function(specialized, "forward", "fp32"))


def test_qwen3_forward_logits_are_bitwise():
    model = load_std(*QWEN3)
    off, on = forward_program(model.model, UNFUSED), forward_program(model.model, FusePass())
    assert launches(on)["fused_qk_norm_rope"] == launches(off)["rope"] > 0
    assert not launches(on)["qk_norm"] and not launches(on)["rope"]
    tokens = np.random.default_rng(1).integers(0, model.config("vocab_size"), (BATCH, TOKENS)).astype(np.int32)
    inputs = model.inputs(tokens, 0)
    (want, *_), (got, *_) = run_program(off, model.weights, inputs), run_program(on, model.weights, inputs)
    assert want.shape[-1] == model.config("vocab_size")
    np.testing.assert_array_equal(got, want)
