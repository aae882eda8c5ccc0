"""Module inheritance (spec 4.2, 4.3): abstract modules, ``extends`` and ``+param`` additions.

``module Child(...) extends Base:`` inherits Base's parameters and forward
signature; ``+name:`` entries add parameters, and the child supplies the
graph. The result is one merged declaration that lowering treats like any
other. Incompatible inheritance is E011: extending something that is not a
module or block, leaving out a signature parameter of the base, redeclaring
an inherited parameter without ``+`` differently, or a concrete module
without a graph; an abstract module cannot be lowered or instantiated.
"""

from __future__ import annotations

from dataclasses import replace

from modeldsl.diagnostics import DiagnosticSink
from modeldsl.frontend.text import ast

INHERITABLE = ("module", "block")


def merged(decl: ast.Decl, namespace: dict[str, ast.Decl], sink: DiagnosticSink,
           seen: tuple[str, ...] = ()) -> ast.Decl | None:
    """The declaration with everything it inherits folded in; None after an E011."""
    if decl.extends is None:
        return decl
    base = namespace.get(decl.extends)
    if decl.kind not in INHERITABLE:
        sink.error("E011", f"a {decl.kind} cannot extend another declaration", decl.span.word("extends"),
                   "only modules and blocks use 'extends'")
        return None
    if base is None or base.kind not in INHERITABLE:
        what = "an undefined name" if base is None else f"a {base.kind}"
        sink.error("E011", f"{decl.name} extends {decl.extends}, which is {what}",
                   decl.span.word(decl.extends, last=True),
                   "a module or block can extend a module or block")
        return None
    if decl.extends in seen or decl.extends == decl.name:
        sink.error("E011", f"{decl.name} inherits from itself", decl.span.word(decl.extends, last=True))
        return None
    base = merged(base, namespace, sink, (*seen, decl.name))
    if base is None:
        return None
    if not _signature_compatible(decl, base, sink):
        return None
    params = _merge_params(decl, base, sink)
    forward = _merge_forward(decl, base, sink)
    if params is None or forward is None:
        return None
    body = [s for s in decl.body if not (isinstance(s, ast.Section) and s.name in ("params", "forward"))]
    body += [params, forward]
    return replace(decl, body=body, extends=None)


def _signature_compatible(decl: ast.Decl, base: ast.Decl, sink: DiagnosticSink) -> bool:
    mine = {p.name for p in decl.params or [] if p.name}
    missing = [p.name for p in base.params or [] if p.name and p.name not in mine and p.default is None]
    if missing:
        sink.error("E011", f"{decl.name} extends {base.name} but does not take its parameter(s) {', '.join(missing)}",
                   decl.span, f"add them to the signature: {decl.name}({', '.join(missing)}, ...)")
        return False
    return True


def _entries(decl: ast.Decl, name: str) -> list[ast.Stmt]:
    return [stmt for section in decl.sections(name) for stmt in section.body]


def _merge_params(decl: ast.Decl, base: ast.Decl, sink: DiagnosticSink) -> ast.Section | None:
    inherited = {e.name: e for e in _entries(base, "params") if isinstance(e, ast.Section)}
    entries = list(inherited.values())
    ok = True
    for entry in _entries(decl, "params"):
        if not isinstance(entry, ast.Section):
            continue
        if entry.added:
            if entry.name in inherited:
                sink.error("E011", f"+{entry.name} adds a parameter that {base.name} already has", entry.span,
                           "drop the '+' to restate it, or choose another name")
                ok = False
                continue
            entries.append(replace(entry, added=False))
        elif entry.name in inherited:
            if _text(entry.value) != _text(inherited[entry.name].value):
                sink.error("E011", f"{entry.name} is declared differently than in {base.name}", entry.span,
                           "an inherited parameter keeps its type; add new parameters with '+name:'")
                ok = False
        else:
            entries.append(entry)
    span = decl.span
    return ast.Section(span, ast.Name(span, "params"), None, entries) if ok else None


def _merge_forward(decl: ast.Decl, base: ast.Decl, sink: DiagnosticSink) -> ast.Section | None:
    own = _entries(decl, "forward")
    names = {e.name for e in own if isinstance(e, ast.Section)}
    base_io = [e for e in _entries(base, "forward") if isinstance(e, ast.Section)]
    inherited: list[ast.Stmt] = []
    for group in (("in", "inputs"), ("out", "outputs")):
        if not names & set(group):
            inherited += [e for e in base_io if e.name in group]
    body = inherited + own
    if not decl.abstract and not any(isinstance(e, ast.Section) and e.name == "graph" for e in body):
        sink.error("E011", f"{decl.name} extends {base.name} but has no graph", decl.span,
                   "a concrete module must give its forward graph")
        return None
    return ast.Section(decl.span, ast.Name(decl.span, "forward"), None, body)


def _text(value: ast.Value | None) -> str:
    return repr(value.expr) if value is not None else ""
