"""RoPE tables: the ``freqs`` input ``[T, head_dim // 2, 2]`` = (cos, sin) per position and pair.

The inverse frequencies follow transformers' ``ROPE_INIT_FUNCTIONS``:
``theta ** (-2i / head_dim)``, optionally rescaled by the checkpoint's
``rope_scaling`` (or ``rope_parameters``), whose ``rope_type`` is one of

* ``default``: unscaled;
* ``linear``: divided by ``factor``;
* ``dynamic`` (NTK): transformers only rescales once the sequence grows past
  ``max_position_embeddings``, which the runtime never lets it do, so the
  frequencies are the default ones;
* ``llama3``: long wavelengths divided by ``factor``, short ones kept, a
  smooth blend between (``low_freq_factor``, ``high_freq_factor``,
  ``original_max_position_embeddings``);
* ``yarn``: a ramp between interpolated and extrapolated frequencies
  (``beta_fast``, ``beta_slow``, ``truncate``) and cos/sin multiplied by an
  ``attention_factor`` (given, or from ``factor``, ``mscale``, ``mscale_all_dim``).

``original_max_position_embeddings`` defaults to ``max_position_embeddings``,
as in transformers. A malformed or unsupported scaling is a
:class:`RopeScalingError` naming the offending key.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

SUPPORTED = ("default", "linear", "dynamic", "llama3", "yarn")
_MISSING = object()


class RopeScalingError(ValueError):
    """A ``rope_scaling`` that is malformed or that this runtime does not implement."""

    def __init__(self, message: str, key: str | None = None):
        super().__init__(message)
        self.key = key


@dataclass(frozen=True)
class RopeFrequencies:
    """The inverse frequencies ``[head_dim // 2]`` and the factor applied to cos and sin."""

    inv_freq: np.ndarray
    attention_factor: float = 1.0

    def table(self, positions: np.ndarray | range) -> np.ndarray:
        """``[len(positions), head_dim // 2, 2]`` fp32 (cos, sin), computed in fp32 as transformers does."""
        inv = self.inv_freq.astype(np.float32)
        angles = np.asarray(positions, dtype=np.float32)[:, None] * inv[None, :]
        cos, sin = np.cos(angles), np.sin(angles)
        if self.attention_factor != 1.0:
            cos, sin = cos * np.float32(self.attention_factor), sin * np.float32(self.attention_factor)
        return np.stack([cos, sin], axis=-1).astype(np.float32)


def rope_type(scaling: Any) -> str:
    """The scaling's ``rope_type`` (or legacy ``type``); ``default`` when there is none."""
    if scaling is None:
        return "default"
    if not isinstance(scaling, dict):
        raise RopeScalingError(f"must be a JSON object such as {{\"rope_type\": \"linear\", \"factor\": 2.0}}, "
                               f"got {scaling!r}")
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    key = "rope_type" if "rope_type" in scaling else "type"
    if not isinstance(kind, str) or kind not in SUPPORTED:
        raise RopeScalingError(f"has rope_type {kind!r}, which is not supported (supported: {', '.join(SUPPORTED)})",
                               key)
    return kind


def rope_frequencies(head_dim: int, theta: float, scaling: dict[str, Any] | None = None,
                     max_positions: int | None = None) -> RopeFrequencies:
    """The RoPE frequencies of ``head_dim`` for ``rope_theta`` and the checkpoint's scaling;
    ``max_positions`` is the config's ``max_position_embeddings``."""
    kind = rope_type(scaling)
    inv = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    if kind == "default":
        return RopeFrequencies(inv)
    assert scaling is not None
    partial = _number(scaling, "partial_rotary_factor", kind, 1.0)
    if partial != 1.0:
        raise RopeScalingError(f"has 'partial_rotary_factor' {partial}, which is not supported (only 1.0)",
                               "partial_rotary_factor")
    if kind == "linear":
        return RopeFrequencies(inv / _number(scaling, "factor", kind))
    if kind == "dynamic":
        _number(scaling, "factor", kind)  # only used past max_position_embeddings, which never runs
        return RopeFrequencies(inv)
    original = _number(scaling, "original_max_position_embeddings", kind,
                       max_positions if max_positions is not None else _MISSING)
    if kind == "llama3":
        return RopeFrequencies(_llama3(inv, scaling, original))
    return _yarn(head_dim, theta, scaling, original, max_positions)


def rope_table(positions: np.ndarray | range, head_dim: int, theta: float,
               scaling: dict[str, Any] | None = None, max_positions: int | None = None) -> np.ndarray:
    """``[len(positions), head_dim // 2, 2]`` fp32 (cos, sin)."""
    return rope_frequencies(head_dim, theta, scaling, max_positions).table(positions)


def _number(scaling: dict[str, Any], key: str, kind: str, default: Any = _MISSING, positive: bool = True) -> float:
    value = scaling.get(key, default)
    if value is _MISSING or (value is None and default is _MISSING):
        raise RopeScalingError(f"has no '{key}', which rope_type '{kind}' needs", key)
    if value is None:
        value = default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or (positive and value <= 0):
        raise RopeScalingError(f"has '{key}': {value!r}, which must be a {'positive ' if positive else ''}number", key)
    return float(value)


def _llama3(inv: np.ndarray, scaling: dict[str, Any], old_context: float) -> np.ndarray:
    factor = _number(scaling, "factor", "llama3")
    low = _number(scaling, "low_freq_factor", "llama3")
    high = _number(scaling, "high_freq_factor", "llama3")
    if high <= low:
        raise RopeScalingError(f"has 'high_freq_factor' {high}, which must be greater than 'low_freq_factor' {low}",
                               "high_freq_factor")
    wavelen = 2 * math.pi / inv
    scaled = np.where(wavelen > old_context / low, inv / factor, inv)
    smooth = (old_context / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old_context / high) & ~(wavelen > old_context / low)
    return np.where(medium, blended, scaled)


def _yarn(dim: int, theta: float, scaling: dict[str, Any], original: float,
          max_positions: int | None) -> RopeFrequencies:
    if scaling.get("factor") is None and max_positions is not None:
        factor = max_positions / original
    else:
        factor = _number(scaling, "factor", "yarn")
    attention = scaling.get("attention_factor")
    if attention is not None:
        attention = _number(scaling, "attention_factor", "yarn")
    else:
        mscale = _number(scaling, "mscale", "yarn", 0.0, positive=False)
        mscale_all_dim = _number(scaling, "mscale_all_dim", "yarn", 0.0, positive=False)
        if mscale and mscale_all_dim:
            attention = _mscale(factor, mscale) / _mscale(factor, mscale_all_dim)
        else:
            attention = _mscale(factor)
    beta_fast = _number(scaling, "beta_fast", "yarn", 0.0, positive=False) or 32.0
    beta_slow = _number(scaling, "beta_slow", "yarn", 0.0, positive=False) or 1.0
    truncate = scaling.get("truncate", True)
    if not isinstance(truncate, bool):
        raise RopeScalingError(f"has 'truncate': {truncate!r}, which must be true or false", "truncate")

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # as transformers: no division by zero
    pos_freqs = theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    extrapolation = 1 - ramp
    inv = (1 / (factor * pos_freqs)) * (1 - extrapolation) + (1 / pos_freqs) * extrapolation
    return RopeFrequencies(inv, float(attention))


def _mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0
