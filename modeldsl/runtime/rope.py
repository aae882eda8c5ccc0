"""RoPE tables: the ``freqs`` input ``[T, rotary_dim // 2, 2]`` = (cos, sin) per position and pair
(``rotary_dim`` is ``head_dim``, or ``int(head_dim * partial_rotary_factor)`` where a model rotates
only part of each head: Phi-3's ``partial_rotary_factor``).

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
  ``attention_factor`` (given, or from ``factor``, ``mscale``, ``mscale_all_dim``);
* ``longrope`` (Phi-3-128k, Phi-3.5, Phi-4-mini; ``su``, its old name, too): the
  default frequencies divided element-wise by ``short_factor``, or by
  ``long_factor`` when the sequence is longer than
  ``original_max_position_embeddings``, and cos/sin multiplied by an
  ``attention_factor`` (given, else ``sqrt(1 + ln(factor) / ln(original))``
  with ``factor`` given or ``max_position_embeddings / original``), as
  transformers' ``_compute_longrope_parameters`` and ``dynamic_rope_update``
  (which picks the set for ``max(position_ids) + 1``). :class:`RopeFrequencies`
  holds both sets; :meth:`RopeFrequencies.table` picks the one for the
  sequence length it is given (the last position + 1 by default), and
  :meth:`RopeFrequencies.recomputes` says when generation must recompute its
  cache, for the families whose transformers generation does
  (``generation_recomputes``: Phi-3's ``prepare_inputs_for_generation`` drops
  the cache when the sequence first grows past
  ``original_max_position_embeddings``, as the keys in it were rotated with the
  short factors; other families' generation keeps them, and so does ours).

Packed rows (several examples in one row of T tokens, each at its own positions
``0..``: ``mdsl-train-step{packed=true}``) take a table per row,
``[B, T, rotary_dim // 2, 2]``: :func:`tables_at` gives it for the tokens'
positions (each row of it bitwise the row of :meth:`RopeFrequencies.table` at that
position; with longrope, each example's factors are those of its own length), and
:func:`packed_inputs` all the inputs of a packed step's forward, in the program's
order.

``original_max_position_embeddings`` defaults to ``max_position_embeddings``,
as in transformers; a config's top-level one (``original_max_positions``,
Phi-3's) takes precedence over the scaling's, as transformers'
``standardize_rope_params`` gives it. A ``partial_rotary_factor`` in the
scaling is only accepted where the caller's ``head_dim`` times it is the
rotated width (the model rotates that part of each head). A malformed or unsupported scaling is a
:class:`RopeScalingError` naming the offending key.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

SUPPORTED = ("default", "linear", "dynamic", "llama3", "yarn", "longrope")
ALIASES = {"su": "longrope"}  # Phi-3-128k's first configs; transformers' Phi3Config renames it
_MISSING = object()


class RopeScalingError(ValueError):
    """A ``rope_scaling`` that is malformed or that this runtime does not implement."""

    def __init__(self, message: str, key: str | None = None):
        super().__init__(message)
        self.key = key


@dataclass(frozen=True)
class RopeFrequencies:
    """The inverse frequencies ``[rotary_dim // 2]`` and the factor applied to cos and sin; for
    longrope also the long ones, used for sequences longer than ``original_max_positions``."""

    inv_freq: np.ndarray
    attention_factor: float = 1.0
    long_inv_freq: np.ndarray | None = None
    original_max_positions: int = 0
    generation_recomputes: bool = False  # transformers' generation of the family drops its cache at the switch

    def uses_long(self, seq_len: int) -> bool:
        """Whether a sequence of ``seq_len`` positions runs with the long frequencies (longrope)."""
        return self.long_inv_freq is not None and seq_len > self.original_max_positions

    def recomputes(self, cached: int, end: int) -> bool:
        """Whether generation with ``cached`` positions in its cache, growing to ``end``, recomputes
        the whole sequence: its cached keys were rotated with the short factors and the sequence now
        takes the long ones (transformers' Phi-3 drops its cache then; other families keep it)."""
        return self.long_inv_freq is not None and self.generation_recomputes \
            and 0 < cached <= self.original_max_positions < end

    def table(self, positions: np.ndarray | range, seq_len: int | None = None) -> np.ndarray:
        """``[len(positions), rotary_dim // 2, 2]`` fp32 (cos, sin), computed in fp32 as transformers
        does, with the frequencies of a sequence of ``seq_len`` positions (default: the last position
        + 1, as transformers' ``dynamic_rope_update``)."""
        positions = np.asarray(positions)
        if seq_len is None:
            seq_len = int(positions.max()) + 1 if positions.size else 0
        inv = (self.long_inv_freq if self.uses_long(seq_len) else self.inv_freq).astype(np.float32)
        angles = positions.astype(np.float32)[:, None] * inv[None, :]
        cos, sin = np.cos(angles), np.sin(angles)
        if self.attention_factor != 1.0:
            cos, sin = cos * np.float32(self.attention_factor), sin * np.float32(self.attention_factor)
        return np.stack([cos, sin], axis=-1).astype(np.float32)


    def tables_at(self, positions: np.ndarray, segments: np.ndarray | None = None) -> np.ndarray:
        """``[*positions.shape, rotary_dim // 2, 2]`` fp32: the (cos, sin) of each token at its own position
        (``positions [B, T]``: packed rows, restarting at 0 with every example). Longrope takes, for each
        token, the factors of its example's length (its ``segments`` id's last position + 1 in its row;
        without segments, its row's): what the example run alone gets."""
        positions = np.asarray(positions)
        flat = positions.reshape(-1)
        if self.long_inv_freq is None or not flat.size:
            return self.table(flat, 1).reshape(*positions.shape, -1, 2)
        lengths = _example_lengths(positions, segments).reshape(-1)
        short = self.table(flat, self.original_max_positions)
        long = self.table(flat, self.original_max_positions + 1)
        return np.where((lengths > self.original_max_positions)[:, None, None], long, short) \
            .reshape(*positions.shape, -1, 2)


def _example_lengths(positions: np.ndarray, segments: np.ndarray | None) -> np.ndarray:
    """For each token, the last position + 1 of its example: of its segment in its row (of its row
    without segments)."""
    positions = np.atleast_2d(np.asarray(positions, dtype=np.int64))
    ids = np.zeros_like(positions) if segments is None else np.atleast_2d(np.asarray(segments, dtype=np.int64))
    ids = ids - ids.min()
    keys = (np.arange(len(ids))[:, None] * (ids.max() + 1) + ids).reshape(-1)  # (row, example)
    longest = np.zeros(keys.max() + 1, np.int64)
    np.maximum.at(longest, keys, positions.reshape(-1) + 1)
    return longest[keys].reshape(positions.shape)


def tables_at(ropes: Mapping[str, RopeFrequencies], positions: np.ndarray,
              segments: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """The RoPE table per row of each RoPE input (``model.ropes``: ``freqs``, Gemma 3's ``local_freqs``) for
    packed rows: ``[B, T, rotary_dim // 2, 2]`` fp32 of the tokens' ``positions`` ``[B, T]`` (their example's
    ``segments`` pick longrope's factors), what ``mdsl-pack-sequences`` makes the forward take."""
    return {name: rope.tables_at(positions, segments) for name, rope in ropes.items()}


def packed_inputs(model: Any, tokens: np.ndarray, segments: np.ndarray, positions: np.ndarray) -> list[np.ndarray]:
    """The forward inputs of a packed training step (``mdsl-train-step{packed=true}``) for rows of ``tokens``
    ``[B, T]`` whose tokens belong to the examples ``segments`` ``[B, T]`` at ``positions`` ``[B, T]``
    (:class:`modeldsl.runtime.instructions.Batch`'s): the model's forward inputs in their order (the token
    ids as the forward's integer dtype, each RoPE table per row, :func:`tables_at`), then the segment ids
    int32. The step's inputs are these, then the labels and ``d_loss`` (as an unpacked step's).
    ``model``: a loaded :class:`modeldsl.runtime.model.Model` (its ``forward_func`` and ``ropes``)."""
    tokens, segments, positions = (np.asarray(a) for a in (tokens, segments, positions))
    if not tokens.shape == segments.shape == positions.shape or tokens.ndim != 2:
        raise ValueError(f"tokens {tokens.shape}, segments {segments.shape} and positions {positions.shape} "
                         "must be [B, T] alike")
    tables = tables_at(model.ropes, positions, segments)
    values = []
    for arg in model.forward_func.body.block.args:
        if arg.name_hint in tables:
            values.append(tables[arg.name_hint])
        elif not arg.type.dtype.is_float:
            values.append(tokens.astype(np.dtype(arg.type.dtype.value)))
        else:
            raise ValueError(f"the forward input '{arg.name_hint}' is neither the token ids nor a RoPE table")
    return [*values, segments.astype(np.int32)]


def rope_type(scaling: Any) -> str:
    """The scaling's ``rope_type`` (or legacy ``type``); ``default`` when there is none."""
    if scaling is None:
        return "default"
    if not isinstance(scaling, dict):
        raise RopeScalingError(f"must be a JSON object such as {{\"rope_type\": \"linear\", \"factor\": 2.0}}, "
                               f"got {scaling!r}")
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    key = "rope_type" if "rope_type" in scaling else "type"
    kind = ALIASES.get(kind, kind) if isinstance(kind, str) else kind
    if not isinstance(kind, str) or kind not in SUPPORTED:
        raise RopeScalingError(f"has rope_type {kind!r}, which is not supported (supported: {', '.join(SUPPORTED)})",
                               key)
    return kind


def rope_frequencies(rotary_dim: int, theta: float, scaling: dict[str, Any] | None = None,
                     max_positions: int | None = None, head_dim: int | None = None,
                     original_max_positions: int | None = None,
                     generation_recomputes: bool = False) -> RopeFrequencies:
    """The RoPE frequencies of ``rotary_dim`` rotated dims for ``rope_theta`` and the checkpoint's
    scaling; ``max_positions`` is the config's ``max_position_embeddings``, ``head_dim`` the
    model's (a scaling's ``partial_rotary_factor`` must give ``rotary_dim`` from it),
    ``original_max_positions`` the config's top-level ``original_max_position_embeddings``;
    ``generation_recomputes``: the family's transformers generation recomputes where longrope
    switches to its long factors (Phi-3)."""
    kind = rope_type(scaling)
    inv = 1.0 / (theta ** (np.arange(0, rotary_dim, 2, dtype=np.float64) / rotary_dim))
    if kind == "default":
        return RopeFrequencies(inv)
    assert scaling is not None
    partial = _number(scaling, "partial_rotary_factor", kind, 1.0)
    if partial != 1.0 and (head_dim is None or int(head_dim * partial) != rotary_dim):
        raise RopeScalingError(f"has 'partial_rotary_factor' {partial}, which is not supported (only 1.0)"
                               + (f": the model rotates {rotary_dim} of its {head_dim} head dims"
                                  if head_dim is not None else ""), "partial_rotary_factor")
    if kind == "linear":
        return RopeFrequencies(inv / _number(scaling, "factor", kind))
    if kind == "dynamic":
        _number(scaling, "factor", kind)  # only used past max_position_embeddings, which never runs
        return RopeFrequencies(inv)
    if original_max_positions is not None:
        original = _number({"original_max_position_embeddings": original_max_positions},
                           "original_max_position_embeddings", kind)
    else:
        original = _number(scaling, "original_max_position_embeddings", kind,
                           max_positions if max_positions is not None else _MISSING)
    if kind == "llama3":
        return RopeFrequencies(_llama3(inv, scaling, original))
    if kind == "longrope":
        return _longrope(rotary_dim, inv, scaling, original, max_positions, generation_recomputes)
    if "short_factor" in scaling and "long_factor" in scaling:
        raise RopeScalingError("has rope_type 'yarn' with 'short_factor' and 'long_factor': transformers' Phi-3 "
                               "reads that as longrope, other families as YaRN without them; write rope_type "
                               "'longrope' (Phi-3) or leave the factors out", "rope_type")
    return _yarn(rotary_dim, theta, scaling, original, max_positions)


def rope_table(positions: np.ndarray | range, rotary_dim: int, theta: float,
               scaling: dict[str, Any] | None = None, max_positions: int | None = None) -> np.ndarray:
    """``[len(positions), rotary_dim // 2, 2]`` fp32 (cos, sin)."""
    return rope_frequencies(rotary_dim, theta, scaling, max_positions).table(positions)


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


def _longrope(dim: int, inv: np.ndarray, scaling: dict[str, Any], original: float,
              max_positions: int | None, generation_recomputes: bool) -> RopeFrequencies:
    """transformers' ``_compute_longrope_parameters``: the short and the long frequencies, and the
    attention factor both share."""
    short, long = (_factors(scaling, key, dim) for key in ("short_factor", "long_factor"))
    if original != int(original):
        raise RopeScalingError(f"has 'original_max_position_embeddings': {original!r}, which must be an integer",
                               "original_max_position_embeddings")
    if scaling.get("factor") is None:
        if max_positions is None:
            raise RopeScalingError("has no 'factor', and there is no max_position_embeddings to derive it from",
                                   "factor")
        factor = max_positions / original
    else:
        factor = _number(scaling, "factor", "longrope")
    if scaling.get("attention_factor") is not None:
        attention = _number(scaling, "attention_factor", "longrope")
    else:
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    return RopeFrequencies(inv / short, float(attention), inv / long, int(original), generation_recomputes)


def _factors(scaling: dict[str, Any], key: str, dim: int) -> np.ndarray:
    value = scaling.get(key)
    if value is None:
        raise RopeScalingError(f"has no '{key}', which rope_type 'longrope' needs", key)
    if not isinstance(value, list) or len(value) != dim // 2 or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0 for v in value):
        raise RopeScalingError(f"has '{key}': {_short(value)}, which must be a list of {dim // 2} positive numbers "
                               f"(one per pair of the {dim} rotated dims)", key)
    return np.asarray(value, dtype=np.float64)


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


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
