"""The ``hf_config``, ``hf_mapping`` and ``hf_export`` sections of a model, as dictionaries
on its ``mdsl.graph.model`` op (read by :mod:`modeldsl.hf`).
"""

from __future__ import annotations

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

from modeldsl.frontend.text import ast
from modeldsl.instances import (
    LoweringFailed,
    source_text,
)


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
