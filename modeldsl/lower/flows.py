"""The statements of a graph: data flows ``a -> op() -> b`` in dependency order, ``if``/``else``,
``recompute:`` blocks; the tensors a flow reads and the names it binds. A failed statement
poisons the names it would define, so their uses stay quiet.
"""

from __future__ import annotations

from collections.abc import Sequence

from xdsl.dialects.builtin import (
    ArrayAttr,
    BoolAttr,
)
from xdsl.ir import Attribute, Operation, SSAValue

from modeldsl.diagnostics import Span
from modeldsl.dialects.annotations import GradientAttr
from modeldsl.dialects.graph import CallOp, ParamRefOp
from modeldsl.dialects.graph_types import TensorType
from modeldsl.frontend.text import ast
from modeldsl.graph_builder import GraphBuilder
from modeldsl.instances import (
    Instance,
    LoweringFailed,
    ParamSlot,
)
from modeldsl.ir import locate_new_ops
from modeldsl.lower.backward import flow_accumulates
from modeldsl.primitives import lookup_primitive
from modeldsl.resolve.order import defined_names, topological_order
from modeldsl.resolve.scope import Scope


class FlowsMixin:
    """Flows: running a graph's statements and binding their results."""

    def run_statements(self, instance: Instance, statements: Sequence[ast.Stmt], scope: Scope) -> None:
        """Run a graph body in dependency order (spec 5.11.5); the names of
        statements on a cycle are poisoned so that their uses stay quiet."""
        statements, cyclic = topological_order(statements, self.sink, self.cycle_code)
        for stmt in cyclic:
            for name in sorted(defined_names(stmt)):
                if scope.find(name) is None:
                    scope.define(name, None, stmt.span, "poisoned")
        for stmt in statements:
            try:
                if isinstance(stmt, ast.Flow):
                    try:
                        before = self.block.last_op
                        self.run_flow(instance, stmt, scope)
                        locate_new_ops(self.block, before, stmt.span)
                    except LoweringFailed:
                        _poison(stmt.chain[-1], scope)
                        target, tuples = stmt.chain[-1], self.graph_outputs[-1] if self.graph_outputs else {}
                        if isinstance(target, ast.Name) and target.id in tuples:
                            for i in range(tuples[target.id]):
                                _poison(ast.Name(target.span, f"{target.id}_{i}"), scope)
                        raise
                elif isinstance(stmt, ast.If):
                    taken = self.guard(stmt.condition, self.graph_env(instance, scope))
                    untaken = [stmt.then, stmt.orelse or []] if taken is None else [stmt.orelse if taken else stmt.then]
                    for branch in untaken:
                        self.check_unlowered_annotations(instance, branch or [])
                    if taken is None:
                        for branch in (stmt.then, stmt.orelse or []):
                            for inner in branch:
                                if isinstance(inner, ast.Flow):
                                    _poison(inner.chain[-1], scope)
                        continue
                    with scope.branches(0 if taken else 1) as (then, orelse):
                        self.run_statements(instance, stmt.then if taken else (stmt.orelse or []),
                                            then if taken else orelse)
                elif isinstance(stmt, ast.Section) and stmt.name == "recompute" and stmt.value is None:
                    self.run_recompute(instance, stmt, scope)
                elif isinstance(stmt, ast.ExprStmt) and isinstance(stmt.expr, (ast.Str, ast.EllipsisLit)):
                    if isinstance(stmt.expr, ast.EllipsisLit):
                        self.sink.error("E001", "this graph is left incomplete ('...')", stmt.span,
                                        "write the graph out; the spec's '...' is a placeholder")
                else:
                    self.sink.error("E001", "a graph holds data flows (a -> op() -> b) and if/else", stmt.span)
            except LoweringFailed:
                continue

    def run_flow(self, instance: Instance, flow: ast.Flow, scope: Scope) -> None:
        """One flow: its source, each stage on the values before it, the names it binds; the flow's
        annotations and the memory hints of its names go on the ops that make the values it names
        (a stated type ``-> [B, T, d] ->`` makes no op: the value passing through is the previous stage's)."""
        if not self.check_recompute_inputs(flow, scope):
            raise LoweringFailed()
        before = self.block.last_op
        values = self.source(instance, flow.chain[0], scope)
        last_ops: list[Operation] = []
        stages = flow.chain[1:-1]
        for index, stage in enumerate(stages):
            if index:
                values = [self.read_back(v) for v in values[:_primary_outputs(last_ops, values)]]
            self.result_types_hint = self.gradient_targets(flow.chain[-1]) if index == len(stages) - 1 else None
            try:
                values, made = self.apply(instance, unannotated(stage), values, scope)
            finally:
                self.result_types_hint = None
            if made or not isinstance(unannotated(stage), ast.ListExpr):
                last_ops = made
            if isinstance(stage, ast.Annotated) and stage.annotations:  # x -> blocks() @partition(0) -> y
                attrs = self.attach_annotations(self.annotated_ops(values, stage.annotations), stage.annotations,
                                                instance)
                if self.dtype_of(attrs) is not None:
                    values = self.cast_to_annotated(self.dtype_of(attrs), [(v.name_hint or "_", v) for v in values],
                                                    stage.annotations[0].span)
        bound = self.bind(flow.chain[-1], values, scope, last_ops, flow)
        if isinstance(flow.chain[-1], ast.TupleExpr):
            self.attach_result_annotations(flow.chain[-1].items, bound, instance)
        self.apply_flow_annotations(instance, flow, flow.annotations, bound, before, scope)
        if isinstance(flow.chain[-1], ast.TupleExpr):  # -> (h @nofuse, gate): the value h names alone
            for item, pair in zip(flow.chain[-1].items, bound):
                nodes = [a for a in item.annotations if a.name != "gradient"] \
                    if isinstance(item, ast.Annotated) else []
                if nodes:
                    self.apply_flow_annotations(instance, flow, nodes, [pair], before, scope)

    def apply_flow_annotations(self, instance: Instance, flow: ast.Flow, nodes: list[ast.Annotation],
                               bound: list[tuple[str, SSAValue]], before: Operation | None, scope: Scope) -> None:
        """The annotations ``nodes`` of a flow (or of one name of its tuple) on the ops that make the
        values ``bound`` names, with what each does there (casts, aliasing, gradients, memory modes)."""
        targets = self.annotated_ops([v for _, v in bound], nodes) if nodes else []
        annotations = self.attach_annotations(targets, nodes, instance)
        self.spread_adapters(annotations, self.made_since(before))
        if self.dtype_of(annotations) is not None:  # the names now stand for the values cast to it
            span = next(a.span for a in nodes if a.name == "dtype")
            for (name, _), cast in zip(bound, self.cast_to_annotated(self.dtype_of(annotations), bound, span)):
                if name != "_":
                    scope.rebind(name, cast)
        if self.backward is not None:
            self.transform_written_gradients(annotations, bound, flow, scope)
        self.apply_aliasing(annotations, bound, set(self.made_since(before)), {a.name: a.span for a in nodes}, scope)
        self.check_flow_annotations(instance, flow, nodes, annotations, self.performed_since(before))
        if self.backward is None:
            self.record_memory_policy(instance, bound, annotations)
            self.mark_checkpoint_region(before, annotations)

    def transform_written_gradients(self, annotations: Sequence[Attribute], bound: list[tuple[str, SSAValue]],
                                    flow: ast.Flow, scope: Scope) -> None:
        """A written backward's ``d_out -> Linear_backward() -> d_in @gradient(scale=0.1)`` (spec 7.8.3):
        the gradients the flow names are scaled by S, then their norm clipped at C (a ``scale`` and a
        ``clip_norm`` op; the names stand for the results). W013 where that cannot apply: ``skip``,
        ``accumulate`` or ``checkpoint`` in a written backward, or a flow that accumulates into a gradient."""
        attr = next((a for a in annotations if isinstance(a, GradientAttr)), None)
        if attr is None:
            return
        node = next(a for a in flow.annotations if a.name == "gradient")
        if attr["mode"] != "compute" or flow_accumulates(flow):
            why = "a flow that accumulates into a gradient" if attr["mode"] == "compute" else \
                f"@gradient({attr['mode']}) in a written backward"
            self.sink.warning("W013", f"`{node.span.text}` has no effect in this version: {why} computes the "
                              "gradient as written", node.span,
                              "scale or clip the gradient a flow computes: @gradient(scale=S, clip=C)")
            return
        builder = GraphBuilder(self.block)
        for name, value in bound:
            if name == "_" or not (isinstance(value.type, TensorType) and value.type.dtype.is_float):
                continue
            result = value
            if attr["scale"] != 1.0:
                result = builder.one("scale", result, factor=float(attr["scale"]))
            if attr["clip"] is not None:
                result = builder.one("clip_norm", result, max_norm=float(attr["clip"]))
            if result is not value:
                result.name_hint = name
                scope.rebind(name, result)

    def attach_result_annotations(self, items: Sequence[ast.Expr], bound: list[tuple[str, SSAValue]],
                                  instance: Instance) -> None:
        """``-> (weights, indices, aux_loss @gradient(skip))``: an annotation of one name of a tuple
        (``@gradient``, spec 7.8.3) belongs to that result alone: the op that makes it carries it in
        ``result_annotations``, one array per result."""
        for item, (_, value) in zip(items, bound):
            nodes = [a for a in item.annotations if a.name == "gradient"] if isinstance(item, ast.Annotated) else []
            if not nodes or not self.annotated_ops([value], nodes):
                continue
            attrs = [a for a in self.annotations(nodes, instance.env, instance.namespace) if isinstance(a, Attribute)]
            owner = value.owner
            current = owner.attributes.get("result_annotations")
            per_result = [list(a.data) for a in current.data] if isinstance(current, ArrayAttr) \
                else [[] for _ in owner.results]
            per_result[value.index] += attrs
            owner.attributes["result_annotations"] = ArrayAttr([ArrayAttr(a) for a in per_result])

    def annotated_ops(self, values: Sequence[SSAValue], nodes: Sequence[ast.Annotation]) -> list[Operation]:
        """The ops that make ``values``, which annotations ``nodes`` describe; E008 where a value is
        no op's result (a module input, a parameter): there is nothing to carry the annotation."""
        ops = producers(values)
        missing = next((v for v in values if not _made_by_op(v)), None)
        if missing is not None:
            what = f"'{missing.name_hint}'" if missing.name_hint else "this value"
            span = Span(nodes[0].span.source, nodes[0].span.line, nodes[0].span.column,
                        nodes[-1].span.end_line, nodes[-1].span.end_column)
            self.sink.error("E008", f"{what} is an input or a parameter, which no op of this graph computes, "
                            "so the annotation has nothing to go on", span,
                            "annotate the flow that computes the value, or the parameter's declaration")
            return []
        return ops

    def gradient_targets(self, destination: ast.Expr) -> list[TensorType] | None:
        """In a backward graph, the types of the required gradients a flow ends in (all of its
        targets must be ones), for a primitive whose shape rule cannot tell them."""
        if self.backward is None:
            return None
        names = destination.items if isinstance(destination, ast.TupleExpr) else [destination]
        names = [unannotated(n) for n in names]
        types = [self.backward.gradient_types.get(n.id) if isinstance(n, ast.Name) else None for n in names]
        return None if None in types else types

    def made_since(self, before: Operation | None) -> list[Operation]:
        """The ops added to the block after ``before``."""
        op, made = before.next_op if before is not None else self.block.first_op, []
        while op is not None:
            made.append(op)
            op = op.next_op
        return made

    def performed_since(self, before: Operation | None) -> list[str]:
        """The primitives a flow added after ``before``, with those of the helpers it calls."""
        op = before.next_op if before is not None else self.block.first_op
        names: list[str] = []
        while op is not None:
            if isinstance(op, CallOp):
                callee = next((f for f in self.helpers if f.sym_name.data == op.callee.string_value()), None)
                names += [o.name.removeprefix("mdsl.graph.") for o in callee.walk()] if callee is not None else []
            else:
                names.append(op.name.removeprefix("mdsl.graph."))
            op = op.next_op
        return [n for n in names if lookup_primitive(n) is not None]

    def source(self, instance: Instance, node: ast.Expr, scope: Scope) -> list[SSAValue]:
        node = self.chosen(node, self.graph_env(instance, scope))
        if isinstance(node, ast.Index):
            return [self.indexed(instance, node, scope)]
        if isinstance(node, ast.TupleExpr):
            return [v for item in node.items for v in self.source(instance, item, scope)]
        if isinstance(node, ast.Call):
            values, _ = self.apply(instance, node, [], scope)
            return values
        return [self.tensor(instance, node, scope)]

    def tensor(self, instance: Instance, node: ast.Expr, scope: Scope) -> SSAValue:
        """A tensor named in a graph: a graph value or a (nested) parameter."""
        node = self.chosen(node, self.graph_env(instance, scope))
        if names_failed_param(node, instance, scope):
            raise LoweringFailed()  # its declaration was refused and reported
        if isinstance(node, ast.Name):
            found = scope.find(node.id)
            if found is not None and found.kind == "poisoned":
                raise LoweringFailed()  # its definition failed and was reported
            if found is not None and found.kind == "none":
                self.sink.error("E003", f"'{node.id}' is an optional input that this call leaves out (None)",
                                node.span, "pass it, or use it only under a guard that is false when it is left out")
                raise LoweringFailed()
            if found is not None:
                return self.read_back(found.value)
            param = instance.params.get(node.id)
            if isinstance(param, ParamSlot):
                return self.read_param(param)
            if not self.forward_tensor_misused(node.id, node.span):
                scope.lookup(node.id, node.span)
            raise LoweringFailed()
        if isinstance(node, ast.Attribute) and is_saved(node):
            value = self.saved_tensor(node)
            if value is None:
                raise LoweringFailed()
            return value
        if isinstance(node, ast.Attribute) and isinstance(node.base, ast.Name):
            child = instance.params.get(node.base.id)
            if isinstance(child, Instance) and isinstance(child.params.get(node.attr), ParamSlot):
                return self.read_param(child.params[node.attr])
        self.sink.error("E002", "expected a tensor name here", node.span)
        raise LoweringFailed()

    def read_param(self, param: ParamSlot) -> SSAValue:
        if param.value is not None:
            return param.value
        if param.path not in self.param_refs:
            ref = ParamRefOp(param.path, param.type)
            ref.result.name_hint = param.path.replace(".", "_")
            self.block.add_op(ref)
            self.param_refs[param.path] = ref.result
        return self.param_refs[param.path]

    def bind(self, node: ast.Expr, values: list[SSAValue], scope: Scope, ops: list[Operation],
             flow: ast.Flow) -> list[tuple[str, SSAValue]]:
        """Name the values of a flow; the (name, value) pairs it bound (``_`` for a discard)."""
        names = node.items if isinstance(node, ast.TupleExpr) else [node]
        tuples = self.graph_outputs[-1] if self.graph_outputs else {}
        if isinstance(node, ast.Name) and tuples.get(node.id) == len(values) > 1:
            names = [ast.Name(node.span, f"{node.id}_{i}") for i in range(len(values))]  # `-> out` of a tuple
        names = _absent_discards(names, values, ops)
        if not _primary_outputs(ops, values) <= len(names) <= len(values):
            self.sink.error("E003", f"the flow produces {len(values)} value(s) but names {len(names)}", node.span,
                            _naming_hint(ops, values))
            raise LoweringFailed()
        accumulating = self.backward is not None and flow_accumulates(flow)
        if accumulating and ops:
            ops[-1].attributes["accumulate"] = BoolAttr.from_bool(False)  # the graph adds explicitly
        bound = []
        for target, value in zip(names, values):
            if isinstance(target, ast.Annotated):
                target = target.value
            if not isinstance(target, ast.Name):
                self.sink.error("E001", "a flow ends in a name or a tuple of names", target.span)
                raise LoweringFailed()
            bound.append((target.id, value))
            previous = scope.find(target.id) if accumulating else None
            if previous is not None and previous.kind != "poisoned":
                scope.rebind(target.id, self.accumulate_into(target.id, previous.value, value, target.span))
                continue
            if target.id != "_" and (value.owner in ops or value.name_hint is None):
                value.name_hint = target.id
            scope.define(target.id, value, target.span)
        return bound


def _made_by_op(value: SSAValue) -> bool:
    """Whether ``value`` is the result of an op that computes it (not a block argument, not a parameter read)."""
    return isinstance(value.owner, Operation) and not isinstance(value.owner, ParamRefOp)


def producers(values: Sequence[SSAValue]) -> list[Operation]:
    """The distinct ops that compute ``values``, in the order of the values."""
    ops: list[Operation] = []
    for value in values:
        if _made_by_op(value) and value.owner not in ops:
            ops.append(value.owner)
    return ops


def _poison(node: ast.Expr, scope: Scope) -> None:
    """Mark the names a failed flow would have defined, so their uses stay quiet."""
    for target in node.items if isinstance(node, ast.TupleExpr) else [node]:
        if isinstance(target, ast.Name) and scope.find(target.id) is None:
            scope.define(target.id, None, target.span, "poisoned")


def _primary_outputs(ops: list[Operation], values: list[SSAValue]) -> int:
    """How many of a stage's values a flow must name: a primitive's statistics
    outputs (rstd, lse, ...) may stay unnamed; everything else must be named."""
    sig = lookup_primitive(ops[-1].name.removeprefix("mdsl.graph.")) if ops else None
    return sig.primary_outputs if sig is not None and len(values) == len(sig.outputs) else len(values)


def _naming_hint(ops: list[Operation], values: list[SSAValue]) -> str | None:
    sig = lookup_primitive(ops[-1].name.removeprefix("mdsl.graph.")) if ops else None
    if sig is None:
        return None
    names = ", ".join(slot.name for slot in sig.outputs)
    return f"{sig.name} produces ({names}); name them in order, or use _ to discard one"


def _absent_discards(names: list[ast.Expr], values: list[SSAValue], ops: list[Operation]) -> list[ast.Expr]:
    """``-> (out, _)``: trailing ``_`` may stand for optional outputs the op does not produce."""
    sig = lookup_primitive(ops[-1].name.removeprefix("mdsl.graph.")) if ops else None
    limit = len(sig.outputs) if sig is not None else len(values)
    while len(names) > len(values) and len(names) <= limit and _is_discard(names[-1]):
        names = names[:-1]
    return names


def _is_discard(node: ast.Expr) -> bool:
    return isinstance(node, ast.Name) and node.id == "_"


def unannotated(stage: ast.Expr) -> ast.Expr:
    return stage.value if isinstance(stage, ast.Annotated) else stage


def names_failed_param(node: ast.Expr, instance: Instance, scope: Scope) -> bool:
    """``p`` or ``p.weight`` where parameter ``p`` was refused (and no graph value is named ``p``)."""
    base = node.base if isinstance(node, ast.Attribute) else node
    return isinstance(base, ast.Name) and base.id in instance.failed and scope.find(base.id) is None


def is_saved(node: ast.Attribute) -> bool:
    return isinstance(node.base, ast.Name) and node.base.id == "saved"
