"""``@hf_config``, ``@hf_mapping`` and ``@hf_export`` of a Python DSL model as its HuggingFace sections."""

from __future__ import annotations

import ast as py

from modeldsl.frontend.python.nodes import Nodes, called_name, constant, is_string
from modeldsl.frontend.text import ast


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
