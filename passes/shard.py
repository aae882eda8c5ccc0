"""``mdsl-shard``: a model's programs for a parallel layout, collectives inserted where shardings meet.

``mdsl-shard{tp=1 dp=2 pp=1 ep=1 sp=false}`` takes the layout (:class:`~modeldsl.runtime.distributed.Layout`
places the ranks; spec 7.6.0) and first checks that it divides the model: ``tp`` the attention heads
(``num_heads``, ``num_kv_heads``), the MLP's ``d_ff`` and the vocabulary, ``pp`` the layers, ``ep``
the experts; a size that does not divide is E048 naming the dimension and its value.

Data parallelism (``dp``): every rank holds every parameter and runs the step on its own rows of
the batch. In each gradient function (``mdsl-autodiff``'s ``@NAME_grad``: its ``grads`` name the
parameter gradients it returns after its own results) the pattern ``dp_gradients``
(:class:`ReduceGradients`) sums each parameter gradient over the ``dp`` group right where it is
made: ``all_reduce(d_W) {group = "dp", size = dp, op = "sum"}``, the returned value; the
function's own results (the loss) and its inputs' gradients stay the rank's. Lowered into a
training step's grads arena (``mdsl-lower-to-sched{grads_arena=true}``), a returned ``all_reduce``
of a gradient reduces the grads buffer in place once the gradient is added into it: the rank's
accumulated gradient, with no copy (a stacked parameter's layer by layer, inside the backward's
layer loop, as each layer's gradient is done). The caller runs the reducing step for the last
micro-batch of an optimizer step only (the others accumulate the rank's own, as DDP's
``no_sync``) and seeds each rank's loss gradient with ``1 / (dp * micro-batches)``, so the summed
gradient is the mean over the global batch, the same on every rank, and every rank's optimizer
step makes the same update. The function is marked ``sharded = "dp=N"``: the pass runs
once.

Tensor (``tp``), pipeline (``pp``), expert (``ep``) and sequence (``sp``) parallelism are refused
(E029) until their patterns land.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import IntegerAttr, ModuleOp, StringAttr
from xdsl.ir import Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.pattern_rewriter import (
    GreedyRewritePatternApplier,
    PatternRewriter,
    PatternRewriteWalker,
    RewritePattern,
    op_type_rewrite_pattern,
)
from xdsl.rewriter import InsertPoint

from modeldsl.diagnostics import Diagnostic, DiagnosticError, PassOptionError
from modeldsl.dialects.graph import FuncOp, ModelOp, ReturnOp
from modeldsl.graph_builder import GraphBuilder

SHARDED_ATTR = "sharded"
# (layout size, what it divides: the config values of the std models that name that dimension)
DIVIDES = {
    "tp": ("num_heads", "num_kv_heads", "d_ff", "vocab_size"),
    "pp": ("n_layers",),
    "ep": ("num_experts",),
}
NOT_YET = {"tp": "tensor", "pp": "pipeline", "ep": "expert"}


def check_divides(model: ModelOp, sizes: dict[str, int]) -> None:
    """E048 for a layout size that does not divide the model dimension it shards."""
    config = model.config.data if model.config is not None else {}
    for option, names in DIVIDES.items():
        size = sizes.get(option, 1)
        for name in names:
            value = config.get(name)
            if isinstance(value, IntegerAttr) and size > 1 and value.value.data % size:
                raise DiagnosticError([Diagnostic(
                    "E048", f"mdsl-shard: {option}={size} does not divide {name}={value.value.data} of "
                    f"{model.sym_name.data}", None,
                    hint=f"choose a {option} that divides {name} (its divisors: "
                         f"{', '.join(str(d) for d in divisors(value.value.data))})")])


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def gradient_results(func: FuncOp) -> list[int]:
    """The indices of an ``mdsl-autodiff`` gradient function's parameter gradients among its results
    (after the function's own results, before its inputs' gradients); none for another function."""
    params, inputs = func.attributes.get("grads"), func.attributes.get("input_grads")
    if params is None or inputs is None:
        return []
    total = len(func.function_type.outputs.data)
    first = total - len(params.data) - len(inputs.data)
    return list(range(first, first + len(params.data)))


def insertion_point(value: SSAValue) -> InsertPoint:
    """Right after ``value`` is made (at its block's start for an argument)."""
    if isinstance(value.owner, Operation):
        return InsertPoint.after(value.owner)
    return InsertPoint.at_start(value.owner)


@dataclass(frozen=True)
class ReduceGradients(RewritePattern):
    """``dp_gradients``: each parameter gradient of a gradient function summed over the ``dp`` group."""

    dp: int

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: FuncOp, rewriter: PatternRewriter) -> None:
        indices = gradient_results(op)
        if not indices or SHARDED_ATTR in op.attributes:
            return
        ret = op.body.block.last_op
        assert isinstance(ret, ReturnOp)
        for index in indices:
            gradient = ret.operands[index]
            builder = GraphBuilder.at(insertion_point(gradient))
            reduced = builder.one("all_reduce", gradient, group="dp", size=self.dp, op="sum")
            reduced.name_hint = gradient.name_hint
            ret.operands[index] = reduced
        op.attributes[SHARDED_ATTR] = StringAttr(f"dp={self.dp}")
        rewriter.notify_op_modified(op)


PATTERNS: dict[str, tuple[type[RewritePattern], ...]] = {"dp_gradients": (ReduceGradients,)}


@dataclass(frozen=True)
class ShardPass(ModulePass):
    name = "mdsl-shard"

    tp: int = 1
    dp: int = 1
    pp: int = 1
    ep: int = 1
    sp: bool = False

    def __post_init__(self) -> None:
        for option in ("tp", "dp", "pp", "ep"):
            value = getattr(self, option)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise PassOptionError(f"{self.name}: {option}={value} is not a positive integer", option,
                                      f"{option}=2 shards over two ranks; 1 leaves it alone")
        if not isinstance(self.sp, bool):
            raise PassOptionError(f"{self.name}: sp={self.sp} is not true or false", "sp",
                                  "sp=true shards the sequence over the tensor-parallel ranks")

    def refuse_what_is_not_built(self) -> None:
        refused = [f"{option}={getattr(self, option)}: {kind}" for option, kind in NOT_YET.items()
                   if getattr(self, option) > 1] + (["sp=true: sequence"] if self.sp else [])
        if refused:
            raise DiagnosticError([Diagnostic("E029", f"{self.name}: {refused[0]} parallelism is not implemented yet",
                                              None, hint="data parallelism is: dp=N")])

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        sizes = {"tp": self.tp, "pp": self.pp, "ep": self.ep}
        for model in [m for m in op.walk() if isinstance(m, ModelOp)]:
            check_divides(model, sizes)
        self.refuse_what_is_not_built()
        if self.dp == 1:
            return
        PatternRewriteWalker(GreedyRewritePatternApplier([ReduceGradients(self.dp)], dce_enabled=False),
                             apply_recursively=False).rewrite_module(op)
