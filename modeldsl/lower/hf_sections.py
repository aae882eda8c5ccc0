"""The ``hf_config``, ``hf_mapping`` and ``hf_export`` sections of a model, as dictionaries
on its ``mdsl.graph.model`` op (read by :mod:`modeldsl.hf`).
"""

from __future__ import annotations

import difflib
import re

from xdsl.dialects.builtin import (
    ArrayAttr,
    DictionaryAttr,
    FloatAttr,
    IntegerAttr,
    StringAttr,
    f64,
    i64,
)
from xdsl.ir import Attribute

from modeldsl.diagnostics import DiagnosticSink
from modeldsl.frontend.text import ast
from modeldsl.instances import (
    LoweringFailed,
    source_text,
)
from modeldsl.lower.params import qualified
from modeldsl.resolve.inherit import merged


class HfSectionsMixin:
    """HuggingFace sections: each section's entries as nested dictionary attributes."""

    def lower_hf_sections(self, decl: ast.Decl) -> None:
        """``hf_config``, ``hf_mapping`` and ``hf_export`` as dictionaries on the model op."""
        for name in ("hf_config", "hf_mapping", "hf_export"):
            sections = decl.sections(name)
            if not sections:
                continue
            if len(sections) > 1:
                self.sink.error("E010", f"more than one {name}: section", sections[1].span)
            if name == "hf_mapping":
                self.check_mapping_keys(decl, sections[0])
            entries: dict[str, Attribute] = {}
            for stmt in sections[0].body:
                try:
                    key, value = self.hf_entry(stmt)
                except LoweringFailed:
                    continue
                if key in entries:
                    self.sink.error("E010", f"'{key}' is mapped twice in {name}", stmt.span)
                entries[key] = value
            self.model.attributes[name] = DictionaryAttr(entries)

    def check_mapping_keys(self, decl: ast.Decl, section: ast.Section) -> None:
        """E010 where an ``hf_mapping`` key names no parameter the model declares (guarded ones
        included), with the closest name: ``blokcs[{layer}].w`` (``@hf_mapping.indexed("blokcs", ...)``),
        ``blocks[{layer}].ww``; where a stack's index (``[{layer}]``) is on a parameter that is no
        stack; and where a tensor name's placeholder (``{layr}``) is none of the key's indices,
        ``{expert}`` or a configuration value of the model (the names it is filled from at load)."""
        config = {p.name for p in decl.params or [] if p.name} | _let_names(decl)
        for stmt in section.body:
            if not isinstance(stmt, ast.Section) or stmt.value is None:
                continue
            key = _hf_key(stmt.key).rstrip("?")
            problem = self.mapping_key_problem(decl, key)
            if problem is not None:
                message, hint = problem
                self.sink.error("E010", f"hf_mapping {key}: {message}", stmt.key.span, hint)
                continue
            names = set(re.findall(r"\{(\w+)\}", key))
            for text in _strings(stmt.value.expr):
                for placeholder in PLACEHOLDER.findall(text.value):
                    unknown = [w for w in re.findall(r"[A-Za-z_]\w*", placeholder)
                               if w not in names | config and w != "expert"]
                    if unknown:
                        known = sorted(names) + sorted(config)
                        close = difflib.get_close_matches(unknown[0], known, n=1) if names else []
                        what = (f"the index {{{', '.join(sorted(names))}}}" if names else
                                "no index: it names no stack element ([{layer}])")
                        self.sink.error("E010", f"hf_mapping {key}: the tensor name '{text.value}' has "
                                        f"'{{{placeholder}}}', but '{unknown[0]}' is no index of the key and no "
                                        "configuration value of the model", text.span,
                                        (f"did you mean '{close[0]}'? " if close else "") + f"the key has {what}")
                        break

    def mapping_key_problem(self, decl: ast.Decl, key: str) -> tuple[str, str] | None:
        """(message, hint) when the path of ``key`` leaves the model's declared parameters."""
        owner: ast.Decl | None = decl
        declared: dict[str, ast.Expr] | None = _declared_params(decl)
        walked: list[str] = []
        for part in _key_parts(key):
            if part is None:
                return None  # written in a way this check does not read (a literal index)
            name, index = part
            if declared is None:
                return (f"'{'.'.join(walked)}' is a tensor, which has no parameter '{name}'",
                        "map the tensor by its own path")
            matches = [n for n in declared if _fits(name, n)]
            if not matches:
                close = difflib.get_close_matches(name, list(declared), n=1)
                where = f"'{'.'.join(walked)}'" if walked else f"model {decl.name}"
                return (f"{where} has no parameter '{name}'", (f"did you mean '{close[0]}'? " if close else "")
                        + f"its parameters: {', '.join(declared) or 'none'}")
            value = declared[matches[0]]
            if isinstance(value, ast.Optional_):
                value = value.base
            if index is not None and not isinstance(value, ast.ArrayType):
                return (f"'{'.'.join([*walked, name])}' is no stack, so [{{{index}}}] indexes nothing",
                        "index a stack's elements: blocks[{layer}].name, where blocks: [n] x Block(...)")
            walked.append(name)
            owner = self.module_of(owner, value)
            if owner is _UNREAD:
                return None  # a module this check cannot read (reported where it is declared)
            declared = _declared_params(owner) if owner is not None else None
        return None

    def module_of(self, owner: ast.Decl, value: ast.Expr):
        """The (inheritance-merged) declaration of a module instance or a stack's element; None for a
        tensor (or a tied one); ``_UNREAD`` for what names no module of ``owner``'s file."""
        if isinstance(value, ast.ArrayType):
            value = value.element
        if isinstance(value, ast.ListExpr) or (isinstance(value, ast.Call) and isinstance(value.func, ast.Name)
                                               and value.func.id == "tied_to"):
            return None
        namespace = self.namespace_of(owner)
        func = qualified(value.func if isinstance(value, ast.Call) else value, namespace)
        module = namespace.get(func.id) if isinstance(func, ast.Name) else None
        if module is None or module.kind == "primitive":
            return _UNREAD
        concrete = merged(module, self.namespace_of(module), DiagnosticSink())
        return concrete if concrete is not None else _UNREAD

    def hf_entry(self, stmt: ast.Stmt) -> tuple[str, Attribute]:
        if isinstance(stmt, ast.Section) and stmt.body and stmt.value is None:
            nested = dict(self.hf_entry(inner) for inner in stmt.body)
            return _hf_key(stmt.key), DictionaryAttr(nested)
        if isinstance(stmt, ast.Section) and stmt.value is not None:
            return _hf_key(stmt.key), self.hf_value(stmt.value.expr)
        if isinstance(stmt, ast.Flow) and len(stmt.chain) == 2:
            return _hf_key(stmt.chain[0]), self.hf_value(stmt.chain[1])
        self.sink.error("E010", "a weight mapping is `name: \"hf.tensor.name\"`, `name: fuse(...)`, "
                        "`name: transform(...)`, `name: tied_to(...)` or `name -> split(...)`", stmt.span)
        raise LoweringFailed()

    def hf_value(self, node: ast.Expr) -> Attribute:
        if isinstance(node, ast.Str):
            return StringAttr(node.value)
        if isinstance(node, ast.Name):
            return StringAttr(node.id)
        if isinstance(node, (ast.Int, ast.Bool)):
            return IntegerAttr(int(node.value), i64)
        if isinstance(node, ast.Float):
            return FloatAttr(node.value, f64)
        if isinstance(node, ast.ListExpr):
            return ArrayAttr([self.hf_value(i) for i in node.items])
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            entries: dict[str, Attribute] = {"op": StringAttr(node.func.id)}
            positional = [self.hf_value(a.value) for a in node.args if a.name is None]
            parts = {a.name: self.hf_value(a.value) for a in node.args if a.style == "str:"}
            entries.update({a.name: self.hf_value(a.value) for a in node.args if a.style in ("=", ":")})
            if positional:
                entries["args"] = ArrayAttr(positional)
            if parts:
                entries["parts"] = DictionaryAttr(parts)
            return DictionaryAttr(entries)
        return StringAttr(source_text(node))


def _hf_key(node: ast.Expr) -> str:
    """An hf_* entry's key: its path as written, or the text of a quoted one (a path pattern such as
    ``"groups[{layer}].local_{k}.mlp.down_weight"``, which is no expression)."""
    return node.value if isinstance(node, ast.Str) else source_text(node)


_UNREAD = object()  # a parameter whose module the key check cannot read
PLACEHOLDER = re.compile(r"\{([^{}]+)\}")  # a tensor name's {layer}, {6 * layer + k} (modeldsl.hf.checkpoint)
_PART = re.compile(r"^(?P<name>[\w{}]+)(?:\[\{(?P<index>\w+)\}\])?$")


def _key_parts(key: str) -> list[tuple[str, str | None] | None]:
    """``groups[{layer}].local_{k}.w`` as (name, index) parts: (groups, layer), (local_{k}, None),
    (w, None); None for a part written otherwise (``blocks[0]``)."""
    parts = []
    for text in key.split("."):
        match = _PART.match(text)
        parts.append((match["name"], match["index"]) if match else None)
    return parts


def _fits(written: str, declared: str) -> bool:
    """A key's part names a declared parameter: the same name, or a pattern (``local_{k}``) of it."""
    if "{" not in written:
        return written == declared
    pattern = "".join(r"\d+" if piece.startswith("{") else re.escape(piece)
                      for piece in re.split(r"(\{\w+\})", written))
    return re.fullmatch(pattern, declared) is not None


def _declared_params(decl: ast.Decl) -> dict[str, ast.Expr]:
    """Every parameter a declaration declares, by name (those under a guard or an ``if`` too), with
    its written type or module."""
    found: dict[str, ast.Expr] = {}

    def visit(body: list[ast.Stmt]) -> None:
        for stmt in body:
            if isinstance(stmt, ast.Section) and stmt.name is not None and stmt.value is not None:
                value = stmt.value.expr
                found[stmt.name] = value.value if isinstance(value, ast.NamedField) else value
            elif isinstance(stmt, ast.If):
                visit(stmt.then)
                visit(stmt.orelse or [])

    for section in decl.sections("params"):
        visit(section.body)
    return found


def _let_names(decl: ast.Decl) -> set[str]:
    names: set[str] = set()
    for section in decl.sections("let"):
        for stmt in section.body:
            if isinstance(stmt, ast.Binding):
                names.add(stmt.name)
            elif isinstance(stmt, ast.Section) and stmt.name is not None and stmt.value is not None:
                names.add(stmt.name)
    return names


def _strings(node: ast.Expr) -> list[ast.Str]:
    """The strings of a mapping value (tensor names), in calls and lists too."""
    if isinstance(node, ast.Str):
        return [node]
    if isinstance(node, ast.Call):
        return [s for a in node.args for s in _strings(a.value)]
    if isinstance(node, ast.ListExpr):
        return [s for item in node.items for s in _strings(item)]
    return []
