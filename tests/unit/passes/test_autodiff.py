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

    saved = vjp.RULES.pop("swiglu")
    try:
        with pytest.raises(AutodiffError, match="no VJP rule for swiglu"):
            gradient_function(model.model)
    finally:
        vjp.RULES["swiglu"] = saved
