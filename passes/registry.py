"""The one registry of passes that ``mdsl-opt`` and the Python pipeline use.

Project passes are named ``mdsl-<verb>`` (no dots: the pipeline parser
rejects them); each lives in its own file in this folder and is listed once
here. A few general xDSL passes that work on any IR are listed too, and the
named pipelines (:data:`PIPELINES`, ``passes/pipelines.py``), which ``mdsl-opt``
expands into their stages.
:func:`describe_pass` gives each pass's one-line description for
``mdsl-opt --list-passes``; :data:`OPTION_NOTES` describes the options of passes
whose options are not their dataclass fields. :data:`LISTINGS` is what
``--list-passes`` (and ``--help``) prints for each pass, kept here so that
listing the passes imports none of them (importing every pass, and the numerics
they reach, once cost ``mdsl-opt --help`` over a second); a unit test checks it
against what the pass classes say (:func:`describe_pass`, their fields).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass

from xdsl.passes import ModulePass

PassFactory = Callable[[], type[ModulePass]]


def _canonicalize() -> type[ModulePass]:
    from xdsl.transforms.canonicalize import CanonicalizePass

    return CanonicalizePass


def _cse() -> type[ModulePass]:
    from xdsl.transforms.common_subexpression_elimination import (
        CommonSubexpressionElimination,
    )

    return CommonSubexpressionElimination


def _dce() -> type[ModulePass]:
    from xdsl.transforms.dead_code_elimination import DeadCodeElimination

    return DeadCodeElimination


GENERAL_PASSES: dict[str, Callable[[], type[ModulePass]]] = {
    "canonicalize": _canonicalize,
    "cse": _cse,
    "dce": _dce,
}

def _specialize() -> type[ModulePass]:
    from modeldsl.passes.specialize import SpecializePass

    return SpecializePass


def _lower_to_sched() -> type[ModulePass]:
    from modeldsl.passes.lower_to_sched import LowerToSchedPass

    return LowerToSchedPass


def _plan_memory() -> type[ModulePass]:
    from modeldsl.passes.plan_memory import PlanMemoryPass

    return PlanMemoryPass


def _autodiff() -> type[ModulePass]:
    from modeldsl.passes.autodiff import AutodiffPass

    return AutodiffPass


def _recompute() -> type[ModulePass]:
    from modeldsl.passes.recompute import RecomputePass

    return RecomputePass


def _fuse() -> type[ModulePass]:
    from modeldsl.passes.fuse import FusePass

    return FusePass


def _optimizer_step() -> type[ModulePass]:
    from modeldsl.passes.optimizer_step import OptimizerStepPass

    return OptimizerStepPass


def _attach_loss() -> type[ModulePass]:
    from modeldsl.passes.attach_loss import AttachLossPass

    return AttachLossPass


def _adapters() -> type[ModulePass]:
    from modeldsl.passes.adapters import AdaptersPass

    return AdaptersPass


def _quantize_frozen() -> type[ModulePass]:
    from modeldsl.passes.quantize_frozen import QuantizeFrozenPass

    return QuantizeFrozenPass


def _pack_sequences() -> type[ModulePass]:
    from modeldsl.passes.pack_sequences import PackSequencesPass

    return PackSequencesPass


def _shard() -> type[ModulePass]:
    from modeldsl.passes.shard import ShardPass

    return ShardPass


def _pipeline(name: str) -> PassFactory:
    """The factory of the named pipeline ``name`` (:mod:`modeldsl.passes.pipelines`, imported on use)."""

    def factory() -> type[ModulePass]:
        from modeldsl.passes.pipelines import PIPELINES

        return next(cls for cls in PIPELINES if cls.name == name)

    return factory


# Project passes, added by the issues that build them: name -> factory.
PROJECT_PASSES: dict[str, Callable[[], type[ModulePass]]] = {
    "mdsl-specialize": _specialize,
    "mdsl-plan-memory": _plan_memory,
    "mdsl-lower-to-sched": _lower_to_sched,
    "mdsl-autodiff": _autodiff,
    "mdsl-recompute": _recompute,
    "mdsl-fuse": _fuse,
    "mdsl-optimizer-step": _optimizer_step,
    "mdsl-attach-loss": _attach_loss,
    "mdsl-adapters": _adapters,
    "mdsl-pack-sequences": _pack_sequences,
    "mdsl-quantize-frozen": _quantize_frozen,
    "mdsl-shard": _shard,
}

# The named pipelines (passes/pipelines.py): mdsl-opt expands each into its stages.
PIPELINES: dict[str, PassFactory] = {
    name: _pipeline(name)
    for name in ("mdsl-forward-profile", "mdsl-generate-step", "mdsl-train-step", "mdsl-optimizer-update")
}

PASSES: dict[str, Callable[[], type[ModulePass]]] = {**GENERAL_PASSES, **PROJECT_PASSES, **PIPELINES}


DESCRIPTIONS: dict[str, str] = {
    "canonicalize": "apply every op's canonicalization patterns (folding, simplification)",
    "cse": "eliminate common subexpressions: pure ops with equal operands and attributes become one",
    "dce": "remove pure ops whose results are unused",
    "mdsl-forward-profile": "a named pipeline: the planned forward of one shape bucket (mdsl-run, modeldsl.load)",
    "mdsl-generate-step": "a named pipeline: the planned forward of one decoding step with a KV cache",
    "mdsl-train-step": "a named pipeline: the planned gradient of one training micro-batch (mdsl-run --train)",
    "mdsl-optimizer-update": "a named pipeline: the planned AdamW step of the parameters (mdsl-run --train)",
}

OPTION_NOTES: dict[str, tuple[tuple[str, str], ...]] = {
    "mdsl-recompute": (
        ("mode=annotated", "the model's @memory/@checkpoint/save:/recompute:; none, full (every stack "
         "checkpointed), or auto with a budget"),
        ("budget=BYTES", "the automatic mode: recompute the cheapest tensors until the saved ones fit "
         "(268435456, 256MiB, 2GiB; auto: the free memory)"),
        ("finetune=auto", "lora: policy=lora_only tensors recompute (auto: where the model has @frozen "
         "parameters); full"),
        ("free_memory=0", "the device's free memory in bytes, for budget=auto (mdsl-opt measures it)"),
    ),
    "mdsl-specialize": (
        ("NAME=INT", "bind a symbol (B, T) or an integer config value (e.g. d_model=64)"),
        ("hf=DIR", "bind the config values of a HuggingFace checkpoint's config.json (default: none)"),
    ),
}



@dataclass(frozen=True)
class PassListing:
    """A pass in ``--list-passes``: its one-line description, its (option, text) lines, its rewrite
    patterns (the ``PATTERNS`` table of its module: each name with its pattern classes) and, for a
    named pipeline, its stages (at its example options) as pipeline text."""

    description: str
    options: tuple[tuple[str, str], ...] = ()
    expansion: str = ""
    patterns: tuple[tuple[str, str], ...] = ()  # (name, its rewrite pattern classes) of the pass's PATTERNS


_FUSION_OPTIONS = (
    ("fuse=bool", "default: true"),
    ("disable=tuple[str, ...]", "default: ()"),
    ("only=tuple[str, ...]", "default: ()"),
    ("auto=bool", "default: true"),
    ("lm_head_chunk=int", "default: 0"),
)
_SHAPE_OPTIONS = (("B=int", "required"), ("T=int", "required"), ("storage=str", "default: fp32"))
_TRAIN_STEP = (
    'mdsl-specialize{B=2 T=16},mdsl-adapters{annotations_only=true},mdsl-attach-loss,'
    'mdsl-fuse{only="dag_gelu","dag_silu","dag_softmax","dag_rmsnorm","dag_attention"},'
    'mdsl-autodiff{func="train_loss"},mdsl-fuse{only="lm_head_loss"},mdsl-recompute,mdsl-fuse,'
    'mdsl-lower-to-sched{func="train_loss_grad" storage="fp32" grads_arena=true},mdsl-plan-memory'
)


LISTINGS: dict[str, PassListing] = {
    "canonicalize": PassListing(DESCRIPTIONS["canonicalize"]),
    "cse": PassListing(DESCRIPTIONS["cse"]),
    "dce": PassListing(DESCRIPTIONS["dce"]),
    "mdsl-specialize": PassListing("bind symbolic dimensions and config values to integers",
                                   OPTION_NOTES["mdsl-specialize"]),
    "mdsl-plan-memory": PassListing("give every buffer of an mdsl.sched.program its arena offset", (
        ("strategy=str", "default: first-fit"),
        ("alignment=int", "default: 256"),
        ("inplace=bool", "default: true"),
    )),
    "mdsl-lower-to-sched": PassListing("a specialized mdsl.graph function becomes an mdsl.sched program", (
        ("func=str", "default: forward"),
        ("storage=str", "default: ''"),
        ("kv_cache=int", "default: 0"),
        ("split_gemms=bool", "default: true"),
        ("grads_arena=bool", "default: false"),
    )),
    "mdsl-autodiff": PassListing("derive a model function's gradient from the VJP rules", (
        ("func=str", "default: forward"),
        ("loop=bool", "default: true"),
    )),
    "mdsl-recompute": PassListing("what a training step saves for its backward, and what it recomputes",
                                  OPTION_NOTES["mdsl-recompute"], patterns=(
                                      ("layer_tensors", "RecomputeLayerTensors"),
                                      ("top_level_tensors", "RecomputeTopLevelTensors"),
                                  )),
    "mdsl-fuse": PassListing("fusion as rewrite patterns on mdsl.graph", (
        ("disable=tuple[str, ...]", "default: ()"),
        ("auto=bool", "default: true"),
        ("lm_head_chunk=int", "default: 0"),
        ("only=tuple[str, ...]", "default: ()"),
    ), patterns=(
        ("residual_norm", "ResidualNorm, ResidualNormBackward"),
        ("scalar_alpha", "ScaleIntoAlpha, AlphaFromScale"),
        ("transpose_flag", "TransposeIntoFlags"),
        ("fold", "FoldIdentity, FoldTransposes, FoldViews, FoldScales"),
        ("linear_bias_act", "LinearBiasAct"),
        ("bias_activation", "BiasActivation"),
        ("lm_head_loss", "LmHeadLossBackward, LmHeadLoss, LmHeadLossGrad"),
        ("gated_mlp", "SplitGated, SplitGatedBackward"),
        ("attention_layout", "AttentionLayout"),
        ("dag_gelu", "DagGelu"),
        ("dag_silu", "DagSilu"),
        ("dag_softmax", "DagSoftmax"),
        ("dag_rmsnorm", "DagRmsnorm"),
        ("attention_softmax", "AttentionSoftmax"),
        ("dag_attention", "DagAttention"),
        ("qk_norm_rope", "QkNormRope, QkNormRopeBackward"),
    )),
    "mdsl-optimizer-step": PassListing("the AdamW update of a model's parameters as an mdsl.sched program", (
        ("beta1=float", "default: 0.9"),
        ("beta2=float", "default: 0.999"),
        ("eps=float", "default: 1e-08"),
        ("weight_decay=float", "default: 0.01"),
        ("clip_norm=float", "default: 0.0"),
        ("storage=str", "default: ''"),
        ("dp=int", "default: 1"),
        ("rank=int", "default: 0"),
        ("zero=int", "default: 0"),
        ("tp=int", "default: 1"),
    )),
    "mdsl-attach-loss": PassListing("a causal language model's training loss as a function of the model", (
        ("ignore_index=int", "default: -100"),
    )),
    "mdsl-adapters": PassListing("LoRA adapters on the matmuls of the weights the targets name", (
        ("rank=int", "default: 0"),
        ("alpha=float", "default: 0.0"),
        ("dropout=float", "default: 0.0"),
        ("targets=tuple[str, ...]", "default: ()"),
        ("rslora=bool", "default: false"),
        ("seed=int", "default: 0"),
        ("annotations_only=bool", "default: false"),
    ), patterns=(("lora_path", "AddLoraPath"),)),
    "mdsl-quantize-frozen": PassListing(
        "the frozen linear weights stored in fp8 (or bf16), widened where a matmul reads them",
        (("dtype=str", "default: fp8_e4m3"),),
        patterns=(("store", "StoreParam"), ("refs", "StoredRef"), ("stacks", "ThreadScale"),
                  ("calls", "ThreadIntoCall"), ("widen", "WidenForReader"))),
    "mdsl-shard": PassListing(
        "a model's programs for a parallel layout, collectives inserted where shardings meet", (
            ("tp=int", "default: 1"),
            ("dp=int", "default: 1"),
            ("pp=int", "default: 1"),
            ("ep=int", "default: 1"),
            ("sp=bool", "default: false"),
        ), patterns=(("dp_gradients", "ReduceGradients"), ("tp_partial_sums", "ReducePartialSums"))),
    "mdsl-pack-sequences": PassListing(
        "a model's forward on packed rows, each example attending only to itself", (), patterns=(
            ("segment_attention", "SegmentAttention"),
            ("pass_segments", "SegmentCalls, SegmentStacks"),
        )),
    "mdsl-forward-profile": PassListing(
        DESCRIPTIONS["mdsl-forward-profile"],
        (*_SHAPE_OPTIONS, ("split_gemms=bool", "default: true"), *_FUSION_OPTIONS, ("tp=int", "default: 1")),
        'mdsl-specialize{B=2 T=16},mdsl-adapters{annotations_only=true},mdsl-fuse,'
        'mdsl-lower-to-sched{storage="fp32"},mdsl-plan-memory'),
    "mdsl-generate-step": PassListing(
        DESCRIPTIONS["mdsl-generate-step"],
        (*_SHAPE_OPTIONS, ("split_gemms=bool", "default: true"), *_FUSION_OPTIONS, ("tp=int", "default: 1"),
         ("kv_cache=int", "default: 256")),
        'mdsl-specialize{B=2 T=16},mdsl-adapters{annotations_only=true},mdsl-fuse,'
        'mdsl-lower-to-sched{storage="fp32" kv_cache=256},mdsl-plan-memory'),
    "mdsl-train-step": PassListing(
        DESCRIPTIONS["mdsl-train-step"],
        (*_SHAPE_OPTIONS, ("recompute=str", "default: annotated"), ("budget=str", "default: ''"),
         ("finetune=str", "default: auto"), ("free_memory=int", "default: 0"), *_FUSION_OPTIONS,
         ("packed=bool", "default: false"), ("dp=int", "default: 1"), ("tp=int", "default: 1")),
        _TRAIN_STEP),
    "mdsl-optimizer-update": PassListing(DESCRIPTIONS["mdsl-optimizer-update"], (
        ("beta1=float", "default: 0.9"),
        ("beta2=float", "default: 0.999"),
        ("eps=float", "default: 1e-08"),
        ("weight_decay=float", "default: 0.01"),
        ("clip_norm=float", "default: 0.0"),
        ("storage=str", "default: fp32"),
        ("dp=int", "default: 1"),
        ("rank=int", "default: 0"),
        ("zero=int", "default: 0"),
        ("tp=int", "default: 1"),
    ), 'mdsl-specialize{B=1 T=1},mdsl-adapters{annotations_only=true},mdsl-optimizer-step{storage="fp32"},'
       'mdsl-plan-memory'),
}

def describe_pass(name: str, cls: type[ModulePass]) -> str:
    """One line: the registry's description, else the pass module's docstring headline
    (``mdsl-x``: what it does), else the class docstring's first line."""
    if name in DESCRIPTIONS:
        return DESCRIPTIONS[name]
    module_doc = (sys.modules[cls.__module__].__doc__ or "").strip()
    headline = module_doc.split("\n\n", 1)[0].replace("\n", " ")
    if headline.startswith(f"``{name}``"):
        return headline.split(":", 1)[-1].strip().rstrip(".").replace("``", "")
    class_doc = (cls.__doc__ or "").strip().splitlines()
    if class_doc and not class_doc[0].startswith(f"{cls.__name__}("):
        return class_doc[0].rstrip(".")
    return headline.rstrip(".") or name
