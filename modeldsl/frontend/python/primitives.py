"""``@primitive`` functions of the Python DSL as ``primitive`` declarations (checked against the op
registry by the resolver, like the text ones)."""

from __future__ import annotations

import ast as py
from typing import Any

from modeldsl.frontend.python.nodes import Nodes, called_name, is_string, subscript_of, subscripts
from modeldsl.frontend.text import ast


class Primitives(Nodes):
    def primitive(self, func: py.FunctionDef, backward: py.FunctionDef | None) -> ast.Decl:
        """``@primitive(impl="kernels.x") def name(a: Tensor[...], *, p: float = 1.0) -> Tensor[...]``:
        ``primitive name:`` with ``params:`` (the keyword-only arguments), ``forward:`` ``in:``/``out:``,
        and, from ``@name.backward def name_backward(...)``, ``backward:`` ``in:``/``out:`` and its
        ``@save`` list."""
        body: list[ast.Stmt] = []
        doc = py.get_docstring(func, clean=True)
        if doc is not None:
            body.append(ast.ExprStmt(self.span(func.body[0]), ast.Str(self.span(func.body[0]), doc)))
        kwonly = func.args.kwonlyargs
        if kwonly:
            defaults = func.args.kw_defaults
            body.append(self.section(func, "params", [self.primitive_param(a, d) for a, d in zip(kwonly, defaults)]))
        body.append(self.section(func, "forward", self.signature_slots(func)))
        if backward is not None:
            body.append(self.section(backward, "backward", self.signature_slots(backward)))
            body += self.lists(backward)
        impl = next((k.value for d in func.decorator_list if isinstance(d, py.Call) and called_name(d) == "primitive"
                     for k in d.keywords if k.arg == "impl"), None)
        if impl is not None:
            body.append(self.section(impl, "impl", self.implementations(impl, backward is not None)))
        return ast.Decl(self.span(func), "primitive", func.name, None, body)

    def primitive_param(self, arg: py.arg, default: py.expr | None) -> ast.Section:
        """``p: float = 1.0``, ``mode: Literal["NN", "NT"] = "NN"`` (an enum), ``sizes: list[int]``,
        ``scale: float | None = None`` (optional)."""
        optional = isinstance(arg.annotation, py.BinOp) and isinstance(arg.annotation.op, py.BitOr) \
            and isinstance(arg.annotation.right, py.Constant) and arg.annotation.right.value is None
        annotation = arg.annotation.left if optional else arg.annotation
        if subscript_of(annotation, "Literal") and all(is_string(c) for c in subscripts(annotation)):
            kind: ast.Expr = ast.Call(self.span(annotation), ast.Name(self.span(annotation.value), "enum"),
                                      [ast.Arg(self.span(c), ast.Name(self.inner(c), c.value))
                                       for c in subscripts(annotation)])
        elif subscript_of(annotation, "list") and called_name(subscripts(annotation)[0]) == "int":
            kind = ast.ListExpr(self.span(annotation), [ast.Name(self.span(annotation), "int")])
        elif isinstance(annotation, py.Name) and annotation.id in ("float", "int", "bool", "dtype"):
            kind = ast.Name(self.span(annotation), annotation.id)
        else:
            raise self.error(arg, f"parameter '{arg.arg}' has no primitive parameter type",
                             "float, int, bool, dtype, list[int] or Literal[\"A\", \"B\"] (an enum); "
                             "| None if optional")
        if optional:
            kind = ast.Optional_(kind.span, kind)
        value_default = None
        if default is not None:
            value_default = self.word(default) if is_string(default) else self.expr(default)
        return ast.Section(self.span(arg), ast.Name(self.span(arg), arg.arg),
                           ast.Value(kind.span, kind, value_default), [])

    def signature_slots(self, func: py.FunctionDef) -> list[ast.Stmt]:
        """``in: (a: [...], b: [...])`` and ``out: [...]`` (several: ``out: ([...], [...])``)."""
        args = func.args
        if args.vararg is not None or args.posonlyargs or args.kwarg is not None:
            raise self.error(func, f"{func.name} takes its tensors as plain arguments (then * and its parameters)")
        fields = [ast.NamedField(self.span(a), a.arg, self.slot_type(a.annotation, a)) for a in args.args]
        entries: list[ast.Stmt] = [self.entry(func, "in", ast.NamedTuple(self.span(func), fields))]
        returns = func.returns
        if returns is None:
            raise self.error(func, f"{func.name} has no output type", "annotate it: -> Tensor[...]")
        outputs = [self.slot_type(t, returns) for t in (subscripts(returns) if subscript_of(returns, "tuple")
                                                         else [returns])]
        shape = outputs[0] if len(outputs) == 1 else ast.TupleExpr(self.span(returns), outputs)
        entries.append(self.entry(returns, "out", shape))
        return entries

    def slot_type(self, annotation: py.expr | None, where: Any) -> ast.Expr:
        if annotation is None:
            raise self.error(where, "a tensor argument needs its type: Tensor[...]")
        if isinstance(annotation, py.BinOp) and isinstance(annotation.op, py.BitOr) \
                and isinstance(annotation.right, py.Constant) and annotation.right.value is None:
            return ast.Optional_(self.span(annotation), self.tensor_type(annotation.left))
        return self.tensor_type(annotation)

    def implementations(self, impl: py.expr, backward: bool) -> list[ast.Stmt]:
        """``impl="kernels.x"`` (forward, and backward when there is one) or ``impl={"forward": ..., ...}``."""
        if is_string(impl):
            pairs = [("forward", impl)] + ([("backward", impl)] if backward else [])
        elif isinstance(impl, py.Dict) and all(is_string(k) and is_string(v) for k, v in zip(impl.keys, impl.values)):
            pairs = [(k.value, v) for k, v in zip(impl.keys, impl.values)]
        else:
            raise self.error(impl, "impl names the kernels: impl=\"kernels.x\" or "
                             "impl={\"forward\": \"kernels.x\", ...}")
        return [self.entry(v, k, ast.Name(self.inner(v), v.value)) for k, v in pairs]
