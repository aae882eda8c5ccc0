"""A primitive's ``invariants:`` section (spec 9.8.3): what its backward must have of the forward.

::

    primitive softmax:
      forward:
        in: x: [*]
        out: [*]
      backward:
        in: (d_out: [*], out: [*])
        out: d_x: [*]
      save: [out]
      invariants:
        - backward_uses: [out]   # the gradient reads the output: it must be saved

Each entry is ``- KIND: [tensor, ...]``; the one kind is ``backward_uses``: the tensors (of the
forward's ``in:``/``out:``, by the declaration's names or the op's) that the primitive's backward
reads. The declaration is checked when it is resolved (:func:`check_invariants`):

- an entry of another form is E001, an unknown kind E001 with the closest one;
- a tensor the forward does not have is E002 with the closest name;
- a tensor the backward needs but the declaration's ``save:`` list leaves out, or that a
  kernel backward's ``in:`` does not take, is E006

(:func:`check_declared_invariants`, for the primitive declarations of a program the resolver reads).

The invariants are kept: :func:`invariants_of` gives them by the op's slot names, which the
lowering records on the model (``invariants = {softmax = {backward_uses = ["out"], at = "..."}}``,
:mod:`modeldsl.invariants` checks them against the graph and ``mdsl-opt --verify-backward``
against the backward it checks).
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass

from modeldsl.diagnostics import DiagnosticSink, Span
from modeldsl.dialects.graph import INVARIANT_KINDS
from modeldsl.frontend.text import ast
from modeldsl.primitives import PrimitiveSignature, lookup_primitive

KINDS = INVARIANT_KINDS
FORM = "an invariant is `- backward_uses: [tensor, ...]`"


@dataclass(frozen=True)
class Invariant:
    """One entry: its kind and the tensors it names (with their spans), as written."""

    kind: str
    tensors: tuple[tuple[str, Span], ...]
    span: Span


def written_invariants(decl: ast.Decl, sink: DiagnosticSink | None = None) -> list[Invariant]:
    """The well-formed entries of a declaration's ``invariants:`` sections (E001 to ``sink`` for
    the others)."""
    found: list[Invariant] = []
    for section in decl.sections("invariants"):
        for stmt in section.body:
            if isinstance(stmt, ast.ExprStmt) and isinstance(stmt.expr, (ast.Str, ast.EllipsisLit)):
                continue
            entry = _entry(stmt)
            if entry is None:
                if sink is not None:
                    sink.error("E001", f"primitive {decl.name}: {FORM}", stmt.span,
                               "list the tensors its backward reads: - backward_uses: [out]")
                continue
            kind, span, tensors = entry
            if kind not in KINDS:
                if sink is not None:
                    close = difflib.get_close_matches(kind, KINDS, n=1, cutoff=0.5)
                    sink.error("E001", f"primitive {decl.name} has an unknown invariant '{kind}'", span,
                               (f"did you mean '{close[0]}'? " if close else "")
                               + f"the invariants: {', '.join(KINDS)}")
                continue
            found.append(Invariant(kind, tensors, stmt.span))
    return found


def _entry(stmt: ast.Stmt) -> tuple[str, Span, tuple[tuple[str, Span], ...]] | None:
    if not (isinstance(stmt, ast.ListItem) and isinstance(stmt.value, ast.Name)
            and isinstance(stmt.extra, ast.ListExpr) and not stmt.chain):
        return None
    if not all(isinstance(item, ast.Name) for item in stmt.extra.items):
        return None
    return stmt.value.id, stmt.value.span, tuple((item.id, item.span) for item in stmt.extra.items)


def forward_slots(decl: ast.Decl, sig: PrimitiveSignature) -> dict[str, str]:
    """Each name a tensor of the forward goes by (the declaration's, and the op's at the same
    place) -> the op's slot name."""
    from modeldsl.resolve.primitive_decls import declared_slots

    names: dict[str, str] = {}
    forward = next(iter(decl.sections("forward")), None)
    for key, slots in (("in", sig.positional_inputs), ("out", sig.outputs)):
        entry = next((s for s in forward.body if isinstance(s, ast.Section) and s.name == key), None) \
            if forward is not None else None
        written = declared_slots(entry) if entry is not None else []
        for index, slot in enumerate(slots):
            names.setdefault(slot.name, slot.name)
            if index < len(written) and written[index].name:
                names.setdefault(written[index].name, slot.name)
    return names


def invariants_of(decl: ast.Decl, sig: PrimitiveSignature) -> dict[str, list[str]]:
    """The declaration's invariants by kind, each tensor by the op's slot name (those the forward
    does not have left out: they are E002 where the declaration is resolved)."""
    slots = forward_slots(decl, sig)
    kept: dict[str, list[str]] = {}
    for invariant in written_invariants(decl):
        names = kept.setdefault(invariant.kind, [])
        names += [slots[name] for name, _ in invariant.tensors if name in slots and slots[name] not in names]
    return {kind: names for kind, names in kept.items() if names}


def check_declared_invariants(decls: Sequence[ast.Decl], sink: DiagnosticSink) -> None:
    """:func:`check_invariants` of each primitive declaration of a known op that has ``invariants:``."""
    for decl in decls:
        sig = lookup_primitive(decl.name) if decl.kind == "primitive" and decl.sections("invariants") else None
        if sig is not None:
            check_invariants(decl, sig, sink)


def check_invariants(decl: ast.Decl, sig: PrimitiveSignature, sink: DiagnosticSink) -> None:
    """The checks of the module docstring, at the declaration."""
    invariants = written_invariants(decl, sink)
    if not invariants:
        return
    slots = forward_slots(decl, sig)
    saved = _save_list(decl)
    kernel_inputs = _backward_inputs(decl)
    for invariant in invariants:
        for name, span in invariant.tensors:
            if name not in slots:
                close = difflib.get_close_matches(name, list(slots), n=1)
                sink.error("E002", f"primitive {decl.name}'s invariant {invariant.kind} names '{name}', which is "
                           "no tensor of its forward", span, (f"did you mean '{close[0]}'? " if close else "")
                           + f"its forward's tensors: {', '.join(slots)}")
                continue
            same = {n for n, slot in slots.items() if slot == slots[name]}
            if saved is not None and not same & set(saved):
                sink.error("E006", f"primitive {decl.name}'s backward uses '{name}' ({invariant.kind}), but its "
                           "save: list leaves it out", span, f"add it: save: [{', '.join([*saved, name])}]")
            elif kernel_inputs is not None and not same & set(kernel_inputs):
                sink.error("E006", f"primitive {decl.name}'s backward uses '{name}' ({invariant.kind}), but its "
                           f"backward's in: takes {', '.join(kernel_inputs)}", span,
                           "the backward kernel reads what the invariant names: list it in backward: in:")


def _save_list(decl: ast.Decl) -> list[str] | None:
    section = next(iter(decl.sections("save")), None)
    if section is None or section.value is None or not isinstance(section.value.expr, ast.ListExpr):
        return None
    return [item.id for item in section.value.expr.items if isinstance(item, ast.Name)]


def _backward_inputs(decl: ast.Decl) -> list[str] | None:
    from modeldsl.resolve.primitive_decls import declared_slots

    backward = next(iter(decl.sections("backward")), None)
    entry = next((s for s in backward.body if isinstance(s, ast.Section) and s.name == "in"), None) \
        if backward is not None else None
    if entry is None or entry.value is None:
        return None
    return [slot.name for slot in declared_slots(entry) if slot.name]
