"""A FLOP cost model of ``mdsl.graph`` primitives and ``mdsl.sched`` programs.

Every count here is an estimate: a matrix product counts its multiply-adds
exactly (``2 * M * N * K``), attention counts the two products of its score
matrix (``4 * B * H * Tq * Tk * D``, half of it under a causal mask), and
everything else counts a small constant per element (a norm about 5, rotary
embedding 6, an add 1). Data movement (views, transposes, copies, casts,
gathers, fills) counts 0. The table :data:`FLOP_RULES` holds one rule per
primitive, keyed by the primitive's name, which is also the kernel name an
``mdsl.sched.launch`` uses, so one table prices both the graph and the
schedule:

- :func:`graph_op_flops`: one ``mdsl.graph`` primitive with concrete shapes;
- :func:`sched_op_flops`: one ``mdsl.sched`` op, from its buffer shapes;
- :func:`program_flops`: a whole program, layer loops counted once per
  layer (nested loops multiply) and the work replayed inside
  ``recompute_segment`` counted in ``recompute`` as well as in ``total``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from xdsl.dialects.builtin import IntegerAttr, StringAttr
from xdsl.ir import Attribute, Block, Operation

from modeldsl.dialects.graph_types import TensorType
from modeldsl.dialects.sched import (
    AttentionBackwardOp,
    AttentionOp,
    BufferOp,
    CollectiveOp,
    CopyOp,
    GemmOp,
    LaunchOp,
    LayerLoopOp,
    LayerViewOp,
    MemsetOp,
    ProgramOp,
    RecomputeSegmentOp,
    StreamOp,
    SyncOp,
    buffer_type,
)
from modeldsl.symbolic import SymbolicError

Shape = tuple[int, ...]

GRAPH_PREFIX = "mdsl.graph."
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


def _transposed(rows: int, cols: int, transposed: bool) -> tuple[int, int]:
    return (cols, rows) if transposed else (rows, cols)


def _matmul_rule(batched: bool) -> Rule:
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
        m, k = _transposed(a[-2], a[-1], transpose[0] == "T")
        _, n = _transposed(b[-2], b[-1], transpose[1] == "T")
        return matmul_flops(numel(c[:-2]), m, n, k)

    return rule


def linear_bias_act(s: OpShapes) -> int:
    """The GEMM (``NN``/``NT``), one add per element for the bias and the activation's work
    (ReLU 1, tanh GELU 8, as the epilogues count them)."""
    attrs = {"transpose": StringAttr(s.text("transpose", "NT"))}
    gemm = _matmul_rule(batched=False)(OpShapes(s.inputs[:2], s.outputs[:1], attrs))
    per_element = 1 + {"none": 0, "relu": 1, "gelu": 8}[s.text("activation", "none")]
    return gemm + per_element * numel(s.outputs[0])


def grouped_gemm(s: OpShapes) -> int:
    """Every token row meets one group's weights: ``2 * tokens * N * K`` (``output: [tokens, N]``)."""
    x, w = s.inputs[0], s.inputs[1]
    weights_transposed, input_transposed = (letter == "T" for letter in s.text("transpose", "TN"))
    k = x[0] if input_transposed else x[1]
    if k != (w[2] if weights_transposed else w[1]):
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


def _attention_rule(q_at: int, factor: float) -> Rule:
    """``q: [B, Hq, Tq, D]`` at input ``q_at``, ``k: [B, Hkv, Tk, D]`` right after it."""

    def rule(s: OpShapes) -> int:
        (b, h, tq, d), (_, _, tk, _) = (_heads_first(s, s.inputs[at]) for at in (q_at, q_at + 1))
        return round(factor * attention_flops(b, h, tq, tk, d, s.flag("causal", True)))

    return rule


def _heads_first(s: OpShapes, shape: Shape) -> Shape:
    """An attention operand's ``[B, H, T, D]``, also where ``layout = "bthd"`` stores ``[B, T, H, D]``."""
    if s.text("layout", "bhtd") == "bthd":
        b, t, h, d = shape
        return (b, h, t, d)
    return tuple(shape)


def kv_cache_attention(s: OpShapes) -> int:
    """Queries over the whole cache capacity (the filled length is a runtime value): an upper bound."""
    (b, h, tq, d), capacity = _heads_first(s, s.inputs[0]), s.inputs[3][2]
    return attention_flops(b, h, tq, capacity, d, causal=False)


def _projection_softmax_rule(gemms: int) -> Rule:
    """``logits = x @ W^T`` (``x: [N, C]``, ``W: [V, C]``: the LM head's loss, a MoE router's
    gate) ``gemms`` times, and 5 per logit for the softmax (and its cross-entropy or top-k); a
    backward (``gemms > 1``, its gradient first) recomputes the logits, then forms ``d_x`` and ``d_W``."""

    def rule(s: OpShapes) -> int:
        x_at = 0 if gemms == 1 else 1
        (n, c), v = s.inputs[x_at], s.inputs[x_at + 1][0]
        return gemms * matmul_flops(1, n, v, c) + 5 * n * v

    return rule


def _conv1d_rule(passes: int) -> Rule:
    """A depthwise causal conv: 2 FLOPs per tap per element of ``x: [B, D, T]``, 4 more per
    element for a SiLU; the backward (``passes = 2``) forms ``d_x`` and ``d_weight``."""

    def rule(s: OpShapes) -> int:
        x = numel(s.inputs[1 if passes == 2 else 0])
        activation = 4 * x if s.text("activation", "silu") == "silu" else 0
        return passes * (2 * s.integer("kernel_size", 4) * x + activation)

    return rule


def _selective_scan_rule(passes: int) -> Rule:
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

FLOP_RULES: dict[str, Rule] = {
    # 6.1 linear algebra
    "matmul": _matmul_rule(batched=False),
    "batched_matmul": _matmul_rule(batched=True),
    "linear_bias_act": linear_bias_act,
    "grouped_gemm": grouped_gemm,
    "grouped_gemm_weight_grad": grouped_gemm_weight_grad,
    # 6.2 normalization: about 5 per element of the normalized input (the backward's d_y)
    "rmsnorm": per_input_element(NORM, 0),
    "rmsnorm_backward": per_input_element(NORM, 0),
    "fused_residual_rmsnorm": per_input_element(NORM, 0),
    "fused_residual_rmsnorm_backward": per_input_element(NORM, 0),
    "layernorm": per_input_element(NORM, 0),
    "layernorm_backward": per_input_element(NORM, 0),
    # 6.3 activations: per element of the outputs
    "swiglu": per_output_element(5),
    "swiglu_backward": per_output_element(6),
    "geglu": per_output_element(9),
    "geglu_backward": per_output_element(10),
    "fused_split_swiglu": per_output_element(5),
    "fused_split_swiglu_backward": per_output_element(6),  # d_gate_up packs d_gate and d_up
    "fused_split_geglu": per_output_element(9),
    "fused_split_geglu_backward": per_output_element(10),
    "silu": per_output_element(4),
    "silu_backward": per_output_element(8),
    "relu": per_output_element(1),
    "relu_backward": per_output_element(1),
    "relu2": per_output_element(2),
    "relu2_backward": per_output_element(2),
    "gelu": per_output_element(8),
    "gelu_backward": per_output_element(12),
    "softmax": per_input_element(SOFTMAX, 0),
    "softmax_backward": per_input_element(SOFTMAX, 0),
    # 6.4 attention (q first in the forward, after d_out in the backward)
    "flash_attention": _attention_rule(q_at=0, factor=1.0),
    "flash_attention_backward": _attention_rule(q_at=1, factor=ATTENTION_BACKWARD_FACTOR),
    "kv_cache_attention": kv_cache_attention,
    "rope": per_output_element(ROPE),
    "rope_backward": per_output_element(ROPE),
    "qk_norm": per_input_element(NORM, 0, 1),
    "qk_norm_backward": per_input_element(NORM, 0, 1),
    "fused_qk_norm_rope": per_input_element(NORM + ROPE, 0, 1),
    "fused_qk_norm_rope_backward": per_input_element(NORM + ROPE, 0, 1),
    # 6.5 tensor manipulation: memory only
    "split": free,
    "concat": free,
    "view": free,
    "transpose": free,
    "permute": free,
    "contiguous": free,
    # 6.6 elementwise, 6.7 reductions
    "add": per_output_element(1),
    "add_backward": per_output_element(1),
    "mul": per_output_element(1),
    "mul_backward": per_output_element(1),
    "bias_add": per_output_element(1),
    "scale": per_output_element(1),
    "add_scalar": per_output_element(1),
    "causal_mask": per_output_element(1),  # a compare and select per score
    "sub": per_output_element(1),
    "div": per_output_element(1),
    "exp": per_output_element(1),
    "tanh": per_output_element(1),
    "sigmoid": per_output_element(4),  # negate, exp, add, divide
    "rsqrt": per_output_element(1),
    "log": per_output_element(1),
    "add3": per_output_element(2),
    "reduce_sum": per_input_element(1, 0),
    "reduce_mean": per_input_element(1, 0),
    "reduce_max": per_input_element(1, 0),
    "reduce_max_backward": free,
    # 6.8 embedding: a gather; its backward scatter-adds d_out
    "embedding": free,
    "embedding_backward": per_input_element(1, 0),
    # 6.9 MoE
    "moe_router": _projection_softmax_rule(gemms=1),
    "moe_router_backward": _projection_softmax_rule(gemms=2),
    "moe_compute_offsets": free,
    "moe_permute": free,
    "moe_unpermute": per_input_element(2, 0),
    "moe_unpermute_backward": per_input_element(4, 1),
    # 6.10 Mamba
    "mamba_conv1d": _conv1d_rule(passes=1),
    "mamba_conv1d_backward": _conv1d_rule(passes=2),
    "mamba_selective_scan": _selective_scan_rule(passes=1),
    "mamba_selective_scan_backward": _selective_scan_rule(passes=2),
    "mamba_conv1d_step": _conv1d_rule(passes=1),
    "mamba_selective_scan_step": _selective_scan_rule(passes=1),
    # 6.11 utility
    "zeros": free,
    "ones": free,
    "fill": free,
    "copy": free,
    "cast": free,
    # losses
    "cross_entropy": per_input_element(SOFTMAX, 0),
    "cross_entropy_backward": per_input_element(SOFTMAX, 1),
    "fused_lm_head_loss": _projection_softmax_rule(gemms=1),
    "fused_lm_head_loss_backward": _projection_softmax_rule(gemms=3),
    "fused_lm_head_loss_grad": _projection_softmax_rule(gemms=3),  # one logits GEMM, the two gradient GEMMs
    # optimizer kernels (registry only)
    "adamw": per_input_element(12, 0),
    "global_norm": lambda s: 2 * sum(numel(i) for i in s.inputs),
    "clip_factor": lambda s: 3,
}


def apply_rule(name: str, shapes: OpShapes) -> int:
    """The FLOPs of primitive (or kernel) ``name`` on ``shapes``."""
    rule = FLOP_RULES.get(name)
    if rule is None:
        raise FlopsUnknown(f"no FLOP rule for '{name}'")
    try:
        return int(rule(shapes))
    except (IndexError, ValueError, TypeError) as err:
        if isinstance(err, FlopsUnknown):
            raise
        raise FlopsUnknown(
            f"'{name}' with inputs {[list(i) for i in shapes.inputs]} and outputs "
            f"{[list(o) for o in shapes.outputs]} does not fit its FLOP rule"
        ) from None


# ----------------------------------------------------------------------------
# mdsl.graph
# ----------------------------------------------------------------------------


def concrete_shape(t: Attribute) -> Shape:
    """The integer dims of a ``TensorType`` whose dims are all bound."""
    if not isinstance(t, TensorType):
        raise FlopsUnknown(f"expected a !mdsl.graph.tensor, got {t}")
    if t.is_variadic:
        raise FlopsUnknown(f"{t} has a variadic '*': specialize the shapes first")
    try:
        return tuple(d.evaluate({}) for d in t.shape)
    except SymbolicError as err:
        raise FlopsUnknown(f"{t}: {err}: specialize the shapes first (mdsl-specialize)") from None


def graph_op_flops(op: Operation) -> int:
    """The estimated FLOPs of one ``mdsl.graph`` primitive op with concrete shapes."""
    if not op.name.startswith(GRAPH_PREFIX):
        raise FlopsUnknown(f"'{op.name}' is not an mdsl.graph primitive")
    shapes = OpShapes(
        tuple(concrete_shape(v.type) for v in op.operands),
        tuple(concrete_shape(r.type) for r in op.results),
        op.attributes,
    )
    return apply_rule(op.name[len(GRAPH_PREFIX):], shapes)


# ----------------------------------------------------------------------------
# mdsl.sched
# ----------------------------------------------------------------------------

MEMORY_OPS = (BufferOp, LayerViewOp, MemsetOp, CopyOp, CollectiveOp, StreamOp, SyncOp)
# per element of C: a bias add 1, GELU 8, its derivative times C 13 (+1 for the column sums);
# bgrada/bgradb sum the operand they reduce (see EPILOGUES in dialects/sched.py)
EPILOGUE_FLOPS_PER_ELEMENT = {
    "none": 0, "bias": 1, "relu": 1, "relu_bias": 2, "gelu": 8, "gelu_bias": 9, "gelu_aux": 8,
    "gelu_aux_bias": 9, "dgelu": 13, "dgelu_bgrad": 14, "bgrada": 0, "bgradb": 0,
}


def gemm_flops(op: GemmOp) -> int:
    """``op(A) @ op(B)`` per batch entry (C's leading dims), plus the epilogue's elementwise work
    and, for ``bgrada``/``bgradb``, one add per element of the summed operand."""
    a, b, c = (buffer_type(v).shape for v in (op.a, op.b, op.c))
    m, k = _transposed(a[-2], a[-1], bool(op.transa.value.data))
    _, n = _transposed(b[-2], b[-1], bool(op.transb.value.data))
    flops = matmul_flops(numel(c[:-2]), m, n, k)
    epilogue = op.epilogue.data
    flops += EPILOGUE_FLOPS_PER_ELEMENT.get(epilogue, 0) * numel(c)
    if epilogue == "bgrada":
        flops += numel(a)
    elif epilogue == "bgradb":
        flops += numel(b)
    return flops


def sched_attention_flops(op: AttentionOp | AttentionBackwardOp) -> int:
    """From ``q`` and ``k`` in the op's layout (``bhtd`` or ``bthd``); the backward is 2.5x."""
    q, k = buffer_type(op.q).shape, buffer_type(op.k).shape
    bthd = op.layout.data == "bthd"
    (b, tq, h, d), tk = (q, k[1]) if bthd else ((q[0], q[2], q[1], q[3]), k[2])
    flops = attention_flops(b, h, tq, tk, d, bool(op.causal.value.data))
    factor = ATTENTION_BACKWARD_FACTOR if isinstance(op, AttentionBackwardOp) else 1.0
    return round(factor * flops)


def launch_flops(op: LaunchOp) -> int:
    """The kernel's rule on its buffer shapes; a trailing ``scratch`` output is not an output."""
    outputs = [buffer_type(v).shape for v in op.outputs]
    if "scratch" in op.attributes:
        outputs = outputs[:-1]
    shapes = OpShapes(tuple(buffer_type(v).shape for v in op.inputs), tuple(outputs), op.attributes)
    return apply_rule(op.kernel.data, shapes)


@dataclass(frozen=True)
class ProgramFlops:
    """The FLOPs of a program; ``recompute`` is the part of ``total`` replayed in recompute segments."""

    total: int = 0
    recompute: int = 0

    def __add__(self, other: ProgramFlops) -> ProgramFlops:
        return ProgramFlops(self.total + other.total, self.recompute + other.recompute)

    def times(self, trips: int) -> ProgramFlops:
        return ProgramFlops(self.total * trips, self.recompute * trips)

    @property
    def recompute_fraction(self) -> float:
        return self.recompute / self.total if self.total else 0.0


def block_flops(block: Block) -> ProgramFlops:
    """The FLOPs of the ops of a block, structure included."""
    result = ProgramFlops()
    for op in block.ops:
        result += op_flops(op)
    return result


def op_flops(op: Operation) -> ProgramFlops:
    """One op: a layer loop runs its body ``upper - lower`` times; a recompute segment's work is all recompute."""
    if isinstance(op, LayerLoopOp):
        return block_flops(op.body.block).times(op.upper.value.data - op.lower.value.data)
    if isinstance(op, RecomputeSegmentOp):
        body = block_flops(op.body.block)
        return ProgramFlops(body.total, body.total)
    return ProgramFlops(sched_op_flops(op))


def sched_op_flops(op: Operation) -> int:
    """The estimated FLOPs of one ``mdsl.sched`` op (a loop or segment: all of its body's runs)."""
    if isinstance(op, GemmOp):
        return gemm_flops(op)
    if isinstance(op, (AttentionOp, AttentionBackwardOp)):
        return sched_attention_flops(op)
    if isinstance(op, LaunchOp):
        return launch_flops(op)
    if isinstance(op, (LayerLoopOp, RecomputeSegmentOp)):
        return op_flops(op).total
    if isinstance(op, MEMORY_OPS):
        return 0
    raise FlopsUnknown(f"no FLOP rule for '{op.name}'")


def program_flops(program: ProgramOp) -> ProgramFlops:
    """The FLOPs of one run of ``program``, and how many of them recompute forward work."""
    return block_flops(program.body.block)
