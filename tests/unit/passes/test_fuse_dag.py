"""mdsl-fuse's DAG patterns on the CPU: a small model that writes GELU, SiLU, softmax or RMSNorm
out op by op runs, with fusion on, the one primitive instead of the chain, and gives the written-out
results (bitwise in fp32 where the primitive's arithmetic is the chain's, within about an ulp of x
for GELU, whose reference cubes with a power), and PyTorch's; the gradient of the fused model is the
written-out model's."""

import numpy as np
import pytest
from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp

import modeldsl
from modeldsl.dialects.graph import ModelOp
from modeldsl.dialects.sched import LaunchOp
from modeldsl.passes.autodiff import gradient_function
from modeldsl.passes.fuse import FusePass
from modeldsl.passes.lower_to_sched import lower_function
from modeldsl.passes.specialize import SpecializePass
from modeldsl.runtime.executor import GraphExecutor
from modeldsl.runtime.profiles import compile_profile, plan
from modeldsl.runtime.sched_executor import run_program

torch = pytest.importorskip("torch")
F = torch.nn.functional

D, BATCH, TOKENS, EPS = 16, 2, 3, 1e-5
HEADER = f"""module Written(d: int = {D}):
  params:
    g: [d]
  forward:
    in: x: [B, T, d]
    out: [B, T, d]
    graph:
"""
BODIES = {
    "gelu": """\
      (x, x) -> mul() -> x2
      (x, x2) -> mul() -> x3
      x3 -> scale(factor=0.044715) -> c3
      (c3, x) -> add() -> inner
      inner -> scale(factor=0.7978845608028654) -> u
      u -> tanh() -> t
      t -> add_scalar(value=1.0) -> t1
      x -> scale(factor=0.5) -> hx
      (hx, t1) -> mul() -> y
      (y, g) -> mul() -> out
""",
    "silu": """\
      x -> sigmoid() -> s
      (s, x) -> mul() -> y
      (y, g) -> mul() -> out
""",
    "softmax": """\
      x -> reduce_max(dim=-1, keepdim=true) -> (m, mi)
      (x, m) -> sub() -> z
      z -> exp() -> e
      e -> reduce_sum(dims=[-1], keepdim=true) -> s
      (e, s) -> div() -> y
      (y, g) -> mul() -> out
""",
    "rmsnorm": f"""\
      (x, x) -> mul() -> sq
      sq -> reduce_mean(dims=[-1], keepdim=true) -> v
      v -> add_scalar(value={EPS}) -> ve
      ve -> rsqrt() -> r
      (x, r) -> mul() -> n
      (n, g) -> mul() -> out
""",
}
CHAINS = {"gelu": "tanh", "silu": "sigmoid", "softmax": "exp", "rmsnorm": "rsqrt"}


def torch_function(name: str, x, g):
    """PyTorch's function (HF's LlamaRMSNorm for rmsnorm), times ``g`` as the model multiplies."""
    if name == "rmsnorm":
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * g
    fn = {"gelu": lambda v: F.gelu(v, approximate="tanh"), "silu": F.silu, "softmax": lambda v: F.softmax(v, -1)}
    return fn[name](x) * g


def written(tmp_path, name: str):
    path = tmp_path / f"{name}.module"
    path.write_text(HEADER + BODIES[name])
    return modeldsl.load(path, dtype="fp32")


def specialized(model: ModelOp, fuse: bool) -> ModelOp:
    module = ModuleOp([model.clone()])
    SpecializePass.of(B=BATCH, T=TOKENS).apply(Context(), module)
    if fuse:
        FusePass().apply(Context(), module)
    return next(op for op in module.body.block.ops if isinstance(op, ModelOp))


def kernels(program) -> list[str]:
    return [op.kernel.data for op in program.walk() if isinstance(op, LaunchOp)]


def inputs(seed: int = 0) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    x = (3 * rng.standard_normal((BATCH, TOKENS, D))).astype(np.float32)
    return x, {"g": (1 + 0.1 * rng.standard_normal(D)).astype(np.float32)}


@pytest.mark.parametrize("name", sorted(BODIES))
def test_the_fused_forward_runs_the_primitive_and_gives_the_written_out_results(tmp_path, name, numpy_cpu_kernels):
    model = written(tmp_path, name)
    x, weights = inputs()
    unfused = plan(lower_function(specialized(model.model, fuse=False), "forward", "fp32"))
    fused = compile_profile(model.model, BATCH, TOKENS, "fp32")
    assert CHAINS[name] in kernels(unfused) and name not in kernels(unfused)
    assert name in kernels(fused) and CHAINS[name] not in kernels(fused)
    assert len(kernels(fused)) == (1 if name == "rmsnorm" else 2)  # the multiply by g (rmsnorm's weight)
    (want,), (got,) = run_program(unfused, weights, [x]), run_program(fused, weights, [x])
    if name == "gelu":
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-7 * np.abs(x).max())  # ~ an ulp of x
    else:
        np.testing.assert_array_equal(got, want)
    expected = torch_function(name, torch.from_numpy(x).double(), torch.from_numpy(weights["g"]).double())
    np.testing.assert_allclose(got, expected.numpy(), rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("name", sorted(BODIES))
def test_the_gradient_of_the_fused_model_is_the_written_out_models(tmp_path, name):
    """Autodiff of the fused graph (the primitive's VJP rule) against autodiff of the chain, float64."""
    model = written(tmp_path, name)
    x, weights = inputs(1)
    x, weights = x.astype(np.float64), {k: v.astype(np.float64) for k, v in weights.items()}
    d_out = np.random.default_rng(2).standard_normal(x.shape)
    results = []
    for fuse in (False, True):
        graph = specialized(model.model, fuse)
        assert any(op.name == f"mdsl.graph.{name}" for op in graph.walk()) == fuse
        grad = gradient_function(graph)
        results.append(GraphExecutor(graph, weights, float_dtype=np.float64).run(grad.sym_name.data, x, d_out))
    for got, want in zip(results[1], results[0], strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
