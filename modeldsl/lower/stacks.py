"""``[n] x Block(...)``: one block body function per stack, called by ``mdsl.graph.stack``;
carried values thread through the layers, shared ones are the same for each, and
``blocks[a:b]()`` runs a range of layers on their slices of the stacked parameters.
"""

from __future__ import annotations

from xdsl.ir import SSAValue

from modeldsl.diagnostics import Span
from modeldsl.dialects.graph import ExprAttr, FuncOp, ReturnOp, StackOp
from modeldsl.dialects.graph_types import TensorType
from modeldsl.frontend.text import ast
from modeldsl.instances import (
    LoweringFailed,
    ParamSlot,
    StackedInstance,
    param_slots,
)
from modeldsl.ir import located, located_argument
from modeldsl.lower.annotations import record_input_memory
from modeldsl.resolve.consts import ConstEnv
from modeldsl.resolve.scope import Scope
from modeldsl.symbolic import Expr


class StacksMixin:
    """Stacks: the block body function and the stack op of a stacked instance."""

    def layer_range(self, func: ast.Index, stacked: StackedInstance, env: ConstEnv) -> tuple[Expr, Expr]:
        """``blocks[8:16]``: the layers [start, stop) of a stack (spec 7.6's pipeline stages)."""
        (sub,) = func.subscripts if len(func.subscripts) == 1 else (None,)
        if not isinstance(sub, ast.Slice):
            self.sink.error("E004", "a stack is called on a range of its layers: blocks[start:stop]()", func.span)
            raise LoweringFailed()
        return self.index_bounds(sub, stacked.count, env)

    def call_stack(self, stacked: StackedInstance, inputs: list[SSAValue], span: Span,
                   layers: tuple[Expr, Expr] | None = None) -> list[SSAValue]:
        """The block's outputs thread into its first inputs (carried); the other
        inputs are the same for every layer (shared). ``layers`` runs a range of
        them (``blocks[0:8]()``) on those layers' slices of the stacked parameters;
        every call of one stack runs the same block body function."""
        body = stacked.body
        name = body.prefix.rstrip(".").replace(".", "_")
        slots = param_slots(body)
        if id(stacked) not in self.stack_bodies:
            self.stack_bodies[id(stacked)] = self.stack_body(stacked, name, slots)
        results = self.stack_bodies[id(stacked)]
        count = stacked.count
        stacked_values = [self.read_param(ParamSlot(s.path, TensorType([stacked.count, *s.type.shape], s.type.dtype)))
                          for s in slots]
        if layers is not None:
            stacked_values = [self.split_out(v, 0, layers[0], layers[1], span) for v in stacked_values]
            count = layers[1] - layers[0]
        carried, shared = inputs[: len(results)], inputs[len(results) :]
        if [v.type for v in carried] != results:
            self.sink.error("E003", f"the outputs of {body.decl.name} must have the types of its first "
                            f"{len(results)} input(s) to be stacked", span,
                            "a stacked block maps (carried..., shared...) to carried values of the same types")
            raise LoweringFailed()
        stack = StackOp(name, ExprAttr(count), carried, stacked_values, shared)
        self.block.add_op(stack)
        return list(stack.res)

    def stack_body(self, stacked: StackedInstance, name: str, slots: list[ParamSlot]) -> list[TensorType]:
        """The block body function of a stack (one layer); the types of its results."""
        body = stacked.body
        forward = self.forward_of(body.decl)
        inner_inputs, outputs = self.signature(forward, body.env)
        types = [t for _, t, _ in inner_inputs] + [s.type for s in slots]
        func = located(FuncOp(name, types, [], kind="block"), forward.span)
        outer_block, outer_refs = self.block, self.param_refs
        self.block, self.param_refs = func.body.block, {}
        args = list(func.body.block.args)
        for slot, arg in zip(slots, args[len(inner_inputs):]):
            slot.value = arg
            arg.name_hint = slot.path.removeprefix(body.prefix).replace(".", "_")
            located_argument(arg, slot.span)
        scope = Scope(self.sink)
        for (n, _, s), arg in zip(inner_inputs, args):
            arg.name_hint = n
            located_argument(arg, s)
            scope.define(n, arg, s, "input")
        record_input_memory(func, body.decl, [n for n, _, _ in inner_inputs])
        self.record_input_gradients(func, forward, [n for n, _, _ in inner_inputs], body)
        try:
            results = self.run_graph(body, forward, scope, outputs)
            self.block.add_op(ReturnOp(*results))
        finally:
            self.block, self.param_refs = outer_block, outer_refs
            for slot in slots:
                slot.value = None
        func.function_type = type(func.function_type).from_lists(types, [r.type for r in results])
        self.model.body.block.add_op(func)
        return [r.type for r in results]
