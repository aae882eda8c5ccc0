"""The FLOP rules' building blocks: what a rule sees of an op, and the rules shared by families.

Every count is an estimate: a matrix product counts its multiply-adds exactly
(``2 * M * N * K``), attention counts the two products of its score matrix
(``4 * B * H * Tq * Tk * D``, half of it under a causal mask), and everything
else counts a small constant per element (a norm about 5, rotary embedding 6,
an add 1). Data movement (views, transposes, copies, casts, gathers, fills)
counts 0. Each primitive's rule is on its entry in :mod:`modeldsl.prims`;
:mod:`modeldsl.flops` applies them to graph ops and schedules.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from xdsl.dialects.builtin import IntegerAttr, StringAttr
from xdsl.ir import Attribute

Shape = tuple[int, ...]

# attention backward: the forward's two products recomputed/transposed into five (dQ, dK, dV, dP, S)
ATTENTION_BACKWARD_FACTOR = 2.5


class FlopsUnknown(ValueError):
    """An op the cost model cannot price: no rule for it, or shapes its rule does not fit."""


@dataclass(frozen=True)
class OpShapes:
    """What a FLOP rule sees of an op: the concrete shapes of its inputs and outputs, and its attributes."""

    inputs: tuple[Shape, ...]
    outputs: tuple[Shape, ...]
    attrs: Mapping[str, Attribute]

    def flag(self, name: str, default: bool) -> bool:
        attr = self.attrs.get(name)
        return default if not isinstance(attr, IntegerAttr) else bool(attr.value.data)

    def integer(self, name: str, default: int) -> int:
        attr = self.attrs.get(name)
        return default if not isinstance(attr, IntegerAttr) else attr.value.data

    def text(self, name: str, default: str) -> str:
        attr = self.attrs.get(name)
        return default if not isinstance(attr, StringAttr) else attr.data


Rule = Callable[[OpShapes], int]


def numel(shape: Shape) -> int:
    return math.prod(shape)


# ----------------------------------------------------------------------------
# Rule builders
# ----------------------------------------------------------------------------


def free(shapes: OpShapes) -> int:
    """Data movement only: views, transposes, copies, casts, gathers, fills."""
    return 0


def per_output_element(k: float) -> Rule:
    """``k`` FLOPs per element of every output (elementwise ops and their backwards)."""
    return lambda s: round(k * sum(numel(o) for o in s.outputs))


def per_input_element(k: float, *indices: int) -> Rule:
    """``k`` FLOPs per element of the inputs at ``indices`` (norms, softmax, losses, reductions)."""
    return lambda s: round(k * sum(numel(s.inputs[i]) for i in indices))


def matmul_flops(batch: int, m: int, n: int, k: int) -> int:
    return 2 * batch * m * n * k


def transposed(rows: int, cols: int, flag: bool) -> tuple[int, int]:
    """(rows, cols) of a matrix operand, swapped where its transpose flag is set."""
    return (cols, rows) if flag else (rows, cols)


def matmul_rule(batched: bool) -> Rule:
    """``op(A) @ op(B)`` with the ``transpose`` letters of A and B (``NT`` is ``A @ B^T``).

    Leading dims of C are a batch, except in ``matmul``'s weight-gradient form
    (``TN`` with A and B both above rank 2), where A's and B's leading dims are
    contracted with their rows: ``dW = dY^T X`` over all tokens.
    """

    def rule(s: OpShapes) -> int:
        a, b, c = s.inputs[0], s.inputs[1], s.outputs[0]
        transpose = s.text("transpose", "NN")
        if not batched and transpose == "TN" and len(a) > 2 and len(b) > 2:
            return matmul_flops(1, a[-1], b[-1], numel(a[:-1]))
        m, k = transposed(a[-2], a[-1], transpose[0] == "T")
        _, n = transposed(b[-2], b[-1], transpose[1] == "T")
        return matmul_flops(numel(c[:-2]), m, n, k)

    return rule


def linear_bias_act(s: OpShapes) -> int:
    """The GEMM (``NN``/``NT``), one add per element for the bias and the activation's work
    (ReLU 1, tanh GELU 8, as the epilogues count them)."""
    attrs = {"transpose": StringAttr(s.text("transpose", "NT"))}
    gemm = matmul_rule(batched=False)(OpShapes(s.inputs[:2], s.outputs[:1], attrs))
    per_element = 1 + {"none": 0, "relu": 1, "gelu": 8}[s.text("activation", "none")]
    return gemm + per_element * numel(s.outputs[0])


def grouped_gemm(s: OpShapes) -> int:
    """Every token row meets one group's weights: ``2 * tokens * N * K`` (``output: [tokens, N]``)."""
    x, w = s.inputs[0], s.inputs[1]
    weightstransposed, inputtransposed = (letter == "T" for letter in s.text("transpose", "TN"))
    k = x[0] if inputtransposed else x[1]
    if k != (w[2] if weightstransposed else w[1]):
        raise FlopsUnknown(f"grouped_gemm input {list(x)} and weights {list(w)} disagree on K")
    return 2 * numel(s.outputs[0]) * k


def grouped_gemm_weight_grad(s: OpShapes) -> int:
    """``d_weights[g] = d_output_g^T @ input_g`` over all tokens: ``2 * tokens * N * K``."""
    x, dy = s.inputs[0], s.inputs[1]
    return matmul_flops(1, dy[1], x[1], x[0])


def attention_flops(batch: int, heads: int, tq: int, tk: int, head_dim: int, causal: bool) -> int:
    """``Q K^T`` and ``P V``: ``4 * B * H * Tq * Tk * D``, half of the scores masked when causal."""
    flops = 4 * batch * heads * tq * tk * head_dim
    return flops // 2 if causal else flops


def attention_rule(q_at: int, factor: float) -> Rule:
    """``q: [B, Hq, Tq, D]`` at input ``q_at``, ``k: [B, Hkv, Tk, D]`` right after it."""

    def rule(s: OpShapes) -> int:
        (b, h, tq, d), (_, _, tk, _) = (heads_first(s, s.inputs[at]) for at in (q_at, q_at + 1))
        return round(factor * attention_flops(b, h, tq, tk, d, s.flag("causal", True)))

    return rule


def heads_first(s: OpShapes, shape: Shape) -> Shape:
    """An attention operand's ``[B, H, T, D]``, also where ``layout = "bthd"`` stores ``[B, T, H, D]``."""
    if s.text("layout", "bhtd") == "bthd":
        b, t, h, d = shape
        return (b, h, t, d)
    return tuple(shape)


def kv_cache_attention(s: OpShapes) -> int:
    """Queries over the whole cache capacity (the filled length is a runtime value): an upper bound."""
    (b, h, tq, d), capacity = heads_first(s, s.inputs[0]), s.inputs[3][2]
    return attention_flops(b, h, tq, capacity, d, causal=False)


def projection_softmax_rule(gemms: int) -> Rule:
    """``logits = x @ W^T`` (``x: [N, C]``, ``W: [V, C]``: the LM head's loss, a MoE router's
    gate) ``gemms`` times, and 5 per logit for the softmax (and its cross-entropy or top-k); a
    backward (``gemms > 1``, its gradient first) recomputes the logits, then forms ``d_x`` and ``d_W``."""

    def rule(s: OpShapes) -> int:
        x_at = 0 if gemms == 1 else 1
        (n, c), v = s.inputs[x_at], s.inputs[x_at + 1][0]
        return gemms * matmul_flops(1, n, v, c) + 5 * n * v

    return rule


def conv1d_rule(passes: int) -> Rule:
    """A depthwise causal conv: 2 FLOPs per tap per element of ``x: [B, D, T]``, 4 more per
    element for a SiLU; the backward (``passes = 2``) forms ``d_x`` and ``d_weight``."""

    def rule(s: OpShapes) -> int:
        x = numel(s.inputs[1 if passes == 2 else 0])
        activation = 4 * x if s.text("activation", "silu") == "silu" else 0
        return passes * (2 * s.integer("kernel_size", 4) * x + activation)

    return rule


def selective_scan_rule(passes: int) -> Rule:
    """Per state element (``u: [B, D, T]`` times ``N`` of ``a_log: [D, N]``): discretize (2),
    update ``h`` (4), read out ``C h`` (2); plus the ``D x`` skip (2 per element of u)."""

    def rule(s: OpShapes) -> int:
        u_at = 1 if passes == 2 else 0
        u, n = numel(s.inputs[u_at]), s.inputs[u_at + 2][1]
        return passes * (8 * u * n + 2 * u)

    return rule


# ----------------------------------------------------------------------------
# The table: one entry per primitive (and per registry kernel without a graph op)
# ----------------------------------------------------------------------------

NORM = 5  # mean of squares, rsqrt, scale, weight
ROPE = 6  # two multiplies and an add per rotated element, on q and k
SOFTMAX = 5  # max, subtract, exp, sum, divide
