"""Emitting primitives: a call's tensor arguments become operands and the others its
parameters (attributes, or only for shape inference: the ``inference_params`` of the
primitive's record in :mod:`modeldsl.prims`); result types
are inferred, float operands promoted to the widest dtype, the op verified.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from xdsl.ir import Attribute, Operation, SSAValue
from xdsl.utils.exceptions import VerifyException

from modeldsl.diagnostics import Span
from modeldsl.dialects.dtypes import DType
from modeldsl.dialects.graph_primitives import CastOp, DTypeMismatch
from modeldsl.frontend.text import ast
from modeldsl.infer import InferenceError, infer_result_types
from modeldsl.instances import (
    Instance,
    LoweringFailed,
)
from modeldsl.ir import located
from modeldsl.lower.constants import concretize
from modeldsl.lower.tensor_types import dtype_typo
from modeldsl.primitives import STAR_REDUCTIONS, PrimitiveSignature, star_reduction
from modeldsl.prims import entry
from modeldsl.resolve.consts import ConstEnv, ConstError, NotConstant, evaluate, symbolic
from modeldsl.resolve.order import expression_names
from modeldsl.resolve.scope import Scope
from modeldsl.symbolic import STAR, Expr


class EmitMixin:
    """Emission: primitive calls as typed, verified ``mdsl.graph`` ops."""

    def call_primitive(self, sig: PrimitiveSignature, inputs: list[SSAValue], args: list[ast.Arg],
                       instance: Instance, scope: Scope, span: Span) -> tuple[list[SSAValue], list[Operation]]:
        """One primitive op: tensor arguments are operands, the others its parameters."""
        operands = list(inputs)
        args = self.chosen_args(args, instance, scope)
        params: dict[str, Any] = {}
        spans: dict[str, Span] = {}
        positional_params = [*entry(sig.name).inference_params, *(p.name for p in sig.params)]
        keyword_tensors: dict[str, SSAValue] = {}
        env: ConstEnv | None = None  # the graph's constants, built for the first parameter
        for arg in args:
            if dtype_typo(arg.value, instance.env) and not self.is_tensor(arg.value, instance, scope):
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
                    # dim=2 is dims=[2]
                    arg = replace(arg, name="dims", value=ast.ListExpr(arg.value.span, [arg.value]))
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
        op = sig.make(grouped, sig.group_results(results), attrs)
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

    def symbolic_param(self, node: ast.Expr, env: ConstEnv) -> Any:
        """A parameter computed from integers without a value yet (a module parameter without a
        default, a tensor size): its expression, which becomes a ``#mdsl.graph.sym`` attribute
        that mdsl-specialize evaluates (``scale(1.0 / sqrt(d_head))``, ``scale(1.0 / (B * T))``)."""
        try:
            return symbolic(node, env, "parameter")
        except NotConstant:
            self.sink.error("E026", f"the parameter '{node.span.text}' is not known at compile time", node.span,
                            "parameters are numbers computed from literals, parameters and sizes")
        except ConstError as err:
            self.sink.error(err.code, err.message, err.span, err.hint)
        raise LoweringFailed()

    def param_value(self, node: ast.Expr, env: ConstEnv) -> Any:
        """A primitive's parameter: an enum word, a list of sizes, or a ConstExpr (symbolic where it
        reads integers that have no value yet)."""
        if isinstance(node, ast.Name) and not env.lookup(node.id)[0] and node.id not in env.sizes:
            return node.id  # enum values (NT, silu) and dtypes
        if isinstance(node, ast.ListExpr):
            return [self.dim(item, env) if not isinstance(item, ast.Star) else STAR for item in node.items]
        try:
            evaluate(node, env)
        except NotConstant:
            env = self.concretized(env, node)  # a float of integer config values: 1.0 / sqrt(d_head)
            try:
                evaluate(node, env)
            except NotConstant:
                return self.symbolic_param(node, env)  # ... of which some have no value here
            except ConstError:
                pass  # reported by const() below
        except ConstError:
            if expression_names(node) & env.sizes:  # reads a tensor size: 1.0 / (B * T)
                return self.symbolic_param(node, self.concretized(env, node))
        value = self.const(node, env)
        if isinstance(value, Expr):
            self.baked |= value.symbols() & self.concrete.keys()
            value = concretize(value, self.concrete)  # attributes take the configured value
        return value


def _shapes_hint(primitive: str, operands: Sequence[SSAValue]) -> str:
    hint = "operand types: " + ", ".join(str(v.type).removeprefix("!mdsl.graph.tensor") for v in operands)
    if primitive in ("matmul", "batched_matmul"):
        hint += ("; transpose modes follow spec 6.1.1 (NT is A @ B^T), so a linear layer x @ W^T "
                 "with W: [out, in] is matmul(W, transpose=NT)")
    return hint
