"""User annotations (``annotation @name:`` declarations, spec 7) and precision recipes.

A program may declare its own annotations. A use ``@name(args)`` of a declared
annotation that is not one of the built-in ones is checked against the
declaration's ``params:`` (names, count, required ones, ``enum(...)`` choices)
and kept on its op or parameter as a dictionary in the ``user_annotations``
attribute; a use of an annotation that is neither built in nor declared stays
E008. ``recipe Name:`` declarations (spec 7.4.4) are ``key: value`` entries; the
lowering keeps them on the model op, and ``@recipe(Name)`` must name one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from xdsl.dialects.builtin import ArrayAttr, BoolAttr, DictionaryAttr, FloatAttr, IntegerAttr, StringAttr, f64, i64
from xdsl.ir import Attribute

from modeldsl.dialects.annotations import AnnotationError
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
