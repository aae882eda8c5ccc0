"""The Python decorator DSL (seed 001) read into the Module DSL's AST.

A ``.py`` file is never run to be lowered: its source is parsed with Python's ``ast``, and each
class decorated ``@module``, ``@block`` or ``@model`` becomes the
:class:`modeldsl.frontend.text.ast.Decl` the text frontend builds for its twin, every node spanned
at its place in the Python file. Resolution, checking and lowering are the text DSL's own, so the
IR is the same and every mistake is the same coded diagnostic, located in the Python file. The
spelling (``docs/python-dsl.md`` has the whole table):

- ``def __init__(self, d: int, eps: float = 1e-6)``: the parameters. In its body,
  ``self.q_dim = self.num_heads * self.head_dim`` is the ``let:`` binding ``q_dim = ...``,
  ``self.C = Dim("d_model")`` makes ``C`` another name for ``d_model``, and ``assert cond, "why"``
  a ``constraint:``.
- ``weight = Param(Tensor["out_dim", "in_dim"], when="bias")`` is ``weight: [out_dim, in_dim] if
  bias``; ``Param(RMSNorm("d_model", "eps"))`` a submodule, ``Param(Array["n_layers",
  Block(...)])`` a stack, ``Param(tied_to("embedding"))`` a tied parameter. A string is an
  expression of the parameters (``"D // 2"``; ``"*"`` any leading dims; a dtype last in a
  ``Tensor[...]``: ``"fp32"``).
- ``@forward def forward(self, x: Tensor[...], ...) -> Tensor[...]`` is ``forward:`` with its
  ``inputs:`` (a lone ``in_`` is the DSL's ``in``) and ``out:`` (``return logits`` names it:
  ``out: logits: [...]``); ``@save(...)`` / ``@recompute(...)`` its lists. ``@backward def
  backward(self, d_out: Tensor[...]) -> Tensor[...]`` is ``backward:`` (its output is ``d_`` and
  the forward's input; ``g.saved("x")`` is ``saved.x``; ``with g.recompute():`` the block of
  recomputed steps).
- In ``with graph() as g:``, ``y = g.prim(x, "weight", [d, d], eps=self.eps)`` is the flow
  ``(x, weight) -> prim([d, d], eps=eps) -> y``: names and strings are the step's input tensors
  (a string names a parameter), other positional values and keywords are its arguments, and a
  keyword named after an annotation (``hook="BeforeAttention"``) annotates the step. ``a, b =``
  gives two results, ``y = self.sub(x)`` runs the submodule (or stack) ``sub``, ``y = x`` copies
  a name, ``if``/``else`` on the parameters is the compile-time ``if``.
- ``@hf_config(...)``, ``@hf_mapping({...})``, ``@hf_export({...})`` on a model are its sections,
  as keywords or a dict (keys such as ``"blocks[{layer}].ln1.weight"`` or ``"lm_head?"``);
  ``fuse(...)``, ``split({...}, dim=0)``, ``transform(...)``, ``field(...)`` are their calls.
- ``from modeldsl.std.modules.norm import RMSNorm`` imports the std library's declaration (the
  text DSL's ``from std.modules.norm import RMSNorm``).

Anything else is E001 at its place, naming what the DSL takes there.
"""

from __future__ import annotations

import ast as py
from pathlib import Path
from typing import Any

from modeldsl.diagnostics import Diagnostic, DiagnosticError, Source, Span
from modeldsl.dialects.annotations import ANNOTATION_BY_NAME
from modeldsl.files import read_regular_file
from modeldsl.frontend.python.slots import apply_slots, is_slot
from modeldsl.frontend.text import ast

KINDS = ("module", "block", "model")
HF_SECTIONS = ("hf_config", "hf_mapping", "hf_export")
OPERATORS = {py.Add: "+", py.Sub: "-", py.Mult: "*", py.Div: "/", py.FloorDiv: "//", py.Mod: "%", py.Pow: "**",
             py.Eq: "==", py.NotEq: "!=", py.Lt: "<", py.Gt: ">", py.LtE: "<=", py.GtE: ">=",
             py.And: "and", py.Or: "or"}
KEYWORD_NAMES = {"in_": "in"}  # Python keywords the text DSL uses as names
STD_PACKAGE = ("modeldsl", "std")


def parse_python_file(path: str | Path) -> ast.Program:
    """The Module DSL AST of the decorated classes of a Python DSL file (E028 when it cannot be read,
    E001 for Python that does not parse or a construct the DSL does not take)."""
    from modeldsl.frontend.text.parser import decode_source

    data = read_regular_file(path, "check the path of the .py file")
    return parse_python_source(decode_source(data, str(path)), str(path))


def parse_python_source(text: str, name: str = "<input>") -> ast.Program:
    source = Source(name, text)
    try:
        tree = py.parse(text, filename=name)
    except SyntaxError as err:
        line, column = err.lineno or 1, err.offset or 1
        raise DiagnosticError([Diagnostic("E001", f"Python syntax error: {err.msg}",
                                          Span(source, line, column, line, column + 1),
                                          "the Python DSL is Python: fix the syntax")]) from None
    translator = Translator(source)
    items: list[Any] = []
    backwards = {_backward_of(node): node for node in tree.body if isinstance(node, py.FunctionDef)
                 and _backward_of(node) is not None}
    for node in tree.body:
        if isinstance(node, py.ImportFrom):
            items += translator.imports(node)
        elif isinstance(node, py.ClassDef) and _kind(node) is not None:
            items.append(translator.declaration(node))
        elif isinstance(node, py.FunctionDef) and any(_called_name(d) == "primitive" for d in node.decorator_list):
            items.append(translator.primitive(node, backwards.get(node.name)))
    return ast.Program(Span(source, 1, 1, 1, 1), source, items)


class Translator:
    """Python AST nodes of one file to Module DSL AST nodes."""

    def __init__(self, source: Source):
        self.source = source
        self.aliases: dict[str, ast.Expr] = {}

    # ------------------------------------------------------------------ spans and errors
    def span(self, node: Any) -> Span:
        line, column = getattr(node, "lineno", 1), getattr(node, "col_offset", 0) + 1
        end_line = getattr(node, "end_lineno", None) or line
        end_column = (getattr(node, "end_col_offset", None) or column - 1) + 1
        return Span(self.source, line, column, end_line, end_column)

    def inner(self, literal: py.Constant) -> Span:
        """The span of a one-line string literal's text, inside its quotes."""
        raw = self.source.line(literal.lineno)[literal.col_offset:]
        quote = len(raw) - len(raw.lstrip("rbuRBUfF"))
        quote += len(raw[quote:]) - len(raw[quote:].lstrip("\"'")) if raw[quote:quote + 3] in ('"""', "'''") \
            else 1
        column = literal.col_offset + quote + 1
        if literal.end_lineno != literal.lineno:
            return self.span(literal)
        return Span(self.source, literal.lineno, column, literal.lineno, column + len(literal.value))

    def error(self, node: Any, message: str, hint: str = "") -> DiagnosticError:
        return DiagnosticError([Diagnostic("E001", message, self.span(node), hint)])

    def section(self, node: Any, name: str, body: list[ast.Stmt], value: ast.Value | None = None) -> ast.Section:
        return ast.Section(self.span(node), ast.Name(self.span(node), name), value, body)

    def entry(self, node: Any, name: str, expr: ast.Expr, guard: ast.Expr | None = None,
              annotations: list[ast.Annotation] | None = None) -> ast.Section:
        """``name: expr [if guard] @annotations``."""
        value = ast.Value(expr.span, expr, guard=guard, annotations=annotations or [])
        return ast.Section(self.span(node), ast.Name(self.span(node), name), value, [])

    # ------------------------------------------------------------------ imports
    def imports(self, node: py.ImportFrom) -> list[ast.FromImport]:
        """``from modeldsl.std.X.Y import Z`` is the text DSL's ``from std.X.Y import Z`` (a ``.module``
        file, or the Python DSL's ``std/python/...py``); ``from .norm import RMSNorm`` a file beside
        this one; other imports (``modeldsl.dsl``, Python's own) are Python's business."""
        parts = tuple((node.module or "").split("."))
        if node.level == 1 and node.module:
            path = list(parts)
        elif node.level == 0 and parts[:2] == STD_PACKAGE and len(parts) >= 3:
            path = ["std", *parts[2:]]
        else:
            return []
        return [ast.FromImport(self.span(node), path, [(alias.name, alias.asname) for alias in node.names])]

    # ------------------------------------------------------------------ declarations
    def declaration(self, node: py.ClassDef) -> ast.Decl:
        self.aliases = {}
        body: list[ast.Stmt] = []
        doc = py.get_docstring(node, clean=True)
        if doc is not None:
            body.append(ast.ExprStmt(self.span(node.body[0]), ast.Str(self.span(node.body[0]), doc)))
        annotations = [self.decorator_annotation(d) for d in node.decorator_list
                       if _called_name(d) in ANNOTATION_BY_NAME]
        if annotations:
            body.append(ast.AnnotationStmt(annotations[0].span, annotations))
        extends = self.extends(node)
        init = next((s for s in node.body if isinstance(s, py.FunctionDef) and s.name == "__init__"), None)
        params, let = self.signature(init) if init is not None else ([], [])
        if let:
            body.append(self.section(init, "let", let))
        entries = [self.parameter(s, added=extends is not None) for s in node.body if _is_param(s)]
        if entries:
            body.append(self.section(node, "params", entries))
        functions = {name: next((s for s in node.body if isinstance(s, py.FunctionDef) and _has(s, name)), None)
                     for name in ("forward", "backward")}
        slots = [s for s in node.body if is_slot(s)]
        if functions["forward"] is not None:
            body.append(self.forward(functions["forward"]))
            apply_slots(self, slots, body[-1])
        elif slots:
            raise self.error(slots[0], "activation slots name tensors of the forward graph, which this class lacks")
        for decorator in node.decorator_list:
            if _called_name(decorator) in HF_SECTIONS:
                body.append(self.hf_section(decorator))
        if functions["backward"] is not None:
            body.append(self.backward(functions["backward"], functions["forward"]))
        abstract = any(_called_name(d) == "abstract" for d in node.decorator_list)
        return ast.Decl(self.span(node), _kind(node) or "module", node.name, params, body, extends, abstract)

    def extends(self, node: py.ClassDef) -> str | None:
        """``@extends("Base")``: the declaration this one inherits from."""
        for decorator in node.decorator_list:
            if _called_name(decorator) == "extends":
                if not (isinstance(decorator, py.Call) and len(decorator.args) == 1 and _is_string(decorator.args[0])):
                    raise self.error(decorator, "@extends names the base declaration: @extends(\"Base\")")
                return decorator.args[0].value
        return None

    def signature(self, init: py.FunctionDef) -> tuple[list[ast.Param], list[ast.Stmt]]:
        args = init.args
        if args.vararg or args.kwarg or args.kwonlyargs or args.posonlyargs:
            raise self.error(init, "__init__ takes plain parameters only (name: type = default)")
        positional = args.args[1:]  # self
        defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
        params = [ast.Param(self.span(a), a.arg, self.expr(a.annotation) if a.annotation else None,
                            self.value(d) if d is not None else None) for a, d in zip(positional, defaults)]
        let: list[ast.Stmt] = []
        constraints: list[ast.Stmt] = []
        for stmt in init.body:
            if isinstance(stmt, py.Assert):
                constraints.append(self.constraint(stmt))
            else:
                let += self.binding(stmt)
        if constraints:
            let.append(self.section(init, "constraint", constraints))
        return params, let

    def binding(self, stmt: py.stmt) -> list[ast.Stmt]:
        """``self.q_dim = expr``: the binding ``q_dim = expr``; ``self.C = Dim("d")``: ``C`` names ``d``;
        ``self.x = x``, ``pass`` and a docstring say nothing."""
        if isinstance(stmt, py.Pass) or (isinstance(stmt, py.Expr) and isinstance(stmt.value, py.Constant)):
            return []
        if not (isinstance(stmt, py.Assign) and len(stmt.targets) == 1 and _self_attribute(stmt.targets[0])):
            raise self.error(stmt, "__init__ names values of the parameters: self.NAME = expression, self.NAME = "
                             "Dim(\"expr\"), assert condition, \"message\"")
        name, value = stmt.targets[0].attr, stmt.value
        if isinstance(value, py.Call) and _called_name(value) == "Dim" and len(value.args) == 1:
            self.aliases[name] = self.value(value.args[0])
            return []
        if isinstance(value, py.Name) and value.id == name:
            return []
        return [ast.Binding(self.span(stmt), name, self.expr(value))]

    def constraint(self, stmt: py.Assert) -> ast.Constraint:
        if not (isinstance(stmt.msg, py.Constant) and isinstance(stmt.msg.value, str)):
            raise self.error(stmt, "a constraint says why: assert condition, \"message\"")
        return ast.Constraint(self.span(stmt), self.expr(stmt.test), stmt.msg.value)

    def parameter(self, stmt: py.Assign, added: bool = False) -> ast.Section:
        """``name = Param(type, when=cond, frozen=True, ...)``; in a declaration that extends another,
        a new parameter (the text DSL's ``+name:``) unless ``restate=True`` restates an inherited one."""
        call, target = stmt.value, stmt.targets[0]
        if len(call.args) != 1:
            raise self.error(call, "Param takes the parameter's type: Param(Tensor[\"d\"]), Param(Module(...)), "
                             "Param(Array[\"n\", Block(...)]), Param(tied_to(\"name\"))")
        guard, annotations = None, []
        for keyword in call.keywords:
            if keyword.arg == "when":
                guard = self.value(keyword.value)
            elif keyword.arg == "restate" and isinstance(keyword.value, py.Constant):
                added = added and not keyword.value.value
            elif keyword.arg in ANNOTATION_BY_NAME:
                annotations.append(self.annotation(keyword))
            else:
                raise self.error(keyword, f"Param takes no '{keyword.arg}'",
                                 "give when= for a conditional parameter, or an annotation (frozen=True, ...)")
        entry = self.entry(stmt, target.id, self.param_type(call.args[0]), guard, annotations)
        entry.added = added
        return entry

    def param_type(self, node: py.expr) -> ast.Expr:
        if _subscript_of(node, "Tensor"):
            return self.tensor_type(node)
        if _subscript_of(node, "Array"):
            count, element = _subscripts(node)
            if len(_subscripts(node)) != 2:
                raise self.error(node, "an array is Array[count, Block(...)]")
            return ast.ArrayType(self.span(node), self.value(count), self.instance(element))
        if isinstance(node, py.Call):
            return self.instance(node)
        raise self.error(node, "a parameter's type is Tensor[...], a module (Module(args)), Array[n, Block(args)] "
                         "or tied_to(\"name\")")

    def instance(self, node: py.expr) -> ast.Expr:
        """``RMSNorm("d_model", "eps")``: a submodule with its arguments (strings are expressions)."""
        if not (isinstance(node, py.Call) and isinstance(node.func, py.Name)):
            raise self.error(node, "a submodule is its declaration called with its arguments: RMSNorm(\"d\")")
        args = [ast.Arg(self.span(a), self.value(a)) for a in node.args]
        args += [ast.Arg(self.span(k), self.value(k.value), k.arg, "=") for k in node.keywords]
        return ast.Call(self.span(node), ast.Name(self.span(node.func), node.func.id), args)

    # ------------------------------------------------------------------ primitives
    def primitive(self, func: py.FunctionDef, backward: py.FunctionDef | None) -> ast.Decl:
        """``@primitive(impl="kernels.x") def name(a: Tensor[...], *, p: float = 1.0) -> Tensor[...]``:
        ``primitive name:`` with ``params:`` (the keyword-only arguments), ``forward:`` ``in:``/``out:``,
        and, from ``@name.backward def name_backward(...)``, ``backward:`` ``in:``/``out:`` and its
        ``@save`` list."""
        body: list[ast.Stmt] = []
        doc = py.get_docstring(func, clean=True)
        if doc is not None:
            body.append(ast.ExprStmt(self.span(func.body[0]), ast.Str(self.span(func.body[0]), doc)))
        kwonly = func.args.kwonlyargs
        if kwonly:
            defaults = func.args.kw_defaults
            body.append(self.section(func, "params", [self.primitive_param(a, d) for a, d in zip(kwonly, defaults)]))
        body.append(self.section(func, "forward", self.signature_slots(func)))
        if backward is not None:
            body.append(self.section(backward, "backward", self.signature_slots(backward)))
            body += self.lists(backward)
        impl = next((k.value for d in func.decorator_list if isinstance(d, py.Call) and _called_name(d) == "primitive"
                     for k in d.keywords if k.arg == "impl"), None)
        if impl is not None:
            body.append(self.section(impl, "impl", self.implementations(impl, backward is not None)))
        return ast.Decl(self.span(func), "primitive", func.name, None, body)

    def primitive_param(self, arg: py.arg, default: py.expr | None) -> ast.Section:
        """``p: float = 1.0``, ``mode: Literal["NN", "NT"] = "NN"`` (an enum), ``sizes: list[int]``,
        ``scale: float | None = None`` (optional)."""
        optional = isinstance(arg.annotation, py.BinOp) and isinstance(arg.annotation.op, py.BitOr) \
            and isinstance(arg.annotation.right, py.Constant) and arg.annotation.right.value is None
        annotation = arg.annotation.left if optional else arg.annotation
        if _subscript_of(annotation, "Literal") and all(_is_string(c) for c in _subscripts(annotation)):
            kind: ast.Expr = ast.Call(self.span(annotation), ast.Name(self.span(annotation.value), "enum"),
                                      [ast.Arg(self.span(c), ast.Name(self.inner(c), c.value))
                                       for c in _subscripts(annotation)])
        elif _subscript_of(annotation, "list") and _called_name(_subscripts(annotation)[0]) == "int":
            kind = ast.ListExpr(self.span(annotation), [ast.Name(self.span(annotation), "int")])
        elif isinstance(annotation, py.Name) and annotation.id in ("float", "int", "bool", "dtype"):
            kind = ast.Name(self.span(annotation), annotation.id)
        else:
            raise self.error(arg, f"parameter '{arg.arg}' has no primitive parameter type",
                             "float, int, bool, dtype, list[int] or Literal[\"A\", \"B\"] (an enum), | None if optional")
        if optional:
            kind = ast.Optional_(kind.span, kind)
        value_default = None
        if default is not None:
            value_default = self.word(default) if _is_string(default) else self.expr(default)
        return ast.Section(self.span(arg), ast.Name(self.span(arg), arg.arg),
                           ast.Value(kind.span, kind, value_default), [])

    def signature_slots(self, func: py.FunctionDef) -> list[ast.Stmt]:
        """``in: (a: [...], b: [...])`` and ``out: [...]`` (several: ``out: ([...], [...])``)."""
        args = func.args
        if args.vararg is not None or args.posonlyargs or args.kwarg is not None:
            raise self.error(func, f"{func.name} takes its tensors as plain arguments (then * and its parameters)")
        fields = [ast.NamedField(self.span(a), a.arg, self.slot_type(a.annotation, a)) for a in args.args]
        entries: list[ast.Stmt] = [self.entry(func, "in", ast.NamedTuple(self.span(func), fields))]
        returns = func.returns
        if returns is None:
            raise self.error(func, f"{func.name} has no output type", "annotate it: -> Tensor[...]")
        outputs = [self.slot_type(t, returns) for t in (_subscripts(returns) if _subscript_of(returns, "tuple")
                                                         else [returns])]
        shape = outputs[0] if len(outputs) == 1 else ast.TupleExpr(self.span(returns), outputs)
        entries.append(self.entry(returns, "out", shape))
        return entries

    def slot_type(self, annotation: py.expr | None, where: Any) -> ast.Expr:
        if annotation is None:
            raise self.error(where, "a tensor argument needs its type: Tensor[...]")
        if isinstance(annotation, py.BinOp) and isinstance(annotation.op, py.BitOr) \
                and isinstance(annotation.right, py.Constant) and annotation.right.value is None:
            return ast.Optional_(self.span(annotation), self.tensor_type(annotation.left))
        return self.tensor_type(annotation)

    def implementations(self, impl: py.expr, backward: bool) -> list[ast.Stmt]:
        """``impl="kernels.x"`` (forward, and backward when there is one) or ``impl={"forward": ..., ...}``."""
        if _is_string(impl):
            pairs = [("forward", impl)] + ([("backward", impl)] if backward else [])
        elif isinstance(impl, py.Dict) and all(_is_string(k) and _is_string(v) for k, v in zip(impl.keys, impl.values)):
            pairs = [(k.value, v) for k, v in zip(impl.keys, impl.values)]
        else:
            raise self.error(impl, "impl names the kernels: impl=\"kernels.x\" or impl={\"forward\": \"kernels.x\", ...}")
        return [self.entry(v, k, ast.Name(self.inner(v), v.value)) for k, v in pairs]

    # ------------------------------------------------------------------ forward and backward
    def forward(self, func: py.FunctionDef) -> ast.Section:
        inputs = self.arguments(func)
        body: list[ast.Stmt] = []
        if len(inputs) == 1 and inputs[0].arg == "in_":
            body.append(self.entry(inputs[0], "in", self.tensor_type(inputs[0].annotation)))
        else:
            body.append(self.section(func, "inputs", [self.entry(a, _name(a.arg), self.tensor_type(a.annotation))
                                                      for a in inputs]))
        steps = self.graph(func)
        body.append(self.output(func, steps or []))
        if steps is not None:
            body.append(self.section(func, "graph", steps))
        body += self.lists(func)
        return self.section(func, "forward", body)

    def output(self, func: py.FunctionDef, steps: list[ast.Stmt]) -> ast.Section:
        """``out: [...]``, or ``out: name: [...]`` when the graph ends with ``return name``."""
        if func.returns is None:
            raise self.error(func, f"{func.name} has no output type", "annotate it: -> Tensor[\"B\", \"T\", \"d\"]")
        shape = self.tensor_type(func.returns)
        named = steps[-1] if steps and isinstance(steps[-1], _NamedOutput) else None
        if named is None:
            return self.entry(func.returns, "out", shape)
        steps.pop()
        field = ast.NamedField(named.span, named.name, shape)
        return self.entry(func.returns, "out", field)

    def backward(self, func: py.FunctionDef, forward: py.FunctionDef | None) -> ast.Section:
        """Its arguments are the gradients it takes (``d_out``); it gives ``d_`` and each forward input."""
        body: list[ast.Stmt] = [self.entry(a, _name(a.arg), self.tensor_type(a.annotation))
                                for a in self.arguments(func)]
        forward_inputs = [_name(a.arg) for a in forward.args.args[1:]] if forward is not None else ["in"]
        returns = func.returns
        types = _subscripts(returns) if returns is not None and _subscript_of(returns, "tuple") else [returns]
        if returns is None or len(types) != len(forward_inputs):
            raise self.error(func, f"backward gives one gradient per forward input ({', '.join(forward_inputs)})",
                             "annotate it: -> Tensor[...] (or tuple[Tensor[...], ...])")
        body += [self.entry(t, f"d_{name}", self.tensor_type(t)) for name, t in zip(forward_inputs, types)]
        body.append(self.section(func, "graph", self.graph(func) or []))
        return self.section(func, "backward", body)

    def arguments(self, func: py.FunctionDef) -> list[py.arg]:
        args = func.args
        if args.vararg or args.kwarg or args.kwonlyargs or args.defaults or not args.args:
            raise self.error(func, f"{func.name} takes self and its input tensors: def {func.name}(self, x: "
                             "Tensor[...])")
        for arg in args.args[1:]:
            if arg.annotation is None:
                raise self.error(arg, f"input '{arg.arg}' has no type", "annotate it: x: Tensor[\"B\", \"T\", \"d\"]")
        return args.args[1:]

    def lists(self, func: py.FunctionDef) -> list[ast.Section]:
        """``@save("x", ...)`` and ``@recompute(...)``, and in the graph ``g.save(...)`` and
        ``g.mark_recompute(...)``: the ``save:`` and ``recompute:`` lists."""
        calls = [(d, _called_name(d)) for d in func.decorator_list if _called_name(d) in ("save", "recompute")]
        block = next((s for s in func.body if isinstance(s, py.With) and _is_with(s, "graph")), None)
        if block is not None:
            g = block.items[0].optional_vars.id
            calls += [(c, LIST_CALLS[c.func.attr]) for c in _list_calls(block.body, g)]
        entries: dict[str, tuple[py.AST, list[ast.Expr]]] = {}
        for call, kind in calls:
            if not isinstance(call, py.Call) or not all(_is_string(a) for a in call.args):
                raise self.error(call, f"{kind} lists name tensors by string: @{kind}(\"x\", \"rstd\")")
            names = entries.setdefault(kind, (call, []))[1]
            names += [ast.Name(self.inner(a), _name(a.value)) for a in call.args]
        return [self.entry(where, kind, ast.ListExpr(self.span(where), names)) for kind, (where, names) in entries.items()]

    # ------------------------------------------------------------------ graphs
    def graph(self, func: py.FunctionDef) -> list[ast.Stmt] | None:
        """The steps of ``with graph() as g:``; None for a body of ``...`` (an abstract declaration's)."""
        statements = [s for s in func.body if not _docstring(s)]
        if not statements:
            return None
        if len(statements) != 1 or not isinstance(statements[0], py.With) or not _is_with(statements[0], "graph"):
            raise self.error(func, f"{func.name}'s body is one `with graph() as g:` block")
        block = statements[0]
        steps = self.statements(block.body, block.items[0].optional_vars.id)
        last = block.body[-1] if block.body else None
        if isinstance(last, py.Return) and isinstance(last.value, py.Name) and last.value.id != "out" \
                and func.name == "forward":
            steps.append(_NamedOutput(self.span(last.value), _name(last.value.id)))
        return steps

    def statements(self, body: list[py.stmt], g: str) -> list[ast.Stmt]:
        return [self.statement(s, g) for s in body
                if not _docstring(s) and not isinstance(s, py.Return) and _list_call(s, g) is None]

    def statement(self, stmt: py.stmt, g: str) -> ast.Stmt:
        if isinstance(stmt, py.Assign) and len(stmt.targets) == 1:
            destination = self.destination(stmt.targets[0])
            if isinstance(stmt.value, py.Call):
                return self.flow(stmt, stmt.value, destination, g)
            return ast.Flow(self.span(stmt), [self.tensor(stmt.value, g), destination])
        if isinstance(stmt, py.If):
            return ast.If(self.span(stmt), self.expr(stmt.test), self.statements(stmt.body, g),
                          self.statements(stmt.orelse, g) if stmt.orelse else None)
        if isinstance(stmt, py.With) and _is_with(stmt, "recompute", g):
            return self.section(stmt, "recompute", self.statements(stmt.body, g))
        raise self.error(stmt, f"a graph takes `name = {g}.primitive(...)`, `name = self.submodule(...)`, "
                         f"`name = other`, if/else on the parameters, `with {g}.recompute():` and `return name`")

    def destination(self, target: py.expr) -> ast.Expr:
        if isinstance(target, py.Name):
            return ast.Name(self.span(target), _name(target.id))
        if isinstance(target, py.Tuple) and all(isinstance(e, py.Name) for e in target.elts):
            return ast.TupleExpr(self.span(target), [ast.Name(self.span(e), _name(e.id)) for e in target.elts])
        raise self.error(target, "a graph step writes a name or a tuple of names")

    def flow(self, stmt: py.stmt, call: py.Call, destination: ast.Expr, g: str) -> ast.Flow:
        """One step, or a chain of them when a step's first argument is another step
        (``g.matmul(g.silu(h), "w2")`` is ``h -> silu() -> matmul(w2) -> ...``)."""
        annotations = [self.annotation(k) for k in call.keywords if k.arg in ANNOTATION_BY_NAME]
        return ast.Flow(self.span(stmt), self.stages(call, g) + [destination], annotations)

    def stages(self, call: py.Call, g: str) -> list[ast.Expr]:
        """The chain's source and steps up to ``call``."""
        first = call.args[0] if call.args else None
        if isinstance(first, py.Call) and _is_step(first, g):
            inner = self.stages(first, g)
            annotations = [self.annotation(k) for k in first.keywords if k.arg in ANNOTATION_BY_NAME]
            if annotations:
                inner[-1] = ast.Annotated(inner[-1].span, inner[-1], annotations)
            return inner + [self.step(call, call.args[1:], g, chained=True)]
        tensors = [self.tensor(a, g) for a in call.args if _is_tensor(a, g)]
        if not tensors:
            raise self.error(call, "a graph step takes at least one input tensor")
        source = tensors[0] if len(tensors) == 1 else ast.TupleExpr(self.span(call), tensors)
        return [source, self.step(call, [a for a in call.args if not _is_tensor(a, g)], g, chained=False)]

    def step(self, call: py.Call, args: list[py.expr], g: str, chained: bool) -> ast.Expr:
        """The step ``call`` is, with ``args`` inside it: its non-tensor arguments, and in a chain also
        the tensors other than the one flowing in (``matmul(w2, transpose=NT)``)."""
        func = call.func
        keywords = [k for k in call.keywords if k.arg not in ANNOTATION_BY_NAME]
        if _self_attribute(func) and not keywords and not args:
            return ast.Name(self.span(func), func.attr)
        if not (isinstance(func, py.Attribute) and isinstance(func.value, py.Name) and func.value.id == g):
            raise self.error(func, f"a graph step calls a primitive on `{g}` ({g}.matmul(...)) or a submodule "
                             "(self.name(...)) with its input tensors")
        inside = [ast.Arg(self.span(a), self.tensor(a, g) if chained and _is_tensor(a, g) else self.value(a))
                  for a in args]
        return ast.Call(self.span(func), ast.Name(self.span(func), func.attr), inside + [self.keyword(k) for k in keywords])

    def tensor(self, node: py.expr, g: str) -> ast.Expr:
        if isinstance(node, py.Name):
            return ast.Name(self.span(node), _name(node.id))
        if _is_string(node):
            return ast.Name(self.inner(node), node.value)
        if _self_attribute(node):
            return ast.Name(self.span(node), node.attr)
        if _is_saved(node, g):
            return ast.Attribute(self.span(node), ast.Name(self.span(node.func), "saved"), _name(node.args[0].value))
        raise self.error(node, "a step's input is a tensor: a name, a parameter's name as a string, self.name or "
                         f"{g}.saved(\"name\")")

    def keyword(self, keyword: py.keyword) -> ast.Arg:
        if keyword.arg is None:
            raise self.error(keyword.value, "**kwargs are not taken in a graph")
        return ast.Arg(self.span(keyword), self.value(keyword.value), keyword.arg, "=")

    def annotation(self, keyword: py.keyword) -> ast.Annotation:
        """``hook="BeforeAttention"``, ``frozen=True``, ``kernel={"impl": "cudnn"}``, ``shard=("column",
        {"tp_size": "tp_size"})``: ``@hook(BeforeAttention)``, ``@frozen``, ``@kernel(impl=cudnn)``,
        ``@shard(column, tp_size=tp_size)`` (a tuple gives several arguments, a dict keyword ones)."""
        value = keyword.value
        if isinstance(value, py.Constant) and value.value is True:
            return ast.Annotation(self.span(keyword), keyword.arg, [])
        items = value.elts if isinstance(value, py.Tuple) else [value]
        return ast.Annotation(self.span(keyword), keyword.arg, [a for item in items for a in self.annotation_args(item)])

    def decorator_annotation(self, decorator: py.expr) -> ast.Annotation:
        """``@checkpoint``, ``@memory("save")``, ``@shard("column", tp_size="tp_size")`` on a class."""
        name = _called_name(decorator)
        if not isinstance(decorator, py.Call):
            return ast.Annotation(self.span(decorator), name, [])
        args = [a for item in decorator.args for a in self.annotation_args(item)]
        args += [ast.Arg(self.span(k), self.word(k.value), k.arg, "=") for k in decorator.keywords]
        return ast.Annotation(self.span(decorator), name, args)

    def annotation_args(self, item: py.expr) -> list[ast.Arg]:
        if isinstance(item, py.Dict):
            return [ast.Arg(self.span(v), self.word(v), k.value, "=") for k, v in zip(item.keys, item.values)
                    if _is_string(k)]
        return [ast.Arg(self.span(item), self.word(item))]

    def word(self, node: py.expr) -> ast.Expr:
        """An annotation argument: an identifier string is the bare word the text DSL writes."""
        if _is_string(node) and node.value.isidentifier():
            return ast.Name(self.inner(node), node.value)
        return self.value(node)

    # ------------------------------------------------------------------ HuggingFace sections
    def hf_section(self, decorator: py.expr) -> ast.Section:
        name = _called_name(decorator)
        if not isinstance(decorator, py.Call):
            raise self.error(decorator, f"@{name}(...) takes its entries")
        entries = [(k.arg, k.value, k) for k in decorator.keywords if k.arg is not None]
        for arg in decorator.args:
            if not isinstance(arg, py.Dict) or not all(_is_string(k) for k in arg.keys):
                raise self.error(arg, f"@{name} takes keywords or a dict of string keys")
            entries += [(k.value, v, k) for k, v in zip(arg.keys, arg.values)]
        return self.section(decorator, name, [self.hf_entry(key, value, where, name) for key, value, where in entries])

    def hf_entry(self, key: str, value: py.expr, where: py.AST, section: str) -> ast.Stmt:
        key_node = ast.Name(self.inner(where) if isinstance(where, py.Constant) else self.span(where), key)
        if isinstance(value, py.Dict):
            body = [self.hf_entry(k.value, v, k, section) for k, v in zip(value.keys, value.values) if _is_string(k)]
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
                             for k, v in zip(arg.keys, arg.values) if _is_string(k)]
                else:
                    args.append(ast.Arg(self.span(arg), self.hf_word(arg)))
            args += [ast.Arg(self.span(k), self.hf_word(k.value), k.arg, "=") for k in node.keywords]
            return ast.Call(self.span(node), ast.Name(self.span(node.func), node.func.id), args)
        if isinstance(node, py.List):
            return ast.ListExpr(self.span(node), [self.hf_value(e) for e in node.elts])
        if isinstance(node, py.Constant):
            return _constant(node.value, self.span(node), self, node)
        raise self.error(node, "a mapping value is a string, a number, a list or a call such as fuse(...)")

    def hf_word(self, node: py.expr) -> ast.Expr:
        """A call argument in a mapping: a dotted tensor name stays a string, an identifier is a word."""
        if _is_string(node) and node.value.isidentifier():
            return ast.Name(self.inner(node), node.value)
        return self.hf_value(node)

    # ------------------------------------------------------------------ expressions
    def tensor_type(self, node: py.expr) -> ast.Expr:
        """``Tensor["B", "T", "d"]`` (a dtype last: ``Tensor["T", "fp32"]``) as the shape ``[B, T, d]``."""
        if not _subscript_of(node, "Tensor"):
            raise self.error(node, "a tensor type is Tensor[dims...]", "e.g. Tensor[\"B\", \"T\", \"d_model\"]")
        return ast.ListExpr(self.span(node), [self.dimension(d) for d in _subscripts(node)])

    def dimension(self, node: py.expr) -> ast.Expr:
        if _is_string(node) and node.value.strip() == "*":
            return ast.Star(self.inner(node))
        return self.value(node)

    def value(self, node: py.expr) -> ast.Expr:
        """An expression of the parameters, where a string holds one (``"D // 2"``)."""
        if not _is_string(node):
            return self.expr(node)
        try:
            inner = py.parse(node.value.strip(), mode="eval").body
        except SyntaxError:
            raise self.error(node, f"'{node.value}' is not an expression of the parameters") from None
        return _InString(self, node).expr(inner)

    def expr(self, node: py.expr) -> ast.Expr:
        span = self.span(node)
        if isinstance(node, py.Constant):
            return _constant(node.value, span, self, node)
        if isinstance(node, py.Name):
            return self.aliases.get(node.id, ast.Name(span, node.id))
        if _self_attribute(node):
            return self.aliases.get(node.attr, ast.Name(span, node.attr))
        if isinstance(node, py.BinOp) and type(node.op) in OPERATORS:
            return ast.Binary(span, OPERATORS[type(node.op)], self.expr(node.left), self.expr(node.right))
        if isinstance(node, py.UnaryOp) and isinstance(node.op, py.USub) and isinstance(node.operand, py.Constant):
            return ast.Unary(span, "-", self.expr(node.operand))
        if isinstance(node, py.UnaryOp) and isinstance(node.op, (py.USub, py.Not)):
            return ast.Unary(span, "-" if isinstance(node.op, py.USub) else "not", self.expr(node.operand))
        if isinstance(node, py.BoolOp):
            result = self.expr(node.values[0])
            for value in node.values[1:]:
                result = ast.Binary(span, OPERATORS[type(node.op)], result, self.expr(value))
            return result
        if isinstance(node, py.Compare) and len(node.ops) == 1 and type(node.ops[0]) in OPERATORS:
            return ast.Binary(span, OPERATORS[type(node.ops[0])], self.expr(node.left), self.expr(node.comparators[0]))
        if isinstance(node, (py.List, py.Tuple)):
            items = [self.value(e) for e in node.elts]
            return ast.ListExpr(span, items) if isinstance(node, py.List) else ast.TupleExpr(span, items)
        if isinstance(node, py.Call) and isinstance(node.func, py.Name):
            args = [ast.Arg(self.span(a), self.value(a)) for a in node.args]
            return ast.Call(span, ast.Name(self.span(node.func), node.func.id), args)
        raise self.error(node, "not an expression the DSL takes here (names, numbers, strings, arithmetic, "
                         "comparisons, lists)")


class _InString(Translator):
    """An expression parsed from inside a string literal, spanned where it lies in the file."""

    def __init__(self, outer: Translator, literal: py.Constant):
        super().__init__(outer.source)
        self.aliases = outer.aliases
        inner = outer.inner(literal)
        self.line, self.column = inner.line, inner.column + (len(literal.value) - len(literal.value.lstrip()))
        self.single_line = literal.end_lineno == literal.lineno

    def span(self, node: Any) -> Span:
        if not self.single_line:
            return super().span(node)
        start = getattr(node, "col_offset", 0)
        end = getattr(node, "end_col_offset", None) or start
        return Span(self.source, self.line, self.column + start, self.line, self.column + end)


class _NamedOutput(ast.Node):
    """``return name`` ending a forward graph: the output is named ``name``."""

    def __init__(self, span: Span, name: str):
        super().__init__(span)
        self.name = name


def _constant(value: Any, span: Span, translator: Translator, node: py.expr) -> ast.Expr:
    if isinstance(value, bool):
        return ast.Bool(span, value)
    if isinstance(value, int):
        return ast.Int(span, value)
    if isinstance(value, float):
        return ast.Float(span, value)
    if isinstance(value, str):
        return ast.Str(span, value)
    if value is None:
        return ast.NoneLit(span)
    raise translator.error(node, f"{value!r} is not a value the DSL takes")


def _backward_of(func: py.FunctionDef) -> str | None:
    """``@name.backward`` on a function: the primitive ``name`` it is the backward of."""
    for decorator in func.decorator_list:
        if isinstance(decorator, py.Attribute) and decorator.attr == "backward" and isinstance(decorator.value, py.Name):
            return decorator.value.id
    return None


def _kind(node: py.ClassDef) -> str | None:
    return next((_called_name(d) for d in node.decorator_list if _called_name(d) in KINDS), None)


def _name(name: str) -> str:
    return KEYWORD_NAMES.get(name, name)


def _called_name(node: py.expr) -> str | None:
    target = node.func if isinstance(node, py.Call) else node
    if isinstance(target, py.Name):
        return target.id
    if isinstance(target, py.Attribute):
        return target.attr
    return None


def _has(func: py.FunctionDef, decorator: str) -> bool:
    return any(_called_name(d) == decorator for d in func.decorator_list)


def _docstring(stmt: py.stmt) -> bool:
    return isinstance(stmt, py.Expr) and isinstance(stmt.value, py.Constant)


def _is_param(stmt: py.stmt) -> bool:
    return (isinstance(stmt, py.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], py.Name)
            and isinstance(stmt.value, py.Call) and _called_name(stmt.value) == "Param")


def _is_with(stmt: py.With, name: str, builder: str | None = None) -> bool:
    """``with graph() as g:`` (a builder name bound), or ``with g.recompute():``."""
    item = stmt.items[0] if len(stmt.items) == 1 else None
    if item is None or _called_name(item.context_expr) != name:
        return False
    if builder is None:
        return isinstance(item.optional_vars, py.Name)
    func = item.context_expr.func if isinstance(item.context_expr, py.Call) else None
    return isinstance(func, py.Attribute) and isinstance(func.value, py.Name) and func.value.id == builder


LIST_CALLS = {"save": "save", "mark_recompute": "recompute"}  # g.save(...), g.mark_recompute(...)


def _list_call(stmt: py.stmt, g: str) -> py.Call | None:
    """``g.save("x")`` or ``g.mark_recompute("h")`` as a statement."""
    call = stmt.value if isinstance(stmt, py.Expr) else None
    if isinstance(call, py.Call) and isinstance(call.func, py.Attribute) and call.func.attr in LIST_CALLS \
            and isinstance(call.func.value, py.Name) and call.func.value.id == g:
        return call
    return None


def _list_calls(body: list[py.stmt], g: str) -> list[py.Call]:
    found = []
    for stmt in body:
        if isinstance(stmt, py.If):
            found += _list_calls(stmt.body, g) + _list_calls(stmt.orelse, g)
        elif _list_call(stmt, g) is not None:
            found.append(_list_call(stmt, g))
    return found


def _is_step(call: py.Call, g: str) -> bool:
    """``g.prim(...)`` or ``self.sub(...)``."""
    func = call.func
    return (isinstance(func, py.Attribute) and isinstance(func.value, py.Name) and func.value.id == g
            and func.attr != "saved") or _self_attribute(func)


def _is_tensor(node: py.expr, g: str) -> bool:
    return isinstance(node, py.Name) or _is_string(node) or _self_attribute(node) or _is_saved(node, g)


def _is_saved(node: py.expr, g: str) -> bool:
    return (isinstance(node, py.Call) and isinstance(node.func, py.Attribute) and node.func.attr == "saved"
            and isinstance(node.func.value, py.Name) and node.func.value.id == g and len(node.args) == 1
            and _is_string(node.args[0]))


def _is_string(node: Any) -> bool:
    return isinstance(node, py.Constant) and isinstance(node.value, str)


def _self_attribute(node: py.expr) -> bool:
    return isinstance(node, py.Attribute) and isinstance(node.value, py.Name) and node.value.id == "self"


def _subscript_of(node: Any, name: str) -> bool:
    return isinstance(node, py.Subscript) and isinstance(node.value, py.Name) and node.value.id == name


def _subscripts(node: py.Subscript) -> list[py.expr]:
    return list(node.slice.elts) if isinstance(node.slice, py.Tuple) else [node.slice]
