"""The one registry of passes that ``mdsl-opt`` and the Python pipeline use.

Project passes are named ``mdsl-<verb>`` (no dots: the pipeline parser
rejects them); each lives in its own file in this folder and is listed once
here. A few general xDSL passes that work on any IR are listed too.
:func:`describe_pass` gives each pass's one-line description for
``mdsl-opt --list-passes``; :data:`OPTION_NOTES` describes the options of passes
whose options are not their dataclass fields.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

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


# Project passes, added by the issues that build them: name -> factory.
PROJECT_PASSES: dict[str, Callable[[], type[ModulePass]]] = {
    "mdsl-specialize": _specialize,
    "mdsl-plan-memory": _plan_memory,
    "mdsl-lower-to-sched": _lower_to_sched,
    "mdsl-autodiff": _autodiff,
    "mdsl-recompute": _recompute,
    "mdsl-fuse": _fuse,
    "mdsl-optimizer-step": _optimizer_step,
}

PASSES: dict[str, Callable[[], type[ModulePass]]] = {**GENERAL_PASSES, **PROJECT_PASSES}


DESCRIPTIONS: dict[str, str] = {
    "canonicalize": "apply every op's canonicalization patterns (folding, simplification)",
    "cse": "eliminate common subexpressions: pure ops with equal operands and attributes become one",
    "dce": "remove pure ops whose results are unused",
}

OPTION_NOTES: dict[str, tuple[tuple[str, str], ...]] = {
    "mdsl-recompute": (
        ("mode=annotated", "the model's @memory/@checkpoint/save:/recompute:; none, full (every stack "
         "checkpointed), or auto with a budget"),
        ("budget=BYTES", "the automatic mode: recompute the cheapest tensors until the saved ones fit "
         "(268435456, 256MiB, 2GiB; auto: the free memory)"),
        ("finetune=auto", "lora: policy=lora_only tensors recompute (auto: where the model has @frozen "
         "parameters); full"),
    ),
    "mdsl-specialize": (
        ("NAME=INT", "bind a symbol (B, T) or an integer config value (e.g. d_model=64)"),
        ("hf=DIR", "bind the config values of a HuggingFace checkpoint's config.json (default: none)"),
    ),
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
