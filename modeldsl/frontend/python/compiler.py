"""The Python DSL's compiler API (its sections 11.3, 11.4 and 12.1): ``compile_model``,
``compile_model_for_hf``, the ``get_*_spec`` look-ups and the ``list_registered_*`` lists.

- ``compile_model(model, config=None, raise_on_error=False)``: ``model`` is a registered name (a
  class of any Python DSL file that was imported, or a std model), a ``.py`` / ``.module`` file or a
  decorated class; ``config`` a dict or JSON text, either the model's parameters by name or a
  HuggingFace ``config.json`` (it has ``architectures`` or ``model_type``; the model's
  ``hf_config`` maps it). The result is the model's JSON IR (``format``, ``version``, ``module``:
  docs/json-ir.md) with ``success: true``, ``model``, ``errors: []`` and ``warnings: [...]``; a
  problem gives ``success: false`` and ``errors: [{code, message, hint, location}]``, or raises a
  :class:`DSLError` with ``raise_on_error=True``.
- ``compile_model_for_hf(architecture, config)``: the same for the model that serves a HuggingFace
  architecture (``"LlamaForCausalLM"``), a registered Python DSL model before the std ones.
- ``get_model_spec(name)`` (``get_block_spec``, ``get_module_spec``): a :class:`DeclarationSpec`
  of a registered or std declaration; ``list_registered_models()`` (``_blocks``, ``_modules``):
  their names, the std library's then the imported files' own.

Nothing here is imported until called (the lowering, the registry), so a Python DSL file that
imports ``modeldsl.dsl`` stays cheap to import.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from modeldsl.diagnostics import Diagnostic, DiagnosticError, DiagnosticSink

KINDS = ("model", "block", "module")


class DSLError(DiagnosticError):
    """The diagnostics of a compilation that failed (``compile_model(..., raise_on_error=True)``), or
    of a look-up of a name nothing declares."""


@dataclass(frozen=True)
class ParameterSpec:
    """One parameter of a declaration's signature: its name, its type and default as written."""

    name: str
    type: str | None
    default: str | None


@dataclass(frozen=True)
class DeclarationSpec:
    """What a model, block or module declares: its signature, its parameters (weights and
    submodules), its file and line, the HuggingFace architectures a model serves."""

    kind: str
    name: str
    path: Path
    line: int
    frontend: str
    doc: str | None
    abstract: bool
    parameters: tuple[ParameterSpec, ...] = ()
    params: tuple[str, ...] = ()
    architectures: tuple[str, ...] = ()
    declaration: Any = field(default=None, compare=False, repr=False)


# ------------------------------------------------------------------ compiling
def compile_model(model: Any, config: dict[str, Any] | str | None = None, raise_on_error: bool = False,
                  top: str | None = None) -> dict[str, Any]:
    """The JSON IR of ``model`` with ``config`` and the diagnostics (see the module docstring)."""
    sink = DiagnosticSink()
    try:
        program, name = _program(model, top)
        document = _compiled(program, name, _config(config, program, name, sink), sink)
    except DiagnosticError as err:
        return _failed(err.diagnostics + [d for d in sink.diagnostics if d not in err.diagnostics], raise_on_error)
    return {"success": True, "model": name, **document, "errors": [],
            "warnings": [_warning(d) for d in sink.diagnostics if d.severity == "warning"]}


def compile_model_for_hf(architecture: str, config: dict[str, Any] | str | None = None,
                         raise_on_error: bool = False) -> dict[str, Any]:
    """``compile_model`` of the model serving the HuggingFace ``architecture`` (E002 when none does)."""
    try:
        model = _serving(architecture)
    except DiagnosticError as err:
        return _failed(err.diagnostics, raise_on_error)
    return compile_model(model, config, raise_on_error)


def _compiled(program: Any, name: str, config: dict[str, Any] | None, sink: DiagnosticSink) -> dict[str, Any]:
    from modeldsl.json_ir import to_json
    from modeldsl.lower import lower_program

    return to_json(lower_program(program, name, config, sink))


def _failed(diagnostics: list[Diagnostic], raise_on_error: bool) -> dict[str, Any]:
    if raise_on_error:
        raise DSLError(diagnostics)
    return {"success": False, "errors": [_error(d) for d in diagnostics if d.severity == "error"],
            "warnings": [_warning(d) for d in diagnostics if d.severity == "warning"]}


def _error(diagnostic: Diagnostic) -> dict[str, Any]:
    entry = diagnostic.to_json()
    return {key: entry[key] for key in ("code", "message", "hint", "location")}


def _warning(diagnostic: Diagnostic) -> dict[str, Any]:
    entry = diagnostic.to_json()
    return {key: entry[key] for key in ("code", "message", "hint", "location")}


def _program(model: Any, top: str | None) -> tuple[Any, str]:
    """The parsed file of ``model`` and the declaration to lower."""
    from modeldsl.frontend.read import read_model

    if isinstance(model, type):
        _check_model_class(model)
    elif isinstance(model, str) and not model.endswith((".py", ".module")):
        spec = _lookup("model", model)
        model, top = spec.path, top or spec.name
    elif not isinstance(model, (str, Path)):
        raise DSLError([Diagnostic("E008", f"compile_model takes a model, not {type(model).__name__}", None,
                                   "pass a @model class, its registered name or a .py / .module file")])
    program, top = read_model(model, top)
    if top is None:
        top = next((d.name for d in program.declarations if d.kind == "model" and not d.abstract), None)
    if top is None:
        raise DSLError([Diagnostic("E012", f"{model} declares no model", None,
                                   "decorate the top-level class @model, or name it: compile_model(file, top=...)")])
    return program, top


def _check_model_class(cls: type) -> None:
    from modeldsl.frontend.python.classes import KIND

    if getattr(cls, KIND, None) != "model":
        kind = getattr(cls, KIND, None)
        what = f"a @{kind}" if kind else "no DSL class"
        raise DSLError([Diagnostic("E008", f"class {cls.__name__} is {what}, not a DSL @model", None,
                                   "compile_model lowers a model: decorate the top-level class @model")])


def _config(config: dict[str, Any] | str | None, program: Any, name: str,
            sink: DiagnosticSink) -> dict[str, Any] | None:
    """The model's parameter values: ``config`` itself, or mapped from a HuggingFace config.json."""
    if isinstance(config, str):
        try:
            config = json.loads(config)
        except ValueError as err:
            raise DSLError([Diagnostic("E030", f"the config is not JSON ({err})", None,
                                       "pass a dict or the text of a config.json")]) from None
    if config is None:
        return None
    if not isinstance(config, dict):
        raise DSLError([Diagnostic("E030", f"the config is a {type(config).__name__}, not a JSON object", None,
                                   "pass the model's parameters by name, or a HuggingFace config.json")])
    if "architectures" not in config and "model_type" not in config:
        return config
    return _hf_values(program, name, config, sink)


def _hf_values(program: Any, name: str, config: dict[str, Any], sink: DiagnosticSink) -> dict[str, Any]:
    from modeldsl.hf.safetensors_io import CheckpointError
    from modeldsl.runtime.model import hf_config_values

    decl = next(d for d in program.declarations if d.name == name)
    try:
        return hf_config_values(program, decl, config, sink)
    except CheckpointError as err:
        raise DSLError([Diagnostic(err.code, err.message, err.span, err.hint)]) from None


def _serving(architecture: str) -> Any:
    """The registered Python DSL model, else the std model, that serves ``architecture``."""
    from modeldsl import registry

    for spec in _user_specs("model"):
        if architecture in spec.architectures:
            return spec.path if spec.path is not None else spec.name
    entry = registry.model_serving([architecture], None, "python")
    if entry is not None:
        return entry.path
    served = sorted({*registry.architectures(), *(a for s in _user_specs("model") for a in s.architectures)})
    close = difflib.get_close_matches(architecture, served, n=1)
    hint = f"did you mean '{close[0]}'? " if close else ""
    raise DSLError([Diagnostic("E002", f"no DSL model serves the HuggingFace architecture '{architecture}'", None,
                               f"{hint}the served architectures are {', '.join(served)}")])


# ------------------------------------------------------------------ specs and lists
def get_model_spec(name: str) -> DeclarationSpec:
    return _lookup("model", name)


def get_block_spec(name: str) -> DeclarationSpec:
    return _lookup("block", name)


def get_module_spec(name: str) -> DeclarationSpec:
    return _lookup("module", name)


def list_registered_models() -> list[str]:
    return _listed("model")


def list_registered_blocks() -> list[str]:
    return _listed("block")


def list_registered_modules() -> list[str]:
    return _listed("module")


def _listed(kind: str) -> list[str]:
    from modeldsl import registry

    std = {"model": registry.list_models, "block": registry.list_blocks, "module": registry.list_modules}[kind]()
    return list(dict.fromkeys([*std, *(s.name for s in _user_specs(kind) if not s.abstract)]))


def _lookup(kind: str, name: str) -> DeclarationSpec:
    """The registered (imported) declaration ``name`` of ``kind``, else the std one; E002 naming the
    closest otherwise."""
    from modeldsl import registry

    user = next((s for s in _user_specs(kind) if s.name == name), None)
    if user is not None:
        return user
    if any(e.name == name for e in registry.entries(kind)):
        entry = registry.get(kind, name, "python")
        return _spec(_declaration(entry.path, name), entry.path, entry.frontend)
    names = _listed(kind)
    close = difflib.get_close_matches(name, names, n=1)
    hint = f"did you mean '{close[0]}'? " if close else ""
    raise DSLError([Diagnostic("E002", f"no {kind} is named '{name}'", None,
                               f"{hint}the registered {kind}s are {', '.join(names)}")])


def _user_specs(kind: str) -> list[DeclarationSpec]:
    """The specs of the classes of ``kind`` that imported Python DSL files declare."""
    from modeldsl.frontend.python.classes import FILE, REGISTERED

    specs = []
    for name, cls in list(REGISTERED[kind].items()):
        path = getattr(cls, FILE, None)
        if path is None or not Path(path).is_file():
            continue
        specs.append(_spec(_declaration(Path(path), name), Path(path), "python"))
    return specs


_PARSED: dict[Path, tuple[float, Any]] = {}  # path -> (modification time, program)


def _declaration(path: Path, name: str) -> Any:
    """The declaration ``name`` of a file, parsed once while the file is unchanged."""
    from modeldsl.frontend.read import read_model

    stamp = path.stat().st_mtime
    if _PARSED.get(path, (None,))[0] != stamp:
        _PARSED[path] = (stamp, read_model(path)[0])
    return next(d for d in _PARSED[path][1].declarations if d.name == name)


def _spec(decl: Any, path: Path, frontend: str) -> DeclarationSpec:
    from modeldsl.frontend.text import ast

    parameters = tuple(ParameterSpec(p.name, p.type.span.text if p.type is not None else None,
                                     p.default.span.text if p.default is not None else None)
                       for p in decl.params or [])
    params = tuple(dict.fromkeys(s.name for section in decl.sections("params") for s in section.body
                                 if isinstance(s, ast.Section)))
    return DeclarationSpec(decl.kind, decl.name, path, decl.span.line if decl.span is not None else 1, frontend,
                           decl.doc, decl.abstract, parameters, params, tuple(_architectures(decl)), decl)


def _architectures(decl: Any) -> list[str]:
    """The HuggingFace architectures a model's ``hf_config`` names."""
    from modeldsl.frontend.text import ast

    for section in decl.sections("hf_config")[:1]:
        for entry in section.body:
            if isinstance(entry, ast.Section) and entry.name == "architecture" and entry.value is not None:
                value = entry.value.expr
                items = value.items if isinstance(value, ast.ListExpr) else [value]
                return [i.value for i in items if isinstance(i, ast.Str)]
    return []
