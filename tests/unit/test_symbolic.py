"""Symbolic dimension arithmetic: canonical forms, simplification, parsing, evaluation."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from modeldsl.symbolic import (
    STAR,
    Expr,
    SymbolicError,
    definitely_different,
    make_shape,
    numel,
    shape_text,
    static_shape,
)

E = Expr.parse


@pytest.mark.parametrize(
    "a, b",
    [
        ("(Hq+2*Hkv)*D", "D*Hq + Hkv*D*2"),
        ("B*T", "T*B"),
        ("(Hq*D)//Hq", "D"),
        ("(2*T+1)//2", "T"),
        ("(4*x+3) % 4", "3"),
        ("8 ceildiv 3", "3"),
        ("T - T", "0"),
        ("D // 1", "D"),
        ("(B*T*C) // (T*C)", "B"),
        ("(2*a + 2*b) // 2", "a + b"),
        ("((a+b)*(a-b))", "a*a - b*b"),
        ("D floordiv 2", "D//2"),
        ("x mod 3", "x % 3"),
    ],
)
def test_equal_expressions_have_one_canonical_form(a, b):
    assert E(a) == E(b)
    assert str(E(a)) == str(E(b))
    assert hash(E(a)) == hash(E(b))


@pytest.mark.parametrize(
    "text, printed",
    [
        ("B*T", "B*T"),
        ("(Hq+2*Hkv)*D", "2*D*Hkv + D*Hq"),
        ("D//2", "D floordiv 2"),
        ("-(D//2)", "-(D floordiv 2)"),
        ("2*(D//2)", "2*(D floordiv 2)"),
        ("(T+1)//2", "(T + 1) floordiv 2"),
        ("T-1", "T - 1"),
        ("3-T", "-T + 3"),
        ("x % 4", "x mod 4"),
        ("0", "0"),
    ],
)
def test_printing_is_canonical_and_reparses(text, printed):
    assert str(E(text)) == printed
    assert E(printed) == E(text)


def test_irreducible_divisions_stay_symbolic():
    assert not E("(T+1)//2").is_const()
    assert E("(T+1)//2") != E("T//2")
    assert E("D//2").symbols() == {"D"}


def test_evaluate_and_substitute():
    assert E("(Hq+2*Hkv)*D").evaluate({"Hq": 16, "Hkv": 8, "D": 128}) == 4096
    assert E("(T+1)//2").evaluate({"T": 7}) == 4
    assert E("B*T").subs({"B": 2}) == E("2*T")
    with pytest.raises(SymbolicError, match="unbound symbol"):
        E("B*T").evaluate({"B": 2})


@pytest.mark.parametrize("bad", ["", "B*", "(B", "B)", "B $ 2", "1 // 0", "x % 0", "*"])
def test_malformed_expressions_are_errors(bad):
    with pytest.raises(SymbolicError):
        E(bad)


def test_shapes():
    shape = make_shape(["*", "T", 64])
    assert shape[0] is STAR
    assert shape_text(shape) == "[*, T, 64]"
    assert numel(shape) is None
    assert numel(make_shape(["B", "T", 4])) == E("4*B*T")
    assert static_shape(make_shape([2, "3*4"])) == (2, 12)
    with pytest.raises(SymbolicError, match="leading"):
        make_shape(["B", "*"])


def test_definitely_different_only_for_provable_differences():
    assert definitely_different(E("4"), E("8"))
    assert definitely_different(E("T+1"), E("T"))
    assert definitely_different(E("64*B*T"), E("128*B*T"))
    assert not definitely_different(E("B"), E("T"))
    assert not definitely_different(E("2*(D//2)"), E("D"))
    assert not definitely_different(E("B*T"), E("4*T"))
    assert not definitely_different(E("B"), E("B"))
    assert not definitely_different(STAR, E("4"))


names = st.sampled_from(["B", "T", "D", "H"])
leaves = st.one_of(st.integers(0, 9).map(str), names)


def _exprs(depth):
    if depth == 0:
        return leaves
    sub = _exprs(depth - 1)
    return st.one_of(
        leaves,
        st.tuples(sub, st.sampled_from(["+", "-", "*"]), sub).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
        st.tuples(sub, st.sampled_from(["//", "%"]), st.integers(1, 5)).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
    )


@settings(max_examples=300, deadline=None)
@given(_exprs(3), st.fixed_dictionaries({n: st.integers(0, 12) for n in "BTDH"}))
def test_simplification_preserves_value(text, env):
    """The canonical form evaluates like Python does on the original text."""
    expected = eval(text, {}, dict(env))  # noqa: S307 - test oracle on generated arithmetic
    expr = E(text)
    assert expr.evaluate(env) == expected
    assert E(str(expr)).evaluate(env) == expected


@pytest.mark.parametrize("dims, typed_rank, rank, axes", [
    ([0], 2, 3, [0, 1]),        # [*, d] on [B, T, d]: '*' is B and T
    ([0], 2, 2, [0]),           # [*, d] on [N, d]
    ([1], 2, 4, [3]),           # the dim after '*' shifts
    ([-1], 2, 3, [2]),
    ([0, 1], 3, 4, [0, 1, 2]),  # [*, h, d] on [B, T, h, d]: '*' and h
])
def test_star_axes_name_every_axis_the_star_stands_for(dims, typed_rank, rank, axes):
    from modeldsl.symbolic import star_axes

    assert star_axes(dims, typed_rank, rank) == axes
