"""The Python DSL's section 13 examples, as printed (but for the package name), each a test: they
import as Python, lower, and give the IR of their Module DSL twins."""

from __future__ import annotations

import importlib.util
import sys
import textwrap

import pytest

from tests.unit.frontend.python.twins import assert_twins

LINEAR = '''
from modeldsl.dsl import module, forward, save, Param, Tensor, graph, Dim, B, T

@module
class Linear:
    """Linear projection: y = x @ W^T (+ bias)."""

    def __init__(self, in_dim: int, out_dim: int, use_bias: bool = False):
        self.in_dim = in_dim
        self.out_dim = out_dim
        self.use_bias = use_bias
        self.C = Dim("in_dim")
        self.O = Dim("out_dim")

    weight = Param(Tensor["O", "C"])
    bias = Param(Tensor["O"], when="use_bias")

    @save("x")
    @forward
    def forward(self, x: Tensor["B", "T", "C"]) -> Tensor["B", "T", "O"]:
        with graph() as g:
            x_flat = g.view(x, shape=[B * T, self.C])
            if self.use_bias:
                y_flat = g.matmul_bias(x_flat, "weight", "bias", transpose="NT")
            else:
                y_flat = g.matmul(x_flat, "weight", transpose="NT")
            y = g.view(y_flat, shape=[B, T, self.O])
            return y
'''

LINEAR_TWIN = '''
module Linear(in_dim: int, out_dim: int, use_bias: bool = false):
  """Linear projection: y = x @ W^T (+ bias)."""
  params:
    weight: [out_dim, in_dim]
    bias: [out_dim] if use_bias
  forward:
    inputs:
      x: [B, T, in_dim]
    out: y: [B, T, out_dim]
    graph:
      x -> view(shape=[B * T, in_dim]) -> x_flat
      if use_bias:
        (x_flat, weight) -> matmul(transpose=NT) -> bias_add(bias) -> y_flat
      else:
        (x_flat, weight) -> matmul(transpose=NT) -> y_flat
      y_flat -> view(shape=[B, T, out_dim]) -> y
    save: [x]
'''

RMSNORM = '''
from modeldsl.dsl import module, forward, Param, Tensor, graph

@module
class RMSNorm:
    """Root Mean Square Layer Normalization."""

    def __init__(self, d_model: int, eps: float = 1e-6):
        self.d_model = d_model
        self.eps = eps

    weight = Param(Tensor["d_model"])

    @forward
    def forward(self, x: Tensor["B", "T", "d_model"]) -> Tensor["B", "T", "d_model"]:
        with graph() as g:
            y, rstd = g.rmsnorm(x, "weight", eps=self.eps)
            return y
'''

RMSNORM_TWIN = '''
module RMSNorm(d_model: int, eps: float = 1e-6):
  """Root Mean Square Layer Normalization."""
  params:
    weight: [d_model]
  forward:
    inputs:
      x: [B, T, d_model]
    out: y: [B, T, d_model]
    graph:
      (x, weight) -> rmsnorm(eps=eps) -> (y, rstd)
'''

SWIGLU_MLP = '''
from modeldsl.dsl import module, forward, save, Param, Tensor, graph, Dim, B, T

@module
class SwiGLUMLP:
    """SwiGLU MLP: down(swiglu(up(x)))."""

    def __init__(self, d_model: int, d_ff: int):
        self.d_model = d_model
        self.d_ff = d_ff
        self.C = Dim("d_model")
        self.M = Dim("d_ff")

    # up_weight is [2*d_ff, d_model] for fused gate+up
    up_weight = Param(Tensor["2 * M", "C"])
    down_weight = Param(Tensor["C", "M"])

    @save("x", "up")
    @forward
    def forward(self, x: Tensor["B", "T", "C"]) -> Tensor["B", "T", "C"]:
        with graph() as g:
            x_flat = g.view(x, shape=[B * T, self.C])
            up_flat = g.matmul(x_flat, "up_weight", transpose="NT")
            up = g.view(up_flat, shape=[B, T, 2 * self.M])
            act = g.swiglu(up)
            act_flat = g.view(act, shape=[B * T, self.M])
            out_flat = g.matmul(act_flat, "down_weight", transpose="NT")
            out = g.view(out_flat, shape=[B, T, self.C])
            return out
'''

SWIGLU_MLP_TWIN = '''
module SwiGLUMLP(d_model: int, d_ff: int):
  """SwiGLU MLP: down(swiglu(up(x)))."""
  params:
    up_weight: [2 * d_ff, d_model]
    down_weight: [d_model, d_ff]
  forward:
    inputs:
      x: [B, T, d_model]
    out: [B, T, d_model]
    graph:
      x -> view(shape=[B * T, d_model]) -> x_flat
      (x_flat, up_weight) -> matmul(transpose=NT) -> up_flat
      up_flat -> view(shape=[B, T, 2 * d_ff]) -> up
      up -> fused_split_swiglu() -> act
      act -> view(shape=[B * T, d_ff]) -> act_flat
      (act_flat, down_weight) -> matmul(transpose=NT) -> out_flat
      out_flat -> view(shape=[B, T, d_model]) -> out
    save: [x, up]
'''

EXAMPLES = {
    "13.1 Linear": (LINEAR, LINEAR_TWIN, "Linear", [{"in_dim": 4, "out_dim": 6, "use_bias": True},
                                                     {"in_dim": 4, "out_dim": 6}]),
    "13.2 RMSNorm": (RMSNORM, RMSNORM_TWIN, "RMSNorm", [{"d_model": 8}]),
    "13.3 SwiGLUMLP": (SWIGLU_MLP, SWIGLU_MLP_TWIN, "SwiGLUMLP", [{"d_model": 8, "d_ff": 16}]),
}


@pytest.mark.parametrize("example", EXAMPLES)
def test_each_example_lowers_to_the_ir_of_its_module_dsl_twin(example, tmp_path):
    python, text, top, configs = EXAMPLES[example]
    for config in configs:
        ir = assert_twins(tmp_path, python, text, top, config)
        assert f"mdsl.graph.model @{top}" in ir


def test_linear_with_a_bias_adds_it_after_the_product(tmp_path):
    python, text, top, _ = EXAMPLES["13.1 Linear"]
    ir = assert_twins(tmp_path, python, text, top, {"in_dim": 4, "out_dim": 6, "use_bias": True})
    assert "mdsl.graph.bias_add" in ir and "mdsl.graph.matmul" in ir


def test_the_packed_swiglu_reads_gate_then_up_along_the_last_dim(tmp_path):
    python, text, top, configs = EXAMPLES["13.3 SwiGLUMLP"]
    ir = assert_twins(tmp_path, python, text, top, configs[0])
    assert "mdsl.graph.fused_split_swiglu %up" in ir and "[B, T, d_ff]" in ir


def imported(path):
    """The Python module of the file ``path``, imported as ``import`` does (and then forgotten)."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[path.stem]
    return module


@pytest.mark.parametrize("example", EXAMPLES)
def test_each_example_imports_as_python_and_registers_its_class(example, tmp_path, monkeypatch):
    from modeldsl.frontend.python import classes

    monkeypatch.setattr(classes, "REGISTERED", {kind: dict(names) for kind, names in classes.REGISTERED.items()})
    path = tmp_path / f"example_{example.split()[0].replace('.', '_')}.py"
    path.write_text(textwrap.dedent(EXAMPLES[example][0]))
    cls = getattr(imported(path), EXAMPLES[example][2])
    assert cls.__mdsl_kind__ == "module" and cls.__mdsl_file__ == str(path)
    assert classes.REGISTERED["module"][cls.__name__] is cls
