"""Named pipelines: the programs users run, each a fixed sequence of passes.

Every program that ``mdsl-run``, ``modeldsl.load`` and the trainer execute
is built here, and each pipeline is registered with ``mdsl-opt`` by name, so
``mdsl-opt MODEL --hf DIR -p 'mdsl-train-step{B=2 T=16}' --print-ir-after-all``
prints every stage of exactly the program ``mdsl-run --train`` runs
(``mdsl-opt`` expands a pipeline into its stages; ``--list-passes`` shows
each expansion):

* ``mdsl-forward-profile{B T storage}``: a forward shape bucket of
  ``mdsl-run`` and ``modeldsl.load`` (:mod:`modeldsl.runtime.profiles`):
  ``mdsl-specialize{B T}``, ``mdsl-fuse``, ``mdsl-lower-to-sched``,
  ``mdsl-plan-memory``;
* ``mdsl-generate-step{B T kv_cache storage}``: the same with a KV cache of
  ``kv_cache`` positions (decoding);
* ``mdsl-train-step{B T storage recompute budget ... packed}``: one micro-batch of
  training (:mod:`modeldsl.runtime.train`): ``mdsl-specialize{B T}``,
  ``mdsl-attach-loss``, the fusions of written-out functions
  (``BEFORE_AUTODIFF``), with ``packed=true`` ``mdsl-pack-sequences`` (rows of
  several examples: the step takes their segment ids and a RoPE table per row,
  ``@train_loss(tokens, freqs [B, T, D/2, 2], segments [B, T], labels)``),
  ``mdsl-autodiff{func=train_loss}``, the chunked
  LM-head loss (``BEFORE_RECOMPUTE``), ``mdsl-recompute``, every fusion,
  with ``dp=N`` ``mdsl-shard{dp=N}`` (the gradients summed over N data-parallel ranks),
  and with ``tp=N`` (a model lowered for one of N tensor-parallel ranks: the program builders take
  it from the model's ``tp_shapes``) ``mdsl-shard{tp=N}`` before the fusions, as in the forward
  pipelines,
  ``mdsl-lower-to-sched{func=train_loss_grad grads_arena=true}``,
  ``mdsl-plan-memory``;
* ``mdsl-optimizer-update{beta1 beta2 eps weight_decay clip_norm storage dp rank zero}``:
  the AdamW step over the training step's gradients: ``mdsl-specialize``,
  ``mdsl-optimizer-step`` (``zero=1``: rank ``rank`` of ``dp``'s share of the optimizer state,
  ZeRO-1), ``mdsl-plan-memory``.

``storage=fp32`` (the default: ``mdsl-run``'s default dtype) keeps every
buffer in fp32; ``storage=''`` keeps the model's declared (16-bit) dtypes.
The fusion options (``fuse``, ``disable``, ``only``, ``auto``,
``lm_head_chunk``) and the recompute options (``recompute``, the mode;
``budget``, ``finetune``, ``free_memory``) are those of ``mdsl-fuse`` and
``mdsl-recompute``. Options are checked where a pipeline is made
(``__post_init__``, :class:`~modeldsl.diagnostics.PassOptionError` naming the
option). :meth:`NamedPipeline.program` runs a pipeline on a copy of a model
and gives the planned program.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass

from modeldsl.diagnostics import DiagnosticError, PassOptionError
from modeldsl.dialects.graph import ModelOp
from modeldsl.dialects.sched import ProgramOp
from modeldsl.passes.adapters import AdaptersPass
from modeldsl.passes.attach_loss import LOSS_FUNCTION, AttachLossPass
from modeldsl.passes.autodiff import AutodiffPass
from modeldsl.passes.fuse import FusePass
from modeldsl.passes.lower_to_sched import LowerToSchedPass
from modeldsl.passes.optimizer_step import OptimizerStepPass
from modeldsl.passes.pack_sequences import PackSequencesPass
from modeldsl.passes.plan_memory import PlanMemoryPass
from modeldsl.passes.recompute import RecomputePass
from modeldsl.passes.shard import ShardPass, rank_shapes
from modeldsl.passes.specialize import SpecializePass

# Patterns that recognize written-out functions: a training step runs them before mdsl-autodiff, so
# the backward is the primitive's own (after it, the backward reads their intermediates).
BEFORE_AUTODIFF = ("dag_gelu", "dag_silu", "dag_softmax", "dag_rmsnorm", "dag_attention")
# The chunked LM-head loss takes the [B*T, vocab] logits out of what the backward saves: a training
# step runs it before mdsl-recompute, whose budget would otherwise count them.
BEFORE_RECOMPUTE = ("lm_head_loss",)
STORAGES = ("fp32", "")


@dataclass(frozen=True)
class NamedPipeline(ModulePass):
    """A pipeline by name: :meth:`stages` are its passes, which :meth:`apply` runs in order."""

    def stages(self) -> tuple[ModulePass, ...]:
        raise NotImplementedError

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for stage in self.stages():
            stage.apply(ctx, op)

    @classmethod
    def example(cls) -> NamedPipeline:
        """The instance whose expansion ``--list-passes`` shows."""
        return cls(B=2, T=16)

    def program(self, model: ModelOp) -> ProgramOp:
        """The planned program this pipeline makes of a copy of ``model`` (left as it is)."""
        module = ModuleOp([model.clone()])
        self.apply(Context(), module)
        program = [op for op in module.body.block.ops if isinstance(op, ProgramOp)][-1]
        program.detach()
        return program


def pipeline_of(cls: type[NamedPipeline], **options: object) -> NamedPipeline:
    """The pipeline ``cls`` with ``options``, for callers outside ``mdsl-opt``: a refused option is the
    E029 :class:`~modeldsl.diagnostics.DiagnosticError` (``mdsl-opt`` places it in the pipeline text)."""
    try:
        return cls(**options)
    except PassOptionError as err:
        raise DiagnosticError([err.diagnostic()]) from None


def planned(program: ProgramOp) -> ProgramOp:
    """``program`` (detached) after ``mdsl-plan-memory`` with its default options."""
    holder = ModuleOp([program])
    PlanMemoryPass().apply(Context(), holder)
    program.detach()
    return program


def tensor_sharding(tp: int) -> tuple[ModulePass, ...]:
    """``mdsl-shard{tp}`` where a program is one of several tensor-parallel ranks' (none for one): it
    runs before ``mdsl-fuse``, so no epilogue folds into a partial sum."""
    return (ShardPass(tp=tp),) if tp != 1 else ()


def tensor_parallel_option(model: ModelOp) -> dict[str, int]:
    """``{"tp": N}`` for a model lowered for one of N tensor-parallel ranks (none for the whole model)."""
    tp = rank_shapes(model)
    return {"tp": tp} if tp != 1 else {}


def bind_configuration(module: ModuleOp) -> None:
    """What ``modeldsl.load`` runs on a lowered model: ``mdsl-specialize`` binding its config values."""
    SpecializePass().apply(Context(), module)


# ----------------------------------------------------------------------------- option checks


def check_shape(name: str, batch: int, tokens: int) -> None:
    for option, value in (("B", batch), ("T", tokens)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise PassOptionError(f"{name}: {option}={value} is not a positive integer", option,
                                  "the micro-batch's sequences and tokens: B=2 T=16")


def check_storage(name: str, storage: str) -> None:
    if storage not in STORAGES:
        raise PassOptionError(f"{name}: storage={storage} is not fp32", "storage",
                              "storage=fp32, or storage='' for the model's declared dtypes")


class _Fusion:
    """The fusion options a pipeline shares with ``mdsl-fuse`` (its fields: see the subclasses)."""

    fuse: bool
    disable: tuple[str, ...]
    only: tuple[str, ...]
    auto: bool
    lm_head_chunk: int

    def fusion(self) -> FusePass | None:
        """``mdsl-fuse`` with these options (None: fusion off); its option errors name the option."""
        if not self.fuse:
            return None
        return FusePass(disable=self.disable, auto=self.auto, lm_head_chunk=self.lm_head_chunk, only=self.only)


# every pipeline adapts a model its @adapter annotations declare adapters for (once: a model loaded
# with them has them already), so that all its programs lay out the same parameters
ANNOTATED_ADAPTERS = AdaptersPass(annotations_only=True)


def _forward_stages(pipeline: ForwardProfile, kv_cache: int) -> tuple[ModulePass, ...]:
    fuse = pipeline.fusion()
    return (SpecializePass.of(B=pipeline.B, T=pipeline.T), ANNOTATED_ADAPTERS, *tensor_sharding(pipeline.tp),
            *((fuse,) if fuse else ()),
            LowerToSchedPass(func="forward", storage=pipeline.storage, kv_cache=kv_cache,
                             split_gemms=pipeline.split_gemms),
            PlanMemoryPass())


# ----------------------------------------------------------------------------- the pipelines


@dataclass(frozen=True)
class ForwardProfile(NamedPipeline, _Fusion):
    """The planned forward of one shape bucket (a named pipeline)."""

    name = "mdsl-forward-profile"

    B: int
    T: int
    storage: str = "fp32"
    split_gemms: bool = True
    fuse: bool = True
    disable: tuple[str, ...] = ()
    only: tuple[str, ...] = ()
    auto: bool = True
    lm_head_chunk: int = 0
    tp: int = 1  # tensor-parallel ranks (a model lowered for one of them): mdsl-shard{tp} adds the sums

    def __post_init__(self) -> None:
        check_shape(self.name, self.B, self.T)
        check_storage(self.name, self.storage)
        self.fusion()
        tensor_sharding(self.tp)

    def stages(self) -> tuple[ModulePass, ...]:
        return _forward_stages(self, 0)


@dataclass(frozen=True)
class GenerateStep(ForwardProfile):
    """The planned forward of one decoding step with a KV cache (a named pipeline)."""

    name = "mdsl-generate-step"

    kv_cache: int = 256

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.kv_cache, bool) or not isinstance(self.kv_cache, int) or self.kv_cache <= 0:
            raise PassOptionError(f"{self.name}: kv_cache={self.kv_cache} is not a number of positions",
                                  "kv_cache", "the cache's capacity in positions: kv_cache=256")

    def stages(self) -> tuple[ModulePass, ...]:
        return _forward_stages(self, self.kv_cache)


@dataclass(frozen=True)
class TrainStep(NamedPipeline, _Fusion):
    """The planned gradient of one micro-batch of training (a named pipeline)."""

    name = "mdsl-train-step"

    B: int
    T: int
    storage: str = "fp32"
    recompute: str = "annotated"
    budget: str = ""
    finetune: str = "auto"
    free_memory: int = 0
    fuse: bool = True
    disable: tuple[str, ...] = ()
    only: tuple[str, ...] = ()
    auto: bool = True
    lm_head_chunk: int = 0
    packed: bool = False  # rows of several examples: mdsl-pack-sequences before mdsl-autodiff
    dp: int = 1  # data-parallel ranks: mdsl-shard{dp} sums the gradients over them
    tp: int = 1  # tensor-parallel ranks (a model lowered for one of them): mdsl-shard{tp} adds the sums
    # where mdsl-recompute's automatic mode hands its table (not an option: set by reporting())
    report: Callable[[str], None] | None = field(default=None, init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        check_shape(self.name, self.B, self.T)
        check_storage(self.name, self.storage)
        self.fusion()
        self.recompute_pass()
        if not isinstance(self.packed, bool):
            raise PassOptionError(f"{self.name}: packed={self.packed} is not true or false", "packed",
                                  "packed=true trains on rows that pack several examples")
        self.sharding()
        tensor_sharding(self.tp)

    def sharding(self) -> tuple[ModulePass, ...]:
        """``mdsl-shard{dp}`` where the step runs on several data-parallel ranks (none for one)."""
        return (ShardPass(dp=self.dp),) if self.dp != 1 else ()

    def reporting(self, report: Callable[[str], None] | None) -> TrainStep:
        """This pipeline, its ``mdsl-recompute`` handing the automatic mode's table to ``report``."""
        copy = replace(self)
        object.__setattr__(copy, "report", report)
        return copy

    def recompute_pass(self) -> RecomputePass:
        """``mdsl-recompute`` with this pipeline's options (its ``mode`` is ``recompute`` here)."""
        try:
            stage = RecomputePass(mode=self.recompute, budget=self.budget, finetune=self.finetune,
                                  free_memory=self.free_memory)
        except PassOptionError as err:
            option = "recompute" if err.option == "mode" else err.option
            raise PassOptionError(str(err), option, err.hint) from None
        return stage.reporting(self.report)

    def stages(self) -> tuple[ModulePass, ...]:
        fuse = self.fusion()
        before_autodiff = (replace(fuse, only=BEFORE_AUTODIFF),) if fuse else ()
        before_recompute = (replace(fuse, only=BEFORE_RECOMPUTE),) if fuse else ()
        packing = (PackSequencesPass(),) if self.packed else ()
        return (SpecializePass.of(B=self.B, T=self.T), ANNOTATED_ADAPTERS, AttachLossPass(), *before_autodiff,
                *packing, AutodiffPass(func=LOSS_FUNCTION), *before_recompute, self.recompute_pass(),
                *tensor_sharding(self.tp), *((fuse,) if fuse else ()), *self.sharding(),
                LowerToSchedPass(func=f"{LOSS_FUNCTION}_grad", storage=self.storage, grads_arena=True),
                PlanMemoryPass())


@dataclass(frozen=True)
class OptimizerUpdate(NamedPipeline):
    """The planned AdamW step of a model's parameters (a named pipeline)."""

    name = "mdsl-optimizer-update"

    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.01
    clip_norm: float = 0.0
    storage: str = "fp32"
    dp: int = 1  # ZeRO-1 (zero=1): the optimizer state shared out over dp ranks, this program rank's
    rank: int = 0
    zero: int = 0
    tp: int = 1  # tensor-parallel ranks: the gradient norm sums the sharded gradients' squares over them

    def __post_init__(self) -> None:
        self.update()

    @classmethod
    def example(cls) -> NamedPipeline:
        return cls()

    def update(self) -> OptimizerStepPass:
        return OptimizerStepPass(beta1=self.beta1, beta2=self.beta2, eps=self.eps, weight_decay=self.weight_decay,
                                 clip_norm=self.clip_norm, storage=self.storage, dp=self.dp, rank=self.rank,
                                 zero=self.zero, tp=self.tp)

    def stages(self) -> tuple[ModulePass, ...]:
        return (SpecializePass.of(B=1, T=1), ANNOTATED_ADAPTERS, self.update(), PlanMemoryPass())


PIPELINES: tuple[type[NamedPipeline], ...] = (ForwardProfile, GenerateStep, TrainStep, OptimizerUpdate)


def expansion(pipeline: NamedPipeline) -> str:
    """The stages of ``pipeline`` as pipeline text (what ``--list-passes`` shows)."""
    return ",".join(str(stage) for stage in pipeline.stages())
