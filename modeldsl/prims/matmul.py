"""Linear algebra (spec 6.1): matmul, batched_matmul, linear_bias_act, grouped_gemm and its weight gradient.

The GEMMs run on cuBLASLt on the GPU (``mdsl.sched.gemm``), so they have no
CUDA launch plan; the grouped GEMMs of MoE are kernels of ``moe.cu``.
"""

from __future__ import annotations

from xdsl.ir import SSAValue

from modeldsl.dialects.graph_primitives import (
    BatchedMatmulOp,
    GroupedGemmOp,
    GroupedGemmWeightGradOp,
    LinearBiasActOp,
    MatmulOp,
    grouped_gemm_layout,
    is_weight_gradient_form,
    matmul_dims,
)
from modeldsl.dialects.graph_types import TensorType
from modeldsl.prims import counts
from modeldsl.prims.base import Primitive, op_attr
from modeldsl.prims.grads import Grad, checked, short_name, unbroadcast

# ----------------------------------------------------------------------------
# result types
# ----------------------------------------------------------------------------


def infer_matmul(ts, p):
    a, b = ts[0], ts[1]
    if is_weight_gradient_form(p.get("transpose", "NN"), a, b):
        return [TensorType([a.shape[-1], b.shape[-1]], a.dtype)]
    m, _, _, n = matmul_dims(p.get("transpose", "NN"), a, b)
    return [TensorType([*a.shape[:-2], m, n], a.dtype)]


def infer_linear_bias_act(ts, p):
    """(out, pre): the matmul's result, twice."""
    (c,) = infer_matmul(ts, {"transpose": p.get("transpose", "NT")})
    return [c, c]


def infer_batched_matmul(ts, p):
    """op(A[b]) @ op(B[b]) per batch: TN keeps the batch dims (no weight-gradient form)."""
    a, b = ts[0], ts[1]
    m, _, _, n = matmul_dims(p.get("transpose", "NN"), a, b)
    return [TensorType([*a.shape[:-2], m, n], a.dtype)]


def infer_grouped_gemm(ts, p):
    x, w = ts[0], ts[1]
    token_axis, _, n_axis = grouped_gemm_layout(p.get("transpose", "TN"))
    return [TensorType([x.shape[token_axis], w.shape[n_axis]], x.dtype)]


def infer_grouped_gemm_weight_grad(ts, p):
    x, dy, offsets = ts
    groups = offsets.shape[0] - 1
    return [TensorType([groups, dy.shape[1], x.shape[1]], x.dtype)]


# ----------------------------------------------------------------------------
# gradients
# ----------------------------------------------------------------------------


def vjp_matmul(b, op, grads: list[Grad]) -> list[Grad]:
    (g,) = grads
    if op_attr(op, "accumulate", False) or op_attr(op, "beta", 0.0):
        raise NotImplementedError("the gradient of an accumulating matmul (accumulate=true or beta != 0)")
    a, w = op.operands
    name = short_name(op)
    alpha = op_attr(op, "alpha", 1.0)
    extra = {"alpha": alpha} if alpha != 1.0 else {}
    mode = op_attr(op, "transpose", "NN")
    # (operands, mode) of d_A and d_B for each forward mode: C = op(A) @ op(B)
    plans = {
        "NN": ((g, w, "NT"), (a, g, "TN")),
        "NT": ((g, w, "NN"), (g, a, "TN")),
        "TN": ((w, g, "NT"), (a, g, "NN")),
        "TT": ((w, g, "TT"), (g, a, "TT")),
    }
    (x1, y1, m1), (x2, y2, m2) = plans[mode]
    if name == "batched_matmul" and w.type.rank == 2 and a.type.rank > 2:
        return _batched_matmul_matrix_b(b, a, g, w, mode, (x2, y2, m2), extra)
    d_a = b.one(name, x1, y1, transpose=m1, **extra)
    d_b = b.one(name, x2, y2, transpose=m2, **extra)
    return [d_a, d_b]


def vjp_linear_bias_act(b, op, grads: list[Grad]) -> list[Grad]:
    """The activation's gradient (GELU's through the saved ``pre``, ReLU's mask from ``out``: the
    same mask, so the GEMM need not save ``pre``), plus a gradient of ``pre`` itself; then matmul's
    and bias_add's rules. Lowering runs the GELU gradient and the bias sum as GEMM epilogues."""
    x, w, bias = op.operands
    g = _pre_activation_grad(b, op, *grads)
    if g is None:
        return [None, None, None]
    d_bias = unbroadcast(b, g, bias)  # before the weight gradient's GEMM, which lowering gives the sum to
    alpha = op_attr(op, "alpha", 1.0)
    extra = {"alpha": alpha} if alpha != 1.0 else {}
    if op_attr(op, "transpose", "NT") == "NT":
        d_x, d_w = b.one("matmul", g, w, transpose="NN", **extra), b.one("matmul", g, x, transpose="TN", **extra)
    else:
        d_x, d_w = b.one("matmul", g, w, transpose="NT", **extra), b.one("matmul", x, g, transpose="TN", **extra)
    return [d_x, d_w, d_bias]


def _pre_activation_grad(b, op, g_out: Grad, g_pre: Grad) -> Grad:
    out, pre = op.results
    activation = op_attr(op, "activation", "none")
    g = g_out
    if g_out is not None and activation == "relu":
        g = b.one("relu_backward", g_out, out)
    elif g_out is not None and activation == "gelu":
        g = b.one("gelu_backward", g_out, pre, approximate=True)
    if g_pre is not None:
        g = g_pre if g is None else b.one("add", g, g_pre)
    return g


def _batched_matmul_matrix_b(b, a: SSAValue, g: SSAValue, w: SSAValue, mode: str,
                             plan_b: tuple, extra: dict) -> list[Grad]:
    """batched_matmul with a matrix B broadcast over A's batch dims: a matrix cannot be the first
    operand of a batched product (d_A of TN/TT is the transpose of G op(B)), and d_B sums the
    per-batch products over the batch dims."""
    if a.type.is_variadic:
        raise NotImplementedError("the gradient of a batched_matmul of a variadic A and a matrix B")
    if mode[0] == "N":  # d_A = G op(B)^T
        d_a = b.one("batched_matmul", g, w, transpose="NT" if mode == "NN" else "NN", **extra)
    else:  # TN: d_A = B G^T = (G B^T)^T; TT: d_A = B^T G^T = (G B)^T
        d_a = b.one("transpose", b.one("batched_matmul", g, w, transpose="NT" if mode == "TN" else "NN", **extra),
                    dim0=-2, dim1=-1)
    x2, y2, m2 = plan_b
    d_b = b.one("reduce_sum", b.one("batched_matmul", x2, y2, transpose=m2, **extra),
                dims=list(range(a.type.rank - 2)), keepdim=False)
    return [d_a, d_b]


def vjp_grouped_gemm(b, op, grads: list[Grad]) -> list[Grad]:
    """out_g = X_g @ op(W)_g with X the input as ``[tokens, K]`` (the second mode letter) and op(W)
    the weights as ``[G, K, N]`` (the first): d_X_g = d_out_g @ op(W)_g^T and d_op(W)_g = X_g^T @ d_out_g,
    whose transpose ``[G, N, K]`` is grouped_gemm_weight_grad. The offsets are integers (no gradient)."""
    (g,) = grads
    x, w, offsets = op.operands
    weights_transposed, input_transposed = (letter == "T" for letter in op_attr(op, "transpose", "TN"))
    d_x = b.one("grouped_gemm", g, w, offsets, transpose="NN" if weights_transposed else "TN")
    tokens_first = b.one("transpose", x, dim0=0, dim1=1) if input_transposed else x
    d_w = b.one("grouped_gemm_weight_grad", tokens_first, g, offsets)
    if not weights_transposed:
        d_w = b.one("transpose", d_w, dim0=1, dim1=2)
    if input_transposed:
        d_x = b.one("transpose", d_x, dim0=0, dim1=1)
    return [d_x, d_w, None]


ENTRIES = (
    Primitive(MatmulOp, infer_matmul, counts.matmul_rule(batched=False), checked(vjp_matmul),
              fusion_kinds=("matmul",), cuda="gemm"),
    Primitive(BatchedMatmulOp, infer_batched_matmul, counts.matmul_rule(batched=True), checked(vjp_matmul),
              fusion_kinds=("matmul",), cuda="gemm"),
    Primitive(LinearBiasActOp, infer_linear_bias_act, counts.linear_bias_act, checked(vjp_linear_bias_act),
              cuda="gemm"),
    Primitive(GroupedGemmOp, infer_grouped_gemm, counts.grouped_gemm, checked(vjp_grouped_gemm),
              fusion_kinds=("matmul",)),
    Primitive(GroupedGemmWeightGradOp, infer_grouped_gemm_weight_grad, counts.grouped_gemm_weight_grad),
)
