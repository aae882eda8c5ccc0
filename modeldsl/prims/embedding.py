"""Embedding (spec 6.8): a gather of rows; its backward scatter-adds d_out into a zeroed (or, with
``accumulate``, the given) weight gradient."""

from __future__ import annotations

from modeldsl.dialects.graph_primitives import EmbeddingBackwardOp, EmbeddingOp
from modeldsl.dialects.graph_types import TensorType
from modeldsl.prims.base import InferenceError, Primitive
from modeldsl.prims.counts import free, per_input_element
from modeldsl.prims.grads import checked


def infer_embedding(ts, p):
    indices, weight = ts
    return [TensorType([*indices.shape, weight.shape[1]], weight.dtype)]


def infer_embedding_backward(ts, p):
    raise InferenceError("embedding_backward needs the weight shape; give the result type explicitly")


def vjp_embedding(b, op, grads):
    indices, weight = op.operands
    d_w = b.one("embedding_backward", grads[0], indices, result_types=[weight.type])
    return [None, d_w]


ENTRIES = (
    Primitive(EmbeddingOp, infer_embedding, free, checked(vjp_embedding), cpu=True),
    # the CUDA kernel scatter-adds into a zeroed output: without the zeroing it accumulates
    Primitive(EmbeddingBackwardOp, infer_embedding_backward, per_input_element(1, 0), accumulates=True, cpu=True),
)
