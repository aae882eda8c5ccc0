"""The gradient invariants a model keeps (spec 9.8.3), checked against its graph and its backward.

A ``primitive`` declaration's ``invariants: - backward_uses: [out]`` (read and checked at the
declaration by :mod:`modeldsl.resolve.invariants`) is kept by the lowering on the model op of a
program that uses the primitive::

    mdsl.graph.model @M attributes {invariants = {softmax = {backward_uses = ["out"],
                                                             at = "model.module:12:7"}}}

(the op's slot names; ``at`` where the declaration writes them). The model op's verifier checks
their form (a primitive of the dialect, its slot names). Against a graph:

- :func:`graph_problems` (when the model lowers): the gradient the compiler derives for each op of
  such a primitive (its VJP rule) reads each tensor the invariant names, else E006 at the
  invariant (the declaration and the compiler's backward disagree);
- :func:`backward_problems` (``mdsl-opt --verify-backward``, before the finite differences): the
  backward being checked has each tensor: the derived gradient reads it, a written ``@backward``
  takes it among its ``saved`` tensors; else E006 at the op.

:func:`uses_of` gives each (op, kind, tensor, value) the invariants cover.
"""

from __future__ import annotations

from collections.abc import Iterator

from xdsl.dialects.builtin import ArrayAttr, DictionaryAttr, StringAttr
from xdsl.ir import Operation, SSAValue

from modeldsl.diagnostics import Diagnostic, Source, Span
from modeldsl.dialects.graph import FuncOp, ModelOp
from modeldsl.ir import span_of_location
from modeldsl.primitives import lookup_primitive

ATTRIBUTE = "invariants"


def model_invariants(model: ModelOp) -> dict[str, dict[str, list[str]]]:
    """primitive -> kind -> the op's slot names, as the model keeps them."""
    kept = model.attributes.get(ATTRIBUTE)
    if not isinstance(kept, DictionaryAttr):
        return {}
    found: dict[str, dict[str, list[str]]] = {}
    for primitive, kinds in kept.data.items():
        if isinstance(kinds, DictionaryAttr):
            found[primitive] = {kind: [s.data for s in names.data if isinstance(s, StringAttr)]
                                for kind, names in kinds.data.items()
                                if kind != "at" and isinstance(names, ArrayAttr)}
    return found


def invariants_attribute(kept: dict[str, tuple[dict[str, list[str]], Span | None]]) -> DictionaryAttr:
    """The model's ``invariants`` attribute from primitive -> (kind -> slot names, where written)."""
    entries = {}
    for primitive, (kinds, span) in sorted(kept.items()):
        fields = {kind: ArrayAttr([StringAttr(n) for n in names]) for kind, names in kinds.items()}
        if span is not None:
            fields["at"] = StringAttr(span.location)
        entries[primitive] = DictionaryAttr(fields)
    return DictionaryAttr(entries)


def written_at(model: ModelOp, primitive: str) -> Span | None:
    """The span of a kept invariant's declaration (its ``at``), when the file can be read."""
    kept = model.attributes.get(ATTRIBUTE)
    entry = kept.data.get(primitive) if isinstance(kept, DictionaryAttr) else None
    at = entry.data.get("at") if isinstance(entry, DictionaryAttr) else None
    if not isinstance(at, StringAttr):
        return None
    name, _, rest = at.data.rpartition(":")
    name, _, line = name.rpartition(":")
    try:
        line_no, column = int(line), int(rest)
    except ValueError:
        return None
    from modeldsl.ir import _file_text  # noqa: PLC2701 - the one reader of remembered sources

    text = _file_text(name)
    if not text:
        return None
    source = Source(name, text)
    word = source.line(line_no)[column - 1:].split(":")[0].strip("- ") or "x"
    return Span(source, line_no, column, line_no, column + len(word))


def slot_value(op: Operation, slot: str) -> SSAValue | None:
    """The operand or result of a primitive op that its signature names ``slot``."""
    sig = lookup_primitive(op.name.removeprefix("mdsl.graph."))
    if sig is None:
        return None
    for index, out in enumerate(sig.outputs):
        if out.name == slot and index < len(op.results):
            return op.results[index]
    for index, arg in enumerate(sig.positional_inputs):
        if arg.name == slot and index < len(op.operands):
            return op.operands[index]
    return None


def uses_of(model: ModelOp, ops: Iterator[Operation] | None = None) -> Iterator[tuple[Operation, str, str, SSAValue]]:
    """Each (op, kind, slot, value) that the model's invariants cover, over ``ops`` (default: the
    ops of its forward-side functions: forward, block bodies, helpers)."""
    kept = model_invariants(model)
    if not kept:
        return
    if ops is None:
        ops = (op for func in model.funcs() if _forward_side(func) for op in func.walk())
    for op in ops:
        kinds = kept.get(op.name.removeprefix("mdsl.graph."))
        for kind, slots in (kinds or {}).items():
            for slot in slots:
                value = slot_value(op, slot)
                if value is not None:
                    yield op, kind, slot, value


def _forward_side(func: FuncOp) -> bool:
    kind = func.kind.data if func.kind is not None else "forward"
    return kind in ("forward", "block", "helper") and not func.sym_name.data.endswith("_backward")


def graph_problems(model: ModelOp, spans: dict[tuple[str, str], Span] | None = None) -> list[Diagnostic]:
    """E006 where the compiler's derived gradient of an op does not read what its primitive's
    invariant names (at the name in the invariant: ``spans`` by (primitive, slot), else its kept ``at``)."""
    from modeldsl.resolve.annotation_checks import read_by_gradient

    problems: list[Diagnostic] = []
    reported: set[tuple[str, str]] = set()
    for op, kind, slot, value in uses_of(model):
        primitive = op.name.removeprefix("mdsl.graph.")
        if (primitive, slot) in reported or value in read_by_gradient(op):
            continue
        reported.add((primitive, slot))
        where = (spans or {}).get((primitive, slot)) or written_at(model, primitive) \
            or span_of_location(op.location, primitive)
        problems.append(Diagnostic(
            "E006", f"primitive {primitive} declares {kind}: [{slot}], but the gradient the compiler derives "
            f"for it (its VJP rule) does not read {slot}", where,
            "the invariant describes the primitive's backward: list the tensors its VJP rule reads"))
    return problems


def backward_problems(model: ModelOp, which: str) -> list[Diagnostic]:
    """E006 where the backward ``mdsl-opt --verify-backward`` checks (``which``: ``derived`` or
    ``written``) lacks a tensor an invariant names (at the op that makes or reads it)."""
    from modeldsl.resolve.annotation_checks import read_by_gradient

    written = next((f for f in model.funcs() if f.kind is not None and f.kind.data == "backward"), None)
    saved = {s.data for s in written.attributes["saved"].data} \
        if written is not None and isinstance(written.attributes.get("saved"), ArrayAttr) else set()
    forward = next((f for f in model.funcs() if f.sym_name.data == "forward"), None)
    problems: list[Diagnostic] = []
    for op, kind, slot, value in uses_of(model):
        primitive = op.name.removeprefix("mdsl.graph.")
        where = span_of_location(op.location, primitive)
        if which == "written":
            if forward is None or op.parent_op() is not forward:
                continue  # a written backward sees the forward function's tensors
            if value.name_hint not in saved:
                problems.append(Diagnostic(
                    "E006", f"the written backward @{written.sym_name.data} does not take '{value.name_hint}', "
                    f"which {primitive}'s backward uses ({kind}: [{slot}])", where,
                    f"read it in the backward: graph as saved.{value.name_hint} (and list it in save:)"))
        elif value not in read_by_gradient(op):
            problems.append(Diagnostic(
                "E006", f"the derived gradient of {primitive} does not read its {slot} ({kind}: [{slot}])", where,
                "the primitive's declaration and its VJP rule disagree"))
    return problems
