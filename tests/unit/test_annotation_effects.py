"""Annotations change the compiled program or warn where they are written (W013).

W013 in both frontends, once per annotation, at its place; ``@dtype`` on a flow value casts it
(and its consumers read it back); ``@barrier`` orders and stops fusion; ``@noalias``/``@alias``
constrain the memory planner.
"""

import textwrap

import pytest
from xdsl.context import Context

from modeldsl.diagnostics import DiagnosticError, DiagnosticSink
from modeldsl.dialects.annotations import annotations_of
from modeldsl.dialects.dtypes import DType
from modeldsl.frontend.python import parse_python_source
from modeldsl.frontend.text.parser import parse_source
from modeldsl.ir import verify_module
from modeldsl.lower import lower_program
from modeldsl.passes.fuse import FusePass

HEADER = "module M(d: int = 64):\n  params:\n    w1: [d, d]\n    w2: [d, d]\n"


def module(graph: str, params: str = "", out: str = "[B, d]") -> str:
    return (HEADER + params + f"  forward:\n    in: x: [B, d]\n    out: {out}\n    graph:\n"
            + textwrap.indent(textwrap.dedent(graph), "      "))


def lowered(text: str, name: str = "m.module"):
    sink = DiagnosticSink()
    ir = lower_program(parse_source(text, name), None, None, sink)
    return ir, sink.diagnostics


def ops_of(ir, name: str) -> list:
    return [op for op in ir.walk() if op.name == f"mdsl.graph.{name}"]


def forward_ops(ir) -> list[str]:
    func = next(op for op in ir.walk() if op.name == "mdsl.graph.func")
    return [op.name.removeprefix("mdsl.graph.") for op in func.body.block.ops]


def w013(diagnostics) -> list[tuple[int, int, str]]:
    return [(d.span.line, d.span.column, d.message) for d in diagnostics if d.code == "W013"]


# ------------------------------------------------------------------ W013

def test_an_inert_annotation_warns_once_at_its_place_with_a_caret():
    text = module("""\
        x -> matmul(w1, transpose=NT) -> h @profile("mm") @memory(offload)
        h -> matmul(w2, transpose=NT) -> out @kernel("cublaslt", autotune=false)
    """)
    ir, diagnostics = lowered(text)
    assert verify_module(ir) == []
    found = w013(diagnostics)
    assert [(line, col) for line, col, _ in found] == [(9, 42), (9, 57), (10, 44)]
    assert found[0][2] == "`@profile` has no effect in this version: the executors record no profile regions"
    assert found[1][2].startswith("`@memory(offload)` has no effect in this version: nothing is offloaded")
    assert found[2][2] == "`@kernel(autotune=false)` has no effect in this version: kernels are not autotuned"
    rendered = next(d for d in diagnostics if d.code == "W013").render()
    assert rendered.startswith("m.module:9:42: warning[W013]: `@profile` has no effect in this version")
    assert '@profile("mm")' in rendered and "^^^^^^^^^^^^^^" in rendered


def test_annotations_that_take_effect_do_not_warn():
    text = module("""\
        x -> matmul(w1, transpose=NT) -> h @memory(recompute) @nofuse @lifetime(global) @hook(AfterLMHead)
        h -> matmul(w2, transpose=NT) -> out @fuse(scope=global) @kernel("cublaslt")
    """, params="    w3: [d, d] @frozen\n    w4: [d, d] @trainable(lr_scale=0.5, wd_scale=0.0)\n")
    _, diagnostics = lowered(text)
    assert w013(diagnostics) == []


@pytest.mark.parametrize("annotation, label", [
    ("@shard(column, tp_size=2)", "@shard"), ("@comm(all_reduce)", "@comm"), ("@partition(0)", "@partition"),
    ("@precision(policy=bf16)", "@precision"), ("@scaling(per_tensor)", "@scaling"), ("@adapter(ia3)", "@adapter(ia3)"),
    ("@trace", "@trace"), ("@memory(pin)", "@memory(pin)"), ("@memory(stream)", "@memory(stream)"),
    ("@lifetime(sublayer)", "@lifetime(sublayer)"), ("@lifetime", "@lifetime(operation)"),
    ("@frozen", "@frozen"),
])
def test_each_inert_flow_annotation_names_itself(annotation, label):
    _, diagnostics = lowered(module(f"x -> matmul(w1, transpose=NT) -> out {annotation}\n"))
    (found,) = w013(diagnostics)
    assert found[2].startswith(f"`{label}` has no effect in this version: ")


def test_a_fusion_no_pattern_implements_warns():
    _, diagnostics = lowered(module("(x, n) -> rmsnorm() -> matmul(w1, transpose=NT) -> out @fuse(norm_linear)\n",
                                    params="    n: [d]\n"))
    assert [m for _, _, m in w013(diagnostics)] == [
        "`@fuse(norm_linear)` has no effect in this version: no mdsl-fuse pattern implements it"]
    _, diagnostics = lowered(module("x -> silu() -> relu() -> out @fuse(ops=[silu, relu])\n"))
    assert [m.split(" has")[0] for _, _, m in w013(diagnostics)] == ["`@fuse(ops=[silu, relu])`"]


def test_parameter_model_and_declaration_annotations_that_are_not_applied_warn():
    text = textwrap.dedent("""\
        module Inner(d: int = 8):
          @checkpoint
          params:
            w: [d, d] @memory(offload) @dtype(fp32) @shard(expert) @frozen
          forward:
            in: x: [B, d]
            out: [B, d]
            graph:
              x -> matmul(w, transpose=NT) -> out

        recipe Hybrid:
          forward_activation_dtype: fp8_e4m3

        model Outer(d: int = 8):
          @recipe(Hybrid)
          params:
            a: Inner(d)
            b: Inner(d)
          forward:
            in: x: [B, d]
            out: [B, d]
            graph:
              x -> a -> b -> out
    """)
    _, diagnostics = lowered(text)
    found = {(line, col): message.split(" has no effect")[0] for line, col, message in w013(diagnostics)}
    assert found == {(2, 3): "`@checkpoint`", (4, 15): "`@memory(offload)`", (4, 32): "`@dtype`",
                     (4, 45): "`@shard`", (11, 8): "`recipe Hybrid`", (15, 3): "`@recipe`"}  # once, for 2 instances


def test_a_tensor_parallel_strategy_on_a_parameter_takes_effect_and_its_options_warn():
    """``@shard(column)`` and ``@shard(row)`` on a parameter are what ``mdsl-shard{tp}`` shards by; a
    size or an asynchronous option written with them is not applied."""
    plain = module("x -> matmul(w1, transpose=NT) -> out\n").replace("w1: [d, d]", "w1: [d, d] @shard(column)")
    assert "@shard(column)" in plain and w013(lowered(plain)[1]) == []
    sized = plain.replace("@shard(column)", "@shard(row, tp_size=2)")
    (found,) = w013(lowered(sized)[1])
    assert found[2].startswith("`@shard(row, tp_size=...)` has no effect in this version: ")


PYTHON = '''\
from modeldsl.dsl import Param, Tensor, forward, graph, module


@module
class M:
    def __init__(self, d: int = 8):
        pass

    w = Param(Tensor["d", "d"], memory="stream")

    @forward
    def forward(self, x: Tensor["B", "d"]) -> Tensor["B", "d"]:
        with graph() as g:
            h = g.matmul(x, "w", transpose="NT", trace="ops")
            out = g.silu(h, dtype="fp32")
            return out
'''


def test_the_python_dsl_warns_at_the_keyword_and_applies_dtype():
    sink = DiagnosticSink()
    ir = lower_program(parse_python_source(PYTHON, "m.py"), None, None, sink)
    assert [(d.span.location, d.message.split(" has")[0]) for d in sink.diagnostics if d.code == "W013"] == [
        ("m.py:9:33", "`@memory(stream)`"), ("m.py:14:50", "`@trace`")]
    (cast,) = ops_of(ir, "cast")
    assert cast.results[0].type.dtype == DType.FP32  # the untyped output keeps @dtype's fp32


# ------------------------------------------------------------------ @dtype

def test_dtype_casts_the_value_and_its_consumers_read_it_back():
    ir, diagnostics = lowered(module("""\
        x -> matmul(w1, transpose=NT) -> h @dtype(fp32)
        h -> silu() -> a
        a -> matmul(w2, transpose=NT) -> b
        (h, b) -> add() -> out
    """, out="[B, d, bf16]"))
    assert verify_module(ir) == [] and diagnostics == []
    assert forward_ops(ir) == ["param_ref", "matmul", "cast", "cast", "silu", "param_ref", "matmul", "cast", "add",
                               "return"]
    to_fp32, *back = ops_of(ir, "cast")
    assert (to_fp32.results[0].name_hint, to_fp32.results[0].type.dtype) == ("h", DType.FP32)
    assert to_fp32.operands[0].name_hint == "h_bf16" and not annotations_of(to_fp32.operands[0].owner)
    assert [a.DSL_NAME for a in annotations_of(to_fp32)] == ["dtype"]
    assert [(c.operands[0], c.results[0].type.dtype) for c in back] == [(to_fp32.results[0], DType.BF16)] * 2


def test_dtype_on_an_output_makes_an_untyped_output_that_dtype():
    ir, diagnostics = lowered(module("x -> matmul(w1, transpose=NT) -> out @dtype(fp32)\n"))
    func = next(op for op in ir.walk() if op.name == "mdsl.graph.func")
    assert func.function_type.outputs.data[0].dtype == DType.FP32 and diagnostics == []
    ir, diagnostics = lowered(module("x -> matmul(w1, transpose=NT) -> out @dtype(fp32)\n", out="[B, d, bf16]"))
    assert [d.code for d in diagnostics] == ["W005"]  # a declared dtype wins, narrowing as declared outputs do


def test_dtype_of_the_computed_dtype_changes_nothing_and_a_mid_chain_dtype_casts_that_stage():
    ir, _ = lowered(module("x -> matmul(w1, transpose=NT) -> out @dtype(bf16)\n"))
    assert ops_of(ir, "cast") == []
    ir, _ = lowered(module("x -> matmul(w1, transpose=NT) @dtype(fp16) -> silu() -> out\n"))
    casts = ops_of(ir, "cast")
    assert [c.results[0].type.dtype for c in casts] == [DType.FP16, DType.BF16]
    assert ops_of(ir, "silu")[0].operands[0] is casts[1].results[0]


def test_dtype_that_is_no_implicit_conversion_is_e003_at_the_annotation():
    with pytest.raises(DiagnosticError) as info:
        lowered(module("x -> matmul(w1, transpose=NT) -> out @dtype(fp8_e4m3)\n"))
    (error,) = [d for d in info.value.diagnostics if d.code == "E003"]
    assert (error.span.line, error.span.column) == (9, 44) and "not an implicit conversion" in error.message


# ------------------------------------------------------------------ @barrier

BARRIER_ORDER = """\
    y2 -> relu() -> y3 {barrier}
    x -> gelu() -> z
    x -> silu() -> y2
    (y3, z) -> out
"""


def test_statements_written_after_a_barrier_run_after_it():
    def order(barrier: str) -> list[str]:
        ir, _ = lowered(module(BARRIER_ORDER.format(barrier=barrier), out="([B, d], [B, d])"))
        return [n for n in forward_ops(ir) if n in ("relu", "gelu", "silu")]

    assert order("") == ["gelu", "silu", "relu"]  # the earliest ready statement first
    assert order("@barrier") == ["silu", "relu", "gelu"]  # silu, which the barrier reads, still comes first


def test_no_fusion_crosses_a_barrier():
    graph = """\
        (x, w1) -> add() -> s
        x -> silu() -> z {barrier}
        (s, n) -> rmsnorm() -> (y, _)
        (y, z) -> out
    """

    def fused(barrier: str) -> list[str]:
        ir, _ = lowered(module(graph.format(barrier=barrier), params="    n: [d]\n", out="([B, d], [B, d])")
                        .replace("w1: [d, d]", "w1: [B, d]"))
        FusePass().apply(Context(), ir)
        return [n for n in forward_ops(ir) if n not in ("param_ref", "return")]

    assert fused("") == ["silu", "fused_residual_rmsnorm"]
    assert fused("@barrier") == ["add", "silu", "rmsnorm"]


# ------------------------------------------------------------------ @alias / @noalias

def test_noalias_on_an_aliasing_flow_copies_and_alias_there_is_the_flow_as_it_is():
    graph = """\
        x -> matmul(w1, transpose=NT) -> h
        h -> y {a}
        y -> relu() -> out
    """
    plain, _ = lowered(module(graph.format(a="")))
    ir, diagnostics = lowered(module(graph.format(a="@alias")))
    assert forward_ops(ir) == forward_ops(plain) and diagnostics == []
    assert not annotations_of(ops_of(ir, "matmul")[0])  # @alias described y, not the matmul's h
    ir, _ = lowered(module(graph.format(a="@noalias")))
    (copy,) = ops_of(ir, "copy")
    assert [a.DSL_NAME for a in annotations_of(copy)] == ["noalias"] and not annotations_of(ops_of(ir, "matmul")[0])
    assert ops_of(ir, "relu")[0].operands[0] is copy.results[0]
    ir, _ = lowered(module("x -> view([B, d]) -> out @noalias\n"))
    assert forward_ops(ir) == ["view", "copy", "return"]


def test_noalias_on_a_computed_value_stays_on_its_op_and_alias_there_is_e008():
    ir, _ = lowered(module("x -> matmul(w1, transpose=NT) -> relu() -> out @noalias\n"))
    assert ops_of(ir, "copy") == [] and [a.DSL_NAME for a in annotations_of(ops_of(ir, "relu")[0])] == ["noalias"]
    with pytest.raises(DiagnosticError) as info:
        lowered(module("x -> matmul(w1, transpose=NT) -> relu() -> out @alias\n"))
    (error,) = info.value.diagnostics
    assert (error.code, error.span.line, error.span.column) == ("E008", 9, 54)
    assert error.message == "@alias: 'out' is computed by relu into a buffer of its own"
