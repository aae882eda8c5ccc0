"""User annotations (``annotation @name:`` declarations, spec 7) and precision recipes.

A program may declare its own annotations. A use ``@name(args)`` of a declared
annotation that is not one of the built-in ones is checked against the
declaration's ``params:`` (names, count, required ones, ``enum(...)`` choices)
and kept on its op or parameter as a dictionary in the ``user_annotations``
attribute; a use of an annotation that is neither built in nor declared stays
E008. A declaration's ``applies_to:`` list says where a use may be written: on a
parameter only where it lists ``parameter``, on a flow only where it lists
something else (``tensor_output``, ``operation``, an op name, ...); elsewhere E008.

A declaration of a built-in annotation (the spec's ``annotation @memory:``)
documents it: each parameter it lists must be one of the built-in's (E003 with
the closest name), and the built-in's own checks apply to its uses.

``recipe Name:`` declarations (spec 7.4.4) are ``key: value`` entries; the
lowering keeps them on the model op, and ``@recipe(Name)`` must name one.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from xdsl.dialects.builtin import ArrayAttr, BoolAttr, DictionaryAttr, FloatAttr, IntegerAttr, StringAttr, f64, i64
from xdsl.ir import Attribute

from modeldsl.diagnostics import DiagnosticSink
from modeldsl.dialects.annotations import ANNOTATION_BY_NAME, AnnotationError
from modeldsl.frontend.text import ast


@dataclass
class DeclaredParam:
    """One entry of an annotation declaration's ``params:``."""

    name: str
    required: bool
    choices: tuple[str, ...] | None  # enum(...) words


def declared_params(decl: ast.Decl) -> list[DeclaredParam]:
    """The parameters an ``annotation @name:`` declaration lists, in order."""
    params = []
    for section in decl.sections("params"):
        for entry in section.body:
            if not isinstance(entry, ast.Section) or entry.name is None or entry.value is None:
                continue
            kind = entry.value.expr
            optional = isinstance(kind, ast.Optional_)
            kind = kind.base if optional else kind
            choices = None
            if isinstance(kind, ast.Call) and isinstance(kind.func, ast.Name) and kind.func.id == "enum":
                choices = tuple(a.value.id for a in kind.args if isinstance(a.value, ast.Name))
            params.append(DeclaredParam(entry.name, entry.value.default is None and not optional, choices))
    return params


def check_builtin_declarations(decls: Sequence[ast.Decl], sink: DiagnosticSink) -> None:
    """E003 at a parameter that a declaration of a built-in annotation lists and the built-in lacks."""
    for decl in decls:
        builtin = ANNOTATION_BY_NAME.get(decl.name) if decl.kind == "annotation" else None
        if builtin is None:
            continue
        known = [p.name for p in builtin.PARAMS]
        for section in decl.sections("params"):
            for entry in section.body:
                if isinstance(entry, ast.Section) and entry.name is not None and entry.name not in known:
                    close = difflib.get_close_matches(entry.name, known, n=1)
                    sink.error("E003", f"the built-in @{decl.name} has no parameter '{entry.name}'", entry.key.span,
                               (f"did you mean '{close[0]}'? " if close else "")
                               + f"its parameters: {', '.join(known) or 'none'}")


PARAMETER_KINDS = ("parameter",)  # the applies_to: word of a parameter declaration


def applies_to(decl: ast.Decl) -> list[str] | None:
    """The words of a declaration's ``applies_to: [...]`` (None where it has none)."""
    section = next(iter(decl.sections("applies_to")), None)
    if section is None or section.value is None or not isinstance(section.value.expr, ast.ListExpr):
        return None
    return [item.id for item in section.value.expr.items if isinstance(item, ast.Name)]


def check_applies_to(decl: ast.Decl, target: str) -> None:
    """AnnotationError (E008) where a use on ``target`` (``param``, ``flow``, ``backward``, ...) is
    not among what the declaration's ``applies_to:`` lists."""
    kinds = applies_to(decl)
    if not kinds:
        return
    on_parameter = target == "param"
    allowed = [k for k in kinds if (k in PARAMETER_KINDS) == on_parameter]
    if not allowed:
        where = "a parameter" if on_parameter else "a flow's value or operation"
        raise AnnotationError(f"@{decl.name} applies to {', '.join(kinds)}, not to {where}",
                              "write it where its declaration's applies_to: says, or add the kind there")


def user_annotation(decl: ast.Decl, args: Sequence[Any], kwargs: Mapping[str, Any]) -> DictionaryAttr:
    """``@name(args)`` of a declared annotation as ``{name = "...", <param> = value, ...}``;
    AnnotationError (E008) for arguments its declaration does not take."""
    params = declared_params(decl)
    by_name = {p.name: p for p in params}
    usage = f"@{decl.name}({', '.join(p.name for p in params)})"
    unknown = [k for k in kwargs if k not in by_name]
    if unknown:
        raise AnnotationError(f"@{decl.name} has no parameter '{unknown[0]}'", f"declared as {usage}")
    free = [p for p in params if p.name not in kwargs]
    if len(args) > len(free):
        raise AnnotationError(f"@{decl.name} takes at most {len(free)} positional argument(s), got {len(args)}",
                              f"declared as {usage}")
    values = dict(kwargs)
    values.update((p.name, v) for p, v in zip(free, args))
    missing = [p.name for p in params if p.required and p.name not in values]
    if missing:
        raise AnnotationError(f"@{decl.name} needs its parameter '{missing[0]}'", f"declared as {usage}")
    for name, value in values.items():
        choices = by_name[name].choices
        if choices is not None and value not in choices:
            raise AnnotationError(f"@{decl.name}({name}=...): {value!r} is not one of {', '.join(choices)}",
                                  f"declared as {usage}")
    entries = {"name": StringAttr(decl.name)}
    entries.update((name, to_attribute(value)) for name, value in values.items())
    return DictionaryAttr(entries)


def to_attribute(value: Any) -> Attribute:
    """A constant (word, number, string, boolean, list) as a builtin attribute."""
    if isinstance(value, bool):
        return BoolAttr.from_bool(value)
    if isinstance(value, int):
        return IntegerAttr(value, i64)
    if isinstance(value, float):
        return FloatAttr(value, f64)
    if isinstance(value, (list, tuple)):
        return ArrayAttr([to_attribute(v) for v in value])
    return StringAttr(str(value))


def recipe_fields(decl: ast.Decl) -> tuple[dict[str, Attribute], list[ast.Stmt]]:
    """The ``key: value`` entries of a ``recipe`` declaration, and the statements that are not."""
    fields: dict[str, Attribute] = {}
    bad: list[ast.Stmt] = []
    for stmt in decl.body:
        if isinstance(stmt, ast.ExprStmt) and isinstance(stmt.expr, ast.Str):
            continue  # its doc string
        if isinstance(stmt, ast.Section) and stmt.name is not None and stmt.value is not None and not stmt.body:
            fields[stmt.name] = constant_attribute(stmt.value.expr)
        else:
            bad.append(stmt)
    return fields, bad


def constant_attribute(node: ast.Expr) -> Attribute:
    """A recipe value: a word (a dtype, a strategy), a number, a string, a boolean or a list."""
    if isinstance(node, (ast.Int, ast.Float, ast.Bool)):
        return to_attribute(node.value)
    if isinstance(node, ast.Str):
        return StringAttr(node.value)
    if isinstance(node, ast.ListExpr):
        return ArrayAttr([constant_attribute(i) for i in node.items])
    return StringAttr(node.span.text)
