"""Collectives (spec 7.6): ``all_reduce``, ``all_gather``, ``reduce_scatter`` over a named process
group of ``size`` ranks.

They move data and add it up, no FLOPs beyond the reduction's adds (``(size - 1)`` per element of
the reduced value). Their VJP rules are the pairs Megatron-LM's parallel layers use, where a value
every rank holds whole has the same cotangent on every rank: ``all_reduce``'s (a partial sum made
whole) is the identity, ``all_gather``'s (a shard made whole) is ``reduce_scatter`` of the
cotangent (each rank's reads of the whole summed into the shard it owns), and ``reduce_scatter``'s
is ``all_gather``. (``broadcast``, which spec 6 uses for broadcasting a tensor to a shape, is a
schedule-level collective only: ``mdsl.sched.collective "broadcast"``.) Running one is the
executor's: the CPU schedule executor sends it through the process's communicator
(:mod:`modeldsl.runtime.distributed`); the numpy reference is a group of one rank's.
"""

from __future__ import annotations

from xdsl.dialects.builtin import IntegerAttr

from modeldsl.dialects.graph_primitives import AllGatherOp, AllReduceOp, ReduceScatterOp
from modeldsl.dialects.graph_types import TensorType
from modeldsl.prims.base import InferenceError, Primitive, op_attr, same
from modeldsl.prims.counts import free, numel
from modeldsl.prims.grads import checked


def _resized(t: TensorType, p, factor: float) -> TensorType:
    """``t`` with dim ``p["dim"]`` times ``factor`` (all_gather: the group's size; reduce_scatter: its inverse)."""
    size, dim = int(p.get("size", 1)), int(p.get("dim", 0))
    if not -len(t.shape) <= dim < len(t.shape):
        raise InferenceError(f"dim {dim} is out of range for a rank-{len(t.shape)} tensor")
    shape = list(t.shape)
    axis = dim % len(shape)
    if factor < 1:
        if isinstance(shape[axis], int) and shape[axis] % size:
            raise InferenceError(f"dim {dim} ({shape[axis]}) does not divide into {size} ranks")
        shape[axis] = shape[axis] // size
    else:
        shape[axis] = shape[axis] * size
    return t.with_shape(shape)


def infer_all_gather(ts, p):
    return [_resized(ts[0], p, p.get("size", 1))]


def infer_reduce_scatter(ts, p):
    return [_resized(ts[0], p, 0.5)]


def reduction_flops(s) -> int:
    """``(size - 1)`` adds per element of the reduced value."""
    size = s.attrs.get("size")
    ranks = size.value.data if isinstance(size, IntegerAttr) else 1
    return max(ranks - 1, 0) * sum(numel(shape) for shape in s.inputs)


def _group(op) -> dict:
    return {"group": op_attr(op, "group", "world"), "size": op_attr(op, "size", 1)}


def vjp_all_reduce(b, op, grads):
    return [grads[0]]


def vjp_all_gather(b, op, grads):
    return [b.one("reduce_scatter", grads[0], dim=op_attr(op, "dim", 0), op="sum", **_group(op))]


def vjp_reduce_scatter(b, op, grads):
    if op_attr(op, "op", "sum") != "sum":
        raise NotImplementedError(f"the gradient of a reduce_scatter with op {op_attr(op, 'op')} (only sum's)")
    return [b.one("all_gather", grads[0], dim=op_attr(op, "dim", 0), **_group(op))]


ENTRIES = (
    Primitive(AllReduceOp, same(0), reduction_flops, checked(vjp_all_reduce), cuda="collective"),
    Primitive(AllGatherOp, infer_all_gather, free, checked(vjp_all_gather), cuda="collective"),
    Primitive(ReduceScatterOp, infer_reduce_scatter, reduction_flops, checked(vjp_reduce_scatter),
              cuda="collective"),
)
