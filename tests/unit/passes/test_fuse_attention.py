"""mdsl-fuse's attention patterns on the CPU: a small model that writes attention out (projections,
heads, q k^T, scale, softmax, p v) runs, with fusion on, one non-causal flash_attention and no
softmax, and gives the written-out model's output within a few fp32 ulps (flash_attention normalizes
with the log-sum-exp) and PyTorch's scaled_dot_product_attention; attention_softmax alone (the scale
in the scores GEMM's alpha) is bitwise the written-out model in fp32; the gradient of the fused model
(flash_attention's and alpha's VJP rules) is the written-out model's in float64."""

import numpy as np
import pytest
from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp

import modeldsl
from modeldsl.dialects.graph import ModelOp
from modeldsl.dialects.sched import AttentionOp, LaunchOp
from modeldsl.passes.autodiff import gradient_function
from modeldsl.passes.fuse import FusePass
from modeldsl.passes.lower_to_sched import lower_function
from modeldsl.passes.specialize import SpecializePass
from modeldsl.runtime.executor import GraphExecutor
from modeldsl.runtime.profiles import plan
from modeldsl.runtime.sched_executor import run_program

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
