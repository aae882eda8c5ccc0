"""``mdsl-fuse`` DAG patterns: hand-written math recognized as the primitive it spells out.

A model written op by op (or imported from ``torch.export``) spells functions that are
primitives of their own; each pattern matches the exact dataflow of one of them, rooted at
its last op, and replaces the whole DAG by the primitive, so one kernel runs instead of a
chain of elementwise launches and reductions that write every intermediate:

* ``dag_gelu``: ``0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x*x*x)))`` (the
  ``0.5`` on ``x`` or on the product) -> ``gelu(x)`` (tanh approximation);
* ``dag_silu``: ``x * sigmoid(x)`` -> ``silu(x)``;
* ``dag_softmax``: ``e = exp(x - max(x, -1, keepdim)); e / sum(e, -1, keepdim)`` -> ``softmax(x, -1)``;
* ``dag_rmsnorm``: ``w * (x * rsqrt(mean(x*x, -1, keepdim) + eps))`` -> ``rmsnorm(x, w, eps)``
  (its ``rstd`` result is left unread).

``mul`` and ``add`` match with their operands in either order. Not fused: an intermediate
that any op outside the DAG also reads (or a function returns), a constant other than the
function's (within a relative 1e-6, as a float literal writes it), a reduction over another
dim than the last or without ``keepdim``, an RMSNorm weight that is not ``[C]`` of ``x``'s last
dim, operands of other dtypes, a ``@checkpoint`` or ``@memory`` mode on an intermediate, and
a barrier (``@nofuse``, a hook or probe, a recompute replay) on any op of the DAG.

Numerics: the fused primitives compute what the written ops do, in the same order, except
GELU, whose reference cubes ``x`` with a power instead of two products: on the CPU in fp32
softmax, SiLU and RMSNorm give the written-out results bitwise; GELU differs by about one ulp of
``x`` (so relatively more in the negative tail, where ``1 + tanh`` cancels). In bf16 every fusion
also drops the roundings of the intermediates to bf16.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import permutations
from typing import ClassVar

from xdsl.dialects.builtin import ArrayAttr, StringAttr
from xdsl.ir import Operation, SSAValue
from xdsl.pattern_rewriter import PatternRewriter, op_type_rewrite_pattern
from xdsl.rewriter import InsertPoint

from modeldsl.dialects.graph_primitives import (
    AddOp,
    AddScalarOp,
    DivOp,
    ExpOp,
    MulOp,
    ReduceMaxOp,
    ReduceMeanOp,
    ReduceSumOp,
    RsqrtOp,
    ScaleOp,
    SigmoidOp,
    SubOp,
    TanhOp,
)
from modeldsl.dialects.graph_types import TensorType
from modeldsl.graph_builder import GraphBuilder, op_attr
from modeldsl.passes.fuse.common import FusionPattern, carry_checkpoint, keeps_no_mode

GELU_INNER = math.sqrt(2.0 / math.pi)
GELU_CUBIC = 0.044715
RTOL = 1e-6  # a written constant may be a rounded literal (0.7978845608) or a computed one


@dataclass
class DagMatch:
    """The ops of one written-out function (its root last), its inputs and its parameters."""

    root: Operation
    ops: list[Operation]
    inputs: list[SSAValue]
    params: dict = field(default_factory=dict)


def producer(value: SSAValue, kind: type[Operation]) -> Operation | None:
    """The op of type ``kind`` that defines ``value``, else None."""
    owner = value.owner
    return owner if isinstance(owner, kind) else None


def close(value: float | None, wanted: float) -> bool:
    """Whether ``value`` is a number (not None, nor a symbolic parameter) close to ``wanted``."""
    return isinstance(value, (int, float)) and math.isclose(value, wanted, rel_tol=RTOL)


def scaled_by(value: SSAValue, factor: float) -> ScaleOp | None:
    """The ``scale`` by ``factor`` that defines ``value``."""
    scale = producer(value, ScaleOp)
    return scale if scale is not None and close(op_attr(scale, "factor"), factor) else None


def plus_constant(value: SSAValue, constant: float) -> AddScalarOp | None:
    """The ``add_scalar`` of ``constant`` that defines ``value``."""
    add = producer(value, AddScalarOp)
    return add if add is not None and close(op_attr(add, "value"), constant) else None


def ordered_pairs(op: Operation) -> list[tuple[SSAValue, SSAValue]]:
    """The operands of a commutative binary op, in both orders."""
    return list(permutations(op.operands, 2))


def is_last_dim(t: TensorType, dim: int) -> bool:
    return dim == -1 or (not t.is_variadic and dim == len(t.shape) - 1)


def reduces_last_dim(op: Operation) -> bool:
    """A reduction of one dim, the last, keeping it (as ``x.sum(-1, keepdim=True)`` does)."""
    dims = op_attr(op, "dims") if "dims" in op.attributes else [op_attr(op, "dim")]
    return len(dims) == 1 and is_last_dim(op.operands[0].type, dims[0]) and bool(op_attr(op, "keepdim", False))


def private(match: DagMatch) -> bool:
    """Every intermediate is read only inside the DAG (a single reader where one is expected)."""
    inside = set(match.ops)
    return all(use.operation in inside
               for op in match.ops if op is not match.root for result in op.results for use in result.uses)


def annotated_intermediate(match: DagMatch) -> bool:
    """An op of the DAG other than its root keeps a ``@checkpoint`` or a ``@memory`` mode."""
    return any(op is not match.root and not keeps_no_mode(op) for op in match.ops)


def cube_of(value: SSAValue, x: SSAValue) -> list[Operation] | None:
    """The two muls of ``value = (x * x) * x`` (either order), the square first; else None."""
    outer = producer(value, MulOp)
    for square, other in ordered_pairs(outer) if outer else ():
        inner = producer(square, MulOp)
        if other is x and inner is not None and list(inner.operands) == [x, x]:
            return [inner, outer]
    return None


# ----------------------------------------------------------------------------
# The four functions
# ----------------------------------------------------------------------------


def match_gelu(root: Operation) -> DagMatch | None:
    """``mul(scale(x, 0.5), 1 + t)`` or ``scale(mul(x, 1 + t), 0.5)``, ``t`` the tanh of the cubic."""
    candidates: list[tuple[SSAValue, SSAValue, list[Operation]]] = []
    if isinstance(root, MulOp):
        candidates = [(half.operands[0], one_plus, [half]) for a, one_plus in ordered_pairs(root)
                      if (half := scaled_by(a, 0.5)) is not None]
    elif isinstance(root, ScaleOp) and close(op_attr(root, "factor"), 0.5):
        product = producer(root.operands[0], MulOp)
        candidates = [(x, one_plus, [product]) for x, one_plus in ordered_pairs(product)] if product else []
    for x, one_plus, outer in candidates:
        chain = _gelu_tanh_chain(x, one_plus)
        if chain is not None:
            return DagMatch(root, [*chain, *outer, root], [x], {"approximate": True})
    return None


def _gelu_tanh_chain(x: SSAValue, one_plus: SSAValue) -> list[Operation] | None:
    """The ops of ``1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3))``, or None."""
    plus_one = plus_constant(one_plus, 1.0)
    tanh = producer(plus_one.operands[0], TanhOp) if plus_one else None
    scale = scaled_by(tanh.operands[0], GELU_INNER) if tanh else None
    inner = producer(scale.operands[0], AddOp) if scale else None
    if inner is None:
        return None
    for a, b in ordered_pairs(inner):
        cubic = scaled_by(b, GELU_CUBIC)
        cube = cube_of(cubic.operands[0], x) if cubic and a is x else None
        if cube is not None:
            return [*cube, cubic, inner, scale, tanh, plus_one]
    return None


def match_silu(root: Operation) -> DagMatch | None:
    """``mul(x, sigmoid(x))`` (either order)."""
    if not isinstance(root, MulOp):
        return None
    for x, s in ordered_pairs(root):
        sigmoid = producer(s, SigmoidOp)
        if sigmoid is not None and sigmoid.operands[0] is x:
            return DagMatch(root, [sigmoid, root], [x])
    return None


def match_softmax(root: Operation) -> DagMatch | None:
    """``e / reduce_sum(e)`` with ``e = exp(x - reduce_max(x))``, both reductions over the last dim."""
    if not isinstance(root, DivOp):
        return None
    e, total = root.operands
    exp, summed = producer(e, ExpOp), producer(total, ReduceSumOp)
    shifted = producer(exp.operands[0], SubOp) if exp else None
    if shifted is None or summed is None or summed.operands[0] is not e:
        return None
    x, peak = shifted.operands
    maximum = producer(peak, ReduceMaxOp)
    if maximum is None or maximum.operands[0] is not x or not reduces_last_dim(maximum) \
            or not reduces_last_dim(summed):
        return None
    return DagMatch(root, [maximum, shifted, exp, summed, root], [x], {"dim": -1})


def match_rmsnorm(root: Operation) -> DagMatch | None:
    """``mul(w, mul(x, rsqrt(reduce_mean(x * x) + eps)))`` (each mul either order)."""
    if not isinstance(root, MulOp):
        return None
    for w, normed in ordered_pairs(root):
        scaled = producer(normed, MulOp)
        for x, r in ordered_pairs(scaled) if scaled else ():
            chain = _rms_chain(x, r)
            if chain is not None and _is_norm_weight(w, x):
                eps = op_attr(chain[2], "value")
                return DagMatch(root, [*chain, scaled, root], [x, w], {"eps": eps})
    return None


def _rms_chain(x: SSAValue, r: SSAValue) -> list[Operation] | None:
    """The ops of ``rsqrt(mean(x * x, -1, keepdim) + eps)``, or None."""
    rsqrt = producer(r, RsqrtOp)
    plus_eps = producer(rsqrt.operands[0], AddScalarOp) if rsqrt else None
    mean = producer(plus_eps.operands[0], ReduceMeanOp) if plus_eps else None
    square = producer(mean.operands[0], MulOp) if mean else None
    if square is None or list(square.operands) != [x, x] or not reduces_last_dim(mean):
        return None
    if not op_attr(plus_eps, "value") > 0:
        return None
    return [square, mean, plus_eps, rsqrt]


def _is_norm_weight(w: SSAValue, x: SSAValue) -> bool:
    """``w: [C]`` of ``x: [*, C]``, of ``x``'s dtype."""
    wt, xt = w.type, x.type
    return isinstance(wt, TensorType) and not wt.is_variadic and len(wt.shape) == 1 \
        and wt.shape[0] == xt.shape[-1] and wt.dtype == xt.dtype


# ----------------------------------------------------------------------------
# The patterns
# ----------------------------------------------------------------------------


class DagPattern(FusionPattern):
    """Matches ``matcher`` at the root op of a DAG (each subclass's ``match_and_rewrite`` is typed
    by the ops its DAG may end in) and replaces the DAG by ``primitive`` of the DAG's inputs."""

    primitive: ClassVar[str]
    matcher: ClassVar[Callable[[Operation], DagMatch | None]]

    def rewrite_dag(self, op: Operation, rewriter: PatternRewriter) -> None:
        found = type(self).matcher(op)
        if found is None or not self.fusable(found):
            return
        results = self.build(found, rewriter)
        self.fused(found.ops)
        rewriter.replace(op, [], [results[0]])
        for dead in sorted(found.ops[:-1], key=_position, reverse=True):
            rewriter.erase(dead)

    def fusable(self, match: DagMatch) -> bool:
        block = match.root.parent_block()
        return all(op.parent_block() is block for op in match.ops) and private(match) \
            and match.root.results[0].type == match.inputs[0].type and not annotated_intermediate(match) \
            and self.may_fuse(*match.ops)

    def build(self, match: DagMatch, rewriter: PatternRewriter) -> Sequence[SSAValue]:
        root = match.root
        results = GraphBuilder.at(InsertPoint.before(root), rewriter).op(self.primitive, *match.inputs, **match.params)
        fused = results[0].owner
        fused.location = root.location
        results[0].name_hint = root.results[0].name_hint
        carry_checkpoint(fused, root)
        memory = root.attributes.get("memory")
        if isinstance(memory, ArrayAttr):
            fused.attributes["memory"] = ArrayAttr([*memory.data, *[StringAttr("auto")] * (len(results) - 1)])
        return results


def _position(op: Operation) -> int:
    return list(op.parent_block().ops).index(op)


class DagGelu(DagPattern):
    name = "dag_gelu"
    primitives = ("mul", "scale", "add", "tanh", "add_scalar")
    primitive = "gelu"
    matcher = staticmethod(match_gelu)

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: MulOp | ScaleOp, rewriter: PatternRewriter) -> None:
        self.rewrite_dag(op, rewriter)


class DagSilu(DagPattern):
    name = "dag_silu"
    primitives = ("sigmoid", "mul")
    primitive = "silu"
    matcher = staticmethod(match_silu)

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: MulOp, rewriter: PatternRewriter) -> None:
        self.rewrite_dag(op, rewriter)


class DagSoftmax(DagPattern):
    name = "dag_softmax"
    primitives = ("reduce_max", "sub", "exp", "reduce_sum", "div")
    primitive = "softmax"
    matcher = staticmethod(match_softmax)

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: DivOp, rewriter: PatternRewriter) -> None:
        self.rewrite_dag(op, rewriter)


class DagRmsnorm(DagPattern):
    name = "dag_rmsnorm"
    primitives = ("mul", "reduce_mean", "add_scalar", "rsqrt")
    primitive = "rmsnorm"
    matcher = staticmethod(match_rmsnorm)

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: MulOp, rewriter: PatternRewriter) -> None:
        self.rewrite_dag(op, rewriter)
