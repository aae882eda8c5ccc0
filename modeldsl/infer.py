"""Result-type inference for the primitives: operand types + parameters -> result types.

The frontend calls :func:`infer_result_types` for every primitive it lowers,
so shapes flow forward through the graph symbolically (spec 3.6). Each rule
returns the result types; the op's own verifier then checks the operands, so
a rule never has to re-check what the verifier enforces. A rule raises
:class:`InferenceError` when the result cannot be determined (for example a
``view`` without a target shape), which the frontend reports as E004.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from xdsl.utils.exceptions import VerifyException

from modeldsl.dialects.dtypes import DType
from modeldsl.dialects.graph_primitives import (
    broadcast_shape, grouped_gemm_layout, is_weight_gradient_form, matmul_dims, normalize_axis, reduced_shape,
)
from modeldsl.dialects.graph_types import TensorType
from modeldsl.symbolic import STAR, Dim, Expr, SymbolicError

Rule = Callable[[Sequence[TensorType], dict[str, Any]], list[TensorType]]


class InferenceError(Exception):
    pass


FP32 = DType.FP32
INT32 = DType.INT32


def _rows(t: TensorType) -> TensorType:
    """The shape without the last dim, fp32 (rstd, mean, lse)."""
    return TensorType(list(t.shape[:-1]), FP32)


def _half_last(t: TensorType) -> TensorType:
    """``[*, 2 F]`` -> ``[*, F]``: one half of a packed gate/up projection."""
    return t.with_shape([*t.shape[:-1], t.shape[-1] // 2])


def _same(*indices: int) -> Rule:
    return lambda ts, p: [ts[i] for i in indices]


def _matmul(ts, p):
    a, b = ts[0], ts[1]
    if is_weight_gradient_form(p.get("transpose", "NN"), a, b):
        return [TensorType([a.shape[-1], b.shape[-1]], a.dtype)]
    m, _, _, n = matmul_dims(p.get("transpose", "NN"), a, b)
    return [TensorType([*a.shape[:-2], m, n], a.dtype)]


def _linear_bias_act(ts, p):
    """(out, pre): the matmul's result, twice."""
    (c,) = _matmul(ts, {"transpose": p.get("transpose", "NT")})
    return [c, c]


def _batched_matmul(ts, p):
    """op(A[b]) @ op(B[b]) per batch: TN keeps the batch dims (no weight-gradient form)."""
    a, b = ts[0], ts[1]
    m, _, _, n = matmul_dims(p.get("transpose", "NN"), a, b)
    return [TensorType([*a.shape[:-2], m, n], a.dtype)]


def _grouped_gemm(ts, p):
    x, w = ts[0], ts[1]
    token_axis, _, n_axis = grouped_gemm_layout(p.get("transpose", "TN"))
    return [TensorType([x.shape[token_axis], w.shape[n_axis]], x.dtype)]


def _grouped_gemm_weight_grad(ts, p):
    x, dy, offsets = ts
    groups = offsets.shape[0] - 1
    return [TensorType([groups, dy.shape[1], x.shape[1]], x.dtype)]


def _norm(ts, p):
    return [ts[0], _rows(ts[0])]


def _layernorm(ts, p):
    return [ts[0], _rows(ts[0]), _rows(ts[0])]


def _layernorm_backward(ts, p):
    x, weight = ts[1], ts[2]
    results = [x, weight]
    if p.get("with_bias", True):
        results.append(weight)
    return results


def _attention(ts, p):
    """(out, lse): lse is ``[B, H, T]`` in both layouts (q ``[B, H, T, D]`` or, ``bthd``, ``[B, T, H, D]``)."""
    q = ts[0]
    rows = list(q.shape[:3])
    if p.get("layout") == "bthd" and len(rows) == 3:
        rows[1], rows[2] = rows[2], rows[1]
    return [q, TensorType(rows, FP32)]


def _qk_norm(ts, p):
    q, k = ts[0], ts[1]
    return [q, k, TensorType(list(q.shape[:3]), FP32), TensorType(list(k.shape[:3]), FP32)]


def _axis(t: TensorType, dim: int) -> int:
    if t.is_variadic and dim >= 0:
        raise InferenceError("cannot address a dimension by position in a shape with leading '*'")
    return normalize_axis("dim", dim, len(t.shape))


def _split(ts, p):
    x = ts[0]
    sizes = p.get("sizes")
    if sizes is None:
        raise InferenceError("split needs its sizes")
    axis = _axis(x, p.get("dim", -1))
    return [x.with_shape([*x.shape[:axis], Expr.of(s), *x.shape[axis + 1 :]]) for s in sizes]


def _concat(ts, p):
    first = ts[0]
    axis = _axis(first, p.get("dim", -1))
    total = Expr()
    for t in ts:
        total = total + t.shape[axis]
    return [first.with_shape([*first.shape[:axis], total, *first.shape[axis + 1 :]])]


def _view(ts, p):
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


def _transpose(ts, p):
    x = ts[0]
    d0, d1 = _axis(x, p["dim0"]), _axis(x, p["dim1"])
    shape = list(x.shape)
    shape[d0], shape[d1] = shape[d1], shape[d0]
    return [x.with_shape(shape)]


def _permute(ts, p):
    x = ts[0]
    return [x.with_shape([x.shape[i] for i in p["dims"]])]


def _broadcast(ts, p):
    a, b = ts[0], ts[1]
    shape = broadcast_shape("operands", a, b)
    if shape is None:  # a variadic '*' hides the rank: the longer shape stands for the result
        return [a if len(a.shape) >= len(b.shape) else b]
    return [a.with_shape(shape)]


def _reduce(ts, p):
    x = ts[0]
    return [x.with_shape(reduced_shape(x, list(p["dims"]), p.get("keepdim", False)))]


def _reduce_max(ts, p):
    (values,) = _reduce(ts, {"dims": [p["dim"]], "keepdim": p.get("keepdim", False)})
    return [values, values.with_dtype(INT32)]


def _reduce_max_backward(ts, p):
    raise InferenceError("reduce_max_backward needs the shape of x; give the result type explicitly")


def _add_backward(ts, p):
    raise InferenceError("add_backward needs the shapes of a and b; give the result types explicitly")


def _embedding(ts, p):
    indices, weight = ts
    return [TensorType([*indices.shape, weight.shape[1]], weight.dtype)]


def _embedding_backward(ts, p):
    raise InferenceError("embedding_backward needs the weight shape; give the result type explicitly")


def _moe_router(ts, p):
    x = ts[0]
    k = p["top_k"]
    return [TensorType([x.shape[0], k], x.dtype), TensorType([x.shape[0], k], INT32), TensorType([], FP32)]


def _moe_compute_offsets(ts, p):
    return [TensorType([p["num_experts"] + 1], INT32)]


def _moe_permute(ts, p):
    x, indices = ts[0], ts[1]
    total = indices.shape[0] * indices.shape[1]
    return [TensorType([total, x.shape[1]], x.dtype), TensorType([total], INT32)]


def _moe_unpermute(ts, p):
    expert_outputs, weights = ts[0], ts[1]
    return [TensorType([weights.shape[0], expert_outputs.shape[1]], expert_outputs.dtype)]


def _mamba_conv1d(ts, p):
    x = ts[0]
    results = [x]
    if p.get("with_state", False):
        ks = p.get("kernel_size", 4)
        results.append(x.with_shape([x.shape[0], x.shape[1], ks - 1]))
    return results


def _selective_scan(ts, p):
    u, a_log = ts[0], ts[2]
    return [u, TensorType([u.shape[0], u.shape[1], a_log.shape[1]], FP32)]


def _loss(ts, p):
    rows = ts[0].shape[0]
    loss = TensorType([rows], FP32) if p.get("reduction", "mean") == "none" else TensorType([], FP32)
    return [loss, TensorType([rows], FP32)]


def _constant(ts, p):
    shape = p.get("shape")
    if shape is None:
        raise InferenceError("a constant needs its shape, e.g. zeros([B, T, d_model])")
    return [TensorType([Expr.of(d) if d is not STAR else STAR for d in shape], p.get("dtype", "bf16"))]


def _cast(ts, p):
    if "dtype" not in p:
        raise InferenceError("cast needs the target dtype, e.g. cast(dtype=fp32)")
    return [ts[0].with_dtype(p["dtype"])]


RULES: dict[str, Rule] = {
    "matmul": _matmul,
    "batched_matmul": _batched_matmul,
    "linear_bias_act": _linear_bias_act,
    "grouped_gemm": _grouped_gemm,
    "grouped_gemm_weight_grad": _grouped_gemm_weight_grad,
    "rmsnorm": _norm,
    "rmsnorm_backward": _same(1, 2),
    "fused_residual_rmsnorm": lambda ts, p: [ts[0], ts[0], _rows(ts[0])],
    "fused_residual_rmsnorm_backward": lambda ts, p: [ts[2], ts[2], ts[3]],
    "layernorm": _layernorm,
    "layernorm_backward": _layernorm_backward,
    "swiglu": _same(0),
    "swiglu_backward": _same(1, 2),
    "geglu": _same(0),
    "geglu_backward": _same(1, 2),
    "fused_split_swiglu": lambda ts, p: [_half_last(ts[0])],
    "fused_split_swiglu_backward": _same(1),
    "fused_split_geglu": lambda ts, p: [_half_last(ts[0])],
    "fused_split_geglu_backward": _same(1),
    "silu": _same(0),
    "silu_backward": _same(1),
    "relu": _same(0),
    "relu_backward": _same(1),
    "relu2": _same(0),
    "relu2_backward": _same(1),
    "gelu": _same(0),
    "gelu_backward": _same(1),
    "softmax": _same(0),
    "softmax_backward": _same(1),
    "causal_mask": _same(0),
    "flash_attention": _attention,
    "flash_attention_backward": _same(1, 2, 3),
    "rope": _same(0, 1),
    "rope_backward": _same(0, 1),
    "qk_norm": _qk_norm,
    "qk_norm_backward": _same(2, 3, 4, 5),
    "fused_qk_norm_rope": _qk_norm,
    "fused_qk_norm_rope_backward": _same(2, 3, 4, 5),
    "split": _split,
    "concat": _concat,
    "view": _view,
    "transpose": _transpose,
    "permute": _permute,
    "contiguous": _same(0),
    "add": _broadcast,
    "add_backward": _add_backward,
    "mul": _broadcast,
    "mul_backward": _same(1, 2),
    "bias_add": _same(0),
    "scale": _same(0),
    "add_scalar": _same(0),
    "sub": _broadcast,
    "div": _broadcast,
    "exp": _same(0),
    "tanh": _same(0),
    "sigmoid": _same(0),
    "rsqrt": _same(0),
    "log": _same(0),
    "add3": _same(0),
    "reduce_sum": _reduce,
    "reduce_mean": _reduce,
    "reduce_max": _reduce_max,
    "reduce_max_backward": _reduce_max_backward,
    "embedding": _embedding,
    "embedding_backward": _embedding_backward,
    "moe_router": _moe_router,
    "moe_router_backward": _same(1, 2),
    "moe_compute_offsets": _moe_compute_offsets,
    "moe_permute": _moe_permute,
    "moe_unpermute": _moe_unpermute,
    "moe_unpermute_backward": _same(1, 2),
    "mamba_conv1d": _mamba_conv1d,
    "mamba_conv1d_backward": lambda ts, p: [ts[1], ts[2], *ts[3:4]],
    "mamba_selective_scan": _selective_scan,
    "mamba_selective_scan_backward": _same(1, 2, 3, 4, 5, 6, 7),
    "zeros": _constant,
    "ones": _constant,
    "fill": _constant,
    "copy": _same(0),
    "cast": _cast,
    "cross_entropy": _loss,
    "cross_entropy_backward": _same(1),
    "fused_lm_head_loss": _loss,
    "fused_lm_head_loss_backward": _same(1, 2),
    "fused_lm_head_loss_grad": lambda ts, p: [_loss(ts[1:], p)[0], ts[1], ts[2]],
}


def infer_result_types(primitive: str, operands: Sequence[TensorType], params: dict[str, Any]) -> list[TensorType]:
    """Result types of ``primitive`` applied to operands of these types with these parameters."""
    rule = RULES.get(primitive)
    if rule is None:
        raise InferenceError(f"no shape rule for primitive '{primitive}'")
    try:
        return rule(list(operands), params)
    except (IndexError, KeyError) as err:
        raise InferenceError(f"missing operand or parameter ({err})") from None
    except (TypeError, ValueError, ZeroDivisionError, SymbolicError, VerifyException) as err:
        raise InferenceError(f"cannot infer the result type ({err})") from None
