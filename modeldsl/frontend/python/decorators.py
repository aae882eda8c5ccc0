"""The words a Python DSL class may use, so that an unknown one is an error and never dropped.

- a class's decorators: ``@module`` / ``@block`` / ``@model``, ``@abstract``, ``@extends(...)``,
  ``@hf_config``, ``@hf_mapping``, ``@hf_mapping.indexed``, ``@hf_export`` and the annotations
  (``@checkpoint``, ``@recipe(...)``, ...); anything else is E008 with the closest known one;
- its methods: ``__init__``, and methods decorated ``@forward``, ``@backward`` (each with
  ``@save`` / ``@recompute``) or ``@param`` (with ``@tied_to``); an undecorated method or another
  decorator is E001 / E008;
- its other statements: the docstring, ``Param(...)``, ``Activation(...)`` and ``Gradient(...)``
  slots, ``_hf_block_mappings_ = {...}`` and ``pass``; anything else is E001.
"""

from __future__ import annotations

import ast as py
import difflib

from modeldsl.diagnostics import Diagnostic, DiagnosticError
from modeldsl.dialects.annotations import ANNOTATION_BY_NAME
from modeldsl.frontend.python.nodes import Nodes, called_name, is_docstring

KINDS = ("module", "block", "model")
HF_SECTIONS = ("hf_config", "hf_mapping", "hf_export")
CLASS_DECORATORS = (*KINDS, "abstract", "extends", *HF_SECTIONS, "hf_mapping.indexed")
METHOD_DECORATORS = ("forward", "backward", "save", "recompute", "param", "tied_to")
MEMBER_CALLS = ("Param", "Activation", "Gradient")
BLOCK_MAPPINGS = "_hf_block_mappings_"


def decorator_name(node: py.expr) -> str | None:
    """``module``, ``hf_mapping.indexed``; ``dsl.module`` (a qualified import) is ``module``."""
    target = node.func if isinstance(node, py.Call) else node
    parts: list[str] = []
    while isinstance(target, py.Attribute):
        parts.insert(0, target.attr)
        target = target.value
    if not isinstance(target, py.Name):
        return None
    parts.insert(0, target.id)
    dotted = ".".join(parts)
    if dotted in CLASS_DECORATORS or parts[0] in HF_SECTIONS:
        return dotted
    return parts[-1]


class Decorators(Nodes):
    def check_undeclared_class(self, node: py.ClassDef) -> None:
        """A class without ``@module`` / ``@block`` / ``@model`` is Python's own, unless a decorator of
        it is a DSL word or close to a kind (``@modle``): then E008, with the kind it lacks."""
        for decorator in node.decorator_list:
            name = decorator_name(decorator)
            close = difflib.get_close_matches(name or "", KINDS, n=1, cutoff=0.7)
            if close:
                raise self.unknown_decorator(decorator, name, list(CLASS_DECORATORS), "a class")
            if name in CLASS_DECORATORS or name in ANNOTATION_BY_NAME or name in METHOD_DECORATORS:
                raise DiagnosticError([Diagnostic("E008", f"class {node.name} has @{name} but is no module, block "
                                                  "or model", self.span(decorator),
                                                  "decorate it @module, @block or @model")])

    def check_class_words(self, node: py.ClassDef) -> None:
        """E008 for an unknown class decorator, E001 / E008 for a class member the DSL does not take."""
        for decorator in node.decorator_list:
            name = decorator_name(decorator)
            if name not in CLASS_DECORATORS and name not in ANNOTATION_BY_NAME:
                raise self.unknown_decorator(decorator, name, [*CLASS_DECORATORS, *ANNOTATION_BY_NAME], "a class")
        for stmt in node.body:
            if isinstance(stmt, py.FunctionDef):
                self.check_method(stmt)
            elif not _is_member(stmt):
                raise self.error(stmt, "a DSL class holds its docstring, __init__, @forward / @backward / @param "
                                 "methods, Param(...), Activation(...) and Gradient(...) members and "
                                 f"{BLOCK_MAPPINGS} = {{...}}")

    def check_method(self, func: py.FunctionDef) -> None:
        if func.name == "__init__":
            if func.decorator_list:
                raise self.error(func.decorator_list[0], "__init__ takes no decorator")
            return
        known = METHOD_DECORATORS
        for decorator in func.decorator_list:
            name = decorator_name(decorator)
            if name not in known:
                raise self.unknown_decorator(decorator, name, list(known), "a method")
        if not any(decorator_name(d) in ("forward", "backward", "param") for d in func.decorator_list):
            raise self.error(func, f"method '{func.name}' is none of the DSL's",
                             "a DSL class's methods are __init__ and those decorated @forward, @backward or "
                             "@param (the file is read, never run, so a helper method is never called)")

    def unknown_decorator(self, decorator: py.expr, name: str | None, known: list[str], where: str) -> DiagnosticError:
        word = name or py.unparse(decorator)
        close = difflib.get_close_matches(word, known, n=1)
        hint = f"did you mean @{close[0]}? " if close else ""
        return DiagnosticError([Diagnostic("E008", f"unknown decorator @{word} on {where}", self.span(decorator),
                                           f"{hint}{where} takes {', '.join('@' + k for k in known)}")])


def _is_member(stmt: py.stmt) -> bool:
    if is_docstring(stmt) or isinstance(stmt, py.Pass):
        return True
    if not (isinstance(stmt, py.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], py.Name)):
        return False
    if stmt.targets[0].id == BLOCK_MAPPINGS:
        return True
    return isinstance(stmt.value, py.Call) and called_name(stmt.value) in MEMBER_CALLS
