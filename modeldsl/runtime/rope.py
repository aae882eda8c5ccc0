"""RoPE tables: the ``freqs`` input ``[T, head_dim // 2, 2]`` = (cos, sin) per position and pair.

The inverse frequencies follow HuggingFace: ``theta ** (-2i / head_dim)``,
optionally rescaled by the checkpoint's ``rope_scaling``: ``linear``
(divide by ``factor``) or ``llama3`` (long wavelengths divided by ``factor``,
short ones kept, a smooth blend between).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np


class RopeScalingError(ValueError):
    """A ``rope_scaling`` this runtime does not implement."""


def inverse_frequencies(head_dim: int, theta: float, scaling: dict[str, Any] | None = None) -> np.ndarray:
    inv = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if kind == "default":
        return inv
    if kind == "linear":
        return inv / float(scaling["factor"])
    if kind == "llama3":
        return _llama3(inv, scaling)
    raise RopeScalingError(f"rope_scaling type '{kind}' is not supported (default, linear, llama3)")


def _llama3(inv: np.ndarray, scaling: dict[str, Any]) -> np.ndarray:
    factor = float(scaling["factor"])
    low, high = float(scaling.get("low_freq_factor", 1.0)), float(scaling.get("high_freq_factor", 4.0))
    old_context = float(scaling.get("original_max_position_embeddings", 8192))
    wavelen = 2 * math.pi / inv
    scaled = np.where(wavelen > old_context / low, inv / factor, inv)
    smooth = (old_context / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old_context / high) & ~(wavelen > old_context / low)
    return np.where(medium, blended, scaled)


def rope_table(positions: np.ndarray | range, head_dim: int, theta: float,
               scaling: dict[str, Any] | None = None) -> np.ndarray:
    """``[len(positions), head_dim // 2, 2]`` fp32 (cos, sin), computed in fp32 as transformers does."""
    inv = inverse_frequencies(head_dim, theta, scaling).astype(np.float32)
    angles = np.asarray(positions, dtype=np.float32)[:, None] * inv[None, :]
    return np.stack([np.cos(angles), np.sin(angles)], axis=-1).astype(np.float32)
