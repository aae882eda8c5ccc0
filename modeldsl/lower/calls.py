"""One stage of a flow: a module instance (inlined), an inline module call ``Linear(w)``, a
stack, a primitive, or a type assertion ``[B, T, D]``.
"""

from __future__ import annotations

import difflib
from dataclasses import replace

from xdsl.ir import Operation, SSAValue

from modeldsl.diagnostics import Span
from modeldsl.dialects.graph_types import TensorType
from modeldsl.frontend.text import ast
from modeldsl.instances import (
    Instance,
    LoweringFailed,
    ParamSlot,
    StackedInstance,
)
from modeldsl.lower.constants import type_name
from modeldsl.lower.flows import is_saved, names_failed_param
from modeldsl.lower.params import qualified
from modeldsl.lower.tensor_types import has_dtype
from modeldsl.primitives import lookup_primitive, primitives
from modeldsl.resolve.consts import ConstEnv
from modeldsl.resolve.imports import std_module_declaring
from modeldsl.resolve.scope import Scope
from modeldsl.resolve.user_primitives import declared_signature, unresolved
from modeldsl.symbolic import STAR, Expr


class CallsMixin:
    """Calls: dispatching a flow's stages and inlining module instances."""

    def apply(self, instance: Instance, stage: ast.Expr, inputs: list[SSAValue],
              scope: Scope) -> tuple[list[SSAValue], list[Operation]]:
        """One stage of a flow: a module instance, a module call or a primitive."""
        if isinstance(stage, ast.ListExpr):
            return self.assert_type(stage, inputs, instance.env), []
        func, args = (stage.func, stage.args) if isinstance(stage, ast.Call) else (stage, [])
        func = qualified(func, instance.namespace)
        if names_failed_param(func, instance, scope):
            raise LoweringFailed()  # its declaration was refused and reported
        if isinstance(func, ast.Index) and isinstance(func.base, ast.Name) \
                and isinstance(instance.params.get(func.base.id), StackedInstance):
            stacked = instance.params[func.base.id]
            results = self.call_stack(stacked, inputs, stage.span, self.layer_range(func, stacked, instance.env))
            return results, [results[0].owner] if results else []
        if isinstance(func, ast.Name):
            # a primitive declaration of a user primitive binds its name to the registration impl: names
            primitive = declared_signature(instance.namespace.get(func.id)) or lookup_primitive(func.id)
            param = instance.params.get(func.id)
            if isinstance(param, (Instance, StackedInstance)):
                return self.call_instance(param, inputs, args, instance, scope, stage.span)
            if func.id in instance.namespace and instance.namespace[func.id].kind != "primitive":
                child = self.instantiate_call(func, args, instance, scope)
                return self.call_instance(child, inputs, [], instance, scope, stage.span)
            if primitive is not None:
                return self.call_primitive(primitive, inputs, args, instance, scope, stage.span)
        if isinstance(func, ast.Name) and unresolved(instance.namespace.get(func.id)):
            raise LoweringFailed()  # its declaration's impl: names nothing registered (reported there)
        name = func.id if isinstance(func, ast.Name) else func.span.text
        found = std_module_declaring(name) if isinstance(func, ast.Name) else None
        hint = f"import it: from {found} import {name}" if found else \
            "primitives are listed in spec section 6; modules must be declared or imported"
        close = difflib.get_close_matches(name, self.callable_names(instance), n=1) if not found else []
        if close:
            hint = f"did you mean '{close[0]}'? {hint}"
        self.sink.error("E014", f"unknown primitive or module '{name}'", func.span, hint)
        raise LoweringFailed()

    def callable_names(self, instance: Instance) -> list[str]:
        """What a flow's stage may call here: the primitives, the module instances and stacks among
        the parameters, and the modules and blocks the file declares or imports."""
        params = [n for n, p in instance.params.items() if isinstance(p, (Instance, StackedInstance))]
        decls = [n for n, d in instance.namespace.items() if d.kind in ("module", "block") and "." not in n]
        return [*primitives(), *params, *decls]

    def inline_prefix(self, base: str) -> str:
        """``Linear.``, then ``Linear_2.``, ...: the parameters an inline call leaves unbound
        become model parameters, one set per call."""
        prefix, index = f"{base}.", 1
        while prefix in self.inline_prefixes:
            index += 1
            prefix = f"{base}_{index}."
        self.inline_prefixes.add(prefix)
        return prefix

    def assert_type(self, stage: ast.ListExpr, inputs: list[SSAValue], env: ConstEnv) -> list[SSAValue]:
        """``x -> transpose(1, 2) -> [B, T, H, D] -> view(...)``: a type in a chain states the
        shape (and dtype, if written) of the value passing through (E004/E003 otherwise)."""
        declared = self.tensor_type(stage, env)
        if len(inputs) != 1:
            self.sink.error("E003", f"a type in a flow describes one value, got {len(inputs)}", stage.span)
            raise LoweringFailed()
        stated, computed = declared.shape, inputs[0].type.shape
        if len(stated) != len(computed) or any((a is STAR) != (b is STAR) or a is not STAR and Expr.of(a) != Expr.of(b)
                                               for a, b in zip(stated, computed)):
            self.sink.error("E004", f"the value is {inputs[0].type}, not the stated {declared}", stage.span)
            raise LoweringFailed()
        if has_dtype(stage) and declared.dtype != inputs[0].type.dtype:
            self.sink.error("E003", f"the value is {inputs[0].type.dtype.value}, not {declared.dtype.value}",
                            stage.span)
            raise LoweringFailed()
        return inputs

    def instantiate_call(self, func: ast.Name, args: list[ast.Arg], instance: Instance, scope: Scope) -> Instance:
        """``Linear(weight)``: tensor arguments bind the module's parameters in order;
        ``Linear(weight, bias=b)`` binds the parameter ``bias`` by name (and sets a boolean
        configuration parameter of that name, as ``bias=None`` clears it)."""
        args = self.chosen_args(args, instance, scope)
        tensors = [a for a in args if a.name is None and self.is_tensor(a.value, instance, scope)]
        by_name = [a for a in args if a.style == "=" and self.is_tensor(a.value, instance, scope)]
        consts = [a for a in args if a not in tensors and a not in by_name]
        decl = instance.namespace.get(func.id)
        flags = {p.name for p in (decl.params or []) if type_name(p) == "bool"} if decl is not None else set()
        consts += [replace(a, value=ast.Bool(a.span, True)) for a in by_name if a.name in flags]
        call = ast.Call(func.span, func, consts)
        bound = [self.tensor(instance, a.value, scope) for a in tensors]
        named = {a.name: self.tensor(instance, a.value, scope) for a in by_name}
        child = self.instantiate(call, instance.env, self.inline_prefix(f"{instance.prefix}{func.id.split('.')[-1]}"),
                                 instance.namespace, [b.type for b in bound])
        self.declare_nested(child, None, bound, named)
        return child

    def call_instance(self, target: Instance | StackedInstance, inputs: list[SSAValue], args: list[ast.Arg],
                      instance: Instance, scope: Scope, span: Span) -> tuple[list[SSAValue], list[Operation]]:
        """Inline a module instance's graph on the given inputs (or run a stack, or call
        the forward of a module with a written backward)."""
        if isinstance(target, StackedInstance):
            results = self.call_stack(target, inputs, span)
            return results, [results[0].owner] if results else []  # its annotations go on the stack op
        forward = self.forward_of(target.decl)
        inner_inputs, outputs = self.signature(forward, target.env)
        optional = self.optional_inputs[id(forward)]
        required = len(inner_inputs)
        while required and inner_inputs[required - 1][0] in optional:
            required -= 1
        if not required <= len(inputs) <= len(inner_inputs):
            counted = f"{required} to {len(inner_inputs)}" if required < len(inner_inputs) else str(required)
            self.sink.error("E003", f"{target.decl.name} takes {counted} input(s), got {len(inputs)}", span)
            raise LoweringFailed()
        omitted = inner_inputs[len(inputs):]
        inner_inputs = inner_inputs[: len(inputs)]
        if target.decl.name in self.active[1:]:
            self.sink.error("E007", f"{target.decl.name} calls itself", span, "a module cannot run inside itself")
            raise LoweringFailed()
        if self.has_written_backward(target):
            return self.call_module(target, forward, inner_inputs, outputs, inputs)
        inner = Scope(self.sink)
        for (name, declared, s), value in zip(inner_inputs, inputs):
            self.define_input(inner, name, value, declared, s, "optional" if name in optional else "input")
        for name, _, s in omitted:
            inner.define(name, None, s, "none")
        self.active.append(target.decl.name)
        # the call's inputs were checked where it stands; the module's own graph reads its inputs
        recomputing = self.backward is not None and self.backward.in_recompute
        if recomputing:
            self.backward.in_recompute = False
        try:
            results = self.run_graph(target, forward, inner, outputs)
        finally:
            self.active.pop()
            if recomputing:
                self.backward.in_recompute = True
        return results, [r.owner for r in results if isinstance(r.owner, Operation)]

    def is_tensor(self, node: ast.Expr, instance: Instance, scope: Scope) -> bool:
        if names_failed_param(node, instance, scope):
            return True  # reading it fails quietly
        if isinstance(node, ast.Name):
            return scope.find(node.id) is not None or isinstance(instance.params.get(node.id), ParamSlot)
        return isinstance(node, ast.Attribute) and isinstance(node.base, ast.Name) and (
            is_saved(node) or isinstance(instance.params.get(node.base.id), Instance)
        )

    def define_input(self, scope: Scope, name: str, value: SSAValue, declared: TensorType | None, span: Span,
                     kind: str = "input") -> None:
        """Bind a module's input; a concrete value bound to a declared ``[*, ...]`` remembers how many
        axes its ``*`` stands for (a reduction over it names the axes of the declared type)."""
        scope.define(name, value, span, kind)
        actual = value.type
        if isinstance(declared, TensorType) and declared.is_variadic and isinstance(actual, TensorType) \
                and not actual.is_variadic:
            self.star_width[value] = len(actual.shape) - len(declared.shape) + 1
