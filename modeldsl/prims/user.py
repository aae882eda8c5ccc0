"""User primitives: numpy functions registered as primitives, :func:`register_primitive`.

``modeldsl.register_primitive("softplus", reference=softplus, vjp=softplus_vjp)`` makes
``softplus`` a primitive like the ops': a program calls it (``x -> softplus(beta=2.0) -> y``
in the Module DSL, ``g.custom("softplus", x, beta=2.0)`` in the Python DSL, or through a
``primitive`` declaration whose ``impl:`` names it), lowering checks the call against its shape
rule, ``mdsl-autodiff`` differentiates it through its VJP, and both executors run its reference.
Every call is the generic op ``mdsl.graph.custom "softplus"`` (:mod:`modeldsl.dialects.graph_custom`),
and a schedule runs it as ``mdsl.sched.launch "softplus"``.

What the registration gives:

``reference(*inputs, **params)``
    The numpy function: its positional arguments without defaults are the tensor inputs (in
    order, by their names), its other arguments the primitive's parameters, which a call passes
    by keyword (``beta: float = 1.0``: float, int, bool, ``Literal["a", "b"]`` (an enum) or a
    list of ints, by annotation or by the default's type; one without a default is required).
    It returns one array per output (``outputs``: their number, or their names).
``shape(*inputs, **params)``
    The output types from the inputs', each a :class:`TensorSpec` (``shape``: a tuple of ints,
    or of symbolic sizes where the program has not bound them yet, ``*`` where the type is
    variadic; ``dtype``: ``"fp32"``, ``"bf16"``, ...). It returns a ``TensorSpec`` (or a
    ``(shape, dtype)`` pair, or a bare shape in the first input's dtype) per output. Without
    one, every output is typed as the first input (an elementwise primitive).
``vjp(*d_outputs, *inputs, *outputs, **params)``
    The input gradients (one array per input, ``None`` for none), given the gradient of each
    output (zeros where none flows), the inputs and the outputs. It becomes the primitive
    ``NAME_backward`` (inputs ``d_out..., in..., out...``, an output per input typed as the
    input), which the VJP rule of ``NAME`` calls. Without one, a gradient that reaches a call is
    E005 at the call.
``flops``
    FLOPs of one call: a number per output element, or ``flops(input_shapes, output_shapes,
    **params)``; none: 0 (the backward counts twice the forward's).

The records go into the primitive registry (:data:`modeldsl.prims.USER`, by name), the
signatures into :data:`modeldsl.primitives.USER_SIGNATURES`, the references into the kernel
registry's lookup and the op's verifier into :data:`modeldsl.dialects.graph_custom.CUSTOM_CHECKS`,
so every table sees them. No CUDA kernel is registered for one: the CUDA executor runs its
reference on host copies, warning once (``FallbackWarning``). A reference whose results do not
have the types its shape rule gives is E004 when it runs.

The tools read ``MDSL_PRIMITIVES``: Python modules or ``.py`` files (separated by ``,``) that
register primitives, imported before the program is read (:func:`modeldsl.primitive_modules.load_from_environment`).
"""

from __future__ import annotations

import difflib
import inspect
import math
import re
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, NamedTuple

from xdsl.ir import Attribute, Operation, SSAValue
from xdsl.utils.exceptions import VerifyException

from modeldsl.diagnostics import Diagnostic, DiagnosticError
from modeldsl.dialects.dtypes import DType
from modeldsl.dialects.graph_custom import CALLEE, CUSTOM_CHECKS, CustomOp
from modeldsl.dialects.graph_types import TensorType
from modeldsl.primitive_modules import ENVIRONMENT
from modeldsl.primitives import (
    USER_SIGNATURES,
    ParamSpec,
    PrimitiveSignature,
    TensorSlot,
    builtin_primitives,
)
from modeldsl.prims import USER, USER_REFERENCES
from modeldsl.prims.base import InferenceError, Primitive, op_attr
from modeldsl.prims.counts import OpShapes
from modeldsl.prims.grads import zeros_like
from modeldsl.symbolic import STAR, Expr, definitely_different

NUMPY_NAMES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "int8": "int8", "int32": "int32",
               "int64": "int64", "bool": "bool", "float64": "fp32"}


class TensorSpec(NamedTuple):
    """The type of a tensor as a shape rule sees it: its sizes and its dtype's spelling."""

    shape: tuple
    dtype: str


@dataclass(frozen=True)
class UserPrimitive:
    """One registration: the forward ``name`` and, with a VJP, its ``NAME_backward``."""

    name: str
    reference: Callable[..., Any]
    shape: Callable[..., Any] | None
    vjp: Callable[..., Any] | None
    flops: float | Callable[..., Any] | None
    signature: PrimitiveSignature

    @property
    def backward(self) -> str | None:
        return f"{self.name}_backward" if self.vjp is not None else None

    @property
    def qualified_name(self) -> str:
        """``module.function`` of the reference (an ``impl:`` may name it so)."""
        return f"{getattr(self.reference, '__module__', '')}.{getattr(self.reference, '__qualname__', '')}"


REGISTERED: dict[str, UserPrimitive] = {}  # the forwards, by name
REFERENCES = USER_REFERENCES  # every kernel (forwards and backwards), by name


# ----------------------------------------------------------------------------
# Registration
# ----------------------------------------------------------------------------


def register_primitive(name: str, reference: Callable[..., Any], *, shape: Callable[..., Any] | None = None,
                       vjp: Callable[..., Any] | None = None, flops: float | Callable[..., Any] | None = None,
                       outputs: int | Sequence[str] = 1) -> UserPrimitive:
    """Register the numpy function ``reference`` as the primitive ``name`` (see the module docstring);
    registering a name again replaces the user primitive of that name. TypeError or ValueError for a
    registration that cannot work (a name of a built-in primitive, a parameter without a kind)."""
    _check_name(name, vjp is not None)
    if not callable(reference) or not all(f is None or callable(f) for f in (shape, vjp)):
        raise TypeError(f"register_primitive({name!r}): reference, shape and vjp are functions")
    if flops is not None and not callable(flops) and (isinstance(flops, bool) or not isinstance(flops, (int, float))):
        raise TypeError(f"register_primitive({name!r}): flops is a number per output element or a function")
    inputs, params = _reference_signature(name, reference)
    names = _output_names(name, outputs)
    if shape is None and not inputs:
        raise TypeError(f"register_primitive({name!r}): a primitive without tensor inputs needs shape=")
    signature = PrimitiveSignature(name, CustomOp, tuple(TensorSlot(n) for n in inputs),
                                   tuple(TensorSlot(n) for n in names), params)
    unregister_primitive(name)
    prim = UserPrimitive(name, reference, shape, vjp, flops, signature)
    _install(signature, Primitive(CustomOp, _shape_rule(prim), _flop_rule(prim), _vjp_rule(prim) if vjp else None,
                                  "" if vjp else f"{name} was registered without vjp=", cuda="host",
                                  custom_name=name), _forward_kernel(prim))
    if vjp is not None:
        backward = _backward_signature(prim)
        _install(backward, Primitive(CustomOp, _backward_shape_rule(prim), _backward_flop_rule(prim), cuda="host",
                                     custom_name=backward.name), _backward_kernel(prim))
    REGISTERED[name] = prim
    return prim


def unregister_primitive(name: str) -> None:
    """Forget the user primitive ``name`` (and its backward); nothing for a name not registered."""
    prim = REGISTERED.pop(name, None)
    if prim is None:
        return
    for kernel in (name, prim.backward):
        if kernel is not None:
            for table in (USER_SIGNATURES, USER, REFERENCES, CUSTOM_CHECKS):
                table.pop(kernel, None)


def registered_primitives() -> list[str]:
    """The names of the user primitives registered in this process (forwards), in order."""
    return list(REGISTERED)


def user_reference(name: str) -> Callable[..., Any] | None:
    """The kernel registry's reference of user kernel ``name`` (a forward or a backward), if registered."""
    return REFERENCES.get(name)


def find_registered(path: str) -> UserPrimitive | None:
    """The registration an ``impl:`` names: by its registered name, or by the reference's
    ``module.function`` (or its bare function name where that is unambiguous)."""
    if path in REGISTERED:
        return REGISTERED[path]
    by_function = [p for p in REGISTERED.values() if path in (p.qualified_name, p.reference.__name__)]
    return by_function[0] if len(by_function) == 1 else None


def impl_problem(path: str, declared: str) -> Diagnostic | None:
    """None where ``impl:`` path ``path`` names a registration; else the E014 saying so (the span is the caller's)."""
    if find_registered(path) is not None:
        return None
    known = [*REGISTERED, *(p.qualified_name for p in REGISTERED.values())]
    close = difflib.get_close_matches(path, known, n=1)
    hint = (f"did you mean '{close[0]}'? " if close else "") + (
        f"register it first: modeldsl.register_primitive(\"{path.rpartition('.')[2]}\", reference=...) "
        f"(the tools import the modules named in {ENVIRONMENT})")
    return Diagnostic("E014", f"primitive {declared}: impl: names '{path}', and no Python function is registered "
                      "under that name", None, hint)




def _install(signature: PrimitiveSignature, record: Primitive, kernel: Callable[..., Any]) -> None:
    USER_SIGNATURES[signature.name] = signature
    USER[signature.name] = record
    REFERENCES[signature.name] = kernel
    CUSTOM_CHECKS[signature.name] = _op_check(signature, record)


def _check_name(name: str, backward: bool) -> None:
    if not isinstance(name, str) or not CALLEE.fullmatch(name):
        raise ValueError(f"register_primitive: {name!r} is not a primitive name (an identifier, or dotted ones)")
    from modeldsl.kernels.reference import REFERENCES as BUILTIN_KERNELS

    for taken in (name, f"{name}_backward") if backward else (name,):
        if taken in builtin_primitives() or taken in BUILTIN_KERNELS:
            raise ValueError(f"register_primitive: '{taken}' is a built-in primitive or kernel; choose another name")
        owner = next((p.name for p in REGISTERED.values() if p.backward == taken and p.name != name), None)
        if owner is not None or (taken != name and taken in REGISTERED):
            raise ValueError(f"register_primitive: '{taken}' is already registered"
                             + (f" (the backward of {owner})" if owner else ""))


def _output_names(name: str, outputs: int | Sequence[str]) -> tuple[str, ...]:
    if isinstance(outputs, int) and not isinstance(outputs, bool):
        if outputs < 1:
            raise ValueError(f"register_primitive({name!r}): outputs counts at least one output")
        return ("out",) if outputs == 1 else tuple(f"out{i}" for i in range(outputs))
    names = tuple(outputs)
    if not names or not all(isinstance(n, str) and n.isidentifier() for n in names) or len(set(names)) != len(names):
        raise ValueError(f"register_primitive({name!r}): outputs is a count or distinct identifiers")
    return names


def _reference_signature(name: str, reference: Callable[..., Any]) -> tuple[list[str], tuple[ParamSpec, ...]]:
    """The tensor inputs and parameters of a reference, read off its Python signature."""
    try:
        signature = inspect.signature(reference)
    except (TypeError, ValueError) as err:
        raise TypeError(f"register_primitive({name!r}): cannot read the reference's signature ({err})") from None
    try:
        hints = typing.get_type_hints(reference)
    except Exception:  # noqa: BLE001 - annotations that do not evaluate: judge by the defaults
        hints = {}
    inputs, params = [], []
    for p in signature.parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise TypeError(f"register_primitive({name!r}): the reference takes its tensors and parameters by name "
                            f"(no *{p.name} or **{p.name})")
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty and not params:
            inputs.append(p.name)
            continue
        params.append(_param_spec(name, p, hints.get(p.name, p.annotation)))
    return inputs, tuple(params)


def _param_spec(name: str, p: inspect.Parameter, annotation: Any) -> ParamSpec:
    required = p.default is p.empty
    default = None if required else p.default
    where = f"register_primitive({name!r}): parameter '{p.name}'"
    if typing.get_origin(annotation) is typing.Literal:
        choices = typing.get_args(annotation)
        if not choices or not all(isinstance(c, str) for c in choices):
            raise TypeError(f"{where}: an enum is Literal[\"a\", \"b\", ...] of strings")
        if not required and default not in choices:
            raise TypeError(f"{where}: the default {default!r} is not one of {', '.join(choices)}")
        return ParamSpec(p.name, "enum", default, required, tuple(choices))
    kind = _kind_of(annotation, default)
    if kind is None:
        raise TypeError(f"{where} needs a kind: annotate it float, int, bool, Literal[...] or list[int], or give a "
                        "default of that kind")
    if not required:
        try:
            ParamSpec(p.name, kind).to_attribute(float(default) if kind == "float" else default)
        except ValueError as err:
            raise TypeError(f"{where}: its default {default!r} {err}") from None
        default = float(default) if kind == "float" else list(default) if kind == "ints" else default
    return ParamSpec(p.name, kind, default, required)


def _kind_of(annotation: Any, default: Any) -> str | None:
    for kind, python in (("bool", bool), ("int", int), ("float", float)):
        if annotation is python or annotation == python.__name__:
            return kind
    origin = typing.get_origin(annotation)
    if origin in (list, tuple, Sequence) and all(a in (int, Ellipsis) for a in typing.get_args(annotation)):
        return "ints"
    if annotation not in (inspect.Parameter.empty, None):
        return None
    if isinstance(default, bool):
        return "bool"
    if isinstance(default, int):
        return "int"
    if isinstance(default, float):
        return "float"
    if isinstance(default, (list, tuple)) and all(isinstance(v, int) and not isinstance(v, bool) for v in default):
        return "ints"
    return None


def _backward_signature(prim: UserPrimitive) -> PrimitiveSignature:
    sig = prim.signature
    taken: set[str] = set()

    def fresh(text: str) -> str:
        while text in taken:
            text += "_"
        taken.add(text)
        return text

    d_outs = [fresh(f"d_{s.name}") for s in sig.outputs]
    ins = [fresh(s.name) for s in sig.inputs]
    outs = [fresh(s.name) for s in sig.outputs]
    slots = tuple(TensorSlot(n) for n in (*d_outs, *ins, *outs))
    return PrimitiveSignature(f"{prim.name}_backward", CustomOp, slots,
                              tuple(TensorSlot(f"d_{s.name}") for s in sig.inputs), sig.params)


# ----------------------------------------------------------------------------
# Shapes
# ----------------------------------------------------------------------------


def _dim(d: Any) -> Any:
    if d is STAR:
        return STAR
    return d.const_value() if isinstance(d, Expr) and d.is_const() else d


def tensor_spec(t: TensorType) -> TensorSpec:
    return TensorSpec(tuple(_dim(d) for d in t.shape), t.dtype.value)


def _dtype(value: Any, like: str | None, name: str) -> DType:
    if value is None and like is not None:
        return DType(like)
    if isinstance(value, DType):
        return value
    text = str(value)
    text = NUMPY_NAMES.get(text, text)
    try:
        return DType(text)
    except ValueError:
        raise ValueError(f"{name}'s shape rule gives the dtype {value!r}, which is none of "
                         f"{', '.join(d.value for d in DType)}") from None


def _is_dtype(value: Any) -> bool:
    return isinstance(value, (str, DType)) or type(value).__name__.startswith("dtype")


def _outputs_of(result: Any, count: int, first: str | None, name: str) -> list[TensorType]:
    """The output types a shape rule returned: TensorSpecs, (shape, dtype) pairs or bare shapes."""
    if isinstance(result, TensorSpec) or (isinstance(result, tuple) and len(result) == 2 and _is_dtype(result[1])):
        result = [result]
    elif count == 1 and isinstance(result, (list, tuple)) and all(_is_dim(d) for d in result):
        result = [result]  # a bare shape
    results = list(result) if isinstance(result, (list, tuple)) else [result]
    if len(results) != count:
        raise ValueError(f"{name}'s shape rule gives {len(results)} output(s); it has {count}")
    types = []
    for spec in results:
        if isinstance(spec, TensorSpec) or (isinstance(spec, tuple) and len(spec) == 2 and _is_dtype(spec[1])):
            shape, dtype = spec
        else:
            shape, dtype = spec, None
        if not isinstance(shape, (list, tuple)) or not all(_is_dim(d) for d in shape):
            raise ValueError(f"{name}'s shape rule gives {spec!r}, not a shape of sizes")
        types.append(TensorType([STAR if d is STAR else Expr.of(d) if not isinstance(d, Expr) else d for d in shape],
                                _dtype(dtype, first, name)))
    return types


def _is_dim(d: Any) -> bool:
    return d is STAR or isinstance(d, Expr) or (isinstance(d, int) and not isinstance(d, bool) and d >= 0)


def _full_params(sig: PrimitiveSignature, params: Mapping[str, Any]) -> dict[str, Any]:
    """The parameters of a call: the given ones, the defaults of the others."""
    full = {p.name: p.default for p in sig.params if not p.required}
    full.update({k: v for k, v in params.items() if sig.param(k) is not None})
    missing = [p.name for p in sig.params if p.required and p.name not in full]
    if missing:
        raise ValueError(f"{sig.name} requires the parameter(s) {', '.join(missing)}")
    return full


def infer_types(prim: UserPrimitive, operands: Sequence[TensorType], params: Mapping[str, Any]) -> list[TensorType]:
    """The output types of ``prim`` on operands of these types (ValueError where they do not fit)."""
    sig = prim.signature
    if len(operands) != len(sig.inputs):
        raise ValueError(f"{sig.name} takes {len(sig.inputs)} tensor input(s), got {len(operands)}")
    first = operands[0].dtype.value if operands else None
    full = _full_params(sig, params)
    if prim.shape is None:
        return [operands[0]] * len(sig.outputs)
    result = prim.shape(*(tensor_spec(t) for t in operands), **full)
    return _outputs_of(result, len(sig.outputs), first, sig.name)


def _shape_rule(prim: UserPrimitive):
    def infer(types: Sequence[TensorType], params: dict[str, Any]) -> list[TensorType]:
        try:
            return infer_types(prim, types, params)
        except InferenceError:
            raise
        except Exception as err:  # noqa: BLE001 - the user's rule: any failure is a type that does not fit
            raise InferenceError(f"{prim.name}'s shape rule: {type(err).__name__}: {err}") from None

    return infer


def _backward_shape_rule(prim: UserPrimitive):
    outs, ins = len(prim.signature.outputs), len(prim.signature.inputs)

    def infer(types: Sequence[TensorType], params: dict[str, Any]) -> list[TensorType]:
        if len(types) != 2 * outs + ins:
            raise InferenceError(f"{prim.name}_backward takes {2 * outs + ins} tensor inputs, got {len(types)}")
        return list(types[outs:outs + ins])

    return infer


def _op_params(op: Operation, sig: PrimitiveSignature) -> dict[str, Any]:
    return {p.name: op_attr(op, p.name) for p in sig.params if p.name in op.attributes}


def _op_check(sig: PrimitiveSignature, record: Primitive) -> Callable[[CustomOp], None]:
    """The verifier of an op calling ``sig``: its operands, parameters and result types."""

    def check(op: CustomOp) -> None:
        if len(op.inputs) != len(sig.inputs):
            raise VerifyException(f"{sig.name} takes {len(sig.inputs)} tensor input(s), got {len(op.inputs)}")
        missing = [p.name for p in sig.params if p.required and p.name not in op.attributes]
        if missing:
            raise VerifyException(f"{sig.name} requires the parameter(s) {', '.join(missing)}")
        for p in sig.params:
            if p.name in op.attributes:
                value = op_attr(op, p.name)
                try:
                    p.to_attribute(float(value) if p.kind == "float" and isinstance(value, int) else value)
                except (ValueError, TypeError) as err:
                    raise VerifyException(f"{sig.name}'s parameter {p.name}: {err}") from None
        try:
            expected = record.infer([v.type for v in op.inputs], _op_params(op, sig))
        except InferenceError as err:
            raise VerifyException(str(err)) from None
        if len(expected) != len(op.outputs):
            raise VerifyException(f"{sig.name} has {len(expected)} output(s), the op {len(op.outputs)}")
        for index, (want, got) in enumerate(zip(expected, (r.type for r in op.outputs))):
            if not _same_type(want, got):
                raise VerifyException(f"{sig.name}'s output {index} is {got}, but its shape rule gives {want}")

    return check


def _same_type(want: TensorType, got: Attribute) -> bool:
    if not isinstance(got, TensorType) or got.dtype != want.dtype or len(got.shape) != len(want.shape):
        return False
    return not any((a is STAR) != (b is STAR) or (a is not STAR and definitely_different(a, b))
                   for a, b in zip(want.shape, got.shape))


# ----------------------------------------------------------------------------
# FLOPs and the VJP rule
# ----------------------------------------------------------------------------


def _attr_values(attrs: Mapping[str, Attribute], sig: PrimitiveSignature) -> dict[str, Any]:
    holder = SimpleNamespace(attributes=attrs)  # what op_attr reads of an op
    return _full_params(sig, {p.name: op_attr(holder, p.name) for p in sig.params if p.name in attrs})


def _count(prim: UserPrimitive, inputs: Sequence[tuple[int, ...]], outputs: Sequence[tuple[int, ...]],
           attrs: Mapping[str, Attribute]) -> int:
    if prim.flops is None:
        return 0
    if callable(prim.flops):
        return int(prim.flops(tuple(map(tuple, inputs)), tuple(map(tuple, outputs)),
                              **_attr_values(attrs, prim.signature)))
    return round(prim.flops * sum(math.prod(o) for o in outputs))


def _flop_rule(prim: UserPrimitive):
    return lambda s: _count(prim, s.inputs, s.outputs, s.attrs)


def _backward_flop_rule(prim: UserPrimitive):
    outs, ins = len(prim.signature.outputs), len(prim.signature.inputs)

    def rule(s: OpShapes) -> int:
        return 2 * _count(prim, s.inputs[outs:outs + ins], s.inputs[outs + ins:], s.attrs)

    return rule


def _vjp_rule(prim: UserPrimitive):
    """``NAME_backward(d_outputs..., inputs..., outputs...)``: the gradient of every float input."""

    def rule(b: Any, op: Operation, grads: list[SSAValue | None]) -> list[SSAValue | None]:
        d_outputs = [g if g is not None else zeros_like(b, r) for g, r in zip(grads, op.results)]
        params = _op_params(op, prim.signature)
        results = b.op(prim.backward, *d_outputs, *op.operands, *op.results, **params)
        return [g if isinstance(x.type, TensorType) and x.type.dtype.is_float else None
                for g, x in zip(results, op.operands)]

    return rule


# ----------------------------------------------------------------------------
# Kernels: the references, checked against the shape rule
# ----------------------------------------------------------------------------


def _results(value: Any, count: int, what: str) -> list[Any]:
    results = list(value) if isinstance(value, (tuple, list)) and count > 1 else [value]
    if isinstance(value, (tuple, list)) and count == 1 and len(value) == 1:
        results = [value[0]]
    if len(results) != count:
        raise _run_error(f"{what} returned {len(results)} result(s); it has {count}")
    return results


def _run_error(message: str) -> DiagnosticError:
    return DiagnosticError([Diagnostic("E004", message, None, "make the reference agree with its shape rule "
                                       "(register_primitive(..., shape=...))")])


def _spec_of(array: Any) -> TensorSpec:
    shape = tuple(int(d) for d in getattr(array, "shape", ()))
    return TensorSpec(shape, NUMPY_NAMES.get(str(getattr(array, "dtype", "float32")), "fp32"))


def _forward_kernel(prim: UserPrimitive) -> Callable[..., Any]:
    import numpy as np

    sig = prim.signature
    count = len(sig.outputs)

    def kernel(*inputs: Any, **params: Any) -> Any:
        full = _full_params(sig, params)
        results = _results(prim.reference(*inputs, **full), count, f"{sig.name}'s reference")
        arrays = [np.asarray(r) for r in results]
        try:
            expected = infer_types(prim, [TensorType(list(_spec_of(x).shape), _spec_of(x).dtype) for x in inputs],
                                   full)
        except Exception as err:  # noqa: BLE001 - the user's shape rule on concrete shapes
            raise _run_error(f"{sig.name}'s shape rule fails on the inputs {[np.shape(x) for x in inputs]}: "
                             f"{err}") from None
        for index, (array, want) in enumerate(zip(arrays, expected)):
            shape = tuple(d.const_value() if isinstance(d, Expr) else d for d in want.shape)
            if array.shape != shape:
                raise _run_error(f"{sig.name}'s reference returned output {index} of shape {array.shape}; its shape "
                                 f"rule gives {shape}")
        return arrays[0] if count == 1 else tuple(arrays)

    kernel.__name__ = re.sub(r"\W", "_", sig.name)
    return kernel


def _backward_kernel(prim: UserPrimitive) -> Callable[..., Any]:
    import numpy as np

    sig = prim.signature
    outs, ins = len(sig.outputs), len(sig.inputs)

    def kernel(*arrays: Any, **params: Any) -> Any:
        inputs = arrays[outs:outs + ins]
        assert prim.vjp is not None
        grads = _results(prim.vjp(*arrays, **_full_params(sig, params)), ins, f"{sig.name}'s vjp")
        results = []
        for index, (grad, x) in enumerate(zip(grads, inputs)):
            if grad is None:
                results.append(np.zeros(np.shape(x), np.asarray(x).dtype))
                continue
            grad = np.asarray(grad)
            if grad.shape != np.shape(x):
                raise _run_error(f"{sig.name}'s vjp returned the gradient of input {index} of shape {grad.shape}; "
                                 f"the input is {np.shape(x)}")
            results.append(grad)
        return results[0] if ins == 1 else tuple(results)

    kernel.__name__ = re.sub(r"\W", "_", f"{sig.name}_backward")
    return kernel


__all__ = ["TensorSpec", "UserPrimitive", "find_registered", "impl_problem", "infer_types",
           "register_primitive", "registered_primitives", "tensor_spec",
           "unregister_primitive", "user_reference"]
