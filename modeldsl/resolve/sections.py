"""The section words of Module DSL declarations: an unknown one is E001 with the closest known word.

A section (``key: value`` with an optional indented body) means what its name says (spec
Appendix A), so a misspelled name would otherwise be dropped without a word: ``recompte: [h]``
under ``forward:`` would leave ``h`` saved. Where a section's key is a word of the language,
not a name the program chooses (a parameter, a tensor, a mapping key), the resolver checks it:

- a declaration's body: ``module`` / ``block`` / ``model`` / ``primitive`` / ``annotation`` each
  take their own sections (``hf_config:`` is a model's, ``pattern:`` a block's, ``impl:`` a
  primitive's); a section another kind takes is E001 saying whose it is;
- ``forward:``: ``in:``, ``inputs:``, ``out:``, ``outputs:``, ``graph:``, ``save:``, ``recompute:``
  (a primitive's: ``in:``, ``out:``, ``impl:``);
- ``backward:``: the gradient declarations ``d_x: [...]``, ``in:``/``inputs:``/``out:``/``outputs:``
  and ``graph:`` (a primitive's: ``in:`` and ``out:`` beside its ``d_x = ...`` formulas);
- a primitive's ``impl:`` (``forward:``, ``backward:``), ``fusion:`` (``patterns:``) and a block's
  ``pattern:`` (``sublayers:``);
- ``let:``: a section with a body is ``constraint:`` (one with a value declares a symbol);
- a primitive's ``precision:`` (``supported:``, ``accumulation:``) and ``constraints:`` (a list,
  ``- product(shape) == product(x.shape)``); its ``memory:`` describes sizes under names of its
  own (``workspace:``, ``saved:``), but not a forward's or backward's ``in:``/``out:``, a
  section of the primitive (``impl:``) or of ``precision:``, nor a parameter (``p: float = 0``).

A section written twice in one body (``impl:`` twice, ``save:`` twice under ``forward:``) is
E001 at the second: one of them would be dropped; ``in:`` and ``out:`` add up, one tensor a line.
The form of a body is checked too: a ``- item`` in a body of sections (``forward:``) or of
declarations (``params:``), a statement in one of sections only (``impl:``, ``precision:``) or in
``constraints:``, an empty primitive section (``fusion:`` with nothing under it) and an ``impl:``
with a backward kernel but no forward one are E001.

A module's ``constants:`` section (spec 6.4.2's RoPE example) is a word of the spec that nothing
lowers: E001 says so and how to pass the tensor instead.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence

from modeldsl.diagnostics import DiagnosticSink
from modeldsl.frontend.text import ast

DECLARATION_SECTIONS: dict[str, tuple[str, ...]] = {
    "module": ("let", "params", "forward", "backward"),
    "block": ("let", "params", "forward", "backward", "pattern"),
    "model": ("let", "params", "forward", "backward", "hf_config", "hf_mapping", "hf_export"),
    "primitive": ("params", "forward", "backward", "save", "impl", "invariants", "constraints", "precision",
                  "fusion", "memory"),
    "annotation": ("params", "applies_to", "compiler_behavior", "runtime_behavior"),
}
FORWARD_SECTIONS = ("in", "inputs", "out", "outputs", "graph", "save", "recompute")
BACKWARD_SECTIONS = ("in", "inputs", "out", "outputs", "graph")
PRIMITIVE_FORWARD_SECTIONS = ("in", "out", "impl")
PRIMITIVE_BACKWARD_SECTIONS = ("in", "out")
PRIMITIVE_PRECISION_KEYS = ("supported", "accumulation")
# declaration sections written with an indented body, and those written with a value
BODY_SECTIONS = ("params", "forward", "backward", "impl", "fusion", "pattern", "hf_config", "hf_mapping",
                 "hf_export", "precision", "memory", "constraints", "invariants", "let")
PROSE_SECTIONS = ("compiler_behavior", "runtime_behavior")  # an annotation's, in words
VALUE_SECTIONS = ("save", "applies_to")
# a primitive's sections that describe it; written, they say something
DESCRIBING_SECTIONS = ("impl", "fusion", "memory", "constraints", "invariants", "precision")
SIGNATURE_WORDS = ("in", "inputs", "out", "outputs", "graph")  # a forward's or backward's, never memory:'s
# a primitive's own sections, never memory:'s (save: is both: memory: may say what the backward keeps)
NOT_MEMORY_WORDS = (*SIGNATURE_WORDS, *PRIMITIVE_PRECISION_KEYS,
                    *(w for w in DECLARATION_SECTIONS["primitive"] if w not in ("save", "memory")))
NESTED_SECTIONS: dict[tuple[str, str], tuple[str, ...]] = {
    ("primitive", "impl"): ("forward", "backward"),
    ("primitive", "fusion"): ("patterns",),
    ("block", "pattern"): ("sublayers",),
}
UNLOWERED = {
    "constants": "constants: sections are not lowered: declare the tensor as a forward input "
                 "(inputs: freq_cis: [...]) and pass it in, or compute it in the graph",
}


def check_sections(declarations: Iterable[ast.Decl], sink: DiagnosticSink) -> None:
    """E001 at each section of the declarations whose name is no word of its place."""
    for decl in declarations:
        known = DECLARATION_SECTIONS.get(decl.kind)
        if known is None:
            continue  # a recipe's keys are its fields (checked where recipes lower)
        _check_repeats(decl.body, f"{decl.kind} {decl.name}", sink)
        for section in _sections(decl.body):
            name = section.name
            if name is None:
                continue
            if name not in known:
                _unknown(section, name, known, f"{decl.kind} {decl.name}", sink, decl.kind)
                continue
            _check_form(section, f"{decl.kind} {decl.name}", sink)
            _check_body(decl, section, sink)


def _check_body(decl: ast.Decl, section: ast.Section, sink: DiagnosticSink) -> None:
    name, kind = section.name, decl.kind
    where = f"the {name}: section of {kind} {decl.name}"
    if name in ("forward", "backward", "precision") or (kind, name) in NESTED_SECTIONS:
        _check_repeats(section.body, where, sink, signatures_add_up=kind != "primitive")
    if kind == "primitive" and name in DESCRIBING_SECTIONS and section.value is None and not section.body:
        sink.error("E001", f"{where} is empty", section.key.span,
                   f"write what it says on the lines under {name}:, or remove it")
    if (kind, name) == ("primitive", "impl"):
        _check_impl(section, where, sink)
    if name == "forward" and kind != "annotation":
        known = PRIMITIVE_FORWARD_SECTIONS if kind == "primitive" else FORWARD_SECTIONS
        _check_words(section.body, known, where, sink)
        _check_no_list_items(section.body, f"it takes {_listing(known)}", where, sink)
    elif name == "backward":
        known = PRIMITIVE_BACKWARD_SECTIONS if kind == "primitive" else BACKWARD_SECTIONS
        _check_words(section.body, known, where, sink, gradients=True)
        _check_no_list_items(section.body, f"it takes {_listing(known)}", where, sink)
    elif (kind, name) in NESTED_SECTIONS:
        _check_words(section.body, NESTED_SECTIONS[(kind, name)], where, sink)
        _check_sections_only(section.body, NESTED_SECTIONS[(kind, name)], where, sink)
    elif name == "params":
        hint = "it declares one parameter a line: name: type = default"
        _check_no_list_items(section.body, hint, where, sink)
        for inner in _sections(section.body):
            if inner.value is None:
                sink.error("E001", f"{where} declares '{inner.key.span.text}' with no type", inner.key.span, hint)
    elif (kind, name) == ("primitive", "precision"):
        _check_words(section.body, PRIMITIVE_PRECISION_KEYS, where, sink)
        _check_sections_only(section.body, PRIMITIVE_PRECISION_KEYS, where, sink)
    elif (kind, name) == ("primitive", "constraints"):
        hint = "constraints: is a list of conditions: - product(shape) == product(x.shape)"
        for stmt in section.body:
            if isinstance(stmt, ast.Section):
                sink.error("E001", f"{where} holds a {stmt.key.span.text}: section", stmt.key.span, hint)
            elif isinstance(stmt, ast.ListItem) and stmt.extra is not None:
                sink.error("E001", f"{where} holds a 'key: value' item, not a condition", stmt.span, hint)
            elif not isinstance(stmt, (ast.ListItem, ast.ExprStmt)):
                sink.error("E001", f"{where} holds a statement", stmt.span, hint)
    elif (kind, name) == ("primitive", "memory"):
        _check_memory(section.body, where, sink)
    elif name == "let":
        for inner in _sections(section.body):
            if inner.value is None and inner.name is not None and inner.name != "constraint":
                _unknown(inner, inner.name, ("constraint",), where, sink,
                         hint="a let: section holds `name = expression` bindings, `B: batch_dim` symbols and "
                              "a constraint: section")


def _check_words(body: Sequence[ast.Stmt], known: tuple[str, ...], where: str, sink: DiagnosticSink,
                 gradients: bool = False) -> None:
    for inner in _sections(body):
        name = inner.name
        if name is None or name in known or gradients and name.startswith("d_"):
            continue
        _unknown(inner, name, known, where, sink, gradients=gradients)


def _check_impl(section: ast.Section, where: str, sink: DiagnosticSink) -> None:
    """E001 where ``impl:`` names a backward kernel but no forward one."""
    names = {inner.name for inner in _sections(section.body)}
    if "backward" in names and "forward" not in names:
        backward = next(inner for inner in _sections(section.body) if inner.name == "backward")
        sink.error("E001", f"{where} names a backward kernel but no forward kernel", backward.key.span,
                   "name the forward kernel first: forward: kernels.NAME")


def _check_memory(body: Sequence[ast.Stmt], where: str, sink: DiagnosticSink) -> None:
    """E001 at what a primitive's memory: cannot hold: a section of the primitive or of its forward, or a
    parameter declaration (``name: type = default``): its entries are sizes, ``workspace: O(B * T)``."""
    hint = "memory: describes the primitive's memory use (workspace:, saved:, ...)"
    for stmt in body:
        if not isinstance(stmt, (ast.Section, ast.ExprStmt, ast.If)):
            what = "a list item" if isinstance(stmt, ast.ListItem) else "a statement"
            sink.error("E001", f"{where} holds {what}", stmt.span, hint)
    for inner in _sections(body):
        if inner.name in NOT_MEMORY_WORDS:
            owner = ("forward's or backward's" if inner.name in SIGNATURE_WORDS else
                     "precision:'s key" if inner.name in PRIMITIVE_PRECISION_KEYS else "primitive's")
            article = "an" if inner.name[0] in "aeiou" else "a"
            sink.error("E001", f"{where} has {article} {inner.name}: section, which is a {owner}", inner.key.span, hint)
        elif inner.value is not None and inner.value.default is not None:
            sink.error("E001", f"{where} declares '{inner.key.span.text}' with a default, as params: does",
                       inner.key.span, hint + "; declare parameters under params:")


def _check_sections_only(body: Sequence[ast.Stmt], known: tuple[str, ...], where: str,
                         sink: DiagnosticSink) -> None:
    """E001 at a statement (``d_x = ...``, a flow) in a body of sections only (``impl:``, ``fusion:``)."""
    for stmt in body:
        if not isinstance(stmt, (ast.Section, ast.ExprStmt, ast.If)):
            sink.error("E001", f"{where} holds a statement", stmt.span, f"it takes the sections {_listing(known)}")


def _check_no_list_items(body: Sequence[ast.Stmt], hint: str, where: str, sink: DiagnosticSink) -> None:
    """E001 at a ``- item`` directly in a body of sections or declarations (``forward:``, ``params:``)."""
    for stmt in body:
        if isinstance(stmt, ast.ListItem):
            sink.error("E001", f"{where} holds a list item", stmt.span, hint)
        elif isinstance(stmt, ast.If):
            _check_no_list_items([*stmt.then, *(stmt.orelse or [])], hint, where, sink)


def _unknown(section: ast.Section, name: str, known: Sequence[str], where: str, sink: DiagnosticSink,
             kind: str | None = None, hint: str = "", gradients: bool = False) -> None:
    span = section.key.span
    if name in UNLOWERED:
        sink.error("E001", f"{where} has a {name}: section, which this compiler does not lower", span,
                   UNLOWERED[name])
        return
    owners = [k for k, words in DECLARATION_SECTIONS.items() if name in words and k != kind] if kind else []
    if owners:
        sink.error("E001", f"{where} has a {name}: section, which is a {' or '.join(owners)}'s", span,
                   f"a {kind} takes {_listing(known)}")
        return
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    words = _listing(known) + (" and gradient declarations d_x: [shape]" if gradients else "")
    prefix = f"did you mean '{close[0]}:'? " if close else ""
    sink.error("E001", f"unknown section '{name}:' in {where}", span, prefix + (hint or f"it takes {words}"))


def _check_form(section: ast.Section, where: str, sink: DiagnosticSink) -> None:
    """E001 where a section that holds an indented body is given a value (``params: [a, b]``), or
    one that takes a value (``save: [x]``) holds a body."""
    name = section.name
    if name in BODY_SECTIONS and section.value is not None and not section.body:
        sink.error("E001", f"the {name}: section of {where} takes an indented body, not a value", section.key.span,
                   f"write its entries on the lines under {name}:")
    elif name in PROSE_SECTIONS and section.value is not None and not isinstance(section.value.expr, ast.Str):
        sink.error("E001", f"the {name}: section of {where} describes the annotation in words", section.key.span,
                   f"write its lines under {name}: as - items")
    elif name in VALUE_SECTIONS and section.value is None and not section.body:
        sink.error("E001", f"the {name}: section of {where} is empty", section.key.span,
                   f"write {name}: [a, b], or remove it")
    elif name in VALUE_SECTIONS and section.value is None and section.body:
        sink.error("E001", f"the {name}: section of {where} takes a list, not an indented body", section.key.span,
                   f"write {name}: [a, b]")


SIGNATURE_SECTIONS = frozenset({"in", "inputs", "out", "outputs"})


def _check_repeats(body: Sequence[ast.Stmt], where: str, sink: DiagnosticSink, signatures_add_up: bool = True) -> None:
    """E001 at a section written a second time in the same body (``if`` branches are bodies of their own);
    a module's signature sections (``in:``, ``out:``) add up, one tensor a line (a primitive's do not:
    each lists its tensors once, a tuple for more than one)."""
    seen: set[tuple[str, bool]] = set()
    repeatable = SIGNATURE_SECTIONS if signatures_add_up else frozenset()
    for stmt in body:
        if isinstance(stmt, ast.Section) and stmt.name is not None and stmt.name not in repeatable:
            key = (stmt.name, stmt.added)
            if key in seen:
                sink.error("E001", f"{where} has a second {'+' if stmt.added else ''}{stmt.name}: section",
                           stmt.key.span, "write each section once: merge the two")
            seen.add(key)
        elif isinstance(stmt, ast.If):
            _check_repeats(stmt.then, where, sink, signatures_add_up)
            _check_repeats(stmt.orelse or [], where, sink, signatures_add_up)


def _listing(known: Sequence[str]) -> str:
    return ", ".join(f"{k}:" for k in known)


def _sections(body: Sequence[ast.Stmt]) -> list[ast.Section]:
    """The sections of a body, those under an ``if`` too."""
    found: list[ast.Section] = []
    for stmt in body:
        if isinstance(stmt, ast.Section):
            found.append(stmt)
        elif isinstance(stmt, ast.If):
            found += _sections(stmt.then) + _sections(stmt.orelse or [])
    return found
