"""``primitive`` declarations of user primitives: an ``impl:`` naming a registered Python function.

A declaration of a name that is no ``mdsl.graph`` op declares a user primitive
(:func:`modeldsl.register_primitive`, :mod:`modeldsl.prims.user`). Its kernel is what
``impl:`` names (spec 4.6 and Appendix A: ``impl:`` ``forward: mylib.softplus``, also written
``impl: mylib.softplus`` or under ``forward:``): a registered primitive, by its registered name or
by its reference's ``module.function``. Without ``impl:`` the declared name itself must be
registered. The declaration then binds its name to that registration: a flow's
``x -> NAME(...)`` is a call of it, and the resolver checks the declaration against the
registration as it checks one of an op (parameters E003, tensors E004). An ``impl:`` naming no
registered function is E014 at the name, with the closest registered one.
"""

from __future__ import annotations

from typing import Any

from modeldsl.diagnostics import DiagnosticSink, Span
from modeldsl.frontend.text import ast
from modeldsl.primitives import USER_SIGNATURES, PrimitiveSignature, builtin_primitives
from modeldsl.prims.user import find_registered, impl_problem

UNRESOLVED: Any = object()  # a user primitive's declaration whose impl: names nothing registered (reported)


def _path(node: ast.Expr | None) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _path(node.base)
        return None if base is None else f"{base}.{node.attr}"
    if isinstance(node, ast.Str):
        return node.value
    return None


def _entry(section: ast.Section, name: str) -> ast.Section | None:
    return next((s for s in section.body if isinstance(s, ast.Section) and s.name == name), None)


def impl_path(decl: ast.Decl) -> tuple[str, Span] | None:
    """What the declaration's ``impl:`` names as the forward's kernel, and where."""
    candidates = []
    for impl in decl.sections("impl"):
        candidates += [impl, _entry(impl, "forward")]
    for forward in decl.sections("forward"):
        candidates.append(_entry(forward, "impl"))
    for section in candidates:
        if section is not None and section.value is not None:
            path = _path(section.value.expr)
            if path is not None:
                return path, section.value.expr.span
    return None


def user_signature(decl: ast.Decl, sink: DiagnosticSink | None = None) -> PrimitiveSignature | None:
    """The registration a ``primitive`` declaration of a user primitive binds its name to; None for
    the declaration of an op, or of a name nothing registers (the caller's E014); :data:`UNRESOLVED`
    where ``impl:`` names no registration (E014 reported into ``sink``)."""
    if decl.kind != "primitive" or decl.name in builtin_primitives():
        return None
    named = impl_path(decl)
    if named is None:
        return USER_SIGNATURES.get(decl.name)
    path, span = named
    found = find_registered(path)
    if found is not None:
        return found.signature
    problem = impl_problem(path, decl.name)
    if sink is not None and problem is not None:
        sink.error(problem.code, problem.message, span, problem.hint)
    return UNRESOLVED


def unresolved(decl: Any) -> bool:
    """Whether ``decl`` declares a user primitive whose ``impl:`` names nothing registered (reported)."""
    return isinstance(decl, ast.Decl) and user_signature(decl) is UNRESOLVED


def declared_signature(decl: Any) -> PrimitiveSignature | None:
    """The user primitive a name of the namespace (its declaration) calls, None for anything else."""
    if not isinstance(decl, ast.Decl):
        return None
    sig = user_signature(decl)
    return None if sig is UNRESOLVED else sig
