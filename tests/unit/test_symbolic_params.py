"""Parameters computed from module parameters without a value and from tensor sizes (issue 32).

Spec 3.7 makes module parameters compile-time constants: ``scale(1.0 / sqrt(d_head))`` with no
value for ``d_head``, ``moe_compute_offsets(num_experts)`` and ``scale(1.0 / (B * T))`` lower to
a ``#mdsl.graph.sym`` attribute, which ``mdsl-specialize`` evaluates to the attribute the op takes;
kernels and executors only ever see the value. Each example is the spec's own block, taken from
the spec's text; where it runs, its numbers are checked.
"""

from __future__ import annotations

import numpy as np
import pytest
from spec_blocks import spec_code_blocks
from xdsl.context import Context
from xdsl.dialects.builtin import FloatAttr, IntegerAttr, ModuleOp

from modeldsl.diagnostics import DiagnosticError
from modeldsl.dialects.graph import ModelOp
from modeldsl.dialects.graph_types import SymbolicAttr
from modeldsl.dialects.sched import LaunchOp
from modeldsl.frontend.text.parser import parse_source
from modeldsl.ir import print_ir, verify_module
from modeldsl.lower import lower_program
from modeldsl.passes.autodiff import AutodiffPass
from modeldsl.passes.lower_to_sched import lower_function
from modeldsl.passes.specialize import SpecializePass
from modeldsl.primitives import lookup_primitive
from modeldsl.runtime.executor import ExecutionError, GraphExecutor
from modeldsl.runtime.profiles import plan
from modeldsl.runtime.sched_executor import run_program
from modeldsl.symbolic import Expr


def spec_example(first_line: str) -> str:
    """The spec's code block that starts with ``first_line`` (its examples open with a comment)."""
    (text,) = [text for _, text in spec_code_blocks() if text.startswith(first_line + "\n")]
    return text


@pytest.fixture(scope="module")
def spec():
    """The spec's examples with a parameter computed from symbols, verbatim."""
    return {
        "AttentionScores": spec_example("# Attention score computation: scores = Q @ K^T"),  # 6.1.2
        "AttentionScale": spec_example("# Attention score scaling"),  # 6.6.3
        "MeanLoss": spec_example("# Bias gradient computation"),  # 6.7.1
        "MoEPermute": spec_example("# Permute tokens for expert processing"),  # 6.9.2
        "MoELayer": spec_example("# Complete MoE forward"),  # 6.9.3
    }


def lower(text: str, top: str) -> ModuleOp:
    module = lower_program(parse_source(text, f"{top}.module"), top)
    assert verify_module(module) == []
    return module


def model_of(module: ModuleOp) -> ModelOp:
    return next(op for op in module.walk() if isinstance(op, ModelOp))


def specialized(module: ModuleOp, **bindings) -> ModuleOp:
    module = module.clone()
    SpecializePass.of(**bindings).apply(Context(), module)
    assert verify_module(module) == []
    return module


def attribute(module: ModuleOp, op_name: str, name: str):
    (op,) = [op for op in module.walk() if op.name == f"mdsl.graph.{op_name}"]
    return op.attributes[name]


def test_which_parameters_may_be_symbolic():
    assert lookup_primitive("scale").param("factor").symbolic
    assert lookup_primitive("rmsnorm").param("eps").symbolic
    assert lookup_primitive("flash_attention").param("softmax_scale").symbolic
    assert lookup_primitive("moe_compute_offsets").param("num_experts").symbolic
    assert lookup_primitive("moe_router").param("top_k").symbolic
    # axes choose the shape of the result: they are known when the program is lowered
    assert not lookup_primitive("transpose").param("dim0").symbolic
    assert not lookup_primitive("softmax").param("dim").symbolic


@pytest.mark.parametrize("top", ["AttentionScores", "AttentionScale"])
def test_the_attention_scale_of_d_head_without_a_value_waits_for_mdsl_specialize(spec, top):
    module = lower(spec[top], top)
    factor = attribute(module, "scale", "factor")
    assert isinstance(factor, SymbolicAttr) and factor.kind == "f64" and factor.expr.text() == "1.0 / sqrt(d_head)"
    assert "{factor = #mdsl.graph.sym<1.0 / sqrt(d_head) : f64>}" in print_ir(module)
    bound = specialized(module, d_head=16)
    assert attribute(bound, "scale", "factor") == FloatAttr(0.25, 64)
    assert "#mdsl.graph.sym" not in print_ir(bound)


def test_attention_scores_run_with_the_bound_scale(spec):
    rng = np.random.default_rng(0)
    q, k = rng.standard_normal((1, 2, 3, 16)), rng.standard_normal((1, 2, 3, 16))
    module = specialized(lower(spec["AttentionScores"], "AttentionScores"), d_head=16)
    (scores,) = GraphExecutor(module, {}, float_dtype=np.float64).run("forward", q, k)
    np.testing.assert_allclose(scores, q @ np.swapaxes(k, -1, -2) / 4.0, rtol=1e-12)


def test_the_schedule_sees_only_the_value_and_refuses_an_unbound_one(spec):
    module = lower(spec["AttentionScale"], "AttentionScale")
    with pytest.raises(DiagnosticError) as err:
        lower_function(model_of(specialized(module, B=1, H=2, T=3)))
    (diag,) = err.value.diagnostics
    assert diag.code == "E029" and "scale's factor is 1.0 / sqrt(d_head), which needs d_head bound" in diag.message
    assert diag.hint == "bind it first: mdsl-specialize{d_head=...}" and diag.span.line == 8
    program = plan(lower_function(model_of(specialized(module, B=1, H=2, T=3, d_head=64)), "forward", "fp32"))
    (launch,) = [op for op in program.walk() if isinstance(op, LaunchOp) and op.kernel.data == "scale"]
    assert launch.attributes["factor"] == FloatAttr(0.125, 64)
    scores = np.random.default_rng(1).standard_normal((1, 2, 3, 3)).astype(np.float32)
    (out,) = run_program(program, {}, [scores])
    np.testing.assert_allclose(out, scores * np.float32(0.125), rtol=1e-6)


def test_the_graph_interpreter_needs_the_value_too(spec):
    module = lower(spec["AttentionScale"], "AttentionScale")
    with pytest.raises(ExecutionError, match=r"1.0 / sqrt\(d_head\) needs d_head bound: run mdsl-specialize"):
        GraphExecutor(module, {}).run("forward", np.zeros((1, 2, 3, 3), np.float32))


def test_the_mean_loss_divides_by_the_batch_sizes(spec):
    """Spec 6.7.1's MeanLoss: ``scale(1.0 / (B * T))`` of the input's sizes."""
    module = lower(spec["MeanLoss"], "MeanLoss")
    assert attribute(module, "scale", "factor").expr.text() == "1.0 / (B * T)"
    assert attribute(specialized(module, B=2), "scale", "factor").expr.text() == "1.0 / (2 * T)"
    loss = np.random.default_rng(2).standard_normal((2, 5))
    # the interpreter binds B and T from the argument's shape, as it does for the shapes
    (mean,) = GraphExecutor(module, {}, float_dtype=np.float64).run("forward", loss)
    np.testing.assert_allclose(mean, loss.mean(), rtol=1e-12)
    bound = specialized(module, B=2, T=5)
    assert attribute(bound, "scale", "factor") == FloatAttr(0.1, 64)
    (out,) = run_program(plan(lower_function(model_of(bound), "forward", "fp32")), {}, [loss.astype(np.float32)])
    np.testing.assert_allclose(out, loss.mean(), rtol=1e-6, atol=1e-7)


def test_differentiating_before_or_after_binding_gives_the_same_program(spec):
    module = lower(spec["MeanLoss"], "MeanLoss")
    first = module.clone()
    AutodiffPass().apply(Context(), first)  # the scale's VJP carries the symbolic factor
    assert print_ir(first).count("#mdsl.graph.sym<1.0 / (B * T) : f64>") == 3
    after = specialized(first, B=2, T=5)
    before = specialized(module, B=2, T=5)
    AutodiffPass().apply(Context(), before)
    assert print_ir(after) == print_ir(before)
    assert "#mdsl.graph.sym" not in print_ir(after)


def test_the_moe_permute_counts_num_experts_offsets(spec):
    """Spec 6.9.2's MoEPermute, with its indices typed int32 (the spec leaves the dtype out, which
    makes them bf16, spec 3.3: test_spec_examples refuses the block as written with E015)."""
    text = spec["MoEPermute"]
    assert "indices: [B*T, top_k])" in text
    module = lower(text.replace("indices: [B*T, top_k])", "indices: [B*T, top_k, int32])"), "MoEPermute")
    experts = attribute(module, "moe_compute_offsets", "num_experts")
    assert isinstance(experts, SymbolicAttr) and experts.kind == "i64" and experts.value() == Expr.sym("num_experts")
    bound = specialized(module, num_experts=3, B=2, T=2)
    assert attribute(bound, "moe_compute_offsets", "num_experts") == IntegerAttr(3, 64)
    rng = np.random.default_rng(3)
    x, indices = rng.standard_normal((4, 5)), np.array([[0, 2], [1, 2], [2, 0], [1, 0]], np.int32)
    permuted, scatter = GraphExecutor(bound, {}, float_dtype=np.float64).run("forward", x, indices)
    order = np.argsort(indices.reshape(-1), kind="stable")
    np.testing.assert_array_equal(permuted, np.repeat(x, 2, axis=0)[order])
    np.testing.assert_array_equal(scatter[order], np.arange(8))


def test_the_moe_layer_without_a_configuration_is_the_configured_one_once_bound(spec):
    """Spec 6.9.3's MoELayer lowers without values for its sizes; bound by mdsl-specialize it computes
    what the layer lowered with those values does (test_primitives checks that one against torch)."""
    text = spec["MoELayer"]
    module = lower(text, "MoELayer")
    assert attribute(module, "moe_compute_offsets", "num_experts").value() == Expr.sym("num_experts")
    bound = specialized(module, d_model=4, num_experts=3, d_ff=2)
    assert attribute(bound, "moe_compute_offsets", "num_experts") == IntegerAttr(3, 64)
    rng = np.random.default_rng(5)
    weights = {"gate": rng.standard_normal((3, 4)), "expert_up": rng.standard_normal((3, 4, 4)) * 0.5,
               "expert_down": rng.standard_normal((3, 4, 2)) * 0.5}
    x = rng.standard_normal((2, 3, 4))
    (got,) = GraphExecutor(bound, weights, float_dtype=np.float64).run("forward", x)
    with_values = text.replace("module MoELayer(d_model, num_experts, d_ff, top_k=2):",
                               "module MoELayer(d_model=4, num_experts=3, d_ff=2, top_k=2):")
    configured = specialized(lower(with_values, "MoELayer"))  # its config integers bound
    (want,) = GraphExecutor(configured, weights, float_dtype=np.float64).run("forward", x)
    np.testing.assert_array_equal(got, want)


def test_a_parameter_without_a_value_once_bound_is_an_error_where_it_has_none():
    text = ("module Gap(d: int):\n  forward:\n    in: x: [N]\n    out: [N]\n    graph:\n"
            "      x -> scale(1.0 / (d - 4)) -> out\n"
            "module Few(e: int):\n  forward:\n    in: i: [N, 2, int32]\n    out: [e - 3, int32]\n    graph:\n"
            "      i -> moe_compute_offsets(e - 4) -> out\n")
    with pytest.raises(DiagnosticError) as err:
        specialized(lower(text, "Gap"), d=4)
    (diag,) = err.value.diagnostics
    assert diag.code == "E026" and "scale's factor = 1.0 / (d - 4) has no value with d=4: division by zero" \
        in diag.message and diag.span.line == 6
    assert attribute(specialized(lower(text, "Gap"), d=6), "scale", "factor") == FloatAttr(0.5, 64)
    with pytest.raises(DiagnosticError) as err:
        specialized(lower(text, "Few"), e=2)
    (diag,) = err.value.diagnostics
    assert diag.code == "E029" and "moe_compute_offsets with num_experts = e - 4 (e=2) does not verify" \
        in diag.message and "num_experts must be at least 1, got -2" in diag.message
    assert attribute(specialized(lower(text, "Few"), e=6), "moe_compute_offsets", "num_experts") == IntegerAttr(2, 64)


def test_an_axis_must_be_known_when_the_program_is_lowered():
    text = ("module M(d: int):\n  forward:\n    in: x: [N, N]\n    out: [N, N]\n    graph:\n"
            "      x -> transpose(d, 1) -> out\n")
    with pytest.raises(DiagnosticError) as err:
        lower(text, "M")
    (diag,) = err.value.diagnostics
    assert diag.code == "E003" and "expects an integer known when the program is lowered, got 'd'" in diag.message
