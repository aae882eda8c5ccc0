"""Tensor manipulation and utilities (spec 6.5, 6.11): split, concat, view, transpose, permute,
contiguous, copy, cast, and the constants zeros, ones, fill. All of them only move data (0 FLOPs)."""

from __future__ import annotations

from modeldsl.dialects.graph_primitives import (
    CastOp,
    ConcatOp,
    ContiguousOp,
    CopyOp,
    FillOp,
    OnesOp,
    PermuteOp,
    SplitOp,
    TransposeOp,
    ViewOp,
    ZerosOp,
    normalize_axis,
)
from modeldsl.dialects.graph_types import TensorType
from modeldsl.prims.base import InferenceError, Primitive, op_attr, same
from modeldsl.prims.counts import free
from modeldsl.prims.grads import checked, forward_params, or_zeros
from modeldsl.symbolic import STAR, Dim, Expr


def axis(t: TensorType, dim: int) -> int:
    if t.is_variadic and dim >= 0:
        raise InferenceError("cannot address a dimension by position in a shape with leading '*'")
    return normalize_axis("dim", dim, len(t.shape))


def infer_split(ts, p):
    x = ts[0]
    sizes = p.get("sizes")
    if sizes is None:
        raise InferenceError("split needs its sizes")
    at = axis(x, p.get("dim", -1))
    return [x.with_shape([*x.shape[:at], Expr.of(s), *x.shape[at + 1 :]]) for s in sizes]


def infer_concat(ts, p):
    first = ts[0]
    at = axis(first, p.get("dim", -1))
    total = Expr()
    for t in ts:
        total = total + t.shape[at]
    return [first.with_shape([*first.shape[:at], total, *first.shape[at + 1 :]])]


def infer_view(ts, p):
    shape = p.get("shape")
    if shape is None:
        raise InferenceError("view needs its target shape, e.g. view([B*T, d_model])")
    x = ts[0]
    dims: list[Dim] = [Expr.of(d) for d in shape]
    unknown = [i for i, d in enumerate(dims) if d == -1]
    if len(unknown) > 1:
        raise InferenceError("a view may infer at most one dimension (-1)")
    if unknown:
        known = Expr.const(1)
        for i, d in enumerate(dims):
            if i != unknown[0]:
                known = known * d
        total = x.numel()
        if total is None:
            raise InferenceError("cannot infer a -1 dimension from a shape with leading '*'")
        dims[unknown[0]] = total // known
    return [x.with_shape(dims)]


def infer_transpose(ts, p):
    x = ts[0]
    d0, d1 = axis(x, p["dim0"]), axis(x, p["dim1"])
    shape = list(x.shape)
    shape[d0], shape[d1] = shape[d1], shape[d0]
    return [x.with_shape(shape)]


def infer_permute(ts, p):
    x = ts[0]
    return [x.with_shape([x.shape[i] for i in p["dims"]])]


def infer_constant(ts, p):
    shape = p.get("shape")
    if shape is None:
        raise InferenceError("a constant needs its shape, e.g. zeros([B, T, d_model])")
    return [TensorType([Expr.of(d) if d is not STAR else STAR for d in shape], p.get("dtype", "bf16"))]


def infer_cast(ts, p):
    if "dtype" not in p:
        raise InferenceError("cast needs the target dtype, e.g. cast(dtype=fp32)")
    return [ts[0].with_dtype(p["dtype"])]


def vjp_split(b, op, grads):
    parts = [or_zeros(b, g, r) for g, r in zip(grads, op.results)]
    return [b.one("concat", *parts, **forward_params(op, "dim"))]


def vjp_concat(b, op, grads):
    dim = op_attr(op, "dim", -1)
    sizes = [v.type.shape[dim] for v in op.operands]
    return list(b.op("split", grads[0], sizes=sizes, dim=dim))


def vjp_view(b, op, grads):
    x = op.operands[0]
    if any(d is STAR for d in x.type.shape):
        raise NotImplementedError("the gradient of a view of a tensor with variadic dims")
    return [b.one("view", grads[0], shape=list(x.type.shape))]


def vjp_transpose(b, op, grads):
    return [b.one("transpose", grads[0], dim0=op_attr(op, "dim0"), dim1=op_attr(op, "dim1"))]


def vjp_permute(b, op, grads):
    dims = op_attr(op, "dims")
    rank = len(dims)
    inverse = [0] * rank
    for position, dim in enumerate(dims):
        inverse[dim % rank] = position
    return [b.one("permute", grads[0], dims=inverse)]


def vjp_identity(b, op, grads):
    return [grads[0]]


def vjp_cast(b, op, grads):
    """The gradient in the input's dtype; none for an integer input (counts, indices)."""
    x = op.operands[0]
    if not x.type.dtype.is_float:
        return [None]
    return [b.one("cast", grads[0], dtype=x.type.dtype)] if x.type.dtype != grads[0].type.dtype else [grads[0]]


def vjp_constant(b, op, grads):
    """A constant: no operands, nothing to pass on."""
    return []


ENTRIES = (
    Primitive(SplitOp, infer_split, free, checked(vjp_split), fusion_kinds=("split",), cuda="copy", cpu=True),
    Primitive(ConcatOp, infer_concat, free, checked(vjp_concat), cuda="copy", cpu=True),
    Primitive(ViewOp, infer_view, free, checked(vjp_view), inference_params=("shape",), cuda="copy", cpu=True),
    Primitive(TransposeOp, infer_transpose, free, checked(vjp_transpose), cuda="copy", cpu=True),
    Primitive(PermuteOp, infer_permute, free, checked(vjp_permute), cuda="copy", cpu=True),
    Primitive(ContiguousOp, same(0), free, checked(vjp_identity), cuda="copy", cpu=True),
    Primitive(CopyOp, same(0), free, checked(vjp_identity), cuda="copy", cpu=True),
    Primitive(CastOp, infer_cast, free, checked(vjp_cast), inference_params=("dtype",), cpu=True),
    Primitive(ZerosOp, infer_constant, free, checked(vjp_constant), inference_params=("shape", "dtype"),
              cuda="memset"),
    Primitive(OnesOp, infer_constant, free, checked(vjp_constant), inference_params=("shape", "dtype"),
              cuda="memset"),
    Primitive(FillOp, infer_constant, free, checked(vjp_constant), inference_params=("shape", "value", "dtype"),
              cuda="memset"),
)
