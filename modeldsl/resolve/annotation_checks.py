"""Checks of annotations against the graph they annotate: E013, E025 and W003.

The fusion and sharding passes come later; these are the checks of spec 7.5.1,
7.6 and 5.12.6 that the frontend can make now, on the ops a flow lowered to:

- E013 (invalid fusion pattern): ``@fuse``/``@fuse_required`` with a pattern
  name that is not one of the spec's patterns, an ``ops=[...]`` list naming
  something that is not a primitive, or a pattern or list whose operations the
  annotated flow does not perform in that order;
- E025 (checkpoint spans pipeline stages): a ``@checkpoint`` flow that runs
  module instances of different ``@partition`` stages, or of another stage
  than the flow's own ``@partition``;
- W003 (suboptimal auto-derived backward): a module without a written
  backward whose ``save:`` list leaves out a tensor that the derived
  gradient of an op reads (found by running the op's VJP rule on a scratch
  block) and that is not a view of kept tensors, so the derived backward
  recomputes it.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence

from xdsl.ir import Block, Operation, SSAValue

from modeldsl.dialects.fusion_patterns import KNOWN, PASS_PATTERNS, SPEC_PATTERNS
from modeldsl.frontend.text import ast
from modeldsl.graph_builder import GraphBuilder, GraphBuildError
from modeldsl.primitives import STATISTICS, lookup_primitive
from modeldsl.prims import by_name

# The operations of each pattern of spec 7.5.1, as kinds of primitives in order (the one list:
# modeldsl.dialects.fusion_patterns).
PATTERN_OPS: dict[str, tuple[str, ...]] = SPEC_PATTERNS
# Ops whose result is a view (or a copy) of their operand: recomputing it costs nothing.
VIEW_OPS = frozenset({"view", "transpose", "permute", "split", "contiguous", "copy"})


def pass_patterns() -> dict[str, tuple[str, ...]]:
    """``mdsl-fuse``'s own patterns and the primitives each merges."""
    return PASS_PATTERNS


def fusion_kinds(primitive: str) -> tuple[str, ...]:
    """The kinds of operation spec 7.5.1's patterns name ``primitive`` by (its registry record's)."""
    entry = by_name().get(primitive)
    return entry.fusion_kinds if entry is not None else ()


def fusion_problem(pattern: str | None, ops: Sequence[str] | None, performed: Sequence[str]) -> tuple[str, str] | None:
    """(message, hint) of an E013 for ``@fuse(pattern)``/``@fuse(ops=[...])`` on a flow that
    performs the primitives ``performed`` in order; None when the annotation fits. A pattern is
    one of spec 7.5.1's table (its operations by kind, in order) or one ``mdsl-fuse`` implements
    (its primitives, in any order: a scale may stand before or after its matmul)."""
    if pattern is not None:
        own = pass_patterns()
        if pattern not in PATTERN_OPS and pattern in own:
            missing = [p for p in own[pattern] if p not in performed]
            if missing:
                return (f"the flow does not perform the operations of fusion pattern '{pattern}' "
                        f"({' + '.join(own[pattern])})", f"the flow performs: {', '.join(performed) or 'nothing'}")
            return None
        if pattern not in PATTERN_OPS:
            known = list(KNOWN)
            close = difflib.get_close_matches(pattern, known, n=1)
            hint = f"did you mean '{close[0]}'? " if close else ""
            return f"unknown fusion pattern '{pattern}'", f"{hint}the patterns are {', '.join(known)}"
        wanted = PATTERN_OPS[pattern]
        if not _in_order(wanted, [kind for op in performed for kind in fusion_kinds(op)]):
            return (f"the flow does not perform the operations of fusion pattern '{pattern}' "
                    f"({' + '.join(wanted)})", f"the flow performs: {', '.join(performed) or 'nothing'}")
        return None
    if ops is not None:
        unknown = [op for op in ops if lookup_primitive(op) is None]
        if unknown:
            return (f"@fuse(ops=...) names '{unknown[0]}', which is not a primitive",
                    "list primitives, e.g. ops=[matmul, add, silu]")
        if not _in_order(ops, performed):
            return (f"the flow does not perform {', '.join(ops)} in this order",
                    f"the flow performs: {', '.join(performed) or 'nothing'}")
    return None


def _in_order(wanted: Sequence[str], performed: Sequence[str]) -> bool:
    """Whether ``wanted`` is a subsequence of ``performed``."""
    remaining = iter(performed)
    return all(any(item == op for op in remaining) for item in wanted)


def declared_partition(decl: ast.Decl, name: str) -> int | None:
    """The ``@partition(stage)`` on the declaration of parameter ``name`` of ``decl``."""
    for section in decl.sections("params"):
        for entry in section.body:
            if isinstance(entry, ast.Section) and entry.name == name and entry.value is not None:
                return partition_of(entry.value.annotations)
    return None


def partition_of(annotations: Iterable[ast.Annotation]) -> int | None:
    """The stage of a ``@partition(stage)`` among annotations (None when there is none)."""
    for annotation in annotations:
        if annotation.name != "partition":
            continue
        for arg in annotation.args:
            if arg.name in (None, "stage") and isinstance(arg.value, ast.Int):
                return arg.value.value
    return None


def stage_names(chain: Sequence[ast.Expr]) -> list[str]:
    """The instance names a flow's stages call (``attn`` of ``x -> attn() -> y``)."""
    names = []
    for stage in chain[1:-1]:
        func = stage.func if isinstance(stage, ast.Call) else stage
        if isinstance(func, ast.Name):
            names.append(func.id)
    return names


def read_by_gradient(op: Operation) -> list[SSAValue]:
    """The forward values (operands and results of ``op``) that its derived gradient reads:
    the VJP rule runs on a scratch block, whose ops are then erased."""
    from modeldsl.vjp import RULES

    name = op.name.removeprefix("mdsl.graph.")
    sig, rule = lookup_primitive(name), RULES.get(name)
    if sig is None or rule is None:
        return []
    scratch = Block(arg_types=[r.type for r in op.results])
    grads = [None if slot.name in STATISTICS else arg for slot, arg in zip(sig.outputs, scratch.args)]
    try:
        rule(GraphBuilder(scratch), op, grads)
    except (GraphBuildError, NotImplementedError, ValueError):
        pass  # a gradient it cannot derive is reported where the backward is derived
    forward = [*op.operands, *op.results]
    read = [v for v in forward if any(use.operation.parent is scratch for use in v.uses)]
    for created in reversed(list(scratch.ops)):
        scratch.erase_op(created, safe_erase=False)
    return read


def cheap_to_recompute(value: SSAValue, kept: set[SSAValue]) -> bool:
    """Whether ``value`` is a view of kept values (walked without recursion)."""
    stack = [value]
    while stack:
        value = stack.pop()
        if value in kept or not isinstance(value.owner, Operation):
            continue
        name = value.owner.name.removeprefix("mdsl.graph.")
        if name == "param_ref":
            continue
        if name not in VIEW_OPS:
            return False
        stack.extend(value.owner.operands)
    return True
