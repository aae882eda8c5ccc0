"""ConstExpr evaluation, let: sections and constraints (E002, E016, E026, E027)."""

import math

import pytest

from modeldsl.diagnostics import DiagnosticSink
from modeldsl.frontend.text import ast
from modeldsl.frontend.text.parser import parse_source
from modeldsl.resolve.consts import (
    ConstEnv,
    ConstError,
    NotConstant,
    check_constraints,
    evaluate,
    evaluate_let,
    guard_value,
)
from modeldsl.symbolic import Expr


def expr(text: str) -> ast.Expr:
    (decl,) = parse_source(f"module M():\n  let:\n    v = {text}\n").declarations
    return decl.body[0].body[0].value


ENV = ConstEnv({"d_model": 4096, "num_heads": 32, "use_bias": False, "eps": 1e-5, "name": "llama"}, {"x"})


@pytest.mark.parametrize(
    "text, value",
    [
        ("d_model // num_heads", 128),
        ("d_model % 8 == 0", True),
        ("num_heads > 0 and not use_bias", True),
        ("use_bias or d_model >= 4096", True),
        ("1.0 / sqrt(d_model // num_heads)", 1 / math.sqrt(128)),
        ("ceil_div(d_model, 3)", 1366),
        ("min(d_model, 1024) + max(1, 2) - abs(-3)", 1023),
        ("2 ** 10", 1024),
        ("-num_heads", -32),
        ("None", None),
        ('"text"', "text"),
        ("25_000_000", 25000000),
        ("eps * 10", pytest.approx(1e-4)),
    ],
)
def test_evaluates_const_expressions(text, value):
    assert evaluate(expr(text), ENV) == value


def test_symbolic_parameters_give_symbolic_dimensions():
    env = ConstEnv({"d_model": Expr.sym("d_model"), "num_heads": Expr.sym("num_heads")})
    assert evaluate(expr("d_model // num_heads"), env) == Expr.parse("d_model // num_heads")
    assert evaluate(expr("2 * d_model + 1 - d_model"), env) == Expr.parse("d_model + 1")
    assert evaluate(expr("d_model + 1 > d_model"), env) is True
    with pytest.raises(NotConstant):
        evaluate(expr("d_model % num_heads == 0"), env)


@pytest.mark.parametrize(
    "text, code, message",
    [
        ("missing + 1", "E002", "undefined identifier 'missing'"),
        ("x.shape[0]", "E026", "depends on a tensor"),
        ("d_model / 0", "E026", "division by zero"),
        ('name + 1', "E026", "cannot combine str and int"),
        ('name >= 1', "E026", "cannot compare str and int"),
        ("reduce_sum(x)", "E026", "depends on a tensor"),
        ("softmax(2)", "E026", "calls the primitive softmax()"),
        ("unknown_fn(2)", "E026", "not a compile-time expression"),
    ],
)
def test_bad_const_expressions_are_coded(text, code, message):
    with pytest.raises(ConstError) as info:
        evaluate(expr(text), ENV)
    assert info.value.code == code and message in info.value.message
    assert info.value.span is not None


def test_if_guard_on_a_tensor_is_e016():
    sink = DiagnosticSink()
    assert guard_value(expr("x.shape[0] > 32"), ENV, sink) is None
    (diag,) = sink.diagnostics
    assert diag.code == "E016" and "depends on a tensor" in diag.message
    sink = DiagnosticSink()
    assert guard_value(expr("x"), ENV, sink) is None
    assert sink.diagnostics[0].code == "E016"
    assert guard_value(expr("use_bias"), ENV, DiagnosticSink()) is False


LET = '''module SafeLinear(in_dim: int, out_dim: int):
  let:
    half = out_dim // 2
    constraint:
      in_dim > 0, "Input dimension must be positive"
      out_dim % 8 == 0, "FP8 requires output dim multiple of 8"
      half, "not a condition"
      x > 0, "uses a tensor"
'''


def test_let_bindings_and_constraints_in_declaration_order():
    (decl,) = parse_source(LET, "safe.module").declarations
    env = ConstEnv({"in_dim": 64, "out_dim": 12}, {"x"})
    sink = DiagnosticSink()
    evaluate_let(decl.body[0], env, sink)
    assert env.values["half"] == 6
    codes = [(d.code, d.span.line) for d in sink.diagnostics]
    assert codes == [("E027", 6), ("E026", 7), ("E026", 8)]
    assert sink.diagnostics[0].message == "constraint violated: FP8 requires output dim multiple of 8"
    assert sink.diagnostics[0].render().startswith("safe.module:6:7: error[E027]")


def test_constraints_on_unbound_config_values_wait_for_specialization():
    (decl,) = parse_source(LET, "safe.module").declarations
    env = ConstEnv({"in_dim": Expr.sym("in_dim"), "out_dim": Expr.sym("out_dim")}, {"x"})
    sink = DiagnosticSink()
    check_constraints(decl.body[0].body[1], env, sink)
    # `half` is not bound here (no let evaluation), `x` is a tensor; the symbolic ones wait
    assert [d.code for d in sink.diagnostics] == ["E002", "E026"]


def test_let_declares_symbolic_dimensions():
    (decl,) = parse_source("module M():\n  let:\n    B: batch_dim\n    N = B * 2\n").declarations
    env = ConstEnv()
    evaluate_let(decl.body[0], env, DiagnosticSink())
    assert env.values["N"] == Expr.parse("2*B")


@pytest.mark.parametrize("text", ["2 ** 2 ** 2 ** 2 ** 2 ** 2", "9223372036854775807 + 1", "1e308 * 10.0",
                                  "10.0 ** 400"])
def test_const_results_past_64_bits_are_e026_without_computing_them(text):
    with pytest.raises(ConstError) as info:
        evaluate(expr(text), ConstEnv())
    assert info.value.code == "E026" and "out of range" in info.value.message
