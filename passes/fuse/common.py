"""What every ``mdsl-fuse`` pattern shares: the fusion barriers, the requests of ``@fuse``, the log.

Every pattern is a :class:`FusionPattern` with the ``name`` a ``disable=`` option and a
``@fuse(name)`` annotation use. Before it merges ops it asks :meth:`FusionPattern.may_fuse`:

* no op is a barrier: ``@nofuse`` (spec 7.5.2), a ``@hook``, a ``@probe`` or an ``@assert`` (the
  executors observe or check its result: fusing it away would lose that), a replay that
  ``mdsl-recompute`` marked (its segment is kept as it is), or an op with a parameter that
  ``mdsl-specialize`` has not bound yet (a ``#mdsl.graph.sym``: its value is not known);
* no op is ``@alias``/``@noalias`` (a fused op would lose what they ask of the memory planner);
* no two ops stand on either side of a ``@barrier`` (spec 5.11.5: an ordering point), which is
  a barrier itself, so that it stays in place to divide its block (:func:`across_barrier`);
* except an ``observe`` hook (spec 5.11.3: observe hooks can be fused with surrounding ops, the
  probe inserted post-fusion) on an op whose results the fused op yields unchanged, where the
  pattern says so (``carries_hooks``, the ops named by ``may_fuse(..., carrying=...)``): the
  pattern moves the hook onto the fused op (:func:`carry_hooks`). ``modify``/``replace`` hooks
  stay barriers, and every hook does for the patterns that carry none;
* the pattern is on: on by default unless ``disable=`` names it, and on regardless for ops
  a flow's ``@fuse(pattern)``, ``@fuse(ops=[...])``, ``@fuse(scope=global)`` or
  ``@fuse_required(...)`` requests it for (spec 7.5.1; the annotation sits on the last
  op of its flow, which every pattern's match includes).

After it merges them it calls :meth:`FusionPattern.fused`, so the pass can tell a
``@fuse_required`` flow whose fusion did not happen (E013). An intermediate value can be
fused away only when nothing but the fusing op reads it (:func:`only_use`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import ClassVar

from xdsl.dialects.builtin import ArrayAttr, StringAttr
from xdsl.ir import Operation, SSAValue
from xdsl.pattern_rewriter import RewritePattern

from modeldsl.dialects.annotations import (
    ANNOTATIONS_ATTR_NAME,
    AliasAttr,
    AnnotationAttr,
    AssertAttr,
    BarrierAttr,
    FuseAttr,
    FuseRequiredAttr,
    HookAttr,
    NoaliasAttr,
    NofuseAttr,
    ProbeAttr,
    annotations_of,
)
from modeldsl.dialects.graph_primitives import is_symbolic
from modeldsl.resolve.annotation_checks import fusion_problem

BARRIERS = (NofuseAttr, HookAttr, ProbeAttr, BarrierAttr, AliasAttr, NoaliasAttr, AssertAttr)


def is_barrier(op: Operation, carried: bool = False) -> bool:
    """Whether no pattern may merge ``op`` with another; ``carried``: the fused op yields ``op``'s
    results unchanged and carries its observe hooks (those are then no barrier)."""
    if "recompute" in op.attributes or is_symbolic(op):  # a #mdsl.graph.sym parameter waits for mdsl-specialize
        return True
    return any(isinstance(a, BARRIERS) and not (carried and is_observe_hook(a)) for a in annotations_of(op))


def is_ordering_point(op: Operation) -> bool:
    return any(isinstance(a, BarrierAttr) for a in annotations_of(op))


def across_barrier(ops: Iterable[Operation], blocks: set[int]) -> bool:
    """Whether two of ``ops`` in one block stand on either side of a ``@barrier`` op (the op and
    what precedes it are one side); ``blocks``: the ids of the blocks that hold one."""
    by_block: dict[int, set[Operation]] = {}
    for op in ops:
        if op.parent is not None and id(op.parent) in blocks:
            by_block.setdefault(id(op.parent), set()).add(op)
    for members in by_block.values():
        if len(members) < 2:
            continue
        sides, side = set(), 0
        for op in next(iter(members)).parent.ops:
            if op in members:
                sides.add(side)
            side += is_ordering_point(op)
        if len(sides) > 1:
            return True
    return False


def is_observe_hook(annotation: AnnotationAttr) -> bool:
    return isinstance(annotation, HookAttr) and annotation.values.get("mode", "observe") == "observe"


def carry_hooks(fused: Operation, *sources: Operation) -> None:
    """Move the observe hooks of ``sources`` (ops whose results ``fused`` yields unchanged) onto ``fused``."""
    hooks = [a for op in sources for a in annotations_of(op) if is_observe_hook(a)]
    if hooks:
        fused.attributes[ANNOTATIONS_ATTR_NAME] = ArrayAttr([*annotations_of(fused), *hooks])


def memory_modes(op: Operation) -> list[str]:
    """An op's ``memory`` modes, ``auto`` for each result where it records none."""
    memory = op.attributes.get("memory")
    return [a.data for a in memory.data] if isinstance(memory, ArrayAttr) else ["auto"] * len(op.results)


def keeps_no_mode(op: Operation) -> bool:
    """Whether nothing asks to keep ``op``'s results: no ``@checkpoint``, no ``@memory`` mode."""
    return "checkpoint" not in op.attributes and all(m == "auto" for m in memory_modes(op))


def carry_memory_modes(fused: Operation, modes: list[str]) -> None:
    """``fused`` records ``modes`` (one per result) where any is not ``auto``."""
    if any(m != "auto" for m in modes):
        fused.attributes["memory"] = ArrayAttr([StringAttr(m) for m in modes])


def carry_checkpoint(fused: Operation, *sources: Operation) -> None:
    """``fused`` takes the ``checkpoint`` of the ops it replaces (the last one's, where several have one)."""
    for source in sources:
        if "checkpoint" in source.attributes:
            fused.attributes["checkpoint"] = source.attributes["checkpoint"]


def only_use(value: SSAValue) -> Operation | None:
    """The one op that reads ``value``, when exactly one does (once)."""
    uses = list(value.uses)
    return uses[0].operation if len(uses) == 1 else None


def same_types(*values: SSAValue) -> bool:
    return len({v.type for v in values}) == 1


def fusion_requests(op: Operation) -> list[AnnotationAttr]:
    """The ``@fuse`` and ``@fuse_required`` annotations on ``op``."""
    return [a for a in annotations_of(op) if isinstance(a, (FuseAttr, FuseRequiredAttr))]


def requests_pattern(annotation: AnnotationAttr, pattern: str) -> bool:
    """Whether a ``@fuse``/``@fuse_required`` asks for ``pattern``: by name, by ``scope=global``, or
    by an ``ops=[...]`` list that performs its operations."""
    values = annotation.values
    if values.get("pattern") is not None:
        return values["pattern"] == pattern
    if values.get("ops") is not None:
        return fusion_problem(pattern, None, list(values["ops"])) is None
    return values.get("scope") == "global"


@dataclass
class FusionSwitch:
    """Which patterns are on (by the pass's options), and the log of what each merged."""

    enabled: frozenset[str] = frozenset()
    merged: dict[str, set[Operation]] = field(default_factory=dict)
    lm_head_chunk: int = 0  # rows per chunk of the fused LM-head loss (0: chosen by size)
    barrier_blocks: set[int] = field(default_factory=set)  # ids of the blocks that hold a @barrier op


class FusionPattern(RewritePattern):
    """A rewrite pattern of ``mdsl-fuse``: ``name`` as ``disable=`` and ``@fuse`` spell it,
    ``primitives`` the ops it merges (for ``@fuse(ops=[...])``)."""

    name: ClassVar[str]
    primitives: ClassVar[tuple[str, ...]] = ()
    carries_hooks: ClassVar[bool] = False  # its fused op may yield a hooked op's results (see carry_hooks)

    def __init__(self, switch: FusionSwitch | None = None):
        self.switch = switch if switch is not None else FusionSwitch(frozenset({self.name}))

    def may_fuse(self, *ops: Operation, carrying: Iterable[Operation] = ()) -> bool:
        """No barrier among ``ops``, and the pattern on for them (by option or by a request);
        ``carrying``: those of ``ops`` whose results the fused op yields unchanged (their observe
        hooks are no barrier where the pattern ``carries_hooks``)."""
        carried = set(carrying) if self.carries_hooks else set()
        if any(is_barrier(op, op in carried) for op in ops) or across_barrier(ops, self.switch.barrier_blocks):
            return False
        return self.name in self.switch.enabled or any(self.requested_by(op) for op in ops)

    def requested_by(self, op: Operation) -> bool:
        return any(requests_pattern(a, self.name) for a in fusion_requests(op))

    def fused(self, ops: Iterable[Operation]) -> None:
        """Record that this pattern merged ``ops`` (before they are erased)."""
        self.switch.merged.setdefault(self.name, set()).update(ops)
