"""The record of one primitive, and the helpers its rules are written with.

A :class:`Primitive` holds everything the system knows about one ``mdsl.graph``
primitive op beyond the op class itself (whose IRDL definition already gives
the operands, results, attributes and the verifier): the result-type rule,
the VJP rule, the FLOP rule, the scratch a kernel asks the planner for, the
in-place reuse and accumulation its kernels allow, the parameters only shape
inference reads, the kinds spec 7.5.1's fusion patterns name it by, and the
attributes a training step sets on it. Its kernels (the numpy reference, the
CUDA launch plan, the fast CPU kernel) live in :mod:`modeldsl.kernels` under
the primitive's name; the record says which of them the primitive must have,
and one test (``tests/unit/test_primitive_registry.py``) checks every op
against every table.

This module imports no kernels, no numpy and no pass: the records load with
the frontend, the kernels only when a schedule runs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from xdsl.dialects.builtin import FloatAttr, IntegerAttr, StringAttr
from xdsl.ir import Attribute, Operation, SSAValue

from modeldsl.dialects.dtypes import DType
from modeldsl.dialects.graph_primitives import PrimitiveOp
from modeldsl.dialects.graph_types import DimsAttr, SymbolicAttr, TensorType

Shape = tuple[int, ...]
# (operand types, parameters) -> result types
ShapeRule = Callable[[Sequence[TensorType], dict[str, Any]], list[TensorType]]
# (builder, forward op, the gradient of each result) -> the gradient of each operand
VJPRule = Callable[[Any, Operation, list[SSAValue | None]], list[SSAValue | None]]
# (an OpShapes of modeldsl.prims.counts) -> FLOPs
FlopRule = Callable[[Any], int]
# (input shapes, output shapes, the launch's parameters) -> bytes of scratch for one launch
ScratchRule = Callable[[Sequence[Shape], Sequence[Shape], Mapping[str, Any]], int]

# How the CUDA executor runs a primitive: "kernel" (a launch plan in kernels/cuda.py), "gemm"
# (cuBLASLt), "copy" (device copies of a layout op, where lowering has not made it a view),
# "memset" (a constant), "composite" (runtime/cuda_composites.py sequences GEMMs and kernels),
# "none" (not covered: the executor reports it), "host" (a user primitive: its numpy reference on host
# copies, with a FallbackWarning, until a CUDA kernel is registered for it), "collective" (a collective
# over a process group: mdsl.sched.collective, through the process's communicator)
CUDA_KINDS = ("kernel", "gemm", "copy", "memset", "composite", "none", "host", "collective")


class InferenceError(Exception):
    """A result type that cannot be determined (the frontend reports it as E004)."""


@dataclass(frozen=True)
class Primitive:
    """Everything known about primitive op ``op`` (see the module docstring)."""

    op: type[PrimitiveOp]
    infer: ShapeRule
    flops: FlopRule
    vjp: VJPRule | None = None
    # why a forward op has no VJP rule (a backward op never has one)
    no_vjp: str = ""
    scratch: ScratchRule | None = None
    # output index -> input index whose buffer the output may reuse when that input
    # is last read by this launch (elementwise kernels read each element before writing it)
    reuse: Mapping[int, int] = field(default_factory=dict)
    # the kernel can add its result into its one output (a launch marked ``accumulate``)
    accumulates: bool = False
    # parameters that only shape inference needs (not op attributes), first in positional order
    inference_params: tuple[str, ...] = ()
    # the kinds of operation spec 7.5.1's fusion patterns name it by (``add``, ``norm``, ...)
    fusion_kinds: tuple[str, ...] = ()
    # attributes mdsl-autodiff sets on the op's forward in a training step (dropout's training=true)
    training: Mapping[str, Attribute] = field(default_factory=dict)
    cuda: str = "kernel"
    # a fast CPU kernel in kernels/cpu (numpy or compiled C); else the executor runs the reference
    cpu: bool = False
    # a user primitive's registered name (its op is the generic mdsl.graph.custom; modeldsl.prims.user)
    custom_name: str = ""

    def __post_init__(self) -> None:
        assert self.cuda in CUDA_KINDS, f"{self.name}: cuda={self.cuda!r} is not one of {CUDA_KINDS}"

    @property
    def name(self) -> str:
        """The primitive's name: the DSL's, the kernel registry's and ``mdsl.sched.launch``'s."""
        return self.custom_name or self.op.name.removeprefix("mdsl.graph.")

    def scratch_bytes(self, inputs: Sequence[Shape], outputs: Sequence[Shape],
                      params: Mapping[str, Any] | None = None) -> int:
        return 0 if self.scratch is None else int(self.scratch(inputs, outputs, params or {}))


# ----------------------------------------------------------------------------
# Shape-rule helpers
# ----------------------------------------------------------------------------

FP32 = DType.FP32
INT32 = DType.INT32


def same(*indices: int) -> ShapeRule:
    """The results have the types of the operands at ``indices``."""
    return lambda ts, p: [ts[i] for i in indices]


def rows(t: TensorType) -> TensorType:
    """The shape without the last dim, fp32 (rstd, mean, lse)."""
    return TensorType(list(t.shape[:-1]), FP32)


def half_last(t: TensorType) -> TensorType:
    """``[*, 2 F]`` -> ``[*, F]``: one half of a packed gate/up projection."""
    return t.with_shape([*t.shape[:-1], t.shape[-1] // 2])


# ----------------------------------------------------------------------------
# Attribute values
# ----------------------------------------------------------------------------


def op_attr(op: Operation, name: str, default: Any = None) -> Any:
    """A graph op's attribute as a Python value (sizes stay symbolic ``Expr``, a ``#mdsl.graph.sym`` is its
    expression); ``default`` when absent."""
    value = op.attributes.get(name)
    if value is None:
        return default
    if isinstance(value, StringAttr):
        return value.data
    if isinstance(value, FloatAttr):
        return value.value.data
    if isinstance(value, IntegerAttr):
        return bool(value.value.data) if value.type.width.data == 1 else value.value.data
    if isinstance(value, DimsAttr):
        return list(value.data)
    if isinstance(value, SymbolicAttr):  # a size expression (num_experts) or a tree (1.0 / sqrt(d_head))
        return value.value()
    return list(value.get_values())
