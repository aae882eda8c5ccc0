"""Lowering Module DSL declarations to ``mdsl.graph``.

A top declaration (a model, or a module/block lowered on its own) becomes one
``mdsl.graph.model`` op: its signature parameters become the model's config
(integer ones stay symbols in shapes, so ``mdsl-specialize`` can bind them
later), every tensor parameter of it and of its sub-module instances becomes
an ``mdsl.graph.param`` named by its path (``blocks.attn.qkv_weight``), and
its forward graph becomes ``@forward``. Module instances are inlined, keeping
tensor names as SSA name hints; ``[n] x Block(...)`` becomes one block body
function plus an ``mdsl.graph.stack`` call, its parameters stacked with a
leading ``n`` dimension.

An instance whose module has a written ``backward:`` section (spec 5.12.6:
an explicit backward disables auto-derivation) is not inlined but called,
so that ``mdsl-autodiff`` can use its written backward for its part of the
graph. It becomes two helper functions, named by the instance's path:

- ``@<path>_forward(inputs..., params...) -> (outputs..., saved...)``
  (kind ``helper``): its forward graph, its tensor parameters as arguments
  (like a block body's, so that it works on the per-layer slices inside a
  stacked block), returning after its outputs the tensors its backward
  reads as ``saved.<name>``. Attributes: ``backward`` (the symbol of its
  backward), ``saved`` (the names of the extra results) and ``params`` (the
  parameter arguments, by their path inside the instance);
- ``@<path>_backward(d_outputs..., saved..., params...) -> (d_inputs...,
  d_params...)`` (kind ``backward``): the written backward, lowered and
  checked as the top's ``@backward`` is (E005, E006, E018-E022, W004 at the
  module's source), with ``grads`` naming and ``grad_args`` indexing (into
  the forward's arguments) its results (:mod:`modeldsl.lower_backward`).

The call site is ``mdsl.graph.call @<path>_forward``; the saved results
are only read by a derived gradient. Instances of one module with the same
configuration, parameter and input types share one pair of functions (named
after the first); inside a written backward, and inside such a helper
(whose written backward covers its sub-modules), instances stay inlined, as
do modules holding a stack. Helper functions follow the model's other
functions.

Every problem is a coded diagnostic collected in a sink, so one run reports
all independent errors.
"""

from __future__ import annotations

import difflib
import fnmatch
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from xdsl.dialects.builtin import (
    ArrayAttr,
    BoolAttr,
    DictionaryAttr,
    FlatSymbolRefAttr,
    FloatAttr,
    IntegerAttr,
    ModuleOp,
    StringAttr,
    f64,
    i64,
)
from xdsl.ir import Attribute, Block, Operation, SSAValue
from xdsl.utils.exceptions import VerifyException

from modeldsl.diagnostics import DiagnosticError, DiagnosticSink, Span
from modeldsl.kernel_choice import check_kernel_annotation
from modeldsl.dialects.annotations import (
    ANNOTATION_BY_NAME,
    AnnotationAttr,
    AnnotationError,
    CheckpointAttr,
    FuseAttr,
    FuseRequiredAttr,
    RecipeAttr,
    check_annotation_set,
    effective_memory_policy,
    make_annotation,
)
from modeldsl.dialects.dtypes import DTYPE_SPELLINGS
from modeldsl.dialects.graph import CallOp, ExprAttr, FuncOp, ModelOp, ParamOp, ParamRefOp, ReturnOp, StackOp
from modeldsl.dialects.dtypes import DType
from modeldsl.dialects.graph_primitives import CastOp, DTypeMismatch, check_same_shape
from modeldsl.dialects.graph_types import TensorType
from modeldsl.frontend.text import ast
from modeldsl.instances import (
    Instance,
    LoweringFailed,
    ParamSlot,
    StackedInstance,
    param_slots,
    source_text,
    typed_entries,
    unnamed_entries,
)
from modeldsl.infer import InferenceError, infer_result_types
from modeldsl.ir import locate_new_ops, located
from modeldsl.lower_backward import BackwardLowering, ForwardInput, ForwardResult, flow_accumulates
from modeldsl.primitives import STAR_REDUCTIONS, PrimitiveSignature, lookup_primitive, star_reduction
from modeldsl.resolve.consts import ConstEnv, ConstError, NotConstant, evaluate, evaluate_let, guard_value
from modeldsl.resolve.imports import ResolvedProgram, qualified_path, resolve_program, std_module_declaring
from modeldsl.resolve.inherit import merged
from modeldsl.resolve.order import defined_names, expression_names, topological_order
from modeldsl.resolve.annotation_checks import (
    cheap_to_recompute,
    declared_partition,
    fusion_problem,
    partition_of,
    read_by_gradient,
    stage_names,
)
from modeldsl.resolve.scope import Scope
from modeldsl.resolve.user_annotations import recipe_fields, user_annotation
from modeldsl.symbolic import STAR, Expr, SymbolicError

DEFAULT_DTYPE = "bf16"
LOWERABLE = ("module", "block", "model")  # declarations that lower to mdsl.graph
# A last shape entry spelled like an element type (fp31, bf61, int4, float32) is a dtype typo, not a size.
DTYPE_LIKE = re.compile(r"^((fp|bf|float|bfloat|int|uint)\d+|[iuf]\d{2,})(_\w*)?$")
# Parameters that only shape inference needs (not op attributes), first in positional order.
INFERENCE_PARAMS = {
    "view": ("shape",),
    "zeros": ("shape", "dtype"),
    "ones": ("shape", "dtype"),
    "fill": ("shape", "value", "dtype"),
    "cast": ("dtype",),
}


class Lowering(BackwardLowering):
    def __init__(self, program: ast.Program, sink: DiagnosticSink, resolved: ResolvedProgram | None = None):
        self.program = program
        self.sink = sink
        self.resolved = resolved
        self.decls = resolved.decls if resolved is not None else {d.name: d for d in program.declarations}
        self.model: ModelOp | None = None
        self.block: Block | None = None
        self.param_refs: dict[str, SSAValue] = {}
        self.active: list[str] = []  # declarations being instantiated, outermost first
        self.concrete: dict[str, int] = {}  # configured values of the top's integer parameters
        self.baked: set[str] = set()  # integer config values fixed into attributes or guards
        self.star_width: dict[SSAValue, int] = {}  # a value bound to a declared [*, ...]: how many axes '*' is
        self.helpers: list[FuncOp] = []  # forward/backward functions of called modules, added last
        self.module_funcs: dict[tuple, ModuleFuncs | None] = {}  # by module, config and types
        self.in_module_func = 0  # > 0 while lowering a called module's forward
        self.config_values: ConstEnv | None = None  # the top's configuration, for its own annotations
        self.optional_inputs: dict[int, set[str]] = {}  # by forward: section, its optional inputs
        self.inline_prefixes: set[str] = set()  # parameter paths of module calls in graphs
        self.stack_bodies: dict[int, list[TensorType]] = {}  # by stack, the result types of its body function
        self.failed_inputs: dict[int, list] = {}  # by forward: section, inputs whose type was refused
        self.untyped_outputs: set[tuple[int, str]] = set()  # (forward: section, output) written without dtype
        self.tuple_outputs: dict[int, dict[str, int]] = {}  # by forward: section, `out: ([..], [..])` sizes
        self.graph_outputs: list[dict[str, int]] = []  # tuple outputs of the graphs being lowered, innermost last
        self.unlisted: set[tuple[Operation, int]] = set()  # results recompute only because save: leaves them out

    # ------------------------------------------------------------------ entry
    def lower(self, top: ast.Decl, config: dict[str, Any] | None = None) -> ModuleOp:
        namespace = self.namespace_of(top)
        top = self.concrete_decl(top, top.span)
        env, config_attrs = self.config_env(top, config or {})
        self.model = located(ModelOp(top.name, config_attrs), top.span)
        self.active.append(top.name)
        report_placeholders(top, self.sink)
        self.check_constraints_on_defaults(top, config or {})
        instance = Instance(top, env, "", namespace)
        self.evaluate_let(instance)
        self.declare_params(instance, stack=None)
        self.config_values = env
        self.lower_recipes(top, namespace)
        self.lower_hf_sections(top)
        try:
            forward = self.lower_forward(instance)
        except LoweringFailed:
            return ModuleOp([self.model])
        self.check_derived_backward(instance, forward)
        self.lower_backward(instance, forward)
        self.model.body.block.add_ops(self.helpers)
        if self.baked:
            self.model.attributes["baked"] = ArrayAttr([StringAttr(n) for n in sorted(self.baked)])
        return ModuleOp([self.model])

    # ------------------------------------------------------------------ HuggingFace sections
    def lower_hf_sections(self, decl: ast.Decl) -> None:
        """``hf_config``, ``hf_mapping`` and ``hf_export`` as dictionaries on the model op."""
        for name in ("hf_config", "hf_mapping", "hf_export"):
            sections = decl.sections(name)
            if not sections:
                continue
            if len(sections) > 1:
                self.sink.error("E010", f"more than one {name}: section", sections[1].span)
            entries: dict[str, Attribute] = {}
            for stmt in sections[0].body:
                try:
                    key, value = self.hf_entry(stmt)
                except LoweringFailed:
                    continue
                if key in entries:
                    self.sink.error("E010", f"'{key}' is mapped twice in {name}", stmt.span)
                entries[key] = value
            self.model.attributes[name] = DictionaryAttr(entries)

    def hf_entry(self, stmt: ast.Stmt) -> tuple[str, Attribute]:
        if isinstance(stmt, ast.Section) and stmt.body and stmt.value is None:
            nested = dict(self.hf_entry(inner) for inner in stmt.body)
            return _hf_key(stmt.key), DictionaryAttr(nested)
        if isinstance(stmt, ast.Section) and stmt.value is not None:
            return _hf_key(stmt.key), self.hf_value(stmt.value.expr)
        if isinstance(stmt, ast.Flow) and len(stmt.chain) == 2:
            return _hf_key(stmt.chain[0]), self.hf_value(stmt.chain[1])
        self.sink.error("E010", "a weight mapping is `name: \"hf.tensor.name\"`, `name: fuse(...)`, "
                        "`name: transform(...)`, `name: tied_to(...)` or `name -> split(...)`", stmt.span)
        raise LoweringFailed()

    def hf_value(self, node: ast.Expr) -> Attribute:
        if isinstance(node, ast.Str):
            return StringAttr(node.value)
        if isinstance(node, ast.Name):
            return StringAttr(node.id)
        if isinstance(node, (ast.Int, ast.Bool)):
            return IntegerAttr(int(node.value), i64)
        if isinstance(node, ast.Float):
            return FloatAttr(node.value, f64)
        if isinstance(node, ast.ListExpr):
            return ArrayAttr([self.hf_value(i) for i in node.items])
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            entries: dict[str, Attribute] = {"op": StringAttr(node.func.id)}
            positional = [self.hf_value(a.value) for a in node.args if a.name is None]
            parts = {a.name: self.hf_value(a.value) for a in node.args if a.style == "str:"}
            entries.update({a.name: self.hf_value(a.value) for a in node.args if a.style in ("=", ":")})
            if positional:
                entries["args"] = ArrayAttr(positional)
            if parts:
                entries["parts"] = DictionaryAttr(parts)
            return DictionaryAttr(entries)
        return StringAttr(source_text(node))

    def config_env(self, decl: ast.Decl, overrides: dict[str, Any]) -> tuple[ConstEnv, dict[str, Attribute]]:
        """Signature parameters: integers stay symbols in shapes; others take their values."""
        env = ConstEnv()
        attrs: dict[str, Attribute] = {}
        known: dict[str, Any] = {}  # configured values, for defaults such as d_model // num_heads
        for param in decl.params or []:
            if param.rest or param.name is None:
                continue
            value = overrides.get(param.name)
            if value is None and param.default is not None:
                try:
                    value = evaluate(param.default, ConstEnv(dict(known)))
                except (ConstError, NotConstant):
                    value = self.const(param.default, env)
                if isinstance(value, float) and _type_name(param) == "int":
                    self.sink.error("E003", f"'{param.name}' is an int parameter, but its default is the float "
                                    f"{value!r}", param.default.span, "write an integer (or use // for division)")
                    raise LoweringFailed()
            if value is not None and not isinstance(value, Expr):
                known[param.name] = value
            if isinstance(value, bool):
                env.values[param.name] = value
                attrs[param.name] = BoolAttr.from_bool(value)
            elif isinstance(value, int) or value is None and _type_name(param) == "int":
                env.values[param.name] = Expr.sym(param.name)
                if value is not None:
                    attrs[param.name] = IntegerAttr(value, i64)
            elif isinstance(value, float):
                env.values[param.name] = value
                attrs[param.name] = FloatAttr(value, f64)
            elif isinstance(value, str):
                env.values[param.name] = value
                attrs[param.name] = StringAttr(value)
            else:
                env.values[param.name] = Expr.sym(param.name)
        return env, attrs

    # ------------------------------------------------------------------ constants
    def const(self, node: ast.Expr, env: ConstEnv, context: str = "expression") -> Any:
        try:
            return evaluate(node, env, context)
        except NotConstant:
            self.sink.error("E026", f"the {context} is not known at compile time", node.span)
        except ConstError as err:
            self.sink.error(err.code, err.message, err.span, err.hint)
        raise LoweringFailed()

    def check_constraints_on_defaults(self, decl: ast.Decl, overrides: dict[str, Any]) -> None:
        """Constraints on config values wait for specialization, but the defaults
        (and given overrides) must already satisfy them: E027 now, not later."""
        values: dict[str, Any] = {}
        for param in decl.params or []:
            if param.name is None or param.rest:
                continue
            if param.name in overrides:
                values[param.name] = overrides[param.name]
            elif param.default is not None:
                try:
                    values[param.name] = evaluate(param.default, ConstEnv(dict(values)))
                except (ConstError, NotConstant):
                    continue
        self.concrete = {k: v for k, v in values.items() if isinstance(v, int) and not isinstance(v, bool)}
        if not values:
            return
        scratch = DiagnosticSink()
        env = ConstEnv(values)
        for section in decl.sections("let"):
            evaluate_let(section, env, scratch)
        for diagnostic in scratch.diagnostics:
            if diagnostic.code == "E027":
                self.sink.add(diagnostic)

    def namespace_of(self, decl: ast.Decl) -> dict[str, ast.Decl]:
        return self.resolved.namespace_of(decl) if self.resolved is not None else self.decls

    def guard(self, condition: ast.Expr, env: ConstEnv) -> bool | None:
        """An ``if`` guard. Integer config values are symbols in shapes, but a guard
        needs their configured value: ``if sliding_window > 0`` picks a branch
        for this configuration (lowering again with another config may pick the other)."""
        return guard_value(condition, self.concretized(env, condition), self.sink)

    def concretized(self, env: ConstEnv, node: ast.Expr) -> ConstEnv:
        """``env`` with integer config values at their configured values (recorded as
        baked when ``node`` reads them), for what needs a number now: a guard, a float
        parameter such as ``scale(1.0 / sqrt(d_head))``, an annotation argument."""
        concrete = ConstEnv(parent=env, tensors=set(env.tensors), sizes=set(env.sizes))
        used = expression_names(node)
        scope: ConstEnv | None = env
        while scope is not None:
            for name, value in scope.values.items():
                if name not in concrete.values and isinstance(value, Expr):
                    concrete.values[name] = _concretize(value, self.concrete)
                    if name in used:
                        self.baked |= value.symbols() & self.concrete.keys()
            scope = scope.parent
        return concrete

    def evaluate_let(self, instance: Instance) -> None:
        for section in instance.decl.sections("let"):
            evaluate_let(section, instance.env, self.sink, self.chosen)

    # ------------------------------------------------------------------ params
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
            annotations, user = split_user(self.annotations(value.annotations, instance.env, instance.namespace))
            param = self.emit_param(path, ptype, stack, annotations)
            if user:
                param.attributes["user_annotations"] = ArrayAttr(user)
            frozen = any(getattr(a, "DSL_NAME", None) == "frozen" for a in annotations)
            instance.params[entry.name] = ParamSlot(path, ptype, frozen=frozen)
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
            self.declare_nested(body, stacked)
            instance.params[entry.name] = stacked
            return
        child = self.instantiate(expr, instance.env, f"{path}.", instance.namespace)
        self.declare_nested(child, stack)
        instance.params[entry.name] = child

    def declare_nested(self, child: Instance, stack: StackedInstance | None, bound: Sequence[SSAValue] = (),
                       named: dict[str, SSAValue] | None = None) -> None:
        self.active.append(child.decl.name)
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
        expr = _qualified(expr, namespace)
        if not isinstance(expr, ast.Name) or expr.id not in namespace or namespace[expr.id].kind == "primitive":
            name = expr.id if isinstance(expr, ast.Name) else "this expression"
            self.sink.error("E002", f"undefined module '{name}'", expr.span,
                            "declare the module in this file or import it")
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

    # ------------------------------------------------------------------ types
    def tensor_type(self, expr: ast.Expr, env: ConstEnv) -> TensorType:
        if not isinstance(expr, ast.ListExpr):
            self.sink.error("E003", "expected a tensor type like [B, T, d_model]", expr.span)
            raise LoweringFailed()
        items = list(expr.items)
        dtype = DEFAULT_DTYPE
        if items and isinstance(items[-1], ast.Name) and items[-1].id in DTYPE_SPELLINGS:
            dtype = items.pop().id
        elif items and _dtype_typo(items[-1], env):
            self.unknown_dtype(items[-1])
        dims: list[Any] = []
        for item in items:
            if isinstance(item, ast.Star):
                dims.append(STAR)
            else:
                dims.append(self.dim(item, env))
        try:
            return TensorType(dims, dtype)
        except SymbolicError as err:
            self.sink.error("E004", str(err), expr.span)
            raise LoweringFailed() from None

    def unknown_dtype(self, node: ast.Name) -> None:
        """E003 at a last shape entry spelled like a dtype (``fp31``) that is none."""
        close = difflib.get_close_matches(node.id, DTYPE_SPELLINGS, n=1, cutoff=0.5)
        hint = f"did you mean '{close[0]}'? " if close else ""
        self.sink.error("E003", f"unknown dtype '{node.id}'", node.span,
                        f"{hint}the dtypes are {', '.join(DTYPE_SPELLINGS)}")
        raise LoweringFailed()

    def dim(self, node: ast.Expr, env: ConstEnv) -> Expr:
        shape_env = env.child()
        for name in _free_names(node):
            if not env.lookup(name)[0]:
                shape_env.values[name] = Expr.sym(name)  # a symbolic dimension such as B or T
        value = self.const(node, shape_env, "shape dimension")
        if isinstance(value, bool) or not isinstance(value, (int, Expr)):
            self.sink.error("E004", f"a dimension must be an integer, got {value!r}", node.span)
            raise LoweringFailed()
        return Expr.of(value)

    def annotations(self, nodes: Sequence[ast.Annotation], env: ConstEnv | None = None,
                    namespace: dict[str, ast.Decl] | None = None) -> list[Attribute]:
        """The built-in annotations of ``nodes`` as attributes, then the uses of annotations
        the program declares (``annotation @name:``) as dictionaries (see :func:`split_user`)."""
        result, user = [], []
        namespace = namespace or self.decls
        for node in nodes:
            args, kwargs = [], {}
            declared = namespace.get(f"@{node.name}")
            try:
                for arg in node.args:
                    value = self.annotation_value(arg.value, env)
                    if arg.name is None:
                        args.append(value)
                    else:
                        kwargs[arg.name] = value
                if declared is not None and node.name not in ANNOTATION_BY_NAME:
                    user.append(user_annotation(declared, args, kwargs))
                    continue
                attr = make_annotation(node.name, args, kwargs)
                if isinstance(attr, RecipeAttr):
                    self.check_recipe(attr, node, namespace)
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
            f"declared recipes: {', '.join(recipes)}" if recipes else "declare it: recipe NAME: with key: value entries")
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
        if recipes:
            self.model.attributes["recipes"] = DictionaryAttr(recipes)
        nodes = [a for stmt in top.body if isinstance(stmt, ast.AnnotationStmt) for a in stmt.annotations]
        builtin, user = split_user(self.annotations(nodes, self.config_values, namespace))
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

    # ------------------------------------------------------------------ forward
    def forward_of(self, decl: ast.Decl) -> ast.Section:
        """The one ``forward:`` section of a declaration (E001 when absent or repeated)."""
        sections = decl.sections("forward")
        if len(sections) != 1:
            problem = "has no forward: section" if not sections else "has more than one forward: section"
            self.sink.error("E001", f"{decl.kind} {decl.name} {problem}", decl.span)
            raise LoweringFailed()
        return sections[0]

    def lower_forward(self, instance: Instance) -> ForwardResult:
        forward = self.forward_of(instance.decl)
        inputs, outputs = self.signature(forward, instance.env)
        func = FuncOp("forward", [t for _, t, _ in inputs], [], kind="forward")
        self.model.body.block.add_op(located(func, forward.span))
        self.block = func.body.block
        scope = Scope(self.sink)
        optional = self.optional_inputs.get(id(forward), set())
        for (name, _, span), arg in zip(inputs, func.body.block.args):
            arg.name_hint = name
            scope.define(name, arg, span, "optional" if name in optional else "input")
        for name, span in self.failed_inputs.get(id(forward), []):
            scope.define(name, None, span, "poisoned")  # reported; its uses stay quiet
        _record_input_memory(func, instance.decl, [name for name, _, _ in inputs])
        results = self.run_graph(instance, forward, scope, outputs)
        self.block.add_op(ReturnOp(*results))
        func.function_type = type(func.function_type).from_lists(
            [t for _, t, _ in inputs], [r.type for r in results]
        )
        skipped = _gradient_skipped(forward)
        return ForwardResult(
            [ForwardInput(n, t, s, n in skipped) for n, t, s in inputs],
            [(n, r.type, s) for (n, _, s), r in zip(outputs, results)],
            scope,
        )

    def signature(self, forward: ast.Section, env: ConstEnv) -> tuple[list, list]:
        """(name, type, span) of the tensor inputs and of the outputs.

        ``B: int`` inputs are sizes (symbols bound at specialization), not tensors;
        ``[..]?`` inputs are optional (a caller may leave trailing ones out); an
        unnamed tuple type ``([..], [..])`` declares ``out_0, out_1, ...`` (which
        ``-> out`` binds together); ``scalar`` is a rank-0 tensor of any dtype."""
        inputs: list[tuple[str, TensorType, Span]] = []
        outputs: list[tuple[str, TensorType | None, Span]] = []
        optional: set[str] = set()
        tuples: dict[str, int] = {}
        for entry in forward.body:
            if not isinstance(entry, ast.Section) or entry.name not in ("in", "inputs", "out", "outputs"):
                continue
            is_input = entry.name in ("in", "inputs")
            for bad in unnamed_entries(entry):
                self.sink.error("E001", "a signature entry is `name: [shape]`", bad.key.span,
                                "name the tensor with a plain name")
            entries = typed_entries(entry)
            if not is_input:
                tuples.update((e.name, len(e.type.items)) for e in entries if isinstance(e.type, ast.TupleExpr))
            for name, expr, span in _expand_tuples(entries):
                if isinstance(expr, ast.Optional_):
                    expr = expr.base
                    optional.add(name)
                try:
                    if is_input and _scalar_name(expr) is not None:
                        self.scalar_input(name, expr, env)
                    elif is_input:
                        inputs.append((name, self.tensor_type(expr, env), span))
                    else:
                        scalar = _scalar_name(expr) == "scalar"
                        outputs.append((name, SCALAR if scalar else self.tensor_type(expr, env), span))
                        if not scalar and not _has_dtype(expr):
                            self.untyped_outputs.add((id(forward), name))
                except LoweringFailed:
                    if is_input:
                        self.failed_inputs.setdefault(id(forward), []).append((name, span))
                    continue
        self.optional_inputs[id(forward)] = optional
        self.tuple_outputs[id(forward)] = tuples
        return inputs, outputs or [("out", None, forward.span)]

    def scalar_input(self, name: str, expr: ast.Name, env: ConstEnv) -> None:
        """``B: int`` in a signature: a size, bound like B in ``[B, T, C]`` at specialization."""
        if expr.id != "int":
            self.sink.error("E003", f"input '{name}' is a {expr.id}; a graph input is a tensor or an int size",
                            expr.span, "pass the value as a parameter of the module instead")
            raise LoweringFailed()
        if not env.lookup(name)[0]:
            env.values[name] = Expr.sym(name)

    def run_graph(self, instance: Instance, forward: ast.Section, scope: Scope,
                  outputs: list[tuple[str, TensorType | None, Span]]) -> list[SSAValue]:
        graph = _only([s for s in forward.body if isinstance(s, ast.Section) and s.name == "graph"])
        if graph is None:
            self.sink.error("E001", f"the forward of {instance.decl.name} has no graph: section", forward.span)
            raise LoweringFailed()
        self.graph_outputs.append(self.tuple_outputs.get(id(forward), {}))
        try:
            self.run_statements(instance, graph.body, scope)
        finally:
            self.graph_outputs.pop()
        results = []
        for name, declared, span in outputs:
            binding = scope.lookup(name, span)
            if binding is None or binding.kind == "poisoned":
                raise LoweringFailed()
            if binding.kind == "none":
                self.sink.error("E003", f"output '{name}' is an optional input that this call leaves out (None)", span)
                raise LoweringFailed()
            value = binding.value
            if declared is not None:
                untyped = (id(forward), name) in self.untyped_outputs
                value = self.check_declared(name, declared, value, span, untyped)
            results.append(value)
        self.keep_outputs_unlisted(results)
        return results

    def keep_outputs_unlisted(self, results: list[SSAValue]) -> None:
        """A module's outputs are its consumers' to save or recompute: its ``save:`` list, which
        leaves them out, does not make them ``recompute`` (spec 7.2.1: "only save input and output")."""
        for value in results:
            owner = value.owner
            if not isinstance(owner, Operation) or (owner, value.index) not in self.unlisted:
                continue
            self.unlisted.discard((owner, value.index))
            if "memory" not in owner.attributes:  # recorded only where every result was named
                continue
            modes = [a.data for a in owner.attributes["memory"].data]
            modes[value.index] = "auto"
            if all(m == "auto" for m in modes):
                del owner.attributes["memory"]
            else:
                owner.attributes["memory"] = ArrayAttr([StringAttr(m) for m in modes])

    def check_declared(self, name: str, declared: TensorType, value: SSAValue, span: Span,
                       untyped: bool = False) -> SSAValue:
        """The graph's value for a declared output must have the declared type (E003,
        E004). Between bf16, fp16 and fp32 the cast rules of spec 7.4.4 insert an
        explicit cast: widening silently, narrowing with W005. An output written
        without a dtype defaults to bf16 as an activation (spec 3.3); integer and
        boolean results (indices, masks) keep their dtype."""
        actual = value.type
        if untyped and declared is not SCALAR and not actual.dtype.is_float:
            declared = declared.with_dtype(actual.dtype)
        if declared is SCALAR:
            if actual.rank != 0:
                self.sink.error("E004", f"output '{name}' is declared scalar but the graph computes {actual}", span,
                                "reduce it to a scalar, e.g. reduce_sum(dims=[...]) over every dimension")
            return value
        try:
            check_same_shape(f"output '{name}'", declared, actual)
        except VerifyException as err:
            self.sink.error("E004", f"{err}: declared {declared}, computed {actual}", span)
        if declared.dtype == actual.dtype:
            return value
        implicit = {DType.BF16, DType.FP16, DType.FP32}
        if {declared.dtype, actual.dtype} <= implicit:
            if declared.dtype.bits < actual.dtype.bits:
                self.sink.warning("W005", f"output '{name}' narrows {actual.dtype.value} to {declared.dtype.value}",
                                  span, "declare the wider dtype, or cast explicitly with cast(dtype=...)")
            cast = CastOp.make([value], [actual.with_dtype(declared.dtype)])
            cast.results[0].name_hint = name
            self.block.add_op(cast)
            return cast.results[0]
        self.sink.error("E003", f"output '{name}' is declared {declared.dtype.value} but the graph computes "
                        f"{actual.dtype.value}", span,
                        "this conversion is not implicit (spec 7.4.4): use @precision/@scaling or an explicit cast")
        return value

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

    def graph_env(self, instance: Instance, scope: Scope) -> ConstEnv:
        """The instance's constants, knowing which names are tensors and sizes (E016). An
        optional input is known at compile time to be given or not: ``if bias:`` tests that."""
        env = instance.env.child()
        env.tensors = set(scope.visible_names()) | {n for n, p in instance.params.items() if isinstance(p, ParamSlot)}
        env.sizes = _shape_symbols(scope)
        for name in scope.visible_names():
            binding = scope.find(name)
            if binding.kind in ("none", "optional"):
                env.values[name] = binding.kind == "optional"
        return env

    def chosen(self, node: ast.Expr, env: ConstEnv) -> ast.Expr:
        """The branch of an inline conditional ``a if cond else b`` (spec 5.8) its guard picks
        (a guard: integer config values at their configured values)."""
        while isinstance(node, ast.Conditional):
            taken = self.guard(node.condition, env)
            if taken is None:
                raise LoweringFailed()  # reported
            node = node.then if taken else node.orelse
        return node

    def chosen_args(self, args: list[ast.Arg], instance: Instance, scope: Scope) -> list[ast.Arg]:
        return [replace(a, value=self.chosen(a.value, self.graph_env(instance, scope)))
                if isinstance(a.value, ast.Conditional) else a for a in args]

    def gradient_targets(self, destination: ast.Expr) -> list[TensorType] | None:
        """In a backward graph, the types of the required gradients a flow ends in (all of its
        targets must be ones), for a primitive whose shape rule cannot tell them."""
        if self.backward is None:
            return None
        names = destination.items if isinstance(destination, ast.TupleExpr) else [destination]
        names = [_unannotated(n) for n in names]
        types = [self.backward.gradient_types.get(n.id) if isinstance(n, ast.Name) else None for n in names]
        return None if None in types else types

    def run_flow(self, instance: Instance, flow: ast.Flow, scope: Scope) -> None:
        if not self.check_recompute_inputs(flow, scope):
            raise LoweringFailed()
        before = self.block.last_op
        values = self.source(instance, flow.chain[0], scope)
        last_ops: list[Operation] = []
        stages = flow.chain[1:-1]
        for index, stage in enumerate(stages):
            if index:
                values = values[:_primary_outputs(last_ops, values)]
            self.result_types_hint = self.gradient_targets(flow.chain[-1]) if index == len(stages) - 1 else None
            stage_annotations = stage.annotations if isinstance(stage, ast.Annotated) else []
            try:
                values, last_ops = self.apply(instance, _unannotated(stage), values, scope)
            finally:
                self.result_types_hint = None
            if stage_annotations and last_ops:  # x -> blocks() @partition(0) -> y: on that stage's op
                self.attach_annotations(last_ops[-1], stage_annotations, instance)
        self.bind(flow.chain[-1], values, scope, last_ops, flow)
        annotations = self.attach_annotations(last_ops[-1] if last_ops else None, flow.annotations, instance)
        self.check_flow_annotations(instance, flow, annotations, self.performed_since(before))
        if last_ops and self.backward is None:
            self.record_memory_policy(instance, flow.chain[-1], last_ops[-1], annotations)
            self.mark_checkpoint_region(before, annotations)

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

    def attach_annotations(self, op: Operation | None, nodes: list[ast.Annotation],
                           instance: Instance) -> list[Attribute]:
        """Add the annotations ``nodes`` to ``op`` (when there is one); the built-in ones."""
        annotations, user = split_user(self.annotations(nodes, instance.env, instance.namespace))
        if op is not None:
            _add_annotations(op, "annotations", annotations)
            _add_annotations(op, "user_annotations", user)
            kernel = next((n for n in nodes if n.name == "kernel"), None)
            if kernel is not None and lookup_primitive(op.name.removeprefix("mdsl.graph.")) is not None:
                check_kernel_annotation(op, kernel.span, self.sink)  # E043 or W012 (spec 7.5.3)
        return annotations

    def check_derived_backward(self, instance: Instance, forward: ForwardResult) -> None:
        """W003 (spec 5.12.6): a module whose backward is derived and whose save: list leaves
        out an intermediate tensor of its graph that a derived gradient reads and that is
        more than a view of kept tensors (the derived backward then recomputes it)."""
        decl = instance.decl
        saved = _tensor_list(decl, "save")
        if decl.sections("backward") or not saved:
            return  # a written backward, or no save: list to judge (autodiff chooses)
        patterns = saved + _tensor_list(decl, "recompute")
        named = {b.value: (n, b) for n, b in forward.scope.names.items() if isinstance(b.value, SSAValue)}
        kept = {v for v, (n, b) in named.items() if b.kind in ("input", "optional") or _matches(n, patterns)}
        warned: set[SSAValue] = set()
        for op in self.block.ops:
            for value in read_by_gradient(op):
                if value in kept or value in warned or value not in named or cheap_to_recompute(value, kept):
                    continue
                warned.add(value)
                tensor, binding = named[value]
                primitive = op.name.removeprefix("mdsl.graph.")
                self.sink.warning("W003", f"the derived backward reads '{tensor}' (for the gradient of {primitive}), "
                                  "which save: does not list, so it recomputes it", binding.span,
                                  f"add it: save: [{', '.join([*saved, tensor])}], or list it in recompute:")

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

    def check_flow_annotations(self, instance: Instance, flow: ast.Flow, annotations: list[Attribute],
                               performed: list[str]) -> None:
        """E013 for a fusion the flow cannot perform, E025 for a checkpoint across stages."""
        for attr in annotations:
            if isinstance(attr, (FuseAttr, FuseRequiredAttr)):
                problem = fusion_problem(attr.values["pattern"], attr.values["ops"], performed)
                if problem is not None:
                    node = next(a for a in flow.annotations if a.name == attr.dsl_name)
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
                stages.setdefault(marked, f"'{_unannotated(stage).span.text}'")
        for name in stage_names([_unannotated(s) for s in flow.chain]):
            declared = declared_partition(instance.decl, name)
            if declared is not None:
                stages.setdefault(declared, f"'{name}'")
        if len(stages) > 1:
            where = ", ".join(f"{who} in stage {stage}" for stage, who in sorted(stages.items()))
            self.sink.error("E025", f"the @checkpoint region spans pipeline stages ({where})", flow.span,
                            "checkpoint each stage on its own: split the flow at the stage boundary")

    def record_memory_policy(self, instance: Instance, destination: ast.Expr, op: Operation,
                             annotations: list[Attribute]) -> None:
        """The memory mode of each named result by the precedence ladder of spec 7.2.0,
        as ``memory = [...]`` on the op (``auto`` where only the default rule applies,
        which ``mdsl-recompute`` decides once it knows what the backward needs). A module
        with a ``save:`` list saves what it lists: the intermediate tensors it leaves out are
        recomputed (spec 7.2.1: ``save: [in]``, "only save input and output; recompute
        intermediates"; W003 says so), its outputs are left to its consumers."""
        names = destination.items if isinstance(destination, ast.TupleExpr) else [destination]
        save, recompute = _tensor_list(instance.decl, "save"), _tensor_list(instance.decl, "recompute")
        modes = []
        for target in names:
            target = target.value if isinstance(target, ast.Annotated) else target
            name = target.id if isinstance(target, ast.Name) else "_"
            listed, unlisted = _matches(name, save), save and not _matches(name, save + recompute)
            policy = effective_memory_policy(
                name, annotations=[a for a in annotations if isinstance(a, AnnotationAttr)],
                save=[name] if listed else [],
                recompute=[name] if _matches(name, recompute) or unlisted else [],
            )
            if unlisted and policy.source == "recompute_list":
                self.unlisted.add((op, len(modes)))
            modes.append(policy.mode if policy.source != "default" else "auto")
        if len(modes) == len(op.results) and any(m != "auto" for m in modes):
            op.attributes["memory"] = ArrayAttr([StringAttr(m) for m in modes])

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
        if _names_failed_param(node, instance, scope):
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
                return found.value
            param = instance.params.get(node.id)
            if isinstance(param, ParamSlot):
                return self.read_param(param)
            if not self.forward_tensor_misused(node.id, node.span):
                scope.lookup(node.id, node.span)
            raise LoweringFailed()
        if isinstance(node, ast.Attribute) and _is_saved(node):
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

    def bind(self, node: ast.Expr, values: list[SSAValue], scope: Scope, ops: list[Operation], flow: ast.Flow) -> None:
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
        for target, value in zip(names, values):
            if isinstance(target, ast.Annotated):
                target = target.value
            if not isinstance(target, ast.Name):
                self.sink.error("E001", "a flow ends in a name or a tuple of names", target.span)
                raise LoweringFailed()
            previous = scope.find(target.id) if accumulating else None
            if previous is not None and previous.kind != "poisoned":
                scope.rebind(target.id, self.accumulate_into(target.id, previous.value, value, target.span))
                continue
            if target.id != "_" and (value.owner in ops or value.name_hint is None):
                value.name_hint = target.id
            scope.define(target.id, value, target.span)

    # ------------------------------------------------------------------ operations
    def apply(self, instance: Instance, stage: ast.Expr, inputs: list[SSAValue],
              scope: Scope) -> tuple[list[SSAValue], list[Operation]]:
        """One stage of a flow: a module instance, a module call or a primitive."""
        if isinstance(stage, ast.ListExpr):
            return self.assert_type(stage, inputs, instance.env), []
        func, args = (stage.func, stage.args) if isinstance(stage, ast.Call) else (stage, [])
        func = _qualified(func, instance.namespace)
        if _names_failed_param(func, instance, scope):
            raise LoweringFailed()  # its declaration was refused and reported
        if isinstance(func, ast.Index) and isinstance(func.base, ast.Name) \
                and isinstance(instance.params.get(func.base.id), StackedInstance):
            stacked = instance.params[func.base.id]
            results = self.call_stack(stacked, inputs, stage.span, self.layer_range(func, stacked, instance.env))
            return results, [results[0].owner] if results else []
        if isinstance(func, ast.Name):
            primitive = lookup_primitive(func.id)
            param = instance.params.get(func.id)
            if isinstance(param, (Instance, StackedInstance)):
                return self.call_instance(param, inputs, args, instance, scope, stage.span)
            if func.id in instance.namespace and instance.namespace[func.id].kind != "primitive":
                child = self.instantiate_call(func, args, instance, scope)
                return self.call_instance(child, inputs, [], instance, scope, stage.span)
            if primitive is not None:
                return self.call_primitive(primitive, inputs, args, instance, scope, stage.span)
        name = func.id if isinstance(func, ast.Name) else func.span.text
        found = std_module_declaring(name) if isinstance(func, ast.Name) else None
        hint = f"import it: from {found} import {name}" if found else \
            "primitives are listed in spec section 6; modules must be declared or imported"
        self.sink.error("E014", f"unknown primitive or module '{name}'", func.span, hint)
        raise LoweringFailed()

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
        if len(stated) != len(computed) or any(
                (a is STAR) != (b is STAR) or a is not STAR and Expr.of(a) != Expr.of(b) for a, b in zip(stated, computed)):
            self.sink.error("E004", f"the value is {inputs[0].type}, not the stated {declared}", stage.span)
            raise LoweringFailed()
        if _has_dtype(stage) and declared.dtype != inputs[0].type.dtype:
            self.sink.error("E003", f"the value is {inputs[0].type.dtype.value}, not {declared.dtype.value}", stage.span)
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
        flags = {p.name for p in (decl.params or []) if _type_name(p) == "bool"} if decl is not None else set()
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

    # ------------------------------------------------------------------ modules with a written backward
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
        func = FuncOp(f"{name}_forward", types, [], kind="helper")
        outer_block, outer_refs, outer_values = self.block, self.param_refs, [s.value for s in slots]
        self.block, self.param_refs = func.body.block, {}
        args = list(func.body.block.args)
        param_names = [s.path.removeprefix(target.prefix).replace(".", "_") for s in slots]
        for slot, arg, param in zip(slots, args[len(inner_inputs):], param_names):
            slot.value = arg
            arg.name_hint = param
        scope = Scope(self.sink)
        for (n, declared, s), arg in zip(inner_inputs, args):
            arg.name_hint = n
            self.define_input(scope, n, arg, declared, s)
        self.active.append(target.decl.name)
        self.in_module_func += 1
        try:
            results = self.run_graph(target, forward, scope, outputs)
            skipped = _gradient_skipped(forward)
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
        func = FuncOp(name, types, [], kind="block")
        outer_block, outer_refs = self.block, self.param_refs
        self.block, self.param_refs = func.body.block, {}
        args = list(func.body.block.args)
        for slot, arg in zip(slots, args[len(inner_inputs):]):
            slot.value = arg
            arg.name_hint = slot.path.removeprefix(body.prefix).replace(".", "_")
        scope = Scope(self.sink)
        for (n, _, s), arg in zip(inner_inputs, args):
            arg.name_hint = n
            scope.define(n, arg, s, "input")
        _record_input_memory(func, body.decl, [n for n, _, _ in inner_inputs])
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

    def is_tensor(self, node: ast.Expr, instance: Instance, scope: Scope) -> bool:
        if _names_failed_param(node, instance, scope):
            return True  # reading it fails quietly
        if isinstance(node, ast.Name):
            return scope.find(node.id) is not None or isinstance(instance.params.get(node.id), ParamSlot)
        return isinstance(node, ast.Attribute) and isinstance(node.base, ast.Name) and (
            _is_saved(node) or isinstance(instance.params.get(node.base.id), Instance)
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

    def call_primitive(self, sig: PrimitiveSignature, inputs: list[SSAValue], args: list[ast.Arg],
                       instance: Instance, scope: Scope, span: Span) -> tuple[list[SSAValue], list[Operation]]:
        """One primitive op: tensor arguments are operands, the others its parameters."""
        operands = list(inputs)
        args = self.chosen_args(args, instance, scope)
        params: dict[str, Any] = {}
        spans: dict[str, Span] = {}
        positional_params = [*INFERENCE_PARAMS.get(sig.name, ()), *(p.name for p in sig.params)]
        keyword_tensors: dict[str, SSAValue] = {}
        env: ConstEnv | None = None  # the graph's constants, built for the first parameter
        for arg in args:
            if _dtype_typo(arg.value, instance.env) and not self.is_tensor(arg.value, instance, scope):
                self.unknown_dtype(arg.value)  # cast(dtype=fp31)
            if arg.name is None and self.is_tensor(arg.value, instance, scope):
                operands.append(self.tensor(instance, arg.value, scope))
            elif arg.name is None and isinstance(arg.value, ast.Name) and not instance.env.lookup(arg.value.id)[0]:
                scope.lookup(arg.value.id, arg.value.span)  # reports E002 with a suggestion
                raise LoweringFailed()
            elif arg.name is None:
                remaining = [p for p in positional_params if p not in params]
                if not remaining:
                    self.sink.error("E012", f"too many arguments to {sig.name}", arg.span)
                    raise LoweringFailed()
                env = env if env is not None else self.graph_env(instance, scope)
                params[remaining[0]] = self.param_value(arg.value, env)
                spans[remaining[0]] = arg.span
            elif arg.name in {slot.name for slot in sig.keyword_inputs}:
                if not isinstance(arg.value, ast.NoneLit):  # a tensor parameter (alibi_slopes=slopes)
                    keyword_tensors[arg.name] = self.tensor(instance, arg.value, scope)
            else:
                if arg.name == "dim" and "dims" in positional_params and "dim" not in positional_params:
                    arg = replace(arg, name="dims", value=ast.ListExpr(arg.value.span, [arg.value]))  # dim=2 is dims=[2]
                if arg.name not in positional_params:
                    known = ", ".join(positional_params) or "none"
                    self.sink.error("E012", f"{sig.name} has no parameter '{arg.name}'", arg.span,
                                    f"its parameters are: {known}")
                    raise LoweringFailed()
                env = env if env is not None else self.graph_env(instance, scope)
                params[arg.name] = self.param_value(arg.value, env)
                spans[arg.name] = arg.span
        operands += [keyword_tensors[slot.name] for slot in sig.keyword_inputs if slot.name in keyword_tensors]
        width = self.star_width.get(operands[0]) if operands and sig.name in STAR_REDUCTIONS else None
        if width is not None and ("dims" in params or "dim" in params):
            try:
                params = star_reduction(params, len(operands[0].type.shape) - width + 1, len(operands[0].type.shape))
            except ValueError as err:
                self.sink.error("E004", f"{sig.name}: {err}", span)
                raise LoweringFailed() from None
        op = self.emit_primitive(sig, operands, params, span, spans)
        return list(op.results), [op]

    def emit_primitive(self, sig: PrimitiveSignature, operands: list[SSAValue], params: dict[str, Any],
                       span: Span, spans: dict[str, Span] | None = None) -> Operation:
        """Add one primitive op with its parameters as attributes (E003 for a bad value)."""
        attrs = {}
        for name, value in params.items():
            spec = sig.param(name)
            if spec is None:
                continue
            params[name] = value = spec.python_value(value)
            try:
                attrs[name] = spec.to_attribute(value)
            except ValueError as err:
                self.sink.error("E003", f"{sig.name}({name}=...): {err}", (spans or {}).get(name, span))
                raise LoweringFailed() from None
        op = self.build_primitive(sig, operands, params, attrs, span)
        self.block.add_op(located(op, span))
        return op

    # ------------------------------------------------------------------ indexing (spec 5.11.4)
    def indexed(self, instance: Instance, node: ast.Index, scope: Scope) -> SSAValue:
        """``x[i]``, ``x[:, a:b]``, ``x[..., -1]``: views of ``x`` (a ``split`` per sliced
        axis, then a ``view`` that drops the indexed axes). Bounds are ConstExprs."""
        value = self.indexed(instance, node.base, scope) if isinstance(node.base, ast.Index) \
            else self.tensor(instance, node.base, scope)
        shape = list(value.type.shape)
        if any(d is STAR for d in shape):
            self.sink.error("E004", "a tensor with '*' dimensions cannot be indexed", node.span)
            raise LoweringFailed()
        subscripts = self.expand_ellipsis(node, len(shape))
        dropped: list[int] = []
        for axis, sub in enumerate(subscripts):
            if sub is None or isinstance(sub, ast.Slice) and sub.lower is None and sub.upper is None:
                continue
            start, stop = self.index_bounds(sub, shape[axis], instance.env)
            if not isinstance(sub, ast.Slice):
                dropped.append(axis)
            value = self.split_out(value, axis, start, stop, sub.span)
        if dropped:
            kept = [d for axis, d in enumerate(value.type.shape) if axis not in dropped]
            value = self.emit_primitive(lookup_primitive("view"), [value], {"shape": kept}, node.span).results[0]
        return value

    def expand_ellipsis(self, node: ast.Index, rank: int) -> list[ast.Expr | None]:
        """One subscript per axis (None where ``...`` or the end leaves it whole)."""
        subs = list(node.subscripts)
        ellipses = [i for i, s in enumerate(subs) if isinstance(s, ast.EllipsisLit)]
        if len(ellipses) > 1:
            self.sink.error("E001", "an index holds at most one '...'", subs[ellipses[1]].span)
            raise LoweringFailed()
        if ellipses:
            at = ellipses[0]
            subs = [*subs[:at], *[None] * (rank - len(subs) + 1), *subs[at + 1:]]
        if len(subs) > rank:
            self.sink.error("E004", f"{len(subs)} subscripts for a tensor of rank {rank}", node.span)
            raise LoweringFailed()
        return subs + [None] * (rank - len(subs))

    def index_bounds(self, sub: ast.Expr, size: Expr, env: ConstEnv) -> tuple[Expr, Expr]:
        """[start, stop) of an index or slice on an axis of ``size``; negative counts from the end."""
        def bound(node: ast.Expr | None, default: Expr) -> Expr:
            if node is None:
                return default
            value = self.const(node, env, "index")
            if isinstance(value, bool) or not isinstance(value, (int, Expr)):
                self.sink.error("E004", f"an index is an integer, got {value!r}", node.span)
                raise LoweringFailed()
            return Expr.of(size) + value if isinstance(value, int) and value < 0 else Expr.of(value)

        if isinstance(sub, ast.Slice):
            start, stop = bound(sub.lower, Expr.of(0)), bound(sub.upper, Expr.of(size))
        else:
            start = bound(sub, Expr.of(0))
            stop = start + 1
        known = [b.const_value() for b in (start, stop, Expr.of(size))]
        if None not in known and not 0 <= known[0] < known[1] <= known[2]:
            self.sink.error("E004", f"index {sub.span.text} is out of range for a dimension of size {known[2]}",
                            sub.span)
            raise LoweringFailed()
        return start, stop

    def split_out(self, value: SSAValue, axis: int, start: Expr, stop: Expr, span: Span) -> SSAValue:
        """The part [start, stop) of ``value`` along ``axis`` (a ``split`` into up to three views)."""
        size = Expr.of(value.type.shape[axis])
        pieces = [(start, False), (stop - start, True), (size - stop, False)]
        pieces = [(p, mine) for p, mine in pieces if mine or p.const_value() != 0]
        if len(pieces) == 1:
            return value
        op = self.emit_primitive(lookup_primitive("split"), [value],
                                 {"sizes": [p for p, _ in pieces], "dim": axis}, span)
        return op.results[[mine for _, mine in pieces].index(True)]

    def build_primitive(self, sig: PrimitiveSignature, operands: list[SSAValue], params: dict[str, Any],
                        attrs: dict[str, Attribute], span: Span, promoted: bool = False) -> Operation:
        """The op with inferred result types, verified. Float operands of different
        dtypes are promoted to the widest one (spec 7.4.4) when the op needs one dtype."""
        try:
            try:
                results = infer_result_types(sig.name, [v.type for v in operands], params)
            except InferenceError:
                hint = self.result_types_hint
                if hint is None or len(hint) != len(sig.outputs) or any(s.variadic for s in sig.outputs):
                    raise
                results = hint  # the declared gradients the flow ends in (add_backward -> (d_a, d_b))
            grouped = sig.group_operands(operands)
        except (InferenceError, ValueError) as err:
            self.sink.error("E004", f"{sig.name}: {err}", span)
            raise LoweringFailed() from None
        op = sig.op.make(grouped, sig.group_results(results), attrs)
        try:
            op.verify_()
        except DTypeMismatch as err:
            widened = None if promoted else self.promote_floats(operands)
            if widened is not None:
                return self.build_primitive(sig, widened, params, attrs, span, promoted=True)
            self.sink.error(err.code, f"{sig.name}: {err}", span,
                            "bf16, fp16, fp32 and fp8 operands are promoted to the widest; other mixes need a cast")
            raise LoweringFailed() from None
        except VerifyException as err:
            self.sink.error(getattr(err, "code", "E004"), f"{sig.name}: {err}", span, _shapes_hint(sig.name, operands))
            raise LoweringFailed() from None
        return op

    def promote_floats(self, operands: list[SSAValue]) -> list[SSAValue] | None:
        """Float operands cast to the widest of their dtypes (two 16-bit kinds meet
        at fp32); None when there is nothing to promote."""
        dtypes = {v.type.dtype for v in operands if v.type.dtype.is_float}
        if len(dtypes) < 2 or any(d.bits > 32 for d in dtypes):
            return None
        widest = max(dtypes, key=lambda d: d.bits)
        if sum(d.bits == widest.bits for d in dtypes) > 1:
            widest = DType.FP32
        promoted = []
        for value in operands:
            if value.type.dtype.is_float and value.type.dtype != widest:
                cast = CastOp.make([value], [value.type.with_dtype(widest)])
                self.block.add_op(cast)
                value = cast.results[0]
            promoted.append(value)
        return promoted

    def require_configured(self, node: ast.Expr, env: ConstEnv) -> None:
        """E026 naming the parameters without a value that a number computed now needs."""
        try:
            evaluate(node, env)
            return
        except (NotConstant, ConstError):
            pass
        unset = sorted(n for n in expression_names(node) if isinstance(env.lookup(n)[1], Expr))
        if unset:
            names = ", ".join(f"'{n}'" for n in unset)
            self.sink.error("E026", f"'{node.span.text}' needs the value of {names}, which has no default here",
                            node.span, "give the parameter a default (d_head: int = 64) or a configured value")
            raise LoweringFailed()

    def param_value(self, node: ast.Expr, env: ConstEnv) -> Any:
        """A primitive's parameter: an enum word, a list of sizes, or a ConstExpr."""
        if isinstance(node, ast.Name) and not env.lookup(node.id)[0]:
            return node.id  # enum values (NT, silu) and dtypes
        if isinstance(node, ast.ListExpr):
            return [self.dim(item, env) if not isinstance(item, ast.Star) else STAR for item in node.items]
        try:
            evaluate(node, env)
        except NotConstant:
            env = self.concretized(env, node)  # a float of integer config values: 1.0 / sqrt(d_head)
            self.require_configured(node, env)
        except ConstError:
            pass  # reported by const() below
        value = self.const(node, env)
        if isinstance(value, Expr):
            self.baked |= value.symbols() & self.concrete.keys()
            value = _concretize(value, self.concrete)  # attributes take the configured value
        return value


# ----------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------

SCALAR = TensorType([], DEFAULT_DTYPE)  # ``out: scalar``: compared by identity, any dtype
SCALAR_TYPES = ("int", "float", "bool", "string", "scalar")


def _add_annotations(op: Operation, key: str, annotations: list[Attribute]) -> None:
    """Append to an op's annotations (a mid-chain stage's and the flow's may meet on one op)."""
    if annotations:
        existing = op.attributes.get(key)
        op.attributes[key] = ArrayAttr([*(existing.data if isinstance(existing, ArrayAttr) else ()), *annotations])


def _unannotated(stage: ast.Expr) -> ast.Expr:
    return stage.value if isinstance(stage, ast.Annotated) else stage


def split_user(annotations: list[Attribute]) -> tuple[list[Attribute], list[Attribute]]:
    """Built-in annotations (typed attributes) apart from uses of declared ones (dictionaries)."""
    return ([a for a in annotations if not isinstance(a, DictionaryAttr)],
            [a for a in annotations if isinstance(a, DictionaryAttr)])


def _qualified(func: ast.Expr, namespace: dict[str, ast.Decl]) -> ast.Expr:
    """``models.llama.Attention`` as the name the resolver registered it under."""
    path = qualified_path(func) if isinstance(func, ast.Attribute) else None
    dotted = ".".join(path) if path else None
    return ast.Name(func.span, dotted) if dotted in namespace else func


def _absent_discards(names: list[ast.Expr], values: list[SSAValue], ops: list[Operation]) -> list[ast.Expr]:
    """``-> (out, _)``: trailing ``_`` may stand for optional outputs the op does not produce."""
    sig = lookup_primitive(ops[-1].name.removeprefix("mdsl.graph.")) if ops else None
    limit = len(sig.outputs) if sig is not None else len(values)
    while len(names) > len(values) and len(names) <= limit and _is_discard(names[-1]):
        names = names[:-1]
    return names


def _is_discard(node: ast.Expr) -> bool:
    return isinstance(node, ast.Name) and node.id == "_"


def _dtype_typo(node: ast.Expr, env: ConstEnv) -> bool:
    """A name spelled like a dtype (fp31) that is neither a dtype nor a known value."""
    return isinstance(node, ast.Name) and node.id not in DTYPE_SPELLINGS and bool(DTYPE_LIKE.match(node.id)) \
        and not env.lookup(node.id)[0]


def _has_dtype(expr: ast.Expr) -> bool:
    """Whether a tensor type names its dtype (``[B, T, int32]``)."""
    return isinstance(expr, ast.ListExpr) and bool(expr.items) and isinstance(expr.items[-1], ast.Name) \
        and expr.items[-1].id in DTYPE_SPELLINGS


def _scalar_name(expr: ast.Expr) -> str | None:
    return expr.id if isinstance(expr, ast.Name) and expr.id in SCALAR_TYPES else None


def _expand_tuples(entries) -> list[tuple[str, ast.Expr, Span]]:
    """``out: ([..], [..])``: one entry per element, named ``out_0``, ``out_1``, ..."""
    expanded = []
    for entry in entries:
        if isinstance(entry.type, ast.TupleExpr):
            expanded += [(f"{entry.name}_{i}", item, item.span) for i, item in enumerate(entry.type.items)]
        else:
            expanded.append((entry.name, entry.type, entry.span))
    return expanded


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


def _hf_key(node: ast.Expr) -> str:
    """An hf_* entry's key: its path as written, or the text of a quoted one (a path pattern such as
    ``"groups[{layer}].local_{k}.mlp.down_weight"``, which is no expression)."""
    return node.value if isinstance(node, ast.Str) else source_text(node)


def _holds_stack(instance: Instance) -> bool:
    return any(isinstance(p, StackedInstance) or isinstance(p, Instance) and _holds_stack(p)
               for p in instance.params.values())


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


def _concretize(value: Expr, concrete: dict[str, int]) -> Any:
    """A symbolic value with configured integers substituted (an int when fully known)."""
    result = value.subs(concrete)
    known = result.const_value()
    return known if known is not None else result


def _is_saved(node: ast.Attribute) -> bool:
    return isinstance(node.base, ast.Name) and node.base.id == "saved"


def _gradient_skipped(forward: ast.Section) -> set[str]:
    """Inputs annotated ``@gradient(skip)``."""
    return {
        entry.name
        for section in forward.body
        if isinstance(section, ast.Section) and section.name in ("in", "inputs")
        for entry in typed_entries(section)
        if any(a.name == "gradient" and any(arg.name in (None, "mode") and isinstance(arg.value, ast.Name)
                                            and arg.value.id == "skip" for arg in a.args)
               for a in entry.annotations)
    }


def _shapes_hint(primitive: str, operands: Sequence[SSAValue]) -> str:
    hint = "operand types: " + ", ".join(str(v.type).removeprefix("!mdsl.graph.tensor") for v in operands)
    if primitive in ("matmul", "batched_matmul"):
        hint += ("; transpose modes follow spec 6.1.1 (NT is A @ B^T), so a linear layer x @ W^T "
                 "with W: [out, in] is matmul(W, transpose=NT)")
    return hint


def _only(items: list):
    return items[0] if len(items) == 1 else None


def _type_name(param: ast.Param) -> str | None:
    return param.type.id if isinstance(param.type, ast.Name) else None


def _free_names(node: ast.Expr) -> list[str]:
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Binary):
        return _free_names(node.lhs) + _free_names(node.rhs)
    if isinstance(node, ast.Unary):
        return _free_names(node.operand)
    return []


def report_placeholders(decl: ast.Decl, sink: DiagnosticSink) -> None:
    """E001 for each place the source leaves out (``...`` as a section body, ``name...``
    in a ``save:`` list); the ``...`` of a graph is reported when the graph runs."""
    def visit(section: ast.Section) -> None:
        if section.name == "graph":
            return
        for stmt in section.body:
            if ast.is_placeholder(stmt):
                sink.error("E001", f"this {section.name or 'section'}: section is left incomplete ('...')", stmt.span,
                           "write it out; '...' is a placeholder for code that is left out")
            elif isinstance(stmt, ast.Section):
                visit(stmt)
        if section.name in ("save", "recompute") and section.value is not None:
            items = section.value.expr.items if isinstance(section.value.expr, ast.ListExpr) else []
            for item in items:
                if isinstance(item, ast.Splat):
                    sink.error("E001", f"this {section.name}: list is left incomplete ('{source_text(item)}')",
                               item.span, "name each tensor, or use a wildcard pattern such as ln*_out")

    for stmt in decl.body:
        if isinstance(stmt, ast.Section):
            visit(stmt)


def _shape_symbols(scope: Scope) -> set[str]:
    """The dimension symbols in the types of the tensors a scope sees."""
    symbols: set[str] = set()
    for name in scope.visible_names():
        found = scope.find(name)
        if found is not None and isinstance(found.value, SSAValue) and isinstance(found.value.type, TensorType):
            for dim in found.value.type.shape:
                if isinstance(dim, Expr):
                    symbols |= dim.symbols()
    return symbols


def _names_failed_param(node: ast.Expr, instance: Instance, scope: Scope) -> bool:
    """``p`` or ``p.weight`` where parameter ``p`` was refused (and no graph value is named ``p``)."""
    base = node.base if isinstance(node, ast.Attribute) else node
    return isinstance(base, ast.Name) and base.id in instance.failed and scope.find(base.id) is None


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


def _tensor_list(decl: ast.Decl, name: str) -> list[str]:
    """The names (or wildcard patterns such as ``ln*_out``) of a forward ``save:`` or ``recompute:`` list."""
    return [pattern for pattern, _ in _listed(decl, name)]


def _record_input_memory(func: FuncOp, decl: ast.Decl, names: list[str]) -> None:
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


def _poison(node: ast.Expr, scope: Scope) -> None:
    """Mark the names a failed flow would have defined, so their uses stay quiet."""
    for target in node.items if isinstance(node, ast.TupleExpr) else [node]:
        if isinstance(target, ast.Name) and scope.find(target.id) is None:
            scope.define(target.id, None, target.span, "poisoned")


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


def choose_top(program: ast.Program, top: str | None = None, sink: DiagnosticSink | None = None) -> ast.Decl:
    """The named declaration, else the program's one model (else its last module or block)."""
    decls = [d for d in program.declarations if d.kind in LOWERABLE]
    if top is not None:
        chosen = next((d for d in decls if d.name == top), None)
    else:
        models = [d for d in decls if d.kind == "model"]
        chosen = models[0] if len(models) == 1 else (decls[-1] if not models and decls else None)
    if chosen is None:
        sink = sink if sink is not None else DiagnosticSink()
        other = next((d for d in program.declarations if d.name == top), None) if top else None
        if other is not None:
            sink.error("E002", f"'{top}' is a {other.kind} declaration, which does not lower", other.span.word(top),
                       "name a model, module or block")
            raise DiagnosticError(sink.diagnostics)
        start = Span(program.source, 1, 1, 1, 2)
        names = ", ".join(d.name for d in decls)
        sink.error("E002", f"no declaration named '{top}'" if top else "no model to lower", start,
                   f"the declarations here are: {names}" if decls else "declare a model, module or block")
        raise DiagnosticError(sink.diagnostics)
    return chosen


def lower_program(program: ast.Program, top: str | None = None, config: dict[str, Any] | None = None,
                  sink: DiagnosticSink | None = None) -> ModuleOp:
    """Lower the model (or the named declaration) of a program; DiagnosticError on any
    error. Warnings are left in ``sink`` when one is given."""
    sink = sink if sink is not None else DiagnosticSink()
    if top is None and program.declarations and not any(d.kind in LOWERABLE for d in program.declarations):
        resolve_program(program, sink)  # only primitive or recipe declarations: check them
        sink.raise_if_errors()
        return ModuleOp([])
    chosen = choose_top(program, top, sink)
    resolved = resolve_program(program, sink)
    try:
        module = Lowering(program, sink, resolved).lower(chosen, config)
    except LoweringFailed:
        module = None
    sink.raise_if_errors()
    return module
