"""mdsl-autodiff: the derived gradient of whole std models against finite differences (float64)."""

import numpy as np
import pytest

import modeldsl
from modeldsl.passes.autodiff import AutodiffError, gradient_function
from modeldsl.resolve.imports import STD_ROOT
from modeldsl.verify_backward import report, verify_backward

TINY = dict(vocab_size=64, d_model=32, n_layers=2, num_heads=4, num_kv_heads=2, head_dim=8, d_ff=48)


@pytest.mark.parametrize("module, config", [
    ("llama.module", {}),
    ("llama.module", {"tie_embeddings": True}),
    ("qwen.module", {}),
    ("mistral.module", {"sliding_window": 3}),
])
def test_the_derived_gradient_of_a_std_model_matches_finite_differences(module, config):
    model = modeldsl.load(STD_ROOT / "models" / module, config={**TINY, **config})
    checks = verify_backward(model.model, model.weights, model.inputs(np.array([[3, 17, 42, 5, 9, 33]]), 0))
    text, ok = report(checks, 1e-5)
    assert ok, text
    assert {c.name for c in checks} >= {"embedding", "blocks.attention.qkv_weight", "blocks.mlp.down_weight"}


def test_the_gradient_function_records_parameters_and_saved_tensors():
    model = modeldsl.load(STD_ROOT / "models" / "llama.module", config=TINY)
    grad = gradient_function(model.model)
    names = [a.data for a in grad.attributes["grads"].data]
    assert names[0] == "embedding" and "lm_head" in names
    saved = {a.data for a in grad.attributes["saved"].data}
    assert {"tokens", "rstd"} <= saved  # token ids for the embedding gradient, norm statistics


def test_a_frozen_parameter_gets_no_gradient(tmp_path):
    source = """model M(d: int = 4):
  params:
    w: [d, d] @frozen
    v: [d, d]
  forward:
    in: x: [2, d, fp32]
    out: [2, d]
    graph:
      x -> matmul(w, transpose=NT) -> h
      h -> matmul(v, transpose=NT) -> out
"""
    (tmp_path / "m.module").write_text(source)
    model = modeldsl.load(tmp_path / "m.module")
    grad = gradient_function(model.model)
    assert [a.data for a in grad.attributes["grads"].data] == ["v"]
    checks = verify_backward(model.model, model.weights, [np.random.default_rng(0).standard_normal((2, 4))])
    assert [c.name for c in checks] == ["v", "input x"] and report(checks, 1e-6)[1]


def test_an_op_without_a_rule_is_refused_naming_it():
    model = modeldsl.load(STD_ROOT / "models" / "llama.module", config=TINY)
    from modeldsl import vjp

    saved = vjp.RULES.pop("rope")  # (not swiglu: SwiGLU_MLP's written backward differentiates it)
    try:
        with pytest.raises(AutodiffError, match="no VJP rule for rope"):
            gradient_function(model.model)
    finally:
        vjp.RULES["rope"] = saved


@pytest.mark.parametrize("file, top, config, shape", [
    ("linear.module", "Linear", {"in_dim": 4, "out_dim": 3}, (5, 4)),
    ("mlp.module", "SwiGLU_MLP", {"d_model": 4, "d_ff": 6}, (2, 3, 4)),
])
def test_the_written_backward_of_a_std_module_equals_the_derived_one(file, top, config, shape):
    """The std modules' written backward: sections compute what autodiff derives (float64)."""
    from xdsl.context import Context

    from modeldsl.dialects.graph import FuncOp, ModelOp
    from modeldsl.frontend.text.parser import parse_file
    from modeldsl.lower import lower_program
    from modeldsl.passes.specialize import SpecializePass
    from modeldsl.runtime.executor import GraphExecutor
    from modeldsl.runtime.model import random_weights

    module = lower_program(parse_file(STD_ROOT / "modules" / file), top, config)
    SpecializePass().apply(Context(), module)
    model = next(op for op in module.walk() if isinstance(op, ModelOp))
    written = next(f for f in model.body.block.ops if isinstance(f, FuncOp) and f.sym_name.data == "backward")
    derived = gradient_function(model)
    rng = np.random.default_rng(1)
    weights = {k: rng.standard_normal(v.shape) for k, v in random_weights(model, np.float64).items()}
    executor = GraphExecutor(model, weights, float_dtype=np.float64)
    x = rng.standard_normal(shape)
    values = {}
    executor.observers.append(lambda op, results: values.update(
        {r.name_hint: v for r, v in zip(op.results, results) if r.name_hint}))
    (out,) = executor.run("forward", x)
    d_out = rng.standard_normal(out.shape)
    saved = [x if name == "in" else values[name] for name in (a.data for a in written.attributes["saved"].data)]
    by_written = dict(zip((a.data for a in written.attributes["grads"].data), executor.run("backward", d_out, *saved)))
    results = executor.run(derived.sym_name.data, x, d_out)[1:]
    names = [f"d_{a.data}" for a in derived.attributes["grads"].data] + ["d_in"]
    by_derived = dict(zip(names, results))
    assert set(by_written) == set(by_derived)
    for name, value in by_written.items():
        np.testing.assert_allclose(value, by_derived[name], rtol=1e-12, atol=1e-12, err_msg=name)


def test_unspecialized_models_are_refused_with_a_hint(capsys):
    """The looped backward needs no layer count; unrolling it (loop=false) and lowering do."""
    from modeldsl.tools.opt import main

    path = str(STD_ROOT / "models" / "llama.module")
    assert main([path, "-p", "mdsl-autodiff"]) == 0
    assert "mdsl.graph.stack @blocks_bwd count #mdsl.graph.expr<n_layers> reverse" in capsys.readouterr().out
    assert main([path, "-p", "mdsl-autodiff{loop=false}"]) == 1
    err = capsys.readouterr().err
    assert "error[E014]: mdsl-autodiff: the layer count n_layers of @blocks is not known" in err
    assert "hint: run mdsl-specialize first" in err
    assert main([path, "-p", "mdsl-lower-to-sched"]) == 1
    err = capsys.readouterr().err
    assert "error[E029]: mdsl-lower-to-sched needs concrete shapes" in err and "mdsl-specialize{B=1 T=64}" in err
