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
  gradient of a non-linear op reads, so the derived backward recomputes it.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence

from modeldsl.frontend.text import ast
from modeldsl.primitives import lookup_primitive

# The operations of each pattern of spec 7.5.1, as kinds of primitives in order.
PATTERN_OPS: dict[str, tuple[str, ...]] = {
    "residual_norm": ("add", "norm"),
    "norm_linear": ("norm", "matmul"),
    "gated_mlp": ("split", "gated"),
    "attention_softmax": ("scale", "softmax"),
    "bias_activation": ("add", "activation"),
    "linear_bias_act": ("matmul", "add", "activation"),
}
KINDS: dict[str, tuple[str, ...]] = {
    "add": ("add",), "bias_add": ("add",), "add3": ("add",),
    "rmsnorm": ("norm",), "layernorm": ("norm",), "fused_residual_rmsnorm": ("add", "norm"),
    "matmul": ("matmul",), "batched_matmul": ("matmul",), "grouped_gemm": ("matmul",),
    "split": ("split",), "swiglu": ("gated", "activation"), "geglu": ("gated", "activation"),
    "silu": ("activation",), "relu": ("activation",), "relu2": ("activation",), "gelu": ("activation",),
    "scale": ("scale",), "softmax": ("softmax",),
}
# Primitives whose derived gradient reads only the incoming gradient (no saved tensor).
LINEAR_OPS = frozenset({
    "add", "add3", "bias_add", "scale", "split", "concat", "view", "transpose", "permute", "contiguous",
    "copy", "cast", "reduce_sum", "reduce_mean", "zeros", "ones", "fill",
})


def fusion_problem(pattern: str | None, ops: Sequence[str] | None, performed: Sequence[str]) -> tuple[str, str] | None:
    """(message, hint) of an E013 for ``@fuse(pattern)``/``@fuse(ops=[...])`` on a flow that
    performs the primitives ``performed`` in order; None when the annotation fits."""
    if pattern is not None:
        if pattern not in PATTERN_OPS:
            close = difflib.get_close_matches(pattern, PATTERN_OPS, n=1)
            hint = f"did you mean '{close[0]}'? " if close else ""
            return f"unknown fusion pattern '{pattern}'", f"{hint}the patterns are {', '.join(PATTERN_OPS)}"
        wanted = PATTERN_OPS[pattern]
        if not _in_order(wanted, [kind for op in performed for kind in KINDS.get(op, ())]):
            return (f"the flow does not perform the operations of fusion pattern '{pattern}' "
                    f"({' + '.join(wanted)})", f"the flow performs: {', '.join(performed) or 'nothing'}")
        return None
    if ops is not None:
        unknown = [op for op in ops if lookup_primitive(op) is None]
        if unknown:
            return f"@fuse(ops=...) names '{unknown[0]}', which is not a primitive", "list primitives, e.g. ops=[matmul, add, silu]"
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


def stage_names(chain: Sequence[ast.Expr]) -> list[tuple[str, ast.Expr]]:
    """The instance names a flow's stages call (``attn`` of ``x -> attn() -> y``)."""
    names = []
    for stage in chain[1:-1]:
        func = stage.func if isinstance(stage, ast.Call) else stage
        if isinstance(func, ast.Name):
            names.append((func.id, stage))
    return names


def reads_saved_tensors(op_name: str) -> bool:
    """Whether the derived gradient of a primitive reads forward tensors (not only its gradient)."""
    return op_name not in LINEAR_OPS
