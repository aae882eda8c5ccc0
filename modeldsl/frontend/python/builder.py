"""The graph builder calls of the Python DSL (its section 8) that are not one primitive of the same
name, rewritten into the calls the translator turns into flows.

- ``g.matmul_bias(a, b, bias, transpose="NT")`` is ``g.bias_add(g.matmul(a, b, transpose="NT"), bias)``
  (the chain ``(a, b) -> matmul(transpose=NT) -> bias_add(bias)``);
- ``g.silu_mul(gate, up)`` is ``g.swiglu(gate, up)``; ``g.swiglu(x)`` with one input is the packed
  form, gate then up along the last dim: ``fused_split_swiglu`` (``g.geglu(x)``: ``fused_split_geglu``);
- ``g.flash_attention_qkv(q, k, v)`` is ``g.flash_attention(q, k, v)``; ``g.moe_softmax(x)`` is
  ``g.softmax(x, dim=-1)``, ``g.moe_sigmoid(x)`` ``g.sigmoid(x)``; ``g.split(x, split_size=[...])``
  gives the sizes as ``sizes=``;
- ``g.custom("name", x, w, num_outputs=1, attr=v)`` is the step ``(x, w) -> name(attr=v)`` of the
  primitive ``name`` (an undeclared one is the lowering's E014, with its did-you-mean);
- ``g.call("StackedBlocks", x, r, num_outputs=2, blocks="blocks", n_layers=self.n_layers)`` runs
  the stack ``blocks`` (``n_layers`` must be its count); ``g.call("sub", x)`` the submodule ``sub``,
  any other name is ``g.custom``;
- ``out_name="qkv"`` names a step's output (``y_name=``, ``rstd_name=``, ``res_out_name=``: the
  output of that name; the Python variable assigned is then another name for it), and
  ``a = g.input("x")`` makes ``a`` another name for the input ``x``.

The section 8 calls modeldsl computes otherwise are E014 naming what it has instead, and a call of
a name that is no primitive, builder call or declaration of the file (its classes, its imports) is
the text DSL's E014 "unknown primitive or module", with the closest name.
"""

from __future__ import annotations

import ast as py
import difflib

from modeldsl.diagnostics import Diagnostic, DiagnosticError
from modeldsl.frontend.python.nodes import (
    KEYWORD_NAMES,
    Nodes,
    is_annotation,
    is_string,
    self_attribute,
    subscript_of,
    subscripts,
)

RENAMED = {"silu_mul": "swiglu", "flash_attention_qkv": "flash_attention", "moe_softmax": "softmax",
           "moe_sigmoid": "sigmoid"}
PACKED = {"swiglu": "fused_split_swiglu", "geglu": "fused_split_geglu"}  # one input: gate then up, last dim
KEYWORDS = {"split": {"split_size": "sizes"}}
EXTRA_KEYWORDS = {"moe_softmax": ("dim", -1)}
OUTPUT_ALIASES = {"res_out": "residual_out"}  # the spec's output names where modeldsl's differ
BUILDER = ("call", "custom", "input", "output", "save", "mark_recompute", "saved", "recompute", "matmul_bias",
           *RENAMED)
ELSEWHERE = {
    "qkv_qk_norm_rope": "modeldsl's fused_qk_norm_rope takes q, k, q_weight, k_weight and freqs "
                        "(qk_norm and rope are also separate primitives)",
    "moe_topk": "modeldsl's moe_router(x, gate, top_k=..., normalize=...) scores, picks the top-k experts "
                "and gives the load-balancing loss in one op",
    "moe_grouped_gemm_gate_up": "modeldsl's grouped_gemm(input, weights, offsets) runs the experts' GEMMs",
    "moe_grouped_gemm_down": "modeldsl's grouped_gemm(input, weights, offsets) runs the experts' GEMMs",
    "fill_normal": "weights are initialised by the runtime, not by the graph; fill(shape=..., value=...) "
                   "gives a constant",
}


class BuilderCalls(Nodes):
    """The rewriting of builder calls and the output names of a graph's steps."""

    def __init__(self, source):
        super().__init__(source)
        self.renames: dict[str, str] = {}  # Python variable -> the tensor it names (out_name=, g.input)
        self.members: dict[str, py.expr] = {}  # the class's parameters: name -> type (Tensor[...], Array[...])
        self.file_names: set[str] = set()  # the classes and imported names of the file

    def tensor_name(self, name: str) -> str:
        return self.renames.get(name, KEYWORD_NAMES.get(name, name))

    # ------------------------------------------------------------------ output names
    def output_names(self, call: py.Call, target: py.expr) -> py.Call:
        """``call`` without its ``out_name=`` / ``X_name=`` keywords, each recorded as the name of the
        output its variable in ``target`` holds."""
        named = [k for k in call.keywords if k.arg is not None and k.arg.endswith("_name")]
        if not named:
            return call
        variables = target.elts if isinstance(target, py.Tuple) else [target]
        outputs = self.output_slots(call)
        for keyword in named:
            if not is_string(keyword.value) or not keyword.value.value.isidentifier():
                raise self.error(keyword.value, f"{keyword.arg}= names the output: {keyword.arg}=\"name\"")
            index = self.output_index(keyword, outputs, len(variables))
            variable = variables[index]
            if not isinstance(variable, py.Name):
                raise self.error(target, "a graph step writes a name or a tuple of names")
            self.renames[variable.id] = keyword.value.value
        return _with_keywords(call, [k for k in call.keywords if k not in named])

    def output_slots(self, call: py.Call) -> list[str] | None:
        """The output names of the primitive a step calls (None for a submodule or a user primitive)."""
        from modeldsl.primitives import lookup_primitive

        func = call.func
        if not isinstance(func, py.Attribute) or self_attribute(func):
            return None
        signature = lookup_primitive(RENAMED.get(func.attr, func.attr))
        return [slot.name for slot in signature.outputs] if signature is not None else None

    def output_index(self, keyword: py.keyword, outputs: list[str] | None, count: int) -> int:
        """Which of the step's ``count`` outputs ``keyword`` (``out_name=``, ``rstd_name=``) names."""
        if keyword.arg == "out_name":
            return 0
        slot = keyword.arg.removesuffix("_name")
        slot = OUTPUT_ALIASES.get(slot, slot)
        if outputs is None or slot not in outputs:
            known = [f"{o}_name" for o in outputs or []] + ["out_name"]
            close = difflib.get_close_matches(keyword.arg, known, n=1)
            hint = f"did you mean '{close[0]}'? " if close else ""
            raise self.error(keyword, f"the step has no output '{slot}' to name",
                             f"{hint}name its outputs with {', '.join(known)}")
        index = outputs.index(slot)
        if index >= count:
            raise self.error(keyword, f"{keyword.arg}= names output {index + 1}, but the step is assigned to "
                             f"{count} name{'s' if count != 1 else ''}")
        return index

    def input_alias(self, call: py.Call, target: py.expr, g: str) -> bool:
        """``a = g.input("x")``: ``a`` is another name for the forward input ``x``."""
        if not _is_builder(call, g, "input"):
            return False
        if len(call.args) != 1 or call.keywords or not is_string(call.args[0]) or not isinstance(target, py.Name):
            raise self.error(call, f"{g}.input names a forward input: a = {g}.input(\"x\")")
        self.renames[target.id] = self.tensor_name(call.args[0].value)
        return True

    # ------------------------------------------------------------------ rewriting
    def rewritten(self, call: py.Call, g: str, outputs: int) -> py.Call:
        """``call`` as the primitive steps it stands for (the module docstring's list)."""
        if call.args and isinstance(call.args[0], py.Call) and _is_builder(call.args[0], g):
            call = _with_args(call, [self.rewritten(call.args[0], g, 1), *call.args[1:]])
        if not _is_builder(call, g) or call.func.attr == "saved":
            return call
        name = call.func.attr
        if name == "custom":
            return self.custom(call, g, outputs)
        if name == "call":
            return self.module_call(call, g, outputs)
        if name == "matmul_bias":
            return self.matmul_bias(call, g)
        if name in ELSEWHERE and name not in self.file_names:
            raise DiagnosticError([Diagnostic("E014", f"the Python DSL's {g}.{name} is not a primitive of modeldsl",
                                              self.span(call.func), ELSEWHERE[name])])
        if name == "flash_attention" and len(call.args) == 1:
            raise DiagnosticError([Diagnostic("E003", "flash_attention takes q, k and v, not one packed qkv",
                                              self.span(call), "split the packed projection first: q, k, v = "
                                              f"{g}.split(qkv, [...], dim=-1), then {g}.view(...) each to "
                                              "[B, T, heads, head_dim]")])
        renamed = PACKED[name] if name in PACKED and len(call.args) == 1 else RENAMED.get(name, name)
        self.check_known(renamed, call.func, name)
        keywords = [_located(py.keyword(KEYWORDS.get(name, {}).get(k.arg, k.arg), k.value), k) for k in call.keywords]
        extra = EXTRA_KEYWORDS.get(name)
        if extra is not None and all(k.arg != extra[0] for k in call.keywords):
            keywords.append(_located(py.keyword(extra[0], _located(py.Constant(extra[1]), call)), call))
        return _located(py.Call(_step(g, renamed, call.func), call.args, keywords), call)

    def matmul_bias(self, call: py.Call, g: str) -> py.Call:
        if len(call.args) != 3:
            raise self.error(call, f"matmul_bias takes a, b and the bias: {g}.matmul_bias(x, \"weight\", \"bias\", "
                             "transpose=\"NT\")")
        a, b, bias = call.args
        annotations = [k for k in call.keywords if is_annotation(k, call)]
        inner = [k for k in call.keywords if k not in annotations]
        product = _located(py.Call(_step(g, "matmul", call.func), [a, b], inner), call)
        return _located(py.Call(_step(g, "bias_add", call.func), [product, bias], annotations), call)

    def custom(self, call: py.Call, g: str, outputs: int) -> py.Call:
        """``g.custom("name", x, ..., num_outputs=k, attr=v)``: a step of the primitive ``name``."""
        if not call.args or not is_string(call.args[0]) or not call.args[0].value.isidentifier():
            raise self.error(call, f"{g}.custom names the primitive first: {g}.custom(\"name\", x, ..., attr=value)")
        keywords = self.num_outputs(call, outputs)
        name = call.args[0]
        self.check_known(name.value, name, name.value, builder=False)
        func = _located(py.Attribute(_located(py.Name(g, py.Load()), name), name.value, py.Load()), name)
        return _located(py.Call(func, call.args[1:], keywords), call)

    def check_known(self, name: str, where: py.AST, written: str, builder: bool = True) -> None:
        """E014 for a step that calls no primitive and no declaration of the file."""
        from modeldsl.primitives import lookup_primitive, primitives

        if lookup_primitive(name) is not None or name in self.file_names:
            return
        known = [*primitives(), *sorted(self.file_names)] + (list(BUILDER) if builder else [])
        close = difflib.get_close_matches(written, known, n=1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        span = self.inner(where) if is_string(where) else self.span(where)
        raise DiagnosticError([Diagnostic("E014", f"unknown primitive or module '{written}'", span,
                                          f"{hint}primitives are listed in spec section 6; modules must be declared "
                                          "or imported")])

    def num_outputs(self, call: py.Call, outputs: int) -> list[py.keyword]:
        """The keywords of ``call`` but ``num_outputs=``, which must count the names it is assigned to."""
        for keyword in call.keywords:
            if keyword.arg == "num_outputs":
                if not (isinstance(keyword.value, py.Constant) and type(keyword.value.value) is int):
                    raise self.error(keyword.value, "num_outputs is a number")
                if keyword.value.value != outputs:
                    raise DiagnosticError([Diagnostic(
                        "E003", f"num_outputs={keyword.value.value}, but the step is assigned to {outputs} "
                        f"name{'s' if outputs != 1 else ''}", self.span(keyword), "assign one name per output")])
        return [k for k in call.keywords if k.arg != "num_outputs"]

    def module_call(self, call: py.Call, g: str, outputs: int) -> py.Call:
        """``g.call("StackedBlocks", ..., blocks="blocks", n_layers=...)``, ``g.call("sub", x)``, or
        ``g.call("prim", ...)`` as ``g.custom``."""
        if not call.args or not is_string(call.args[0]):
            raise self.error(call, f"{g}.call names what it calls first: {g}.call(\"StackedBlocks\", x, ..., "
                             "blocks=\"blocks\", n_layers=...) or {g}.call(\"submodule\", x)")
        name = call.args[0]
        if name.value == "StackedBlocks":
            return self.stacked_blocks(call, g, outputs)
        if name.value not in self.members:
            return self.custom(call, g, outputs)
        keywords = self.num_outputs(call, outputs)
        if keywords:
            raise self.error(keywords[0], f"a submodule call takes its input tensors only: {g}.call(\"{name.value}\", "
                             "x, ...)")
        return _located(py.Call(_self_member(name.value, name), call.args[1:], []), call)

    def stacked_blocks(self, call: py.Call, g: str, outputs: int) -> py.Call:
        keywords = {k.arg: k for k in self.num_outputs(call, outputs)}
        unknown = [k for name, k in keywords.items() if name not in ("blocks", "n_layers")]
        if unknown:
            raise self.error(unknown[0], f"StackedBlocks takes no '{unknown[0].arg}'",
                             "give the input tensors, num_outputs=, blocks=\"stack\" and n_layers=")
        for needed in ("blocks", "n_layers"):
            if needed not in keywords:
                raise DiagnosticError([Diagnostic("E012", f"StackedBlocks needs {needed}=", self.span(call),
                                                  "blocks=\"name\" names the stack parameter, n_layers= its count")])
        stack = keywords["blocks"].value
        stacks = [n for n, t in self.members.items() if subscript_of(t, "Array")]
        if not is_string(stack) or stack.value not in stacks:
            close = difflib.get_close_matches(getattr(stack, "value", ""), stacks, n=1)
            hint = f"did you mean '{close[0]}'? " if close else ""
            raise DiagnosticError([Diagnostic("E002", "blocks= names no stack parameter of this class",
                                              self.span(stack), f"{hint}the stacks are: {', '.join(stacks) or 'none'}"
                                              " (Param(Array[\"n_layers\", Block(...)]))")])
        count = subscripts(self.members[stack.value])[0]
        if self.value(keywords["n_layers"].value) != self.value(count):
            raise DiagnosticError([Diagnostic("E003", f"n_layers is not the count of the stack '{stack.value}'",
                                              self.span(keywords["n_layers"].value),
                                              f"the stack has {ast_text(count)} layers")])
        return _located(py.Call(_self_member(stack.value, stack), call.args[1:], []), call)


def ast_text(node: py.expr) -> str:
    return node.value if is_string(node) else py.unparse(node)


def _is_builder(call: py.expr, g: str, name: str | None = None) -> bool:
    func = call.func if isinstance(call, py.Call) else None
    return (isinstance(func, py.Attribute) and isinstance(func.value, py.Name) and func.value.id == g
            and (name is None or func.attr == name))


def _located(node, where):
    return py.copy_location(node, where)


def _step(g: str, name: str, where: py.expr) -> py.Attribute:
    """``g.name``, located at ``where`` (the call's own ``g.xyz``)."""
    return _located(py.Attribute(_located(py.Name(g, py.Load()), where), name, py.Load()), where)


def _self_member(name: str, where: py.expr) -> py.Attribute:
    return _located(py.Attribute(_located(py.Name("self", py.Load()), where), name, py.Load()), where)


def _with_keywords(call: py.Call, keywords: list[py.keyword]) -> py.Call:
    return _located(py.Call(call.func, call.args, keywords), call)


def _with_args(call: py.Call, args: list[py.expr]) -> py.Call:
    return _located(py.Call(call.func, args, call.keywords), call)

