"""``mdsl-optimizer-step``: the AdamW update of a model's parameters as an ``mdsl.sched`` program.

``mdsl-optimizer-step{beta1=0.9 beta2=0.999 eps=1e-8 weight_decay=0.01
clip_norm=1.0 storage=fp32}`` adds ``@optimizer_step`` after each specialized
model of the module. It declares the model's parameters and gradients exactly
as a training step lowered with ``mdsl-lower-to-sched{grads_arena=true}`` does
(every parameter, then one fp32 gradient per trainable parameter, in the
model's order), so the two programs share the ``params`` and ``grads`` arenas,
and keeps two fp32 moments per trainable parameter in the ``optimizer`` arena
(tagged ``moment = "exp_avg.NAME"`` / ``"exp_avg_sq.NAME"``). Per step it

0. clips the gradient of each parameter declared ``@trainable(grad_clip=C)``
   (spec 7.8.2) on its own, as ``torch.nn.utils.clip_grad_norm_([p], C)``:
   ``global_norm`` of that gradient, ``clip_factor`` and an in-place ``mul``
   (a stacked block's parameter layer by layer: each layer's tensor is a
   parameter of its own);
1. launches ``global_norm`` over all the gradients (output 0: the norm
   before clipping) and, with ``clip_norm > 0``, ``clip_factor`` (torch's
   ``clip_grad_norm_`` coefficient);
2. launches ``adamw`` in place on each parameter and its moments, reading
   the runtime learning rate (input 0, ``[1]`` fp32: the warmup/cosine
   schedule's value for this step) and step number (input 1, ``[1]`` int64,
   1-based: the bias correction), with the parameter's
   ``@trainable(lr_scale, wd_scale)`` (spec 7.8.2) folded into its
   attributes (``lr_scale``, ``weight_decay``);
3. zeroes every gradient, so the next step's micro-batches accumulate from 0.

``@frozen`` parameters have no gradient, no moments and no update. A 16-bit
parameter (bf16 or fp16 storage, mixed precision) is updated through an fp32
master copy in the ``optimizer`` arena (tagged ``master = "NAME"``; the
caller fills it with the fp32 weights once): ``adamw`` runs on the master,
then a ``cast`` launch writes the rounded weights the next step computes with.

ZeRO-1 (``dp=N rank=R zero=1``): the optimizer state is shared out over the N data-parallel ranks
by parameter (:func:`zero_owners`: the largest first, each to the rank holding the fewest bytes so
far). Rank R's program keeps the moments (and masters) of its own parameters only and updates
those; then every parameter is broadcast over the ``dp`` group from its owner
(``mdsl.sched.collective "broadcast"``), so every rank computes the next step with the same
weights. Each grad buffer carries its ``owner``. The gradients (summed over the ranks by the
training step) and their global norm are every rank's, so the update is plain data parallelism's,
bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import BoolAttr, FloatAttr, IntegerAttr, ModuleOp, StringAttr, f64, i64
from xdsl.ir import Attribute, Operation, SSAValue
from xdsl.passes import ModulePass

from modeldsl.diagnostics import PassOptionError
from modeldsl.dialects.annotations import SHARD_DIMS, TrainableAttr, annotations_of
from modeldsl.dialects.dtypes import DType
from modeldsl.dialects.graph import ModelOp, ParamOp, ParamRefOp, StackOp
from modeldsl.dialects.sched import BufferOp, BufferType, CollectiveOp, LaunchOp, MemsetOp, ProgramOp
from modeldsl.passes.lower_to_sched import gradient_buffers, parameter_buffers
from modeldsl.passes.shard import param_shardings

PROGRAM_NAME = "optimizer_step"
MOMENTS = ("exp_avg", "exp_avg_sq")


@dataclass(frozen=True)
class OptimizerStepPass(ModulePass):
    name = "mdsl-optimizer-step"

    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.01
    clip_norm: float = 0.0
    storage: str = ""
    dp: int = 1
    rank: int = 0
    zero: int = 0
    tp: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.tp, bool) or not isinstance(self.tp, int) or self.tp < 1:
            raise PassOptionError(f"{self.name}: tp={self.tp} is not a positive integer", "tp",
                                  "tp=2: the gradient norm sums the sharded gradients' squares over two ranks")
        if self.storage not in ("", "fp32"):
            raise PassOptionError(f"mdsl-optimizer-step: storage={self.storage} is not fp32", "storage",
                                  "storage=fp32 or leave it out")
        check_zero(self.name, self.dp, self.rank, self.zero)

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for model in [m for m in op.body.block.ops if isinstance(m, ModelOp)]:
            program = optimizer_program(model, self.beta1, self.beta2, self.eps, self.weight_decay,
                                        self.clip_norm, self.storage == "fp32",
                                        (self.dp, self.rank) if self.zero else None, self.tp)
            op.body.block.insert_op_after(program, model)


def check_zero(name: str, dp: int, rank: int, zero: int) -> None:
    """The ZeRO options: ``zero`` 0 or 1, 1 only over several data-parallel ranks, ``rank`` one of them."""
    for option, value, low in (("dp", dp, 1), ("rank", rank, 0), ("zero", zero, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise PassOptionError(f"{name}: {option}={value} is not an integer >= {low}", option,
                                  "dp=2 rank=0 zero=1 shares the optimizer state over two ranks")
    if zero not in (0, 1):
        raise PassOptionError(f"{name}: zero={zero}: ZeRO stage 1 (the optimizer state) is the one built", "zero",
                              "zero=1, or zero=0 for every rank's full state")
    if zero and dp == 1:
        raise PassOptionError(f"{name}: zero=1 shares the optimizer state over the data-parallel ranks: dp=1 has "
                              "one", "dp", "give dp=2 or more with zero=1")
    if rank >= dp:
        raise PassOptionError(f"{name}: rank={rank} is not one of dp={dp} ranks", "rank", f"give rank 0..{dp - 1}")


def zero_owners(sizes: dict[str, int], ranks: int) -> dict[str, int]:
    """ZeRO-1's owner rank of each trainable parameter: the largest first (then by name), each to the
    rank that holds the fewest bytes so far (the lowest such rank)."""
    load, owners = [0] * ranks, {}
    for name, size in sorted(sizes.items(), key=lambda item: (-item[1], item[0])):
        rank = min(range(ranks), key=lambda r: (load[r], r))
        owners[name], load[rank] = rank, load[rank] + size
    return owners


def optimizer_program(model: ModelOp, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8,
                      weight_decay: float = 0.01, clip_norm: float = 0.0, fp32_storage: bool = False,
                      zero: tuple[int, int] | None = None, tp: int = 1) -> ProgramOp:
    """``@optimizer_step`` of a specialized model (see the module docstring); ``zero``: ZeRO-1's
    (data-parallel ranks, this rank); ``tp``: the tensor-parallel ranks whose shares of the sharded
    parameters' gradients the norm is over."""
    params = {p.attributes["param"].data: p for p in parameter_buffers(model, fp32_storage)}
    grads = gradient_buffers(model, fp32_storage)
    owners = {} if zero is None else \
        zero_owners({g.attributes["grad"].data: g.result.type.nbytes for g in grads}, zero[0])
    for grad in grads:
        if owners:
            grad.attributes["owner"] = _index(owners[grad.attributes["grad"].data])
    updated_here = [g for g in grads if zero is None or owners[g.attributes["grad"].data] == zero[1]]
    buffers: list[BufferOp] = [*params.values(), *grads]
    state: dict[str, list[SSAValue]] = {}  # name -> [the fp32 weights adamw updates, exp_avg, exp_avg_sq]
    for grad in updated_here:
        name = grad.attributes["grad"].data
        fp32 = grad.result.type
        owned = [_buffer("optimizer", fp32, f"{m}.{name}", {"moment": StringAttr(f"{m}.{name}")}) for m in MOMENTS]
        if params[name].result.type.dtype != DType.FP32:  # a 16-bit parameter: updated through an fp32 master
            owned.insert(0, _buffer("optimizer", fp32, f"master.{name}", {"master": StringAttr(name)}))
        buffers += owned
        updated = [] if len(owned) == 3 else [params[name].result]  # a master copy, else the parameter itself
        state[name] = [*updated, *(b.result for b in owned)]
    lr = _buffer("external", BufferType([1], DType.FP32), "lr", {"input": _index(0)})
    step = _buffer("external", BufferType([1], DType.INT64), "step", {"input": _index(1)})
    norm = _buffer("external", BufferType([], DType.FP32), "grad_norm", {"output": _index(0)})
    buffers += [lr, step, norm]
    runtime = [lr.result, step.result]
    work, scratch = parameter_clipping(model, grads)
    buffers += scratch
    norm_work, norm_scratch = norm_launches(grads, norm.result, sharded_gradients(model, grads, tp), tp)
    work += norm_work
    buffers += norm_scratch
    if clip_norm > 0 and grads:
        factor = _buffer("workspace", BufferType([], DType.FP32), "clip_factor")
        buffers.append(factor)
        work.append(LaunchOp("clip_factor", [norm.result], [factor.result], {"max_norm": _float(clip_norm)}))
        runtime.append(factor.result)
    scales = parameter_scales(model)
    casts = []
    for grad in updated_here:
        name = grad.attributes["grad"].data
        lr_scale, wd_scale = scales.get(name, (1.0, 1.0))
        attrs = {"beta1": _float(beta1), "beta2": _float(beta2), "eps": _float(eps),
                 "weight_decay": _float(weight_decay * wd_scale), "lr_scale": _float(lr_scale)}
        weights, exp_avg, exp_avg_sq = state[name]
        work.append(LaunchOp("adamw", [weights, grad.result, exp_avg, exp_avg_sq, *runtime],
                             [weights, exp_avg, exp_avg_sq], attrs, inplace=True))
        if weights is not params[name].result:
            casts.append(LaunchOp("cast", [weights], [params[name].result]))
    work += casts
    if zero is not None:  # every parameter from its owner
        for grad in grads:
            param = params[grad.attributes["grad"].data].result
            work.append(CollectiveOp("broadcast", param, param, "dp", root=owners[grad.attributes["grad"].data],
                                     size=zero[0]))
    work += [MemsetOp(g.result) for g in grads]
    program = ProgramOp(PROGRAM_NAME, {})
    program.attributes["model"] = StringAttr(model.sym_name.data)
    program.body.block.add_ops([*buffers, *work])
    return program


def sharded_gradients(model: ModelOp, grads: list[BufferOp], tp: int) -> list[BufferOp]:
    """The gradients of the parameters tensor parallelism shards (``@shard(column|row)``) over ``tp`` ranks."""
    if tp == 1:
        return []
    strategies = param_shardings(model)
    return [g for g in grads if strategies.get(g.attributes["grad"].data) in SHARD_DIMS]


def norm_launches(grads: list[BufferOp], norm: SSAValue, sharded: list[BufferOp],
                  tp: int) -> tuple[list[Operation], list[BufferOp]]:
    """``global_norm`` of all the gradients into ``norm``. With gradients sharded over ``tp`` ranks:
    their sum of squares (``squared``), summed over the ranks (``all_reduce(tp)``), then added to
    the others' (``plus=1``), so every rank has the whole model's norm."""
    if not grads:
        return [], []
    if not sharded:
        return [LaunchOp("global_norm", [g.result for g in grads], [norm])], []
    shares = _buffer("workspace", BufferType([], DType.FP32), "sharded_squares")
    whole = [g.result for g in grads if g not in sharded]
    squared = {"squared": BoolAttr.from_bool(True)}
    return [LaunchOp("global_norm", [g.result for g in sharded], [shares.result], squared),
            CollectiveOp("all_reduce", shares.result, shares.result, "tp", op="sum", size=tp),
            LaunchOp("global_norm", [*whole, shares.result], [norm], {"plus": _index(1)})], [shares]


def parameter_clipping(model: ModelOp, grads: list[BufferOp]) -> tuple[list[Operation], list[BufferOp]]:
    """The launches that clip each ``@trainable(grad_clip=C)`` parameter's gradient to an L2 norm of
    at most C, in place (layer by layer for a stacked parameter), and the buffers they add."""
    clips = {name: values["grad_clip"] for name, values in trainable_values(model).items()
             if values["grad_clip"] is not None}
    work: list[Operation] = []
    buffers: list[BufferOp] = []
    if not clips:
        return work, buffers
    norm = _buffer("workspace", BufferType([], DType.FP32), "param_grad_norm")
    factor = _buffer("workspace", BufferType([], DType.FP32), "param_clip_factor")
    layers = stacked_parameters(model)
    for grad in grads:
        name = grad.attributes["grad"].data
        if name not in clips:
            continue
        pieces = [grad.result]
        if name in layers:  # one alias per layer of the stacked gradient
            btype = BufferType(grad.result.type.shape[1:], grad.result.type.dtype)
            pieces = []
            for layer in range(layers[name]):
                piece = BufferOp("grads", btype, layer * btype.nbytes, btype.nbytes, grad.result)
                piece.result.name_hint = f"d_{name}.{layer}"
                buffers.append(piece)
                pieces.append(piece.result)
        for piece in pieces:
            work += [LaunchOp("global_norm", [piece], [norm.result]),
                     LaunchOp("clip_factor", [norm.result], [factor.result], {"max_norm": _float(clips[name])}),
                     LaunchOp("mul", [piece, factor.result], [piece], inplace=True)]
    return work, [*buffers, norm, factor]


def stacked_parameters(model: ModelOp) -> dict[str, int]:
    """The parameters a ``stack`` reads layer by layer, with their layer counts (their leading dim)."""
    found = {}
    for op in model.walk():
        if isinstance(op, StackOp):
            for value in op.per_layer:
                count = value.type.shape[0] if isinstance(value.owner, ParamRefOp) else None
                if count is not None and count.is_const():
                    found[value.owner.param.root_reference.data] = count.const_value()
    return found


def trainable_values(model: ModelOp) -> dict[str, dict]:
    """The ``@trainable(...)`` values (defaults included) of each parameter declared with one."""
    return {param.sym_name.data: annotation.values
            for param in model.body.block.ops if isinstance(param, ParamOp)
            for annotation in annotations_of(param) if isinstance(annotation, TrainableAttr)}


def parameter_scales(model: ModelOp) -> dict[str, tuple[float, float]]:
    """``(lr_scale, wd_scale)`` of each parameter declared ``@trainable(...)`` (spec 7.8.2)."""
    scales = {}
    for param in (op for op in model.body.block.ops if isinstance(op, ParamOp)):
        for annotation in annotations_of(param):
            if isinstance(annotation, TrainableAttr):
                values = annotation.values
                scales[param.sym_name.data] = (float(values["lr_scale"]), float(values["wd_scale"]))
    return scales


def _buffer(arena: str, btype: BufferType, name: str, attrs: dict[str, Attribute] | None = None) -> BufferOp:
    op = BufferOp(arena, btype)
    op.attributes |= attrs or {}
    op.result.name_hint = name
    return op


def _index(value: int) -> IntegerAttr:
    return IntegerAttr(value, i64)


def _float(value: float) -> FloatAttr:
    return FloatAttr(float(value), f64)
