"""mdsl-fuse's gated_mlp pattern on whole training steps: the std Llama, Qwen3 and Mistral steps
with gated_mlp alone give bitwise the gradients of fusion off (the fused kernels do the unfused
arithmetic, and the tiny shapes' one GEMM over both halves rounds as the two over each), the MLP's
gradient concat and swiglu launches are gone (the backward's replay recomputes only the swiglu, from
the saved projection), and the fused ops' verifier refuses a gate_up that is not twice the gated width."""

from collections import Counter

import numpy as np
import pytest
from training_steps import BATCH, FAMILIES, FAMILY_IDS, TOKENS, load_std, step_gradients
from xdsl.dialects import test as xdsl_test
from xdsl.utils.exceptions import VerifyException

from modeldsl.dialects.graph_primitives import FusedSplitSwigluOp
from modeldsl.dialects.graph_types import TensorType
from modeldsl.dialects.sched import GemmOp, LaunchOp
from modeldsl.passes.fuse import PATTERNS, FusePass
from modeldsl.runtime.train import compile_training_step

pytest.importorskip("transformers")

GATED_MLP_ONLY = FusePass(disable=tuple(name for name in PATTERNS if name != "gated_mlp"))


def gradients(model, program) -> tuple[float, np.ndarray]:
    return step_gradients(model, program, ignored=3)


def launches(program) -> Counter:
    return Counter(op.kernel.data for op in program.walk() if isinstance(op, LaunchOp))


def gemms(program) -> int:
    return sum(isinstance(op, GemmOp) for op in program.walk())


@pytest.mark.parametrize("arch, module, config", FAMILIES, ids=FAMILY_IDS)
def test_gated_mlp_alone_is_bitwise_and_drops_the_concat(arch, module, config):
    model = load_std(arch, module, config)
    off = compile_training_step(model.model, BATCH, TOKENS, fuse=False)
    fused = compile_training_step(model.model, BATCH, TOKENS, fuse=GATED_MLP_ONLY)
    before, after = launches(off), launches(fused)
    assert after["fused_split_swiglu"] == 2 and after["fused_split_swiglu_backward"] == 1  # forward, replay; backward
    assert after["swiglu"] == after["swiglu_backward"] == after["split"] == 0
    assert after["concat"] == before["concat"] - 1  # the layer body's d_gate_up concat
    assert gemms(fused) == gemms(off)  # the projection is one GEMM either way: its whole gate_up is saved
    (loss, grads), (fused_loss, fused_grads) = gradients(model, off), gradients(model, fused)
    assert fused_loss == loss and np.array_equal(fused_grads, grads)


def test_the_fused_op_refuses_a_gate_up_that_is_not_twice_the_gated_width():
    gate_up = xdsl_test.TestOp(result_types=[TensorType([4, 10], "fp32")]).results[0]
    op = FusedSplitSwigluOp(operands=[gate_up], result_types=[TensorType([4, 6], "fp32")])
    with pytest.raises(VerifyException, match="twice the gated width"):
        op.verify()
