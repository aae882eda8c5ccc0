"""The one registry of passes that ``mdsl-opt`` and the Python pipeline use.

Project passes are named ``mdsl-<verb>`` (no dots: the pipeline parser
rejects them); each lives in its own file in this folder and is listed once
here. A few general xDSL passes that work on any IR are listed too.
"""

from __future__ import annotations

from collections.abc import Callable

from xdsl.passes import ModulePass


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


def _optimizer_step() -> type[ModulePass]:
    from modeldsl.passes.optimizer_step import OptimizerStepPass

    return OptimizerStepPass


# Project passes, added by the issues that build them: name -> factory.
PROJECT_PASSES: dict[str, Callable[[], type[ModulePass]]] = {
    "mdsl-specialize": _specialize,
    "mdsl-plan-memory": _plan_memory,
    "mdsl-lower-to-sched": _lower_to_sched,
    "mdsl-autodiff": _autodiff,
    "mdsl-optimizer-step": _optimizer_step,
}

PASSES: dict[str, Callable[[], type[ModulePass]]] = {**GENERAL_PASSES, **PROJECT_PASSES}
