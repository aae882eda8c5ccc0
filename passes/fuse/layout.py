"""``mdsl-fuse`` pattern ``attention_layout``: the head transposes around attention absorbed into its strides.

The std attention splits q, k, v out of one projection as ``[B, T, H, D]`` views and
transposes each to ``[B, H, T, D]`` (a copy), runs ``qk_norm``, ``rope`` and
``flash_attention`` there, and transposes the output back::

    q = transpose(view(q_flat), 1, 2)   (k, v alike)
    (q_n, k_n, ...) = qk_norm(q, k, ...)        (optional)
    (q_r, k_r) = rope(q_n, k_n, freqs)          (optional)
    (att, lse) = flash_attention(q_r, k_r, v)
    att_t = transpose(att, 1, 2)

becomes the same ops on the ``[B, T, H, D]`` views with ``layout = "bthd"`` on rope and
flash_attention (``mdsl.sched.attention``'s ``layout``, and the position axis of rope): no
transpose, no copy. ``qk_norm`` normalizes rows of D and needs no layout: in ``bthd`` its
rstd results are ``[B, T, H]``. ``lse`` stays ``[B, H, T]``. The arithmetic is the same
(the same values in the same order), so results are bitwise equal.

It fires only where every transpose of the chain is matched and nothing else reads a value
whose layout changes: not where a transposed q/k/v, a rope or qk_norm result, a qk_norm
rstd or the attention output has another reader (a function result: in the training step
the saved ``q_rot, k_rot, v, att`` are read by the backward, so the forward keeps its
layout there), not across a barrier (``@nofuse``, a ``@hook``, e.g. the std model's
``@hook(BeforeAttention)`` on rope, whose observed value keeps its layout; a ``@probe``;
a recompute replay), not on transposes of other dims, ALiBi or a ``bthd`` attention.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from xdsl.dialects.builtin import StringAttr
from xdsl.ir import Operation, SSAValue
from xdsl.pattern_rewriter import PatternRewriter, op_type_rewrite_pattern

from modeldsl.dialects.graph_primitives import FlashAttentionOp, QkNormOp, RopeOp, TransposeOp
from modeldsl.dialects.graph_types import TensorType
from modeldsl.passes.fuse.common import FusionPattern, only_use

LAYOUT_OPS = (RopeOp, FlashAttentionOp)  # ops that take the ``layout`` attribute


@dataclass
class HeadChain:
    """The ops between the head transposes and the attention: ``entries`` (transposes into
    ``[B, H, T, D]``), ``middle`` (qk_norm, rope in block order), and the attention's ``exit`` transpose."""

    entries: list[TransposeOp] = field(default_factory=list)
    middle: list[Operation] = field(default_factory=list)

    def ops(self, attention: Operation, exit_: TransposeOp) -> list[Operation]:
        return [*self.entries, *self.middle, attention, exit_]


def is_head_transpose(op: Operation | None) -> bool:
    """A transpose of dims 1 and 2 of a 4-d tensor (``[B, T, H, D]`` <-> ``[B, H, T, D]``)."""
    if not isinstance(op, TransposeOp) or not isinstance(op.x.type, TensorType) or op.x.type.is_variadic:
        return False
    return op.x.type.rank == 4 and {op.dim0.value.data % 4, op.dim1.value.data % 4} == {1, 2}


def read_only_by(value: SSAValue, readers: set[Operation]) -> bool:
    """Every use of ``value`` is by one of ``readers`` (and there is one)."""
    uses = list(value.uses)
    return bool(uses) and all(u.operation in readers for u in uses)


def head_chain(attention: FlashAttentionOp) -> HeadChain | None:
    """The chain feeding q, k, v of ``attention``, when each operand starts at a head transpose
    and every value on the way is read only by the next op of the chain; else None."""
    chain = HeadChain()
    pending = [(value, attention) for value in attention.operands[:3]]
    while pending:
        value, reader = pending.pop()
        op = value.owner
        if not isinstance(op, Operation) or not read_only_by(value, {reader}):
            return None
        if op in chain.entries or op in chain.middle:
            continue
        if is_head_transpose(op):
            chain.entries.append(op)
        elif isinstance(op, QkNormOp) or isinstance(op, RopeOp) and op.layout.data == "bhtd":
            if not all(_read_within(r, reader) for r in op.results[:2]):
                return None
            if isinstance(op, QkNormOp) and any(list(r.uses) for r in op.results[2:]):
                return None  # a reader of rstd (the backward) would see [B, T, H] instead of [B, H, T]
            chain.middle.append(op)
            pending.extend((operand, op) for operand in op.operands[:2])
        else:
            return None
    chain.middle.sort(key=_position)
    return chain


def _read_within(value: SSAValue, reader: Operation) -> bool:
    """``value`` is read only by ``reader`` (a rope result by the attention, a qk_norm result by rope)."""
    return all(u.operation is reader for u in value.uses)


def _position(op: Operation) -> int:
    return list(op.parent_block().ops).index(op)


def heads_last(t: TensorType) -> TensorType:
    """``[B, H, T, D]`` as ``[B, T, H, D]`` (and back): dims 1 and 2 swapped."""
    shape = list(t.shape)
    shape[1], shape[2] = shape[2], shape[1]
    return t.with_shape(shape)


def bthd_result_types(op: Operation) -> list[TensorType]:
    """The result types of a chain op once it works on ``[B, T, H, D]``: its 4-d results swap
    dims 1 and 2, qk_norm's rstd ([B, H, T] -> [B, T, H]) too; attention's lse stays."""
    types = []
    for r in op.results:
        t = r.type
        if isinstance(op, FlashAttentionOp) and r is op.lse:
            types.append(t)
        elif t.rank == 4:
            types.append(heads_last(t))
        else:
            types.append(t.with_shape([t.shape[0], t.shape[2], t.shape[1]]))
    return types


class AttentionLayout(FusionPattern):
    """The head transposes of q, k, v and of the attention output removed: qk_norm, rope and
    flash_attention on ``[B, T, H, D]`` (``layout = "bthd"``)."""

    name = "attention_layout"
    primitives = ("transpose", "flash_attention")  # qk_norm and rope may stand between them

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: FlashAttentionOp, rewriter: PatternRewriter) -> None:
        if op.layout.data != "bhtd" or op.alibi_slopes is not None:
            return
        exit_ = only_use(op.out)
        if not is_head_transpose(exit_):
            return
        chain = head_chain(op)
        if chain is None:
            return
        ops = chain.ops(op, exit_)
        if not self.may_fuse(*ops):
            return
        self.fused(ops)
        for entry in chain.entries:
            rewriter.replace(entry, [], [entry.x])
        for middle in [*chain.middle, op]:
            new = _in_bthd(middle)
            rewriter.replace(middle, [new], new.results)
        rewriter.replace(exit_, [], [exit_.x])


def _in_bthd(op: Operation) -> Operation:
    """``op`` on ``[B, T, H, D]`` operands (as the erased transposes left them), ``layout = "bthd"``
    where it takes one; the results keep their names."""
    attributes = dict(op.attributes)
    if isinstance(op, LAYOUT_OPS):
        attributes["layout"] = StringAttr("bthd")
    new = type(op).create(operands=list(op.operands), result_types=bthd_result_types(op),
                          attributes=attributes, properties=dict(op.properties))
    new.location = op.location
    for old, fresh in zip(op.results, new.results):
        fresh.name_hint = old.name_hint
    return new

