"""``@alias`` and ``@noalias`` on a flow value (spec 5.11.2): whether it shares its input's buffer.

A flow that names an earlier value (``x -> y``) or makes a view of one (``view``,
``contiguous``, ``split``) aliases it: ``y`` is the same buffer. ``@alias`` states that and
the lowering checks it: on a flow that computes a new tensor it is E008. ``@noalias`` asks
for an independent buffer: on an aliasing flow the lowering copies the value (a ``copy`` op,
which carries the annotation, and the name stands for the copy); on a computed value the
annotation stays on the op that makes it, ``mdsl-lower-to-sched`` marks its buffer
``noalias``, and ``mdsl-plan-memory`` never lets another buffer share its storage in place
(nor it another's). Both keep the op they annotate out of fusions (a fused op would lose them).
"""

from __future__ import annotations

from collections.abc import Sequence

from xdsl.dialects.builtin import ArrayAttr
from xdsl.ir import Operation, SSAValue

from modeldsl.diagnostics import Span
from modeldsl.dialects.annotations import ANNOTATIONS_ATTR_NAME, AliasAttr, AnnotationAttr, NoaliasAttr
from modeldsl.dialects.graph_primitives import CopyOp

ALIASING_PRIMITIVES = ("mdsl.graph.view", "mdsl.graph.contiguous", "mdsl.graph.split")


class AliasingMixin:
    """``@alias`` checked, ``@noalias`` applied, on the values a flow names."""

    def apply_aliasing(self, annotations: Sequence, bound: Sequence[tuple[str, SSAValue]],
                       made: set[Operation], span_of: dict[str, Span], scope) -> None:
        """``bound``: the (name, value) pairs of a flow whose new ops are ``made``; ``span_of``:
        where each annotation of the flow is written, by name."""
        alias = next((a for a in annotations if isinstance(a, AliasAttr)), None)
        noalias = next((a for a in annotations if isinstance(a, NoaliasAttr)), None)
        if alias is None and noalias is None:
            return
        for name, value in bound:
            owner = value.owner if isinstance(value.owner, Operation) else None
            earlier = owner is None or owner not in made  # x -> y: the flow names an earlier value
            aliasing = earlier or owner.name in ALIASING_PRIMITIVES
            if alias is not None:
                if not aliasing:
                    self.sink.error("E008", f"@alias: '{name}' is computed by {owner.name.removeprefix('mdsl.graph.')}"
                                    " into a buffer of its own", span_of["alias"],
                                    "@alias marks a value that shares its input's buffer (x -> y, view, contiguous, "
                                    "split); @noalias asks for an independent one")
                elif earlier and owner is not None:
                    _drop_last(owner, alias)  # it describes this name, not the earlier flow's value
            if noalias is not None and aliasing and name != "_":
                if owner is not None:
                    _drop_last(owner, noalias)
                copy = CopyOp.make([value], [value.type], {ANNOTATIONS_ATTR_NAME: ArrayAttr([noalias])})
                copy.results[0].name_hint = name
                self.block.add_op(copy)
                scope.rebind(name, copy.results[0])


def _drop_last(op: Operation, attr: AnnotationAttr) -> None:
    """Take the last ``attr`` off ``op``'s annotations (the one this flow attached)."""
    current = op.attributes.get(ANNOTATIONS_ATTR_NAME)
    if not isinstance(current, ArrayAttr) or attr not in current.data:
        return
    items = list(current.data)
    del items[len(items) - 1 - items[::-1].index(attr)]
    if items:
        op.attributes[ANNOTATIONS_ATTR_NAME] = ArrayAttr(items)
    else:
        del op.attributes[ANNOTATIONS_ATTR_NAME]
