"""Flow annotations and ``save:``/``recompute:`` entries attach to the op that makes the value a flow
binds, whatever the flow's form (issue 32, item 1): a stated type stage (``x -> silu() -> [B, d] -> h
@X``, which makes no op of its own), tuple outputs (and one name of a tuple), ``if`` branches, an
inline module call or a module instance (the op inside the inlined graph), a stack (the stack op);
each annotation kind (``@hook``, ``@nofuse``, ``@memory``, ``@lifetime``, a ``recompute:`` and a
``save:`` entry) through each form, and nowhere else. The memory modes then take effect in ``mdsl-recompute`` (the same
recompute segments). And a Python DSL ``Activation(..., recompute=True, recompute_policy=...)``
slot is its Module DSL twin, on a single- and a multi-output step, before and after
``mdsl-autodiff`` + ``mdsl-recompute``."""

from __future__ import annotations

import re

import pytest
from xdsl.context import Context
from xdsl.dialects.builtin import ArrayAttr

from modeldsl.diagnostics import DiagnosticSink
from modeldsl.dialects.annotations import annotations_of
from modeldsl.frontend.python import parse_python_source
from modeldsl.frontend.text.parser import parse_source
from modeldsl.ir import print_ir, verify_module
from modeldsl.lower import lower_program
from modeldsl.passes.autodiff import AutodiffPass
from modeldsl.passes.recompute import RecomputePass

HEAD = '''\
block Layer(d: int):
  params:
    w: [d]
  forward:
    in: x: [B, d]
    out: [B, d]
    graph:
      (x, w) -> mul() -> out

module Inner(d: int):
  params:
    v: [d]
  forward:
    in: x: [B, d]
    out: [B, d]
    graph:
      (x, v) -> mul() -> y
      y -> silu() -> out

model M(d: int = 8, n: int = 2, gated: bool = true):
  params:
    w: [d]
    blocks: [n] x Layer(d)
    inner: Inner(d)
  forward:
    in: x: [B, d]
    out: [B, d]
    graph:
'''
USE = "      (h, w) -> mul() -> out\n"

# flow form -> (the flows binding h, {A} where the annotations go; the op that makes h; its result index)
FORMS = {
    "stated type": ("      x -> silu() -> [B, d] -> h{A}\n", "silu", 0),
    "stated types between stages": ("      x -> relu() -> [B, d] -> silu() -> [B, d, bf16] -> h{A}\n", "silu", 0),
    "tuple outputs": ("      (x, w) -> rmsnorm(eps=1e-6) -> (h, rstd){A}\n", "rmsnorm", 0),
    "one name of a tuple": ("      (x, w) -> rmsnorm(eps=1e-6) -> (h{A}, rstd)\n", "rmsnorm", 0),
    "if branches": ("      if gated:\n        x -> silu() -> h{A}\n      else:\n        x -> relu() -> h{A}\n",
                    "silu", 0),
    "inline module call": ("      x -> Inner(w) -> h{A}\n", "silu", 0),
    "module instance": ("      x -> inner -> h{A}\n", "silu", 0),
    "stack outputs": ("      x -> blocks -> h{A}\n", "stack", 0),
}
# annotation kind -> (what the flow carries, the forward's list entry, what the op must show)
KINDS = {
    "@hook": (" @hook(AfterX)", "", "hook"),
    "@nofuse": (" @nofuse", "", "nofuse"),
    "@memory": (" @memory(recompute)", "", "memory"),
    "@lifetime": (" @lifetime(global)", "", "lifetime"),
    "recompute:": ("", "    recompute: [h]\n", "recompute"),
    "save:": ("", "    save: [h]\n", "save"),
}


def source(form: str, kind: str) -> str:
    flows, _, _ = FORMS[form]
    annotation, entry, _ = KINDS[kind]
    return HEAD + flows.replace("{A}", annotation) + USE + entry


def lowered(text: str, config: dict | None = None, name: str = "flows.module"):
    ir = lower_program(parse_source(text, name), "M", config, DiagnosticSink())
    assert verify_module(ir) == []
    return ir


def forward_ops(ir) -> list:
    func = next(op for op in ir.walk() if op.name == "mdsl.graph.func" and op.sym_name.data == "forward")
    return list(func.body.block.ops)


def memory_modes(op) -> list[str]:
    recorded = op.attributes.get("memory")
    return [a.data for a in recorded.data] if isinstance(recorded, ArrayAttr) else ["auto"] * len(op.results)


def carried(op, kind: str) -> bool:
    """Whether ``op`` carries the annotation kind (a name of annotations_of, or a memory mode)."""
    if kind in ("save", "recompute"):
        return kind in memory_modes(op)
    return kind in [a.DSL_NAME for a in annotations_of(op)]


def maker_of_h(ir):
    """The op whose result the forward's ``mul`` reads as h."""
    mul = next(op for op in forward_ops(ir) if op.name == "mdsl.graph.mul" and op.results[0].name_hint == "out")
    return mul.operands[0].owner, mul.operands[0].index


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("form", list(FORMS))
def test_each_annotation_kind_reaches_the_op_that_makes_the_bound_value(form, kind):
    ir = lowered(source(form, kind))
    maker, index = maker_of_h(ir)
    _, made_by, result = FORMS[form]
    assert maker.name == f"mdsl.graph.{made_by}" and index == result, print_ir(ir)
    wanted = KINDS[kind][2]
    assert carried(maker, wanted), print_ir(ir)
    if wanted in ("save", "recompute"):
        assert memory_modes(maker)[index] == wanted
    elif wanted == "memory":
        assert memory_modes(maker)[index] == "recompute"
    others = [op for op in forward_ops(ir) if op is not maker and op.name != "mdsl.graph.return"]
    if wanted != "recompute":  # a save: list makes the intermediates it leaves out recompute
        assert not any(carried(op, wanted) for op in others), print_ir(ir)


def test_the_else_branch_carries_them_when_it_is_the_one_taken():
    for kind in KINDS:
        maker, _ = maker_of_h(lowered(source("if branches", kind), {"gated": False}))
        assert maker.name == "mdsl.graph.relu" and carried(maker, KINDS[kind][2])


@pytest.mark.parametrize("flows, made_by, kind", [
    ("      x -> silu() -> [B, d] @hook(AfterX) -> relu() -> h\n", "silu", "hook"),  # the type's value: silu's
    ("      x -> silu() @nofuse -> [B, d] -> relu() -> h\n", "silu", "nofuse"),
    ("      x -> silu() -> relu() -> h @memory(recompute)\n", "relu", "memory"),
])
def test_a_mid_chain_annotation_stays_with_its_stage(flows, made_by, kind):
    ops = forward_ops(lowered(HEAD + flows + USE))
    assert [op.name.removeprefix("mdsl.graph.") for op in ops if carried(op, kind)] == [made_by]


def test_an_annotation_of_the_second_name_of_a_tuple_is_that_result_s_alone():
    flows = "      (x, w) -> rmsnorm(eps=1e-6) -> (h, rstd @memory(recompute) @dtype(bf16))\n"
    ops = forward_ops(lowered(HEAD + flows + USE))
    norm = next(op for op in ops if op.name == "mdsl.graph.rmsnorm")
    assert memory_modes(norm) == ["auto", "recompute"]
    casts = [op for op in ops if op.name == "mdsl.graph.cast"]
    assert [(c.operands[0].owner, c.operands[0].index) for c in casts] == [(norm, 1)]


def recompute_segments(ir) -> list[tuple[str, str]]:
    """(op, segment) of every op ``mdsl-recompute`` replays in the backward."""
    return [(op.name.removeprefix("mdsl.graph."), op.attributes["recompute"].data) for op in ir.walk()
            if "recompute" in op.attributes]


def trained(ir, finetune: str = "auto"):
    AutodiffPass().apply(Context(), ir)
    RecomputePass(finetune=finetune).apply(Context(), ir)
    assert verify_module(ir) == []
    return ir


@pytest.mark.parametrize("form", ["stated type", "stated types between stages", "tuple outputs", "if branches",
                                  "inline module call", "module instance"])
def test_a_recompute_entry_through_each_form_makes_the_same_segment_as_its_plain_flow(form):
    """Written with or without a stated type (and whatever the form), ``recompute: [h]`` replays the op
    that makes h in the backward, and ``save: [h]`` keeps it."""
    flows, made_by, _ = FORMS[form]
    segments = recompute_segments(trained(lowered(source(form, "recompute:"))))
    assert (made_by, "h") in segments
    plain = re.sub(r" -> \[B, d(, bf16)?\]", "", flows.replace("{A}", ""))
    assert recompute_segments(trained(lowered(HEAD + plain + USE + "    recompute: [h]\n"))) == segments
    saved = recompute_segments(trained(lowered(source(form, "save:"))))
    assert (made_by, "h") not in saved


# ------------------------------------------------------------------ Python DSL Activation slots

PYTHON = '''
from modeldsl.dsl import Activation, Param, Tensor, forward, graph, model


@model
class M:
    def __init__(self, d: int = 8):
        pass

    w = Param(Tensor["d"])
{slots}

    @forward
    def forward(self, x: Tensor["B", "d"]) -> Tensor["B", "d"]:
        with graph() as g:
{steps}
            out = g.mul(h, "w")
            return out
'''
TEXT = '''
model M(d: int = 8):
  params:
    w: [d]
  forward:
    in: x: [B, d]
    out: out: [B, d]
    graph:
{flows}
      (h, w) -> mul() -> out
    recompute: [{recomputed}]
'''
# step -> (slots with {P}, the builder steps, the text twin's flows with {M} for the memory annotation,
#          the recomputed names, the op)
STEPS = {
    "single-output": ('    h = Activation(Tensor["B", "d"], recompute=True, recompute_policy="{P}")',
                      "            h = g.silu(x)",
                      "      x -> silu() -> [B, d] -> h{M}", "h", "silu"),
    "multi-output": ('    h = Activation(Tensor["B", "d"], recompute=True, recompute_policy="{P}")',
                     '            h, rstd = g.rmsnorm(x, "w", eps=1e-6)',
                     "      (x, w) -> rmsnorm(eps=1e-6) -> (h, rstd){M}", "h", "rmsnorm"),
    "multi-output, both slots": ('    h = Activation(Tensor["B", "d"], recompute=True, recompute_policy="{P}")\n'
                                 '    rstd = Activation(Tensor["B"], dtype="fp32", recompute=True, '
                                 'recompute_policy="{P}")',
                                 '            h, rstd = g.rmsnorm(x, "w", eps=1e-6)',
                                 "      (x, w) -> rmsnorm(eps=1e-6) -> (h, rstd){M}", "h, rstd", "rmsnorm"),
}


def without_locations(ir: str) -> str:
    return re.sub(r'"[^"]*\.(module|py):\d+:\d+"', '"LOC"', ir)


def twins(step: str, policy: str) -> tuple[str, str]:
    slots, steps, flows, recomputed, _ = STEPS[step]
    python = PYTHON.replace("{slots}", slots.replace("{P}", policy)).replace("{steps}", steps)
    memory = "" if policy == "always" else f" @memory(recompute, policy={policy})"  # always: the default
    text = TEXT.replace("{flows}", flows.replace("{M}", memory)).replace("{recomputed}", recomputed)
    return python, text


def both(step: str, policy: str):
    python, text = twins(step, policy)
    return (lower_program(parse_python_source(python, "twin.py"), "M", None, DiagnosticSink()),
            lower_program(parse_source(text, "twin.module"), "M", None, DiagnosticSink()))


@pytest.mark.parametrize("policy", ["always", "lora_only", "never"])
@pytest.mark.parametrize("step", list(STEPS))
def test_an_activation_recompute_slot_is_its_text_twin(step, policy):
    python, text = both(step, policy)
    assert without_locations(print_ir(python)) == without_locations(print_ir(text))
    maker, index = maker_of_h(python)
    assert maker.name == f"mdsl.graph.{STEPS[step][4]}" and memory_modes(maker)[index] == "recompute"


@pytest.mark.parametrize("policy, finetune, replayed", [
    ("always", "auto", True), ("always", "full", True),
    ("lora_only", "lora", True), ("lora_only", "full", False),
    ("never", "lora", False), ("never", "auto", False),
])
@pytest.mark.parametrize("step", list(STEPS))
def test_an_activation_recompute_slot_makes_its_twins_recompute_segments(step, policy, finetune, replayed):
    python, text = (trained(ir, finetune) for ir in both(step, policy))
    assert without_locations(print_ir(python)) == without_locations(print_ir(text))
    segments = recompute_segments(python)
    assert segments == recompute_segments(text)
    assert ((STEPS[step][4], "h") in segments) == replayed, segments


@pytest.mark.parametrize("kind", ["@memory", "recompute:"])
def test_recompute_of_a_stack_output_warns_that_it_stays_saved(kind):
    """The test's finding: ``mdsl-recompute`` keeps a stack's outputs saved (it replays tensors inside
    a layer loop or outside stacks), so marking one recompute changed nothing, silently: W013 says so,
    at the list entry or at the flow's name; a save: list that leaves the output out warns nothing."""
    text = source("stack outputs", kind)
    sink = DiagnosticSink()
    ir = lower_program(parse_source(text, "flows.module"), "M", None, sink)
    (warning,) = [d for d in sink.diagnostics if d.code == "W013"]
    label = "@memory(recompute)" if kind == "@memory" else "recompute: [h]"
    assert warning.message == (f"`{label}` has no effect in this version: 'h' is the output of the stack blocks, "
                               "which mdsl-recompute keeps saved (it replays tensors inside a layer loop or "
                               "outside stacks)")
    line = text.splitlines().index("    recompute: [h]") + 1 if kind == "recompute:" else \
        next(k for k, t in enumerate(text.splitlines(), 1) if "-> blocks -> h" in t)
    column = text.splitlines()[line - 1].index("h]" if kind == "recompute:" else "h @") + 1
    assert (warning.span.line, warning.span.column) == (line, column) and "^" in warning.render()
    assert recompute_segments(trained(ir)) == []
    quiet = DiagnosticSink()
    lower_program(parse_source(source("stack outputs", "save:").replace("save: [h]", "save: [x]"), "q.module"),
                  "M", None, quiet)
    assert not [d for d in quiet.diagnostics if d.code == "W013"]
