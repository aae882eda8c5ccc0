"""Graph scopes: single assignment (E017), undefined names (E002), if/else branches."""

from modeldsl.diagnostics import DiagnosticSink, Source, Span
from modeldsl.resolve.scope import Scope

SRC = Source("g.module", "x -> relu() -> y\nx -> silu() -> y\n")


def span(line: int, column: int) -> Span:
    return Span(SRC, line, column, line, column + 1)


def test_redefinition_is_e017_with_a_note_at_the_first_definition():
    sink = DiagnosticSink()
    scope = Scope(sink)
    scope.define("y", 1, span(1, 16))
    scope.define("y", 2, span(2, 16))
    (diag,) = sink.diagnostics
    assert diag.code == "E017" and "'y' is already defined" in diag.message
    assert diag.notes[0][1].line == 1
    assert "g.module:1:16: note: 'y' was first defined here" in diag.render()
    assert scope.find("y").value == 1


def test_undefined_name_is_e002_with_a_suggestion():
    sink = DiagnosticSink()
    scope = Scope(sink)
    scope.define("weight", 0, None, "param")
    assert scope.lookup("wieght", span(1, 1)) is None
    (diag,) = sink.diagnostics
    assert diag.code == "E002" and diag.hint == "did you mean 'weight'?"


def test_both_branches_may_define_a_name_and_the_taken_one_flows_out():
    sink = DiagnosticSink()
    scope = Scope(sink)
    scope.define("y", "y", None)
    with scope.branches(taken=0) as (then, orelse):
        then.define("out", "from-then", span(1, 1))
        orelse.define("out", "from-else", span(2, 1))
        orelse.define("y", "again", span(2, 5))
    assert scope.find("out").value == "from-then"
    assert [d.code for d in sink.diagnostics] == ["E017"]  # redefining y inside a branch


def test_discard_is_never_defined():
    sink = DiagnosticSink()
    scope = Scope(sink)
    scope.define("_", 1, None)
    scope.define("_", 2, None)
    assert not sink.diagnostics and scope.find("_") is None


def test_child_scopes_see_but_do_not_shadow_enclosing_names():
    sink = DiagnosticSink()
    scope = Scope(sink)
    scope.define("x", 1, None, "input")
    inner = scope.child()
    assert inner.lookup("x", None).kind == "input"
    inner.define("x", 2, span(1, 1))
    assert sink.diagnostics[0].code == "E017"
