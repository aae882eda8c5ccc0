"""Reductions (spec 6.7): reduce_sum, reduce_mean, reduce_max and reduce_max's backward."""

from __future__ import annotations

from modeldsl.dialects.graph_primitives import (
    ReduceMaxBackwardOp,
    ReduceMaxOp,
    ReduceMeanOp,
    ReduceSumOp,
    reduced_shape,
)
from modeldsl.prims.base import INT32, InferenceError, Primitive, op_attr
from modeldsl.prims.counts import free, per_input_element
from modeldsl.prims.grads import checked, forward_params
from modeldsl.symbolic import STAR


def infer_reduce(ts, p):
    x = ts[0]
    return [x.with_shape(reduced_shape(x, list(p["dims"]), p.get("keepdim", False)))]


def infer_reduce_max(ts, p):
    (values,) = infer_reduce(ts, {"dims": [p["dim"]], "keepdim": p.get("keepdim", False)})
    return [values, values.with_dtype(INT32)]


def infer_reduce_max_backward(ts, p):
    raise InferenceError("reduce_max_backward needs the shape of x; give the result type explicitly")


def vjp_reduce(b, op, grads):
    x = op.operands[0]
    shape = list(x.type.shape)
    dims = sorted(d % len(shape) for d in op_attr(op, "dims"))
    kept = [1 if i in dims else d for i, d in enumerate(shape)]
    g = grads[0] if list(grads[0].type.shape) == kept else b.one("view", grads[0], shape=kept)
    if op.name.endswith("reduce_mean"):
        count = 1
        for d in dims:
            size = None if shape[d] is STAR else shape[d].const_value()
            if size is None:
                raise NotImplementedError(f"the gradient of a mean over the symbolic dimension {shape[d]} "
                                          "(the scale factor must be a number): run mdsl-specialize first")
            count *= size
        g = b.one("scale", g, factor=1.0 / count)
    return [b.one("mul", b.one("ones", shape=shape, dtype=x.type.dtype), g)]


def vjp_reduce_max(b, op, grads):
    """The indices are integers: no gradient reaches them (autodiff never seeds one)."""
    x, indices = op.operands[0], op.results[1]
    params = forward_params(op, "dim", "keepdim")
    return [b.one("reduce_max_backward", grads[0], indices, result_types=[x.type], **params)]


ONE_PER_INPUT = per_input_element(1, 0)

ENTRIES = (
    Primitive(ReduceSumOp, infer_reduce, ONE_PER_INPUT, checked(vjp_reduce)),
    Primitive(ReduceMeanOp, infer_reduce, ONE_PER_INPUT, checked(vjp_reduce)),
    Primitive(ReduceMaxOp, infer_reduce_max, ONE_PER_INPUT, checked(vjp_reduce_max)),
    Primitive(ReduceMaxBackwardOp, infer_reduce_max_backward, free, cuda="none"),
)
