"""The evaluation order of a graph body (spec 5.11.5).

Operations run in topological order of their data dependencies, not in the
order they are written: a flow may use a name that a later line defines. This
module sorts the statements of one graph body (stable: independent statements
keep their written order) and reports dependency cycles, naming the tensors
on the cycle. An ``if`` and a ``recompute:`` block each move as one unit;
their own bodies are sorted when they run. A flow annotated ``@barrier`` is an
ordering point: the statements written after it run after it (those it needs
itself excepted: a data dependency comes first).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from modeldsl.diagnostics import DiagnosticSink
from modeldsl.frontend.text import ast


def defined_names(stmt: ast.Stmt) -> set[str]:
    """The tensor names a statement assigns."""
    if isinstance(stmt, ast.Flow):
        return {n.id for n in _targets(stmt.chain[-1]) if n.id != "_"}
    if isinstance(stmt, ast.If):
        return set().union(*(defined_names(s) for s in [*stmt.then, *(stmt.orelse or [])]))
    if isinstance(stmt, ast.Section):
        return set().union(*(defined_names(s) for s in stmt.body))
    return set()


def used_names(stmt: ast.Stmt) -> set[str]:
    """Every plain name a statement reads (tensors, parameters and constants alike)."""
    if isinstance(stmt, ast.Flow):
        return set().union(*(expression_names(node) for node in stmt.chain[:-1]))
    if isinstance(stmt, ast.If):
        inner = [*stmt.then, *(stmt.orelse or [])]
        return expression_names(stmt.condition).union(*(used_names(s) for s in inner))
    if isinstance(stmt, ast.Section):
        return set().union(*(used_names(s) for s in stmt.body))
    return set()


def topological_order(statements: Sequence[ast.Stmt], sink: DiagnosticSink,
                      code: str) -> tuple[list[ast.Stmt], list[ast.Stmt]]:
    """(statements in an order that defines names before their uses, statements on
    or behind a dependency cycle). Each cycle is reported once with ``code``."""
    definers: dict[str, list[int]] = {}
    for index, stmt in enumerate(statements):
        for name in defined_names(stmt):
            definers.setdefault(name, []).append(index)
    needs = [
        sorted({d for name in used_names(stmt) for d in definers.get(name, []) if d != index})
        for index, stmt in enumerate(statements)
    ]
    _order_after_barriers(statements, needs)
    done: set[int] = set()
    ordered: list[int] = []
    progress = True
    while progress:
        progress = False
        for index in range(len(statements)):
            if index not in done and all(d in done for d in needs[index]):
                done.add(index)
                ordered.append(index)
                progress = True
                break  # restart from the top: the earliest ready statement goes first
    stuck = [i for i in range(len(statements)) if i not in done]
    if stuck:
        _report_cycle(statements, needs, stuck, definers, sink, code)
    return [statements[i] for i in ordered], [statements[i] for i in stuck]


def is_barrier(stmt: ast.Stmt) -> bool:
    """Whether a statement is a flow annotated ``@barrier`` (spec 5.11.5)."""
    return isinstance(stmt, ast.Flow) and any(a.name == "barrier" for a in stmt.annotations)


def _order_after_barriers(statements: Sequence[ast.Stmt], needs: list[list[int]]) -> None:
    """Each statement written after a ``@barrier`` flow needs it, unless the barrier needs that
    statement (directly or not): its data comes first, and no cycle is made."""
    for barrier in [i for i, stmt in enumerate(statements) if is_barrier(stmt)]:
        before, stack = set(), list(needs[barrier])
        while stack:  # what the barrier needs, transitively
            index = stack.pop()
            if index not in before:
                before.add(index)
                stack.extend(needs[index])
        for later in range(barrier + 1, len(statements)):
            if later not in before and barrier not in needs[later]:
                needs[later] = sorted([*needs[later], barrier])


def _report_cycle(statements: Sequence[ast.Stmt], needs: list[list[int]], stuck: list[int],
                  definers: dict[str, list[int]], sink: DiagnosticSink, code: str) -> None:
    """Walk back from the first stuck statement until a statement repeats: that is the cycle."""
    path = [stuck[0]]
    while True:
        nxt = next(d for d in needs[path[-1]] if d in stuck)
        if nxt in path:
            cycle = path[path.index(nxt):]
            break
        path.append(nxt)
    first = min(cycle)
    names = [_name_between(statements, a, b, definers) for a, b in zip(cycle, cycle[1:] + cycle[:1])]
    chain = " <- ".join(names + names[:1])
    kind = "gradient" if code == "E019" else "recompute" if code == "E022" else "data"
    sink.error(code, f"circular {kind} dependency: {chain}", statements[first].span,
               "each tensor must be computed from tensors computed before it; break the cycle")


def _name_between(statements: Sequence[ast.Stmt], user: int, definer: int, definers: dict[str, list[int]]) -> str:
    """A name that statement ``user`` reads and statement ``definer`` defines."""
    shared = sorted(n for n in used_names(statements[user]) if definer in definers.get(n, []))
    return shared[0] if shared else "?"


def _targets(node: ast.Expr) -> Iterable[ast.Name]:
    for target in node.items if isinstance(node, ast.TupleExpr) else [node]:
        target = target.value if isinstance(target, ast.Annotated) else target
        if isinstance(target, ast.Name):
            yield target


def expression_names(node: ast.Node | None) -> set[str]:
    """Plain names in an expression; a called function's name and ``saved.x`` fields are not names."""
    if node is None or isinstance(node, ast.Annotation):
        return set()  # annotation arguments are words and constants, not graph names
    if isinstance(node, ast.Name):
        return {node.id}
    if isinstance(node, ast.Call):
        return set().union(*(expression_names(a.value) for a in node.args))
    if isinstance(node, ast.Attribute):
        return expression_names(node.base) - {"saved"}
    names: set[str] = set()
    for value in vars(node).values():
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, ast.Node):
                names |= expression_names(item)
    return names
