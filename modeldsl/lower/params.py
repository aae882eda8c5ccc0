"""Parameters: a module's ``params:`` section becomes ``mdsl.graph.param`` ops named by their
path (``blocks.attn.qkv_weight``), stacked ``[n] x Block(...)`` ones with a leading ``n``;
a ``Module(...)`` entry is a nested instance, configured by its arguments.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from xdsl.dialects.builtin import (
    ArrayAttr,
)
from xdsl.ir import SSAValue

from modeldsl.diagnostics import Span
from modeldsl.dialects.dtypes import DTYPE_SPELLINGS
from modeldsl.dialects.graph import ParamOp
from modeldsl.dialects.graph_types import TensorType
from modeldsl.frontend.text import ast
from modeldsl.instances import (
    Instance,
    LoweringFailed,
    ParamSlot,
    StackedInstance,
)
from modeldsl.ir import located
from modeldsl.lower.annotations import split_user
from modeldsl.resolve.consts import ConstEnv
from modeldsl.resolve.imports import qualified_path, std_module_declaring
from modeldsl.resolve.inherit import merged
from modeldsl.symbolic import STAR, Expr


class ParamsMixin:
    """Params: declaring, binding and instantiating modules' parameters."""

    def declare_params(self, instance: Instance, stack: StackedInstance | None, bound: Sequence[SSAValue] = (),
                       named: dict[str, SSAValue] | None = None) -> None:
        """Declare an instance's tensor parameters (or bind them to caller tensors, in
        order or by name)."""
        bound = list(bound)
        named = dict(named or {})
        seen: dict[str, Span] = {}
        for section in instance.decl.sections("params"):
            for entry in section.body:
                if not isinstance(entry, ast.Section) or entry.value is None or entry.name is None:
                    self.sink.error("E001", "a parameter is declared as `name: [shape]` or `name: Module(...)`",
                                    entry.span)
                    continue
                guard = entry.value.guard
                if guard is not None and not self.guard(guard, instance.env):
                    continue
                if entry.name in seen:
                    self.sink.error("E009", f"duplicate parameter name '{entry.name}'", entry.key.span,
                                    "each parameter of a module needs its own name")
                    continue
                seen[entry.name] = entry.span
                try:
                    self.declare_param(instance, entry, stack, bound, named)
                except LoweringFailed:
                    instance.failed.add(entry.name)

    def declare_param(self, instance: Instance, entry: ast.Section, stack: StackedInstance | None,
                      bound: list[SSAValue], named: dict[str, SSAValue] | None = None) -> None:
        value = entry.value
        path = f"{instance.prefix}{entry.name}"
        expr = value.expr
        if isinstance(expr, ast.Optional_):
            expr = expr.base
        if isinstance(expr, ast.ListExpr):
            ptype = self.tensor_type(expr, instance.env)
            if named and entry.name in named:
                instance.params[entry.name] = ParamSlot(path, ptype, named.pop(entry.name))
                return
            if bound:
                instance.params[entry.name] = ParamSlot(path, ptype, bound.pop(0))
                return
            annotations, user = split_user(self.annotations(value.annotations, instance.env, instance.namespace,
                                                            target="param"))
            annotations, user = self.with_inherited(annotations, user)
            param = located(self.emit_param(path, ptype, stack, annotations), entry.key.span)
            if user:
                param.attributes["user_annotations"] = ArrayAttr(user)
            frozen = any(getattr(a, "DSL_NAME", None) == "frozen" for a in annotations)
            instance.params[entry.name] = ParamSlot(path, ptype, frozen=frozen, span=entry.key.span)
            return
        if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id == "tied_to":
            target = expr.args[0].value if expr.args else None
            if not isinstance(target, ast.Name) or target.id not in instance.params:
                self.sink.error("E002", "tied_to(...) needs a parameter declared before it", expr.span)
                raise LoweringFailed()
            instance.params[entry.name] = instance.params[target.id]
            return
        if isinstance(expr, ast.ArrayType):
            if stack is not None:
                self.sink.error("E003", f"'{entry.name}' is a stack inside a block that is itself stacked "
                                f"('{stack.span.text.strip() if stack.span is not None else path}'); stacks do not "
                                "nest", expr.span, "declare the inner layers as named parameters (layer_0, "
                                "layer_1, ...), or make the two stacks siblings in the model")
                raise LoweringFailed()
            count = self.const(expr.count, instance.env, "layer count")
            body = self.instantiate(expr.element, instance.env, f"{path}.", instance.namespace)
            stacked = StackedInstance(body, Expr.of(count), expr.span)
            with self.inheriting(value.annotations, instance):
                self.declare_nested(body, stacked)
            instance.params[entry.name] = stacked
            return
        child = self.instantiate(expr, instance.env, f"{path}.", instance.namespace)
        with self.inheriting(value.annotations, instance):
            self.declare_nested(child, stack)
        instance.params[entry.name] = child

    @contextmanager
    def inheriting(self, nodes: Sequence[ast.Annotation], instance: Instance) -> Iterator[None]:
        """While an instance's parameters are declared: the annotations written on the instance
        (``mlp: SwiGLU_MLP(d, f) @frozen``), which each of its parameters takes."""
        if not nodes:
            yield
            return
        self.inherited.append(split_user(self.annotations(nodes, instance.env, instance.namespace,
                                                          target="instance")))
        try:
            yield
        finally:
            self.inherited.pop()

    def with_inherited(self, annotations: list, user: list) -> tuple[list, list]:
        """A parameter's annotations after those of the instances around it, outermost first; the
        closer one of a kind wins (``@frozen`` and ``@trainable`` are one kind)."""
        merged_builtin: list = []
        merged_user: list = [*(u for _, users in self.inherited for u in users), *user]
        for layer in [*(b for b, _ in self.inherited), annotations]:
            kinds = {_kind(a) for a in layer}
            merged_builtin = [a for a in merged_builtin if _kind(a) not in kinds] + list(layer)
        return merged_builtin, merged_user

    def declare_nested(self, child: Instance, stack: StackedInstance | None, bound: Sequence[SSAValue] = (),
                       named: dict[str, SSAValue] | None = None) -> None:
        self.active.append(child.decl.name)
        self.warn_inert_declaration(child.decl, child.env, child.namespace)
        try:
            self.declare_params(child, stack, bound, named)
        finally:
            self.active.pop()

    def emit_param(self, path: str, ptype: TensorType, stack: StackedInstance | None, annotations: list) -> ParamOp:
        declared = ptype if stack is None else TensorType([stack.count, *ptype.shape], ptype.dtype)
        op = ParamOp(path, declared, annotations)
        self.model.body.block.add_op(op)
        return op

    def instantiate(self, expr: ast.Expr, env: ConstEnv, prefix: str, namespace: dict[str, ast.Decl],
                    bound_types: Sequence[TensorType] = ()) -> Instance:
        """``Module(args)`` or a bare ``Module``: a new instance with its arguments bound.

        Parameters not given may be inferred from the tensors bound to the
        module's parameters: ``Linear(up_weight)`` takes ``in_dim`` and
        ``out_dim`` from the shape of ``up_weight``."""
        call_args: list[ast.Arg] = []
        if isinstance(expr, ast.Call):
            call_args, expr = expr.args, expr.func
        expr = qualified(expr, namespace)
        if not isinstance(expr, ast.Name) or expr.id not in namespace or namespace[expr.id].kind == "primitive":
            name = expr.id if isinstance(expr, ast.Name) else "this expression"
            found = std_module_declaring(name) if isinstance(expr, ast.Name) else None
            modules = [n for n, d in namespace.items() if d.kind in ("module", "block") and "." not in n]
            close = difflib.get_close_matches(name, modules, n=1) if isinstance(expr, ast.Name) else []
            hint = f"import it: from {found} import {name}" if found else \
                (f"did you mean '{close[0]}'? " if close else "") + "declare the module in this file or import it"
            self.sink.error("E002", f"undefined module '{name}'", expr.span, hint)
            raise LoweringFailed()
        decl = self.concrete_decl(namespace[expr.id], expr.span)
        if decl.name in self.active:
            chain = " -> ".join([*self.active, decl.name])
            self.sink.error("E007", f"{decl.name} contains itself ({chain})", expr.span,
                            "a module cannot be one of its own parameters")
            raise LoweringFailed()
        child_env = ConstEnv()
        positional = [p for p in decl.params or [] if not p.rest]
        given: dict[str, Any] = {}
        for index, arg in enumerate(call_args):
            name = arg.name if arg.name is not None else (positional[index].name if index < len(positional) else None)
            if name is None:
                self.sink.error("E012", f"{decl.name} takes {len(positional)} argument(s)", arg.span)
                raise LoweringFailed()
            given[name] = self.const(self.chosen(arg.value, env), env)
        inferred = _infer_from_bound(decl, bound_types)
        for param in positional:
            if param.name in given:
                child_env.values[param.name] = given[param.name]
            elif param.name in inferred:
                child_env.values[param.name] = inferred[param.name]
            elif param.default is not None:
                child_env.values[param.name] = self.const(param.default, child_env)
            else:
                self.sink.error("E012", f"missing required parameter '{param.name}' of {decl.name}", expr.span,
                                f"pass it: {decl.name}(..., {param.name}=...)")
                raise LoweringFailed()
        instance = Instance(decl, child_env, prefix, self.namespace_of(namespace[expr.id]))
        self.evaluate_let(instance)
        return instance

    def concrete_decl(self, decl: ast.Decl, span: Span) -> ast.Decl:
        """The declaration with its inheritance folded in; abstract ones cannot be used (E011)."""
        if decl.abstract:
            self.sink.error("E011", f"{decl.name} is abstract and cannot be instantiated", span,
                            f"declare a module that extends {decl.name} and gives its graph")
            raise LoweringFailed()
        result = merged(decl, self.namespace_of(decl), self.sink)
        if result is None:
            raise LoweringFailed()
        return result


def _infer_from_bound(decl: ast.Decl, bound_types: Sequence[TensorType]) -> dict[str, Any]:
    """Signature parameters that appear alone as a dimension of a parameter bound to a tensor."""
    names = {p.name for p in decl.params or [] if p.name}
    found: dict[str, Any] = {}
    entries = [e for section in decl.sections("params") for e in section.body
               if isinstance(e, ast.Section) and e.value is not None and isinstance(e.value.expr, ast.ListExpr)]
    for entry, bound in zip(entries, bound_types):
        dims = [d for d in entry.value.expr.items if not (isinstance(d, ast.Name) and d.id in DTYPE_SPELLINGS)]
        if len(dims) != len(bound.shape):
            continue
        for dim, actual in zip(dims, bound.shape):
            if isinstance(dim, ast.Name) and dim.id in names and dim.id not in found and actual is not STAR:
                value = actual.const_value()
                found[dim.id] = value if value is not None else actual
    return found


def qualified(func: ast.Expr, namespace: dict[str, ast.Decl]) -> ast.Expr:
    """``models.llama.Attention`` as the name the resolver registered it under."""
    path = qualified_path(func) if isinstance(func, ast.Attribute) else None
    dotted = ".".join(path) if path else None
    return ast.Name(func.span, dotted) if dotted in namespace else func


def _kind(annotation) -> str:
    """What an annotation decides, for :meth:`ParamsMixin.with_inherited`: frozen and trainable decide one thing."""
    name = getattr(annotation, "DSL_NAME", type(annotation).__name__)
    return "trainable" if name in ("frozen", "trainable") else name
