"""The instances a lowering works with: modules with their arguments and parameters.

Shared by the forward lowering (:mod:`modeldsl.lower`) and the backward
lowering (:mod:`modeldsl.lower.backward`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from xdsl.ir import SSAValue

from modeldsl.diagnostics import Span
from modeldsl.dialects.graph_types import TensorType
from modeldsl.frontend.text import ast
from modeldsl.resolve.consts import ConstEnv
from modeldsl.symbolic import Expr


class LoweringFailed(Exception):
    """Raised to abandon one statement after its diagnostic was reported."""


@dataclass
class ParamSlot:
    """A tensor parameter of an instance: where it is declared, and how it is read."""

    path: str
    type: TensorType
    value: SSAValue | None = None  # a block argument, or a bound caller tensor
    frozen: bool = False  # @frozen: no gradient
    span: Span | None = None  # its name in the params: section (the location of its function arguments)


@dataclass
class Instance:
    """A module, block or model with its arguments, as seen while lowering."""

    decl: ast.Decl
    env: ConstEnv
    prefix: str
    namespace: dict[str, ast.Decl] = field(default_factory=dict)  # declarations visible inside it
    params: dict[str, ParamSlot | "Instance" | "StackedInstance"] = field(default_factory=dict)
    failed: set[str] = field(default_factory=set)  # parameters whose declaration was refused (reported)


@dataclass
class StackedInstance:
    """``[n] x Block(...)``: one body, parameters stacked along a leading ``count`` dim."""

    body: Instance
    count: Expr
    span: Span


def param_slots(instance: Instance) -> list[ParamSlot]:
    slots: list[ParamSlot] = []
    for value in instance.params.values():
        if isinstance(value, ParamSlot) and value not in slots:
            slots.append(value)
        elif isinstance(value, Instance):
            slots += [s for s in param_slots(value) if s not in slots]
    return slots


class TypedEntry(NamedTuple):
    """``name: [shape] @annotations`` in a signature."""

    name: str
    type: ast.Expr
    span: Span
    annotations: list[ast.Annotation]


def typed_entries(entry: ast.Section) -> list[TypedEntry]:
    """``in: [..]``, ``in: x: [..]``, ``in: (x: [..], y: [..])`` or an indented list of ``name: [..]``."""
    default = "in" if entry.name in ("in", "inputs") else "out"
    if entry.value is not None:
        expr = entry.value.expr
        if isinstance(expr, ast.NamedField):
            return [TypedEntry(expr.name, expr.value, expr.span, expr.annotations + entry.value.annotations)]
        if isinstance(expr, ast.NamedTuple):
            return [TypedEntry(f.name, f.value, f.span, f.annotations) for f in expr.fields]
        return [TypedEntry(default, expr, entry.span, entry.value.annotations)]
    return [TypedEntry(e.name, e.value.expr, e.span, e.value.annotations)
            for e in entry.body if isinstance(e, ast.Section) and e.value and e.name is not None]


def unnamed_entries(entry: ast.Section) -> list[ast.Section]:
    """Entries of an indented signature list whose key is not a plain name (``re.sidual: [..]``)."""
    return [e for e in entry.body if isinstance(e, ast.Section) and e.value and e.name is None]


def source_text(node: ast.Node) -> str:
    """The exact source text of a node (weight-mapping keys such as ``blocks[{i}].w?``); a name's
    own text (the Python DSL gives such keys, and ``save:`` patterns, as names)."""
    return node.id if isinstance(node, ast.Name) else node.span.text
