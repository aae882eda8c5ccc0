"""Name scopes of a graph: single assignment (E017) and undefined names (E002).

Graph bodies are in SSA form (spec 5.11.1): a tensor name is assigned once.
The two branches of an ``if``/``else`` are separate scopes, so each may
define the same name; the names the branch taken defines become visible
after the ``if``. ``_`` discards a value and is never defined.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from modeldsl.diagnostics import Diagnostic, DiagnosticSink, Span

DISCARD = "_"


@dataclass
class Binding:
    value: Any
    span: Span | None
    kind: str = "tensor"  # tensor | param | input | module


@dataclass
class Scope:
    """One level of names; ``parent`` levels are visible but not redefinable."""

    sink: DiagnosticSink
    parent: "Scope | None" = None
    names: dict[str, Binding] = field(default_factory=dict)

    def find(self, name: str) -> Binding | None:
        scope: Scope | None = self
        while scope is not None:
            if name in scope.names:
                return scope.names[name]
            scope = scope.parent
        return None

    def define(self, name: str, value: Any, span: Span | None, kind: str = "tensor") -> None:
        """Bind a name; a second assignment in this scope or an enclosing one is E017."""
        if name == DISCARD:
            return
        previous = self.find(name)
        if previous is not None:
            diagnostic = Diagnostic(
                "E017", f"'{name}' is already defined; graph names are assigned once", span,
                "give the new value a new name (graphs are in single-assignment form)",
            )
            if previous.span is not None:
                diagnostic.notes.append((f"'{name}' was first defined here", previous.span))
            self.sink.add(diagnostic)
            return
        self.names[name] = Binding(value, span, kind)

    def rebind(self, name: str, value: Any) -> None:
        """Give a defined name a new value (a gradient accumulated into, spec 5.12.3)."""
        scope: Scope | None = self
        while scope is not None and name not in scope.names:
            scope = scope.parent
        if scope is not None:
            scope.names[name].value = value

    def lookup(self, name: str, span: Span | None) -> Binding | None:
        """The binding of a name, or an E002 diagnostic with a did-you-mean hint."""
        found = self.find(name)
        if found is None:
            self.sink.error("E002", f"undefined identifier '{name}'", span, self.suggest(name))
        return found

    def visible_names(self) -> list[str]:
        names: list[str] = []
        scope: Scope | None = self
        while scope is not None:
            names.extend(scope.names)
            scope = scope.parent
        return names

    def suggest(self, name: str) -> str:
        close = difflib.get_close_matches(name, self.visible_names(), n=1)
        return f"did you mean '{close[0]}'?" if close else "define it before it is used"

    def child(self) -> "Scope":
        return Scope(self.sink, self)

    @contextmanager
    def branches(self, taken: int | None, count: int = 2) -> Iterator[list["Scope"]]:
        """Scopes for the branches of an ``if``/``else``, each checked against the
        names defined before it; the names of branch ``taken`` flow out afterwards."""
        inner = [self.child() for _ in range(count)]
        yield inner
        if taken is not None:
            self.names.update(inner[taken].names)
