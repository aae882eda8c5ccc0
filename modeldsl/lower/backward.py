"""Lowering a written ``backward:`` section to a backward function.

The contract is spec 5.10-5.12. For the top declaration the function is the
model's ``@backward``: it takes the gradients of the forward's outputs
(``d_out``), then the forward tensors the backward reads as ``saved.<name>``
(each listed in the forward's ``save:``), and returns the required
gradients: ``d_<input>`` for every float input not marked
``@gradient(skip)``, then ``d_<param>`` for every parameter not ``@frozen``
(a nested parameter ``ln1.weight`` is ``d_ln1_weight``; a tied parameter may
be written under either name and its contributions add up). The function's
``saved`` and ``grads`` attributes name its saved arguments and its results.

A sub-module instance whose module has a written backward (spec 5.12.6: an
explicit backward disables auto-derivation) gets the same function for its
part of a model, ``@<path>_backward`` (see :mod:`modeldsl.lower`), with two
differences: its parameters are arguments too (after the saved tensors, in
the order of the forward helper's parameter arguments, so that it works on
the per-layer slices of a stacked block), and ``grad_args`` gives, for each
result, the index of the forward helper's argument (inputs, then
parameters) it is the gradient of. Gradient names are relative to the
instance (``d_up_weight``, not ``d_blocks_mlp_up_weight``), and the
gradients of the outputs take the shapes the instance is called with.

A flow ending in ``accumulate=true`` into a gradient already computed adds
to it (an explicit ``add``; the schedule folds it into the GEMM's beta).
``recompute:`` blocks rebuild forward tensors from saved ones and parameters;
their ops carry a ``recompute`` attribute.

Validation: E005 missing gradient, E006 ``saved.`` names not saved (or
forward tensors read without ``saved.``), E018 gradient shapes, E019 cycles,
E020 gradient dtypes, E021 recompute from non-saved tensors, E022 recompute
cycles, W004 saved but never read.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field

from xdsl.dialects.builtin import ArrayAttr, DenseArrayBase, StringAttr, UnitAttr, i64
from xdsl.ir import SSAValue
from xdsl.utils.exceptions import VerifyException

from modeldsl.diagnostics import Span
from modeldsl.dialects.graph import FuncOp, ParamRefOp, ReturnOp
from modeldsl.dialects.graph_primitives import AddOp, check_same_shape
from modeldsl.dialects.graph_types import TensorType
from modeldsl.frontend.text import ast
from modeldsl.instances import LoweringFailed, ParamSlot, StackedInstance, param_slots, source_text, typed_entries
from modeldsl.ir import located, located_argument
from modeldsl.resolve.order import defined_names, used_names
from modeldsl.resolve.scope import Scope

IMPLICIT_FLOATS = {"bf16", "fp16", "fp32"}


class BackwardFailed(Exception):
    """The backward section cannot be lowered; its diagnostics were reported."""


@dataclass
class ForwardInput:
    name: str
    type: TensorType
    span: Span
    skip_gradient: bool = False


@dataclass
class ForwardResult:
    """What the backward needs to know of the lowered forward graph."""

    inputs: list[ForwardInput]
    outputs: list[tuple[str, TensorType, Span]]
    scope: Scope

    def tensors(self) -> dict[str, TensorType]:
        """Every forward tensor by name, in definition order."""
        return {name: b.value.type for name, b in self.scope.names.items()
                if b.kind != "poisoned" and isinstance(b.value, SSAValue)}


@dataclass
class Gradient:
    """A gradient the backward must return: ``d_<name>`` of a forward input or parameter."""

    name: str
    type: TensorType
    what: str
    aliases: tuple[str, ...] = ()
    declared: tuple[TensorType, Span] | None = None
    arg: int = -1  # the forward argument (inputs, then parameters) it is the gradient of


@dataclass
class BackwardState:
    """Name resolution inside a backward graph."""

    saved: dict[str, SSAValue]
    forward_names: set[str]
    recomputed: set[str] = field(default_factory=set)
    in_recompute: bool = False
    # the type of each required gradient (and alias): a flow ending in gradients whose primitive's
    # shape rule cannot tell its result types (add_backward, reduce_max_backward) takes these
    gradient_types: dict[str, TensorType] = field(default_factory=dict)


class BackwardLowering:
    """The backward half of :class:`modeldsl.lower.Lowering` (a mixin: it uses its
    sink, block, run_statements, check_declared and parameter bookkeeping)."""

    backward: BackwardState | None = None
    cycle_code: str = "E007"
    result_types_hint: list[TensorType] | None = None  # see Lowering.gradient_targets

    def lower_backward(self, instance, forward: ForwardResult) -> None:
        """The top declaration's written backward as the model's ``@backward``."""
        self.lower_backward_func(instance, forward)

    def lower_backward_func(self, instance, forward: ForwardResult, name: str = "backward",
                            params: list[ParamSlot] | None = None) -> tuple[FuncOp, list[str]] | None:
        """Lower the instance's ``backward:`` section to a function; with ``params`` (a sub-module
        instance) they are its last arguments and the function is returned for the caller
        to add. (function, saved tensor names), or None when there is no backward or it
        failed (reported)."""
        nested = params is not None
        sections = instance.decl.sections("backward")
        if not sections:
            return None
        if len(sections) > 1:
            self.sink.error("E001", f"{instance.decl.name} has more than one backward: section", sections[1].span)
            return None
        section = sections[0]
        graph = next((s for s in section.body if isinstance(s, ast.Section) and s.name == "graph"), None)
        if graph is None:
            if any(map(ast.is_placeholder, section.body)):
                return None  # reported with the other placeholders
            self.sink.error("E001", f"the backward of {instance.decl.name} has no graph: section", section.span)
            return None
        try:
            grad_inputs, required = self.gradient_contract(instance, section, forward, nested)
        except BackwardFailed:
            return None
        saved_names = self.check_saved(instance.decl, graph, forward)
        tensors = forward.tensors()
        arg_types = [t for _, t, _ in grad_inputs] + [tensors[n] for n in saved_names]
        arg_types += [s.type for s in params or []]
        func = located(FuncOp(name, arg_types, [], kind="backward"), section.span)
        if not nested:
            self.model.body.block.add_op(func)
        self.block, self.param_refs = func.body.block, {}
        scope = Scope(self.sink)
        args = list(func.body.block.args)
        output_spans = {f"d_{n}": s for n, _, s in forward.outputs}
        for (grad, _, declared), arg in zip(grad_inputs, args):
            arg.name_hint = grad
            located_argument(arg, output_spans.get(grad, section.span))
            self.define_input(scope, grad, arg, declared, section.span)
        saved_args = args[len(grad_inputs):len(grad_inputs) + len(saved_names)]
        for saved, arg in zip(saved_names, saved_args):
            arg.name_hint = f"saved_{saved}"
            located_argument(arg, forward.scope.names[saved].span if saved in forward.scope.names else None)
        for slot, arg in zip(params or [], args[len(grad_inputs) + len(saved_names):]):
            slot.value = arg  # the caller restores the slots
            arg.name_hint = _relative(slot, instance)
            located_argument(arg, slot.span)
        self.backward = BackwardState(dict(zip(saved_names, saved_args)), set(tensors),
                                      gradient_types={n: g.type for g in required for n in (g.name, *g.aliases)})
        self.cycle_code = "E019"
        try:
            self.run_statements(instance, graph.body, scope)
            results = self.collect_gradients(required, scope, section.span)
        except BackwardFailed:
            return None
        finally:
            self.backward, self.cycle_code = None, "E007"
        self.block.add_op(ReturnOp(*results))
        func.function_type = type(func.function_type).from_lists(arg_types, [r.type for r in results])
        func.attributes["saved"] = ArrayAttr([StringAttr(n) for n in saved_names])
        func.attributes["grads"] = ArrayAttr([StringAttr(g.name) for g in required])
        if nested:
            func.attributes["grad_args"] = DenseArrayBase.from_list(i64, [g.arg for g in required])
        return func, saved_names

    # ------------------------------------------------------------------ the contract
    def gradient_contract(self, instance, section: ast.Section, forward: ForwardResult, nested: bool = False
                          ) -> tuple[list[tuple[str, TensorType, TensorType | None]], list[Gradient]]:
        """(gradient inputs (name, type, declared type), required gradient outputs), with the section's
        declarations checked.
        ``nested``: a sub-module instance's backward, whose output gradients have the shapes of
        its call (a declared ``d_out: [*, d]`` gives only the dtype) and whose parameters
        bound to the caller's tensors need gradients too."""
        outputs = {f"d_{n}": (n, t) for n, t, _ in forward.outputs if t.dtype.is_float}
        required = [Gradient(f"d_{i.name}", i.type, f"input '{i.name}'", arg=index)
                    for index, i in enumerate(forward.inputs) if i.type.dtype.is_float and not i.skip_gradient]
        required += self.parameter_gradients(instance, nested, len(forward.inputs))
        by_name = {g.name: g for g in required}
        for alias in (a for g in required for a in g.aliases):
            by_name[alias] = next(g for g in required if alias in g.aliases)
        declared_inputs: dict[str, TensorType] = {}
        failed = False
        for name, ptype, span in self.backward_declarations(section, instance.env):
            if name in outputs:
                target, kind = outputs[name][1], "output"
            elif name in by_name:
                target, kind = by_name[name].type, "gradient"
            elif _absent_parameter(instance, name):
                continue  # d_bias of a bias this configuration leaves out: written with or without '?'
            else:
                known = ", ".join([*outputs, *by_name]) or "none"
                self.sink.error("E002", f"'{name}' is not the gradient of a forward output, input or parameter",
                                span, f"the backward's gradients are: {known}")
                failed = True
                continue
            if not self.gradient_type_fits(name, target, ptype, span):
                failed = True
            elif kind == "output":
                declared_inputs[name] = ptype
            else:
                by_name[name].declared = (ptype, span)
        if failed:
            raise BackwardFailed()
        if nested:
            grad_inputs = [(g, t.with_dtype(declared_inputs[g].dtype) if g in declared_inputs else t,
                            declared_inputs.get(g)) for g, (_, t) in outputs.items()]
        else:
            grad_inputs = [(g, declared_inputs.get(g, t), declared_inputs.get(g)) for g, (_, t) in outputs.items()]
        return grad_inputs, required

    def parameter_gradients(self, instance, nested: bool = False, first_arg: int = 0) -> list[Gradient]:
        """``d_<path>`` (relative to the instance) for every parameter that is not frozen, stacked
        ones with their layer dim. Parameters bound to a caller's tensors count only for a
        sub-module instance (``nested``), whose parameters are arguments from ``first_arg`` on."""
        gradients: list[Gradient] = []
        aliases: dict[int, list[str]] = {}
        for key, value in instance.params.items():
            if isinstance(value, ParamSlot):
                aliases.setdefault(id(value), []).append(f"d_{key}")
        slots: list[tuple[ParamSlot, TensorType]] = [(s, s.type) for s in param_slots(instance)]
        for value in instance.params.values():
            if isinstance(value, StackedInstance):
                slots += [(s, TensorType([value.count, *s.type.shape], s.type.dtype))
                          for s in param_slots(value.body)]
        for index, (slot, ptype) in enumerate(slots):
            if slot.frozen or (slot.value is not None and not nested):
                continue
            name = "d_" + _relative(slot, instance)
            others = tuple(a for a in aliases.get(id(slot), []) if a != name)
            gradients.append(Gradient(name, ptype, f"parameter '{slot.path}'", others, arg=first_arg + index))
        return gradients

    def backward_declarations(self, section: ast.Section, env) -> list[tuple[str, TensorType, Span]]:
        """``d_x: [shape]`` entries, bare or under ``in:``/``inputs:``/``out:``/``outputs:``."""
        declared = []
        for entry in section.body:
            if isinstance(entry, ast.ExprStmt) and isinstance(entry.expr, ast.Str):
                continue
            if not isinstance(entry, ast.Section) or entry.name is None:
                self.sink.error("E001", "a backward section holds gradient declarations and a graph:", entry.span)
                continue
            if entry.name == "graph":
                continue
            if entry.name in ("in", "inputs", "out", "outputs"):
                entries = [(e.name, e.type, e.span) for e in typed_entries(entry)]
            elif entry.value is not None:
                entries = [(entry.name, entry.value.expr, entry.span)]
            else:
                self.sink.error("E001", f"'{entry.name}' needs a type: {entry.name}: [shape]", entry.span)
                continue
            for name, expr, span in entries:
                try:
                    declared.append((name, self.tensor_type(expr, env), span))
                except LoweringFailed:
                    continue
        return declared

    def gradient_type_fits(self, name: str, target: TensorType, declared: TensorType, span: Span) -> bool:
        """A gradient has its tensor's shape (E018) and a float dtype the tensor's converts to (E020)."""
        try:
            check_same_shape(f"gradient '{name}'", target, declared)
        except VerifyException as err:
            self.sink.error("E018", f"{err}: the tensor is {target}, its gradient {declared}", span,
                            "a gradient has the shape of the tensor it is the gradient of")
            return False
        if declared.dtype != target.dtype and not {declared.dtype.value, target.dtype.value} <= IMPLICIT_FLOATS:
            self.sink.error("E020", f"gradient '{name}' is {declared.dtype.value} but its tensor is "
                            f"{target.dtype.value}", span,
                            "gradients are bf16, fp16 or fp32 like their tensors; cast explicitly otherwise")
            return False
        return True

    # ------------------------------------------------------------------ saved tensors
    def check_saved(self, decl: ast.Decl, graph: ast.Section, forward: ForwardResult) -> list[str]:
        """The saved tensors the backward reads, in forward order. E006 for ``saved.x``
        with x not saved, E002 for save entries naming nothing, W004 for unread ones."""
        tensors = forward.tensors()
        entries = _save_entries(decl)
        patterns = [text for text, _ in entries]
        read: set[str] = set()
        for node in _saved_references(graph):
            name = node.attr
            if not any(fnmatch.fnmatchcase(name, p) for p in patterns):
                self.sink.error("E006", f"saved.{name}: '{name}' is not in the forward's save: list", node.span,
                                f"add it: save: [{', '.join([*patterns, name])}]")
            elif name not in tensors:
                self.sink.error("E006", f"saved.{name}: the forward defines no tensor '{name}'", node.span)
            else:
                read.add(name)
        for text, span in entries:
            matched = [n for n in tensors if fnmatch.fnmatchcase(n, text)]
            if not matched:
                self.sink.error("E002", f"save: names '{text}', which the forward does not define", span,
                                "save lists name tensors of this module's forward graph")
            elif not any(n in read for n in matched):
                self.sink.warning("W004", f"saved tensor '{text}' is never read by the backward", span,
                                  "drop it from save: to free its memory, or read it as saved." + matched[0])
        return [n for n in tensors if n in read]

    def saved_tensor(self, node: ast.Attribute) -> SSAValue | None:
        """The value of ``saved.x`` in a backward graph (None when reported already)."""
        if self.backward is None:
            self.sink.error("E006", f"saved.{node.attr} is only readable in a backward graph", node.span,
                            "in the forward graph, name the tensor directly")
            return None
        return self.backward.saved.get(node.attr)

    def forward_tensor_misused(self, name: str, span: Span) -> bool:
        """A forward tensor read in the backward without ``saved.`` is E006."""
        if self.backward is None or name not in self.backward.forward_names:
            return False
        self.sink.error("E006", f"the forward tensor '{name}' is not available in the backward", span,
                        f"read it as saved.{name} and list it in the forward's save:")
        return True

    # ------------------------------------------------------------------ recompute and accumulation
    def run_recompute(self, instance, block: ast.Section, scope: Scope) -> None:
        if self.backward is None:
            self.sink.error("E001", "recompute: blocks belong in a backward graph", block.span,
                            "in the forward, list tensors in recompute: [...] or annotate them @memory(recompute)")
            return
        first = len(self.block.ops)
        outer_code, self.cycle_code = self.cycle_code, "E022"
        self.backward.in_recompute = True
        try:
            self.run_statements(instance, block.body, scope)
        finally:
            self.backward.in_recompute, self.cycle_code = False, outer_code
        for op in list(self.block.ops)[first:]:
            if not isinstance(op, ParamRefOp):  # shared by every use in the function
                op.attributes["recompute"] = UnitAttr()

    def check_recompute_inputs(self, flow: ast.Flow, scope: Scope) -> bool:
        """Inside ``recompute:``, only saved tensors, parameters and recomputed names may be read (E021)."""
        state = self.backward
        if state is None or not state.in_recompute:
            return True
        ok = True
        for name in sorted(used_names(flow)):
            binding = scope.find(name)
            if binding is not None and binding.kind != "poisoned" and name not in state.recomputed:
                self.sink.error("E021", f"recompute reads '{name}', which is not derivable from saved tensors",
                                flow.span, "a recompute block computes from saved.<name> tensors and parameters")
                ok = False
        state.recomputed |= defined_names(flow)
        return ok

    def accumulate_into(self, target: str, previous: SSAValue, value: SSAValue, span: Span) -> SSAValue:
        """``... accumulate=true -> d_w`` when ``d_w`` exists: ``d_w + contribution``."""
        add = AddOp.make([previous, value], [previous.type])
        try:
            add.verify_()
        except VerifyException as err:
            code = "E018" if previous.type.shape != value.type.shape else "E020"
            self.sink.error(code, f"cannot accumulate into '{target}': {err}", span)
            return previous
        add.results[0].name_hint = target
        self.block.add_op(add)
        return add.results[0]

    def collect_gradients(self, required: list[Gradient], scope: Scope, span: Span) -> list[SSAValue]:
        results = []
        missing = []
        for gradient in required:
            values, defined_at = [], None
            for name in (gradient.name, *gradient.aliases):
                binding = scope.find(name)
                if binding is not None and binding.kind == "poisoned":
                    values.append(None)
                elif binding is not None:
                    values.append(binding.value)
                    defined_at = defined_at or binding.span
            if not values:
                missing.append(gradient)
                continue
            if any(v is None for v in values):
                continue  # its computation failed and was reported
            value = values[0]
            for extra in values[1:]:
                value = self.accumulate_into(gradient.name, value, extra, span)
            declared, where = gradient.declared or (gradient.type, defined_at or span)
            if self.gradient_type_fits(gradient.name, gradient.type, value.type, where):
                results.append(self.check_declared(gradient.name, declared, value, where))
        for gradient in missing:
            self.sink.error("E005", f"missing required gradient '{gradient.name}' of {gradient.what}", span,
                            "compute it in the backward graph, or mark the parameter @frozen / the input "
                            "@gradient(skip)")
        if len(results) != len(required):
            raise BackwardFailed()
        return results


def _relative(slot: ParamSlot, instance) -> str:
    """A parameter's path inside the instance, as a name: ``ln1.weight`` is ``ln1_weight``."""
    return slot.path.removeprefix(instance.prefix).replace(".", "_")


def flow_accumulates(flow: ast.Flow) -> bool:
    """The flow's last operation is called with ``accumulate=true``."""
    last = flow.chain[-2] if len(flow.chain) >= 3 else None
    last = last.value if isinstance(last, ast.Annotated) else last
    if not isinstance(last, ast.Call):
        return False
    return any(a.name == "accumulate" and isinstance(a.value, ast.Bool) and a.value.value for a in last.args)


def _saved_references(node: ast.Node) -> list[ast.Attribute]:
    found = []
    if isinstance(node, ast.Attribute) and isinstance(node.base, ast.Name) and node.base.id == "saved":
        return [node]
    for value in vars(node).values():
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, ast.Node):
                found += _saved_references(item)
    return found


def _save_entries(decl: ast.Decl) -> list[tuple[str, Span]]:
    """(name or pattern, span) of each item of the forward's ``save:`` lists."""
    entries = []
    for forward in decl.sections("forward"):
        for entry in forward.body:
            if isinstance(entry, ast.Section) and entry.name == "save" and entry.value is not None:
                expr = entry.value.expr
                for item in expr.items if isinstance(expr, ast.ListExpr) else []:
                    entries.append((_text(item), item.span))
    return entries


def _text(node: ast.Expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    return source_text(node).replace(" ", "")


def _absent_parameter(instance, gradient: str) -> bool:
    """Whether ``gradient`` is ``d_<name>`` of a parameter the declaration has but this
    configuration leaves out (``bias: [d] if use_bias`` with use_bias false)."""
    name = gradient.removeprefix("d_")
    declared = any(isinstance(entry, ast.Section) and entry.name == name
                   for section in instance.decl.sections("params") for entry in section.body)
    return gradient.startswith("d_") and declared and name not in instance.params and name not in instance.failed
