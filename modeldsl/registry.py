"""The registry of the std library: its models (with the HuggingFace architectures each serves),
blocks, modules and primitives by name, and the model that serves a checkpoint.

Every declaration of the std library is an :class:`Entry`: its kind, name, file, line and
frontend, from the text DSL's ``.module`` files (``std/models``, ``std/blocks``, ``std/modules``,
``std/primitives``, and their subfolders such as ``std/modules/attention``) and the Python
DSL's files (``std/python/models``, ...); a declaration written in both is listed once by
name, and ``get_model(name, frontend="python")`` picks a
spelling. A
model's entry also carries what its ``hf_config`` declares it serves: ``architecture:`` (a
class name or a list of them) and the model types of ``config_class:`` (``LlamaConfig`` is
``llama``) or ``model_type:``. :func:`model_for_checkpoint` picks the model for a checkpoint's
``config.json`` the way transformers' ``AutoModel`` does: by ``architectures``, else by
``model_type``; ``modeldsl.load(hf=DIR)`` and ``mdsl-run --hf DIR`` use it when no model file
is given. A checkpoint nobody serves is E036, listing the architectures that are served.
Each folder is parsed once per process, when first asked for.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from modeldsl.diagnostics import Diagnostic, DiagnosticError, Span
from modeldsl.frontend.python import parse_python_file
from modeldsl.frontend.text import ast
from modeldsl.frontend.text.parser import parse_file
from modeldsl.resolve.imports import STD_ROOT

FOLDERS = {"model": "models", "block": "blocks", "module": "modules", "primitive": "primitives"}


def plain_model_type(model_type: str) -> str:
    """A model type without its underscores: ``qwen3_moe`` is ``Qwen3MoeConfig``'s ``qwen3moe``."""
    return model_type.replace("_", "")


@dataclass(frozen=True)
class Entry:
    """One declaration of the std library."""

    kind: str  # model | block | module | primitive
    name: str
    path: Path
    line: int
    frontend: str = "text"  # text | python
    abstract: bool = False
    doc: str | None = None
    architectures: tuple[str, ...] = ()  # models: the HF classes they serve
    model_types: tuple[str, ...] = ()  # models: the HF model types they serve

    def serves(self, architectures: list[str], model_type: str | None) -> bool:
        """Whether this model serves a checkpoint of these ``architectures`` (they decide when both
        sides name classes) or of this ``model_type``."""
        if architectures and self.architectures:
            return bool(set(architectures) & set(self.architectures))
        served = {plain_model_type(t) for t in self.model_types}
        return model_type is not None and plain_model_type(model_type) in served


@cache
def _entries(kind: str) -> tuple[Entry, ...]:
    """The text DSL's declarations of ``kind``, then the Python DSL's (``std/python/...``)."""
    found = []
    for path in sorted((STD_ROOT / FOLDERS[kind]).rglob("*.module")):
        found += [_entry(decl, path, "text") for decl in parse_file(path).declarations if decl.kind == kind]
    for path in sorted((STD_ROOT / "python" / FOLDERS[kind]).rglob("*.py")):
        found += [_entry(decl, path, "python") for decl in parse_python_file(path).declarations if decl.kind == kind]
    return tuple(found)


def _entry(decl: ast.Decl, path: Path, frontend: str) -> Entry:
    served: dict[str, Any] = {}
    for section in decl.sections("hf_config")[:1]:
        served = {s.name: s.value.expr for s in section.body if isinstance(s, ast.Section) and s.value is not None}
    types = _strings(served.get("model_type")) or \
        [n.removesuffix("Config").lower() for n in _strings(served.get("config_class"))]
    return Entry(decl.kind, decl.name, path, decl.span.line if decl.span is not None else 1, frontend, decl.abstract,
                 decl.doc, tuple(_strings(served.get("architecture"))), tuple(types))


def _strings(node: Any) -> list[str]:
    if isinstance(node, ast.Str):
        return [node.value]
    if isinstance(node, ast.ListExpr):
        return [item.value for item in node.items if isinstance(item, ast.Str)]
    return []


def entries(kind: str) -> list[Entry]:
    """Every std declaration of ``kind`` (model, block, module, primitive), in file order."""
    if kind not in FOLDERS:
        raise ValueError(f"kind '{kind}' is not one of {', '.join(FOLDERS)}")
    return list(_entries(kind))


def _names(kind: str) -> list[str]:
    """The names of ``kind``, each once (a declaration in both spellings is one name)."""
    return list(dict.fromkeys(e.name for e in _entries(kind) if not e.abstract))


def list_models() -> list[str]:
    return _names("model")


def list_blocks() -> list[str]:
    return _names("block")


def list_modules() -> list[str]:
    return _names("module")


def list_primitives() -> list[str]:
    return _names("primitive")


def get(kind: str, name: str, frontend: str = "text") -> Entry:
    """The std declaration ``name`` of ``kind`` in ``frontend``'s spelling (``text`` or ``python``;
    where it has no such spelling, the other); KeyError naming the ones there are."""
    matches = [e for e in entries(kind) if e.name == name]
    if not matches:
        raise KeyError(f"no std {kind} is named '{name}' (there are: {', '.join(_names(kind))})")
    return next((e for e in matches if e.frontend == frontend), matches[0])


def get_model(name: str, frontend: str = "text") -> Entry:
    return get("model", name, frontend)


def get_block(name: str, frontend: str = "text") -> Entry:
    return get("block", name, frontend)


def get_module(name: str, frontend: str = "text") -> Entry:
    return get("module", name, frontend)


def get_primitive(name: str) -> Entry:
    return get("primitive", name)


def get_any(name: str, frontend: str = "text") -> Entry:
    """The std declaration ``name`` of any kind (models first, then blocks, modules, primitives)."""
    for kind in FOLDERS:
        if any(e.name == name for e in _entries(kind)):
            return get(kind, name, frontend)
    raise KeyError(f"no std declaration is named '{name}'")


def architectures() -> dict[str, str]:
    """Each HuggingFace architecture a std model serves -> that model's name."""
    return {arch: e.name for e in _entries("model") if not e.abstract for arch in e.architectures}


def model_serving(architectures_: list[str], model_type: str | None, frontend: str = "text") -> Entry | None:
    """The std model that serves a checkpoint of these architectures or this model type (the first in
    file order; in ``frontend``'s spelling where it has one), or None."""
    entry = next((e for e in _entries("model") if not e.abstract and e.serves(architectures_, model_type)), None)
    return None if entry is None else get("model", entry.name, frontend)


def model_for_checkpoint(config: Any, where: str = "config.json") -> Entry:
    """The std model for a checkpoint's ``config.json`` (a mapping; its spans are used when it has
    them): E036 listing the served architectures when none serves it."""
    given = config.get("architectures")
    given = [a for a in given if isinstance(a, str)] if isinstance(given, list) else []
    model_type = config.get("model_type") if isinstance(config.get("model_type"), str) else None
    entry = model_serving(given, model_type)
    if entry is not None:
        return entry
    field = "architectures" if given else "model_type"
    what = ", ".join(given) if given else (f"model_type '{model_type}'" if model_type else "of no named architecture")
    served = ", ".join(f"{arch} ({name})" for arch, name in architectures().items())
    span: Span | None = config.span(field) if hasattr(config, "span") else None
    raise DiagnosticError([Diagnostic(
        "E036", f"{'' if span else where + ': '}no std model serves the checkpoint, which is {what}", span,
        f"the std models serve {served}; pass a model file for this family (mdsl-run MODEL.module --hf DIR, "
        "modeldsl.load(MODEL_FILE, hf=DIR))")])
