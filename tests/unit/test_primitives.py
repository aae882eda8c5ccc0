"""Primitive signatures derived from the graph ops, and DSL values converted to attributes."""

import pytest
from xdsl.dialects.builtin import DenseArrayBase, FloatAttr, IntegerAttr, StringAttr

from modeldsl.dialects.graph_primitives import PRIMITIVE_OPS, MatmulOp
from modeldsl.dialects.graph_types import DimsAttr
from modeldsl.primitives import lookup_primitive, primitives
from modeldsl.symbolic import Expr


def test_every_primitive_op_has_a_signature():
    assert len(primitives()) == len(PRIMITIVE_OPS)
    assert all(sig.op.name == f"mdsl.graph.{name}" for name, sig in primitives().items())


def test_matmul_signature():
    sig = lookup_primitive("matmul")
    assert sig.op is MatmulOp
    assert [s.name for s in sig.inputs] == ["a", "b"] and [s.name for s in sig.outputs] == ["c"]
    transpose = sig.param("transpose")
    assert (transpose.kind, transpose.default, transpose.choices) == ("enum", "NN", ("NN", "NT", "TN", "TT"))
    assert (sig.param("accumulate").kind, sig.param("accumulate").default) == ("bool", False)
    assert (sig.param("alpha").kind, sig.param("alpha").default) == ("float", 1.0)


@pytest.mark.parametrize(
    "name, inputs, outputs, params",
    [
        ("rmsnorm", ["x", "weight"], ["y", "rstd"], {"eps": ("float", 1e-6, False)}),
        ("layernorm", ["x", "weight", "bias?"], ["y", "mean", "rstd"], {"eps": ("float", 1e-5, False)}),
        ("split", ["x"], ["outs*"], {"sizes": ("dims", None, True), "dim": ("int", -1, False)}),
        ("concat", ["inputs*"], ["out"], {"dim": ("int", -1, False)}),
        ("permute", ["x"], ["out"], {"dims": ("ints", None, True)}),
        ("flash_attention", ["q", "k", "v", "alibi_slopes?", "segments?"], ["out", "lse"],
         {"causal": ("bool", True, False), "softmax_scale": ("float", None, False),
          "window_size": ("int", None, False)}),
        ("moe_router", ["x", "gate"], ["weights", "indices", "aux_loss"], {"top_k": ("int", None, True)}),
        ("cross_entropy", ["logits", "labels"], ["loss", "lse"],
         {"ignore_index": ("int", -100, False), "reduction": ("enum", "mean", False)}),
        ("zeros", [], ["out"], {}),
    ],
)
def test_signatures(name, inputs, outputs, params):
    sig = lookup_primitive(name)

    def slots(s):
        return [x.name + ("?" if x.optional else "*" if x.variadic else "") for x in s]

    assert slots(sig.inputs) == inputs and slots(sig.outputs) == outputs
    for pname, (kind, default, required) in params.items():
        p = sig.param(pname)
        assert (p.kind, p.default, p.required) == (kind, default, required), pname


def test_backward_primitives_are_marked():
    assert lookup_primitive("rmsnorm_backward").is_backward
    assert lookup_primitive("grouped_gemm_weight_grad").is_backward
    assert not lookup_primitive("rmsnorm").is_backward
    assert lookup_primitive("no_such_op") is None


def test_values_become_attributes():
    mm = lookup_primitive("matmul")
    assert mm.param("transpose").to_attribute("NT") == StringAttr("NT")
    assert isinstance(mm.param("alpha").to_attribute(2), FloatAttr)
    assert mm.param("accumulate").to_attribute(True).value.data != 0
    assert isinstance(lookup_primitive("softmax").param("dim").to_attribute(-1), IntegerAttr)
    assert isinstance(lookup_primitive("permute").param("dims").to_attribute([0, 2, 1]), DenseArrayBase)
    sizes = lookup_primitive("split").param("sizes").to_attribute([Expr.sym("d_ff"), 4])
    assert sizes == DimsAttr.from_list(["d_ff", 4])


@pytest.mark.parametrize(
    "prim, param, value, message",
    [
        ("matmul", "transpose", "XY", "'XY' is not one of NN, NT, TN, TT"),
        ("matmul", "accumulate", 1, "expects true or false"),
        ("matmul", "alpha", "big", "expects a number"),
        ("softmax", "dim", 1.5, "expects an integer"),
        ("permute", "dims", [0, "a"], "expects a list of integers"),
        ("split", "sizes", 3, "expects a list of sizes"),
    ],
)
def test_bad_values_are_rejected_with_a_message(prim, param, value, message):
    with pytest.raises(ValueError, match=message):
        lookup_primitive(prim).param(param).to_attribute(value)


def test_group_operands_fills_slots_in_order():
    assert lookup_primitive("matmul").group_operands(["a", "b"]) == ["a", "b"]
    assert lookup_primitive("layernorm").group_operands(["x", "w"]) == ["x", "w", None]
    assert lookup_primitive("layernorm").group_operands(["x", "w", "b"]) == ["x", "w", "b"]
    assert lookup_primitive("concat").group_operands(["a", "b", "c"]) == [["a", "b", "c"]]
    assert lookup_primitive("mamba_conv1d").group_operands(["x", "w", "b"]) == ["x", "w", "b", None]
    with pytest.raises(ValueError, match="takes 2 tensor input"):
        lookup_primitive("matmul").group_operands(["a"])
    with pytest.raises(ValueError, match="takes 2 tensor input"):
        lookup_primitive("matmul").group_operands(["a", "b", "c"])


BINARY_BACKWARD = """mdsl.graph.model @m config {} {
  mdsl.graph.func @backward(%g: !mdsl.graph.tensor<[2, 3, 4], fp32>, %a: !mdsl.graph.tensor<[2, 3, 4], fp32>,
                            %b: !mdsl.graph.tensor<[3, 1], fp32>) -> (!mdsl.graph.tensor<[2, 3, 4], fp32>,
      !mdsl.graph.tensor<[3, 1], fp32>, !mdsl.graph.tensor<[2, 3, 4], fp32>, !mdsl.graph.tensor<[3, 1], fp32>)
      attributes {kind = "backward"} {
    %da, %db = mdsl.graph.add_backward %g : (!mdsl.graph.tensor<[2, 3, 4], fp32>)
        -> (!mdsl.graph.tensor<[2, 3, 4], fp32>, !mdsl.graph.tensor<[3, 1], fp32>)
    %ma, %mb = mdsl.graph.mul_backward %g, %a, %b : (!mdsl.graph.tensor<[2, 3, 4], fp32>,
        !mdsl.graph.tensor<[2, 3, 4], fp32>, !mdsl.graph.tensor<[3, 1], fp32>)
        -> (!mdsl.graph.tensor<[2, 3, 4], fp32>, !mdsl.graph.tensor<[3, 1], fp32>)
    mdsl.graph.return %da, %db, %ma, %mb : !mdsl.graph.tensor<[2, 3, 4], fp32>, !mdsl.graph.tensor<[3, 1], fp32>,
        !mdsl.graph.tensor<[2, 3, 4], fp32>, !mdsl.graph.tensor<[3, 1], fp32>
  }
}
"""


def test_add_and_mul_backward_run_on_the_schedule_executor_and_the_interpreter():
    """The gradients of a + b and a * b for b: [3, 1] broadcast against a: [2, 3, 4], summed back."""
    import numpy as np

    from modeldsl.dialects.graph import ModelOp
    from modeldsl.ir import make_context, parse_module
    from modeldsl.passes.lower_to_sched import lower_function
    from modeldsl.runtime.executor import GraphExecutor
    from modeldsl.runtime.profiles import plan
    from modeldsl.runtime.sched_executor import run_program

    module, _ = parse_module(make_context(), BINARY_BACKWARD)
    module.verify()
    model = next(op for op in module.walk() if isinstance(op, ModelOp))
    rng = np.random.default_rng(3)
    g, a, b = (rng.standard_normal(s).astype(np.float32) for s in [(2, 3, 4), (2, 3, 4), (3, 1)])
    expected = [g, g.sum(axis=(0, 2)).reshape(3, 1), g * b, (g * a).sum(axis=(0, 2)).reshape(3, 1)]
    interpreted = GraphExecutor(model, {}).run("backward", g, a, b)
    scheduled = run_program(plan(lower_function(model, "backward")), {}, [g, a, b])
    for got_i, got_s, want in zip(interpreted, scheduled, expected, strict=True):
        np.testing.assert_allclose(got_i, want, rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(got_s, got_i)


def test_a_written_backward_calls_mul_backward():
    from modeldsl.frontend.text.parser import parse_source
    from modeldsl.ir import verify_module
    from modeldsl.lower import lower_program

    text = ("module Gate(d: int = 4):\n  forward:\n    in: (x: [B, d], y: [d])\n    out: [B, d]\n    graph:\n"
            "      (x, y) -> mul() -> out\n    save: [x, y]\n  backward:\n    d_out: [B, d]\n    graph:\n"
            "      (d_out, saved.x, saved.y) -> mul_backward() -> (d_x, d_y)\n")
    ir = lower_program(parse_source(text, "gate.module"), "Gate")
    assert verify_module(ir) == []
    (op,) = [op for op in ir.walk() if op.name == "mdsl.graph.mul_backward"]
    assert [str(r.type) for r in op.results] == ["!mdsl.graph.tensor<[B, d], bf16>", "!mdsl.graph.tensor<[d], bf16>"]


@pytest.mark.parametrize("approximate", [True, False])
def test_the_std_geglu_mlp_computes_either_gelu(approximate):
    """GeGLU_MLP(approximate=true) is gelu(tanh) then mul; false is the geglu primitive (exact GELU)."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    from modeldsl.dialects.graph import ModelOp
    from modeldsl.frontend.text.parser import parse_source
    from modeldsl.lower import lower_program
    from modeldsl.runtime.executor import GraphExecutor

    text = (f"import std.modules.mlp\n\nmodule M(approx: bool = {str(approximate).lower()}):\n  params:\n"
            "    mlp: GeGLU_MLP(4, 6, approximate=approx)\n  forward:\n    in: [1, 2, 4]\n    out: [1, 2, 4]\n"
            "    graph:\n      in -> mlp -> out\n")
    module = lower_program(parse_source(text, "m.module"), "M")
    model = next(op for op in module.walk() if isinstance(op, ModelOp))
    assert any(op.name == "mdsl.graph.geglu" for op in model.walk()) is not approximate
    rng = np.random.default_rng(5)
    weights = {"mlp.up_weight": rng.standard_normal((12, 4)), "mlp.down_weight": rng.standard_normal((4, 6))}
    x = rng.standard_normal((1, 2, 4))
    (got,) = GraphExecutor(model, weights, float_dtype=np.float64).run("forward", x)
    gate, up = (torch.from_numpy(x) @ torch.from_numpy(weights["mlp.up_weight"]).T).split(6, dim=-1)
    hidden = F.gelu(gate, approximate="tanh" if approximate else "none") * up
    np.testing.assert_allclose(got, (hidden @ torch.from_numpy(weights["mlp.down_weight"]).T).numpy(), rtol=1e-9)


def test_alibi_slopes_is_a_keyword_tensor_parameter_of_flash_attention():
    """Spec 6.4.1 declares alibi_slopes: [H]? = None under params: a call passes the tensor by keyword."""
    from modeldsl.diagnostics import DiagnosticError
    from modeldsl.frontend.text.parser import parse_source
    from modeldsl.lower import lower_program

    sig = lookup_primitive("flash_attention")
    assert [s.name for s in sig.positional_inputs] == ["q", "k", "v"]
    assert [(s.name, s.optional) for s in sig.keyword_inputs] == [("alibi_slopes", True), ("segments", True)]
    assert [s.name for s in lookup_primitive("flash_attention_backward").keyword_inputs] == ["alibi_slopes",
                                                                                            "segments"]
    text = ("module A(h: int = 2):\n  forward:\n    in: (q: [1, h, 3, 4], k: [1, h, 3, 4], v: [1, h, 3, 4], s: [h])\n"
            "    out: [1, h, 3, 4]\n    graph:\n      (q, k, v) -> flash_attention(alibi_slopes={}) -> out\n")
    module = lower_program(parse_source(text.format("s"), "a.module"), "A")
    (op,) = [op for op in module.walk() if op.name == "mdsl.graph.flash_attention"]
    assert [a.name_hint for a in op.operands] == ["q", "k", "v", "s"]
    module = lower_program(parse_source(text.format("None"), "a.module"), "A")
    (op,) = [op for op in module.walk() if op.name == "mdsl.graph.flash_attention"]
    assert len(op.operands) == 3
    with pytest.raises(DiagnosticError) as err:
        lower_program(parse_source(text.format("t"), "a.module"), "A")
    assert [d.code for d in err.value.diagnostics] == ["E002"]


GATED_BIAS = """module Gate(d: int = 4):
  params:
    bias: [d]
  forward:
    in: (x: [B, d], y: [B, d])
    out: [B, d]
    graph:
      (x, bias) -> add() -> h
      (h, y) -> mul() -> out
    save: [h, y]
  backward:
    d_out: [B, d]
    graph:
      (d_out, saved.h, saved.y) -> mul_backward() -> (d_h, d_y)
      d_h -> add_backward() -> (d_x, d_bias)
"""


def test_a_written_backward_of_add_backward_and_mul_backward_matches_finite_differences(tmp_path):
    """add_backward's results take the types of the gradients the flow ends in (d_bias: [d] sums over B)."""
    import numpy as np

    import modeldsl
    from modeldsl.verify_backward import checked_backward, random_inputs, random_weights, report, verify_backward

    path = tmp_path / "gate.module"
    path.write_text(GATED_BIAS)
    model = modeldsl.load(path).model
    assert checked_backward(model) == "written"
    (op,) = [op for op in model.walk() if op.name == "mdsl.graph.add_backward"]
    assert [str(r.type) for r in op.results] == ["!mdsl.graph.tensor<[B, 4], bf16>", "!mdsl.graph.tensor<[4], bf16>"]
    inputs = [np.random.default_rng(s).standard_normal((3, 4)) for s in (0, 1)]
    checks = verify_backward(model, random_weights(model), inputs)
    text, ok = report(checks, 1e-6)
    assert ok and {c.name for c in checks} == {"bias", "input x", "input y"}, text
    assert {c.backward for c in checks} == {"written"}
    random_inputs(model)  # the model's inputs are well-formed for the oracle's own generator too


def test_add_backward_in_a_flow_that_does_not_end_in_gradients_asks_for_the_types():
    from modeldsl.diagnostics import DiagnosticError
    from modeldsl.frontend.text.parser import parse_source
    from modeldsl.lower import lower_program

    text = GATED_BIAS.replace("d_h -> add_backward() -> (d_x, d_bias)",
                              "d_h -> add_backward() -> (d_x, tmp)\n      tmp -> scale(1.0) -> d_bias")
    with pytest.raises(DiagnosticError) as err:
        lower_program(parse_source(text, "gate.module"), "Gate")
    (diag,) = err.value.diagnostics
    assert diag.code == "E004" and "add_backward needs the shapes of a and b" in diag.message


def test_the_spec_moe_experts_block_with_grouped_gemm_tn_matches_torch_and_finite_differences(tmp_path):
    """Spec 6.1.3's MoEExperts (its offsets typed int32): grouped_gemm(transpose=TN) is x_g @ W_g^T."""
    import numpy as np
    import torch
    import torch.nn.functional as F
    from spec_blocks import spec_code_blocks

    import modeldsl
    from modeldsl.runtime.executor import GraphExecutor
    from modeldsl.verify_backward import report, verify_backward

    (text,) = [t for line, t in spec_code_blocks() if t.startswith("# MoE expert forward pass\nmodule MoEExperts")]
    text = text.replace("module MoEExperts(num_experts, d_model, d_ff):",
                        "module MoEExperts(num_experts: int = 2, d_model: int = 3, d_ff: int = 2):")
    text = text.replace("expert_offsets: [num_experts + 1])", "expert_offsets: [num_experts + 1, int32])")
    (tmp_path / "moe.module").write_text(text)
    model = modeldsl.load(tmp_path / "moe.module").model
    rng = np.random.default_rng(11)
    weights = {"gate_up_weights": rng.standard_normal((2, 4, 3)), "down_weights": rng.standard_normal((2, 3, 2))}
    x, offsets = rng.standard_normal((5, 3)), np.array([0, 2, 5], dtype=np.int32)
    (got,) = GraphExecutor(model, weights, float_dtype=np.float64).run("forward", x, offsets)
    rows = []
    for g, (lo, hi) in enumerate([(0, 2), (2, 5)]):
        gate, up = F.linear(torch.from_numpy(x[lo:hi]), torch.from_numpy(weights["gate_up_weights"][g])).split(2, -1)
        rows.append(F.linear(F.silu(gate) * up, torch.from_numpy(weights["down_weights"][g])))
    np.testing.assert_allclose(got, torch.cat(rows).numpy(), rtol=1e-9)
    checks = verify_backward(model, weights, [x, offsets])
    text, ok = report(checks, 1e-6)
    assert ok and {c.name for c in checks} == {"gate_up_weights", "down_weights", "input permuted_tokens"}, text


def test_the_spec_moe_layer_computes_its_own_offsets_and_matches_torch_and_finite_differences(
    tmp_path, numpy_cpu_kernels
):
    """Spec 6.9.3's MoELayer: route (softmax, top 2 renormalized), moe_compute_offsets, permute, the experts'
    grouped GEMMs, unpermute; against a per-token torch loop over the chosen experts, and every gradient
    (router gate, experts, input) against finite differences."""
    import numpy as np
    import torch
    import torch.nn.functional as F
    from spec_blocks import spec_code_blocks

    import modeldsl
    from modeldsl.runtime.executor import GraphExecutor
    from modeldsl.verify_backward import report, verify_backward

    (text,) = [t for line, t in spec_code_blocks() if t.startswith("# Complete MoE forward\nmodule MoELayer")]
    (tmp_path / "moe.module").write_text(text)
    model = modeldsl.load(tmp_path / "moe.module", config={"d_model": 4, "num_experts": 3, "d_ff": 2}).model
    rng = np.random.default_rng(5)
    weights = {"gate": rng.standard_normal((3, 4)), "expert_up": rng.standard_normal((3, 4, 4)) * 0.5,
               "expert_down": rng.standard_normal((3, 4, 2)) * 0.5}
    x = rng.standard_normal((2, 3, 4))
    (got,) = GraphExecutor(model, weights, float_dtype=np.float64).run("forward", x)
    flat = torch.from_numpy(x.reshape(6, 4))
    probs = F.softmax(flat @ torch.from_numpy(weights["gate"]).T, dim=-1)
    top, chosen = probs.topk(2, dim=-1)
    top = top / top.sum(-1, keepdim=True)
    expected = torch.zeros_like(flat)
    for n in range(6):
        for k in range(2):
            e = int(chosen[n, k])
            gate, up = F.linear(flat[n], torch.from_numpy(weights["expert_up"][e])).split(2)
            expected[n] += top[n, k] * F.linear(F.silu(gate) * up, torch.from_numpy(weights["expert_down"][e]))
    np.testing.assert_allclose(got, expected.reshape(2, 3, 4).numpy(), rtol=1e-9, atol=1e-12)
    assert any(op.name == "mdsl.graph.moe_compute_offsets" for op in model.walk())
    checks = verify_backward(model, weights, [x])
    text, ok = report(checks, 1e-6)
    assert ok and {c.name for c in checks} == {"gate", "expert_up", "expert_down", "input x"}, text
    # the planned schedule runs it too (offsets computed by its own launch), as the interpreter does in fp32
    from xdsl.context import Context
    from xdsl.dialects.builtin import ModuleOp

    from modeldsl.passes.lower_to_sched import lower_function
    from modeldsl.passes.specialize import SpecializePass
    from modeldsl.runtime.profiles import plan
    from modeldsl.runtime.sched_executor import run_program

    module = ModuleOp([model.clone()])
    SpecializePass.of(B=2, T=3).apply(Context(), module)
    specialized = next(iter(module.body.block.ops))
    single = {n: w.astype(np.float32) for n, w in weights.items()}
    (scheduled,) = run_program(plan(lower_function(specialized, "forward", "fp32")), single, [x.astype(np.float32)])
    (interpreted,) = GraphExecutor(specialized, single, float_dtype=np.float32).run("forward", x.astype(np.float32))
    np.testing.assert_array_equal(scheduled, interpreted)
