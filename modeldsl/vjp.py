"""VJP rules: the gradient of each primitive, written as ``mdsl.graph`` ops.

A rule takes a :class:`GraphBuilder`, the forward op and the gradient of each
of its results (None where no gradient flows, e.g. to ``rstd``) and returns
the gradient of each operand (None for operands that get none: token ids,
labels, RoPE tables are not differentiated). A gradient that reaches a
statistic result (``rstd``, ``mean``, ``lse``) is refused, not dropped. Rules reuse the primitives'
explicit ``*_backward`` ops where the spec has one (spec section 6), so the
kernels that run a derived backward are those a written backward calls.
The kernel registry hangs each rule on its primitive's entry.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from xdsl.ir import Operation, SSAValue

from modeldsl.dialects.graph_types import TensorType
from modeldsl.graph_builder import GraphBuilder, op_attr
from modeldsl.primitives import STATISTICS, lookup_primitive
from modeldsl.symbolic import STAR

Grad = SSAValue | None
VJPRule = Callable[[GraphBuilder, Operation, list[Grad]], list[Grad]]
RULES: dict[str, VJPRule] = {}


def rule(*names: str):
    def register(fn: VJPRule) -> VJPRule:
        @functools.wraps(fn)
        def checked(b: GraphBuilder, op: Operation, grads: list[Grad]) -> list[Grad]:
            refuse_statistics_gradients(op, grads)
            return fn(b, op, grads)

        for name in names:
            RULES[name] = checked
        return fn

    return register


def refuse_statistics_gradients(op: Operation, grads: list[Grad]) -> None:
    """The rules differentiate an op's primary results only: a gradient reaching a statistic
    (``rstd``, ``mean``, ``lse``: a function that returns it, or uses it) is refused, not dropped."""
    sig = lookup_primitive(op.name.removeprefix("mdsl.graph."))
    if sig is None or len(sig.outputs) != len(grads):
        return
    for slot, grad in zip(sig.outputs, grads):
        if grad is not None and slot.name in STATISTICS:
            raise NotImplementedError(f"the gradient of its statistic result '{slot.name}'")


# ----------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------


def zeros_like(b: GraphBuilder, value: SSAValue) -> SSAValue:
    t: TensorType = value.type
    return b.one("zeros", shape=list(t.shape), dtype=t.dtype)


def or_zeros(b: GraphBuilder, grad: Grad, like: SSAValue) -> SSAValue:
    return grad if grad is not None else zeros_like(b, like)


def unbroadcast(b: GraphBuilder, grad: SSAValue, like: SSAValue) -> SSAValue:
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
    return {n: op_attr(op, n) for n in names if n in op.attributes}


# ----------------------------------------------------------------------------
# linear algebra
# ----------------------------------------------------------------------------


@rule("matmul", "batched_matmul")
def _matmul(b: GraphBuilder, op: Operation, grads: list[Grad]) -> list[Grad]:
    (g,) = grads
    if op_attr(op, "accumulate", False) or op_attr(op, "beta", 0.0):
        raise NotImplementedError("the gradient of an accumulating matmul (accumulate=true or beta != 0)")
    a, w = op.operands
    name = op.name.removeprefix("mdsl.graph.")
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


@rule("linear_bias_act")
def _linear_bias_act(b: GraphBuilder, op: Operation, grads: list[Grad]) -> list[Grad]:
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


def _pre_activation_grad(b: GraphBuilder, op: Operation, g_out: Grad, g_pre: Grad) -> Grad:
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


def _batched_matmul_matrix_b(b: GraphBuilder, a: SSAValue, g: SSAValue, w: SSAValue, mode: str,
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


@rule("grouped_gemm")
def _grouped_gemm(b: GraphBuilder, op: Operation, grads: list[Grad]) -> list[Grad]:
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


# ----------------------------------------------------------------------------
# normalization, activations, attention
# ----------------------------------------------------------------------------


@rule("rmsnorm")
def _rmsnorm(b, op, grads):
    x, w = op.operands
    d_x, d_w = b.op("rmsnorm_backward", grads[0], x, w, op.results[1])
    return [d_x, d_w]


@rule("fused_residual_rmsnorm")
def _fused_residual_rmsnorm(b, op, grads):
    residual_out, y, rstd = op.results
    w = op.operands[2]
    d_res, d_in, d_w = b.op("fused_residual_rmsnorm_backward", or_zeros(b, grads[1], y),
                            or_zeros(b, grads[0], residual_out), residual_out, w, rstd)
    return [d_res, d_in, d_w]


@rule("layernorm")
def _layernorm(b, op, grads):
    x, w = op.operands[0], op.operands[1]
    d_x, d_w, d_b = b.op("layernorm_backward", grads[0], x, w, op.results[1], op.results[2])
    return [d_x, d_w] + ([d_b] if len(op.operands) == 3 else [])


@rule("silu", "relu", "relu2", "gelu")
def _activation(b, op, grads):
    name = op.name.removeprefix("mdsl.graph.")
    return [b.one(f"{name}_backward", grads[0], op.operands[0], **forward_params(op, "approximate"))]


@rule("swiglu", "geglu")
def _gated(b, op, grads):
    name = op.name.removeprefix("mdsl.graph.")
    return b.op(f"{name}_backward", grads[0], *op.operands, **forward_params(op, "approximate"))


@rule("fused_split_swiglu", "fused_split_geglu")
def _fused_split_gated(b, op, grads):
    name = op.name.removeprefix("mdsl.graph.")
    return [b.one(f"{name}_backward", grads[0], op.operands[0])]


@rule("softmax")
def _softmax(b, op, grads):
    return [b.one("softmax_backward", grads[0], op.results[0], **forward_params(op, "dim"))]


@rule("flash_attention")
def _flash_attention(b, op, grads):
    """ALiBi slopes (a parameter of the primitive) shift the scores and are not differentiated."""
    q, k, v, *slopes = op.operands
    params = forward_params(op, "causal", "softmax_scale", "window_size", "layout", "softcap")
    d_q, d_k, d_v = b.op("flash_attention_backward", grads[0], q, k, v, op.results[0], op.results[1], *slopes,
                         **params)
    return [d_q, d_k, d_v, *[None for _ in slopes]]


@rule("rope")
def _rope(b, op, grads):
    q_rot, k_rot = op.results
    d_q, d_k = b.op("rope_backward", or_zeros(b, grads[0], q_rot), or_zeros(b, grads[1], k_rot), op.operands[2],
                    **forward_params(op, "interleaved", "layout"))
    return [d_q, d_k, None]


@rule("qk_norm")
def _qk_norm(b, op, grads):
    q_norm, k_norm, q_rstd, k_rstd = op.results
    return b.op("qk_norm_backward", or_zeros(b, grads[0], q_norm), or_zeros(b, grads[1], k_norm),
                *op.operands, q_rstd, k_rstd)


@rule("fused_qk_norm_rope")
def _fused_qk_norm_rope(b, op, grads):
    q_rot, k_rot, q_rstd, k_rstd = op.results
    q, k, q_weight, k_weight, freqs = op.operands
    d_q, d_k, d_qw, d_kw = b.op("fused_qk_norm_rope_backward", or_zeros(b, grads[0], q_rot),
                                or_zeros(b, grads[1], k_rot), q, k, q_weight, k_weight, q_rstd, k_rstd, freqs,
                                **forward_params(op, "interleaved", "layout"))
    return [d_q, d_k, d_qw, d_kw, None]

# ----------------------------------------------------------------------------
# tensor manipulation
# ----------------------------------------------------------------------------


@rule("split")
def _split(b, op, grads):
    parts = [or_zeros(b, g, r) for g, r in zip(grads, op.results)]
    return [b.one("concat", *parts, **forward_params(op, "dim"))]


@rule("concat")
def _concat(b, op, grads):
    dim = op_attr(op, "dim", -1)
    sizes = [v.type.shape[dim] for v in op.operands]
    return list(b.op("split", grads[0], sizes=sizes, dim=dim))


@rule("view")
def _view(b, op, grads):
    x = op.operands[0]
    if any(d is STAR for d in x.type.shape):
        raise NotImplementedError("the gradient of a view of a tensor with variadic dims")
    return [b.one("view", grads[0], shape=list(x.type.shape))]


@rule("transpose")
def _transpose(b, op, grads):
    return [b.one("transpose", grads[0], dim0=op_attr(op, "dim0"), dim1=op_attr(op, "dim1"))]


@rule("permute")
def _permute(b, op, grads):
    dims = op_attr(op, "dims")
    rank = len(dims)
    inverse = [0] * rank
    for position, dim in enumerate(dims):
        inverse[dim % rank] = position
    return [b.one("permute", grads[0], dims=inverse)]


@rule("contiguous", "copy")
def _identity(b, op, grads):
    return [grads[0]]


@rule("cast")
def _cast(b, op, grads):
    """The gradient in the input's dtype; none for an integer input (counts, indices)."""
    x = op.operands[0]
    if not x.type.dtype.is_float:
        return [None]
    return [b.one("cast", grads[0], dtype=x.type.dtype)] if x.type.dtype != grads[0].type.dtype else [grads[0]]


@rule("zeros", "ones", "fill")
def _constant(b, op, grads):
    """A constant: no operands, nothing to pass on."""
    return []


# ----------------------------------------------------------------------------
# elementwise
# ----------------------------------------------------------------------------


@rule("add")
def _add(b, op, grads):
    """The sums add_backward computes, written as reduce_sum/view: the CUDA table covers those, not
    add_backward (nor mul_backward below), and every residual add of a model takes this rule."""
    return [unbroadcast(b, grads[0], x) for x in op.operands]


@rule("add3")
def _add3(b, op, grads):
    return [grads[0]] * 3


@rule("mul")
def _mul(b, op, grads):
    x, y = op.operands
    return [unbroadcast(b, b.one("mul", grads[0], y), x), unbroadcast(b, b.one("mul", grads[0], x), y)]


@rule("scale")
def _scale(b, op, grads):
    return [b.one("scale", grads[0], factor=op_attr(op, "factor"))]


@rule("add_scalar")
def _add_scalar(b, op, grads):
    return [grads[0]]


@rule("causal_mask")
def _causal_mask(b, op, grads):
    """The gradient where the score was kept, 0 where it was masked."""
    return [b.one("causal_mask", grads[0], offset=op_attr(op, "offset", 0), window_size=op_attr(op, "window_size"),
                  fill="zero")]


@rule("sub")
def _sub(b, op, grads):
    x, y = op.operands
    return [unbroadcast(b, grads[0], x), unbroadcast(b, b.one("scale", grads[0], factor=-1.0), y)]


@rule("div")
def _div(b, op, grads):
    """d_a = g / b; d_b = -g a / b^2 = -(g / b) * out."""
    x, y = op.operands
    g_over_y = b.one("div", grads[0], y)
    d_y = b.one("scale", b.one("mul", g_over_y, op.results[0]), factor=-1.0)
    return [unbroadcast(b, g_over_y, x), unbroadcast(b, d_y, y)]


@rule("exp")
def _exp(b, op, grads):
    return [b.one("mul", grads[0], op.results[0])]


@rule("log")
def _log(b, op, grads):
    """g / x."""
    return [b.one("div", grads[0], op.operands[0])]


@rule("tanh")
def _tanh(b, op, grads):
    """g * (1 - out^2)."""
    out = op.results[0]
    return [b.one("mul", grads[0], _one_minus(b, b.one("mul", out, out)))]


@rule("sigmoid")
def _sigmoid(b, op, grads):
    """g * out * (1 - out)."""
    out = op.results[0]
    return [b.one("mul", b.one("mul", grads[0], out), _one_minus(b, out))]


@rule("rsqrt")
def _rsqrt(b, op, grads):
    """g * -0.5 * out^3."""
    out = op.results[0]
    cube = b.one("mul", b.one("mul", out, out), out)
    return [b.one("mul", grads[0], b.one("scale", cube, factor=-0.5))]


def _one_minus(b: GraphBuilder, value: SSAValue) -> SSAValue:
    return b.one("add_scalar", b.one("scale", value, factor=-1.0), value=1.0)


@rule("bias_add")
def _bias_add(b, op, grads):
    x, bias = op.operands
    return [grads[0], unbroadcast(b, grads[0], bias)]


# ----------------------------------------------------------------------------
# reductions, embedding, losses
# ----------------------------------------------------------------------------


@rule("reduce_sum", "reduce_mean")
def _reduce(b, op, grads):
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


@rule("reduce_max")
def _reduce_max(b, op, grads):
    """The indices are integers: no gradient reaches them (autodiff never seeds one)."""
    x, indices = op.operands[0], op.results[1]
    params = forward_params(op, "dim", "keepdim")
    return [b.one("reduce_max_backward", grads[0], indices, result_types=[x.type], **params)]


@rule("embedding")
def _embedding(b, op, grads):
    indices, weight = op.operands
    d_w = b.one("embedding_backward", grads[0], indices, result_types=[weight.type])
    return [None, d_w]


@rule("cross_entropy")
def _cross_entropy(b, op, grads):
    logits, labels = op.operands
    params = forward_params(op, "ignore_index", "reduction")
    return [b.one("cross_entropy_backward", grads[0], logits, labels, op.results[1], **params), None]


@rule("fused_lm_head_loss")
def _fused_lm_head_loss(b, op, grads):
    x, weight, labels = op.operands
    params = forward_params(op, "ignore_index", "reduction", "chunk")
    d_x, d_w = b.op("fused_lm_head_loss_backward", grads[0], x, weight, labels, op.results[1], **params)
    return [d_x, d_w, None]


# ----------------------------------------------------------------------------
# mixture of experts and Mamba (spec 6.9-6.10)
# ----------------------------------------------------------------------------


@rule("moe_router")
def _moe_router(b, op, grads):
    """moe_router_backward gives the gradient of ``sum(d_weights * weights) + aux_loss_coef * aux`` with the
    indices held: once with the weights' gradient (coefficient 0), once with zero weight gradients for the
    auxiliary loss, scaled by its gradient (a scalar). The indices are integers (no gradient)."""
    g_weights, _, g_aux = grads
    x, gate = op.operands
    weights, indices = op.results[0], op.results[1]
    params = forward_params(op, "normalize", "use_sigmoid")
    coefficient = op_attr(op, "aux_loss_coef", 0.01)
    parts = []
    if g_weights is not None:
        parts.append(b.op("moe_router_backward", g_weights, x, gate, indices, aux_loss_coef=0.0, **params))
    if g_aux is not None and coefficient:
        d_x, d_gate = b.op("moe_router_backward", zeros_like(b, weights), x, gate, indices,
                           aux_loss_coef=coefficient, **params)
        parts.append([b.one("mul", d_x, g_aux), b.one("mul", d_gate, g_aux)])
    if not parts:
        return [None, None]
    d_x, d_gate = parts[0]
    for more_x, more_gate in parts[1:]:
        d_x, d_gate = b.one("add", d_x, more_x), b.one("add", d_gate, more_gate)
    return [d_x, d_gate]


@rule("moe_permute")
def _moe_permute(b, op, grads):
    """Each token's rows of the gradient, summed back: moe_unpermute with unit weights."""
    x, indices, _ = op.operands
    ones = b.one("ones", shape=list(indices.type.shape), dtype=x.type.dtype)
    return [b.one("moe_unpermute", grads[0], ones, op.results[1]), None, None]


@rule("moe_unpermute")
def _moe_unpermute(b, op, grads):
    expert_outputs, weights, scatter_indices = op.operands
    d_outputs, d_weights = b.op("moe_unpermute_backward", grads[0], expert_outputs, weights, scatter_indices)
    return [d_outputs, d_weights, None]


@rule("mamba_conv1d")
def _mamba_conv1d(b, op, grads):
    """From a zero initial state (training); the gradient through a decode step's conv state is refused."""
    if op.conv_state is not None:
        raise NotImplementedError("the gradient of mamba_conv1d with a conv_state (a decode step)")
    return b.op("mamba_conv1d_backward", grads[0], op.x, op.weight, op.bias,
                **forward_params(op, "kernel_size", "activation"))


@rule("mamba_selective_scan")
def _mamba_selective_scan(b, op, grads):
    """The gradients of u, delta, A_log, B, C, D and dt_bias; a given initial state is held (not
    differentiated), and a gradient reaching the final state is refused."""
    g_y, g_state = grads
    if g_state is not None:
        raise NotImplementedError("the gradient of mamba_selective_scan's final ssm_state")
    state = op.ssm_state
    results = b.op("mamba_selective_scan_backward", g_y, *op.operands[:7], state, op.y,
                   **forward_params(op, "chunk_size"))
    return list(results) + ([None] if state is not None else [])
