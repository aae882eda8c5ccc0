"""``@hf_config``, ``@hf_mapping`` and ``@hf_export`` of a Python DSL model as its HuggingFace sections."""

from __future__ import annotations

import ast as py

from modeldsl.diagnostics import Diagnostic, DiagnosticError
from modeldsl.frontend.python.nodes import Nodes, called_name, constant, is_string
from modeldsl.frontend.text import ast

INDEXED_OPTIONS = ("index_var",)


class HuggingFaceSections(Nodes):
    def hf_section(self, decorator: py.expr) -> ast.Section:
        name = called_name(decorator)
        if not isinstance(decorator, py.Call):
            raise self.error(decorator, f"@{name}(...) takes its entries")
        entries = [(k.arg, k.value, k) for k in decorator.keywords if k.arg is not None]
        for arg in decorator.args:
            if not isinstance(arg, py.Dict) or not all(is_string(k) for k in arg.keys):
                raise self.error(arg, f"@{name} takes keywords or a dict of string keys")
            entries += [(k.value, v, k) for k, v in zip(arg.keys, arg.values)]
        return self.section(decorator, name, [self.hf_entry(key, value, where, name) for key, value, where in entries])

    def indexed_mapping(self, decorator: py.expr) -> list[ast.Stmt]:
        """``@hf_mapping.indexed("blocks", ln1_weight="model.layers.{layer}.input_layernorm.weight")`` (or a
        dict of such entries; ``index_var="expert"`` for ``{expert}``): the entries
        ``"blocks[{layer}].ln1_weight": ...`` of the stack ``blocks``'s elements."""
        if not isinstance(decorator, py.Call) or not decorator.args or not is_string(decorator.args[0]):
            raise self.error(decorator, "@hf_mapping.indexed names the stack first: @hf_mapping.indexed(\"blocks\", "
                             "name=\"model.layers.{layer}.name\", ...)")
        stack, rest = decorator.args[0].value, decorator.args[1:]
        index = "layer"
        for keyword in decorator.keywords:
            if keyword.arg == "index_var":
                if not (is_string(keyword.value) and keyword.value.value.isidentifier()):
                    raise self.error(keyword.value, "index_var names the index: index_var=\"layer\"")
                index = keyword.value.value
        entries = [(k.arg, k.value, k) for k in decorator.keywords if k.arg not in (*INDEXED_OPTIONS, None)]
        for arg in rest:
            if not isinstance(arg, py.Dict) or not all(is_string(k) for k in arg.keys):
                raise self.error(arg, "@hf_mapping.indexed takes the stack's name, then keywords or a dict of "
                                 "string keys")
            entries += [(k.value, v, k) for k, v in zip(arg.keys, arg.values)]
        return self.indexed_entries(stack, index, entries)

    def block_mappings(self, stmt: py.Assign) -> list[ast.Stmt]:
        """``_hf_block_mappings_ = {"ln1_weight": "model.layers.{layer}...", ...}``: the mappings of the
        elements of the stack ``blocks`` (``@hf_mapping.indexed("blocks", {...})``)."""
        if not isinstance(stmt.value, py.Dict) or not all(is_string(k) for k in stmt.value.keys):
            raise self.error(stmt.value, "_hf_block_mappings_ is a dict of the block parameters' mappings")
        return self.indexed_entries("blocks", "layer", [(k.value, v, k) for k, v in zip(stmt.value.keys,
                                                                                       stmt.value.values)])

    def indexed_entries(self, stack: str, index: str, entries: list[tuple[str, py.expr, py.AST]]) -> list[ast.Stmt]:
        found = []
        for key, value, where in entries:
            found.append(self.hf_entry(f"{stack}[{{{index}}}].{key}", value, where, "hf_mapping"))
        return found

    def check_mapped_once(self, entries: list[ast.Stmt]) -> None:
        """E010 for a parameter mapped twice (by two decorators, or a decorator and ``hf_mapping=``)."""
        seen: dict[str, ast.Stmt] = {}
        for entry in entries:
            key = entry.name if isinstance(entry, ast.Section) else None
            if key is None:
                continue
            if key in seen:
                raise DiagnosticError([Diagnostic("E010", f"'{key}' is mapped twice", entry.key.span,
                                                  "map each parameter once")])
            seen[key] = entry

    def hf_entry(self, key: str, value: py.expr, where: py.AST, section: str) -> ast.Stmt:
        key_node = ast.Name(self.inner(where) if isinstance(where, py.Constant) else self.span(where), key)
        if isinstance(value, py.Dict):
            body = [self.hf_entry(k.value, v, k, section) for k, v in zip(value.keys, value.values) if is_string(k)]
            return ast.Section(self.span(where), key_node, None, body)
        converted = self.hf_value(value)
        if section == "hf_export":  # name -> split(...)
            return ast.Flow(self.span(where), [key_node, converted])
        return ast.Section(self.span(where), key_node, ast.Value(converted.span, converted), [])

    def hf_value(self, node: py.expr) -> ast.Expr:
        """Strings stay strings (tensor names, ``"num_heads * head_dim"`` in a split); calls such as
        ``fuse(...)``, ``field(...)`` and ``split({...}, dim=0)`` keep their arguments."""
        if isinstance(node, py.Call) and isinstance(node.func, py.Name):
            args = []
            for arg in node.args:
                if isinstance(arg, py.Dict):  # split's parts: "tensor": [begin, end]
                    args += [ast.Arg(self.span(k), self.hf_value(v), k.value, "str:")
                             for k, v in zip(arg.keys, arg.values) if is_string(k)]
                else:
                    args.append(ast.Arg(self.span(arg), self.hf_word(arg)))
            args += [ast.Arg(self.span(k), self.hf_word(k.value), k.arg, "=") for k in node.keywords]
            return ast.Call(self.span(node), ast.Name(self.span(node.func), node.func.id), args)
        if isinstance(node, py.List):
            return ast.ListExpr(self.span(node), [self.hf_value(e) for e in node.elts])
        if isinstance(node, py.Constant):
            return constant(node.value, self.span(node), self, node)
        raise self.error(node, "a mapping value is a string, a number, a list or a call such as fuse(...)")

    def hf_word(self, node: py.expr) -> ast.Expr:
        """A call argument in a mapping: a dotted tensor name stays a string, an identifier is a word."""
        if is_string(node) and node.value.isidentifier():
            return ast.Name(self.inner(node), node.value)
        return self.hf_value(node)
