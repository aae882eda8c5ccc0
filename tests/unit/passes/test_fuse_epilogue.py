"""GEMM epilogues end to end: a Module DSL MLP with bias + GELU and bias + ReLU layers trains to the
same loss and gradients with ``linear_bias_act``/``bias_activation`` on as off on the CPU executor
(bitwise with only these patterns on: the GEMM, the bias, the activation in the same order), and
to PyTorch's; the fused step runs the bias, GELU (saving its input) and ReLU in its GEMMs, and
the backward's GELU gradient and bias gradients as dgelu_bgrad/bgrada epilogues."""

from pathlib import Path

import numpy as np
import pytest

import modeldsl
from modeldsl.dialects.sched import GemmOp, LaunchOp
from modeldsl.passes.fuse import PATTERNS, FusePass
from modeldsl.runtime.sched_executor import ScheduleExecutor
from modeldsl.runtime.train import compile_training_step

torch = pytest.importorskip("torch")

MLP = Path(__file__).with_name("bias_mlp.module")  # embedding, bias + GELU, bias + ReLU, LM head
BATCH, TOKENS = 2, 8
EPILOGUE_PATTERNS = ("linear_bias_act", "bias_activation")
ONLY_EPILOGUES = FusePass(disable=tuple(p for p in PATTERNS if p not in EPILOGUE_PATTERNS))


@pytest.fixture(scope="module")
def model():
    loaded = modeldsl.load(MLP, dtype="fp32")
    rng = np.random.default_rng(3)
    for name in ("b1", "b2"):  # biases large enough that ReLU and GELU see both signs
        loaded.weights[name] = rng.standard_normal(loaded.weights[name].shape).astype(np.float32) * 0.5
    for name in ("w1", "w2", "lm_head", "embedding"):
        loaded.weights[name] = rng.standard_normal(loaded.weights[name].shape).astype(np.float32) * 0.4
    return loaded


def batch() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 32, size=(BATCH, TOKENS)).astype(np.int32)
    labels = rng.integers(0, 32, size=(BATCH, TOKENS)).astype(np.int64)
    labels[0, :2] = -100
    return tokens, labels


def step(model, program) -> tuple[float, dict[str, np.ndarray]]:
    """The loss and each parameter's gradient of one training step on the CPU executor."""
    executor = ScheduleExecutor(program, model.weights)
    executor.arenas["grads"][:] = 0
    tokens, labels = batch()
    (loss,) = executor.execute(*model.inputs(tokens, 0), labels, np.array(1.0, dtype=np.float32))
    return float(loss), {name: view.copy() for name, view in executor.grads.items()}


def epilogues(program) -> list[str]:
    return [op.epilogue.data for op in program.walk() if isinstance(op, GemmOp)]


def kernels(program) -> set[str]:
    return {op.kernel.data for op in program.walk() if isinstance(op, LaunchOp)}


def torch_step(model) -> tuple[float, dict[str, np.ndarray]]:
    params = {n: torch.tensor(v, dtype=torch.float64, requires_grad=True) for n, v in model.weights.items()}
    tokens, labels = batch()
    x = params["embedding"][torch.from_numpy(tokens).long()]
    a1 = torch.nn.functional.gelu(x @ params["w1"].T + params["b1"], approximate="tanh")
    a2 = torch.relu(a1 @ params["w2"].T + params["b2"])
    logits = a2 @ params["lm_head"].T
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 32), torch.from_numpy(labels).reshape(-1),
                                             ignore_index=-100)
    loss.backward()
    return float(loss.detach()), {n: p.grad.numpy() for n, p in params.items()}


def test_the_fused_step_runs_bias_and_activations_in_its_gemms(model):
    fused = compile_training_step(model.model, BATCH, TOKENS, fuse=ONLY_EPILOGUES)
    unfused = compile_training_step(model.model, BATCH, TOKENS, fuse=False)
    assert {"gelu_aux_bias", "relu_bias", "dgelu_bgrad", "bgrada"} <= set(epilogues(fused))
    assert not kernels(fused) & {"bias_add", "gelu", "relu"}
    assert {"bias_add", "gelu", "relu"} <= kernels(unfused)


def test_fusion_keeps_the_training_step_bitwise(model):
    loss, grads = step(model, compile_training_step(model.model, BATCH, TOKENS, fuse=False))
    fused_loss, fused_grads = step(model, compile_training_step(model.model, BATCH, TOKENS, fuse=ONLY_EPILOGUES))
    assert fused_loss == loss
    for name in grads:
        np.testing.assert_array_equal(fused_grads[name], grads[name], err_msg=name)


@pytest.mark.parametrize("fuse", [False, True], ids=["unfused", "all-patterns"])
def test_the_training_step_matches_pytorch(model, fuse):
    loss, grads = step(model, compile_training_step(model.model, BATCH, TOKENS, fuse=fuse))
    want_loss, want = torch_step(model)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
    assert np.abs(grads["b1"]).max() > 0 and np.abs(grads["b2"]).max() > 0
    for name in want:
        np.testing.assert_allclose(grads[name], want[name], rtol=2e-4, atol=2e-6, err_msg=name)


def test_recompute_replays_the_fused_forward_to_the_same_gradients(model):
    """With every op replayed in the backward the fused step's gradients stay bitwise."""
    plain = step(model, compile_training_step(model.model, BATCH, TOKENS, recompute="none", fuse=ONLY_EPILOGUES))
    full = step(model, compile_training_step(model.model, BATCH, TOKENS, recompute="full", fuse=ONLY_EPILOGUES))
    assert full[0] == plain[0]
    for name in plain[1]:
        np.testing.assert_array_equal(full[1][name], plain[1][name], err_msg=name)
