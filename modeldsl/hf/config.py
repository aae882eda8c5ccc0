"""HuggingFace ``config.json`` to the DSL model's configuration, through ``hf_config``.

``hf_config.param_mapping`` maps each DSL model parameter to a config field,
either plainly (``d_model: hidden_size``) or with what an absent or null
field means::

    num_kv_heads: field(num_key_value_heads, null=num_heads, absent=num_heads)
    sliding_window: field(sliding_window, null=0)

A field the file has gives its value, checked against the parameter's type
(``int``, ``float``, ``bool``); an integer that sizes a tensor of the model
(a symbol of a parameter's or input's shape: ``n_layers``, ``d_model``, ...)
must be at least 1. All of these are E030 naming the field.

A field the file **lacks** takes ``absent=`` when given, else the DSL default;
a parameter with neither is E030 naming the field.

A field the file sets to **null** takes ``null=`` when given, else it is E030.
transformers does not treat null as "the default": the JSON value replaces
the config class's default, and each config class decides what None means
(``head_dim: null`` is ``hidden_size // num_attention_heads``,
``num_key_value_heads: null`` is ``num_attention_heads``, Mistral's
``sliding_window: null`` is full attention while its default is 4096, and
most fields cannot be None at all). The DSL default agrees with that only
where the model says so, so a mapping spells each null it accepts.

``null=`` and ``absent=`` take a literal, ``default`` (the DSL default), or
a compile-time expression of the parameters before it. An exported
``config.json`` writes null where the value equals a literal ``null=``.

A field that holds a list is read element by element with ``index=`` (a
non-negative integer literal)::

    mlp_gate_multiplier: field(mlp_multipliers, index=0, null=1.0)
    mlp_down_multiplier: field(mlp_multipliers, index=1, null=1.0)

The parameters that map a list field map every element of it, each once, and
none maps it whole (E010 at the mapping otherwise): an element no parameter
reads could change the math unchecked, and could not be written back. So the
list must have exactly that many elements; a value that is not a list, or a
list of another length, is E030 naming the field, and each element is checked
against its parameter's type like a field (E030 naming ``field[index]``), a
null element included (transformers' config classes give a null list a
meaning, never a null element). An absent or null list gives each parameter
its ``absent=`` / ``null=`` (the DSL default / E030 without). An exported
``config.json`` writes the list whole, each element its parameter's value
(never null).

Configs written by transformers 5 keep ``rope_theta`` and the scaling under
``rope_parameters``; :func:`normalize` lifts them to the older top-level
``rope_theta`` / ``rope_scaling`` so one mapping reads both (Gemma 3's
``rope_parameters`` per kind of layer: the ``full_attention`` one, and the
``sliding_attention`` theta as the older ``rope_local_base_freq``; a mapped
``partial_rotary_factor`` is read in ``rope_parameters`` first, where
transformers 5 reads it, then at the top level), gives the
expert count under both of its names (``num_experts``, ``num_local_experts``),
and reads transformers 5's spelling of the floats JSON has no number for
(``{"__float__": "Infinity"}``, ``"-Infinity"``, ``"NaN"``; 4.x wrote a bare
``Infinity``, which Python's json reads) as those floats. A config.json
that is not valid JSON is a located E030 (file, line and column of the JSON
error, with a caret), and so are integers past 4000 digits and nesting past
200 levels (which Python's json cannot read); a config.json that is a folder,
FIFO or device is E028, found by ``stat`` before anything opens it. A field's
error points at it in the file (:meth:`HFConfig.span`). Before any value is
mapped, :mod:`modeldsl.hf.compat` checks that the config describes what the
model computes (E036, E037; W010, W011).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xdsl.dialects.builtin import DictionaryAttr, IntegerAttr, IntegerType, StringAttr

from modeldsl.diagnostics import Diagnostic, DiagnosticError, Source, Span
from modeldsl.dialects.graph import ModelOp, StackOp
from modeldsl.dialects.graph_types import TensorType
from modeldsl.frontend.text import ast
from modeldsl.hf.compat import NESTED, check_compatible, declarations, declared_types, suspicious_values, warn_python
from modeldsl.hf.safetensors_io import CheckpointError, regular_file
from modeldsl.instances import source_text
from modeldsl.resolve.consts import ConstEnv, ConstError, NotConstant, evaluate
from modeldsl.symbolic import Expr

INT64 = (-(2**63), 2**63 - 1)
MAX_CONFIG_BYTES = 64 * 1024 * 1024
MAX_INT_DIGITS = 4000  # below Python's int-str limit (4300), far above any real config value
MAX_NESTING = 200  # json recurses per level; far above any real config


class HFConfig(dict):
    """A normalized ``config.json``: a dict that remembers its text, to point diagnostics at a field."""

    source: Source | None = None

    def span(self, field: str) -> Span | None:
        """Where ``"field":`` first appears in the file (None for a config without a file)."""
        if self.source is None:
            return None
        match = re.search(rf'"{re.escape(field)}"\s*:', self.source.text)
        if match is None:
            return None
        return offset_span(self.source, match.start(), match.start() + len(field) + 2)


def offset_span(source: Source, start: int, end: int) -> Span:
    """The span of the characters ``[start, end)`` of a one-line stretch of ``source``."""
    line = source.text.count("\n", 0, start) + 1
    column = start - (source.text.rfind("\n", 0, start) + 1) + 1
    return Span(source, line, column, line, column + max(1, end - start))


def read_config(directory: str | Path) -> HFConfig:
    """The normalized ``config.json`` of a checkpoint directory: E028 when the folder or the
    file is not there as such (a folder, FIFO or device in place of the file), E030 when it is
    invalid, located at the JSON error (also integers past 4000 digits and nesting deeper than
    200 levels, which Python's json cannot read)."""
    path = Path(directory)
    if not path.is_dir():
        raise CheckpointError("E028", f"checkpoint directory '{path}' does not exist"
                              + (" (it is a file)" if path.exists() else ""),
                              "pass the folder that holds config.json and *.safetensors")
    config_file = path / "config.json"
    info = regular_file(config_file, "the checkpoint config", required=False)
    if info is None:
        raise CheckpointError("E030", f"'{path}' has no config.json", "a HuggingFace checkpoint folder holds "
                              "config.json beside its *.safetensors files")
    if info.st_size > MAX_CONFIG_BYTES:
        raise CheckpointError("E030", f"{config_file} holds {info.st_size} bytes; a config.json is a few KB",
                              "replace it with the checkpoint's original config.json")
    try:
        text = config_file.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise CheckpointError("E030", f"{config_file} is not UTF-8 text (byte {err.start})") from None
    source = Source(str(config_file), text)
    data = _parse_json(source)
    if not isinstance(data, dict):
        raise CheckpointError("E030", f"{config_file} does not hold a JSON object")
    config = HFConfig(data)
    config.source = source
    return normalize(config)


def _parse_json(source: Source) -> Any:
    huge: list[str] = []

    def parse_int(digits: str) -> int | None:
        if len(digits.lstrip("-")) > MAX_INT_DIGITS:
            huge.append(digits)
            return None
        return int(digits)

    deep = _too_deep(source.text)
    if deep is not None:
        raise _json_error(source, deep, deep + 1, f"config.json nests arrays or objects more than {MAX_NESTING} "
                          "levels deep")
    try:
        data = json.loads(source.text, parse_int=parse_int)
    except json.JSONDecodeError as err:
        span = Span(source, err.lineno, err.colno, err.lineno, err.colno + 1)
        raise DiagnosticError([Diagnostic("E030", f"config.json is not valid JSON: {err.msg}", span,
                                          "fix the JSON (a missing comma or quote, a trailing comma, a "
                                          "truncated file), or download the checkpoint's config.json again")
                               ]) from None
    if huge:
        start = source.text.find(huge[0])
        raise _json_error(source, start, start + len(huge[0]), f"config.json holds an integer of "
                          f"{len(huge[0].lstrip('-'))} digits")
    return data


def _too_deep(text: str) -> int | None:
    """The offset of the first bracket nested past ``MAX_NESTING`` levels (outside strings)."""
    if text.count("[") + text.count("{") <= MAX_NESTING:
        return None
    depth, in_string, escaped = 0, False, False
    for offset, char in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > MAX_NESTING:
                return offset
        elif char in "]}":
            depth -= 1
    return None


def _json_error(source: Source, start: int, end: int, message: str) -> DiagnosticError:
    return DiagnosticError([Diagnostic("E030", message, offset_span(source, start, end),
                                       "replace config.json with the checkpoint's original one")])


# transformers 5 writes Qwen3-MoE's expert count as num_local_experts (Mixtral's name), 4.x as num_experts
EXPERT_COUNT_SPELLINGS = (("num_local_experts", "num_experts"), ("num_experts", "num_local_experts"))


# transformers 5 writes the floats JSON has no number for as {"__float__": NAME} (PretrainedConfig's
# _encode_special_floats) and reads them back as floats
SPECIAL_FLOATS = {"Infinity": float("inf"), "-Infinity": float("-inf"), "NaN": float("nan")}


def _special_floats(value: Any) -> Any:
    """``value`` with each ``{"__float__": "Infinity"}`` (``"-Infinity"``, ``"NaN"``) in it the float it stands for."""
    if isinstance(value, dict):
        if len(value) == 1 and value.get("__float__") in SPECIAL_FLOATS:
            return SPECIAL_FLOATS[value["__float__"]]
        return {k: _special_floats(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_special_floats(v) for v in value]
    return value


# text_config fields a wrapper's own forward does not apply, so not lifted: transformers'
# Gemma3ForConditionalGeneration computes its logits without the final softcapping its text model's
# Gemma3ForCausalLM applies
WRAPPER_SKIPS = {"Gemma3ForConditionalGeneration": ("final_logit_softcapping",)}


def normalize(config: dict[str, Any]) -> HFConfig:
    """The config with, lifted to its top level: a multimodal wrapper's ``text_config`` fields (its
    own ``architectures`` and ``model_type`` kept, none of :data:`WRAPPER_SKIPS`); ``rope_parameters``
    (transformers 5) as ``rope_theta`` / ``rope_scaling`` (Gemma 3's per kind of layer:
    ``full_attention``'s, and ``sliding_attention``'s theta as ``rope_local_base_freq``). transformers
    5's ``{"__float__": "Infinity"}`` is read as the float; a ``rope_parameters`` or ``rope_scaling``
    that is not an object is E030 at the field."""
    result = HFConfig({name: _special_floats(value) for name, value in config.items()})
    result.source = getattr(config, "source", None)
    text = result.get("text_config")
    if isinstance(text, dict):  # a multimodal wrapper's text model (Gemma3ForConditionalGeneration)
        wrappers = [a for a in result.get("architectures") or [] if isinstance(a, str)]
        unapplied = {field for wrapper in wrappers for field in WRAPPER_SKIPS.get(wrapper, ())}
        result.update({name: value for name, value in text.items()
                       if name not in ("architectures", "model_type") and name not in unapplied})
    for name in ("rope_parameters", "rope_scaling"):
        value = result.get(name)
        if value is not None and not isinstance(value, dict):
            raise DiagnosticError([Diagnostic("E030", f"config.json field '{name}' is {_short(value)}, not an "
                                              "object", result.span(name), f"'{name}' is null or an object such "
                                              "as {\"rope_type\": \"default\", \"rope_theta\": 10000.0}")])
    rope = result.get("rope_parameters")
    if isinstance(rope, dict) and any(isinstance(value, dict) for value in rope.values()):
        local = rope.get("sliding_attention")
        if isinstance(local, dict) and local.get("rope_theta") is not None:
            result.setdefault("rope_local_base_freq", local["rope_theta"])
        rope = rope.get("full_attention")  # Gemma 3's per kind of layer: the global layers' is the model's
    if isinstance(rope, dict):
        if rope.get("rope_theta") is not None:
            result.setdefault("rope_theta", rope["rope_theta"])
        if rope.get("rope_type", "default") != "default":
            result.setdefault("rope_scaling", rope)
    for one, other in EXPERT_COUNT_SPELLINGS:
        if one in result and other not in result:
            result[other] = result[one]
    return result


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _field_name(value: Any) -> str | None:
    """The config field of a lowered ``param_mapping`` value (a name, or ``field(name, ...)``)."""
    if isinstance(value, StringAttr):
        return value.data
    if isinstance(value, DictionaryAttr) and "args" in value.data:
        first = value.data["args"].data[0] if value.data["args"].data else None
        return first.data if isinstance(first, StringAttr) else None
    return None


def _field_index(value: Any) -> int | None:
    """The ``index=`` of a lowered ``field(name, index=I)`` (None: the field whole)."""
    index = value.data.get("index") if isinstance(value, DictionaryAttr) else None
    return index.value.data if isinstance(index, IntegerAttr) else None


def _mapping_attrs(model: ModelOp) -> dict[str, Any]:
    if model.hf_config is None or not isinstance(model.hf_config.data.get("param_mapping"), DictionaryAttr):
        return {}
    return dict(model.hf_config.data["param_mapping"].data)


@dataclass
class FieldRule:
    """One ``param_mapping`` entry as written: the field, the element of a list field it reads
    (``index=``), what null / absence mean, and where it is written (for diagnostics)."""

    field: str
    null: ast.Expr | None = None
    absent: ast.Expr | None = None
    index: int | None = None
    span: Span | None = None

    @property
    def shown(self) -> str:
        """The field as messages name it: ``name`` or ``name[index]``."""
        return self.field if self.index is None else f"{self.field}[{self.index}]"


def model_rules(model: ModelOp) -> dict[str, FieldRule]:
    """The ``param_mapping`` of a lowered model: each parameter's field and element (no null/absent
    expressions, no locations)."""
    return {name: FieldRule(field, index=_field_index(attr)) for name, attr in _mapping_attrs(model).items()
            if (field := _field_name(attr)) is not None}


def list_fields(rules: dict[str, FieldRule]) -> dict[str, list[str]]:
    """The list fields that ``index=`` maps: field -> the parameter of each element, in order. E010 at
    the mapping where the parameters skip an element, map one twice, or one maps the field whole."""
    elements: dict[str, dict[int, str]] = {}
    for param, rule in rules.items():
        if rule.index is None:
            continue
        taken = elements.setdefault(rule.field, {})
        if rule.index in taken:
            raise _list_mapping_error(rule, f"hf_config maps element {rule.index} of '{rule.field}' twice "
                                      f"('{taken[rule.index]}' and '{param}')")
        taken[rule.index] = param
    for field, taken in elements.items():
        whole = next((param for param, rule in rules.items() if rule.field == field and rule.index is None), None)
        if whole is not None:
            raise _list_mapping_error(rules[whole], f"hf_config maps '{field}' whole to '{whole}' and by element "
                                      f"to {', '.join(repr(p) for p in taken.values())}")
        missing = [i for i in range(max(taken) + 1) if i not in taken]
        if missing:
            last = rules[taken[max(taken)]]
            raise _list_mapping_error(last, f"hf_config maps elements {', '.join(map(str, sorted(taken)))} of "
                                      f"'{field}' but not element {missing[0]}")
    return {field: [taken[i] for i in range(len(taken))] for field, taken in elements.items()}


def _list_mapping_error(rule: FieldRule, message: str) -> DiagnosticError:
    return DiagnosticError([Diagnostic("E010", message, rule.span, "map each element of a list field to one "
                                       "parameter with field(name, index=I), I = 0, 1, ...: an element no "
                                       "parameter reads would go unchecked and could not be written back")])


def field_rules(decl: ast.Decl) -> dict[str, FieldRule]:
    """The ``param_mapping`` entries of a model declaration, by DSL parameter."""
    rules: dict[str, FieldRule] = {}
    for section in decl.sections("hf_config")[:1]:
        for stmt in section.body:
            if not (isinstance(stmt, ast.Section) and stmt.name == "param_mapping"):
                continue
            for entry in stmt.body:
                if isinstance(entry, ast.Section) and entry.name is not None and entry.value is not None:
                    rules[entry.name] = _field_rule(entry.name, entry.value.expr)
    return rules


def _field_rule(param: str, node: ast.Expr) -> FieldRule:
    if isinstance(node, (ast.Name, ast.Str)):
        return FieldRule(node.id if isinstance(node, ast.Name) else node.value, span=node.span)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "field":
        positional = [a.value for a in node.args if a.name is None]
        named = {a.name: a for a in node.args if a.name is not None}
        unknown = [a for name, a in named.items() if name not in ("null", "absent", "index")]
        index = named["index"].value if "index" in named else None
        if index is not None and not (type(index) is ast.Int and index.value >= 0):
            raise DiagnosticError([Diagnostic("E010", f"hf_config maps '{param}' to an element of a list field, "
                                              f"but index={source_text(index)} is not a non-negative integer",
                                              named["index"].span, "write field(config_name, index=I) with I = "
                                              "0 for the first element")])
        if len(positional) == 1 and isinstance(positional[0], (ast.Name, ast.Str)) and not unknown:
            name = positional[0]
            return FieldRule(name.id if isinstance(name, ast.Name) else name.value,
                             named["null"].value if "null" in named else None,
                             named["absent"].value if "absent" in named else None,
                             index.value if index is not None else None, node.span)
        where = unknown[0].span if unknown else node.span
        raise DiagnosticError([Diagnostic("E010", f"hf_config maps '{param}' with a malformed field(...)", where,
                                          "write field(config_name, null=VALUE, absent=VALUE); VALUE is a "
                                          "literal, `default` or an expression of earlier parameters; index=I "
                                          "reads element I of a list field")])
    raise DiagnosticError([Diagnostic("E010", f"hf_config maps '{param}' to something that is not a config "
                                      "field", node.span, "write `param: config_name` or "
                                      "`param: field(config_name, null=VALUE, absent=VALUE)`")])


def size_symbols(model: ModelOp) -> set[str]:
    """Config parameters that size tensors: the symbols of parameter and input shapes."""
    symbols: set[str] = set()
    types = [p.param_type for p in model.params()]
    for func in model.funcs():
        types += [a.type for a in func.body.block.args]
    for ttype in types:
        if isinstance(ttype, TensorType):
            for dim in ttype.shape:
                if isinstance(dim, Expr):
                    symbols |= dim.symbols()
    return symbols & set(model.config_values)


def layer_counts(model: ModelOp) -> set[str]:
    """Config parameters that are a stack's layer count, alone (``blocks: [first_window_layer] x ...``)."""
    counts = [op.count.data for op in model.walk() if isinstance(op, StackOp)]
    return {name for count in counts for name in count.symbols() if count == Expr.sym(name)} & set(model.config_values)


def dsl_config(decl: ast.Decl, model: ModelOp, hf: dict[str, Any], force_architecture: bool = False,
               warn: Callable[[Diagnostic], None] | None = None) -> dict[str, Any]:
    """Values for the DSL model's parameters from a checkpoint's config (see the module
    docstring for absent and null fields), each evaluated against the values before it,
    once the config is known to describe what the model computes (:mod:`modeldsl.hf.compat`:
    E036, E037; W010 and W011 go to ``warn``, else to Python's ``warnings``). A problem
    with one field is a :class:`CheckpointError` whose ``span`` locates it in ``config.json``."""
    rules = model_rules(model) | field_rules(decl)
    report = warn if warn is not None else warn_python
    if not isinstance(hf, HFConfig):
        hf = normalize(hf)
    lists = list_fields(rules)
    for warning in check_compatible(model, hf, {rule.field for rule in rules.values()}, force_architecture):
        report(warning)
    try:
        check_lists(hf, rules, lists)
        values = _mapped_values(decl, model, hf, rules)
    except CheckpointError as err:
        if err.field is not None:
            err.span = hf.span(err.field)
        raise
    for warning in suspicious_values(hf):
        report(warning)
    return values


def check_lists(hf: dict[str, Any], rules: dict[str, FieldRule], lists: dict[str, list[str]]) -> None:
    """E030 for a list field (mapped with ``index=``) that the config gives as something other than
    a list of as many elements as the model maps."""
    for field, params in lists.items():
        value = hf.get(field)
        if value is None:
            continue
        readers = ", ".join(f"'{p}'" for p in params)
        hint = f"'{field}' is a JSON list of {len(params)} values, for {readers} in that order"
        if not isinstance(value, list):
            raise CheckpointError("E030", f"config.json field '{field}' is {_short(value)}, not a list: hf_config "
                                  f"reads its elements for {readers}", hint, field=field)
        if len(value) != len(params):
            raise CheckpointError("E030", f"config.json field '{field}' has {len(value)} element"
                                  f"{'s' if len(value) != 1 else ''}, but hf_config reads it as a list of "
                                  f"{len(params)} ({readers})", hint, field=field)


def _mapped_values(decl: ast.Decl, model: ModelOp, hf: dict[str, Any], rules: dict[str, FieldRule]) -> dict[str, Any]:
    sizes, counts = size_symbols(model), layer_counts(model)
    values: dict[str, Any] = {}
    for param in decl.params or []:
        if param.name is None or param.rest:
            continue
        rule = rules.get(param.name)
        given = rule is not None and rule.field in hf
        raw = hf[rule.field] if given else None
        nested = _nested(hf, rule.field) if rule is not None and rule.index is None else None
        if nested is not None:  # transformers 5 keeps it in rope_parameters, and reads it there first
            given, raw = True, nested
        if given and rule.index is not None and raw is not None:
            raw = raw[rule.index]  # a list of the mapped length (check_lists)
        if given and raw is not None:
            values[param.name] = _typed(param, rule, raw, sizes)
        elif given and rule.index is not None and hf[rule.field] is not None:
            raise CheckpointError("E030", f"config.json sets '{rule.shown}' to null; an element of a list has no "
                                  f"null meaning for '{param.name}'", f"give '{rule.shown}' a value (null= of the "
                                  f"mapping is what a null '{rule.field}' list means)", field=rule.field)
        elif given:
            if rule.null is None:
                raise CheckpointError("E030", f"config.json sets '{rule.field}' to null, and the model's hf_config "
                                      f"does not say what null means for '{param.name}'",
                                      f"give '{rule.field}' a value, or map it as `{param.name}: field("
                                      f"{rule.field}{'' if rule.index is None else f', index={rule.index}'}, "
                                      "null=VALUE)` (VALUE: a literal, `default`, or an expression of earlier "
                                      "parameters) where transformers gives null that meaning", field=rule.field)
            value = _given(param, rule.null, values, f"null '{rule.field}'")
            if value is not None:
                values[param.name] = _typed(param, rule, value, sizes, derived=True)
        elif rule is not None and rule.absent is not None:
            value = _given(param, rule.absent, values, f"absent '{rule.field}'")
            if value is not None:
                values[param.name] = _typed(param, rule, value, sizes, derived=True)
        elif param.default is not None:
            value = _evaluate(param.default, values)
            least = 0 if param.name in counts else 1  # a stack may have no layers
            if isinstance(value, int) and not isinstance(value, bool) and param.name in sizes and value < least:
                raise CheckpointError("E030", f"'{param.name}' takes its default {source_text(param.default)} = "
                                      f"{value}, but it sizes the model's tensors and must be at least {least}",
                                      f"give '{rule.field if rule else param.name}' in config.json")
            if value is not None:
                values[param.name] = value
        else:
            missing = rule.field if rule is not None else param.name
            raise CheckpointError("E030", f"config.json has no field '{missing}' for the model parameter "
                                  f"'{param.name}', which has no default",
                                  f"add '{missing}' to config.json, or give {param.name} a default in the model")
    return values


def _nested(hf: dict[str, Any], field: str) -> Any:
    """The value of ``field`` inside the object transformers 5 keeps it in (``rope_parameters.
    partial_rotary_factor``), None where it is not there."""
    for parent, names in NESTED.items():
        inner = hf.get(parent)
        if field in names and isinstance(inner, dict) and inner.get(field) is not None:
            return inner[field]
    return None


def _given(param: ast.Param, node: ast.Expr, values: dict[str, Any], what: str) -> Any:
    """The value of a ``null=`` / ``absent=`` expression (``default``: the DSL default)."""
    if isinstance(node, ast.Name) and node.id == "default":
        if param.default is None:
            raise DiagnosticError([Diagnostic("E010", f"'{param.name}' has no default for the {what} to take",
                                              node.span, "give the parameter a default, or a value here")])
        return _evaluate(param.default, values)
    try:
        return evaluate(node, ConstEnv(dict(values)), "hf_config value")
    except (ConstError, NotConstant) as err:
        message = getattr(err, "message", str(err))
        raise DiagnosticError([Diagnostic("E010", f"the value for a {what} of '{param.name}': {message}",
                                          node.span, "use a literal, `default`, or an expression of the "
                                          "parameters before this one")]) from None


def _evaluate(node: ast.Expr, values: dict[str, Any]) -> Any:
    try:
        return evaluate(node, ConstEnv(dict(values)))
    except (ConstError, NotConstant, ZeroDivisionError):
        return None


def _typed(param: ast.Param, rule: FieldRule, value: Any, sizes: set[str], derived: bool = False) -> Any:
    kind = param.type.id if isinstance(param.type, ast.Name) else None
    field, shown = rule.field, rule.shown
    ok = {
        "int": isinstance(value, int) and not isinstance(value, bool),
        "float": isinstance(value, (int, float)) and not isinstance(value, bool),
        "bool": isinstance(value, bool),
    }.get(kind, True)
    source = f"the value hf_config gives for '{shown}'" if derived else f"config.json field '{shown}'"
    if not ok:
        raise CheckpointError("E030", f"{source} is {_short(value)}, but '{param.name}' is {kind}",
                              f"'{shown}' must be a JSON {'boolean' if kind == 'bool' else kind}"
                              f"{'' if kind != 'float' else ' or integer'}", field=field)
    if kind == "int" and not INT64[0] <= value <= INT64[1]:
        raise CheckpointError("E030", f"{source} is {value}, which does not fit in a 64-bit integer "
                              f"('{param.name}')", f"fix '{shown}' in config.json", field=field)
    if kind == "int" and param.name in sizes and value < 1:
        raise CheckpointError("E030", f"{source} is {value}, but '{param.name}' sizes the model's tensors and "
                              "must be at least 1", f"fix '{shown}' in config.json", field=field)
    return float(value) if kind == "float" else value


SPECIAL_TOKEN_IDS = ("bos_token_id", "eos_token_id", "pad_token_id")


def export_config(model: ModelOp) -> dict[str, Any]:
    """A ``config.json`` for a model that was not imported: its config values under
    their HF field names (null where a literal ``null=`` gives the value), a list field
    mapped with ``index=`` written whole from the parameters of its elements, with the
    architecture and model type of ``hf_config``. The special token ids it does not map are
    null: the config classes' defaults name tokens of their tokenizers (Phi-3's pad and eos
    32000), which a model of another vocabulary does not have, and transformers refuses a
    pad id outside the vocabulary."""
    config: dict[str, Any] = {}
    values = model.config_values
    nulls = _literal_nulls(model)
    rules = model_rules(model)
    lists = list_fields(rules)
    exported: dict[str, Any] = {}
    for name in rules:
        attr = values.get(name)
        if attr is not None and hasattr(attr, "value"):
            value = attr.value.data
            value = bool(value) if attr.type == IntegerType(1) else value
            null = name in nulls and nulls[name] == value and rules[name].index is None
            exported[name] = None if null else value
    for name, rule in rules.items():
        if rule.index is None and name in exported:
            config[rule.field] = exported[name]
    for field, params in lists.items():
        if all(name in exported for name in params):
            config[field] = [exported[name] for name in params]
    for field in SPECIAL_TOKEN_IDS:
        config.setdefault(field, None)
    # the declared model type (falcon_h1) goes before the one of the class name (FalconH1Config)
    architectures, model_types = declared_types(declarations(model))
    if architectures:
        config["architectures"] = architectures[:1]
    if model_types:
        config["model_type"] = model_types[0]
    return config


def _literal_nulls(model: ModelOp) -> dict[str, Any]:
    """Parameters whose ``null=`` is a number: the value that exports as null."""
    nulls = {}
    for name, value in _mapping_attrs(model).items():
        null = value.data.get("null") if isinstance(value, DictionaryAttr) else None
        if null is not None and not isinstance(null, StringAttr) and hasattr(null, "value"):
            nulls[name] = null.value.data
    return nulls
