"""mdsl-autodiff uses the written backward of the sub-modules that have one (spec 5.12.6).

A sub-module instance whose module has a ``backward:`` section is lowered to
``call @<path>_forward`` (plus ``@<path>_backward``); the derived gradient of
the model calls the written backward for that part of the graph instead of
deriving it op by op. The tests use a written backward that is deliberately
wrong (d_in doubled) to prove it is the one used, and correct ones against
float64 finite differences.
"""

import numpy as np
import pytest

import modeldsl
from modeldsl.diagnostics import DiagnosticError
from modeldsl.dialects.graph import CallOp, FuncOp
from modeldsl.passes.autodiff import gradient_function
from modeldsl.resolve.imports import STD_ROOT
from modeldsl.runtime.executor import GraphExecutor
from modeldsl.verify_backward import random_weights, report, verify_backward

PROJ = """module Proj(d: int):
  params:
    weight: [d, d]
  forward:
    in: [*, d]
    out: [*, d]
    graph:
      in -> matmul(weight, transpose=NT) -> out
    save: [in]
{backward}"""

DOUBLED = """  backward:
    d_out: [*, d]
    graph:
      (d_out, weight) -> matmul(transpose=NN, alpha=2.0) -> d_in
      (d_out, saved.in) -> matmul(transpose=TN) -> d_weight
"""

CORRECT = DOUBLED.replace(", alpha=2.0", "")

MODEL = """
model M(d: int = 4):
  params:
    v: [d, d]
    proj: Proj(d)
  forward:
    in: x: [2, 3, d]
    out: [2, 3, d]
    graph:
      x -> matmul(v, transpose=NT) -> h
      h -> proj -> y
      y -> silu() -> out
"""

X = np.random.default_rng(0).standard_normal((2, 3, 4))


def load(tmp_path, text, name="m.module", **options):
    path = tmp_path / name
    path.write_text(text)
    return modeldsl.load(path, **options)


def funcs(model):
    return {f.sym_name.data: f for f in model.body.block.ops if isinstance(f, FuncOp)}


def calls(func):
    return [op.callee.root_reference.data for op in func.walk() if isinstance(op, CallOp)]


def gradients(loaded, x=X, seed=1):
    """{parameter or 'input x': gradient} of the derived gradient function, in float64."""
    grad = gradient_function(loaded.model)
    weights = {k: np.random.default_rng(seed).standard_normal(v.shape) for k, v in sorted(loaded.weights.items())}
    executor = GraphExecutor(loaded.model, weights, float_dtype=np.float64)
    (out,) = executor.run("forward", x)
    d_out = np.random.default_rng(seed + 1).standard_normal(out.shape)
    results = executor.run(grad.sym_name.data, x, d_out)
    names = [a.data for a in grad.attributes["grads"].data] + [f"input {a.data}" for a in
                                                              grad.attributes["input_grads"].data]
    return dict(zip(names, results[1:], strict=True))


def test_a_deliberately_wrong_written_backward_is_the_one_the_model_gradient_uses(tmp_path):
    written = load(tmp_path, PROJ.format(backward=DOUBLED) + MODEL, "written.module")
    derived = load(tmp_path, PROJ.format(backward="") + MODEL, "derived.module")
    assert calls(gradient_function(written.model)) == ["proj_backward"]
    assert calls(funcs(derived.model)["forward"]) == []  # no written backward: inlined and derived
    by_written, by_derived = gradients(written), gradients(derived)
    assert set(by_written) == set(by_derived) == {"v", "proj.weight", "input x"}
    # d_h is doubled by the written backward, and so is everything upstream of it
    np.testing.assert_allclose(by_written["proj.weight"], by_derived["proj.weight"], rtol=1e-12)
    np.testing.assert_allclose(by_written["v"], 2 * by_derived["v"], rtol=1e-12)
    np.testing.assert_allclose(by_written["input x"], 2 * by_derived["input x"], rtol=1e-12)
    # and the finite-difference oracle sees the difference where the derived path passes
    checks = {c.name: c for c in verify_backward(written.model, written.weights, [X])}
    assert checks["proj.weight"].relative_error < 1e-6
    assert abs(checks["v"].derived / checks["v"].numerical - 2) < 1e-6
    assert report(verify_backward(derived.model, derived.weights, [X]), 1e-6)[1]


def test_a_correct_written_backward_passes_the_finite_difference_oracle(tmp_path):
    loaded = load(tmp_path, PROJ.format(backward=CORRECT) + MODEL)
    assert "proj_backward" in calls(gradient_function(loaded.model))
    checks = verify_backward(loaded.model, loaded.weights, [X])
    text, ok = report(checks, 1e-6)
    assert ok, text
    assert [c.name for c in checks] == ["v", "proj.weight", "input x"]


def test_std_linear_and_swiglu_mlp_inside_a_model_pass_the_oracle(tmp_path):
    source = """from std.modules.linear import Linear
from std.modules.mlp import SwiGLU_MLP

model M(d: int = 4, f: int = 6):
  params:
    inp: Linear(d, d)
    mlp: SwiGLU_MLP(d, f)
    out_proj: Linear(d, d, bias=true)
  forward:
    in: x: [B, T, d]
    out: [B, T, d]
    graph:
      x -> inp -> h
      h -> mlp -> m
      (x, m) -> add() -> r
      r -> out_proj -> out
"""
    loaded = load(tmp_path, source)
    assert calls(gradient_function(loaded.model)) == ["out_proj_backward", "mlp_backward", "inp_backward"]
    checks = verify_backward(loaded.model, random_weights(loaded.model), [X])
    text, ok = report(checks, 1e-6)
    assert ok, text
    assert {c.name for c in checks} == {"inp.weight", "mlp.up_weight", "mlp.down_weight", "out_proj.weight",
                                        "out_proj.bias", "input x"}
    # Linear's d_out -> reduce_sum(dims=[0]) -> d_bias over d_out: [*, d] sums the axes '*' is here: B and T
    backward = funcs(loaded.model)["out_proj_backward"]
    (reduce,) = [op for op in backward.body.walk() if op.name == "mdsl.graph.reduce_sum"]
    assert list(reduce.attributes["dims"].get_values()) == [0, 1]


def test_instances_of_one_configuration_share_their_functions_and_each_gets_its_gradient(tmp_path):
    source = PROJ.format(backward=CORRECT) + """
module Wide(d: int):
  params:
    weight: [2 * d, d]
  forward:
    in: [*, d]
    out: [*, 2 * d]
    graph:
      in -> matmul(weight, transpose=NT) -> out
    save: [in]
  backward:
    graph:
      (d_out, weight) -> matmul(transpose=NN) -> d_in
      (d_out, saved.in) -> matmul(transpose=TN) -> d_weight

model M(d: int = 4):
  params:
    a: Proj(d)
    b: Proj(d)
    w: Wide(d)
  forward:
    in: x: [2, 3, d]
    out: [2, 3, 2 * d]
    graph:
      x -> a -> h
      h -> b -> g
      (g, x) -> mul() -> k
      k -> w -> out
"""
    loaded = load(tmp_path, source)
    model = loaded.model
    assert calls(funcs(model)["forward"]) == ["a_forward", "a_forward", "w_forward"]
    assert {"a_forward", "a_backward", "w_forward", "w_backward"} <= set(funcs(model))
    assert "b_forward" not in funcs(model)
    assert calls(gradient_function(model)) == ["w_backward", "a_backward", "a_backward"]
    checks = verify_backward(model, loaded.weights, [X])
    text, ok = report(checks, 1e-6)
    assert ok, text
    assert {c.name for c in checks} == {"a.weight", "b.weight", "w.weight", "input x"}


def test_a_module_called_with_a_bound_weight_returns_its_gradient_to_that_tensor(tmp_path):
    source = """from std.modules.linear import Linear

model M(d: int = 4):
  params:
    up: [6, d]
    down: [d, 6]
  forward:
    in: x: [2, 3, d]
    out: [2, 3, d]
    graph:
      x -> Linear(up) -> h
      h -> silu() -> s
      s -> Linear(down) -> out
"""
    loaded = load(tmp_path, source)
    model = loaded.model
    assert calls(funcs(model)["forward"]) == ["Linear_forward", "Linear_2_forward"]
    assert calls(gradient_function(model)) == ["Linear_2_backward", "Linear_backward"]
    text, ok = report(verify_backward(model, loaded.weights, [X]), 1e-6)
    assert ok, text


def test_frozen_parameters_and_skipped_inputs_of_a_sub_module_get_no_gradient(tmp_path):
    source = """module Gate(d: int):
  params:
    weight: [d, d] @frozen
    scale: [d]
  forward:
    in: (x: [*, d], mask: [*, d] @gradient(skip))
    out: [*, d]
    graph:
      x -> matmul(weight, transpose=NT) -> h
      (h, mask) -> mul() -> hm
      (hm, scale) -> mul() -> out
    save: [hm, mask]
  backward:
    graph:
      (d_out, saved.hm) -> mul() -> prod
      prod -> reduce_sum(dims=[0, 1]) -> d_scale
      (d_out, scale) -> mul() -> d_hm
      (d_hm, saved.mask) -> mul() -> d_h
      (d_h, weight) -> matmul(transpose=NN) -> d_x

model M(d: int = 4):
  params:
    v: [d, d]
    gate: Gate(d)
  forward:
    in: x: [2, 3, d]
    out: [2, 3, d]
    graph:
      x -> matmul(v, transpose=NT) -> m
      (x, m) -> gate -> out
"""
    loaded = load(tmp_path, source)
    model = loaded.model
    backward = funcs(model)["gate_backward"]
    assert [a.data for a in backward.attributes["grads"].data] == ["d_x", "d_scale"]
    assert list(backward.attributes["grad_args"].get_values()) == [0, 3]  # x; (mask, weight,) scale
    grad = gradient_function(model)
    assert [a.data for a in grad.attributes["grads"].data] == ["v", "gate.scale"]  # v: zeros (mask skipped)
    by_written = gradients(loaded)
    assert not by_written["v"].any()
    checks = {c.name: c for c in verify_backward(model, loaded.weights, [X])}
    assert checks["gate.scale"].relative_error < 1e-6  # (x's check sees the mask's skipped path too)


def test_an_output_no_gradient_reaches_gets_zeros_and_a_passed_through_input_its_own_value(tmp_path):
    source = """module Two(d: int):
  params:
    weight: [d, d]
  forward:
    in: [*, d]
    out: (a: [*, d], b: [*, d], c: [*, d])
    graph:
      in -> matmul(weight, transpose=NT) -> a
      a -> relu() -> b
      in -> c
    save: [in, a]
  backward:
    graph:
      (d_b, saved.a) -> relu_backward() -> d_a_b
      (d_a, d_a_b) -> add() -> d_a_all
      (d_a_all, weight) -> matmul(transpose=NN) -> d_in_a
      (d_in_a, d_c) -> add() -> d_in
      (d_a_all, saved.in) -> matmul(transpose=TN) -> d_weight

model M(d: int = 4):
  params:
    two: Two(d)
  forward:
    in: x: [2, 3, d]
    out: [2, 3, d]
    graph:
      x -> two -> (a, b, c)
      (a, c) -> mul() -> out
"""
    loaded = load(tmp_path, source)
    grad = gradient_function(loaded.model)
    ops = [op.name for op in grad.body.block.ops]
    assert "mdsl.graph.zeros" in ops  # d_b: the model never reads b
    assert "mdsl.graph.view" in ops  # c is the input itself: its own value, so d_c and d_x stay apart
    text, ok = report(verify_backward(loaded.model, loaded.weights, [X]), 1e-6)
    assert ok, text


def test_the_std_llama_gradient_uses_swiglu_mlps_written_backward_in_every_layer():
    tiny = dict(vocab_size=64, d_model=32, n_layers=2, num_heads=4, num_kv_heads=2, head_dim=8, d_ff=48)
    model = modeldsl.load(STD_ROOT / "models" / "llama.module", config=tiny)
    block = funcs(model.model)["blocks"]
    assert calls(block) == ["blocks_mlp_forward"]
    assert funcs(model.model)["blocks_mlp_forward"].attributes["backward"].root_reference.data == "blocks_mlp_backward"
    from modeldsl import vjp

    rule = vjp.RULES.pop("swiglu")  # the written backward calls swiglu_backward itself
    try:
        gradient_function(model.model)
    finally:
        vjp.RULES["swiglu"] = rule
    block_backward = funcs(model.model)["blocks_bwd"]  # run once per layer by the reverse stack
    assert calls(block_backward) == ["blocks_mlp_backward"]
    assert not any(op.name == "mdsl.graph.swiglu_backward" for op in block_backward.walk())
    assert calls(gradient_function(model.model, loop=False)).count("blocks_mlp_backward") == 2


# ---------------------------------------------------------------------------- diagnostics


def diagnostics(tmp_path, backward, module_extra=""):
    (tmp_path / "lib.module").write_text(PROJ.format(backward=backward).replace("    save: [in]\n",
                                                                                  module_extra or "    save: [in]\n"))
    path = tmp_path / "m.module"
    path.write_text("from lib import Proj\n" + MODEL)
    with pytest.raises(DiagnosticError) as info:
        modeldsl.load(path)
    return info.value.diagnostics


def test_a_missing_gradient_of_a_sub_modules_parameter_is_e005_at_the_modules_source(tmp_path):
    warning, err = diagnostics(
        tmp_path, CORRECT.replace("      (d_out, saved.in) -> matmul(transpose=TN) -> d_weight\n", ""))
    assert warning.code == "W004" and warning.span.source.name.endswith("lib.module")  # saved.in is unread now
    assert err.code == "E005" and "d_weight" in err.message and "parameter 'proj.weight'" in err.message
    assert err.span.source.name.endswith("lib.module") and err.span.line == 10  # the backward: section


@pytest.mark.parametrize("backward, save, code, line", [
    (CORRECT.replace("saved.in", "saved.out"), None, "E006", 14),
    (CORRECT.replace("    d_out: [*, d]\n", "    d_out: [*, 2 * d]\n"), None, "E018", 11),
    (CORRECT.replace("    d_out: [*, d]\n", "    d_out: [*, d, int32]\n"), None, "E020", 11),
    (CORRECT.replace("      (d_out, weight) -> matmul(transpose=NN) -> d_in\n",
                     "      (d_x, weight) -> matmul(transpose=NN) -> d_in\n"
                     "      (d_in, weight) -> matmul(transpose=NN) -> d_x\n"), None, "E019", 13),
])
def test_errors_of_a_sub_modules_backward_point_into_its_source(tmp_path, backward, save, code, line):
    found = diagnostics(tmp_path, backward, save)
    assert found[0].code == code, [(d.code, d.message) for d in found]
    assert found[0].span.source.name.endswith("lib.module") and found[0].span.line == line


def test_an_unread_saved_tensor_of_a_sub_module_is_w004_at_its_source(tmp_path):
    (tmp_path / "lib.module").write_text(PROJ.format(backward=CORRECT).replace("save: [in]", "save: [in, out]"))
    path = tmp_path / "m.module"
    path.write_text("from lib import Proj\n" + MODEL)
    from modeldsl.diagnostics import DiagnosticSink
    from modeldsl.frontend.text.parser import parse_file
    from modeldsl.lower import lower_program

    sink = DiagnosticSink()
    lower_program(parse_file(path), None, None, sink)
    (warning,) = sink.diagnostics
    assert warning.code == "W004" and "'out' is never read" in warning.message
    assert warning.span.source.name.endswith("lib.module") and warning.span.line == 9
