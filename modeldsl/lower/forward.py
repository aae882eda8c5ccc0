"""A declaration's ``forward:`` section: its signature (tensor inputs, ``int`` sizes,
optional inputs, tuple outputs, ``scalar``) and the graph that computes its outputs, each
checked against its declared type (with the implicit casts of spec 7.4.4).
"""

from __future__ import annotations

from xdsl.dialects.builtin import DictionaryAttr
from xdsl.ir import Attribute, SSAValue
from xdsl.utils.exceptions import VerifyException

from modeldsl.diagnostics import Span
from modeldsl.dialects.annotations import GradientAttr
from modeldsl.dialects.dtypes import DType
from modeldsl.dialects.graph import FuncOp, ReturnOp
from modeldsl.dialects.graph_primitives import CastOp, check_same_shape
from modeldsl.dialects.graph_types import TensorType
from modeldsl.frontend.text import ast
from modeldsl.instances import (
    Instance,
    LoweringFailed,
    typed_entries,
    unnamed_entries,
)
from modeldsl.ir import located, located_argument
from modeldsl.lower.annotations import record_input_memory
from modeldsl.lower.backward import ForwardInput, ForwardResult
from modeldsl.lower.tensor_types import SCALAR, has_dtype, scalar_name
from modeldsl.resolve.consts import ConstEnv
from modeldsl.resolve.scope import Scope
from modeldsl.symbolic import Expr


class ForwardMixin:
    """Forward: the ``@forward`` function and the graphs of inlined instances."""

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
            located_argument(arg, span)
            scope.define(name, arg, span, "optional" if name in optional else "input")
        for name, span in self.failed_inputs.get(id(forward), []):
            scope.define(name, None, span, "poisoned")  # reported; its uses stay quiet
        record_input_memory(func, instance.decl, [name for name, _, _ in inputs])
        self.record_input_gradients(func, forward, [name for name, _, _ in inputs], instance)
        results = self.run_graph(instance, forward, scope, outputs)
        self.block.add_op(ReturnOp(*results))
        func.function_type = type(func.function_type).from_lists(
            [t for _, t, _ in inputs], [r.type for r in results]
        )
        skipped = gradient_skipped(forward)
        return ForwardResult(
            [ForwardInput(n, t, s, n in skipped) for n, t, s in inputs],
            [(n, r.type, s) for (n, _, s), r in zip(outputs, results)],
            scope,
        )

    def record_input_gradients(self, func: FuncOp, forward: ast.Section, names: list[str], instance: Instance) -> None:
        """``in: (x: [B, d], mask: [B] @gradient(skip))``: each input's ``@gradient`` (spec 5.12.2, 7.8.3)
        as ``input_gradients = {mask = #mdsl.graph.gradient<skip>}`` on the function, which
        ``mdsl-autodiff`` applies to the input's gradient (E008 for a bad one)."""
        found: dict[str, Attribute] = {}
        for section in forward.body:
            if not isinstance(section, ast.Section) or section.name not in ("in", "inputs"):
                continue
            for entry in typed_entries(section):
                nodes = [a for a in entry.annotations if a.name == "gradient"]
                if nodes and entry.name in names:
                    attrs = [a for a in self.annotations(nodes, instance.env, instance.namespace)
                             if isinstance(a, GradientAttr)]
                    if attrs:
                        found[entry.name] = attrs[0]
        if found:
            func.attributes["input_gradients"] = DictionaryAttr(found)

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
                    if is_input and scalar_name(expr) is not None:
                        self.scalar_input(name, expr, env)
                    elif is_input:
                        inputs.append((name, self.tensor_type(expr, env), span))
                    else:
                        scalar = scalar_name(expr) == "scalar"
                        outputs.append((name, SCALAR if scalar else self.tensor_type(expr, env), span))
                        if not scalar and not has_dtype(expr):
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
        self.check_listed_tensors(instance, scope)
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

    def check_declared(self, name: str, declared: TensorType, value: SSAValue, span: Span,
                       untyped: bool = False) -> SSAValue:
        """The graph's value for a declared output must have the declared type (E003,
        E004). Between bf16, fp16 and fp32 the cast rules of spec 7.4.4 insert an
        explicit cast: widening silently, narrowing with W005. An output written
        without a dtype defaults to bf16 as an activation (spec 3.3); integer and
        boolean results (indices, masks) keep their dtype."""
        actual = value.type
        if untyped and declared is not SCALAR and (not actual.dtype.is_float or self.keeps_annotated_dtype(value)):
            declared = declared.with_dtype(actual.dtype)  # an index, a mask, a value @dtype made
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


def _expand_tuples(entries) -> list[tuple[str, ast.Expr, Span]]:
    """``out: ([..], [..])``: one entry per element, named ``out_0``, ``out_1``, ..."""
    expanded = []
    for entry in entries:
        if isinstance(entry.type, ast.TupleExpr):
            expanded += [(f"{entry.name}_{i}", item, item.span) for i, item in enumerate(entry.type.items)]
        else:
            expanded.append((entry.name, entry.type, entry.span))
    return expanded


def _only(items: list):
    return items[0] if len(items) == 1 else None


def gradient_skipped(forward: ast.Section) -> set[str]:
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
