"""Inheritance: abstract modules, extends, +param additions, and E011."""

import pytest

from modeldsl.diagnostics import DiagnosticError
from modeldsl.frontend.text.parser import parse_source
from modeldsl.lower import lower_program

BASE = '''abstract module Base(d: int, h: int):
  params:
    w: [d, d]
  forward:
    in: [B, d]
    out: [B, d]
'''


def lower(text: str, top: str):
    return lower_program(parse_source(text, "inherit.module"), top)


def codes(text: str, top: str) -> list[tuple[str, str]]:
    with pytest.raises(DiagnosticError) as info:
        lower(text, top)
    return [(d.code, d.message) for d in info.value.diagnostics]


def first_error(text: str, top: str):
    with pytest.raises(DiagnosticError) as info:
        lower(text, top)
    return info.value.diagnostics[0]


def params_of(module) -> list[str]:
    return [op.sym_name.data for op in module.walk() if op.name == "mdsl.graph.param"]


def test_child_inherits_params_and_signature_and_adds_with_plus():
    text = BASE + "module Child(d: int = 8, h: int = 2) extends Base:\n  params:\n    +extra: [h]\n" \
                  "  forward:\n    graph:\n      in -> matmul(w, transpose=NT) -> out\n"
    module = lower(text, "Child")
    assert params_of(module) == ["w", "extra"]
    func = next(op for op in module.walk() if op.name == "mdsl.graph.func")
    assert str(func.function_type.inputs.data[0]) == "!mdsl.graph.tensor<[B, d], bf16>"


def test_spec_example_of_sections_4_2_and_4_3():
    text = '''abstract module BaseAttention(d_model: int, num_heads: int):
  params:
    qkv_weight: [3 * d_model, d_model]
    out_weight: [d_model, d_model]
  forward:
    in: [B, T, d_model]
    out: [B, T, d_model]

module LlamaAttention(d_model, num_heads, max_seq) extends BaseAttention:
  params:
    +rope_freqs: [max_seq, d_model // num_heads // 2, 2]
  forward:
    graph:
      in -> matmul(out_weight, transpose=NT) -> out
'''
    assert params_of(lower(text, "LlamaAttention")) == ["qkv_weight", "out_weight", "rope_freqs"]


@pytest.mark.parametrize(
    "child, message",
    [
        ("module C(d: int = 8) extends Base:\n  forward:\n    graph:\n      in -> out\n",
         "does not take its parameter(s) h"),
        ("module C(d: int = 8, h: int = 2) extends Nowhere:\n  forward:\n    graph:\n      in -> out\n",
         "extends Nowhere, which is an undefined name"),
        ("module C(d: int = 8, h: int = 2) extends Base:\n  params:\n    +w: [d]\n"
         "  forward:\n    graph:\n      in -> out\n",
         "+w adds a parameter that Base already has"),
        ("module C(d: int = 8, h: int = 2) extends Base:\n  params:\n    w: [d]\n"
         "  forward:\n    graph:\n      in -> out\n",
         "w is declared differently than in Base"),
        ("module C(d: int = 8, h: int = 2) extends Base:\n  params:\n    +v: [d]\n", "C extends Base but has no graph"),
        ("model C(d: int = 8, h: int = 2) extends Base:\n  forward:\n    graph:\n      in -> out\n",
         "a model cannot extend another declaration"),
    ],
)
def test_incompatible_inheritance_is_e011(child, message):
    diagnostic = first_error(BASE + child, "C")
    assert diagnostic.code == "E011" and message in diagnostic.message
    assert diagnostic.span is not None


def test_abstract_modules_cannot_be_lowered_or_instantiated():
    assert codes(BASE, "Base")[0] == ("E011", "Base is abstract and cannot be instantiated")
    user = BASE + ("module U(d: int = 4):\n  params:\n    inner: Base(d, 2)\n"
                   "  forward:\n    in: [B, d]\n    graph:\n      in -> out\n")
    assert codes(user, "U")[0][0] == "E011"


def test_inheriting_from_itself_is_e011():
    text = "module A(d: int = 2) extends A:\n  forward:\n    in: [d]\n    graph:\n      in -> out\n"
    assert codes(text, "A")[0] == ("E011", "A inherits from itself")
