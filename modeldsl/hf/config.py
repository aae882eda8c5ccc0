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

Configs written by transformers 5 keep ``rope_theta`` and the scaling under
``rope_parameters``; :func:`normalize` lifts them to the older top-level
``rope_theta`` / ``rope_scaling`` so one mapping reads both. A config.json
that is not valid JSON is a located E030 (file, line and column of the JSON
error, with a caret).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xdsl.dialects.builtin import DictionaryAttr, IntegerType, StringAttr

from modeldsl.diagnostics import Diagnostic, DiagnosticError, Source, Span
from modeldsl.dialects.graph import ModelOp
from modeldsl.dialects.graph_types import TensorType
from modeldsl.frontend.text import ast
from modeldsl.hf.safetensors_io import CheckpointError
from modeldsl.instances import source_text
from modeldsl.resolve.consts import ConstEnv, ConstError, NotConstant, evaluate
from modeldsl.symbolic import Expr


def read_config(directory: str | Path) -> dict[str, Any]:
    """The normalized ``config.json`` of a checkpoint directory (E030 when absent or invalid;
    invalid JSON is a :class:`DiagnosticError` located at the JSON error)."""
    path = Path(directory)
    if not path.is_dir():
        raise CheckpointError("E028", f"checkpoint directory '{path}' does not exist",
                              "pass the folder that holds config.json and *.safetensors")
    config_file = path / "config.json"
    if not config_file.is_file():
        raise CheckpointError("E030", f"'{path}' has no config.json", "a HuggingFace checkpoint folder holds "
                              "config.json beside its *.safetensors files")
    try:
        text = config_file.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise CheckpointError("E030", f"{config_file} is not UTF-8 text (byte {err.start})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        span = Span(Source(str(config_file), text), err.lineno, err.colno, err.lineno, err.colno + 1)
        raise DiagnosticError([Diagnostic("E030", f"config.json is not valid JSON: {err.msg}", span,
                                          "fix the JSON (a missing comma or quote, a trailing comma, a "
                                          "truncated file), or download the checkpoint's config.json again")
                               ]) from None
    if not isinstance(data, dict):
        raise CheckpointError("E030", f"{config_file} does not hold a JSON object")
    return normalize(data)


def normalize(config: dict[str, Any]) -> dict[str, Any]:
    config = dict(config)
    rope = config.get("rope_parameters")
    if isinstance(rope, dict):
        if rope.get("rope_theta") is not None:
            config.setdefault("rope_theta", rope["rope_theta"])
        if rope.get("rope_type", "default") != "default":
            config.setdefault("rope_scaling", rope)
    return config


def _field_name(value: Any) -> str | None:
    """The config field of a lowered ``param_mapping`` value (a name, or ``field(name, ...)``)."""
    if isinstance(value, StringAttr):
        return value.data
    if isinstance(value, DictionaryAttr) and "args" in value.data:
        first = value.data["args"].data[0] if value.data["args"].data else None
        return first.data if isinstance(first, StringAttr) else None
    return None


def param_mapping(model: ModelOp) -> dict[str, str]:
    """DSL parameter -> config field, from the model's ``hf_config``."""
    if model.hf_config is None or "param_mapping" not in model.hf_config.data:
        return {}
    mapping = model.hf_config.data["param_mapping"]
    if not isinstance(mapping, DictionaryAttr):
        return {}
    names = {k: _field_name(v) for k, v in mapping.data.items()}
    return {k: v for k, v in names.items() if v is not None}


@dataclass
class FieldRule:
    """One ``param_mapping`` entry as written: the field and what null / absence mean."""

    field: str
    null: ast.Expr | None = None
    absent: ast.Expr | None = None


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
        return FieldRule(node.id if isinstance(node, ast.Name) else node.value)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "field":
        positional = [a.value for a in node.args if a.name is None]
        named = {a.name: a for a in node.args if a.name is not None}
        unknown = [a for name, a in named.items() if name not in ("null", "absent")]
        if len(positional) == 1 and isinstance(positional[0], (ast.Name, ast.Str)) and not unknown:
            name = positional[0]
            return FieldRule(name.id if isinstance(name, ast.Name) else name.value,
                             named["null"].value if "null" in named else None,
                             named["absent"].value if "absent" in named else None)
        where = unknown[0].span if unknown else node.span
        raise DiagnosticError([Diagnostic("E010", f"hf_config maps '{param}' with a malformed field(...)", where,
                                          "write field(config_name, null=VALUE, absent=VALUE); VALUE is a "
                                          "literal, `default` or an expression of earlier parameters")])
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


def dsl_config(decl: ast.Decl, model: ModelOp, hf: dict[str, Any]) -> dict[str, Any]:
    """Values for the DSL model's parameters from a checkpoint's config (see the module
    docstring for absent and null fields), each evaluated against the values before it."""
    rules = {name: FieldRule(field) for name, field in param_mapping(model).items()} | field_rules(decl)
    sizes = size_symbols(model)
    values: dict[str, Any] = {}
    for param in decl.params or []:
        if param.name is None or param.rest:
            continue
        rule = rules.get(param.name)
        if rule is not None and rule.field in hf and hf[rule.field] is not None:
            values[param.name] = _typed(param, rule.field, hf[rule.field], sizes)
        elif rule is not None and rule.field in hf:
            if rule.null is None:
                raise CheckpointError("E030", f"config.json sets '{rule.field}' to null, and the model's hf_config "
                                      f"does not say what null means for '{param.name}'",
                                      f"give '{rule.field}' a value, or map it as `{param.name}: field({rule.field}, "
                                      "null=VALUE)` (VALUE: a literal, `default`, or an expression of earlier "
                                      "parameters) where transformers gives null that meaning")
            value = _given(param, rule.null, values, f"null '{rule.field}'")
            if value is not None:
                values[param.name] = _typed(param, rule.field, value, sizes, derived=True)
        elif rule is not None and rule.absent is not None:
            value = _given(param, rule.absent, values, f"absent '{rule.field}'")
            if value is not None:
                values[param.name] = _typed(param, rule.field, value, sizes, derived=True)
        elif param.default is not None:
            value = _evaluate(param.default, values)
            if isinstance(value, int) and not isinstance(value, bool) and param.name in sizes and value < 1:
                raise CheckpointError("E030", f"'{param.name}' takes its default {source_text(param.default)} = "
                                      f"{value}, but it sizes the model's tensors and must be at least 1",
                                      f"give '{rule.field if rule else param.name}' in config.json")
            if value is not None:
                values[param.name] = value
        else:
            missing = rule.field if rule is not None else param.name
            raise CheckpointError("E030", f"config.json has no field '{missing}' for the model parameter "
                                  f"'{param.name}', which has no default",
                                  f"add '{missing}' to config.json, or give {param.name} a default in the model")
    return values


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


def _typed(param: ast.Param, field: str, value: Any, sizes: set[str], derived: bool = False) -> Any:
    kind = param.type.id if isinstance(param.type, ast.Name) else None
    ok = {
        "int": isinstance(value, int) and not isinstance(value, bool),
        "float": isinstance(value, (int, float)) and not isinstance(value, bool),
        "bool": isinstance(value, bool),
    }.get(kind, True)
    source = f"the value hf_config gives for '{field}'" if derived else f"config.json field '{field}'"
    if not ok:
        raise CheckpointError("E030", f"{source} is {value!r}, but '{param.name}' is {kind}",
                              f"'{field}' must be a JSON {'boolean' if kind == 'bool' else kind}"
                              f"{'' if kind != 'float' else ' or integer'}")
    if kind == "int" and param.name in sizes and value < 1:
        raise CheckpointError("E030", f"{source} is {value}, but '{param.name}' sizes the model's tensors and "
                              "must be at least 1", f"fix '{field}' in config.json")
    return float(value) if kind == "float" else value


def export_config(model: ModelOp) -> dict[str, Any]:
    """A ``config.json`` for a model that was not imported: its config values under
    their HF field names (null where a literal ``null=`` gives the value), with the
    architecture and model type of ``hf_config``."""
    config: dict[str, Any] = {}
    values = model.config_values
    nulls = _literal_nulls(model)
    for name, hf_field in param_mapping(model).items():
        attr = values.get(name)
        if attr is not None and hasattr(attr, "value"):
            value = attr.value.data
            value = bool(value) if attr.type == IntegerType(1) else value
            config[hf_field] = None if name in nulls and nulls[name] == value else value
    section = model.hf_config.data if model.hf_config is not None else {}
    if "architecture" in section:
        config["architectures"] = [section["architecture"].data]
    if "config_class" in section:
        config["model_type"] = section["config_class"].data.removesuffix("Config").lower()
    return config


def _literal_nulls(model: ModelOp) -> dict[str, Any]:
    """Parameters whose ``null=`` is a number: the value that exports as null."""
    if model.hf_config is None or not isinstance(model.hf_config.data.get("param_mapping"), DictionaryAttr):
        return {}
    nulls = {}
    for name, value in model.hf_config.data["param_mapping"].data.items():
        null = value.data.get("null") if isinstance(value, DictionaryAttr) else None
        if null is not None and not isinstance(null, StringAttr) and hasattr(null, "value"):
            nulls[name] = null.value.data
    return nulls
