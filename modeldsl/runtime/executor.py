"""The numpy reference executor of ``mdsl.graph`` functions.

It interprets a model's functions op by op with the reference kernels of
:mod:`modeldsl.kernels.reference` (fp32 accumulation; fp64 when fed fp64),
storing every value in the dtype its type declares — or, with
``float_dtype``, every bf16/fp16 value in that dtype instead (fp32 runs of a
bf16 model). Symbolic dimensions (``B``, ``T``) are bound from the shapes of
the arguments at each call, so one lowered model serves prompts of any
length; a specialized model simply has nothing left to bind.

``mdsl.graph.stack`` runs its block body once per layer with that layer's
slice of the stacked parameters. ``dropout`` draws its mask as the schedule
executors do: keyed with the layers of the stacks around it and the step
counter (its ``step`` operand, else the executor's ``rng_step``); with
``training`` every op runs as a training step runs it (dropout active), so the
forward a finite difference takes is the one a derived gradient differentiates. A :class:`KVCache` turns every attention
op into incremental decoding: its keys and values are appended to the
cache of that op and layer, and the queries attend to everything cached.
It carries the state of every recurrent op (Mamba's conv and scan, when the
op takes no state operand of its own) from one step to the next the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import ml_dtypes
import numpy as np
from xdsl.dialects.builtin import DenseArrayBase, FloatAttr, IntegerAttr, ModuleOp, StringAttr
from xdsl.ir import Attribute, Operation, SSAValue

from modeldsl.dialects.dtypes import DType
from modeldsl.dialects.graph import CallOp, CustomOp, FuncOp, ModelOp, ParamRefOp, ReturnOp, StackOp
from modeldsl.dialects.graph_types import DimsAttr, SymbolicAttr, TensorType
from modeldsl.primitives import (
    STAR_REDUCTIONS,
    PrimitiveSignature,
    builtin_primitives,
    signature_of_op,
    star_reduction,
)
from modeldsl.prims import registry
from modeldsl.runtime.threads import blas_threads
from modeldsl.symbolic import STAR, Expr, SymbolicError

NUMPY_DTYPES: dict[DType, np.dtype] = {
    DType.BF16: np.dtype(ml_dtypes.bfloat16),
    DType.FP16: np.dtype(np.float16),
    DType.FP32: np.dtype(np.float32),
    DType.FP8_E4M3: np.dtype(ml_dtypes.float8_e4m3fn),
    DType.FP8_E5M2: np.dtype(ml_dtypes.float8_e5m2),
    DType.FP4_E2M1: np.dtype(ml_dtypes.float4_e2m1fn),
    DType.INT8: np.dtype(np.int8),
    DType.INT32: np.dtype(np.int32),
    DType.INT64: np.dtype(np.int64),
    DType.BOOL: np.dtype(np.bool_),
}
SHAPE_KEYWORDS = {"view", "zeros", "ones", "fill", "embedding_backward", "reduce_max_backward"}
DTYPE_KEYWORDS = {"zeros", "ones", "fill", "cast"}
# kernels told the shape of each of their results (``shapes``): the operands do not give them
SHAPES_KEYWORDS = {"add_backward"}



class ExecutionError(Exception):
    """An argument or an op the executor cannot run (with the op's name)."""


@dataclass
class KVCache:
    """Keys and values of every attention op and layer seen so far, each in its op's layout
    (positions along axis -2 in ``bhtd``, axis 1 in ``bthd``)."""

    entries: dict[tuple[int, int | None], tuple[np.ndarray, np.ndarray, int]] = field(default_factory=dict)
    # recurrent ops (Mamba's conv and scan): their state after the positions seen, and how many
    states: dict[tuple[int, int | None], tuple[np.ndarray, int]] = field(default_factory=dict)

    @property
    def length(self) -> int:
        """Positions cached (the same for every attention and recurrent op)."""
        kv = (k.shape[axis] for k, _, axis in self.entries.values())
        return next(kv, next((seen for _, seen in self.states.values()), 0))

    def state(self, key: tuple[int, int | None]) -> np.ndarray | None:
        """The recurrent state of an op and layer (None before the first step)."""
        held = self.states.get(key)
        return None if held is None else held[0]

    def carry(self, key: tuple[int, int | None], state: np.ndarray, steps: int) -> None:
        seen = self.states[key][1] if key in self.states else 0
        self.states[key] = (state, seen + steps)

    def extend(self, key: tuple[int, int | None], k: np.ndarray, v: np.ndarray,
               layout: str = "bhtd") -> tuple[np.ndarray, np.ndarray]:
        axis = 1 if layout == "bthd" else -2
        if key in self.entries:
            old_k, old_v, _ = self.entries[key]
            k, v = np.concatenate([old_k, k], axis=axis), np.concatenate([old_v, v], axis=axis)
        self.entries[key] = (k, v, axis)
        return k, v


RECURRENT = ("mamba_conv1d", "mamba_selective_scan")  # their last operand is the optional carried state
KEYED = ("dropout",)  # keyed by the layers around them and the step counter (their optional last operand)


@lru_cache(maxsize=1)
def _signatures_by_op() -> dict[str, PrimitiveSignature]:
    return {sig.op.name: sig for sig in builtin_primitives().values()}


@dataclass
class Frame:
    values: dict[SSAValue, np.ndarray]
    layer: int | None = None
    layers: tuple[int, ...] = ()  # the layer of every enclosing stack, outermost first


class GraphExecutor:
    """Runs the functions of one model on numpy arrays."""

    def __init__(self, module: ModuleOp | ModelOp, weights: dict[str, np.ndarray],
                 float_dtype: np.dtype | None = None, training: bool = False, rng_step: int = 0):
        self.model = module if isinstance(module, ModelOp) else next(
            op for op in module.walk() if isinstance(op, ModelOp))
        self.funcs = {op.sym_name.data: op for op in self.model.body.block.ops if isinstance(op, FuncOp)}
        self.weights = weights
        self.float_dtype = None if float_dtype is None else np.dtype(float_dtype)
        self.symbols: dict[str, int] = {}
        self.cache: KVCache | None = None
        self.observers: list[Callable[[Operation, list[np.ndarray]], None]] = []
        self.training = training  # run every op with the attributes a training step sets (dropout's training)
        self.rng_step = rng_step  # the step counter of dropout ops without a step operand

    # ------------------------------------------------------------------ entry
    def run(self, name: str, *args: np.ndarray, cache: KVCache | None = None) -> list[np.ndarray]:
        func = self.funcs.get(name)
        if func is None:
            raise ExecutionError(f"the model has no function @{name}")
        self.symbols = {}
        self.cache = cache
        for arg, value in zip(func.body.block.args, args, strict=True):
            self.bind(arg.type, value, arg.name_hint or "argument")
        with blas_threads(1):  # the oracle runs small models: one thread never waits on a busy machine
            return self.call(func, list(args), None, ())

    def bind(self, ttype: TensorType, value: np.ndarray, what: str) -> None:
        """Bind the symbols of ``ttype`` from the shape of ``value`` (and check the rest)."""
        shape = [d for d in ttype.shape if d is not STAR]
        if ttype.is_variadic or len(shape) != value.ndim:
            if not ttype.is_variadic:
                raise ExecutionError(f"{what}: expected rank {len(shape)} ({ttype}), got shape {value.shape}")
            return
        for dim, size in zip(shape, value.shape):
            free = dim.symbols() - self.symbols.keys()
            if len(free) == 1 and dim == Expr.sym(next(iter(free))):
                self.symbols[next(iter(free))] = int(size)
            elif not free and dim.evaluate(self.symbols) != size:
                raise ExecutionError(f"{what}: expected shape {ttype}, got {value.shape} "
                                     f"(with {self.symbols})")

    def call(self, func: FuncOp, args: Sequence[np.ndarray], layer: int | None,
             layers: tuple[int, ...] = ()) -> list[np.ndarray]:
        frame = Frame(dict(zip(func.body.block.args, args)), layer, layers)
        for op in func.body.block.ops:
            if isinstance(op, ReturnOp):
                return [frame.values[v] for v in op.values]
            results = self.execute(op, frame)
            for result, value in zip(op.results, results, strict=True):
                frame.values[result] = value
            for observe in self.observers:
                observe(op, results)
        raise ExecutionError(f"@{func.sym_name.data} has no return")

    # ------------------------------------------------------------------ ops
    def execute(self, op: Operation, frame: Frame) -> list[np.ndarray]:
        if isinstance(op, ParamRefOp):
            return [self.weights[op.param.root_reference.data]]
        if isinstance(op, StackOp):
            return self.run_stack(op, frame)
        if isinstance(op, CallOp):
            return self.call(self.funcs[op.callee.root_reference.data], [frame.values[v] for v in op.arguments],
                             frame.layer, frame.layers)
        sig = signature_of_op(op) if isinstance(op, CustomOp) else _signatures_by_op().get(op.name)
        if sig is None:
            raise ExecutionError(f"the reference executor cannot run {op.name}" + (
                f" \"{op.primitive}\" (no primitive of that name is registered)" if isinstance(op, CustomOp) else ""))
        inputs = self.operands(op, sig, frame)
        params = self.parameters(op, sig)
        if sig.name in STAR_REDUCTIONS and op.operands[0].type.is_variadic:
            try:
                params = star_reduction(params, len(op.operands[0].type.shape), np.ndim(inputs[0]))
            except ValueError as err:
                raise ExecutionError(str(err)) from None
        if sig.name == "flash_attention" and self.cache is not None:
            k, v = self.cache.extend((id(op), frame.layer), inputs[1], inputs[2], params.get("layout", "bhtd"))
            inputs = [inputs[0], k, v, *inputs[3:]]
        if sig.name in KEYED:  # as the schedule runs it: the enclosing layers, the step counter
            params["layers"] = list(frame.layers)
            if inputs[-1] is None:
                inputs[-1] = np.array([self.rng_step], dtype=np.int64)
        if sig.name in RECURRENT and self.cache is not None and inputs[-1] is None:
            return self.recur(op, sig, frame, inputs, params)
        out = sig.reference(*inputs, **params)
        outs = list(out) if isinstance(out, tuple) else [out]
        return [self.store(value, result.type) for value, result in zip(outs, op.results, strict=True)]

    def recur(self, op: Operation, sig: PrimitiveSignature, frame: Frame, inputs: list[np.ndarray | None],
              params: dict[str, Any]) -> list[np.ndarray]:
        """A recurrent op (no state operand of its own) decoding with the cache: it starts from the
        state its op and layer left there and leaves the state after these steps."""
        key = (id(op), frame.layer)
        assert self.cache is not None
        state = self.cache.state(key)
        if state is None and sig.name == "mamba_conv1d":  # the conv returns its state when given one
            x = inputs[0]
            state = np.zeros((*np.shape(x)[:2], params.get("kernel_size", 4) - 1), np.float32)
        y, state = sig.reference(*inputs[:-1], state, **params)
        self.cache.carry(key, state, np.shape(inputs[0])[-1])
        outs = [y, state][:len(op.results)]
        return [self.store(value, result.type) for value, result in zip(outs, op.results, strict=True)]

    def run_stack(self, op: StackOp, frame: Frame) -> list[np.ndarray]:
        body = self.funcs[op.body.root_reference.data]
        carried = [frame.values[v] for v in op.carried]
        shared = [frame.values[v] for v in op.shared]
        stacked = [frame.values[v] for v in op.per_layer]
        count = op.count.data.evaluate(self.symbols)
        collected = [np.empty(self.shape_of(r.type), self.numpy_dtype(r.type.dtype)) for r in op.collected]
        for layer in reversed(range(count)) if op.reverse is not None else range(count):
            results = self.call(body, [*carried, *shared, *(w[layer] for w in stacked)], layer,
                                (*frame.layers, layer))
            carried = results[:len(carried)]
            for out, value in zip(collected, results[len(carried):]):
                out[layer] = value
        return [*carried, *collected]

    def shape_of(self, ttype: TensorType) -> tuple[int, ...]:
        return tuple(d.evaluate(self.symbols) for d in ttype.shape)

    def operands(self, op: Operation, sig: PrimitiveSignature, frame: Frame) -> list[np.ndarray | None]:
        if isinstance(op, CustomOp):  # a user primitive: its operands are its inputs in order
            return [frame.values[v] for v in op.operands]
        inputs: list[np.ndarray | None] = []
        for slot in sig.inputs:
            value = getattr(op, slot.name)
            if slot.variadic:
                inputs.extend(frame.values[v] for v in value)
            else:
                inputs.append(None if value is None else frame.values[value])
        return inputs

    def parameters(self, op: Operation, sig: PrimitiveSignature) -> dict[str, Any]:
        params = {p.name: attribute_value(op.attributes[p.name], p.kind, self.symbols) for p in sig.params
                  if p.name in op.attributes}
        if self.training:
            record = registry().get(type(op))
            for name, value in (record.training.items() if record is not None else ()):
                params[name] = attribute_value(value, sig.param(name).kind)
        result = op.results[0].type
        if sig.name in SHAPE_KEYWORDS:
            params["shape"] = tuple(d.evaluate(self.symbols) for d in result.shape)
        if sig.name in DTYPE_KEYWORDS:
            params["dtype"] = self.numpy_dtype(result.dtype)
        if sig.name in SHAPES_KEYWORDS:
            params["shapes"] = tuple(tuple(d.evaluate(self.symbols) for d in r.type.shape) for r in op.results)
        return params

    # ------------------------------------------------------------------ storage
    def numpy_dtype(self, dtype: DType) -> np.dtype:
        """The storage of a dtype: ``float_dtype`` replaces 16-bit floats (fp32 runs of a bf16
        model), and every float when it is float64 (the finite-difference oracle)."""
        if self.float_dtype is not None and dtype.is_float and (
                dtype in (DType.BF16, DType.FP16) or self.float_dtype == np.float64):
            return self.float_dtype
        return NUMPY_DTYPES[dtype]

    def store(self, value: np.ndarray, ttype: Attribute) -> np.ndarray:
        if not isinstance(ttype, TensorType):
            return value
        return np.asarray(value).astype(self.numpy_dtype(ttype.dtype), copy=False)


def attribute_value(attr: Attribute, kind: str = "", symbols: dict[str, int] | None = None) -> Any:
    """An op attribute as a reference kernel's keyword value: an integer of kind ``bool`` (or of
    width 1) is a bool, sizes are evaluated with ``symbols``."""
    if isinstance(attr, StringAttr):
        return attr.data
    if isinstance(attr, IntegerAttr):
        is_bool = kind == "bool" or getattr(attr.type, "width", None) is not None and attr.type.width.data == 1
        return bool(attr.value.data) if is_bool else attr.value.data
    if isinstance(attr, FloatAttr):
        return attr.value.data
    if isinstance(attr, DenseArrayBase):
        return list(attr.get_values())
    if isinstance(attr, DimsAttr):
        return [d.evaluate(symbols or {}) for d in attr.data]
    if isinstance(attr, SymbolicAttr):  # 1.0 / (B * T): its sizes are bound by the arguments' shapes
        try:
            bound = attr.bind(symbols or {})
        except SymbolicError as err:
            raise ExecutionError(f"the parameter {attr.expr} has no value: {err}") from None
        if isinstance(bound, SymbolicAttr):
            raise ExecutionError(f"the parameter {attr.expr} needs {', '.join(sorted(bound.expr.symbols()))} "
                                 "bound: run mdsl-specialize first")
        return attribute_value(bound, kind)
    raise ExecutionError(f"cannot read the attribute {attr}")
