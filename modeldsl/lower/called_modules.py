"""Modules with a written ``backward:`` section (spec 5.12.6) are called, not inlined:
``@<path>_forward`` returns their outputs and the tensors their backward reads,
``@<path>_backward`` is the written backward (:mod:`modeldsl.lower.backward`). Instances
with the same configuration and types share one pair of functions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from xdsl.dialects.builtin import (
    ArrayAttr,
    FlatSymbolRefAttr,
    StringAttr,
)
from xdsl.ir import Operation, SSAValue

from modeldsl.dialects.graph import CallOp, FuncOp, ReturnOp
from modeldsl.dialects.graph_types import TensorType
from modeldsl.frontend.text import ast
from modeldsl.instances import (
    Instance,
    LoweringFailed,
    ParamSlot,
    StackedInstance,
    param_slots,
)
from modeldsl.ir import located, located_argument
from modeldsl.lower.backward import ForwardInput, ForwardResult
from modeldsl.lower.forward import gradient_skipped
from modeldsl.resolve.consts import ConstEnv
from modeldsl.resolve.scope import Scope


class CalledModulesMixin:
    """Called modules: the helper functions of modules with a written backward."""

    def has_written_backward(self, target: Instance) -> bool:
        """Whether an instance is called (not inlined) for its written backward's sake."""
        if self.backward is not None or self.in_module_func:
            return False  # a written backward covers the instances inside it
        sections = target.decl.sections("backward")
        if not sections or _holds_stack(target):
            return False
        graphs = [s for s in sections[0].body if isinstance(s, ast.Section) and s.name == "graph"]
        return bool(graphs) or not any(map(ast.is_placeholder, sections[0].body))

    def call_module(self, target: Instance, forward: ast.Section, inner_inputs: list, outputs: list,
                    inputs: list[SSAValue]) -> tuple[list[SSAValue], list[Operation]]:
        """``mdsl.graph.call @<path>_forward(inputs..., params...)``: its outputs (the saved
        tensors it also returns are for a derived gradient)."""
        slots = param_slots(target)
        key = _module_key(target, inputs, slots)
        if key not in self.module_funcs:
            self.module_funcs[key] = None  # a failure is reported once
            self.module_funcs[key] = self.lower_module(target, forward, inner_inputs, outputs,
                                                       [v.type for v in inputs], slots)
        funcs = self.module_funcs[key]
        if funcs is None:
            raise LoweringFailed()
        forward_func = funcs.forward
        call = CallOp(forward_func.sym_name.data, [*inputs, *(self.read_param(s) for s in slots)],
                      forward_func.function_type.outputs.data)
        for result, name in zip(call.res[funcs.outputs:], funcs.saved):
            result.name_hint = f"saved_{name}"
        self.block.add_op(call)
        return list(call.res[:funcs.outputs]), [call]

    def lower_module(self, target: Instance, forward: ast.Section, inner_inputs: list, outputs: list,
                     input_types: list[TensorType], slots: list[ParamSlot]) -> ModuleFuncs:
        """The ``@<path>_forward`` and ``@<path>_backward`` helpers of an instance."""
        name = self.helper_name(target.prefix.rstrip(".").replace(".", "_") or target.decl.name)
        types = [*input_types, *(s.type for s in slots)]
        func = located(FuncOp(f"{name}_forward", types, [], kind="helper"), forward.span)
        outer_block, outer_refs, outer_values = self.block, self.param_refs, [s.value for s in slots]
        self.block, self.param_refs = func.body.block, {}
        args = list(func.body.block.args)
        param_names = [s.path.removeprefix(target.prefix).replace(".", "_") for s in slots]
        for slot, arg, param in zip(slots, args[len(inner_inputs):], param_names):
            slot.value = arg
            arg.name_hint = param
            located_argument(arg, slot.span)
        scope = Scope(self.sink)
        for (n, declared, s), arg in zip(inner_inputs, args):
            arg.name_hint = n
            located_argument(arg, s)
            self.define_input(scope, n, arg, declared, s)
        self.active.append(target.decl.name)
        self.in_module_func += 1
        try:
            results = self.run_graph(target, forward, scope, outputs)
            skipped = gradient_skipped(forward)
            lowered = ForwardResult(
                [ForwardInput(n, arg.type, s, n in skipped) for (n, _, s), arg in zip(inner_inputs, args)],
                [(n, r.type, s) for (n, _, s), r in zip(outputs, results)],
                scope,
            )
            written = self.lower_backward_func(target, lowered, f"{name}_backward", slots)
        finally:
            self.active.pop()
            self.in_module_func -= 1
            self.block, self.param_refs = outer_block, outer_refs
            for slot, value in zip(slots, outer_values):
                slot.value = value
        if written is None:
            raise LoweringFailed()  # reported
        backward, saved = written
        returned = [*results, *(scope.find(n).value for n in saved)]
        func.body.block.add_op(ReturnOp(*returned))
        func.function_type = type(func.function_type).from_lists(types, [v.type for v in returned])
        func.attributes["backward"] = FlatSymbolRefAttr(backward.sym_name.data)
        func.attributes["saved"] = ArrayAttr([StringAttr(n) for n in saved])
        func.attributes["params"] = ArrayAttr([StringAttr(n) for n in param_names])
        self.helpers += [func, backward]
        return ModuleFuncs(func, len(results), saved)

    def helper_name(self, base: str) -> str:
        """``base``, or ``base_2``, ... when a function of that name exists."""
        taken = {f.sym_name.data for f in [*self.model.funcs(), *self.helpers]}
        name, index = base, 1
        while f"{name}_forward" in taken or f"{name}_backward" in taken or name in taken:
            index += 1
            name = f"{base}_{index}"
        return name


@dataclass
class ModuleFuncs:
    """The helper functions of a called module: its forward (which returns ``outputs``
    results, then the ``saved`` tensors); its backward is the forward's ``backward``."""

    forward: FuncOp
    outputs: int
    saved: list[str]


def _module_key(target: Instance, inputs: Sequence[SSAValue], slots: Sequence[ParamSlot]) -> tuple:
    """What a called module's helper functions depend on: the declaration, its configuration,
    the input types and the parameters' types and frozenness."""
    decl = target.decl
    env = []
    scope: ConstEnv | None = target.env
    while scope is not None:
        env += sorted((k, repr(v)) for k, v in scope.values.items())
        scope = scope.parent
    return (decl.name, decl.span.location, tuple(env), tuple(str(v.type) for v in inputs),
            tuple((str(s.type), s.frozen) for s in slots))


def _holds_stack(instance: Instance) -> bool:
    return any(isinstance(p, StackedInstance) or isinstance(p, Instance) and _holds_stack(p)
               for p in instance.params.values())
