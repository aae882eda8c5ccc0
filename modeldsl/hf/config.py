"""HuggingFace ``config.json`` to the DSL model's configuration, through ``hf_config``.

``hf_config.param_mapping`` maps each DSL model parameter to a config field
(``d_model: hidden_size``). A field the file lacks (or sets to null) leaves
the DSL default; a parameter with neither is E030 naming the field. Configs
written by transformers 5 keep ``rope_theta`` and the scaling under
``rope_parameters``; :func:`normalize` lifts them to the older top-level
``rope_theta`` / ``rope_scaling`` so one mapping reads both.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from xdsl.dialects.builtin import IntegerType

from modeldsl.dialects.graph import ModelOp
from modeldsl.frontend.text import ast
from modeldsl.hf.safetensors_io import CheckpointError
from modeldsl.resolve.consts import ConstEnv, ConstError, NotConstant, evaluate


def read_config(directory: str | Path) -> dict[str, Any]:
    """The normalized ``config.json`` of a checkpoint directory (E030 when absent or invalid)."""
    path = Path(directory)
    if not path.is_dir():
        raise CheckpointError("E028", f"checkpoint directory '{path}' does not exist",
                              "pass the folder that holds config.json and *.safetensors")
    config_file = path / "config.json"
    if not config_file.is_file():
        raise CheckpointError("E030", f"'{path}' has no config.json", "a HuggingFace checkpoint folder holds "
                              "config.json beside its *.safetensors files")
    try:
        data = json.loads(config_file.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError("E030", f"{config_file} is not valid JSON: {err}") from None
    if not isinstance(data, dict):
        raise CheckpointError("E030", f"{config_file} does not hold a JSON object")
    return normalize(data)


def normalize(config: dict[str, Any]) -> dict[str, Any]:
    config = dict(config)
    rope = config.get("rope_parameters")
    if isinstance(rope, dict):
        config.setdefault("rope_theta", rope.get("rope_theta"))
        if rope.get("rope_type", "default") != "default":
            config.setdefault("rope_scaling", rope)
    return config


def param_mapping(model: ModelOp) -> dict[str, str]:
    """DSL parameter -> config field, from the model's ``hf_config``."""
    if model.hf_config is None or "param_mapping" not in model.hf_config.data:
        return {}
    mapping = model.hf_config.data["param_mapping"]
    return {k: v.data for k, v in mapping.data.items() if hasattr(v, "data") and isinstance(v.data, str)}


def dsl_config(decl: ast.Decl, model: ModelOp, hf: dict[str, Any]) -> dict[str, Any]:
    """Values for the DSL model's parameters: mapped fields, else DSL defaults
    evaluated against the values before them."""
    mapping = param_mapping(model)
    values: dict[str, Any] = {}
    for param in decl.params or []:
        if param.name is None or param.rest:
            continue
        field = mapping.get(param.name)
        if field is not None and hf.get(field) is not None:
            values[param.name] = _typed(param, field, hf[field])
        elif param.default is not None:
            try:
                values[param.name] = evaluate(param.default, ConstEnv(dict(values)))
            except (ConstError, NotConstant):
                continue
        else:
            missing = field or param.name
            raise CheckpointError("E030", f"config.json has no field '{missing}' for the model parameter "
                                  f"'{param.name}', which has no default",
                                  f"add '{missing}' to config.json, or give {param.name} a default in the model")
    return values


def _typed(param: ast.Param, field: str, value: Any) -> Any:
    kind = param.type.id if isinstance(param.type, ast.Name) else None
    ok = {
        "int": isinstance(value, int) and not isinstance(value, bool),
        "float": isinstance(value, (int, float)) and not isinstance(value, bool),
        "bool": isinstance(value, bool),
    }.get(kind, True)
    if not ok:
        raise CheckpointError("E030", f"config.json field '{field}' is {value!r}, but '{param.name}' is {kind}")
    return float(value) if kind == "float" else value


def export_config(model: ModelOp) -> dict[str, Any]:
    """A ``config.json`` for a model that was not imported: its config values under
    their HF field names, with the architecture and model type of ``hf_config``."""
    config: dict[str, Any] = {}
    values = model.config_values
    for name, hf_field in param_mapping(model).items():
        attr = values.get(name)
        if attr is not None and hasattr(attr, "value"):
            value = attr.value.data
            config[hf_field] = bool(value) if attr.type == IntegerType(1) else value
    section = model.hf_config.data if model.hf_config is not None else {}
    if "architecture" in section:
        config["architectures"] = [section["architecture"].data]
    if "config_class" in section:
        config["model_type"] = section["config_class"].data.removesuffix("Config").lower()
    return config
