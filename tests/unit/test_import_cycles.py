"""No import cycles among modeldsl's modules (the static graph of :mod:`module_imports`:
every import, those inside functions too). A cycle fails the test with the imports that form it.
"""

from __future__ import annotations

import module_imports
from module_imports import graph, strongly_connected


def describe(component: frozenset[str]) -> str:
    """The imports inside one cycle, with their lines."""
    lines = [f"  {i.importer} -> {i.imported} (line {i.line}{', its package' if i.implicit else ''})"
             for i in module_imports.all_imports() if i.importer in component and i.imported in component]
    return "a cycle of " + ", ".join(sorted(component)) + ":\n" + "\n".join(lines)


def test_strongly_connected_finds_the_cycles_of_a_graph():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": {"e"}, "e": {"d"}, "f": {"a"}}
    assert sorted(sorted(c) for c in strongly_connected(edges)) == [["a", "b", "c"], ["d", "e"]]
    assert strongly_connected({"a": {"b"}, "b": set()}) == []


def test_the_graph_holds_imports_inside_functions_and_the_packages_they_load():
    edges = graph()
    assert "modeldsl.lower" in edges and "modeldsl.passes.registry" in edges and "modeldsl.tools.opt" in edges
    # tools/run.py imports modeldsl.tools.train at its top; tools/train.py the tokenizer inside a function
    assert "modeldsl.tools.train" in edges["modeldsl.tools.run"]
    assert "modeldsl.tokenizer" in edges["modeldsl.tools.train"]
    # from modeldsl.lower.backward import ... (in lower/lowering.py) runs nothing above: its package is loaded
    assert "modeldsl.lower" not in edges["modeldsl.lower.lowering"]


def test_no_import_cycles():
    cycles = strongly_connected(graph())
    assert not cycles, "import cycles:\n" + "\n".join(describe(c) for c in cycles)
