"""``mdsl-attach-loss``: a causal language model's training loss as a function of the model.

Adds ``@train_loss(forward inputs..., labels [B, T] int64) -> loss`` to each
model of the module: its ``@forward``, then the mean cross-entropy of the
logits (the forward's first result) over the labels that are not
``ignore_index`` (-100, as transformers masks them), plus each further
result of the forward, a scalar auxiliary loss (a mixture of experts'
load-balancing loss, as transformers adds it when ``output_router_logits``).
``mdsl-autodiff{func=train_loss}`` derives the training step's gradient from
it. A forward that returns more than logits and scalars is E029.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.builder import Builder
from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass
from xdsl.rewriter import InsertPoint

from modeldsl.diagnostics import Diagnostic, DiagnosticError
from modeldsl.dialects.dtypes import DType
from modeldsl.dialects.graph import CallOp, FuncOp, ModelOp, ReturnOp
from modeldsl.dialects.graph_types import TensorType
from modeldsl.graph_builder import GraphBuilder

LOSS_FUNCTION = "train_loss"
IGNORE_INDEX = -100


@dataclass(frozen=True)
class AttachLossPass(ModulePass):
    name = "mdsl-attach-loss"

    ignore_index: int = IGNORE_INDEX

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for model in [m for m in op.walk() if isinstance(m, ModelOp)]:
            add_loss_function(model, self.ignore_index)


def add_loss_function(model: ModelOp, ignore_index: int = IGNORE_INDEX) -> FuncOp:
    """``@train_loss`` of ``model`` (see the module docstring), added after its other functions."""
    forward = _forward(model)
    inputs = list(forward.function_type.inputs.data)
    logits_type, *aux_types = forward.function_type.outputs.data
    if any(aux.shape for aux in aux_types):
        raise DiagnosticError([Diagnostic("E029", "@forward returns more than logits, and not only scalars: "
                                          "training adds a scalar auxiliary loss, and cannot add "
                                          f"{', '.join(str(t) for t in aux_types)}", None,
                                          "return the logits first, then scalar auxiliary losses")])
    batch, tokens, vocab = logits_type.shape
    labels_type = TensorType([batch, tokens], DType.INT64)
    func = FuncOp(LOSS_FUNCTION, [*inputs, labels_type], [], kind="helper")
    block = func.body.block
    for arg, old in zip(block.args, forward.body.block.args):
        arg.name_hint = old.name_hint
    block.args[-1].name_hint = "labels"
    at_end = Builder(InsertPoint.at_end(block))
    call = at_end.insert(CallOp("forward", list(block.args[:-1]), [logits_type, *aux_types]))
    builder = GraphBuilder.at(InsertPoint.at_end(block))
    rows = batch * tokens
    flat_logits = builder.one("view", call.res[0], shape=[rows, vocab])
    flat_labels = builder.one("view", block.args[-1], shape=[rows])
    loss, _ = builder.op("cross_entropy", flat_logits, flat_labels, ignore_index=ignore_index, reduction="mean")
    for aux in call.res[1:]:
        loss = builder.one("add", loss, aux)
    at_end.insert(ReturnOp(loss))
    func.function_type = type(func.function_type).from_lists([a.type for a in block.args], [loss.type])
    Builder(InsertPoint.at_end(model.body.block)).insert(func)
    return func


def _forward(model: ModelOp) -> FuncOp:
    """The model's ``@forward`` (E029 where it has none)."""
    for op in model.body.block.ops:
        if isinstance(op, FuncOp) and op.sym_name.data == "forward":
            return op
    raise DiagnosticError([Diagnostic("E029", f"mdsl-attach-loss: @{model.sym_name.data} has no @forward", None,
                                      "a causal language model's forward gives the logits")])
