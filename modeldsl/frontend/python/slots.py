"""Activation and gradient slots of the Python DSL (its section 10) as the memory hints the recompute
pass reads and the types lowering checks.

``ln1_rstd = Activation(Tensor["B", "T"], dtype="fp32", save=True)`` names a tensor of the
forward graph and says what the backward does with it:

- ``save=True``: it is in the forward's ``save:`` list; ``recompute=True``: in its ``recompute:``
  list (both: ``recompute:``, the policy saying when it is saved instead);
- ``recompute_policy="lora_only"`` / ``"never"``: the step that writes it carries
  ``@memory(recompute, policy=...)`` (a step's memory hint covers all its outputs, so slots of one
  step must agree);
- ``recompute_group="g"``: the slots of a group are outputs of one step, which is recomputed as one;
- its type (with ``dtype=``): where its step writes only it, the chain states it
  (``... -> [B, T, fp32] -> ln1_rstd``), so lowering checks it (E005 when it differs);
- ``when="cond"``: the slot exists where the graph writes it (a step under ``if cond:``).

``recompute_from``, ``recompute_op``, ``recompute_attrs``, ``recompute_outputs``,
``lora_targets``, ``shares_with`` and ``aliases`` are E001: the recompute pass finds what a step
reads from the graph and replays the step itself, and tensors have one name.

``d_ln1 = Gradient(Tensor["B", "T", "C"], gradient_of="ln1")`` (section 10.2) declares the type of
the gradient of a forward tensor, which is that tensor's type: ``gradient_of`` must name a tensor of
the forward graph or one of its inputs (E002 with the closest name), and the type is checked there
(stated on the step writing it, as an ``Activation``'s; an input's written type must be it, else
E018). ``when=``, ``scope="gradient"`` / ``"global_gradient"`` and ``description=`` are taken;
``dtype=``, ``shares_with=`` and ``alias_of=`` are E001: a gradient's dtype is the training step's,
the memory planner shares buffers, and a tensor has one name.
"""

from __future__ import annotations

import ast as py
import difflib
from typing import TYPE_CHECKING

from modeldsl.diagnostics import Diagnostic, DiagnosticError
from modeldsl.frontend.text import ast

if TYPE_CHECKING:
    from modeldsl.frontend.python.translate import Translator

TAKEN = {"save", "recompute", "recompute_policy", "recompute_group", "dtype", "when", "description"}
POLICIES = ("always", "lora_only", "never")
GRADIENT_TAKEN = {"gradient_of", "when", "scope", "description"}
GRADIENT_SCOPES = ("gradient", "global_gradient")


def is_slot(stmt: py.stmt, kind: str = "Activation") -> bool:
    return (isinstance(stmt, py.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], py.Name)
            and isinstance(stmt.value, py.Call) and isinstance(stmt.value.func, py.Name)
            and stmt.value.func.id == kind)


def is_gradient_slot(stmt: py.stmt) -> bool:
    return is_slot(stmt, "Gradient")


def apply_gradient_slots(translator: Translator, slots: list[py.Assign], forward: ast.Section,
                         activations: list[py.Assign]) -> None:
    """Check each gradient slot's tensor and type against the forward (see the module docstring)."""
    graph = next((s for s in forward.body if isinstance(s, ast.Section) and s.name == "graph"), None)
    steps = graph.body if graph is not None else []
    inputs = _forward_inputs(forward)
    for stmt in slots:
        call = stmt.value
        options = _gradient_options(translator, call)
        of = options.get("gradient_of")
        if of is None or _string(of) is None:
            raise DiagnosticError([Diagnostic("E012", f"gradient slot '{stmt.targets[0].id}' names no tensor",
                                              translator.span(call), "say whose gradient it is: "
                                              "Gradient(Tensor[...], gradient_of=\"name\")")])
        name = _string(of)
        flows = _writers(steps, name)
        if not flows and name not in inputs:
            known = sorted({*inputs, *_written(steps)})
            close = difflib.get_close_matches(name, known, n=1)
            hint = f"did you mean '{close[0]}'? " if close else ""
            raise DiagnosticError([Diagnostic("E002", f"gradient_of names '{name}', which the forward neither takes "
                                              "nor writes", translator.inner(of), f"{hint}the forward's tensors: "
                                              f"{', '.join(known)}")])
        if not call.args:
            continue
        if name in inputs:
            _check_input_type(translator, call.args[0], inputs[name], name)
        for flow in flows:
            _state_type(translator, flow, name, call, None)


def _gradient_options(translator: Translator, call: py.Call) -> dict[str, py.expr]:
    for keyword in call.keywords:
        if keyword.arg not in GRADIENT_TAKEN:
            raise translator.error(keyword, f"Gradient takes no '{keyword.arg}' here",
                                   "a gradient's dtype is the training step's, the memory planner shares buffers and "
                                   "a tensor has one name; give gradient_of=, when=, scope= or description=")
        if keyword.arg == "scope" and _string(keyword.value) not in GRADIENT_SCOPES:
            raise translator.error(keyword.value, f"a gradient slot's scope is one of {', '.join(GRADIENT_SCOPES)}")
    return {k.arg: k.value for k in call.keywords}


def _forward_inputs(forward: ast.Section) -> dict[str, ast.Expr]:
    """The forward's inputs by name, with their written types."""
    found = {}
    for entry in forward.body:
        if isinstance(entry, ast.Section) and entry.name == "in" and entry.value is not None:
            found["in"] = entry.value.expr
        elif isinstance(entry, ast.Section) and entry.name == "inputs":
            found.update({e.name: e.value.expr for e in entry.body if isinstance(e, ast.Section) and e.value})
    return found


def _written(steps: list[ast.Stmt]) -> list[str]:
    names = []
    for stmt in steps:
        if isinstance(stmt, ast.If):
            names += _written(stmt.then) + _written(stmt.orelse or [])
        elif isinstance(stmt, ast.Flow):
            target = stmt.chain[-1]
            names += [n.id for n in (target.items if isinstance(target, ast.TupleExpr) else [target])
                      if isinstance(n, ast.Name)]
    return names


def _check_input_type(translator: Translator, annotation: py.expr, written: ast.Expr, name: str) -> None:
    """E018 when a gradient slot of a forward input states another type than the input's."""
    stated = translator.tensor_type(annotation)
    if stated != written:
        raise DiagnosticError([Diagnostic("E018", f"the gradient of '{name}' is stated {stated.span.text}, but "
                                          f"'{name}' is {written.span.text}", translator.span(annotation),
                                          "a gradient has its tensor's shape")])


def apply_slots(translator: Translator, slots: list[py.Assign], forward: ast.Section) -> None:
    """Give ``forward`` (its text AST) the memory hints and stated types of ``slots``."""
    graph = next((s for s in forward.body if isinstance(s, ast.Section) and s.name == "graph"), None)
    groups: dict[str, tuple[ast.Flow, py.AST]] = {}
    for stmt in slots:
        name, call = stmt.targets[0].id, stmt.value
        options = {k.arg: k.value for k in call.keywords}
        for keyword in call.keywords:
            if keyword.arg not in TAKEN:
                raise translator.error(keyword, f"Activation takes no '{keyword.arg}' here",
                                       "the recompute pass finds what a recomputed step reads in the graph and "
                                       "replays the step itself; give save=, recompute=, recompute_policy=, "
                                       "recompute_group=, dtype= or when=")
        flows = _writers(graph.body if graph is not None else [], name)
        if not flows:
            raise translator.error(stmt.targets[0], f"Activation '{name}' names no tensor the forward graph writes")
        save, recompute = _flag(options.get("save")), _flag(options.get("recompute"))
        policy = _string(options.get("recompute_policy")) or "always"
        if policy not in POLICIES:
            raise translator.error(options["recompute_policy"], f"recompute_policy is one of {', '.join(POLICIES)}")
        if recompute or save:
            _listed(translator, forward, "recompute" if recompute else "save", stmt.targets[0], name)
        for flow in flows:
            if policy != "always":
                _memory_policy(translator, flow, policy, stmt)
            _state_type(translator, flow, name, call, options.get("dtype"))
        group = _string(options.get("recompute_group"))
        if group is not None:
            first = groups.setdefault(group, (flows[0], stmt))
            if first[0] is not flows[0]:
                raise translator.error(options["recompute_group"], f"recompute_group '{group}' holds outputs of two "
                                       "steps; a group is the outputs of one step, recomputed together")


def _writers(steps: list[ast.Stmt], name: str) -> list[ast.Flow]:
    """The flows of ``steps`` (in any ``if`` branch) whose destination is or holds ``name``."""
    found = []
    for stmt in steps:
        if isinstance(stmt, ast.If):
            found += _writers(stmt.then, name) + _writers(stmt.orelse or [], name)
        elif isinstance(stmt, ast.Flow):
            target = stmt.chain[-1]
            names = target.items if isinstance(target, ast.TupleExpr) else [target]
            if any(isinstance(n, ast.Name) and n.id == name for n in names):
                found.append(stmt)
    return found


def _flag(node: py.expr | None) -> bool:
    return isinstance(node, py.Constant) and node.value is True


def _string(node: py.expr | None) -> str | None:
    return node.value if isinstance(node, py.Constant) and isinstance(node.value, str) else None


def _listed(translator: Translator, forward: ast.Section, kind: str, where: py.AST, name: str) -> None:
    """``name`` added to the forward's ``save:`` or ``recompute:`` list."""
    section = next((s for s in forward.body if isinstance(s, ast.Section) and s.name == kind), None)
    if section is None:
        section = translator.entry(where, kind, ast.ListExpr(translator.span(where), []))
        forward.body.append(section)
    section.value.expr.items.append(ast.Name(translator.span(where), name))


def _memory_policy(translator: Translator, flow: ast.Flow, policy: str, stmt: py.Assign) -> None:
    span = translator.span(stmt)
    memory = next((a for a in flow.annotations if a.name == "memory"), None)
    if memory is not None:
        given = next((a.value.id for a in memory.args if a.name == "policy" and isinstance(a.value, ast.Name)), None)
        if given != policy:
            raise translator.error(stmt, f"the step writing '{stmt.targets[0].id}' already has another memory hint; "
                                   "the outputs of one step share one recompute policy")
        return
    flow.annotations.append(ast.Annotation(span, "memory", [ast.Arg(span, ast.Name(span, "recompute")),
                                                            ast.Arg(span, ast.Name(span, policy), "policy", "=")]))


def _state_type(translator: Translator, flow: ast.Flow, name: str, call: py.Call, dtype: py.expr | None) -> None:
    """The slot's type as a stage before its name, where the step writes only it."""
    if not call.args or isinstance(flow.chain[-1], ast.TupleExpr):
        return
    shape = translator.tensor_type(call.args[0])
    if dtype is not None:
        shape.items.append(ast.Name(translator.inner(dtype) if _string(dtype) else translator.span(dtype),
                                    _string(dtype) or ""))
    flow.chain.insert(len(flow.chain) - 1, shape)
