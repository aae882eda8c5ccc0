"""``mdsl-shard``: a model's programs for a parallel layout, collectives inserted where shardings meet.

``mdsl-shard{tp=1 dp=2 pp=1 ep=1 sp=false}`` takes the layout (:class:`~modeldsl.runtime.distributed.Layout`
places the ranks; spec 7.6.0) and first checks that it divides the model: ``tp`` the attention heads
(``num_heads``, ``num_kv_heads``) and the MLP's ``d_ff``, ``pp`` the layers, ``ep``
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

Tensor parallelism (``tp``), Megatron-LM's: a parameter declared ``@shard(column)`` (the q/k/v and
gate/up projections, and their biases) holds on each rank its share of the output rows, one declared
``@shard(row)`` (the o and down projections) its share of the input columns, every other parameter
all of it. The model is lowered for one rank (``tp_shapes = N`` on the model: its heads,
``num_kv_heads`` and ``d_ff`` divided by N, :mod:`modeldsl.rank_config`), so every shape is the
rank's already; the pass adds what makes the ranks one model, pattern ``tp_partial_sums``
(:class:`ReducePartialSums`): each GEMM whose product is a partial sum over the ranks is followed
by ``all_reduce(tp)``, and its readers read the sum. Those are the forward's ``NT`` GEMMs of a
row-parallel weight (``o_proj``, ``down_proj``: each rank's share of the inputs, its term of the
output) wherever they run (the forward, a recompute's replay) and the backward's ``NN`` GEMMs of a
column-parallel one (the input gradient ``dx = dy W`` of q/k/v and gate/up: each rank's heads'
term), the two all-reduces of each block Megatron's ``g`` and ``f`` place. A row-parallel GEMM's
bias is added after the sum. What the GEMMs' inputs and the norms see is then the same on every
rank, and so are the replicated parameters' gradients; a sharded parameter's gradient is its
rank's share. A sharded parameter any other op reads (a transpose, an adapter's GEMM), or a model
with LoRA adapters, is E048. Run it before ``mdsl-fuse`` (a bias or activation epilogue must not
fold into the partial sum).

Pipeline (``pp``), expert (``ep``) and sequence (``sp``) parallelism are refused (E029) until their
patterns land.
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
from modeldsl.dialects.annotations import shard_strategy
from modeldsl.dialects.graph import CallOp, FuncOp, ModelOp, ParamOp, ReturnOp, StackOp
from modeldsl.dialects.graph_primitives import MatmulOp
from modeldsl.graph_builder import GraphBuilder, op_attr
from modeldsl.passes.adapters import weight_origins
from modeldsl.passes.fuse import count_forward_ops, mark_backward_starts

SHARDED_ATTR = "sharded"
TP_SHAPES_ATTR = "tp_shapes"  # on a model lowered for one of N tensor-parallel ranks
MOVED_ATTRS = ("annotations", "memory")  # what a partial product hands to its sum (hooks, save/recompute)
# the GEMM mode whose product is a partial sum over the ranks, by the strategy of its weight
PARTIAL_MODES = {"row": "NT", "column": "NN"}
# (layout size, what it divides: the config values of the std models that name that dimension)
DIVIDES = {
    "tp": ("num_heads", "num_kv_heads", "d_ff"),
    "pp": ("n_layers",),
    "ep": ("num_experts",),
}
NOT_YET = {"pp": "pipeline", "ep": "expert"}


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


# ----------------------------------------------------------------------------- tensor parallelism


def param_shardings(model: ModelOp) -> dict[str, str]:
    """The ``@shard`` strategy of each parameter declaring one (``column``, ``row``, ``replicated``, ...)."""
    strategies = {param.sym_name.data: shard_strategy(param) for param in model.params()}
    return {name: strategy for name, strategy in strategies.items() if strategy is not None}


def tp_error(message: str, hint: str) -> DiagnosticError:
    return DiagnosticError([Diagnostic("E048", f"mdsl-shard: {message}", None, hint=hint)])


def partial_products(model: ModelOp, shardings: dict[str, str]) -> list[MatmulOp]:
    """The GEMMs whose product is each rank's term of a sum over the tensor-parallel ranks: ``NT``
    of a row-parallel weight, ``NN`` of a column-parallel one (through stacks and calls). E048 for a
    sharded weight that another op reads."""
    found = []
    for value, names in weight_origins(model).items():
        strategies = {shardings.get(n) for n in names} & set(PARTIAL_MODES)
        if not strategies:
            continue
        for use in value.uses:
            op = use.operation
            if isinstance(op, (StackOp, CallOp)) or op.name == "mdsl.graph.return":
                continue
            mode = op_attr(op, "transpose", "NN")
            if not isinstance(op, MatmulOp) or use.index != 1 or mode not in ("NT", "NN"):
                raise tp_error(f"the {'/'.join(sorted(strategies))}-parallel parameter {sorted(names)[0]} is read by "
                               f"{op.name} (operand {use.index}{', ' + mode if isinstance(op, MatmulOp) else ''})",
                               "tensor parallelism shards weights that only GEMMs read as their right operand "
                               "(x W^T and dy W); declare the parameter without @shard to replicate it")
            if any(PARTIAL_MODES[s] == mode for s in strategies):
                found.append(op)
    return found


@dataclass(frozen=True)
class ReducePartialSums(RewritePattern):
    """``tp_partial_sums``: a GEMM whose product is a partial sum, followed by ``all_reduce(tp)``,
    which its readers read instead (with its annotations and memory hints)."""

    tp: int
    partial: frozenset[Operation]

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: MatmulOp, rewriter: PatternRewriter) -> None:
        if op not in self.partial or SHARDED_ATTR in op.attributes:
            return
        product = op.results[0]
        builder = GraphBuilder.at(InsertPoint.after(op), rewriter)
        reduced = builder.one("all_reduce", product, group="tp", size=self.tp, op="sum")
        product.replace_uses_with_if(reduced, lambda use: use.operation is not reduced.owner)
        for name in MOVED_ATTRS:
            if name in op.attributes:
                reduced.owner.attributes[name] = op.attributes.pop(name)
        reduced.name_hint, product.name_hint = product.name_hint, f"{product.name_hint or 'product'}_partial"
        op.attributes[SHARDED_ATTR] = StringAttr(f"tp={self.tp}")
        rewriter.notify_op_modified(op)


def rank_shapes(model: ModelOp) -> int:
    """N where ``model`` was lowered for one of N tensor-parallel ranks (``tp_shapes``), else 1."""
    lowered = model.attributes.get(TP_SHAPES_ATTR)
    return lowered.value.data if isinstance(lowered, IntegerAttr) else 1


def check_rank_shapes(model: ModelOp, tp: int) -> None:
    """E048 unless ``model`` was lowered for one of ``tp`` ranks, with no adapters."""
    have = rank_shapes(model)
    if have != tp:
        raise tp_error(f"tp={tp}, but @{model.sym_name.data} has the shapes of "
                       f"{'the whole model' if have == 1 else f'one of {have} ranks'}",
                       f"lower the model for one of {tp} tensor-parallel ranks: modeldsl.load(..., tp={tp}), "
                       f"mdsl-run --tp {tp}")
    adapters = [p.sym_name.data for p in model.params() if isinstance(p, ParamOp) and p.is_adapter]
    if adapters:
        raise tp_error(f"tensor parallelism of a model with adapters ({adapters[0]}) is not implemented",
                       "train the adapters with data parallelism (dp=N), or leave tp=1")


def shard_tensors(module: ModuleOp, tp: int) -> None:
    """``tp_partial_sums`` over each model of ``module`` lowered for one of ``tp`` ranks."""
    partial: set[Operation] = set()
    for model in [m for m in module.walk() if isinstance(m, ModelOp)]:
        check_rank_shapes(model, tp)
        partial.update(partial_products(model, param_shardings(model)))
    boundaries = mark_backward_starts(module)
    PatternRewriteWalker(GreedyRewritePatternApplier([ReducePartialSums(tp, frozenset(partial))], dce_enabled=False),
                         apply_recursively=False).rewrite_module(module)
    count_forward_ops(boundaries)


PATTERNS: dict[str, tuple[type[RewritePattern], ...]] = {"dp_gradients": (ReduceGradients,),
                                                         "tp_partial_sums": (ReducePartialSums,)}


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
            check_divides(model, sizes if TP_SHAPES_ATTR not in model.attributes else {**sizes, "tp": 1})
        self.refuse_what_is_not_built()
        if self.tp > 1:
            shard_tensors(op, self.tp)
        if self.dp == 1:
            return
        PatternRewriteWalker(GreedyRewritePatternApplier([ReduceGradients(self.dp)], dce_enabled=False),
                             apply_recursively=False).rewrite_module(op)
