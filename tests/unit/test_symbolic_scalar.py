"""Symbolic scalar expressions (modeldsl.symbolic_scalar): folding, evaluation, both spellings."""

from __future__ import annotations

import math
import re

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from modeldsl.symbolic import Expr, SymbolicError
from modeldsl.symbolic_scalar import MAX_DEPTH, ScalarExpr


def parse(text: str) -> ScalarExpr:
    return ScalarExpr.parse(text)


@pytest.mark.parametrize("dsl, ir", [
    ("1.0 / sqrt(d_head)", "1.0 / sqrt(d_head)"),
    ("1.0 / (B * T)", "1.0 / (B * T)"),
    ("a - (b - c)", "a - (b - c)"),
    ("a // 2 % b", "a floordiv 2 mod b"),
    ("-x ** 2", "-pow(x, 2)"),
    ("(-x) ** 2", "pow(-x, 2)"),
    ("a ** b ** c", "pow(a, pow(b, c))"),
    ("1e-06 * a", "1.0e-06 * a"),
    ("x * -3", "x * -3"),
    ("min(a, b, 4) + ceil_div(a, 4)", "min(a, b, 4) + ceil_div(a, 4)"),
])
def test_both_spellings_parse_back_to_the_same_tree(dsl, ir):
    tree = parse(dsl)
    assert tree.text() == ir and parse(ir) == tree and parse(tree.text(ir=False)) == tree


def test_constants_fold_as_the_tree_is_built():
    assert parse("2 * 3 + a") == parse("6 + a")
    assert parse("1.0 / sqrt(64)") == ScalarExpr.num(0.125)
    assert parse("-(2)").kind == "num" and parse("-(2)").value == -2
    assert parse("1 / a") != parse("1.0 / a")  # an integer and a float constant are different trees


@pytest.mark.parametrize("text, bindings, value", [
    ("1.0 / sqrt(d_head)", {"d_head": 64}, 0.125),
    ("1.0 / (B * T)", {"B": 2, "T": 4}, 0.125),
    ("num_experts + 1", {"num_experts": 8}, 9),
    ("ceil_div(a, 4) + int(a / 3) - a % 3", {"a": 10}, 3 + 3 - 1),
    ("max(a, b) ** 2", {"a": 3, "b": 5}, 25),
])
def test_evaluation_follows_the_const_expr_rules(text, bindings, value):
    result = parse(text).evaluate(bindings)
    assert result == value and type(result) is type(value)


def test_partial_bindings_leave_the_rest_symbolic():
    assert parse("1.0 / (B * T)").subs({"B": 2}).text() == "1.0 / (2 * T)"
    with pytest.raises(SymbolicError, match="unbound symbol"):
        parse("1.0 / (B * T)").evaluate({"B": 2})


@pytest.mark.parametrize("text, bindings, words", [
    ("1.0 / (d - 4)", {"d": 4}, "division by zero"),
    ("sqrt(1 - d)", {"d": 2}, "has no value"),
    ("10.0 ** d", {"d": 400}, "out of range"),
    ("2 ** d", {"d": 10**6}, "out of range"),
])
def test_no_value_is_a_symbolic_error(text, bindings, words):
    with pytest.raises(SymbolicError, match=words):
        parse(text).evaluate(bindings)


def test_integer_expressions_and_their_dimension_form():
    assert parse("num_experts + 1").is_int() and parse("num_experts + 1").as_dim() == Expr.parse("num_experts + 1")
    assert parse("(a + 1) // 2").as_dim() == Expr.parse("(a + 1) floordiv 2")
    assert parse("ceil_div(a, 4)").as_dim() == Expr.parse("a ceildiv 4")
    assert parse("a ** 2").as_dim() == Expr.parse("a*a")
    assert not parse("a / 2").is_int() and parse("a / 2").as_dim() is None
    assert parse("min(a, 2)").is_int() and parse("min(a, 2)").as_dim() is None
    assert not parse("2 ** -a").is_int()
    assert ScalarExpr.of(Expr.parse("2*D*Hkv + D*Hq")).as_dim() == Expr.parse("2*D*Hkv + D*Hq")


@pytest.mark.parametrize("text, words", [
    ("", "empty"),
    ("a +", "ends early"),
    ("(a", "expected ')'"),
    ("cbrt(a)", "unknown function 'cbrt'"),
    ("sqrt(a, b)", "takes 1 argument"),
    ("a $ b", "unexpected character"),
    (" + ".join(["a"] * (MAX_DEPTH + 5)), "deeper than"),
    ("(" * (MAX_DEPTH + 5) + "a" + ")" * (MAX_DEPTH + 5), "deeper than"),
])
def test_bad_text_is_a_symbolic_error(text, words):
    with pytest.raises(SymbolicError, match=re.escape(words)):
        parse(text)


NAMES = ("a", "b", "d_head")


def trees() -> st.SearchStrategy[ScalarExpr]:
    leaves = st.one_of(st.sampled_from(NAMES).map(ScalarExpr.sym),
                       st.integers(-5, 9).map(ScalarExpr.num),
                       st.sampled_from([0.5, 1.0, 2.5e-7, 3e10]).map(ScalarExpr.num))

    def grow(children):
        binary = st.tuples(st.sampled_from(["+", "-", "*", "/", "//", "%", "**"]), children, children)
        call = st.tuples(st.sampled_from(["sqrt", "abs", "neg"]), children)
        return st.one_of(binary.map(lambda t: _or_none(ScalarExpr.binary, *t)),
                         call.map(lambda t: -t[1] if t[0] == "neg" else _or_none(ScalarExpr.call, *t)),
                         st.tuples(children, children).map(lambda ab: _or_none(ScalarExpr.call, "max", *ab))
                         ).filter(lambda t: t is not None)

    return st.recursive(leaves, grow, max_leaves=8)


def _or_none(build, *args):
    try:
        return build(*args)
    except SymbolicError:
        return None


@settings(max_examples=300, deadline=None)
@given(trees(), st.integers(1, 6), st.integers(1, 6), st.integers(1, 6))
def test_any_tree_prints_in_both_spellings_that_parse_back_and_evaluates_as_python(tree, a, b, d_head):
    assert parse(tree.text()) == tree and parse(tree.text(ir=False)) == tree
    bindings = {"a": a, "b": b, "d_head": d_head}
    try:
        python = eval(tree.text(ir=False), {"sqrt": math.sqrt, "max": max, "abs": abs}, bindings)  # noqa: S307
    except (ZeroDivisionError, ValueError, OverflowError, TypeError):
        python = None
    assume(python is not None and not isinstance(python, complex) and abs(python) < 2**63
           and math.isfinite(python))  # beyond, an integer power is out of range (as an i64 attribute)
    try:
        value = tree.evaluate(bindings)
    except SymbolicError as err:  # an integer power past 64 bits on the way, which Python computes
        assume("out of range" not in str(err))
        raise
    assert value == python
