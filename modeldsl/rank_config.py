"""One tensor-parallel rank's model: the configuration it is lowered with, and the check of its shapes.

With ``tp`` ranks, each holds ``1/tp`` of the attention heads and of the MLP's hidden units, so one
rank's program is the model lowered with :data:`TP_DIVIDED` (``num_heads``, ``num_kv_heads``,
``d_ff``) divided by ``tp`` and :data:`TP_PINNED` (``head_dim``, which defaults to
``d_model // num_heads``) kept at the whole model's value. Every parameter declared
``@shard(column)`` then has ``1/tp`` of its output rows (dim 0 of a layer's ``[out, in]`` weight or
``[out]`` bias), every ``@shard(row)`` one ``1/tp`` of its input columns (dim 1), and every other
parameter its whole shape; :func:`lower_for_rank` checks that it is so (E048 naming the parameter,
for a model whose sizes have other names, or a parameter sized by a head count without a
``@shard`` strategy) and marks the model ``tp_shapes = tp``, the mark ``mdsl-shard{tp}`` asks for.
"""

from __future__ import annotations

from typing import Any

from xdsl.dialects.builtin import IntegerAttr, ModuleOp, i64

from modeldsl.diagnostics import Diagnostic, DiagnosticError, DiagnosticSink
from modeldsl.dialects.annotations import SHARD_DIMS
from modeldsl.dialects.graph import ModelOp, ParamRefOp, StackOp
from modeldsl.hf.checkpoint import config_integers
from modeldsl.passes.shard import DIVIDES, TP_SHAPES_ATTR, check_divides, param_shardings

TP_DIVIDED = DIVIDES["tp"]  # num_heads, num_kv_heads, d_ff
TP_PINNED = ("head_dim",)


def rank_error(message: str, hint: str) -> DiagnosticError:
    return DiagnosticError([Diagnostic("E048", message, None, hint=hint)])


def rank_values(whole: ModelOp, values: dict[str, Any], tp: int) -> dict[str, Any]:
    """The configuration of one of ``tp`` ranks of ``whole`` (lowered with ``values``; E048 where
    ``tp`` does not divide a size)."""
    check_divides(whole, {"tp": tp})
    config = config_integers(whole)
    local = dict(values)
    for name in TP_DIVIDED:
        if name in config:
            local[name] = config[name] // tp
    for name in TP_PINNED:
        if name in config:
            local[name] = config[name]
    return local


def shapes(model: ModelOp) -> dict[str, tuple[int, ...]]:
    config = config_integers(model)
    return {p.sym_name.data: tuple(d.evaluate(config) for d in p.param_type.shape) for p in model.params()}


def rank_shape(shape: tuple[int, ...], strategy: str | None, stacked: bool, tp: int) -> tuple[int, ...] | None:
    """A parameter's shape on one of ``tp`` ranks under its strategy (None: ``tp`` does not divide it)."""
    dim = SHARD_DIMS.get(strategy or "")
    if dim is None:
        return shape
    axis = dim + (1 if stacked else 0)
    if axis >= len(shape) or shape[axis] % tp:
        return None
    return (*shape[:axis], shape[axis] // tp, *shape[axis + 1:])


def stacked_names(model: ModelOp) -> set[str]:
    """The parameters a ``stack`` reads layer by layer (their leading dim the layers)."""
    return {v.owner.param.root_reference.data for op in model.walk() if isinstance(op, StackOp)
            for v in op.per_layer if isinstance(v.owner, ParamRefOp)}


def check_rank_params(whole: ModelOp, local: ModelOp, tp: int) -> None:
    """E048 for a parameter whose shape on a rank is not its whole shape cut by its ``@shard`` strategy."""
    whole_shapes, local_shapes = shapes(whole), shapes(local)
    strategies, stacked = param_shardings(whole), stacked_names(whole)
    for name, shape in whole_shapes.items():
        expected = rank_shape(shape, strategies.get(name), name in stacked, tp)
        found = local_shapes.get(name)
        if expected is None or found != expected:
            strategy = strategies.get(name)
            what = f"@shard({strategy})" if strategy else "no @shard strategy (replicated)"
            raise rank_error(
                f"tp={tp}: parameter {name} of {whole.sym_name.data} is {list(shape)} with {what}, but one rank's "
                f"model has it {list(found) if found is not None else 'not at all'}",
                "tensor parallelism divides num_heads, num_kv_heads and d_ff; a parameter sized by them needs "
                "@shard(column) (its output rows) or @shard(row) (its input columns), and one that is not stays whole")


def lower_for_rank(program: Any, top: str | None, values: dict[str, Any], tp: int,
                   sink: DiagnosticSink) -> tuple[ModuleOp, ModuleOp]:
    """The module of one of ``tp`` tensor-parallel ranks (its model marked ``tp_shapes``), and the
    whole model's, both lowered from ``program`` with ``values``."""
    from modeldsl.lower import lower_program

    whole = lower_program(program, top, values, sink=DiagnosticSink())
    module = lower_program(program, top, rank_values(model_of(whole), values, tp), sink=sink)
    local = model_of(module)
    check_rank_params(model_of(whole), local, tp)
    local.attributes[TP_SHAPES_ATTR] = IntegerAttr(tp, i64)
    return module, whole


def model_of(module: ModuleOp) -> ModelOp:
    return next(op for op in module.walk() if isinstance(op, ModelOp))
