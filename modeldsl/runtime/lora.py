"""LoRA adapters on a loaded model: the options, and the adapters' initial weights.

``modeldsl.load(..., lora=dict(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]))`` runs
``mdsl-adapters`` (:mod:`modeldsl.passes.adapters`) on the configured model before its
parameters are allocated, so that the adapters live in the params arena beside the frozen
weights. The options take PEFT's ``LoraConfig`` names (``r``, ``lora_alpha``,
``target_modules``, ``lora_dropout``, ``use_rslora``) or the pass's (``rank``, ``alpha``,
``targets``, ``dropout``, ``rslora``), and ``seed``. The adapters start as PEFT's do:
``lora_A`` uniform in ``[-1/sqrt(in), 1/sqrt(in)]`` (Kaiming-uniform with ``a = sqrt(5)``),
``lora_B`` zeros, so the adapted model computes what the base does until it trains; each
layer of a stack draws its own ``lora_A``, from a generator seeded with ``seed`` and the
parameter's name.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from modeldsl.diagnostics import Diagnostic, DiagnosticError
from modeldsl.dialects.graph import ModelOp, ParamOp
from modeldsl.passes.adapters import Lora, adapter_info, add_adapters

ALIASES = {"r": "rank", "lora_alpha": "alpha", "target_modules": "targets", "lora_dropout": "dropout",
           "use_rslora": "rslora"}


@dataclass(frozen=True)
class LoraOptions:
    """What ``mdsl-adapters`` adds: rank, alpha (None: the rank), targets, dropout, rsLoRA, seed."""

    rank: int = 8
    alpha: float | None = None
    targets: tuple[str, ...] = ("q_proj", "v_proj")
    dropout: float = 0.0
    rslora: bool = False
    seed: int = 0

    @classmethod
    def of(cls, spec: LoraOptions | Mapping[str, Any] | int) -> LoraOptions:
        """From a rank, a dictionary (PEFT's names or ours) or options; E029 naming a wrong key or value."""
        if isinstance(spec, LoraOptions):
            return spec.checked()
        if isinstance(spec, int) and not isinstance(spec, bool):
            return cls(rank=spec).checked()
        if not isinstance(spec, Mapping):
            raise _error(f"lora={spec!r} is not a rank or a dictionary of LoRA options",
                         "give lora=8 or lora=dict(r=8, lora_alpha=16, target_modules=['q_proj', 'v_proj'])")
        known = {f for f in cls.__dataclass_fields__}
        values: dict[str, Any] = {}
        for key, value in spec.items():
            name = ALIASES.get(key, key)
            if name not in known:
                raise _error(f"lora: no option '{key}'", f"the options: {', '.join([*ALIASES, 'seed'])}")
            values[name] = tuple([value] if isinstance(value, str) else value) if name == "targets" else value
        return cls(**values).checked()

    def checked(self) -> LoraOptions:
        if not isinstance(self.rank, int) or isinstance(self.rank, bool) or self.rank < 1:
            raise _error(f"lora: r={self.rank!r} is not a positive integer", "give the adapters' rank: r=8")
        if self.alpha is not None and (not isinstance(self.alpha, (int, float)) or not self.alpha > 0):
            raise _error(f"lora: lora_alpha={self.alpha!r} is not a positive number",
                         "give lora_alpha (the scaling is lora_alpha / r), or leave it out for r")
        if not isinstance(self.dropout, (int, float)) or not 0 <= self.dropout < 1:
            raise _error(f"lora: lora_dropout={self.dropout!r} is not in [0, 1)", "give a probability: 0.05")
        if not self.targets or not all(isinstance(t, str) and t for t in self.targets):
            raise _error(f"lora: target_modules={list(self.targets)!r} names no module",
                         "name the modules: ['q_proj', 'v_proj'], or 'all-linear'")
        return self

    @property
    def lora(self) -> Lora:
        return Lora(self.rank, float(self.alpha if self.alpha is not None else self.rank), float(self.dropout),
                    bool(self.rslora), int(self.seed))


def _error(message: str, hint: str) -> DiagnosticError:
    return DiagnosticError([Diagnostic("E029", message, None, hint)])


def adapt(model: ModelOp, options: LoraOptions) -> list[str]:
    """Add the adapters to a configured model (``mdsl-adapters``); the names of their parameters."""
    return add_adapters(model, options.lora, options.targets)


def adapter_params(model: ModelOp) -> list[ParamOp]:
    """The parameters ``mdsl-adapters`` declared, in declaration order."""
    return [p for p in model.params() if adapter_info(p) is not None]


def initial_value(param: ParamOp, seed: int, dtype: np.dtype) -> np.ndarray:
    """The adapter's first value: Kaiming-uniform (``a = sqrt(5)``) for lora_A, zeros for lora_B."""
    shape = tuple(d.evaluate({}) for d in param.param_type.shape)
    info = adapter_info(param)
    if info["init"] == "zeros":
        return np.zeros(shape, dtype)
    bound = 1.0 / math.sqrt(shape[-1])
    digest = hashlib.sha256(param.sym_name.data.encode()).digest()
    rng = np.random.default_rng([seed, int.from_bytes(digest[:8], "little")])
    return rng.uniform(-bound, bound, size=shape).astype(dtype)


def init_adapters(model: ModelOp, weights: dict[str, np.ndarray], dtype: np.dtype, seed: int,
                  into: Mapping[str, np.ndarray] | None = None) -> None:
    """Give every adapter parameter its first value, in place in ``into`` (the params arena's views)
    where it has one."""
    for param in adapter_params(model):
        name = param.sym_name.data
        value = initial_value(param, seed, dtype)
        target = (into or {}).get(name)
        if target is not None and target.shape == value.shape:
            np.copyto(target, value, casting="unsafe")
            value = target
        weights[name] = value


def adapter_names(model: ModelOp) -> Sequence[str]:
    return [p.sym_name.data for p in adapter_params(model)]
