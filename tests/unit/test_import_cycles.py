"""No import cycles among modeldsl's modules (the static graph of :mod:`module_imports`:
every import, those inside functions too).

The cycles still being taken apart are listed, each by the one import that closes it, in
``KNOWN_CYCLES_BEING_REMOVED``. The graph without those imports must have no cycle, and
each of them must still close one: fixing a cycle means deleting its entry here, and a new
cycle fails the test with the imports that form it.
"""

from __future__ import annotations

import module_imports
from module_imports import graph, strongly_connected

KNOWN_CYCLES_BEING_REMOVED = {
    # modeldsl.frontend's read_model (in the package, which every frontend.text import runs) reads
    # the Python DSL's API, whose compiler functions call lowering, the JSON IR, the registry and
    # the runtime; the Python DSL's builder and translation import each other; and the Python
    # DSL's translation resolves Array elements with the resolver, which parses .py imports with it
    ("modeldsl.frontend", "modeldsl.frontend.python"),
    ("modeldsl.frontend.python.translate", "modeldsl.resolve.imports"),
}


def without(edges: dict[str, set[str]], removed: set[tuple[str, str]]) -> dict[str, set[str]]:
    return {module: {t for t in targets if (module, t) not in removed} for module, targets in edges.items()}


def reaches(edges: dict[str, set[str]], start: str, goal: str) -> bool:
    seen, todo = {start}, [start]
    while todo:
        for target in edges.get(todo.pop(), ()):
            if target == goal:
                return True
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return False


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


def test_no_import_cycles_beyond_the_known_ones():
    remaining = strongly_connected(without(graph(), KNOWN_CYCLES_BEING_REMOVED))
    assert not remaining, "import cycles:\n" + "\n".join(describe(c) for c in remaining)


def test_each_known_cycle_is_still_there():
    edges = graph()
    gone = sorted((a, b) for a, b in KNOWN_CYCLES_BEING_REMOVED
                  if b not in edges.get(a, ()) or not reaches(edges, b, a))
    assert not gone, f"no longer cycles: remove them from KNOWN_CYCLES_BEING_REMOVED: {gone}"
