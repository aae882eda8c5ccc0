"""What every ``mdsl-fuse`` pattern checks before it merges ops: the fusion barriers.

An op is a barrier when it carries ``@nofuse`` (spec 7.5.2), a ``@hook`` or a
``@probe`` (the executors observe its result: fusing it away would lose the
observation), or when it is a replay ``mdsl-recompute`` marked (its segment is
kept as it is). An intermediate value can be fused away only when nothing but
the fusing op reads it.
"""

from __future__ import annotations

from xdsl.ir import Operation, SSAValue

from modeldsl.dialects.annotations import HookAttr, NofuseAttr, ProbeAttr, annotations_of

BARRIERS = (NofuseAttr, HookAttr, ProbeAttr)


def is_barrier(op: Operation) -> bool:
    """Whether no pattern may merge ``op`` with another."""
    return "recompute" in op.attributes or any(isinstance(a, BARRIERS) for a in annotations_of(op))


def only_use(value: SSAValue) -> Operation | None:
    """The one op that reads ``value``, when exactly one does (once)."""
    uses = list(value.uses)
    return uses[0].operation if len(uses) == 1 else None


def same_types(*values: SSAValue) -> bool:
    return len({v.type for v in values}) == 1
