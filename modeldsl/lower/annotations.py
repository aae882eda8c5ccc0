"""Annotations: built-in ones become typed attributes, uses of declared ones dictionaries
(``user_annotations``); recipes on the model; the checks that need the lowered flow
(E013 fusions, E025 checkpoints across stages, W003 unsaved intermediates) and the
memory policy of each named result (spec 7.2.0).
"""

from __future__ import annotations

import difflib
import fnmatch
from collections.abc import Sequence
from typing import Any

from xdsl.dialects.builtin import (
    ArrayAttr,
    DictionaryAttr,
    StringAttr,
)
from xdsl.ir import Attribute, Operation, SSAValue

from modeldsl.diagnostics import Span
from modeldsl.dialects.annotations import (
    ANNOTATION_BY_NAME,
    AdapterAttr,
    AnnotationAttr,
    AnnotationError,
    AssertAttr,
    CheckpointAttr,
    FuseAttr,
    FuseRequiredAttr,
    RecipeAttr,
    annotations_of,
    check_annotation_set,
    effective_memory_policy,
    make_annotation,
)
from modeldsl.dialects.assertions import Check
from modeldsl.dialects.graph import CallOp, FuncOp, ParamRefOp, StackOp
from modeldsl.frontend.text import ast
from modeldsl.instances import (
    Instance,
    source_text,
)
from modeldsl.invariants import uses_of
from modeldsl.kernel_choice import check_kernel_annotation
from modeldsl.lower.backward import ForwardResult
from modeldsl.lower.flows import unannotated
from modeldsl.lower.inert import NOWHERE, inert_message, inert_reason
from modeldsl.primitives import lookup_primitive
from modeldsl.resolve.annotation_checks import (
    cheap_to_recompute,
    declared_partition,
    fusion_problem,
    partition_of,
    read_by_gradient,
    stage_names,
)
from modeldsl.resolve.consts import ConstEnv, ConstError, NotConstant, evaluate
from modeldsl.resolve.scope import Scope
from modeldsl.resolve.user_annotations import check_applies_to, recipe_fields, user_annotation
from modeldsl.symbolic import Expr, definitely_different

INERT_HINT = "remove it, or see docs/annotations.md for the annotations that take effect"


class AnnotationsMixin:
    """Annotations: built-in and declared annotations, recipes, checkpoints and memory policies."""

    def check_unlowered_annotations(self, instance: Instance, body: Sequence[ast.Stmt]) -> None:
        """The annotations of the flows of an ``if`` branch that is not taken (so not lowered): an
        unknown name or a wrong argument is the error it is in a taken branch (E008), one that has
        no effect in this version warns (W013) as it does there."""
        for stmt in body:
            if isinstance(stmt, ast.If):
                self.check_unlowered_annotations(instance, [*stmt.then, *(stmt.orelse or [])])
            elif isinstance(stmt, ast.Flow):
                nodes = [*stmt.annotations]
                for expr in stmt.chain:
                    items = expr.items if isinstance(expr, ast.TupleExpr) else [expr]
                    nodes += [a for item in items if isinstance(item, ast.Annotated) for a in item.annotations]
                if nodes:
                    self.annotations(nodes, instance.env, instance.namespace)

    def annotations(self, nodes: Sequence[ast.Annotation], env: ConstEnv | None = None,
                    namespace: dict[str, ast.Decl] | None = None, target: str = "flow") -> list[Attribute]:
        """The built-in annotations of ``nodes`` as attributes, then the uses of annotations
        the program declares (``annotation @name:``) as dictionaries (see :func:`split_user`).
        Those that do not change the program on ``target`` (:mod:`modeldsl.lower.inert`) warn (W013)."""
        result, user = [], []
        namespace = namespace or self.decls
        for node in nodes:
            args, kwargs = [], {}
            declared = namespace.get(f"@{node.name}")
            try:
                for arg in node.args:
                    condition = node.name == "assert" and (arg.name == "condition" or arg.name is None and not args)
                    value = condition_text(arg.value) if condition else self.annotation_value(arg.value, env)
                    if arg.name is None:
                        args.append(value)
                    else:
                        kwargs[arg.name] = value
                if declared is not None and node.name not in ANNOTATION_BY_NAME:
                    check_applies_to(declared, target)
                    user.append(user_annotation(declared, args, kwargs))
                    continue
                attr = make_annotation(node.name, args, kwargs)
                if isinstance(attr, RecipeAttr):
                    self.check_recipe(attr, node, namespace)
                self.warn_inert(attr, node.span, target)
                result.append(attr)
            except AnnotationError as err:
                self.sink.error("E008", err.message, node.span, self.annotation_hint(node.name, err, namespace))
        if result:
            try:
                check_annotation_set(result)
            except AnnotationError as err:
                span = Span(nodes[0].span.source, nodes[0].span.line, nodes[0].span.column,
                            nodes[-1].span.end_line, nodes[-1].span.end_column)
                self.sink.error("E008", err.message, span, err.hint)
                return user
        return result + user

    def warn_inert(self, attr: AnnotationAttr, span: Span, target: str) -> None:
        """W013 at an annotation that does not change the compiled program where it is written
        (once per place: an instance lowered twice reports it once)."""
        found = inert_reason(attr, target)
        place = (span.source.name, span.line, span.column)
        if found is None or place in self.inert_reported:
            return
        self.inert_reported.add(place)
        self.sink.warning("W013", inert_message(*found), span, INERT_HINT)

    def warn_inert_declaration(self, decl: ast.Decl, env: ConstEnv | None, namespace: dict[str, ast.Decl]) -> None:
        """The annotation lines of an instantiated module or block: checked (E008), and W013 (they
        are not applied; the top declaration's are, see :meth:`lower_recipes`)."""
        nodes = [a for stmt in decl.body if isinstance(stmt, ast.AnnotationStmt) for a in stmt.annotations]
        if nodes:
            self.annotations(nodes, env, namespace, target="declaration")

    def annotation_hint(self, name: str, err: AnnotationError, namespace: dict[str, ast.Decl]) -> str:
        """For an unknown annotation: the closest built-in or declared one."""
        if name in ANNOTATION_BY_NAME or f"@{name}" in namespace:
            return err.hint
        known = [*ANNOTATION_BY_NAME, *(k[1:] for k in namespace if k.startswith("@"))]
        close = difflib.get_close_matches(name, known, n=1)
        return f"did you mean @{close[0]}? {err.hint}" if close else err.hint

    def check_recipe(self, attr: RecipeAttr, node: ast.Annotation, namespace: dict[str, ast.Decl]) -> None:
        """``@recipe(Name)`` names a ``recipe`` declaration (E008 otherwise)."""
        name = attr.values["name"]
        recipes = sorted(n for n, d in namespace.items() if d.kind == "recipe")
        if name in recipes:
            return
        close = difflib.get_close_matches(name, recipes, n=1)
        hint = f"did you mean '{close[0]}'?" if close else (
            f"declared recipes: {', '.join(recipes)}" if recipes
            else "declare it: recipe NAME: with key: value entries")
        raise AnnotationError(f"unknown recipe '{name}'", hint)

    def lower_recipes(self, top: ast.Decl, namespace: dict[str, ast.Decl]) -> None:
        """Every visible ``recipe`` declaration as ``recipes = {Name = {key = value}}`` on the
        model, and the model's own annotations (``@recipe(Name)``) as its ``annotations``."""
        recipes: dict[str, Attribute] = {}
        for name, decl in sorted(namespace.items()):
            if decl.kind != "recipe" or name.startswith("@"):
                continue
            fields, bad = recipe_fields(decl)
            for stmt in bad:
                self.sink.error("E001", "a recipe holds `key: value` entries", stmt.span,
                                "e.g. forward_activation_dtype: fp8_e4m3")
            recipes[name] = DictionaryAttr(fields)
            span = decl.span.word(decl.name)
            if (span.source.name, span.line, span.column) not in self.inert_reported:
                self.inert_reported.add((span.source.name, span.line, span.column))
                self.sink.warning("W013", inert_message(f"recipe {decl.name}", NOWHERE["recipe"]), span, INERT_HINT)
        if recipes:
            self.model.attributes["recipes"] = DictionaryAttr(recipes)
        nodes = [a for stmt in top.body if isinstance(stmt, ast.AnnotationStmt) for a in stmt.annotations]
        builtin, user = split_user(self.annotations(nodes, self.config_values, namespace, target="model"))
        if builtin:
            self.model.attributes["annotations"] = ArrayAttr(builtin)
        if user:
            self.model.attributes["user_annotations"] = ArrayAttr(user)

    def annotation_value(self, node: ast.Expr, env: ConstEnv | None) -> Any:
        """An annotation argument: a word (``column``, ``recompute``), a literal, or a ConstExpr
        of the module's parameters (``@shard(tp_size=tp_size)``) at its configured value."""
        if env is None or isinstance(node, ast.Name) and not env.lookup(node.id)[0] \
                or isinstance(node, (ast.Int, ast.Float, ast.Str, ast.Bool, ast.ListExpr, ast.TupleExpr)):
            return _annotation_value(node)
        try:
            value = evaluate(node, self.concretized(env, node), "annotation argument")
        except (ConstError, NotConstant):
            return _annotation_value(node)  # not a ConstExpr: the annotation says what it takes
        if isinstance(value, Expr):
            raise AnnotationError(f"'{node.span.text}' is a size without a configured value",
                                  "give the parameter a default or a configured value")
        return value

    def attach_annotations(self, ops: Sequence[Operation], nodes: list[ast.Annotation],
                           instance: Instance) -> list[Attribute]:
        """Add the annotations ``nodes`` to each of ``ops`` (those that make the values a flow
        or a stage names); the built-in ones."""
        target = "flow" if self.backward is None else "backward"
        annotations, user = split_user(self.annotations(nodes, instance.env, instance.namespace, target))
        kernel = next((n for n in nodes if n.name == "kernel"), None)
        annotations = self.check_assertions(ops, annotations, nodes, instance)
        for op in ops:
            _add_annotations(op, "annotations", annotations)
            _add_annotations(op, "user_annotations", user)
            if kernel is not None and lookup_primitive(op.name.removeprefix("mdsl.graph.")) is not None:
                check_kernel_annotation(op, kernel.span, self.sink)  # E043 or W012 (spec 7.5.3)
        return annotations

    def spread_adapters(self, annotations: Sequence[Attribute], made: Sequence[Operation]) -> None:
        """``@adapter(lora)`` on a flow adapts every linear the flow computes: each matmul it makes,
        and each call or stack it makes carries it too (for the weights they pass on)."""
        adapters = [a for a in annotations if isinstance(a, AdapterAttr) and a["type"] == "lora"]
        for op in made if adapters else ():
            if op.name == "mdsl.graph.matmul" or isinstance(op, (CallOp, StackOp)):
                present = annotations_of(op)
                _add_annotations(op, "annotations", [a for a in adapters if a not in present])

    def check_assertions(self, ops: Sequence[Operation], annotations: list[Attribute], nodes: list[ast.Annotation],
                         instance: Instance) -> list[Attribute]:
        """``@assert`` (spec 7.7.1) names the tensors the flow computes (E002 otherwise); a shape check
        is decided here where the sizes tell (E027 where it fails), else left to ``mdsl-lower-to-sched``
        (its size an integer or a size of the model); the condition kept holds the checks left (an
        assertion with none left, or ``enabled=false``, is dropped: it costs nothing)."""
        kept = []
        results = {r.name_hint: r for op in ops for r in op.results if r.name_hint}
        for attr in annotations:
            if not isinstance(attr, AssertAttr):
                kept.append(attr)
                continue
            node = next((n for n in nodes if n.name == "assert"), nodes[0])
            left = []
            for check in attr.checks():
                value = results.get(check.tensor)
                if value is None:
                    close = difflib.get_close_matches(check.tensor, list(results), n=1)
                    self.sink.error("E002", f"@assert checks '{check.tensor}', which this flow does not compute",
                                    node.span, f"did you mean '{close[0]}'?" if close else
                                    f"the flow computes: {', '.join(results) or 'no named tensor'}")
                elif check.kind != "shape":
                    left.append(check)
                else:
                    deferred = self.check_shape_assertion(check, value, attr, node, instance)
                    left += [deferred] if deferred is not None else []
            if left and attr["enabled"]:
                condition = " && ".join(c.text for c in left)
                kept.append(attr if condition == attr["condition"] else
                            AssertAttr.of(condition=condition, message=attr["message"]))
        return kept

    def check_shape_assertion(self, check: Check, value: SSAValue, attr: AnnotationAttr, node: ast.Annotation,
                              instance: Instance) -> Check | None:
        """``x.shape[i] == size``: decided from the tensor's type and the module's sizes (None), or the
        check ``mdsl-lower-to-sched`` decides once the sizes are bound."""
        shape = list(value.type.shape)
        if not -len(shape) <= check.dim < len(shape):
            self.sink.error("E004", f"@assert: '{check.tensor}' has {len(shape)} dimensions, no dimension "
                            f"{check.dim}", node.span)
            return None
        dim, size = shape[check.dim], check.size
        if isinstance(size, str):
            found, size = instance.env.lookup(size)
            if not found:
                self.sink.error("E002", f"@assert compares with '{check.size}', which is no size of the module",
                                node.span, "compare with an integer or a parameter of the module")
                return None
        want = Expr.const(size) if isinstance(size, int) and not isinstance(size, bool) else size
        if not isinstance(want, Expr) or not isinstance(dim, Expr):
            self.sink.error("E008", f"@assert: '{check.text}' does not compare sizes", node.span)
            return None
        if dim == want:
            return None
        if definitely_different(dim, want):
            self.sink.error("E027", f"@assert({check.text}) never holds: '{check.tensor}' is {value.type}: "
                            f"{attr['message'] or 'assertion failed'}", node.span)
            return None
        bound = want.const_value() if want.is_const() else str(want)
        if not isinstance(bound, int) and not str(bound).isidentifier():
            self.sink.error("E008", f"@assert({check.text}) cannot be decided: dimension {check.dim} of "
                            f"'{check.tensor}' is {dim}, and {check.size} is {want}", node.span,
                            "compare with an integer or a size of the model")
            return None
        return Check("shape", check.tensor, dim=check.dim, size=bound)

    def mark_checkpoint_region(self, before: Operation | None, annotations: list[Attribute]) -> None:
        """A flow ``@checkpoint``: every op the flow made (the region ``mdsl-recompute`` replays)
        carries it as its ``checkpoint`` attribute; a flow through a stack leaves it on the stack
        (in its annotations: the stack's layers are the region)."""
        checkpoint = next((a for a in annotations if isinstance(a, CheckpointAttr)), None)
        first = before.next_op if before is not None else self.block.first_op
        made = []
        while checkpoint is not None and first is not None:
            made.append(first)
            first = first.next_op
        if any(isinstance(op, StackOp) for op in made):
            return
        for op in made:
            if not isinstance(op, ParamRefOp):
                op.attributes["checkpoint"] = checkpoint

    def check_flow_annotations(self, instance: Instance, flow: ast.Flow, nodes: list[ast.Annotation],
                               annotations: list[Attribute], performed: list[str]) -> None:
        """E013 for a fusion the flow cannot perform, E025 for a checkpoint across stages (``nodes``:
        the annotations written, of the flow or of one name of its tuple)."""
        for attr in annotations:
            if isinstance(attr, (FuseAttr, FuseRequiredAttr)):
                problem = fusion_problem(attr.values["pattern"], attr.values["ops"], performed)
                if problem is not None:
                    node = next(a for a in nodes if a.name == attr.dsl_name)
                    self.sink.error("E013", problem[0], node.span, problem[1])
        if not any(isinstance(a, CheckpointAttr) for a in annotations):
            return
        stages = {}
        own = partition_of(flow.annotations)
        if own is not None:
            stages[own] = "the flow's @partition"
        for stage in flow.chain[1:-1]:
            marked = partition_of(stage.annotations) if isinstance(stage, ast.Annotated) else None
            if marked is not None:
                stages.setdefault(marked, f"'{unannotated(stage).span.text}'")
        for name in stage_names([unannotated(s) for s in flow.chain]):
            declared = declared_partition(instance.decl, name)
            if declared is not None:
                stages.setdefault(declared, f"'{name}'")
        if len(stages) > 1:
            where = ", ".join(f"{who} in stage {stage}" for stage, who in sorted(stages.items()))
            self.sink.error("E025", f"the @checkpoint region spans pipeline stages ({where})", flow.span,
                            "checkpoint each stage on its own: split the flow at the stage boundary")

    def record_memory_policy(self, instance: Instance, bound: list[tuple[str, SSAValue]],
                             annotations: list[Attribute]) -> None:
        """The memory mode of each named result by the precedence ladder of spec 7.2.0,
        as ``memory = [...]`` on the op that makes it (``auto`` where only the default rule applies,
        which ``mdsl-recompute`` decides once it knows what the backward needs). A module
        with a ``save:`` list saves what it lists: the intermediate tensors it leaves out are
        recomputed (spec 7.2.1: ``save: [in]``, "only save input and output; recompute
        intermediates"; W003 says so), its outputs are left to its consumers. A name bound to a
        value an earlier flow made (``x -> y``, a stated type) sets that value's mode, except that
        being left out of ``save:`` does not undo a mode stated for it before."""
        save, recompute = _tensor_list(instance.decl, "save"), _tensor_list(instance.decl, "recompute")
        memory = [a for a in annotations if isinstance(a, AnnotationAttr)]
        for name, value in bound:
            owner = value.owner
            if not isinstance(owner, Operation) or isinstance(owner, ParamRefOp):
                continue  # an input (its mode is the function's input_memory) or a parameter
            listed, unlisted = _matches(name, save), save and not _matches(name, save + recompute)
            policy = effective_memory_policy(
                name, annotations=memory, save=[name] if listed else [],
                recompute=[name] if _matches(name, recompute) or unlisted else [],
            )
            mode = policy.mode if policy.source != "default" else "auto"
            modes = _memory_modes(owner)
            if mode == "auto" or policy.source == "recompute_list" and unlisted and modes[value.index] != "auto":
                continue
            if unlisted and policy.source == "recompute_list":
                self.unlisted.add((owner, value.index))
            else:
                self.unlisted.discard((owner, value.index))
            modes[value.index] = mode
            owner.attributes["memory"] = ArrayAttr([StringAttr(m) for m in modes])

    def keep_outputs_unlisted(self, results: list[SSAValue]) -> None:
        """A module's outputs are its consumers' to save or recompute: its ``save:`` list, which
        leaves them out, does not make them ``recompute`` (spec 7.2.1: "only save input and output")."""
        for value in results:
            owner = value.owner
            if not isinstance(owner, Operation) or (owner, value.index) not in self.unlisted:
                continue
            self.unlisted.discard((owner, value.index))
            if "memory" not in owner.attributes:
                continue
            modes = [a.data for a in owner.attributes["memory"].data]
            modes[value.index] = "auto"
            if all(m == "auto" for m in modes):
                del owner.attributes["memory"]
            else:
                owner.attributes["memory"] = ArrayAttr([StringAttr(m) for m in modes])

    def check_listed_tensors(self, instance: Instance, scope: Scope) -> None:
        """E002 at an entry of the forward's ``save:`` or ``recompute:`` list that names (or, a
        pattern, matches) no tensor of its graph: nothing would be saved or recomputed."""
        names = [n for n in scope.names if n != "_"]
        names += [n for n in _bound_anywhere(instance.decl) if n not in names]  # untaken branches too
        for section in ("save", "recompute"):
            for pattern, span in _listed(instance.decl, section):
                if _matches_any(pattern, names) or "..." in pattern or span.location in self.checked_lists:
                    continue
                self.checked_lists.add(span.location)
                close = difflib.get_close_matches(pattern, names, n=1)
                self.sink.error("E002", f"{section}: lists '{pattern}', which is no tensor of the graph of "
                                f"{instance.decl.name}", span, f"did you mean '{close[0]}'?" if close else
                                f"its tensors: {', '.join(names)}")

    def check_derived_backward(self, instance: Instance, forward: ForwardResult) -> None:
        """W003 (spec 5.12.6): a module whose backward is derived and whose save: list leaves
        out an intermediate tensor of its graph that a derived gradient reads and that is
        more than a view of kept tensors (the derived backward then recomputes it); E006 instead where
        the op's primitive declares that its backward uses it (``invariants:``, spec 9.8.3). And W013 where
        a stack's output is marked recompute (:meth:`warn_recomputed_stack_outputs`)."""
        self.warn_recomputed_stack_outputs(instance, forward)
        decl = instance.decl
        saved = _tensor_list(decl, "save")
        if decl.sections("backward") or not saved:
            return  # a written backward, or no save: list to judge (autodiff chooses)
        patterns = saved + _tensor_list(decl, "recompute")
        named = {b.value: (n, b) for n, b in forward.scope.names.items() if isinstance(b.value, SSAValue)}
        kept = {v for v, (n, b) in named.items() if b.kind in ("input", "optional") or _matches(n, patterns)}
        warned: set[SSAValue] = set()
        declared = {(op, value): kind for op, kind, _, value in uses_of(self.model, iter(self.block.ops))}
        for op in self.block.ops:
            for value in read_by_gradient(op):
                if value in kept or value in warned or value not in named or cheap_to_recompute(value, kept):
                    continue
                warned.add(value)
                tensor, binding = named[value]
                primitive = op.name.removeprefix("mdsl.graph.")
                if (op, value) in declared:
                    self.sink.error("E006", f"{primitive}'s backward uses '{tensor}' ({declared[(op, value)]}: its "
                                    "declaration's invariant), which save: does not list", binding.span,
                                    f"add it: save: [{', '.join([*saved, tensor])}]")
                    continue
                self.sink.warning("W003", f"the derived backward reads '{tensor}' (for the gradient of {primitive}), "
                                  "which save: does not list, so it recomputes it", binding.span,
                                  f"add it: save: [{', '.join([*saved, tensor])}], or list it in recompute:")


    def warn_recomputed_stack_outputs(self, instance: Instance, forward: ForwardResult) -> None:
        """W013 at a ``recompute:`` entry or a ``@memory(recompute)`` that names a stack's output
        (``x -> blocks -> h``): ``mdsl-recompute`` replays tensors inside a layer loop and outside
        stacks, and a stack's outputs stay saved for its reverse loop, so the mark changes nothing.
        (A ``save:`` list that leaves the output out marks nothing: its outputs are its consumers'.)"""
        listed = _listed(instance.decl, "recompute")
        for op in self.block.ops:
            if not isinstance(op, StackOp):
                continue
            annotated = any(a.dsl_name == "memory" and a.values.get("mode") == "recompute"
                            for a in find_memory_annotations(op))
            for value, mode in zip(op.results, _memory_modes(op)):
                if mode != "recompute" or (op, value.index) in self.unlisted or not value.name_hint:
                    continue
                name = value.name_hint
                entry = next((span for pattern, span in listed if fnmatch.fnmatchcase(name, pattern)), None)
                binding = forward.scope.names.get(name)
                span = entry if entry is not None and not annotated else binding.span if binding else None
                label = "@memory(recompute)" if annotated else f"recompute: [{name}]"
                self.sink.warning("W013", inert_message(label, f"'{name}' is the output of the stack "
                                  f"{op.body.root_reference.data}, which mdsl-recompute keeps saved (it replays "
                                  "tensors inside a layer loop or outside stacks)"), span,
                                  "to recompute inside the layers, write recompute: in the block, or "
                                  "@checkpoint on the stack's flow")


def find_memory_annotations(op: Operation) -> list[AnnotationAttr]:
    return [a for a in annotations_of(op) if isinstance(a, AnnotationAttr) and a.dsl_name == "memory"]


def _memory_modes(op: Operation) -> list[str]:
    """The memory mode recorded for each result of ``op`` (``auto`` for all where none is)."""
    recorded = op.attributes.get("memory")
    return [a.data for a in recorded.data] if isinstance(recorded, ArrayAttr) else ["auto"] * len(op.results)


def _add_annotations(op: Operation, key: str, annotations: list[Attribute]) -> None:
    """Append to an op's annotations (a mid-chain stage's and the flow's may meet on one op)."""
    if annotations:
        existing = op.attributes.get(key)
        op.attributes[key] = ArrayAttr([*(existing.data if isinstance(existing, ArrayAttr) else ()), *annotations])


def split_user(annotations: list[Attribute]) -> tuple[list[Attribute], list[Attribute]]:
    """Built-in annotations (typed attributes) apart from uses of declared ones (dictionaries)."""
    return ([a for a in annotations if not isinstance(a, DictionaryAttr)],
            [a for a in annotations if isinstance(a, DictionaryAttr)])


def condition_text(node: ast.Expr) -> str:
    """An ``@assert`` condition: a string as written, an expression (``!has_nan(out)``) as its text."""
    return node.value if isinstance(node, ast.Str) else node.span.text


def _annotation_value(node: ast.Expr) -> Any:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, (ast.Int, ast.Float, ast.Str, ast.Bool)):
        return node.value
    if isinstance(node, ast.Unary) and node.op == "-" and isinstance(node.operand, (ast.Int, ast.Float)):
        return -node.operand.value
    if isinstance(node, (ast.ListExpr, ast.TupleExpr)):
        return [_annotation_value(i) for i in node.items]
    raise AnnotationError("annotation arguments are names, numbers, strings, booleans or lists")


def _tensor_list(decl: ast.Decl, name: str) -> list[str]:
    """The names (or wildcard patterns such as ``ln*_out``) of a forward ``save:`` or ``recompute:`` list."""
    return [pattern for pattern, _ in _listed(decl, name)]


def _listed(decl: ast.Decl, name: str) -> list[tuple[str, Span]]:
    """(name or pattern, its span) of each entry of a forward ``save:`` or ``recompute:`` list."""
    found = []
    for forward in decl.sections("forward"):
        for entry in forward.body:
            if isinstance(entry, ast.Section) and entry.name == name and entry.value is not None:
                items = entry.value.expr.items if isinstance(entry.value.expr, ast.ListExpr) else []
                found += [(source_text(item).replace(" ", ""), item.span) for item in items]
    return found


def _matches(name: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)


def _bound_anywhere(decl: ast.Decl) -> list[str]:
    """The names the flows of a declaration's forward graph bind, in every ``if`` branch."""
    found: list[str] = []

    def walk(body: Sequence[ast.Stmt]) -> None:
        for stmt in body:
            if isinstance(stmt, ast.If):
                walk(stmt.then)
                walk(stmt.orelse or [])
            elif isinstance(stmt, ast.Section):
                walk(stmt.body)  # graph:, a recompute: block
            elif isinstance(stmt, ast.Flow):
                target = unannotated(stmt.chain[-1])
                items = target.items if isinstance(target, ast.TupleExpr) else [target]
                found.extend(item.id for item in map(unannotated, items) if isinstance(item, ast.Name))

    for forward in decl.sections("forward"):
        walk(forward.body)
    return found


def _matches_any(pattern: str, names: list[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for name in names)


def record_input_memory(func: FuncOp, decl: ast.Decl, names: list[str]) -> None:
    """``input_memory = {x = "recompute"}`` for the inputs a block's ``save:`` or ``recompute:`` list
    names (``mdsl-recompute`` reads it), with where the list says so (``input_memory_at``)."""
    modes, places = {}, {}
    for section in ("recompute", "save"):  # save: is the higher rung of the ladder: it wins
        for name, span in _listed(decl, section):
            for n in names:
                if fnmatch.fnmatchcase(n, name):
                    modes[n], places[n] = StringAttr(section), StringAttr(span.location)
    if modes:
        func.attributes["input_memory"] = DictionaryAttr(modes)
        func.attributes["input_memory_at"] = DictionaryAttr(places)
