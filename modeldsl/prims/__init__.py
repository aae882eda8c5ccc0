"""The primitive registry: one :class:`~modeldsl.prims.base.Primitive` per ``mdsl.graph`` primitive op.

Each family of primitives has one module here (:mod:`~modeldsl.prims.matmul`,
``norm``, ``activation``, ``attention``, ``elementwise``, ``tensor``,
``reduction``, ``embedding``, ``loss``, ``moe``, ``mamba``, ``quantize``, ``collective``) whose ``ENTRIES``
hold, for every op class of the family, its result-type rule, VJP rule, FLOP
rule, scratch rule, in-place reuse, accumulation, inference parameters, fusion
kinds and the kernels it must have. :func:`registry` gathers them keyed by
the op class; :func:`by_name` keys the same records by the primitive's name
(the kernel name of ``mdsl.sched.launch``), the user primitives registered with
:func:`modeldsl.register_primitive` (:mod:`~modeldsl.prims.user`) among them. The numpy references, the CUDA
launch plans and the CPU kernels are registered in :mod:`modeldsl.kernels`
under that name and load only when a schedule runs.

The family modules load on the first call (they import the graph builder's
helpers and the dialect), so importing this package costs nothing.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from modeldsl.dialects.graph_primitives import PrimitiveOp
from modeldsl.prims.base import Primitive

FAMILIES = ("matmul", "norm", "activation", "attention", "elementwise", "tensor", "reduction", "embedding",
            "loss", "moe", "mamba", "quantize", "collective")


@lru_cache(maxsize=1)
def registry() -> dict[type[PrimitiveOp], Primitive]:
    """Every primitive's record, keyed by its op class (AssertionError for an op registered twice)."""
    entries: dict[type[PrimitiveOp], Primitive] = {}
    for family in FAMILIES:
        for entry in importlib.import_module(f"modeldsl.prims.{family}").ENTRIES:
            assert entry.op not in entries, f"{entry.name} is registered twice"
            entries[entry.op] = entry
    return entries


# the records of the user primitives (modeldsl.register_primitive) by their registered names; their op
# is the generic mdsl.graph.custom, so registry() has none of them. Kept by modeldsl.prims.user.
USER: dict[str, Primitive] = {}
# their numpy references (forwards and backwards), which the kernel registry serves under the same names
USER_REFERENCES: dict[str, Callable[..., Any]] = {}


@lru_cache(maxsize=1)
def builtin_by_name() -> dict[str, Primitive]:
    """The op records keyed by the primitive's name (``rmsnorm``, ``flash_attention_backward``, ...)."""
    return {entry.name: entry for entry in registry().values()}


def by_name() -> dict[str, Primitive]:
    """Every record keyed by the primitive's name: the ops', then the user primitives registered in
    this process (:mod:`modeldsl.prims.user`)."""
    return {**builtin_by_name(), **USER} if USER else builtin_by_name()


def entry(key: type[PrimitiveOp] | str) -> Primitive:
    """The record of an op class or primitive name; KeyError for one the registry lacks."""
    found = registry().get(key) if isinstance(key, type) else by_name().get(key)
    if found is None:
        raise KeyError(f"no primitive '{key}' in the registry")
    return found


__all__ = ["FAMILIES", "USER", "USER_REFERENCES", "Primitive", "builtin_by_name", "by_name", "entry", "registry"]
