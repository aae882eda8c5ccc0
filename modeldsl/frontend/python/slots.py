"""Activation slots of the Python DSL (seed 001 section 10, seed 002's recompute fields) as the memory
hints the recompute pass reads.

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
"""

from __future__ import annotations

import ast as py
from typing import TYPE_CHECKING

from modeldsl.frontend.text import ast

if TYPE_CHECKING:
    from modeldsl.frontend.python.translate import Translator

TAKEN = {"save", "recompute", "recompute_policy", "recompute_group", "dtype", "when", "description"}
POLICIES = ("always", "lora_only", "never")


def is_slot(stmt: py.stmt) -> bool:
    return (isinstance(stmt, py.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], py.Name)
            and isinstance(stmt.value, py.Call) and isinstance(stmt.value.func, py.Name)
            and stmt.value.func.id == "Activation")


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
