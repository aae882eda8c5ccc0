"""Topological order of graph statements (spec 5.11.5) and cycle reports."""

from modeldsl.diagnostics import DiagnosticSink
from modeldsl.frontend.text.parser import parse_source
from modeldsl.resolve.order import defined_names, topological_order, used_names


def graph(lines: str):
    text = "module M():\n  forward:\n    graph:\n" + "".join(f"      {line}\n" for line in lines.strip().split("\n"))
    decl = parse_source(text, "m.module").declarations[0]
    forward = decl.sections("forward")[0]
    return next(s for s in forward.body if s.name == "graph").body


def test_names_read_and_defined():
    (flow,) = graph("(x, saved.h) -> matmul(w, transpose=NT) -> (y, _)")
    assert defined_names(flow) == {"y"}
    assert used_names(flow) == {"x", "w", "NT"}  # saved.h is not a graph name


def test_written_order_is_kept_unless_a_use_comes_first():
    body = graph("a -> relu() -> b\nc -> relu() -> d\nb -> relu() -> c")
    ordered, cyclic = topological_order(body, DiagnosticSink(), "E007")
    assert [sorted(defined_names(s)) for s in ordered] == [["b"], ["c"], ["d"]] and cyclic == []


def test_a_cycle_is_reported_once_with_its_names_and_the_rest_still_runs():
    sink = DiagnosticSink()
    body = graph("x -> relu() -> y\np -> relu() -> q\nq -> relu() -> p\nq -> relu() -> r")
    ordered, cyclic = topological_order(body, sink, "E019")
    assert [sorted(defined_names(s)) for s in ordered] == [["y"]]
    assert len(cyclic) == 3
    (diag,) = sink.diagnostics
    assert diag.code == "E019" and diag.span.line == 5 and "p <- q <- p" in diag.message
