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
        ("flash_attention", ["q", "k", "v", "alibi_slopes?"], ["out", "lse"],
         {"causal": ("bool", True, False), "softmax_scale": ("float", None, False), "window_size": ("int", None, False)}),
        ("moe_router", ["x", "gate"], ["weights", "indices", "aux_loss"], {"top_k": ("int", None, True)}),
        ("cross_entropy", ["logits", "labels"], ["loss", "lse"], {"ignore_index": ("int", -100, False), "reduction": ("enum", "mean", False)}),
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
