"""The Python decorator DSL read into the Module DSL's AST.

A ``.py`` file is never run to be lowered: its source is parsed with Python's ``ast``, and each
class decorated ``@module``, ``@block`` or ``@model`` (and each function decorated ``@primitive``,
:mod:`.primitives`) becomes the :class:`modeldsl.frontend.text.ast.Decl` the text frontend builds for
its twin, every node spanned
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
- The builder calls that are not one primitive (``g.matmul_bias``, ``g.call``, ``g.custom``,
  ``out_name=``, ...) are rewritten first (:mod:`.builder`); ``@param`` methods are ``Param``
  attributes, ``Array["n", "Block"]`` binds the block's parameters by name (:func:`bind_by_name`),
  ``@hf_mapping.indexed`` and ``Param(hf_mapping=)`` join the model's ``hf_mapping:``, and
  ``Gradient`` slots check their tensors' types (:mod:`.slots`).

An unknown decorator is E008 with the closest known one (:mod:`.decorators`), an unknown builder
call E014; anything else the DSL does not take is E001 at its place, naming what it takes there.
"""

from __future__ import annotations

import ast as py
from pathlib import Path
from typing import Any

from modeldsl.diagnostics import Diagnostic, DiagnosticError, Source, Span
from modeldsl.dialects.annotations import ANNOTATION_BY_NAME
from modeldsl.files import read_regular_file
from modeldsl.frontend.python.builder import BuilderCalls
from modeldsl.frontend.python.decorators import BLOCK_MAPPINGS, HF_SECTIONS, KINDS, Decorators, decorator_name
from modeldsl.frontend.python.hf import HuggingFaceSections
from modeldsl.frontend.python.nodes import (
    KEYWORD_NAMES,
    annotation_name,
    called_name,
    is_annotation,
    is_docstring,
    is_string,
    self_attribute,
    subscript_of,
    subscripts,
)
from modeldsl.frontend.python.primitives import Primitives
from modeldsl.frontend.python.slots import apply_gradient_slots, apply_slots, is_gradient_slot, is_slot
from modeldsl.frontend.text import ast

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
    translator.file_names = _file_names(tree)
    items: list[Any] = []
    backwards = {_backward_of(node): node for node in tree.body if isinstance(node, py.FunctionDef)
                 and _backward_of(node) is not None}
    for node in tree.body:
        if isinstance(node, py.ImportFrom):
            items += translator.imports(node)
        elif isinstance(node, py.ClassDef) and _kind(node) is not None:
            items.append(translator.declaration(node))
        elif isinstance(node, py.ClassDef):
            translator.check_undeclared_class(node)
        elif isinstance(node, py.FunctionDef) and any(called_name(d) == "primitive" for d in node.decorator_list):
            items.append(translator.primitive(node, backwards.get(node.name)))
    program = ast.Program(Span(source, 1, 1, 1, 1), source, items)
    program.by_name = bind_by_name(translator.by_name, {d.name: d for d in program.declarations})
    return program


def _file_names(tree: py.Module) -> set[str]:
    """The names a file's classes and imports bind."""
    names = {node.name for node in tree.body if isinstance(node, (py.ClassDef, py.FunctionDef))}
    for node in tree.body:
        if isinstance(node, (py.Import, py.ImportFrom)):
            names |= {alias.asname or alias.name.split(".")[0] for alias in node.names}
    return names


def bind_by_name(pending: list[tuple[ast.Call, set[str]]], declared: dict[str, ast.Decl]
                 ) -> list[tuple[ast.Call, set[str]]]:
    """``Array["n_layers", "Block"]``: the element is ``Block`` with each of its parameters that the
    declaration holding the stack also has, bound by name (``Block(d_model=d_model, ...)``); a
    parameter it lacks is the lowering's E012. A block ``declared`` lacks (an imported one) is left:
    the stacks returned are bound by the resolver, in the file's namespace
    (:meth:`modeldsl.resolve.imports.Resolver.namespace`)."""
    left = []
    for call, names in pending:
        decl = declared.get(call.func.id)
        if decl is None:
            left.append((call, names))
        for param in (decl.params or []) if decl is not None else []:
            if param.name in names:
                call.args.append(ast.Arg(call.span, ast.Name(call.span, param.name), param.name, "="))
    return left


class Translator(HuggingFaceSections, Primitives, BuilderCalls, Decorators):
    """The decorated classes and functions of one file as Module DSL declarations."""

    def __init__(self, source: Source):
        super().__init__(source)
        self.by_name: list[tuple[ast.Call, set[str]]] = []  # stacks of "Block" to bind by name
        self.names: set[str] = set()  # the parameters and let names of the class being read
        self.mappings: list[ast.Stmt] = []  # its parameters' hf_mapping=

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
        self.aliases, self.mappings = {}, []
        self.check_class_words(node)
        self.members = {name: member_type for name, member_type in _members(node)}
        body: list[ast.Stmt] = []
        doc = py.get_docstring(node, clean=True)
        if doc is not None:
            body.append(ast.ExprStmt(self.span(node.body[0]), ast.Str(self.span(node.body[0]), doc)))
        annotations = [self.decorator_annotation(d) for d in node.decorator_list
                       if called_name(d) in ANNOTATION_BY_NAME]
        if annotations:
            body.append(ast.AnnotationStmt(annotations[0].span, annotations))
        extends = self.extends(node)
        init = next((s for s in node.body if isinstance(s, py.FunctionDef) and s.name == "__init__"), None)
        params, let = self.signature(init) if init is not None else ([], [])
        self.names = {p.name for p in params} | {b.name for b in let if isinstance(b, ast.Binding)}
        if let:
            body.append(self.section(init, "let", let))
        entries = [self.parameter(s, added=extends is not None) if isinstance(s, py.Assign)
                   else self.method_parameter(s, added=extends is not None) for s in node.body if _is_param(s)]
        if entries:
            body.append(self.section(node, "params", entries))
        functions = {name: next((s for s in node.body if isinstance(s, py.FunctionDef) and _has(s, name)), None)
                     for name in ("forward", "backward")}
        slots = [s for s in node.body if is_slot(s)]
        gradients = [s for s in node.body if is_gradient_slot(s)]
        if functions["forward"] is not None:
            body.append(self.forward(functions["forward"]))
            apply_slots(self, slots, body[-1])
            apply_gradient_slots(self, gradients, body[-1], slots)
        elif slots or gradients:
            raise self.error((slots or gradients)[0], "activation and gradient slots name tensors of the forward "
                             "graph, which this class lacks")
        body += self.hf_sections(node, _kind(node) or "module")
        if functions["backward"] is not None:
            body.append(self.backward(functions["backward"], functions["forward"]))
        abstract = any(called_name(d) == "abstract" for d in node.decorator_list)
        return ast.Decl(self.span(node), _kind(node) or "module", node.name, params, body, extends, abstract)

    def hf_sections(self, node: py.ClassDef, kind: str) -> list[ast.Section]:
        """``@hf_config``, ``@hf_export``, and one ``hf_mapping`` (where the first ``@hf_mapping`` is) of
        ``@hf_mapping``, ``@hf_mapping.indexed``, ``_hf_block_mappings_`` and the parameters' ``hf_mapping=``."""
        sections: list[ast.Section] = []
        mapping: ast.Section | None = None
        for decorator in node.decorator_list:
            name = decorator_name(decorator)
            if name in ("hf_mapping", "hf_mapping.indexed"):
                entries = self.hf_section(decorator).body if name == "hf_mapping" else self.indexed_mapping(decorator)
                if mapping is None:
                    mapping = self.section(decorator, "hf_mapping", [])
                    sections.append(mapping)
                mapping.body += entries
            elif name in HF_SECTIONS:
                sections.append(self.hf_section(decorator))
        extra = [e for stmt in node.body if _is_block_mappings(stmt) for e in self.block_mappings(stmt)]
        extra += self.mappings
        if extra and mapping is None:
            mapping = self.section(node, "hf_mapping", [])
            sections.append(mapping)
        if mapping is not None:
            mapping.body += extra
            if kind != "model":
                raise DiagnosticError([Diagnostic("E010", f"a {kind} has no HuggingFace mapping of its own",
                                                  mapping.body[0].span, "map the checkpoint in the model that holds "
                                                  "it: @hf_mapping.indexed(\"blocks\", name=\"...{layer}...\")")])
            self.check_mapped_once(mapping.body)
        return sections

    def method_parameter(self, func: py.FunctionDef, added: bool = False) -> ast.Section:
        """``@param def weight(self) -> Tensor[...]: ...`` (``@param(frozen=True)``, ``@param(condition=lambda
        self: self.use_bias)``, ``@tied_to("embedding")``): the parameter ``weight``, as ``Param(...)``."""
        if len(func.args.args) != 1 or func.args.vararg or func.args.kwarg or func.args.kwonlyargs:
            raise self.error(func, f"a @param method takes self only: def {func.name}(self) -> Tensor[...]")
        if any(not is_docstring(s) and not isinstance(s, py.Pass) for s in func.body):
            raise self.error(func.body[0], "a @param method's body is ... (its type is its return annotation)")
        decorator = next(d for d in func.decorator_list if decorator_name(d) == "param")
        tied = next((d for d in func.decorator_list if decorator_name(d) == "tied_to"), None)
        if tied is not None:
            kind = py.copy_location(py.Call(tied.func, tied.args, tied.keywords), tied) if isinstance(tied, py.Call) \
                else tied
        elif func.returns is not None:
            kind = func.returns
        else:
            raise self.error(func, f"@param {func.name} has no type", "annotate it: -> Tensor[\"d\"]")
        keywords = decorator.keywords if isinstance(decorator, py.Call) else []
        keywords = [py.copy_location(py.keyword("when", k.value), k) if k.arg == "condition" else k
                    for k in keywords]
        if isinstance(decorator, py.Call) and decorator.args:
            raise self.error(decorator.args[0], "@param takes keywords: @param(frozen=True, condition=...)")
        call = py.copy_location(py.Call(py.Name("Param", py.Load()), [kind], keywords), func)
        stmt = py.copy_location(py.Assign([py.copy_location(py.Name(func.name, py.Store()), func)], call), func)
        return self.parameter(stmt, added)

    def extends(self, node: py.ClassDef) -> str | None:
        """``@extends("Base")``: the declaration this one inherits from."""
        for decorator in node.decorator_list:
            if called_name(decorator) == "extends":
                if not (isinstance(decorator, py.Call) and len(decorator.args) == 1 and is_string(decorator.args[0])):
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
        if not (isinstance(stmt, py.Assign) and len(stmt.targets) == 1 and self_attribute(stmt.targets[0])):
            raise self.error(stmt, "__init__ names values of the parameters: self.NAME = expression, self.NAME = "
                             "Dim(\"expr\"), assert condition, \"message\"")
        name, value = stmt.targets[0].attr, stmt.value
        if isinstance(value, py.Call) and called_name(value) == "Dim" and len(value.args) == 1:
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
                guard = self.condition(keyword.value)
            elif keyword.arg == "hf_mapping":
                self.mappings.append(self.hf_entry(target.id, keyword.value, keyword, "hf_mapping"))
            elif keyword.arg == "restate" and isinstance(keyword.value, py.Constant):
                added = added and not keyword.value.value
            elif keyword.arg in ANNOTATION_BY_NAME:
                annotations.append(self.annotation(keyword))
            else:
                raise self.error(keyword, f"Param takes no '{keyword.arg}'",
                                 "give when= for a conditional parameter, hf_mapping= for its checkpoint tensor, or "
                                 "an annotation (frozen=True, ...)")
        entry = self.entry(stmt, target.id, self.param_type(call.args[0]), guard, annotations)
        entry.added = added
        return entry

    def condition(self, node: py.expr) -> ast.Expr:
        """``when="use_bias"``, or a callable: ``lambda self: self.use_bias``."""
        if isinstance(node, py.Lambda):
            if [a.arg for a in node.args.args] != ["self"]:
                raise self.error(node, "a condition is a lambda of self: lambda self: self.use_bias")
            return self.expr(node.body)
        return self.value(node)

    def param_type(self, node: py.expr) -> ast.Expr:
        if subscript_of(node, "Tensor"):
            return self.tensor_type(node)
        if subscript_of(node, "Array"):
            if len(subscripts(node)) != 2:
                raise self.error(node, "an array is Array[count, Block(...)] or Array[count, \"Block\"]")
            count, element = subscripts(node)
            return ast.ArrayType(self.span(node), self.value(count), self.element(element))
        if isinstance(node, py.Call):
            return self.instance(node)
        raise self.error(node, "a parameter's type is Tensor[...], a module (Module(args)), Array[n, Block(args)] "
                         "or tied_to(\"name\")")

    def element(self, node: py.expr) -> ast.Expr:
        """A stack's element: ``Block("d")``, or ``"Block"`` / ``Block`` (its parameters bound by name,
        :func:`bind_by_name`)."""
        if (is_string(node) and node.value.isidentifier()) or isinstance(node, py.Name):
            name = node.value if is_string(node) else node.id
            span = self.inner(node) if is_string(node) else self.span(node)
            call = ast.Call(span, ast.Name(span, name), [])
            self.by_name.append((call, set(self.names)))
            return call
        return self.instance(node)

    def instance(self, node: py.expr) -> ast.Expr:
        """``RMSNorm("d_model", "eps")``: a submodule with its arguments (strings are expressions)."""
        if not (isinstance(node, py.Call) and isinstance(node.func, py.Name)):
            raise self.error(node, "a submodule is its declaration called with its arguments: RMSNorm(\"d\")")
        args = [ast.Arg(self.span(a), self.value(a)) for a in node.args]
        args += [ast.Arg(self.span(k), self.value(k.value), k.arg, "=") for k in node.keywords]
        return ast.Call(self.span(node), ast.Name(self.span(node.func), node.func.id), args)

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
        """``out: [...]``, or ``out: name: [...]`` when the graph ends with ``return name``; an
        ``outputs:`` section of ``name: [...]`` entries for ``-> tuple[...]`` and ``return a, b``."""
        if func.returns is None:
            raise self.error(func, f"{func.name} has no output type", "annotate it: -> Tensor[\"B\", \"T\", \"d\"]")
        if subscript_of(func.returns, "tuple"):
            return self.outputs(func, steps)
        shape = self.tensor_type(func.returns)
        named = steps[-1] if steps and isinstance(steps[-1], _NamedOutput) else None
        if named is None:
            return self.entry(func.returns, "out", shape)
        steps.pop()
        field = ast.NamedField(named.span, named.name, shape)
        return self.entry(func.returns, "out", field)

    def outputs(self, func: py.FunctionDef, steps: list[ast.Stmt]) -> ast.Section:
        types = subscripts(func.returns)
        named = steps.pop() if steps and isinstance(steps[-1], _NamedOutput) else None
        if named is None or len(named.names) != len(types):
            raise self.error(func.returns, f"{func.name} gives {len(types)} outputs: its graph ends with "
                             f"return {', '.join(f'out{i}' for i in range(len(types)))}",
                             "return one name per tensor of the tuple")
        return self.section(func, "outputs", [self.entry(t, name, self.tensor_type(t))
                                              for name, t in zip(named.names, types)])

    def backward(self, func: py.FunctionDef, forward: py.FunctionDef | None) -> ast.Section:
        """Its arguments are the gradients it takes (``d_out``); it gives ``d_`` and each forward input."""
        body: list[ast.Stmt] = [self.entry(a, _name(a.arg), self.tensor_type(a.annotation))
                                for a in self.arguments(func)]
        forward_inputs = [_name(a.arg) for a in forward.args.args[1:]] if forward is not None else ["in"]
        returns = func.returns
        types = subscripts(returns) if returns is not None and subscript_of(returns, "tuple") else [returns]
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
        calls = [(d, called_name(d)) for d in func.decorator_list if called_name(d) in ("save", "recompute")]
        block = next((s for s in func.body if isinstance(s, py.With) and _is_with(s, "graph")), None)
        if block is not None:
            g = block.items[0].optional_vars.id
            calls += [(c, LIST_CALLS[c.func.attr]) for c in _list_calls(block.body, g)]
        entries: dict[str, tuple[py.AST, list[ast.Expr]]] = {}
        for call, kind in calls:
            in_graph = call not in func.decorator_list
            if not isinstance(call, py.Call) or not all(is_string(a) or (in_graph and isinstance(a, py.Name))
                                                        for a in call.args):
                raise self.error(call, f"{kind} lists name tensors by string: @{kind}(\"x\", \"rstd\")")
            names = entries.setdefault(kind, (call, []))[1]
            names += [ast.Name(self.inner(a), _name(a.value)) if is_string(a)
                      else ast.Name(self.span(a), self.tensor_name(a.id)) for a in call.args]
        return [self.entry(where, kind, ast.ListExpr(self.span(where), names))
                for kind, (where, names) in entries.items()]

    # ------------------------------------------------------------------ graphs
    def graph(self, func: py.FunctionDef) -> list[ast.Stmt] | None:
        """The steps of ``with graph() as g:``; None for a body of ``...`` (an abstract declaration's)."""
        statements = [s for s in func.body if not is_docstring(s)]
        if not statements:
            return None
        after = statements[1] if len(statements) == 2 and isinstance(statements[1], py.Return) else None
        if len(statements) != 1 + (after is not None) or not isinstance(statements[0], py.With) \
                or not _is_with(statements[0], "graph"):
            raise self.error(func, f"{func.name}'s body is one `with graph() as g:` block (and a `return` after it)")
        block = statements[0]
        g = block.items[0].optional_vars.id
        self.renames = {}
        steps = self.statements(block.body, g)
        ending = self.ending(block, after, g)
        if ending is not None and func.name == "forward":
            names = ending.elts if isinstance(ending, py.Tuple) else [ending]
            plain = all(isinstance(e, py.Name) for e in names)
            if plain and (len(names) > 1 or self.tensor_name(names[0].id) != "out"):
                steps.append(_NamedOutput(self.span(ending), *(self.tensor_name(e.id) for e in names)))
        return steps

    def ending(self, block: py.With, after: py.Return | None, g: str) -> py.expr | None:
        """What a graph returns: ``return x`` ending the ``with`` block or after it, or ``g.output(x)``."""
        last = block.body[-1] if block.body else None
        output = last.value if isinstance(last, py.Expr) and _is_output(last.value, g) else None
        inside = last.value if isinstance(last, py.Return) else None
        if output is not None:
            if output.keywords or not output.args:
                raise self.error(output, f"{g}.output names the outputs: {g}.output(y) or {g}.output(a, b)")
            inside = output.args[0] if len(output.args) == 1 else py.copy_location(py.Tuple(output.args, py.Load()),
                                                                                     output)
        if after is not None and inside is not None:
            raise self.error(after, "the graph already returns its outputs", "return once")
        return after.value if after is not None else inside

    def statements(self, body: list[py.stmt], g: str) -> list[ast.Stmt]:
        steps = [self.statement(s, g) for s in body
                 if not is_docstring(s) and not isinstance(s, py.Return) and _list_call(s, g) is None
                 and not (isinstance(s, py.Expr) and _is_output(s.value, g))]
        return [s for s in steps if s is not None]

    def statement(self, stmt: py.stmt, g: str) -> ast.Stmt | None:
        if isinstance(stmt, py.Assign) and len(stmt.targets) == 1:
            target = stmt.targets[0]
            if isinstance(stmt.value, py.Call):
                if self.input_alias(stmt.value, target, g):
                    return None
                call = self.output_names(stmt.value, target)
                call = self.rewritten(call, g, len(target.elts) if isinstance(target, py.Tuple) else 1)
                return self.flow(stmt, call, self.destination(target), g)
            return ast.Flow(self.span(stmt), [self.tensor(stmt.value, g), self.destination(target)])
        if isinstance(stmt, py.If):
            return ast.If(self.span(stmt), self.expr(stmt.test), self.statements(stmt.body, g),
                          self.statements(stmt.orelse, g) if stmt.orelse else None)
        if isinstance(stmt, py.With) and _is_with(stmt, "recompute", g):
            return self.section(stmt, "recompute", self.statements(stmt.body, g))
        raise self.error(stmt, f"a graph takes `name = {g}.primitive(...)`, `name = self.submodule(...)`, "
                         f"`name = other`, if/else on the parameters, `with {g}.recompute():` and `return name`")

    def destination(self, target: py.expr) -> ast.Expr:
        if isinstance(target, py.Name):
            return ast.Name(self.span(target), self.tensor_name(target.id))
        if isinstance(target, py.Tuple) and all(isinstance(e, py.Name) for e in target.elts):
            return ast.TupleExpr(self.span(target), [ast.Name(self.span(e), self.tensor_name(e.id))
                                                     for e in target.elts])
        raise self.error(target, "a graph step writes a name or a tuple of names")

    def flow(self, stmt: py.stmt, call: py.Call, destination: ast.Expr, g: str) -> ast.Flow:
        """One step, or a chain of them when a step's first argument is another step
        (``g.matmul(g.silu(h), "w2")`` is ``h -> silu() -> matmul(w2) -> ...``)."""
        annotations = [self.annotation(k) for k in call.keywords if is_annotation(k, call)]
        return ast.Flow(self.span(stmt), self.stages(call, g) + [destination], annotations)

    def stages(self, call: py.Call, g: str) -> list[ast.Expr]:
        """The chain's source and steps up to ``call``."""
        first = call.args[0] if call.args else None
        if isinstance(first, py.Call) and _is_step(first, g):
            inner = self.stages(first, g)
            annotations = [self.annotation(k) for k in first.keywords if is_annotation(k, first)]
            if annotations:
                inner[-1] = ast.Annotated(inner[-1].span, inner[-1], annotations)
            return inner + [self.step(call, call.args[1:], g, chained=True)]
        tensors = [self.tensor(a, g) for a in call.args if _is_tensor(a, g)]
        if not tensors and not self_attribute(call.func) and not call.args:  # a constant: g.zeros(shape=[...])
            return [self.step(call, [], g, chained=False)]
        if not tensors:
            raise self.error(call, "a graph step takes at least one input tensor")
        source = tensors[0] if len(tensors) == 1 else ast.TupleExpr(self.span(call), tensors)
        return [source, self.step(call, [a for a in call.args if not _is_tensor(a, g)], g, chained=False)]

    def step(self, call: py.Call, args: list[py.expr], g: str, chained: bool) -> ast.Expr:
        """The step ``call`` is, with ``args`` inside it: its non-tensor arguments, and in a chain also
        the tensors other than the one flowing in (``matmul(w2, transpose=NT)``)."""
        func = call.func
        keywords = [k for k in call.keywords if not is_annotation(k, call)]
        if self_attribute(func) and not keywords and not args:
            return ast.Name(self.span(func), func.attr)
        if not (isinstance(func, py.Attribute) and isinstance(func.value, py.Name) and func.value.id == g):
            raise self.error(func, f"a graph step calls a primitive on `{g}` ({g}.matmul(...)) or a submodule "
                             "(self.name(...)) with its input tensors")
        inside = [ast.Arg(self.span(a), self.tensor(a, g) if chained and _is_tensor(a, g) else self.value(a))
                  for a in args]
        keyword_args = [self.keyword(k) for k in keywords]
        return ast.Call(self.span(func), ast.Name(self.span(func), func.attr), inside + keyword_args)

    def tensor(self, node: py.expr, g: str) -> ast.Expr:
        if isinstance(node, py.Name):
            return ast.Name(self.span(node), self.tensor_name(node.id))
        if is_string(node):
            return ast.Name(self.inner(node), node.value)
        if self_attribute(node):
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
        value, name = keyword.value, annotation_name(keyword.arg)
        if isinstance(value, py.Constant) and value.value is True:
            return ast.Annotation(self.span(keyword), name, [])
        items = value.elts if isinstance(value, py.Tuple) else [value]
        if name == "assert":  # assert_=("!has_nan(out)", "why"): the condition and message as written
            return ast.Annotation(self.span(keyword), name, [a for item in items for a in self.text_args(item)])
        args = [a for item in items for a in self.annotation_args(item)]
        return ast.Annotation(self.span(keyword), name, args)

    def text_args(self, item: py.expr) -> list[ast.Arg]:
        """Arguments whose strings are text (an ``@assert``'s condition and message), not expressions."""
        def text(v: py.expr) -> ast.Expr:
            return ast.Str(self.span(v), v.value) if is_string(v) else self.word(v)
        if isinstance(item, py.Dict):
            return [ast.Arg(self.span(v), text(v), k.value, "=") for k, v in zip(item.keys, item.values)
                    if is_string(k)]
        return [ast.Arg(self.span(item), text(item))]

    def decorator_annotation(self, decorator: py.expr) -> ast.Annotation:
        """``@checkpoint``, ``@memory("save")``, ``@shard("column", tp_size="tp_size")`` on a class."""
        name = called_name(decorator)
        if not isinstance(decorator, py.Call):
            return ast.Annotation(self.span(decorator), name, [])
        args = [a for item in decorator.args for a in self.annotation_args(item)]
        args += [ast.Arg(self.span(k), self.word(k.value), k.arg, "=") for k in decorator.keywords]
        return ast.Annotation(self.span(decorator), name, args)

    def annotation_args(self, item: py.expr) -> list[ast.Arg]:
        if isinstance(item, py.Dict):
            return [ast.Arg(self.span(v), self.word(v), k.value, "=") for k, v in zip(item.keys, item.values)
                    if is_string(k)]
        return [ast.Arg(self.span(item), self.word(item))]


class _NamedOutput(ast.Node):
    """``return name`` (``return a, b``) ending a forward graph: the output is named ``name`` (the
    outputs ``a``, ``b``)."""

    def __init__(self, span: Span, *names: str):
        super().__init__(span)
        self.names = names
        self.name = names[0]


def _backward_of(func: py.FunctionDef) -> str | None:
    """``@name.backward`` on a function: the primitive ``name`` it is the backward of."""
    for decorator in func.decorator_list:
        if isinstance(decorator, py.Attribute) and decorator.attr == "backward" \
                and isinstance(decorator.value, py.Name):
            return decorator.value.id
    return None


def _kind(node: py.ClassDef) -> str | None:
    return next((called_name(d) for d in node.decorator_list if called_name(d) in KINDS), None)


def _name(name: str) -> str:
    return KEYWORD_NAMES.get(name, name)


def _has(func: py.FunctionDef, decorator: str) -> bool:
    return any(called_name(d) == decorator for d in func.decorator_list)


def _is_param(stmt: py.stmt) -> bool:
    """``name = Param(...)`` or a ``@param`` method."""
    if isinstance(stmt, py.FunctionDef):
        return any(decorator_name(d) == "param" for d in stmt.decorator_list)
    return (isinstance(stmt, py.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], py.Name)
            and isinstance(stmt.value, py.Call) and called_name(stmt.value) == "Param")


def _members(node: py.ClassDef) -> list[tuple[str, py.expr]]:
    """The class's parameters by name, with their types (``Tensor[...]``, ``Array[...]``, a module call)."""
    found = []
    for stmt in node.body:
        if isinstance(stmt, py.Assign) and _is_param(stmt) and stmt.value.args:
            found.append((stmt.targets[0].id, stmt.value.args[0]))
        elif isinstance(stmt, py.FunctionDef) and _is_param(stmt) and stmt.returns is not None:
            found.append((stmt.name, stmt.returns))
    return found


def _is_block_mappings(stmt: py.stmt) -> bool:
    return isinstance(stmt, py.Assign) and isinstance(stmt.targets[0], py.Name) and stmt.targets[0].id == BLOCK_MAPPINGS


def _is_output(node: py.expr, g: str) -> bool:
    """``g.output(...)``."""
    return isinstance(node, py.Call) and isinstance(node.func, py.Attribute) and node.func.attr == "output" \
        and isinstance(node.func.value, py.Name) and node.func.value.id == g


def _is_with(stmt: py.With, name: str, builder: str | None = None) -> bool:
    """``with graph() as g:`` (a builder name bound), or ``with g.recompute():``."""
    item = stmt.items[0] if len(stmt.items) == 1 else None
    if item is None or called_name(item.context_expr) != name:
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
            and func.attr != "saved") or self_attribute(func)


def _is_tensor(node: py.expr, g: str) -> bool:
    return isinstance(node, py.Name) or is_string(node) or self_attribute(node) or _is_saved(node, g)


def _is_saved(node: py.expr, g: str) -> bool:
    return (isinstance(node, py.Call) and isinstance(node.func, py.Attribute) and node.func.attr == "saved"
            and isinstance(node.func.value, py.Name) and node.func.value.id == g and len(node.args) == 1
            and is_string(node.args[0]))
