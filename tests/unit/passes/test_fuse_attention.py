"""mdsl-fuse's attention patterns on the CPU: a small model that writes attention out (projections,
heads, q k^T, scale, softmax, p v) runs, with fusion on, one non-causal flash_attention and no
softmax, and gives the written-out model's output within a few fp32 ulps (flash_attention normalizes
with the log-sum-exp) and PyTorch's scaled_dot_product_attention; attention_softmax alone (the scale
in the scores GEMM's alpha) is bitwise the written-out model in fp32; the gradient of the fused model
(flash_attention's and alpha's VJP rules) is the written-out model's in float64.

Causal: the same model with a causal_mask() (or a causal_mask(window_size=3)) between the scale and
the softmax runs one causal flash_attention (its window) and gives the written-out results and
PyTorch's (scaled_dot_product_attention(is_causal=True), or its boolean window mask); a mask at
another offset stays written out; a written-out causal LM's training step (dag_attention before
autodiff) differentiates flash_attention to the unfused step's loss and gradients and PyTorch's."""

import numpy as np
import pytest
from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp

import modeldsl
from modeldsl.dialects.graph import ModelOp
from modeldsl.dialects.sched import AttentionBackwardOp, AttentionOp, LaunchOp
from modeldsl.graph_builder import op_attr
from modeldsl.passes.autodiff import gradient_function
from modeldsl.passes.fuse import FusePass
from modeldsl.passes.lower_to_sched import lower_function
from modeldsl.passes.specialize import SpecializePass
from modeldsl.runtime.executor import GraphExecutor
from modeldsl.runtime.profiles import plan
from modeldsl.runtime.sched_executor import ScheduleExecutor, run_program
from modeldsl.runtime.train import compile_training_step

torch = pytest.importorskip("torch")
F = torch.nn.functional

D, HEADS, HEAD_DIM, BATCH, TOKENS = 16, 2, 8, 2, 5
SOURCE = f"""module WrittenAttention(d: int = {D}, h: int = {HEADS}, dh: int = {HEAD_DIM}):
  params:
    wq: [d, d]
    wk: [d, d]
    wv: [d, d]
  forward:
    in: x: [B, T, d]
    out: [B, T, d]
    graph:
      x -> matmul(wq, transpose=NT) -> view([B, T, h, dh]) -> transpose(1, 2) -> q
      x -> matmul(wk, transpose=NT) -> view([B, T, h, dh]) -> transpose(1, 2) -> k
      x -> matmul(wv, transpose=NT) -> view([B, T, h, dh]) -> transpose(1, 2) -> v
      (q, k) -> batched_matmul(transpose=NT) -> s
      s -> scale(factor=1.0 / sqrt(dh)) -> ss
      ss -> softmax() -> p
      (p, v) -> batched_matmul() -> o
      o -> transpose(1, 2) -> view([B, T, d]) -> out
"""


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("attention") / "written_attention.module"
    path.write_text(SOURCE)
    return modeldsl.load(path, dtype="fp32").model


def specialized(model: ModelOp, fuse: FusePass | None) -> ModelOp:
    module = ModuleOp([model.clone()])
    SpecializePass.of(B=BATCH, T=TOKENS).apply(Context(), module)
    if fuse is not None:
        fuse.apply(Context(), module)
    return next(op for op in module.body.block.ops if isinstance(op, ModelOp))


def program(model: ModelOp, fuse: FusePass | None):
    return plan(lower_function(specialized(model, fuse), "forward", "fp32"))


def kernels(program) -> list[str]:
    return [op.kernel.data for op in program.walk() if isinstance(op, LaunchOp)]


def attentions(program) -> int:
    return sum(isinstance(op, AttentionOp) for op in program.walk())


def inputs(seed: int = 0) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((BATCH, TOKENS, D)).astype(np.float32)
    weights = {name: (rng.standard_normal((D, D)) / np.sqrt(D)).astype(np.float32) for name in ("wq", "wk", "wv")}
    return x, weights


def torch_attention(x: np.ndarray, weights: dict[str, np.ndarray]) -> np.ndarray:
    """The model in PyTorch (float64): projections, heads, scaled_dot_product_attention (non-causal)."""
    tx = torch.from_numpy(x).double()
    q, k, v = (F.linear(tx, torch.from_numpy(weights[n]).double()).view(BATCH, TOKENS, HEADS, HEAD_DIM).transpose(1, 2)
               for n in ("wq", "wk", "wv"))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=False)
    return out.transpose(1, 2).reshape(BATCH, TOKENS, D).numpy()


def test_the_fused_forward_runs_flash_attention_and_gives_the_written_out_results(model):
    x, weights = inputs()
    unfused, fused = program(model, None), program(model, FusePass())
    assert "softmax" in kernels(unfused) and attentions(unfused) == 0
    assert "softmax" not in kernels(fused) and "scale" not in kernels(fused) and attentions(fused) == 1
    (want,), (got,) = run_program(unfused, weights, [x]), run_program(fused, weights, [x])
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got, torch_attention(x, weights), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(want, torch_attention(x, weights), rtol=1e-6, atol=1e-6)


def test_attention_softmax_alone_is_bitwise_the_written_out_model(model):
    x, weights = inputs(1)
    unfused = program(model, None)
    alpha = program(model, FusePass(disable=("dag_attention",)))
    assert "scale" in kernels(unfused) and "scale" not in kernels(alpha) and "softmax" in kernels(alpha)
    (want,), (got,) = run_program(unfused, weights, [x]), run_program(alpha, weights, [x])
    np.testing.assert_array_equal(got, want)


def test_the_gradient_of_the_fused_model_is_the_written_out_models(model):
    """Autodiff of the fused graph (flash_attention's VJP rule, causal=false, softmax_scale) against
    autodiff of the written-out attention, float64; and of the alpha-scaled scores GEMM."""
    x, weights = inputs(2)
    x, weights = x.astype(np.float64), {k: v.astype(np.float64) for k, v in weights.items()}
    d_out = np.random.default_rng(3).standard_normal(x.shape)
    results = {}
    for name, fuse in (("off", None), ("flash", FusePass()), ("alpha", FusePass(disable=("dag_attention",)))):
        graph = specialized(model, fuse)
        assert any(op.name == "mdsl.graph.flash_attention" for op in graph.walk()) == (name == "flash")
        grad = gradient_function(graph)
        results[name] = GraphExecutor(graph, weights, float_dtype=np.float64).run(grad.sym_name.data, x, d_out)
    for name in ("flash", "alpha"):
        for got, want in zip(results[name], results["off"], strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


def test_after_autodiff_the_written_out_attention_stays_but_its_scale_folds(model):
    """After autodiff the backward reads the probabilities: dag_attention keeps them (a training
    step runs it before autodiff), the scale of the scores still goes into their GEMM's alpha."""
    graph = specialized(model, None)
    grad = gradient_function(graph)
    FusePass().apply(Context(), graph.parent_op())
    names = [op.name.removeprefix("mdsl.graph.") for op in grad.walk()]
    assert "flash_attention" not in names and "softmax" in names and "softmax_backward" in names
    scores = [op for op in grad.walk() if op.name == "mdsl.graph.batched_matmul" and "alpha" in op.attributes]
    assert scores, "the forward's scale went into the scores GEMM"


# ----------------------------------------------------------------------------
# causal attention: causal_mask between the scale and the softmax
# ----------------------------------------------------------------------------

CAUSAL_SOURCE = SOURCE.replace("module WrittenAttention", "module WrittenCausalAttention").replace(
    "ss -> softmax() -> p", "ss -> causal_mask(MASK) -> softmax() -> p")

CAUSAL_LM = f"""model WrittenCausalLm(vocab_size: int = 32, d: int = {D}, h: int = {HEADS}, dh: int = {HEAD_DIM}):
  \"\"\"An embedding, one written-out causal attention (q k^T, scale, causal_mask, softmax, p v), its
  output projection and residual, an LM head.\"\"\"
  params:
    embedding: [vocab_size, d]
    wq: [d, d]
    wk: [d, d]
    wv: [d, d]
    wo: [d, d]
    lm_head: [vocab_size, d]

  forward:
    inputs:
      tokens: [B, T, int32]
    out: logits: [B, T, vocab_size]
    graph:
      (tokens, embedding) -> embedding() -> x
      x -> matmul(wq, transpose=NT) -> view([B, T, h, dh]) -> transpose(1, 2) -> q
      x -> matmul(wk, transpose=NT) -> view([B, T, h, dh]) -> transpose(1, 2) -> k
      x -> matmul(wv, transpose=NT) -> view([B, T, h, dh]) -> transpose(1, 2) -> v
      (q, k) -> batched_matmul(transpose=NT) -> s
      s -> scale(factor=1.0 / sqrt(dh)) -> causal_mask() -> softmax() -> p
      (p, v) -> batched_matmul() -> o
      o -> transpose(1, 2) -> view([B, T, d]) -> matmul(wo, transpose=NT) -> y
      (x, y) -> add() -> r
      r -> matmul(lm_head, transpose=NT) -> logits
"""
VOCAB = 32


def load_source(tmp_path_factory, name: str, source: str):
    path = tmp_path_factory.mktemp("causal") / f"{name}.module"
    path.write_text(source)
    return modeldsl.load(path, dtype="fp32")


@pytest.fixture(scope="module", params=[None, 3], ids=["causal", "window"])
def causal_model(request, tmp_path_factory):
    """(the model, its mask's window) with a causal_mask() or a causal_mask(window_size=3)."""
    mask = "" if request.param is None else f"window_size={request.param}"
    return load_source(tmp_path_factory, f"causal_{request.param}", CAUSAL_SOURCE.replace("MASK", mask)), request.param


def flash_attentions(graph) -> list:
    return [op for op in graph.walk() if op.name == "mdsl.graph.flash_attention"]


def torch_causal_attention(x: np.ndarray, weights: dict[str, np.ndarray], window: int | None) -> np.ndarray:
    """The model in PyTorch (float64): scaled_dot_product_attention(is_causal=True), or with a sliding
    window its boolean mask (query i sees keys i - window < j <= i)."""
    tx = torch.from_numpy(x).double()
    q, k, v = (F.linear(tx, torch.from_numpy(weights[n]).double()).view(BATCH, TOKENS, HEADS, HEAD_DIM).transpose(1, 2)
               for n in ("wq", "wk", "wv"))
    if window is None:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    else:
        i, j = torch.arange(TOKENS)[:, None], torch.arange(TOKENS)[None, :]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=(j <= i) & (i - j < window))
    return out.transpose(1, 2).reshape(BATCH, TOKENS, D).numpy()


def test_the_causal_forward_runs_causal_flash_attention_and_gives_the_written_out_results(causal_model):
    loaded, window = causal_model
    model = loaded.model
    (fused_attention,) = flash_attentions(specialized(model, FusePass()))
    assert op_attr(fused_attention, "causal") is True and op_attr(fused_attention, "window_size") == window
    x, weights = inputs(4)
    unfused, fused = program(model, None), program(model, FusePass())
    assert "causal_mask" in kernels(unfused) and attentions(unfused) == 0
    assert {"causal_mask", "softmax", "scale"}.isdisjoint(kernels(fused)) and attentions(fused) == 1
    (want,), (got,) = run_program(unfused, weights, [x]), run_program(fused, weights, [x])
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got, torch_causal_attention(x, weights, window), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(want, torch_causal_attention(x, weights, window), rtol=1e-6, atol=1e-6)


def test_a_mask_at_another_offset_stays_written_out(tmp_path_factory):
    """offset 1 lets each query see the next key: no flash_attention computes that."""
    loaded = load_source(tmp_path_factory, "offset", CAUSAL_SOURCE.replace("MASK", "offset=1"))
    graph = specialized(loaded.model, FusePass())
    assert not flash_attentions(graph) and any(op.name == "mdsl.graph.causal_mask" for op in graph.walk())


@pytest.fixture(scope="module")
def causal_lm(tmp_path_factory):
    loaded = load_source(tmp_path_factory, "causal_lm", CAUSAL_LM)
    rng = np.random.default_rng(5)
    for name, value in loaded.weights.items():
        loaded.weights[name] = (rng.standard_normal(value.shape) * 0.4).astype(np.float32)
    return loaded


def lm_batch() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, VOCAB, size=(BATCH, TOKENS)).astype(np.int32)
    return tokens, rng.integers(0, VOCAB, size=(BATCH, TOKENS)).astype(np.int64)


def training_step(loaded, program) -> tuple[float, dict[str, np.ndarray]]:
    """The loss and each parameter's gradient of one fp32 training step on the CPU executor."""
    executor = ScheduleExecutor(program, loaded.weights)
    executor.arenas["grads"][:] = 0
    tokens, labels = lm_batch()
    (loss,) = executor.execute(*loaded.inputs(tokens, 0), labels, np.array(1.0, dtype=np.float32))
    return float(loss), {name: view.copy() for name, view in executor.grads.items()}


def torch_training_step(loaded) -> tuple[float, dict[str, np.ndarray]]:
    """The causal LM's loss and gradients in PyTorch (float64, scaled_dot_product_attention(is_causal=True))."""
    params = {n: torch.tensor(v, dtype=torch.float64, requires_grad=True) for n, v in loaded.weights.items()}
    tokens, labels = lm_batch()
    x = params["embedding"][torch.from_numpy(tokens).long()]
    q, k, v = ((x @ params[n].T).view(BATCH, TOKENS, HEADS, HEAD_DIM).transpose(1, 2) for n in ("wq", "wk", "wv"))
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(BATCH, TOKENS, D)
    logits = (x + o @ params["wo"].T) @ params["lm_head"].T
    loss = F.cross_entropy(logits.reshape(-1, VOCAB), torch.from_numpy(labels).reshape(-1))
    loss.backward()
    return float(loss.detach()), {n: p.grad.numpy() for n, p in params.items()}


def test_a_training_step_differentiates_causal_flash_attention_to_the_written_out_gradients(causal_lm):
    """compile_training_step runs dag_attention before autodiff: the step's forward and backward are
    flash_attention's (causal), no softmax or mask kernel; loss and gradients are the unfused step's
    within fp32 rounding (log-sum-exp normalization, the flash backward's order), both PyTorch's."""
    unfused = compile_training_step(causal_lm.model, BATCH, TOKENS, fuse=False)
    fused = compile_training_step(causal_lm.model, BATCH, TOKENS, fuse=FusePass(only=("dag_attention",)))
    assert {"causal_mask", "softmax", "softmax_backward"} <= set(kernels(unfused)) and attentions(unfused) == 0
    assert {"causal_mask", "softmax", "softmax_backward"}.isdisjoint(kernels(fused)) and attentions(fused) == 1
    (forward,) = [op for op in fused.walk() if isinstance(op, AttentionOp)]
    (backward,) = [op for op in fused.walk() if isinstance(op, AttentionBackwardOp)]
    assert op_attr(forward, "causal") is True and op_attr(backward, "causal") is True
    loss, grads = training_step(causal_lm, unfused)
    fused_loss, fused_grads = training_step(causal_lm, fused)
    assert fused_loss == pytest.approx(loss, rel=1e-6)
    assert grads.keys() == fused_grads.keys()
    torch_loss, torch_grads = torch_training_step(causal_lm)
    assert loss == pytest.approx(torch_loss, rel=1e-6)
    for name, grad in grads.items():
        np.testing.assert_allclose(fused_grads[name], grad, rtol=1e-5, atol=1e-6, err_msg=name)
        np.testing.assert_allclose(grad, torch_grads[name], rtol=1e-5, atol=1e-6, err_msg=name)
        assert np.abs(grad).max() > 0, name
