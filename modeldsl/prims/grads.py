"""Helpers the VJP rules of the primitive families are written with.

A VJP rule takes a :class:`~modeldsl.graph_builder.GraphBuilder`, the forward
op and the gradient of each of its results (None where no gradient flows, e.g.
to ``rstd``) and returns the gradient of each operand (None for operands that
get none: token ids, labels, RoPE tables are not differentiated). Rules reuse
the primitives' explicit ``*_backward`` ops where the spec has one (spec
section 6), so the kernels that run a derived backward are those a written
backward calls. :func:`checked` wraps every rule of the registry: a gradient
that reaches a statistic result (``rstd``, ``mean``, ``lse``) is refused, not
dropped.
"""

from __future__ import annotations

import functools
from typing import Any

from xdsl.ir import Operation, SSAValue

from modeldsl.dialects.graph_types import TensorType
from modeldsl.primitives import STATISTICS, lookup_primitive
from modeldsl.prims.base import VJPRule, op_attr

Grad = SSAValue | None


def checked(fn: VJPRule) -> VJPRule:
    """``fn``, refusing a gradient of a statistic result first."""

    @functools.wraps(fn)
    def rule(b: Any, op: Operation, grads: list[Grad]) -> list[Grad]:
        refuse_statistics_gradients(op, grads)
        return fn(b, op, grads)

    return rule


def refuse_statistics_gradients(op: Operation, grads: list[Grad]) -> None:
    """The rules differentiate an op's primary results only: a gradient reaching a statistic
    (``rstd``, ``mean``, ``lse``: a function that returns it, or uses it) is refused, not dropped."""
    sig = lookup_primitive(op.name.removeprefix("mdsl.graph."))
    if sig is None or len(sig.outputs) != len(grads):
        return
    for slot, grad in zip(sig.outputs, grads):
        if grad is not None and slot.name in STATISTICS:
            raise NotImplementedError(f"the gradient of its statistic result '{slot.name}'")


def zeros_like(b: Any, value: SSAValue) -> SSAValue:
    t: TensorType = value.type
    return b.one("zeros", shape=list(t.shape), dtype=t.dtype)


def or_zeros(b: Any, grad: Grad, like: SSAValue) -> SSAValue:
    return grad if grad is not None else zeros_like(b, like)


def unbroadcast(b: Any, grad: SSAValue, like: SSAValue) -> SSAValue:
    """Sum ``grad`` over the dims a broadcast added or stretched, back to ``like``'s shape."""
    shape, target = list(grad.type.shape), list(like.type.shape)
    if shape == target:
        return grad
    lead = len(shape) - len(target)
    dims = list(range(lead)) + [lead + i for i, d in enumerate(target) if d == 1 and shape[lead + i] != 1]
    summed = b.one("reduce_sum", grad, dims=dims, keepdim=False) if dims else grad
    if list(summed.type.shape) != target:
        summed = b.one("view", summed, shape=target)
    return summed


def forward_params(op: Operation, *names: str) -> dict:
    """The named attributes of ``op`` that it has, as Python values (passed on to its backward)."""
    return {n: op_attr(op, n) for n in names if n in op.attributes}


def short_name(op: Operation) -> str:
    return op.name.removeprefix("mdsl.graph.")
