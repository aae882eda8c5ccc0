"""The graph builder calls of the Python DSL (its section 8) that are not one primitive of the same
name: each gives the IR of its Module DSL twin, and a wrong use is a coded diagnostic at its place."""

from __future__ import annotations

import pytest

from tests.unit.frontend.python.twins import assert_twins, at, first_problem

HEADER = "from modeldsl.dsl import Array, Param, Tensor, block, forward, graph, model, module, save\n\n\n"

NORM = '''
@module
class Norm:
    def __init__(self, d: int = 8, eps: float = 1e-6):
        pass

    weight = Param(Tensor["d"])

    @forward
    def forward(self, x: Tensor["B", "T", "d"], r: Tensor["B", "T", "d"]) -> Tensor["B", "T", "d"]:
        with graph() as g:
{steps}
'''

NORM_TWIN = '''
module Norm(d: int = 8, eps: float = 1e-6):
  params:
    weight: [d]
  forward:
    inputs:
      x: [B, T, d]
      r: [B, T, d]
    out: [B, T, d]
    graph:
{steps}
'''


def twins(tmp_path, python_steps: str, text_steps: str, top: str = "Norm", config=None, output: str = "",
          after: str = "") -> str:
    """The twins of ``Norm`` with these graphs (``output`` names its output, ``after`` follows the
    text graph: ``save: [...]``)."""
    python = HEADER + NORM.replace("{steps}", _indent(python_steps, 12))
    text = NORM_TWIN.replace("{steps}", _indent(text_steps, 6) + ("\n    " + after if after else ""))
    text = text.replace("out: [", f"out: {output}: [" if output else "out: [")
    return assert_twins(tmp_path, python, text, top, config)


def problem(python_steps: str):
    source = HEADER + NORM.replace("{steps}", _indent(python_steps, 12))
    return first_problem(source, "Norm"), source


def _indent(text: str, spaces: int) -> str:
    return "\n".join(" " * spaces + line for line in text.strip("\n").splitlines())


@pytest.mark.parametrize("python, text", [
    ('out = g.silu_mul(x, r)', "(x, r) -> swiglu() -> out"),
    ('out = g.swiglu(x, r)', "(x, r) -> swiglu() -> out"),
    ('both = g.concat(x, r, dim=-1)\nout = g.swiglu(both)',
     "(x, r) -> concat(dim=-1) -> both\nboth -> fused_split_swiglu() -> out"),
    ('both = g.concat(x, r, dim=-1)\nout = g.geglu(both)',
     "(x, r) -> concat(dim=-1) -> both\nboth -> fused_split_geglu() -> out"),
    ('out = g.moe_softmax(x)', "x -> softmax(dim=-1) -> out"),
    ('out = g.moe_sigmoid(x)', "x -> sigmoid() -> out"),
    ('both = g.concat(x, r, dim=-1)\na, b = g.split(both, split_size=["d", "d"], dim=-1)\nout = g.add(a, b)',
     "(x, r) -> concat(dim=-1) -> both\nboth -> split(sizes=[d, d], dim=-1) -> (a, b)\n(a, b) -> add() -> out"),
    ('y = g.matmul_bias(x, "w2", "weight", transpose="NT")\nout = g.add(y, r)',
     "(x, w2) -> matmul(transpose=NT) -> bias_add(weight) -> y\n(y, r) -> add() -> out"),
])
def test_a_builder_call_is_the_steps_of_its_twin(tmp_path, python, text):
    python_source = HEADER + NORM.replace("{steps}", _indent(python, 12)).replace(
        'weight = Param(Tensor["d"])', 'weight = Param(Tensor["d"])\n    w2 = Param(Tensor["d", "d"])')
    text_source = NORM_TWIN.replace("{steps}", _indent(text, 6)).replace("weight: [d]", "weight: [d]\n    w2: [d, d]")
    assert_twins(tmp_path, python_source, text_source, "Norm")


def test_out_name_and_the_outputs_names_name_the_steps_tensors(tmp_path):
    """``out_name=`` names a step's output, ``res_out_name=`` / ``y_name=`` / ``rstd_name=`` those of a
    fused_residual_rmsnorm; the variables assigned are other names for them, in the graph, in its
    save list and in its return."""
    ir = twins(tmp_path, '''
res, h, rstd = g.fused_residual_rmsnorm(r, x, "weight", eps=self.eps, res_out_name="res_ffn", y_name="ln1",
                                        rstd_name="ln1_rstd")
g.save(rstd)
y = g.silu(h, out_name="act")
summed = g.add(y, res)
return summed
''', '''
(r, x, weight) -> fused_residual_rmsnorm(eps=eps) -> (res_ffn, ln1, ln1_rstd)
ln1 -> silu() -> act
(act, res_ffn) -> add() -> summed
''', output="summed", after="save: [ln1_rstd]")
    assert "%ln1_rstd" in ir and "%act = mdsl.graph.silu %ln1" in ir
    diagnostic, source = problem('out = g.silu(x, rsd_name="z")')
    assert diagnostic.code == "E001" and "no output 'rsd'" in diagnostic.message and at(diagnostic, source, "rsd_name")


def test_g_input_names_an_input_and_g_output_or_a_return_after_the_block_the_output(tmp_path):
    twins(tmp_path, 'a = g.input("x")\ntotal = g.add(a, r)\ng.output(total)', "(x, r) -> add() -> total",
          output="total")
    source = HEADER + NORM.replace("{steps}", _indent("total = g.add(x, r)", 12)) + "        return total\n"
    twin = NORM_TWIN.replace("out: [B, T, d]", "out: total: [B, T, d]").replace("{steps}", "      (x, r) -> add() -> "
                                                                                 "total")
    assert_twins(tmp_path, source, twin, "Norm")
    twice = HEADER + NORM.replace("{steps}", _indent("total = g.add(x, r)\nreturn total", 12)) + \
        "        return total\n"
    diagnostic = first_problem(twice, "Norm")
    assert diagnostic.code == "E001" and "already returns" in diagnostic.message


def test_g_custom_calls_a_primitive_by_name_and_an_unknown_one_is_e014_with_the_closest(tmp_path):
    twins(tmp_path, 'out = g.custom("add", x, r, num_outputs=1)', "(x, r) -> add() -> out")
    diagnostic, source = problem('out = g.custom("sillu", x, num_outputs=1)')
    assert diagnostic.code == "E014" and "unknown primitive or module 'sillu'" in diagnostic.message
    assert "did you mean 'silu'?" in diagnostic.hint and at(diagnostic, source, 'sillu"')
    diagnostic, source = problem('a, b = g.custom("add", x, r, num_outputs=1)')
    assert diagnostic.code == "E003" and at(diagnostic, source, "num_outputs=1")


@pytest.mark.parametrize("step, close", [
    ("out = g.sliu(x)", "silu"),
    ("out = g.matmul_bais(x, r)", "matmul_bias"),
    ("out = g.rmsnrom(x, \"weight\")", "rmsnorm"),
])
def test_an_unknown_builder_call_is_e014_at_its_place_with_the_closest_name(step, close):
    diagnostic, source = problem(step)
    assert diagnostic.code == "E014" and f"did you mean '{close}'?" in diagnostic.hint, diagnostic.render()
    assert at(diagnostic, source, "g." + step.split("g.")[1].split("(")[0])


@pytest.mark.parametrize("step, code, message", [
    ('out = g.qkv_qk_norm_rope(x, "weight", "weight", r, r)', "E014", "fused_qk_norm_rope"),
    ('out = g.moe_topk(x, top_k=2)', "E014", "moe_router"),
    ('out, lse = g.flash_attention(x, causal=True)', "E003", "split the packed projection"),
])
def test_a_builder_call_modeldsl_computes_otherwise_names_what_it_has(step, code, message):
    diagnostic, source = problem(step)
    assert diagnostic.code == code and message in diagnostic.hint, diagnostic.render()
    assert diagnostic.span.line == source.count("\n", 0, source.index(step.split(" = ")[1])) + 1


STACK = HEADER + '''
@block
class Blk:
    def __init__(self, d: int):
        pass

    w = Param(Tensor["d"])

    @forward
    def forward(self, x: Tensor["B", "d"]) -> Tensor["B", "d"]:
        with graph() as g:
            out = g.mul(x, "w")


@model
class M:
    def __init__(self, d: int = 4, n_layers: int = 3):
        pass

    norm = Param(Tensor["d"])
    blocks = Param(Array["n_layers", Blk("d")])

    @forward
    def forward(self, x: Tensor["B", "d"]) -> Tensor["B", "d"]:
        with graph() as g:
            {step}
            return y
'''

STACK_TWIN = '''
block Blk(d: int):
  params:
    w: [d]
  forward:
    inputs:
      x: [B, d]
    out: [B, d]
    graph:
      (x, w) -> mul() -> out

model M(d: int = 4, n_layers: int = 3):
  params:
    norm: [d]
    blocks: [n_layers] x Blk(d)
  forward:
    inputs:
      x: [B, d]
    out: y: [B, d]
    graph:
      x -> blocks -> y
'''


def test_g_call_runs_a_stack_or_a_submodule(tmp_path):
    call = 'y = g.call("StackedBlocks", x, num_outputs=1, blocks="blocks", n_layers=self.n_layers)'
    assert_twins(tmp_path, STACK.replace("{step}", call), STACK_TWIN, "M")
    assert_twins(tmp_path, STACK.replace("{step}", 'y = g.call("blocks", x)'), STACK_TWIN, "M")


@pytest.mark.parametrize("call, code, place", [
    ('y = g.call("StackedBlocks", x, num_outputs=1, blocks="blocks", n_layers=2)', "E003", "2)"),
    ('y = g.call("StackedBlocks", x, num_outputs=1, blocks="blocks")', "E012", 'g.call('),
    ('y = g.call("StackedBlocks", x, num_outputs=1, blocks="blokcs", n_layers=self.n_layers)', "E002", '"blokcs"'),
    ('y = g.call("StackedBlocks", x, num_outputs=2, blocks="blocks", n_layers=self.n_layers)', "E003",
     "num_outputs"),
    ('y = g.call("StackedBlocks", x, blocks="blocks", n_layers=self.n_layers, depth=3)', "E001", "depth"),
])
def test_a_wrong_stacked_blocks_call_is_reported_at_its_place(call, code, place):
    source = STACK.replace("{step}", call)
    diagnostic = first_problem(source, "M")
    assert diagnostic.code == code and at(diagnostic, source, place), diagnostic.render()
    if code == "E002":
        assert "did you mean 'blocks'?" in diagnostic.hint
