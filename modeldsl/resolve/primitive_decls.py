"""``primitive`` declarations checked against the op registry.

The primitives a program can call are the ``mdsl.graph`` primitive ops
(:mod:`modeldsl.primitives` reads their signatures off the ops). A
``primitive NAME:`` declaration (spec section 6, ``std/primitives/``) only
documents one of them, so the resolver checks that it says what the op does:

* ``NAME`` is a registered op, else E014 (no kernel registered);
* its ``params:`` are the op's parameters, in the op's positional order, each
  of the same kind (``float``, ``int``, ``bool``, ``enum(...)`` with the same
  choices, ``[int]`` for a list of integers or sizes, ``dtype``), optional
  (``T?``) or defaulted exactly as the op is; shape-only parameters that are
  no op attributes (``view``'s ``shape``, ``cast``'s ``dtype``, ...) count as
  parameters too. Any disagreement is E003. A parameter with a default may be
  left out (spec 6.1.2's ``batched_matmul`` has no ``alpha``, 6.4.1's
  ``flash_attention`` no ``layout``), as long as no declared one follows it in
  the op's positional order; the optional tensors the op takes by keyword
  (``alibi_slopes: [H]? = None``) are parameters in the spec's spelling;
* its ``forward:`` ``in:``/``out:`` list as many tensors as the op has operands
  and results, optional (``[C]?``) and variadic (``xs...``) in the same
  places, else E004 (the names may differ);
* a ``backward:`` section either describes the kernel ``NAME_backward`` with
  ``in:``/``out:`` (the op must exist, E014; same arity, E004; every parameter
  of the backward op is one the forward declares, E003), or gives the
  gradients as formulas ``d_x = primitive(...)`` (also ``out: d_x = ...``),
  whose outermost calls must be primitives (E014) with known keyword
  parameters and enum values (E003); comments alone leave the backward unsaid.

* its ``invariants:`` (``- backward_uses: [out]``, spec 9.8.3) name tensors of its forward that its
  ``save:`` list keeps (the resolver checks them next, :mod:`modeldsl.resolve.invariants`: E001,
  E002, E006).

A declaration holding ``...`` leaves parts out; it is only checked for what it
writes.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from modeldsl.diagnostics import DiagnosticSink, Span
from modeldsl.frontend.text import ast
from modeldsl.primitives import ParamSpec, PrimitiveSignature, TensorSlot, lookup_primitive, primitives
from modeldsl.prims import by_name
from modeldsl.resolve.user_primitives import UNRESOLVED, user_signature

LIST_KINDS = ("ints", "dims")  # both written [int] in a declaration
SCALAR_TYPES = {"float": "float", "int": "int", "bool": "bool", "dtype": "dtype"}
KIND_WORDS = {"float": "float", "int": "int", "bool": "bool", "enum": "enum", "ints": "[int]", "dims": "[int]",
              "list": "[int]", "dtype": "dtype", "tensor": "a tensor"}
MISSING = object()


def inference_params(name: str) -> list[ParamSpec]:
    """Parameters a primitive takes only for shape inference (not op attributes),
    as :mod:`modeldsl.lower` passes them (the ``inference_params`` of the primitive's record in
    :mod:`modeldsl.prims`), with the defaults its shape rule applies."""
    entry = by_name().get(name)
    specs = []
    for pname in entry.inference_params if entry is not None else ():
        if pname == "shape":
            specs.append(ParamSpec("shape", "dims", required=True))
        elif pname == "dtype":
            specs.append(ParamSpec("dtype", "dtype", None if name == "cast" else "bf16", required=name == "cast"))
        elif lookup_primitive(name) is not None and lookup_primitive(name).param(pname) is not None:
            specs.append(lookup_primitive(name).param(pname))
    return specs


def positional_params(sig: PrimitiveSignature) -> list[ParamSpec]:
    """The parameters of a primitive in the order a call takes them positionally; last the
    optional tensors it takes by keyword (kind ``tensor``, default None)."""
    first = inference_params(sig.name)
    names = {p.name for p in first}
    tensors = [ParamSpec(s.name, "tensor", None) for s in sig.keyword_inputs]
    return first + [p for p in sig.params if p.name not in names] + tensors


# ----------------------------------------------------------------------------
# What a declaration writes
# ----------------------------------------------------------------------------


@dataclass
class DeclParam:
    name: str
    kind: str | None  # float int bool enum list dtype tensor, None when not understood
    optional: bool
    choices: tuple[str, ...]
    default: Any  # a Python value, MISSING when none is written
    span: Span  # the name
    type_span: Span
    default_span: Span | None


@dataclass
class DeclSlot:
    name: str | None
    optional: bool
    variadic: bool
    span: Span

    def text(self) -> str:
        return (self.name or "_") + ("?" if self.optional else "..." if self.variadic else "")


def _elided(body: Sequence[ast.Stmt]) -> bool:
    return any(isinstance(s, ast.ExprStmt) and isinstance(s.expr, ast.EllipsisLit) for s in body)


def _section(body: Sequence[ast.Stmt], name: str) -> ast.Section | None:
    return next((s for s in body if isinstance(s, ast.Section) and s.name == name), None)


def _key_span(section: ast.Section) -> Span:
    return section.key.span


def _literal(node: ast.Expr | None) -> Any:
    """The Python value of a default; MISSING for anything but a literal or a word."""
    if isinstance(node, (ast.Int, ast.Float, ast.Bool, ast.Str)):
        return node.value
    if isinstance(node, ast.NoneLit):
        return None
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Unary) and node.op == "-" and isinstance(node.operand, (ast.Int, ast.Float)):
        return -node.operand.value
    return MISSING


def _param_type(node: ast.Expr) -> tuple[str | None, bool, tuple[str, ...]]:
    """(kind, optional, enum choices) of a written parameter type."""
    optional = isinstance(node, ast.Optional_)
    if optional:
        node = node.base
    if isinstance(node, ast.Name) and node.id in SCALAR_TYPES:
        return SCALAR_TYPES[node.id], optional, ()
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "enum":
        words = tuple(_literal(a.value) for a in node.args)
        if all(isinstance(w, str) for w in words):
            return "enum", optional, words
        return None, optional, ()
    if isinstance(node, ast.ListExpr):
        if len(node.items) == 1 and isinstance(node.items[0], ast.Name) and node.items[0].id in ("int", "dim"):
            return "list", optional, ()
        return "tensor", optional, ()
    return None, optional, ()


def declared_params(decl: ast.Decl) -> tuple[list[DeclParam], ast.Section | None]:
    section = _section(decl.body, "params")
    if section is None:
        return [], None
    params = []
    for entry in section.body:
        if not isinstance(entry, ast.Section) or entry.name is None or entry.value is None:
            continue
        value = entry.value
        type_node = value.expr.value if isinstance(value.expr, ast.NamedField) else value.expr
        kind, optional, choices = _param_type(type_node)
        default = _literal(value.default) if value.default is not None else MISSING
        if default is MISSING and optional and value.default is None:
            default = None
        params.append(DeclParam(entry.name, kind, optional, choices, default, _key_span(entry), type_node.span,
                                value.default.span if value.default is not None else None))
    return params, section


def _slot(node: ast.Expr) -> DeclSlot:
    span = node.span
    name = None
    if isinstance(node, ast.NamedField):
        name, node = node.name, node.value
    if isinstance(node, ast.Annotated):
        node = node.value
    if isinstance(node, ast.Optional_):
        inner = node.base
        return DeclSlot(name or (inner.id if isinstance(inner, ast.Name) else None), True, False, span)
    if isinstance(node, ast.Splat):
        inner = node.base
        return DeclSlot(name or (inner.id if isinstance(inner, ast.Name) else None), False, True, span)
    return DeclSlot(name or (node.id if isinstance(node, ast.Name) else None), False, False, span)


def declared_slots(section: ast.Section | None) -> list[DeclSlot]:
    """The tensors an ``in:`` or ``out:`` entry lists: one for a shape or a name,
    each item of a parenthesized list."""
    if section is None or section.value is None:
        return []
    expr = section.value.expr
    if isinstance(expr, ast.TupleExpr):
        return [_slot(item) for item in expr.items]
    if isinstance(expr, ast.NamedTuple):
        return [_slot(field) for field in expr.fields]
    return [_slot(expr)]


def _slots_text(slots: Iterable[DeclSlot | TensorSlot]) -> str:
    texts = []
    for s in slots:
        if isinstance(s, DeclSlot):
            texts.append(s.text())
        else:
            texts.append(s.name + ("?" if s.optional else "..." if s.variadic else ""))
    return "(" + ", ".join(texts) + ")"


def _kind_text(kind: str | None) -> str:
    return KIND_WORDS.get(kind or "", "an unknown type")


def _value_text(value: Any) -> str:
    if value is None:
        return "None"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _spec_text(spec: ParamSpec) -> str:
    if spec.kind == "tensor":
        return f"{spec.name}: [*]? = None"
    kind = f"enum({', '.join(spec.choices)})" if spec.kind == "enum" else _kind_text(spec.kind)
    if spec.required:
        return f"{spec.name}: {kind}"
    if spec.default is None:
        return f"{spec.name}: {kind}? = None"
    return f"{spec.name}: {kind} = {_value_text(spec.default)}"


def _same_value(kind: str, written: Any, default: Any) -> bool:
    if written is None or default is None:
        return written is None and default is None
    if kind == "bool":
        return isinstance(written, bool) and written == default
    if kind == "float":
        return (not isinstance(written, bool) and isinstance(written, (int, float))
                and math.isclose(float(written), float(default), rel_tol=1e-9, abs_tol=0.0))
    if kind == "int":
        return isinstance(written, int) and not isinstance(written, bool) and written == default
    return str(written) == str(default)


def _name_span(decl: ast.Decl) -> Span:
    """The span of the declared name (the caret goes under it, not under ``primitive``)."""
    line = decl.span.source.line(decl.span.line)
    start = line.find(decl.name, decl.span.column - 1 + len(decl.kind))
    if start < 0:
        return decl.span
    return Span(decl.span.source, decl.span.line, start + 1, decl.span.line, start + 1 + len(decl.name))


# ----------------------------------------------------------------------------
# The check
# ----------------------------------------------------------------------------


class PrimitiveDeclChecker:
    def __init__(self, sink: DiagnosticSink):
        self.sink = sink

    def check(self, decl: ast.Decl) -> None:
        sig = user_signature(decl, self.sink)  # a user primitive: the registration its impl: names
        if sig is UNRESOLVED:
            return
        sig = sig or lookup_primitive(decl.name)
        if sig is None:
            self.unknown(decl.name, _name_span(decl), "primitive")
            return
        elided = _elided(decl.body)
        self.check_params(decl, sig, elided)
        self.check_forward(decl, sig, elided)
        for backward in decl.sections("backward"):
            self.check_backward(decl, sig, backward)

    def unknown(self, name: str, span: Span, what: str) -> None:
        close = difflib.get_close_matches(name, list(primitives()), n=1) if what != "backward kernel" else []
        hint = (f"did you mean '{close[0]}'? " if close else "") + {
            "primitive": "the primitives are the mdsl.graph ops (spec section 6) and the Python functions registered "
                         "with modeldsl.register_primitive (name one in impl:); compose other operations as a module",
            "backward kernel": "without a kernel of its own, give the gradients as formulas over primitives "
                               "(d_x = op(...)) or leave the backward: section to comments",
            "formula": "a gradient formula calls primitives; leave what no primitive computes to a comment",
        }[what]
        self.sink.error("E014", f"no kernel registered for primitive {name}", span, hint)

    # ---------------------------------------------------------------- params
    def check_params(self, decl: ast.Decl, sig: PrimitiveSignature, elided: bool) -> None:
        written, section = declared_params(decl)
        expected = positional_params(sig)
        by_name = {p.name: p for p in expected}
        seen: dict[str, DeclParam] = {}
        for param in written:
            if param.name in seen:
                self.sink.error("E009", f"primitive {decl.name} declares the parameter '{param.name}' twice",
                                param.span, "remove one of them")
                continue
            seen[param.name] = param
            spec = by_name.get(param.name)
            if spec is None:
                self.extra_param(decl.name, sig, param)
                continue
            self.compare_param(decl.name, param, spec)
        missing = [p for p in expected if p.name not in seen and p.required]
        where = _key_span(section) if section is not None else _name_span(decl)
        if missing and not elided and not (section is not None and _elided(section.body)):
            self.sink.error("E003", f"primitive {decl.name} does not declare the parameter(s) "
                            f"{', '.join(p.name for p in missing)} of its op",
                            where, "declare " + "; ".join(_spec_text(p) for p in missing))
        self.check_left_out(decl.name, expected, seen)
        order = [name for name in seen if name in by_name]
        want = [p.name for p in expected if p.name in seen]
        if order != want:
            first = next(p for p, q in zip(order, want) if p != q)
            self.sink.error("E003", f"primitive {decl.name} declares its parameters in the order "
                            f"{', '.join(order)}; calls pass them positionally as {', '.join(want)}",
                            seen[first].span, "declare the parameters in the op's order")

    def check_left_out(self, name: str, expected: Sequence[ParamSpec], seen: dict[str, DeclParam]) -> None:
        """A parameter with a default may be left out (the spec's batched_matmul has no ``alpha``), where
        calls still mean what the declaration says: a call passes parameters positionally in the op's
        order, so none it declares may follow one it leaves out (tensors, passed by keyword, aside)."""
        positional = [p for p in expected if p.kind != "tensor"]
        left_out = [p for p in positional if p.name not in seen and not p.required]
        later = [p for p in positional if p.name in seen and left_out and
                 positional.index(p) > positional.index(left_out[0])]
        if later:
            skipped = [p for p in left_out if positional.index(p) < positional.index(later[-1])]
            self.sink.error("E003", f"primitive {name} leaves out the parameter(s) "
                            f"{', '.join(p.name for p in skipped)} but declares {later[0].name} after them; calls "
                            f"pass parameters positionally in the op's order ({', '.join(p.name for p in positional)})",
                            seen[later[0].name].span,
                            "declare " + "; ".join(_spec_text(p) for p in skipped) + f" before {later[0].name}, "
                            "or leave out the parameters after them too")

    def extra_param(self, name: str, sig: PrimitiveSignature, param: DeclParam) -> None:
        as_input = next((s for s in sig.inputs if s.name == param.name), None)
        if as_input is not None or param.kind == "tensor":
            self.sink.error("E003", f"'{param.name}' of primitive {name} is a parameter here but the op has "
                            f"no such parameter" + (f"; it takes {param.name} as a tensor input" if as_input else ""),
                            param.span, "list tensors under forward: in:, compile-time values under params:")
            return
        known = ", ".join(p.name for p in positional_params(sig)) or "none"
        self.sink.error("E003", f"primitive {name} has no parameter '{param.name}'", param.span,
                        f"its parameters are: {known}")

    def compare_param(self, name: str, param: DeclParam, spec: ParamSpec) -> None:
        kind_ok = param.kind == spec.kind or (param.kind == "list" and spec.kind in LIST_KINDS)
        if not kind_ok:
            self.sink.error("E003", f"parameter '{param.name}' of primitive {name} is {_kind_text(param.kind)} "
                            f"here but {_kind_text(spec.kind)} in the op", param.type_span,
                            f"declare {_spec_text(spec)}")
            return
        if spec.kind == "enum" and set(param.choices) != set(spec.choices):
            self.sink.error("E003", f"parameter '{param.name}' of primitive {name} allows "
                            f"{', '.join(param.choices)} here but the op allows {', '.join(spec.choices)}",
                            param.type_span, f"declare {_spec_text(spec)}")
            return
        optional = not spec.required and spec.default is None
        if param.optional != optional:
            self.sink.error("E003", f"parameter '{param.name}' of primitive {name} is "
                            f"{'optional' if param.optional else 'not optional'} here but "
                            f"{'optional' if optional else 'not optional'} in the op",
                            param.type_span, f"declare {_spec_text(spec)}")
            return
        where = param.default_span or param.span
        if param.default is MISSING:
            if not spec.required:
                self.sink.error("E003", f"parameter '{param.name}' of primitive {name} has no default here but "
                                f"the op's default is {_value_text(spec.default)}", param.span,
                                f"declare {_spec_text(spec)}")
        elif spec.required:
            self.sink.error("E003", f"parameter '{param.name}' of primitive {name} has a default here but the op "
                            "requires it", where, f"declare {_spec_text(spec)}")
        elif not _same_value(spec.kind, param.default, spec.default):
            self.sink.error("E003", f"parameter '{param.name}' of primitive {name} defaults to "
                            f"{_value_text(param.default)} here but to {_value_text(spec.default)} in the op",
                            where, f"declare {_spec_text(spec)}")

    # ---------------------------------------------------------------- tensors
    def check_forward(self, decl: ast.Decl, sig: PrimitiveSignature, elided: bool) -> None:
        forward = _section(decl.body, "forward")
        if forward is None:
            if not elided:
                self.sink.error("E004", f"primitive {decl.name} has no forward: section", _name_span(decl),
                                f"declare forward: with in: {_slots_text(sig.positional_inputs)} and out: "
                                f"{_slots_text(sig.outputs)}")
            return
        partial = elided or _elided(forward.body)
        self.check_slots(decl.name, sig, forward, "in", sig.positional_inputs, "tensor input", partial)
        self.check_slots(decl.name, sig, forward, "out", sig.outputs, "output", partial)

    def check_slots(self, name: str, sig: PrimitiveSignature, section: ast.Section, key: str,
                    expected: Sequence[TensorSlot], what: str, partial: bool,
                    optional_names: frozenset[str] = frozenset()) -> None:
        """The tensor slots written under ``key`` against the op's. A backward kernel's
        slots may leave out the ``?`` of a tensor the forward declares optional (the spec
        writes ``in: (d_y, x, weight, bias)`` for a ``bias: [D]?``): ``optional_names``."""
        entry = _section(section.body, key)
        if entry is None and (partial or not expected):
            return
        written = declared_slots(entry)
        flags = [(s.optional, s.variadic) for s in written]
        if optional_names and len(written) == len(expected):
            flags = [(w.optional or (e.optional and w.name.removeprefix("d_") in optional_names), w.variadic)
                     for w, e in zip(written, expected)]
        if flags == [(s.optional, s.variadic) for s in expected]:
            return
        where = entry.value.span if entry is not None and entry.value is not None else _key_span(section)
        if len(written) != len(expected):
            message = (f"primitive {name} declares {len(written)} {what}(s) {_slots_text(written)} but the op "
                       f"{sig.name} has {len(expected)}: {_slots_text(expected)}")
        else:
            message = (f"the {what}s of primitive {name} {_slots_text(written)} are optional or variadic in other "
                       f"places than the op's {_slots_text(expected)}")
        self.sink.error("E004", message, where, f"declare {key}: {_slots_text(expected)} (names may differ)")

    # ---------------------------------------------------------------- backward
    def check_backward(self, decl: ast.Decl, sig: PrimitiveSignature, backward: ast.Section) -> None:
        ins, outs = _section(backward.body, "in"), _section(backward.body, "out")
        formula_out = outs is not None and outs.value is not None and outs.value.default is not None
        if (ins is not None or outs is not None) and not formula_out:
            self.check_backward_kernel(decl, sig, backward, ins, outs)
        for stmt in backward.body:
            if isinstance(stmt, ast.Binding):
                self.check_formula(stmt.value)
        if formula_out:
            self.check_formula(outs.value.default)

    def check_backward_kernel(self, decl: ast.Decl, sig: PrimitiveSignature, backward: ast.Section,
                              ins: ast.Section | None, outs: ast.Section | None) -> None:
        name = f"{sig.name}_backward"
        kernel = lookup_primitive(name)
        if kernel is None:
            self.unknown(name, _key_span(backward), "backward kernel")
            return
        partial = _elided(backward.body)
        forward = _section(decl.body, "forward")
        inputs = _section(forward.body, "in") if forward is not None else None
        optional = (frozenset(s.name for s in declared_slots(inputs) if s.optional) if inputs is not None
                    else frozenset())
        self.check_slots(name, kernel, backward, "in", kernel.positional_inputs, "tensor input", partial, optional)
        self.check_slots(name, kernel, backward, "out", kernel.outputs, "output", partial, optional)
        # The backward kernel gets its parameters from the forward's (check_params compared those).
        forward_params = {p.name: p for p in positional_params(sig)}
        for spec in kernel.params:
            mine = forward_params.get(spec.name)
            if mine is None or (mine.kind, mine.default, mine.required) != (spec.kind, spec.default, spec.required):
                self.sink.error("E003", f"{name} takes the parameter {_spec_text(spec)}, which {sig.name} does "
                                "not take alike", _key_span(backward),
                                "the backward kernel takes its parameters from the forward's")

    def check_formula(self, node: ast.Expr) -> None:
        """The outermost calls of a gradient formula are primitives with known keywords."""
        calls = [node] if isinstance(node, ast.Call) else (
            [i for i in node.items if isinstance(i, ast.Call)] if isinstance(node, ast.TupleExpr) else [])
        for call in calls:
            if not isinstance(call.func, ast.Name):
                continue
            sig = lookup_primitive(call.func.id)
            if sig is None:
                self.unknown(call.func.id, call.func.span, "formula")
                continue
            params = {p.name: p for p in positional_params(sig)}
            for arg in call.args:
                if arg.name is None:
                    continue
                spec = params.get(arg.name)
                if spec is None:
                    self.sink.error("E003", f"{sig.name} has no parameter '{arg.name}'", arg.span,
                                    f"its parameters are: {', '.join(params) or 'none'}")
                elif spec.kind == "enum" and isinstance(arg.value, (ast.Name, ast.Str)):
                    word = _literal(arg.value)
                    if word not in spec.choices:
                        self.sink.error("E003", f"'{word}' is not one of {', '.join(spec.choices)}", arg.value.span,
                                        f"{sig.name}'s {arg.name} is one of {', '.join(spec.choices)}")


def check_primitive_decl(decl: ast.Decl, sink: DiagnosticSink) -> None:
    """Report where a ``primitive`` declaration disagrees with its registry op."""
    PrimitiveDeclChecker(sink).check(decl)


def check_primitive_decls(decls: Iterable[ast.Decl], sink: DiagnosticSink) -> None:
    checker = PrimitiveDeclChecker(sink)
    for decl in decls:
        if decl.kind == "primitive":
            checker.check(decl)
