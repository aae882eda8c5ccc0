"""Whether a checkpoint's ``config.json`` describes the math a model computes.

A checkpoint of another family often has the same tensor names and shapes as
the model's own (Qwen2, Granite, Gemma-2 and Llama-2 with biases all fit the
std Llama), so loading it would run without a word and give wrong logits.
Three checks run on the config before any value is mapped:

- **Architecture (E036).** The config's ``architectures`` and ``model_type``
  must be ones the model's ``hf_config`` declares: ``architecture:`` (a string
  or a list) and ``config_class:`` (``LlamaConfig`` is model type ``llama``;
  ``model_type:`` names others). The error names the std model that serves the
  checkpoint when one does. ``force_architecture`` turns it into W010.
- **Fields that change the math (E037).** :data:`FIELDS` lists the fields of
  transformers' config classes (Llama, Mistral, Qwen2/3, Gemma/Gemma-2,
  Granite, Phi-3, OLMo, ...) that change what the network computes, each with
  its neutral value (``attention_bias: false``, ``*_multiplier: 1.0``,
  ``hidden_act: "silu"``, no ``*_softcapping``, only ``full_attention`` layers
  or, for a model that maps ``sliding_window``, only ``sliding_attention``, ...). A field the
  model maps in ``param_mapping`` is the model's business.
  The model declares the rest in its ``hf_config``::

      require:                  # the values the model computes; overrides the table
        hidden_act: "silu"
      ignore: ["pretraining_tp"]  # fields the model accepts with any value

  Every other listed field must be absent (the config class's default) or
  neutral; the error names the field, at its place in ``config.json``.
- **Suspicious values (W011).** A norm epsilon that is NaN, not positive or
  above 0.01, and a ``rope_theta`` that is NaN, infinite or at most 1.

Warnings reach Python users as :class:`DiagnosticWarning` through
:func:`warn_python` where no sink collects them.
"""

from __future__ import annotations

import json
import math
import re
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from xdsl.dialects.builtin import ArrayAttr, DictionaryAttr, FloatAttr, IntegerAttr, StringAttr
from xdsl.ir import Attribute

from modeldsl.diagnostics import Diagnostic, DiagnosticError, Span
from modeldsl.dialects.graph import ModelOp
from modeldsl.registry import model_serving, plain_model_type

Neutral = Callable[[Any, dict[str, Any]], bool]


class DiagnosticWarning(UserWarning):
    """A modeldsl warning diagnostic (``.code``, ``.diagnostic``) raised through Python's ``warnings``."""

    def __init__(self, diagnostic: Diagnostic):
        super().__init__(diagnostic)  # the args rebuild the warning (copy, pickle, pytest-xdist)
        self.diagnostic = diagnostic
        self.code = diagnostic.code

    def __str__(self) -> str:
        return self.diagnostic.render().rstrip("\n")


def warn_python(diagnostic: Diagnostic) -> None:
    """Raise a warning diagnostic through Python's ``warnings``, attributed to the caller's code."""
    warnings.warn(DiagnosticWarning(diagnostic), stacklevel=_first_frame_outside_the_package())


def _first_frame_outside_the_package() -> int:
    """The ``stacklevel`` of the nearest caller outside modeldsl (seen from :func:`warn_python`)."""
    frame, level = sys._getframe(2), 2
    while frame is not None and frame.f_code.co_filename.startswith(PACKAGE_ROOT):
        frame, level = frame.f_back, level + 1
    return level


PACKAGE_ROOT = str(Path(__file__).resolve().parents[1])


# ---------------------------------------------------------------------------- neutral values
def _off(value: Any, hf: dict[str, Any]) -> bool:
    return value is None or value is False or value == 0


def _equals(neutral: Any) -> Neutral:
    """Neutral at ``neutral``, or null (the config class's default, as for an absent field)."""
    return lambda value, hf: value is None or _same(value, neutral)


def _head_dim(hf: dict[str, Any]) -> int | None:
    head_dim, hidden, heads = hf.get("head_dim"), hf.get("hidden_size"), hf.get("num_attention_heads")
    if _integer(head_dim) and head_dim > 0:
        return head_dim
    return hidden // heads if _integer(hidden) and _integer(heads) and heads > 0 else None


def _standard_attention_scale(value: Any, hf: dict[str, Any]) -> bool:
    head_dim = _head_dim(hf)
    return value is None or (head_dim is not None and _same(value, head_dim ** -0.5))


def _query_scalar_is_head_dim(value: Any, hf: dict[str, Any]) -> bool:
    return value is None or _same(value, _head_dim(hf))


def _window_unused(value: Any, hf: dict[str, Any]) -> bool:
    return _off(value, hf) or hf.get("use_sliding_window") is False


def _all_of(value: Any, kind: str) -> bool:
    return isinstance(value, list) and all(entry == kind for entry in value)


def _all_full_attention(value: Any, hf: dict[str, Any]) -> bool:
    return value is None or _all_of(value, "full_attention")


def _rope_everywhere(value: Any, hf: dict[str, Any]) -> bool:
    return value is None or (isinstance(value, list) and all(_same(flag, 1) for flag in value))


def _no_step_clamp(value: Any, hf: dict[str, Any]) -> bool:
    """time_step_limit, Mamba-2's clamp of the step size dt = softplus(...) >= 0: neutral where it clamps
    nothing (the default (0, inf), which config.py reads from transformers 5's {"__float__": "Infinity"})."""
    return value is None or (isinstance(value, list) and len(value) == 2 and all(_number(v) for v in value)
                             and value[0] <= 0 and value[1] == math.inf)


FIELDS: dict[str, tuple[Neutral, str]] = {
    "attention_bias": (_off, "biases on the q/k/v/o projections"),
    "mlp_bias": (_off, "biases on the MLP projections"),
    "qkv_bias": (_off, "biases on the q/k/v projections"),
    "use_qk_norm": (_off, "a norm of q and k before attention"),
    "qk_layernorm": (_off, "a norm of q and k before attention"),
    "qk_norm": (_off, "a norm of q and k before attention"),
    "hidden_act": (_equals("silu"), "the MLP's activation"),
    "hidden_activation": (_equals("silu"), "the MLP's activation"),
    "partial_rotary_factor": (_equals(1.0), "RoPE on only part of each head"),
    "attention_multiplier": (_standard_attention_scale, "an attention scale other than 1/sqrt(head_dim)"),
    "query_pre_attn_scalar": (_query_scalar_is_head_dim, "an attention scale other than 1/sqrt(head_dim)"),
    "logits_scaling": (_equals(1.0), "a division of the logits"),
    "logit_scale": (_equals(1.0), "a scale of the logits"),
    "clip_qkv": (_off, "clipping of q, k and v"),
    "use_sliding_window": (_off, "sliding-window attention"),
    "sliding_window": (_window_unused, "sliding-window attention"),
    "layer_types": (_all_full_attention, "layers of another attention kind"),
    "no_rope_layers": (_rope_everywhere, "layers without RoPE"),
    "use_parallel_residual": (_off, "parallel attention and MLP residuals"),
    "use_bidirectional_attention": (_off, "bidirectional (non-causal) attention"),
    "num_local_experts": (_off, "mixture-of-experts layers"),
    "num_experts": (_off, "mixture-of-experts layers"),
    "n_routed_experts": (_off, "mixture-of-experts layers"),
    "time_step_limit": (_no_step_clamp, "a clamp of the Mamba-2 step size"),
}
# fields that transformers' config classes accept under two names for one setting (Gemma's configs carry
# both, with the same value): one the model requires or maps, the other set to the same value, is accepted
ALIASES: dict[str, str] = {"hidden_act": "hidden_activation", "hidden_activation": "hidden_act"}
PATTERNS: list[tuple[re.Pattern[str], Neutral, str]] = [
    (re.compile(r".+_multiplier$"), _equals(1.0), "a scale of the activations"),
    (re.compile(r".+_softcapping$"), _off, "tanh soft-capping"),
]
NESTED = {"rope_parameters": ("partial_rotary_factor",)}  # fields transformers 5 keeps inside an object


def math_field(name: str) -> tuple[Neutral, str] | None:
    """How a config field changes the math, and its neutral value (None: it does not)."""
    if name in FIELDS:
        return FIELDS[name]
    return next(((neutral, what) for pattern, neutral, what in PATTERNS if pattern.match(name)), None)


# fields that change only what training computes (dropout, the router's noise), which the trainer does not
# implement: a value other than 0 is W007 when a run trains
TRAINING_ONLY: dict[str, str] = {
    "attention_dropout": "dropout of the attention probabilities",
    "hidden_dropout": "dropout of the hidden states",
    "resid_pdrop": "dropout of the residual branches",
    "embd_pdrop": "dropout of the embeddings",
    "router_jitter_noise": "the router's multiplicative jitter noise",
}


def training_only_fields(hf: Any) -> list[Diagnostic]:
    """W007 for each field of :data:`TRAINING_ONLY` set to something other than 0 (or null): training
    runs without it, unlike transformers' training mode; inference is the same either way."""
    problems = []
    for name, what in TRAINING_ONLY.items():
        value = hf.get(name) if hasattr(hf, "get") else None
        if value is not None and not (_number(value) and value == 0):
            problems.append(Diagnostic("W007", f"config.json sets '{name}' to {_show(value)}: {what}, which "
                                       "modeldsl's training does not apply (transformers applies it in training "
                                       "mode)", _span(hf, name), f"training runs as with '{name}': 0; losses "
                                       "and gradients follow that"))
    return problems


# ---------------------------------------------------------------------------- the checks
def check_compatible(model: ModelOp, hf: Any, mapped: set[str], force_architecture: bool = False
                     ) -> list[Diagnostic]:
    """E036 / E037 (raised together as a :class:`DiagnosticError`) for a config that does not
    describe the model; the W010 of a forced architecture is returned."""
    declared = declarations(model)
    warned: list[Diagnostic] = []
    malformed = malformed_identity(hf)
    if malformed:
        raise DiagnosticError(malformed)
    mismatch = architecture_mismatch(declared, hf)
    if mismatch is not None and not force_architecture:
        raise DiagnosticError([mismatch])
    if mismatch is not None:
        warned.append(Diagnostic("W010", f"--force-architecture: {mismatch.message}", mismatch.span,
                                 "the fields that change the math are still checked; compare the logits "
                                 "with the checkpoint's own implementation"))
    problems = unsupported_fields(model.sym_name.data, declared, hf, mapped)
    if problems:
        raise DiagnosticError(warned + problems)
    return warned


def declarations(model: ModelOp) -> dict[str, Any]:
    """The model's ``hf_config`` as Python values (``architecture``, ``require``, ``ignore``, ...)."""
    section = model.hf_config.data if model.hf_config is not None else {}
    return {name: python_value(value) for name, value in section.items() if name != "param_mapping"}


def _names(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def declared_types(declared: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The architectures and model types a model serves."""
    types = _names(declared.get("model_type"))
    if not types:
        types = [name.removesuffix("Config").lower() for name in _names(declared.get("config_class"))]
    return _names(declared.get("architecture")), types


def malformed_identity(hf: Any) -> list[Diagnostic]:
    """E030 for an ``architectures`` that is not a list of strings or a ``model_type`` that is
    not a string (transformers could not read either)."""
    problems = []
    architectures, model_type = hf.get("architectures"), hf.get("model_type")
    if architectures is not None and not (isinstance(architectures, list)
                                          and all(isinstance(a, str) for a in architectures)):
        problems.append(Diagnostic("E030", f"config.json field 'architectures' is {_show(architectures)}, not a "
                                   "list of class names", _span(hf, "architectures"),
                                   'write e.g. "architectures": ["LlamaForCausalLM"]'))
    if model_type is not None and not isinstance(model_type, str):
        problems.append(Diagnostic("E030", f"config.json field 'model_type' is {_show(model_type)}, not a string",
                                   _span(hf, "model_type"), 'write e.g. "model_type": "llama"'))
    return problems


def architecture_mismatch(declared: dict[str, Any], hf: Any) -> Diagnostic | None:
    """E036 when the config's ``architectures`` or ``model_type`` is not the model's."""
    architectures, types = declared_types(declared)
    given = _names(hf.get("architectures"))
    model_type = hf.get("model_type") if isinstance(hf.get("model_type"), str) else None
    wrong_arch = bool(architectures and given and not set(given) & set(architectures))
    by_type = not (architectures and given)  # the class names decide where both sides have them
    wrong_type = bool(by_type and types and model_type is not None
                      and plain_model_type(model_type) not in {plain_model_type(t) for t in types})
    if not (wrong_arch or wrong_type):
        return None
    theirs = " / ".join(filter(None, [", ".join(given), model_type and f"model_type '{model_type}'"]))
    ours = " / ".join(filter(None, [", ".join(architectures), types and f"model_type '{types[0]}'"]))
    serving = std_model_for(given, model_type)
    hint = (f"load it with the std model that serves it: {serving}" if serving is not None else
            "no std model serves it; write a model for this family") + \
        ", or pass --force-architecture (modeldsl.load(..., force_architecture=True)) if the model computes " \
        "exactly what the checkpoint's family does"
    field = "architectures" if wrong_arch else "model_type"
    return Diagnostic("E036", f"the checkpoint is {theirs}, but the model serves {ours}", _span(hf, field), hint)


def std_model_for(architectures: list[str], model_type: str | None) -> str | None:
    """The std model file (``std/models/NAME.module``) that serves the architectures."""
    entry = model_serving(architectures, model_type)
    return None if entry is None else f"std/models/{entry.path.name} ({entry.name})"


def unsupported_fields(model_name: str, declared: dict[str, Any], hf: Any, mapped: set[str]) -> list[Diagnostic]:
    """E037 for each field that changes the math and that the model neither maps, requires
    nor ignores, where the config gives it a value other than its neutral one."""
    required = declared.get("require") if isinstance(declared.get("require"), dict) else {}
    ignored = set(_names(declared.get("ignore")))
    problems = _per_layer_type_rope(model_name, hf, mapped)
    for name, value, where in _fields(hf):
        if name in mapped or name in ignored:
            continue
        if _names_the_same(name, value, required, hf, mapped):
            continue
        if name in required:
            if value is not None and not _same(value, required[name]):
                problems.append(Diagnostic("E037", f"config.json sets '{where}' to {_show(value)}, but "
                                           f"{model_name} computes {where} = {_show(required[name])}",
                                           _span(hf, name), "the checkpoint is of another variant; load it "
                                           "with a model that implements it"))
            continue
        if name == "layer_types" and "sliding_window" in mapped and _all_of(value, "sliding_attention"):
            continue  # every layer has the window the model maps
        if name == "layer_types" and "max_window_layers" in mapped and _window_from_max_window_layers(value, hf):
            continue  # the layers the model gives the window it maps (Qwen2)
        rule = math_field(name)
        if rule is not None and not rule[0](value, hf):
            problems.append(Diagnostic("E037", f"config.json sets '{where}' to {_show(value)}: {rule[1]}, which "
                                       f"{model_name} does not implement", _span(hf, name),
                                       f"load the checkpoint with a model that maps '{name}'; a model that "
                                       f"computes it declares it in hf_config (param_mapping, require: or ignore:)"))
    return problems


def _names_the_same(name: str, value: Any, required: dict[str, Any], hf: Any, mapped: set[str]) -> bool:
    """Whether ``name`` is the other name of a field the model requires or maps, set to what that one
    is (Gemma-2's ``hidden_act`` beside the ``hidden_activation`` the model requires)."""
    alias = ALIASES.get(name)
    if alias is None or name in required:
        return False
    if alias in required:
        return _same(value, required[alias])
    return alias in mapped and alias in hf and _same(value, hf.get(alias))


def _window_from_max_window_layers(value: Any, hf: Any) -> bool:
    """Whether layer_types are full attention before max_window_layers and sliding from it on (all full
    without use_sliding_window or a sliding_window), as transformers' Qwen2 derives them."""
    layers, first = hf.get("num_hidden_layers"), hf.get("max_window_layers")
    if not isinstance(value, list) or not isinstance(layers, int) or not isinstance(first, int):
        return False
    if not hf.get("use_sliding_window") or hf.get("sliding_window") is None:
        first = layers
    first = min(max(first, 0), layers)
    return value == ["full_attention"] * first + ["sliding_attention"] * (layers - first)


LOCAL_ROPE = ("sliding_attention", "rope_local_base_freq")  # the kind of layer with a RoPE of its own, its theta


def _per_layer_type_rope(model_name: str, hf: Any, mapped: set[str]) -> list[Diagnostic]:
    """E037 for RoPE parameters per kind of layer (Gemma-3's ``{"full_attention": {...}, ...}``), but
    for a model that maps the local theta (config.py lifts full_attention's to ``rope_theta`` and
    ``rope_scaling``, sliding_attention's theta to ``rope_local_base_freq``) where the local one is unscaled."""
    rope = hf.get("rope_parameters")
    kinds = [k for k, v in rope.items() if isinstance(v, dict)] if isinstance(rope, dict) else []
    if not kinds:
        return []
    local_kind, local_theta = LOCAL_ROPE
    if local_theta in mapped and set(kinds) <= {"full_attention", local_kind}:
        local_type = rope.get(local_kind, {}).get("rope_type", "default")
        if local_type in ("default", None):
            return []
        return [Diagnostic("E037", f"config.json gives the {local_kind} layers rope_type {_show(local_type)}, but "
                           f"{model_name} rotates them with unscaled frequencies of {local_theta}",
                           _span(hf, "rope_parameters"), f"set rope_parameters.{local_kind}.rope_type to "
                           "\"default\", as the family's checkpoints have it")]
    return [Diagnostic("E037", f"config.json gives 'rope_parameters' per kind of layer ({', '.join(kinds)}), which "
                       f"{model_name} does not implement", _span(hf, "rope_parameters"),
                       "load the checkpoint with a model of its family")]


def _fields(hf: dict[str, Any]) -> list[tuple[str, Any, str]]:
    """(name, value, as written) of the config's top-level fields and the nested ones of :data:`NESTED`."""
    fields = [(name, value, name) for name, value in hf.items()]
    for parent, names in NESTED.items():
        inner = hf.get(parent)
        if isinstance(inner, dict):
            fields += [(n, inner[n], f"{parent}.{n}") for n in names if n in inner and n not in hf]
    return fields


def suspicious_values(hf: Any) -> list[Diagnostic]:
    """W011 for a norm epsilon or RoPE base that no trained model has."""
    found = []
    for name in ("rms_norm_eps", "layer_norm_eps", "norm_eps"):
        value = hf.get(name)
        if _number(value) and not (0 < value <= 0.01):
            found.append(Diagnostic("W011", f"config.json sets '{name}' to {_show(value)}; a norm epsilon is a small "
                                    "positive number (1e-5, 1e-6)", _span(hf, name),
                                    "the norm divides by sqrt(mean + eps): a NaN, zero or negative eps gives NaN "
                                    "or infinite activations, a large one flattens them; fix config.json"))
    theta = hf.get("rope_theta")
    if _number(theta) and not (1 < theta < math.inf):
        found.append(Diagnostic("W011", f"config.json sets 'rope_theta' to {_show(theta)}; the RoPE base is a "
                                "number above 1 (10000, 500000)", _span(hf, "rope_theta"),
                                "the RoPE frequencies are theta^(-2i/d): this one gives NaN or meaningless "
                                "positions; fix config.json"))
    return found


# ---------------------------------------------------------------------------- helpers
def _span(hf: Any, field: str) -> Span | None:
    return hf.span(field) if hasattr(hf, "span") else None


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _same(value: Any, expected: Any) -> bool:
    """Equal as config values: numbers within a relative 1e-6, booleans as 0/1, others exactly; a
    required list is a pattern the config's list repeats, the last repetition possibly cut short (Gemma
    2's ``layer_types``: ``["sliding_attention", "full_attention"]`` for alternating layers, Gemma 3's
    five sliding then one full, 26 layers ending on two sliding ones)."""
    if isinstance(expected, (list, tuple)) and expected and isinstance(value, list):
        repeats = -(-len(value) // len(expected))
        return value == (list(expected) * repeats)[:len(value)]
    if isinstance(value, bool) or isinstance(expected, bool):
        flags = all(isinstance(v, bool) or (_integer(v) and v in (0, 1)) for v in (value, expected))
        return flags and int(value) == int(expected)
    if _number(value) and _number(expected):
        return math.isclose(value, expected, rel_tol=1e-6)
    return value == expected


def _show(value: Any) -> str:
    """A config value as config.json writes it (``true``, ``"silu"``, ``NaN``)."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 80 else text[:80] + "..."


def python_value(attr: Attribute) -> Any:
    """The Python value of an hf_config / hf_mapping attribute (strings, numbers, lists, dicts)."""
    if isinstance(attr, StringAttr):
        return attr.data
    if isinstance(attr, (IntegerAttr, FloatAttr)):
        return attr.value.data
    if isinstance(attr, ArrayAttr):
        return [python_value(a) for a in attr.data]
    if isinstance(attr, DictionaryAttr):
        return {k: python_value(v) for k, v in attr.data.items()}
    return getattr(attr, "data", attr)
