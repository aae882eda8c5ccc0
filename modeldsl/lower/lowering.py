"""The lowering: one :class:`Lowering` per program, composed of one mixin per responsibility,
and the entry points :func:`lower_program` and :func:`choose_top`.

The mixins share the lowering's state, which :meth:`Lowering.__init__` sets up: the
diagnostic sink, the model op being built, the block ops are added to, the parameter
references and the bookkeeping of instances, stacks and called modules.
"""

from __future__ import annotations

from typing import Any

from xdsl.dialects.builtin import ArrayAttr, ModuleOp, StringAttr
from xdsl.ir import Block, Operation, SSAValue

from modeldsl.diagnostics import DiagnosticError, DiagnosticSink, Span
from modeldsl.dialects.graph import FuncOp, ModelOp
from modeldsl.dialects.graph_types import TensorType
from modeldsl.frontend.text import ast
from modeldsl.instances import Instance, LoweringFailed, source_text
from modeldsl.invariants import graph_problems, invariants_attribute
from modeldsl.ir import located
from modeldsl.lower.aliasing import AliasingMixin
from modeldsl.lower.annotations import AnnotationsMixin
from modeldsl.lower.backward import BackwardLowering
from modeldsl.lower.called_modules import CalledModulesMixin, ModuleFuncs
from modeldsl.lower.calls import CallsMixin
from modeldsl.lower.constants import ConstantsMixin
from modeldsl.lower.dtypes import DtypesMixin
from modeldsl.lower.emit import EmitMixin
from modeldsl.lower.flows import FlowsMixin
from modeldsl.lower.forward import ForwardMixin
from modeldsl.lower.hf_sections import HfSectionsMixin
from modeldsl.lower.indexing import IndexingMixin
from modeldsl.lower.params import ParamsMixin
from modeldsl.lower.stacks import StacksMixin
from modeldsl.lower.tensor_types import TensorTypesMixin
from modeldsl.primitives import lookup_primitive
from modeldsl.resolve.consts import ConstEnv
from modeldsl.resolve.imports import ResolvedProgram, resolve_program
from modeldsl.resolve.invariants import forward_slots, invariants_of, written_invariants

LOWERABLE = ("module", "block", "model")  # declarations that lower to mdsl.graph


class Lowering(HfSectionsMixin, ConstantsMixin, TensorTypesMixin, ParamsMixin, AnnotationsMixin, ForwardMixin,
               FlowsMixin, CallsMixin, CalledModulesMixin, StacksMixin, IndexingMixin, EmitMixin, BackwardLowering,
               DtypesMixin, AliasingMixin):
    """Lowers the declarations of one program, one top declaration per :meth:`lower`."""

    def __init__(self, program: ast.Program, sink: DiagnosticSink, resolved: ResolvedProgram | None = None):
        self.program = program
        self.sink = sink
        self.resolved = resolved
        self.decls = resolved.decls if resolved is not None else {d.name: d for d in program.declarations}
        self.model: ModelOp | None = None
        self.block: Block | None = None
        self.param_refs: dict[str, SSAValue] = {}
        self.active: list[str] = []  # declarations being instantiated, outermost first
        self.inherited: list[tuple[list, list]] = []  # (built-in, user) annotations of the enclosing instances
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
        self.checked_lists: set[str] = set()  # save:/recompute: entries reported (an instance lowers many times)
        self.inert_reported: set[tuple[str, int, int]] = set()  # where a W013 was reported (file, line, column)
        self.retyped: dict[SSAValue, TensorType] = {}  # a value @dtype cast -> the type its consumers read

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
        self.keep_invariants(namespace)
        self.check_derived_backward(instance, forward)
        self.lower_backward(instance, forward)
        self.model.body.block.add_ops(self.helpers)
        if self.baked:
            self.model.attributes["baked"] = ArrayAttr([StringAttr(n) for n in sorted(self.baked)])
        return ModuleOp([self.model])

    def keep_invariants(self, namespace: dict[str, ast.Decl]) -> None:
        """The ``invariants:`` of the visible primitive declarations whose ops the model runs, kept on
        the model op (spec 9.8.3, :mod:`modeldsl.invariants`), and E006 where the gradient the
        compiler derives for such an op does not read what the invariant names."""
        used = {op.name.removeprefix("mdsl.graph.") for root in (self.model, *self.helpers) for op in root.walk()}
        kept: dict[str, tuple[dict[str, list[str]], Span | None]] = {}
        spans: dict[tuple[str, str], Span] = {}  # (primitive, slot) -> the tensor's name in the invariant
        for decl in namespace.values():
            sig = lookup_primitive(decl.name) if decl.kind == "primitive" and decl.name in used else None
            found = invariants_of(decl, sig) if sig is not None else {}
            if found:
                written, slots = written_invariants(decl), forward_slots(decl, sig)
                kept[decl.name] = (found, written[0].span if written else None)
                spans.update({(decl.name, slots[n]): span for w in written for n, span in w.tensors if n in slots})
        if not kept:
            return
        self.model.attributes["invariants"] = invariants_attribute(kept)
        for problem in graph_problems(self.model, spans):
            self.sink.add(problem)


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
