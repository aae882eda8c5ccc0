"""``mdsl-autodiff``: derive a model function's gradient from the VJP rules.

``mdsl-autodiff{func=forward}`` adds ``@forward_grad(inputs..., d_outputs...)
-> (outputs..., d_params..., d_inputs...)`` (the inputs a gradient reaches: not token
ids, not a RoPE table) to a specialized model: the
forward ops, then their gradients in reverse order, built by each
primitive's VJP rule (:mod:`modeldsl.vjp`). Gradients of a value used more
than once are added; ``@frozen`` parameters get none, nor do integer tensors
(token ids, labels), nor what an op without a VJP rule computes from frozen
parameters alone (``dequantize`` of a weight ``mdsl-quantize-frozen`` stores).
The function records the parameters its gradients belong to (``grads``) and
the forward values the backward ops read (``saved``: what a training schedule
must keep, or recompute) and how many of
its first ops are the forward's (``forward_ops``). The forward ops it clones get
the attributes their registry record sets in training (dropout's
``training = true``: the plain ``@forward`` stays the inference program).

Calls are inlined. A call of a module's forward helper that names its
written backward (``backward = @<path>_backward``, see :mod:`modeldsl.lower`;
spec 5.12.6: an explicit backward disables auto-derivation) is inlined too,
but its part of the graph is not differentiated op by op: in the reverse
sweep the gradients of its outputs (zeros for an output no gradient reaches,
cast to the dtype the backward declares) go, with the saved tensors the
forward returns after its outputs and its parameter arguments, into
``mdsl.graph.call @<path>_backward``, whose results (``grad_args`` says of
which forward argument each is the gradient) are added to the gradients of
the call's operands: its inputs and the parameters (or per-layer parameter
slices) it was called with. Frozen parameters and integer operands still get
no gradient; inputs marked ``@gradient(skip)`` get none from the written
backward.

A ``stack`` stays a stack: its block body ``@<body>`` gets a gradient of
its own, split in two functions. ``@<body>_fwd`` (kind ``block``) is the body
returning, after its carried values, the values its backward reads (the
block's saved tensors: forward results, and the carried inputs where the
backward reads them); the forward runs it in a ``stack`` whose collected
results hold them layer by layer. ``@<body>_bwd`` (kind ``block_backward``,
``forward = @<body>_fwd``) takes the gradients of the carried values, the
shared values, the layer's slices and its saved tensors, and returns the
gradients of the carried inputs, then of each differentiable slice; the reverse
sweep runs it in a ``stack ... reverse`` whose collected results are the
per-layer parameter gradients. ``mdsl-recompute`` then decides what of the
saved is recomputed instead. A stack whose body reads a parameter of its own,
holds another stack, or whose shared values or integer carried values a
gradient reaches is unrolled layer by layer (the per-layer slices become
split + view, whose VJPs concatenate the per-layer gradients back); so is
every stack with ``loop=false``.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ArrayAttr, IntegerAttr, ModuleOp, StringAttr, SymbolRefAttr, i64
from xdsl.ir import Block, Operation, SSAValue
from xdsl.passes import ModulePass

from modeldsl.diagnostics import Diagnostic, DiagnosticError
from modeldsl.dialects.annotations import GradientAttr, annotations_of, find_annotation
from modeldsl.dialects.graph import CallOp, CustomOp, FuncOp, ModelOp, ParamOp, ParamRefOp, ReturnOp, StackOp
from modeldsl.dialects.graph_types import TensorType
from modeldsl.graph_builder import GraphBuilder, GraphBuildError
from modeldsl.ir import span_of_location
from modeldsl.kernel_choice import carry_to_backward
from modeldsl.primitives import primitive_name
from modeldsl.prims import by_name, registry
from modeldsl.vjp import RULES


class AutodiffError(Exception):
    """A function autodiff cannot differentiate (with the op that stops it)."""


@dataclass(frozen=True)
class AutodiffPass(ModulePass):
    name = "mdsl-autodiff"

    func: str = "forward"
    loop: bool = True

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for model in [m for m in op.walk() if isinstance(m, ModelOp)]:
            try:
                gradient_function(model, self.func, self.loop)
            except AutodiffError as err:
                hint = "run mdsl-specialize first" if "mdsl-specialize" in str(err) else \
                    "write a backward: section for the module that uses it"
                raise DiagnosticError([Diagnostic("E014", f"mdsl-autodiff: {err}", None, hint)]) from None


def gradient_function(model: ModelOp, func_name: str = "forward", loop: bool = True) -> FuncOp:
    """Build ``@<func_name>_grad`` in ``model`` and return it (stacks looped unless ``loop`` is false)."""
    funcs = {f.sym_name.data: f for f in model.body.block.ops if isinstance(f, FuncOp)}
    if func_name not in funcs:
        raise AutodiffError(f"@{model.sym_name.data} has no function @{func_name}")
    grad = GradientBuilder(model, funcs, loop).build(funcs[func_name])
    for func in [f for f in model.funcs() if f.attributes.get("kind") == StringAttr("backward")]:
        drop_unread_gradients(model, func)
    return grad


def drop_unread_gradients(model: ModelOp, backward: FuncOp) -> None:
    """A written backward's gradients no call reads (those of ``@frozen`` parameters) leave its
    results, with the ops only they need: a frozen weight's gradient GEMM is not computed."""
    calls = [op for op in model.walk() if isinstance(op, CallOp) and op.callee.root_reference.data ==
             backward.sym_name.data]
    ret = backward.body.block.last_op
    if not calls or not isinstance(ret, ReturnOp):
        return
    kept = [i for i in range(len(ret.values)) if any(call.res[i].uses for call in calls)]
    if len(kept) == len(ret.values):
        return
    values = [ret.values[i] for i in kept]
    new_ret = ReturnOp(*values)
    backward.body.block.insert_op_before(new_ret, ret)
    ret.detach()
    ret.erase()
    backward.function_type = type(backward.function_type).from_lists(
        list(backward.function_type.inputs.data), [v.type for v in values])
    for name in ("grads", "grad_args"):
        attr = backward.attributes.get(name)
        if attr is not None:
            entries = list(attr.data) if isinstance(attr, ArrayAttr) else list(attr.get_values())
            kept_entries = [entries[i] for i in kept if i < len(entries)]
            backward.attributes[name] = ArrayAttr(kept_entries) if isinstance(attr, ArrayAttr) else \
                type(attr).from_list(i64, kept_entries)
    for call in calls:
        new = CallOp(call.callee.root_reference.data, list(call.arguments), [call.res[i].type for i in kept])
        new.attributes.update({k: v for k, v in call.attributes.items() if k not in new.attributes})
        call.parent_block().insert_op_before(new, call)
        for index, result in zip(kept, new.res):
            result.name_hint = call.res[index].name_hint
            call.res[index].replace_all_uses_with(result)
        call.detach()
        call.erase()
    erase_dead_ops(list(backward.body.block.ops))


def set_training_mode(op: Operation) -> None:
    """The attributes a training step sets on a forward op (its registry record's ``training``:
    dropout's ``training = true``), so the differentiated forward trains and the plain one infers."""
    entry = registry().get(type(op))
    for name, value in (entry.training.items() if entry is not None else ()):
        op.attributes[name] = value


def user_vjp(op: Operation):
    """The VJP rule of a user primitive's call (:mod:`modeldsl.prims.user`); E005 at the call for one
    registered without ``vjp=`` (or not registered here), whose gradient is needed."""
    if not isinstance(op, CustomOp):
        return None
    record = by_name().get(op.primitive)
    if record is not None and record.vjp is not None:
        return record.vjp
    why = record.no_vjp if record is not None else f"{op.primitive} is not registered in this process"
    raise DiagnosticError([Diagnostic(
        "E005", f"missing required gradient: a gradient flows back through {op.primitive}, but {why}",
        span_of_location(op.location, op.primitive),
        f"register it with modeldsl.register_primitive(\"{op.primitive}\", ..., vjp=...), or keep the gradient "
        "from reaching it (@frozen parameters, @gradient(skip))")])


def is_float(value: SSAValue) -> bool:
    return isinstance(value.type, TensorType) and value.type.dtype.is_float


@dataclass
class WrittenBackward:
    """An inlined call of a forward with a written backward: in the reverse sweep, one call
    of ``backward`` on the gradients of ``outputs``, the ``saved`` values and ``params``,
    whose results are the gradients of ``operands[i]`` for ``i`` in ``grad_args``."""

    backward: FuncOp
    operands: list[SSAValue]
    outputs: list[SSAValue]
    saved: list[SSAValue]
    params: list[SSAValue]
    grad_args: list[int]


@dataclass
class LoopedStack:
    """A stack run as a loop in both directions: in the reverse sweep, ``stack @<bwd> reverse``
    on the gradients of ``forward``'s carried results, its shared values, its per-layer
    operands and its collected (saved) results; its collected results are the gradients of
    the per-layer operands numbered in ``differentiable``."""

    forward: StackOp
    backward: FuncOp
    differentiable: list[int]


class NotLoopable(Exception):
    """A stack the looped backward does not cover (it is unrolled instead)."""


class GradientBuilder:
    def __init__(self, model: ModelOp, funcs: dict[str, FuncOp], loop: bool = True):
        self.model, self.funcs, self.loop = model, funcs, loop
        self.forward_ops: list[Operation | WrittenBackward | LoopedStack] = []
        self.grads: dict[SSAValue, SSAValue] = {}
        self.nondifferentiable: set[SSAValue] = set()  # arguments that get no gradient (frozen slices)
        self.gradient_of: dict[SSAValue, GradientAttr] = {}  # a value's @gradient (spec 7.8.3)
        self.per_layer: set[str] = set()  # parameters whose @gradient applies to each layer's slice
        self.skipped = False  # a gradient was dropped (@gradient(skip)): its ops are dead code

    # ------------------------------------------------------------------ forward
    def build(self, func: FuncOp) -> FuncOp:
        grad_func, backward_start, args = self.derive(func)
        saved = self.saved(backward_start, args)
        grad_func.attributes["saved"] = ArrayAttr([StringAttr(n) for n in saved])
        grad_func.attributes["forward_ops"] = IntegerAttr(backward_start, i64)
        self.model.body.block.add_op(grad_func)
        return grad_func

    def derive(self, func: FuncOp, fixed_args: list[int] = (),
               arg_gradients: dict[int, GradientAttr] | None = None) -> tuple[FuncOp, int, list[SSAValue]]:
        """``@<func>_grad`` (not yet added to the model; the arguments numbered in ``fixed_args`` get
        no gradient, those in ``arg_gradients`` have that ``@gradient``), where its backward starts,
        and its inputs."""
        inputs = list(func.function_type.inputs.data)
        outputs = list(func.function_type.outputs.data)
        seeds = [t for t in outputs if isinstance(t, TensorType) and t.dtype.is_float]
        grad_func = FuncOp(f"{func.sym_name.data}_grad", [*inputs, *seeds], [], kind="helper")
        self.block = grad_func.body.block
        self.builder = GraphBuilder(self.block)
        args = list(self.block.args)
        for arg, old in zip(args, func.body.block.args):
            arg.name_hint = old.name_hint
        self.nondifferentiable |= {args[i] for i in fixed_args}
        for i, attr in input_gradients(func).items():
            self.gradient_of[args[i]] = attr
        for i, attr in (arg_gradients or {}).items():
            self.gradient_of[args[i]] = attr
        results = self.inline(func.body.block, dict(zip(func.body.block.args, args)))
        seed_args = iter(args[len(inputs):])
        for value in results:
            if is_float(value):
                seed = next(seed_args)
                seed.name_hint = f"d_{value.name_hint}" if value.name_hint else None
                self.accumulate(value, seed)
        backward_start = len(self.block.ops)
        self.backward()
        self.finish(args[:len(inputs)])
        params = self.parameter_gradients()
        differentiated = [a for a in args[:len(inputs)] if is_float(a) and a in self.grads]
        returned = [*results, *(g for _, g in params), *(self.grads[a] for a in differentiated)]
        self.block.add_op(ReturnOp(*returned))
        if self.skipped:
            erase_dead_ops(list(self.block.ops)[backward_start:])
        grad_func.function_type = type(grad_func.function_type).from_lists(
            [a.type for a in args], [v.type for v in returned])
        grad_func.attributes["grads"] = ArrayAttr([StringAttr(name) for name, _ in params])
        grad_func.attributes["input_grads"] = ArrayAttr([StringAttr(a.name_hint or "?") for a in differentiated])
        return grad_func, backward_start, args[:len(inputs)]

    def inline(self, block: Block, values: dict[SSAValue, SSAValue]) -> list[SSAValue]:
        """Clone a function body's ops (stacks looped or unrolled); the values it returns."""
        for op in block.ops:
            if isinstance(op, ReturnOp):
                return [values[v] for v in op.values]
            if isinstance(op, StackOp):
                results = self.looped(op, values) if self.loop else None
                for result, value in zip(op.res, results or self.unroll(op, values)):
                    values[result] = value
            elif isinstance(op, CallOp):
                callee = self.funcs[op.callee.root_reference.data]
                operands = [values[v] for v in op.arguments]
                inner = dict(zip(callee.body.block.args, operands))
                start = len(self.forward_ops)
                results = self.inline(callee.body.block, inner)
                if isinstance(callee.attributes.get("backward"), SymbolRefAttr):
                    del self.forward_ops[start:]  # differentiated by the written backward, not op by op
                    results = self.written_backward(callee, operands, results)
                    for result, value in zip(op.res, results[:len(results) - len(callee.attributes["saved"])]):
                        value.name_hint = result.name_hint or value.name_hint  # the caller's name
                for result, value in zip(op.res, results):
                    values[result] = value
            else:
                clone = op.clone(value_mapper=dict(values))
                set_training_mode(clone)
                self.block.add_op(clone)
                self.forward_ops.append(clone)
                for old, new in zip(op.results, clone.results):
                    new.name_hint = old.name_hint
                    values[old] = new
            self.note_gradients(op, [values[r] for r in op.results])
        raise AutodiffError("a function without return")

    def note_gradients(self, op: Operation, values: list[SSAValue]) -> None:
        """Record the ``@gradient`` of each of ``values`` (the results of ``op`` in this function):
        the one its result carries (``-> (w, i, aux_loss @gradient(skip))``), else the op's."""
        for index, value in enumerate(values):
            attr = result_gradient(op, index)
            if attr is not None and is_float(value):
                self.gradient_of[value] = attr

    def written_backward(self, callee: FuncOp, operands: list[SSAValue], results: list[SSAValue]) -> list[SSAValue]:
        """Record the call for the reverse sweep; its results, each output a value of its own."""
        backward = self.funcs.get(callee.attributes["backward"].root_reference.data)
        if backward is None:
            raise AutodiffError(f"@{callee.sym_name.data} names a backward @"
                                f"{callee.attributes['backward'].root_reference.data} the model does not have")
        saved, params = len(callee.attributes["saved"]), len(callee.attributes["params"])
        outputs = results[:len(results) - saved]
        distinct: list[SSAValue] = []
        for value in outputs:
            if value in operands or value in distinct:  # an input passed through: its own value
                value = self.builder.one("view", value, shape=list(value.type.shape))  # (not differentiated)
            distinct.append(value)
        grad_args = list(backward.attributes["grad_args"].get_values()) if "grad_args" in backward.attributes \
            else []
        self.forward_ops.append(WrittenBackward(backward, operands, distinct, results[len(outputs):],
                                                operands[len(operands) - params:], grad_args))
        return [*distinct, *results[len(outputs):]]

    def unroll(self, op: StackOp, values: dict[SSAValue, SSAValue]) -> list[SSAValue]:
        body = self.funcs[op.body.root_reference.data]
        count = op.count.data
        if not count.is_const():
            raise AutodiffError(f"the layer count {count} of @{op.body.root_reference.data} is not known "
                                "(mdsl-specialize binds it)")
        layers = count.const_value()
        slices = [self.layer_slices(values[v], layers) for v in op.per_layer]
        for v, layer_slices in zip(op.per_layer, slices):
            attr = self.gradient_of.get(values[v]) or self.param_gradient(values[v])
            if attr is not None:  # a stacked parameter's @gradient: each layer's slice
                self.gradient_of.update((s, attr) for s in layer_slices)
                if isinstance(values[v].owner, ParamRefOp):
                    self.per_layer.add(values[v].owner.param.root_reference.data)
        carried = [values[v] for v in op.carried]
        shared = [values[v] for v in op.shared]
        marked = input_gradients(body)
        for layer in range(layers):
            operands = [*carried, *shared, *(s[layer] for s in slices)]
            for index, attr in marked.items():  # the block's in: x @gradient(...), in each layer
                self.gradient_of.setdefault(operands[index], attr)
            inner = dict(zip(body.body.block.args, operands))
            carried = self.inline(body.body.block, inner)
        return carried

    def looped(self, op: StackOp, values: dict[SSAValue, SSAValue]) -> list[SSAValue] | None:
        """The carried results of ``stack @<body>_fwd`` (recorded for the reverse sweep), or None
        where the stack is unrolled instead."""
        if op.collected or op.reverse is not None:
            return None  # a stack autodiff itself made: differentiate it layer by layer
        frozen = self.frozen_params()
        per_layer = [values[v] for v in op.per_layer]
        fixed = [i for i, v in enumerate(per_layer)
                 if not is_float(v) or v in self.nondifferentiable or
                 (isinstance(v.owner, ParamRefOp) and v.owner.param.root_reference.data in frozen)]
        slice_gradients = {i: self.gradient_of[v] for i, v in enumerate(per_layer) if v in self.gradient_of}
        slice_gradients |= {i: attr for i, v in enumerate(per_layer) if (attr := self.param_gradient(v)) is not None}
        try:
            split = BlockGradient(self, self.funcs[op.body.root_reference.data], len(op.carried),
                                  len(op.shared), fixed, slice_gradients).split()
        except NotLoopable:
            return None
        self.per_layer |= {v.owner.param.root_reference.data for i, v in enumerate(per_layer)
                           if i in slice_gradients and isinstance(v.owner, ParamRefOp)}
        forward_func, backward_func, differentiable = split
        forward = StackOp(forward_func.sym_name.data, op.count, [values[v] for v in op.carried], per_layer,
                          [values[v] for v in op.shared],
                          [StackOp.stacked_type(op.count, t) for t in
                           forward_func.function_type.outputs.data[len(op.carried):]])
        if "annotations" in op.attributes:
            forward.attributes["annotations"] = op.attributes["annotations"]
        forward.location = op.location  # (where an @assert on the stack's result stands)
        self.block.add_op(forward)
        for result, old in zip(forward.carried_results, op.carried_results):
            result.name_hint = old.name_hint
        body = op.body.root_reference.data
        for result, value in zip(forward.collected, forward_func.body.block.last_op.operands[len(op.carried):]):
            result.name_hint = f"{body}_{value.name_hint}" if value.name_hint else None
        self.forward_ops.append(LoopedStack(forward, backward_func, differentiable))
        return list(forward.carried_results)

    def layer_slices(self, stacked: SSAValue, layers: int) -> list[SSAValue]:
        """``stacked[l]`` for each layer: one split along the layer dim, then a view per layer."""
        start = len(self.block.ops)
        parts = self.builder.op("split", stacked, sizes=[1] * layers, dim=0)
        shape = list(stacked.type.shape[1:])
        views = [self.builder.one("view", part, shape=shape) for part in parts]
        self.forward_ops.extend(list(self.block.ops)[start:])
        return views

    # ------------------------------------------------------------------ backward
    def accumulate(self, value: SSAValue, grad: SSAValue) -> None:
        attr = self.gradient_of.get(value) or self.param_gradient(value)
        if attr is not None and attr["mode"] == "skip":
            self.skipped = True  # @gradient(skip): the value is a constant of the backward
            return
        if attr is not None and attr["mode"] == "accumulate":
            grad = self.transformed(grad, attr)  # each contribution scaled and clipped before the sum
        previous = self.grads.get(value)
        self.grads[value] = grad if previous is None else self.builder.one("add", previous, grad)

    def transformed(self, grad: SSAValue, attr: GradientAttr) -> SSAValue:
        """A gradient through ``@gradient(scale=S, clip=C)``: scaled by S, then its L2 norm clipped at C."""
        if attr["scale"] != 1.0:
            grad = self.builder.one("scale", grad, factor=float(attr["scale"]))
        if attr["clip"] is not None:
            grad = self.builder.one("clip_norm", grad, max_norm=float(attr["clip"]))
        return grad

    def finish(self, values) -> None:
        """The gradients of ``values`` are complete (every use of them is differentiated): apply
        their ``@gradient(scale, clip)`` (mode compute: to the total gradient)."""
        for value in values:
            attr = self.gradient_of.get(value)
            if attr is not None and attr["mode"] not in ("skip", "accumulate") and value in self.grads:
                self.grads[value] = self.transformed(self.grads[value], attr)

    def param_gradient(self, value: SSAValue) -> GradientAttr | None:
        """The ``@gradient`` declared on the parameter ``value`` reads (None for other values, and
        for a stacked parameter whose layers' slices carry it)."""
        if not isinstance(value.owner, ParamRefOp) or value.owner.param.root_reference.data in self.per_layer:
            return None
        param = self.params().get(value.owner.param.root_reference.data)
        return find_annotation(param, GradientAttr) if param is not None else None

    def params(self) -> dict[str, ParamOp]:
        return {p.sym_name.data: p for p in self.model.body.block.ops if isinstance(p, ParamOp)}

    def backward(self) -> None:
        frozen = self.frozen_params()
        for op in reversed(self.forward_ops):
            if isinstance(op, ParamRefOp):
                continue  # its gradient is the parameter's (parameter_gradients)
            if isinstance(op, WrittenBackward):
                self.finish(op.outputs)
                self.call_backward(op, frozen)
                continue
            if isinstance(op, LoopedStack):
                self.finish(op.forward.carried_results)
                self.stack_backward(op, frozen)
                continue
            self.finish(op.results)
            result_grads = [self.grads.get(r) for r in op.results]
            if all(g is None for g in result_grads):
                continue
            name = primitive_name(op)
            rule = RULES.get(name) or user_vjp(op)
            if rule is None and self.constant(op, frozen):
                continue  # computed from frozen parameters alone (a stored weight's dequantize): nothing to pass on
            if rule is None:
                raise AutodiffError(f"no VJP rule for {name}")
            before = self.block.last_op
            try:
                operand_grads = rule(self.builder, op, result_grads)
            except (GraphBuildError, NotImplementedError) as err:
                raise AutodiffError(f"the gradient of {name}: {err}") from None
            carry_to_backward(op, before, self.block)  # @kernel names the backward kernel too
            for operand, grad in zip(op.operands, operand_grads, strict=True):
                self.accumulate_operand(operand, grad, frozen)

    def constant(self, op: Operation, frozen: set[str]) -> bool:
        """Whether every float operand of ``op`` is a constant of the backward: a frozen parameter, an
        argument that gets no gradient, or computed from such values alone (through ops that have one
        operand or more)."""
        pending = [v for v in op.operands if is_float(v)]
        seen: set[SSAValue] = set()
        while pending:
            value = pending.pop()
            if value in seen or value in self.nondifferentiable or not is_float(value):
                continue
            seen.add(value)
            owner = value.owner
            if isinstance(owner, ParamRefOp):
                if owner.param.root_reference.data not in frozen:
                    return False
            elif isinstance(owner, Operation) and owner.operands and not isinstance(owner, (StackOp, CallOp)):
                pending.extend(owner.operands)
            else:
                return False
        return True

    def accumulate_operand(self, operand: SSAValue, grad: SSAValue | None, frozen: set[str]) -> None:
        """Add an operand's gradient (none for integer tensors and frozen parameters)."""
        if grad is None or not is_float(operand) or operand in self.nondifferentiable:
            return
        owner = operand.owner
        if isinstance(owner, ParamRefOp) and owner.param.root_reference.data in frozen:
            return
        self.accumulate(operand, grad)

    def call_backward(self, record: WrittenBackward, frozen: set[str]) -> None:
        """``call @<path>_backward(d_outputs..., saved..., params...)`` and its gradients added in."""
        float_outputs = [v for v in record.outputs if is_float(v)]
        if all(self.grads.get(v) is None for v in float_outputs):
            return  # no gradient reaches the module
        arg_types = list(record.backward.function_type.inputs.data)
        d_outputs = []
        for value, wanted in zip(float_outputs, arg_types):
            grad = self.grads.get(value)
            grad = self.zeros(value) if grad is None else grad
            d_outputs.append(self.cast(grad, wanted))
        call = CallOp(record.backward.sym_name.data, [*d_outputs, *record.saved, *record.params],
                      record.backward.function_type.outputs.data)
        self.block.add_op(call)
        base = record.backward.sym_name.data.removesuffix("_backward")
        for result, name in zip(call.res, record.backward.attributes["grads"].data):
            result.name_hint = f"{base}_{name.data}"
        for index, grad in zip(record.grad_args, call.res, strict=True):
            operand = record.operands[index]
            self.accumulate_operand(operand, self.cast(grad, operand.type), frozen)

    def stack_backward(self, record: LoopedStack, frozen: set[str]) -> None:
        """``stack @<body>_bwd reverse``: the gradients of the forward stack's carried inputs and
        of its differentiable per-layer operands, added in."""
        forward = record.forward
        if all(self.grads.get(r) is None for r in forward.carried_results):
            return  # no gradient reaches the stack
        d_carried = [self.grads.get(r) or self.zeros(r) for r in forward.carried_results]
        collected = list(record.backward.function_type.outputs.data[len(d_carried):])
        stack = StackOp(record.backward.sym_name.data, forward.count, d_carried,
                        [*forward.per_layer, *forward.collected], list(forward.shared),
                        [StackOp.stacked_type(forward.count, t) for t in collected], reverse=True)
        self.block.add_op(stack)
        for carried, grad in zip(forward.carried, stack.carried_results):
            grad.name_hint = f"d_{carried.name_hint}" if carried.name_hint else None
            self.accumulate_operand(carried, grad, frozen)
        for index, grad in zip(record.differentiable, stack.collected, strict=True):
            operand = forward.per_layer[index]
            grad.name_hint = f"d_{operand.name_hint}" if operand.name_hint else None
            self.accumulate_operand(operand, grad, frozen)

    def cast(self, value: SSAValue, wanted) -> SSAValue:
        """``value`` in the dtype of type ``wanted`` (a cast where they differ)."""
        if not isinstance(wanted, TensorType) or value.type.dtype == wanted.dtype:
            return value
        return self.builder.one("cast", value, dtype=wanted.dtype)

    def frozen_params(self) -> set[str]:
        """``@frozen`` parameters, and those declared ``@gradient(skip)``: no gradient reaches them."""
        return {p.sym_name.data for p in self.model.body.block.ops if isinstance(p, ParamOp)
                and any(getattr(a, "DSL_NAME", None) == "frozen" for a in annotations_of(p))
                or isinstance(p, ParamOp) and skips_gradient(p)}

    def parameter_gradients(self) -> list[tuple[str, SSAValue]]:
        """(parameter, gradient) in declaration order, for every parameter the function reads."""
        refs: dict[str, list[SSAValue]] = {}
        for op in self.block.ops:
            if isinstance(op, ParamRefOp):
                refs.setdefault(op.param.root_reference.data, []).append(op.result)
        frozen = self.frozen_params()
        found = []
        for param in (p for p in self.model.body.block.ops if isinstance(p, ParamOp)):
            name = param.sym_name.data
            if name not in refs or name in frozen:
                continue
            attr = find_annotation(param, GradientAttr) if name not in self.per_layer else None
            grads = [self.grads[r] for r in refs[name] if r in self.grads]
            total = grads[0] if grads else self.zeros(refs[name][0])
            for extra in grads[1:]:
                total = self.builder.one("add", total, extra)
            if attr is not None and attr["mode"] not in ("skip", "accumulate") and grads:  # accumulate: per use
                total = self.transformed(total, attr)
            found.append((name, total))
        return found

    def zeros(self, like: SSAValue) -> SSAValue:
        return self.builder.one("zeros", shape=list(like.type.shape), dtype=like.type.dtype)

    def saved(self, backward_start: int, inputs: list[SSAValue]) -> list[str]:
        names: list[str] = []
        for i, value in enumerate(self.saved_values(backward_start, inputs)):
            name = value.name_hint or f"v{i}"
            if name not in names:
                names.append(name)
        return names

    def saved_values(self, backward_start: int, inputs: list[SSAValue]) -> list[SSAValue]:
        """Names of the forward values (and inputs) the backward ops read (not the output
        gradients, nor the outputs the function only returns)."""
        forward = set(inputs) | {r for op in list(self.block.ops)[:backward_start] for r in op.results}
        found: list[SSAValue] = []
        for op in list(self.block.ops)[backward_start:]:
            if isinstance(op, ReturnOp):
                continue
            for operand in op.operands:
                if operand in forward and not isinstance(operand.owner, ParamRefOp) and operand not in found:
                    found.append(operand)
        return found


class BlockGradient:
    """The gradient of a block body split into ``@<body>_fwd`` and ``@<body>_bwd`` (see the module)."""

    def __init__(self, outer: GradientBuilder, body: FuncOp, carried: int, shared: int, fixed: list[int],
                 slice_gradients: dict[int, GradientAttr] | None = None):
        self.outer, self.body = outer, body
        self.carried, self.shared, self.fixed = carried, shared, fixed
        self.slice_gradients = slice_gradients or {}  # a per-layer operand's @gradient, applied per layer

    def split(self) -> tuple[FuncOp, FuncOp, list[int]]:
        self.check_loopable()
        inner = GradientBuilder(self.outer.model, self.outer.funcs, loop=False)
        first_slice = self.carried + self.shared
        grad, backward_start, args = inner.derive(self.body, [first_slice + i for i in self.fixed],
                                                  {first_slice + i: a for i, a in self.slice_gradients.items()})
        ops = list(grad.body.block.ops)
        ret = ops[-1]
        carried_args, shared_args, slice_args = args[:self.carried], args[self.carried:first_slice], args[first_slice:]
        if any(a in inner.grads for a in shared_args):
            raise NotLoopable("a gradient reaches a shared value")
        saved = [v for v in inner.saved_values(backward_start, args) if v not in shared_args and v not in slice_args]
        outputs = list(ret.operands[:self.carried])
        forward = self.forward_function(args, ops[:backward_start], outputs, saved)
        differentiable = [i for i, a in enumerate(slice_args) if i not in self.fixed and is_float(a)]
        seeds = list(grad.body.block.args[len(args):])
        gradients = [(inner.grads.get(a), seed) for a, seed in zip(carried_args, seeds)] + \
            [(inner.grads.get(slice_args[i]), slice_args[i]) for i in differentiable]
        backward = self.backward_function(seeds, shared_args, slice_args, saved, ops[backward_start:-1],
                                          gradients, forward)
        ret.detach()
        ret.erase()
        for func in (forward, backward):
            self.outer.model.body.block.add_op(func)
            self.outer.funcs[func.sym_name.data] = func
        return forward, backward, differentiable

    def check_loopable(self) -> None:
        outputs = self.body.function_type.outputs.data
        if not all(isinstance(t, TensorType) and t.dtype.is_float for t in outputs):
            raise NotLoopable("a carried value is not a float tensor")
        for op in self.body.walk():
            if isinstance(op, (ParamRefOp, StackOp)):
                raise NotLoopable(f"the block body holds {op.name}")
            if isinstance(op, CallOp):
                callee = self.outer.funcs.get(op.callee.root_reference.data)
                if callee is None or any(isinstance(o, (ParamRefOp, StackOp)) for o in callee.walk()):
                    raise NotLoopable("the block body calls a function with parameters or stacks")

    def unique_name(self, suffix: str) -> str:
        name = f"{self.body.sym_name.data}_{suffix}"
        taken, n = set(self.outer.funcs), 1
        while name in taken:
            name, n = f"{self.body.sym_name.data}_{suffix}_{n}", n + 1
        return name

    def forward_function(self, args: list[SSAValue], ops: list[Operation], outputs: list[SSAValue],
                         saved: list[SSAValue]) -> FuncOp:
        """``@<body>_fwd(carried..., shared..., slices...) -> (carried..., saved...)``."""
        func = FuncOp(self.unique_name("fwd"), [a.type for a in args],
                      [*(v.type for v in outputs), *(v.type for v in saved)], kind="block")
        mapping = dict(zip(args, func.body.block.args))
        for old, new in mapping.items():
            new.name_hint = old.name_hint
        move_ops(ops, func.body.block, mapping)
        func.body.block.add_op(ReturnOp(*(mapping.get(v, v) for v in [*outputs, *saved])))
        func.attributes["saved"] = ArrayAttr([StringAttr(v.name_hint or f"v{i}") for i, v in enumerate(saved)])
        for name in ("input_memory", "input_memory_at"):  # the block's own save:/recompute: of its inputs
            if name in self.body.attributes:
                func.attributes[name] = self.body.attributes[name]
        return func

    def backward_function(self, seeds: list[SSAValue], shared: list[SSAValue], slices: list[SSAValue],
                          saved: list[SSAValue], ops: list[Operation],
                          gradients: list[tuple[SSAValue | None, SSAValue]], forward: FuncOp) -> FuncOp:
        """``@<body>_bwd(d_carried..., shared..., slices..., saved...) -> (d_carried_in..., d_slices...)``:
        ``gradients`` pairs each result (None: no gradient reaches it) with the value it is shaped like."""
        inputs = [*seeds, *shared, *slices, *saved]
        func = FuncOp(self.unique_name("bwd"), [v.type for v in inputs], [], kind="block_backward")
        block = func.body.block
        mapping = dict(zip(inputs, block.args))
        for old, new in mapping.items():
            new.name_hint = f"saved_{old.name_hint}" if old in saved and old.name_hint else old.name_hint
        move_ops(ops, block, mapping)
        builder = GraphBuilder(block)
        returned = []
        for grad, like in gradients:
            grad = mapping.get(grad, grad) if grad is not None else \
                builder.one("zeros", shape=list(like.type.shape), dtype=like.type.dtype)
            returned.append(grad)
        for value, like in zip(returned[:len(seeds)], seeds):
            if value.type != like.type:
                raise NotLoopable("a carried gradient changes type")
        block.add_op(ReturnOp(*returned))
        func.function_type = type(func.function_type).from_lists([a.type for a in block.args],
                                                                  [v.type for v in returned])
        func.attributes["forward"] = SymbolRefAttr(forward.sym_name.data)
        return func


def move_ops(ops: list[Operation], block: Block, mapping: dict[SSAValue, SSAValue]) -> None:
    """Move ``ops`` to the end of ``block``, reading ``mapping[v]`` for each operand ``v`` it maps."""
    for op in ops:
        op.detach()
        for i, operand in enumerate(op.operands):
            if operand in mapping:
                op.operands[i] = mapping[operand]
        block.add_op(op)


def result_gradient(op: Operation, index: int) -> GradientAttr | None:
    """The ``@gradient`` of result ``index`` of ``op``: its own (``result_annotations``, from a flow's
    ``-> (a, b @gradient(skip))``), else the op's."""
    per_result = op.attributes.get("result_annotations")
    if isinstance(per_result, ArrayAttr) and index < len(per_result.data):
        own = per_result.data[index]
        found = next((a for a in own.data if isinstance(a, GradientAttr)), None) if isinstance(own, ArrayAttr) else None
        if found is not None:
            return found
    return find_annotation(op, GradientAttr)


def input_gradients(func: FuncOp) -> dict[int, GradientAttr]:
    """The ``@gradient`` of each input of a function (its ``input_gradients`` attribute, by input name)."""
    recorded = func.attributes.get("input_gradients")
    if recorded is None:
        return {}
    names = [a.name_hint for a in func.body.block.args]
    return {names.index(name): attr for name, attr in recorded.data.items()
            if name in names and isinstance(attr, GradientAttr)}


def skips_gradient(param: ParamOp) -> bool:
    """A parameter declared ``@gradient(skip)``: a constant of the backward, as ``@frozen``."""
    attr = find_annotation(param, GradientAttr)
    return attr is not None and attr["mode"] == "skip"


def erase_dead_ops(ops: list[Operation]) -> None:
    """Erase those of ``ops`` whose results nothing reads (the gradient ops a ``@gradient(skip)``
    left unused), last first, so what only they read goes too."""
    for op in reversed(ops):
        if not isinstance(op, ReturnOp) and op.results and not any(r.uses for r in op.results):
            op.detach()
            op.erase()
