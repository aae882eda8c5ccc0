"""Lowering Module DSL to mdsl.graph: the IR it builds, and the coded diagnostics it reports."""

import random
from pathlib import Path

import pytest
from spec_blocks import spec_code_blocks

from modeldsl.diagnostics import CODES, DiagnosticError
from modeldsl.dialects.annotations import annotations_of
from modeldsl.frontend.text.parser import parse_source
from modeldsl.ir import print_ir, verify_module
from modeldsl.lower import lower_program

HEADER = "module M(d: int = 64, use_bias: bool = false):\n"


def lower(text: str, top: str | None = None):
    return lower_program(parse_source(text, "m.module"), top)


def errors(text: str, top: str | None = None) -> list[tuple[str, int, int, str]]:
    with pytest.raises(DiagnosticError) as info:
        lower(text, top)
    return [(d.code, d.span.line if d.span else 0, d.span.column if d.span else 0, d.message)
            for d in info.value.diagnostics]


def module(graph: str, params: str = "    w: [d, d]\n", io: str = "    in: x: [B, d]\n    out: [B, d]\n") -> str:
    return HEADER + "  params:\n" + params + "  forward:\n" + io + "    graph:\n" + graph


def test_lowered_module_verifies_and_round_trips():
    ir = lower(module("      x -> matmul(w, transpose=NT) -> out @memory(recompute) @hook(AfterQKVProjection)\n"))
    assert verify_module(ir) == []
    matmul = next(op for op in ir.walk() if op.name == "mdsl.graph.matmul")
    assert [a.DSL_NAME for a in annotations_of(matmul)] == ["memory", "hook"]
    assert "#mdsl.graph.memory<recompute>" in print_ir(ir)


def test_undefined_tensor_is_e002_with_a_suggestion():
    (err,) = errors(module("      x -> matmul(ww, transpose=NT) -> out\n"))
    assert err[:3] == ("E002", 8, 19) and "'ww'" in err[3]


def test_unknown_primitive_is_e014():
    (err,) = errors(module("      x -> matmull(w) -> out\n"))
    assert err[:3] == ("E014", 8, 12) and "matmull" in err[3]


def test_duplicate_parameter_is_e009():
    (err,) = errors(module("      x -> matmul(w, transpose=NT) -> out\n", params="    w: [d, d]\n    w: [d]\n"))
    assert err[:2] == ("E009", 4)


def test_missing_module_argument_is_e012():
    text = (
        "module Inner(k: int):\n  params:\n    w: [k]\n  forward:\n    in: [k]\n    graph:\n      in -> out\n"
        + module("      x -> out\n", params="    inner: Inner()\n")
    )
    codes = errors(text, "M")
    assert codes[0][0] == "E012" and "missing required parameter 'k' of Inner" in codes[0][3]


def test_unknown_keyword_of_a_primitive_is_e012():
    (err,) = errors(module("      x -> matmul(w, transposed=NT) -> out\n"))
    assert err[0] == "E012" and "matmul has no parameter 'transposed'" in err[3]


def test_bad_enum_value_is_e003():
    (err,) = errors(module("      x -> matmul(w, transpose=XX) -> out\n"))
    assert err[0] == "E003" and "'XX' is not one of NN, NT, TN, TT" in err[3]


def test_bad_annotation_is_e008():
    (err,) = errors(module("      x -> matmul(w, transpose=NT) -> out @memory(sometimes)\n"))
    assert err[:2] == ("E008", 8) and "'sometimes' is not one of" in err[3]


def test_guard_on_a_tensor_is_e016():
    (err,) = errors(module("      if x:\n        x -> out\n      else:\n        x -> relu() -> out\n"))
    assert err[:2] == ("E016", 8)


def test_guard_on_a_parameter_chooses_a_branch():
    ir = lower(module("      if use_bias:\n        x -> relu() -> out\n      else:\n        x -> silu() -> out\n"))
    names = [op.name for op in ir.walk()]
    assert "mdsl.graph.silu" in names and "mdsl.graph.relu" not in names


WINDOWED = """
module Inner(window: int):
  forward:
    in: x: [B, T, 4]
    out: [B, T, 4]
    graph:
      if window > 0:
        x -> relu() -> out
      else:
        x -> silu() -> out

model M(use_window: bool = false, window_size: int = 3, full_from: int = 0):
  let:
    window = window_size if use_window and full_from == 0 else 0
  params:
    inner: Inner(window)
    other: Inner(window_size if use_window else 0)
  forward:
    in: x: [B, T, 4]
    out: [B, T, 4]
    graph:
      x -> inner -> y
      y -> other -> out
"""


@pytest.mark.parametrize("config, kernel", [({}, "silu"), ({"use_window": True}, "relu"),
                                            ({"use_window": True, "full_from": 2}, None)])
def test_a_conditional_of_config_values_picks_its_branch_in_a_let_and_in_module_arguments(config, kernel):
    """The integer config values a guard reads are baked: the let binding is the configured branch."""
    ir = lower_program(parse_source(WINDOWED, "m.module"), None, config)
    names = [op.name.removeprefix("mdsl.graph.") for op in ir.walk()
             if op.name in ("mdsl.graph.relu", "mdsl.graph.silu")]
    assert names == ([kernel] * 2 if kernel else ["silu", "relu"])


def test_redefinition_is_e017():
    (err,) = errors(module("      x -> relu() -> y\n      x -> silu() -> y\n      y -> out\n"))
    assert err[:3] == ("E017", 9, 22)


def test_shape_mismatch_is_reported_by_the_op_verifier_rules():
    (err,) = errors(module("      x -> matmul(w, transpose=NT) -> out\n",
                           io="    in: x: [B, d]\n    out: [B, 2 * d]\n"))
    assert err[0] == "E004" and "output 'out'" in err[3]


def test_declared_output_dtype_is_checked():
    (err,) = errors(module("      x -> relu() -> out\n", io="    in: x: [B, d]\n    out: [B, d, fp8_e4m3]\n"))
    assert err[0] == "E003" and "declared fp8_e4m3 but the graph computes bf16" in err[3]


@pytest.mark.parametrize("source, target, warned",
                         [("bf16", "fp32", False), ("fp32", "bf16", True), ("fp16", "bf16", False)])
def test_implicit_float_casts_follow_spec_7_4_4(source, target, warned):
    from modeldsl.diagnostics import DiagnosticSink

    sink = DiagnosticSink()
    text = module("      x -> relu() -> out\n", io=f"    in: x: [B, d, {source}]\n    out: [B, d, {target}]\n")
    ir = lower_program(parse_source(text, "m.module"), sink=sink)
    cast = next(op for op in ir.walk() if op.name == "mdsl.graph.cast")
    assert str(cast.results[0].type).endswith(f"{target}>")
    assert [d.code for d in sink.diagnostics] == (["W005"] if warned else [])


def test_constraint_violated_by_defaults_is_e027():
    text = "module M(d: int = 60):\n  let:\n    constraint:\n      d % 8 == 0, \"d must be a multiple of 8\"\n" \
           "  forward:\n    in: [d]\n    graph:\n      in -> out\n"
    (err,) = errors(text)
    assert err[:2] == ("E027", 4) and err[3] == "constraint violated: d must be a multiple of 8"
    assert lower(text.replace("d: int = 60", "d: int = 64")) is not None


def test_incomplete_placeholder_is_a_coded_diagnostic():
    (err,) = errors(module("      ...\n      x -> out\n"))
    assert err[0] == "E001" and "left incomplete" in err[3]


def test_independent_errors_are_all_reported_and_uses_of_failed_values_stay_quiet():
    codes = errors(module("      x -> nope() -> a\n      a -> relu() -> b\n      x -> matmul(missing) -> out\n"))
    assert [c for c, *_ in codes] == ["E014", "E002"]


# Spec sections 10 and 11, block by block (keyed by the line of the opening fence).
# The 10.x blocks show std files without their imports; the std library supplies them.
STD_IMPORTS = ("from std.modules.linear import Linear\nfrom std.modules.mlp import SwiGLU_MLP\n"
               "from std.modules.attention import GQA as CausalSelfAttention\n")
# What stops each block that does not lower: (code, spec line, column, words of the message).
SPEC_OUTCOMES = {
    # 10.2's Linear writes x @ W^T as TN, which 6.1.1 defines as A^T @ B (the spec contradicts itself)
    5911: [("E004", 5921, 13, "cannot be transposed")],
    # 10.2's SwiGLU_MLP: its weight gradients use the same contradicting letters
    5939: [("E004", 5966, 26, "B must have rank 2"), ("E004", 5972, 32, "B must have rank 2")],
    # 10.3 uses RMSNormParams, which the spec never declares
    5978: [("E002", 5989, 10, "RMSNormParams"), ("E002", 5991, 10, "RMSNormParams")],
    6041: [("E001", 6097, 16, "left incomplete ('per_layer_saves...')")],  # 11.1
    6155: [("E001", 6210, 5, "backward: section is left incomplete")],  # 11.2
    6215: [("E001", 6283, 5, "backward: section is left incomplete")],  # 11.3
    6288: [],  # 11.4 lowers
}
# The transpose letters of 6.1.1's definition (NT = A @ B^T) in place of the contradicting ones.
SPEC_CONVENTION_FIXES = [
    ("matmul(weight, transpose=TN)", "matmul(weight, transpose=NT)"),
    ("(saved.in, d_out) -> matmul(transpose=NT", "(d_out, saved.in) -> matmul(transpose=TN"),
    ("(hidden, d_out) -> matmul(transpose=NT", "(d_out, hidden) -> matmul(transpose=TN"),
    ("(saved.in, d_gate_up) -> matmul(transpose=NT", "(d_gate_up, saved.in) -> matmul(transpose=TN"),
]


def lower_spec_block(line: int, text: str):
    prelude = STD_IMPORTS if line < 6041 else ""
    program = parse_source(prelude + text, f"spec{line}.module")
    decl = next(d for d in program.declarations if d.kind in ("module", "block", "model"))
    try:
        module = lower_program(program, decl.name)
    except DiagnosticError as err:
        offset = line - prelude.count("\n")
        return [(d.code, d.span.line + offset, d.span.column, d.message) for d in err.diagnostics if d.code[0] == "E"]
    assert verify_module(module) == []
    return []


def test_spec_section_10_and_11_programs_lower_or_are_refused_where_the_spec_is_incomplete_or_contradicts_itself():
    blocks = dict(spec_code_blocks(first_line=5875))
    assert sorted(blocks) == sorted(SPEC_OUTCOMES)
    for line, expected in SPEC_OUTCOMES.items():
        found = lower_spec_block(line, blocks[line])
        for code, at, column, words in expected:
            assert any(f[:3] == (code, at, column) and words in f[3] for f in found), (line, found)
        assert bool(found) == bool(expected), (line, found)


def test_spec_std_blocks_lower_with_the_transpose_letters_of_the_matmul_definition():
    blocks = dict(spec_code_blocks(first_line=5875))
    for line in (5911, 5939):
        text = blocks[line]
        for old, new in SPEC_CONVENTION_FIXES:
            text = text.replace(old, new)
        assert lower_spec_block(line, text) == [], line


def test_a_module_call_inside_a_recompute_block_reads_its_own_inputs():
    text = """from std.modules.linear import Linear
module M(d: int = 8):
  params:
    w: [d, d]
  forward:
    in: [B, d]
    out: [B, d]
    graph:
      in -> Linear(w) -> h
      h -> relu() -> out
    save: [in]
    recompute: [h]
  backward:
    d_out: [B, d]
    d_in: [B, d]
    graph:
      recompute:
        saved.in -> Linear(w) -> h
      (d_out, h) -> relu_backward() -> d_h
      (d_h, w) -> matmul() -> d_in
      (d_h, saved.in) -> matmul(transpose=TN, accumulate=true) -> d_w
"""
    ops = [op for op in lower(text).walk() if op.name == "mdsl.graph.matmul"]
    assert sum("recompute" in op.attributes for op in ops) == 1


def test_statistics_outputs_may_stay_unnamed_and_chains_pass_on_the_others():
    module_ir = print_ir(lower(module("      x -> rmsnorm(n) -> y\n      y -> rmsnorm(n) -> relu() -> out\n",
                                      params="    n: [d]\n")))
    assert module_ir.count("mdsl.graph.rmsnorm") == 2 and "%out = mdsl.graph.relu %" in module_ir
    (err,) = errors(module("      x -> layernorm(n) -> (y, m, r, extra)\n      y -> out\n", params="    n: [d]\n"))
    assert err[:2] == ("E003", 8) and "produces 3 value(s) but names 4" in err[3]
    (err,) = errors(module("      (x, x) -> fused_residual_rmsnorm(n) -> y\n      y -> out\n", params="    n: [d]\n"))
    assert err[0] == "E003" and "produces 3 value(s) but names 1" in err[3]


def test_left_out_code_outside_graphs_is_e001():
    text = module("      x -> out\n") + "  backward:\n    ...\n"
    (err,) = errors(text)
    assert err[0] == "E001" and "backward: section is left incomplete" in err[3]
    text = module("      x -> relu() -> out\n").replace("    graph:", "    save: [x, rest...]\n    graph:")
    (err,) = errors(text)
    assert err[0] == "E001" and "save: list is left incomplete ('rest...')" in err[3]


def test_a_module_inside_itself_is_e007():
    text = ("module Loop(d: int = 4):\n  params:\n    w: [d]\n  forward:\n    in: [d]\n    out: [d]\n"
            "    graph:\n      in -> Loop(w) -> out\n")
    (err,) = errors(text)
    assert err[:3] == ("E007", 8, 13)


STACKED = Path(__file__).resolve().parents[1] / "filecheck" / "frontend" / "lower-stacked-model.module"


def test_mutated_models_fail_only_with_located_coded_diagnostics():
    """Delete, duplicate and swap tokens and lines of a stacked model 300 times:
    lowering either succeeds or reports located diagnostics, never a traceback."""
    from frontend.test_parser import mutations

    text = STACKED.read_text().split("# CHECK")[0]
    rng = random.Random(2026)
    refused = 0
    for mutant in mutations(text, rng, 300):
        try:
            lower_program(parse_source(mutant, "mutant.module"))
        except DiagnosticError as err:
            refused += 1
            assert all(d.span is not None and d.code in CODES for d in err.diagnostics)
    assert refused > 100


def test_a_weight_mapped_twice_is_e010():
    model = module("      x -> out\n").replace("module M", "model M")  # hf_mapping: is a model's section
    text = model + '  hf_mapping:\n    w: "a.weight"\n    w: "b.weight"\n'
    (err,) = errors(text)
    assert err[:2] == ("E010", 11) and "'w' is mapped twice" in err[3]


def test_contradictory_annotations_are_e008_at_the_source():
    params = "    w: [d, d] @frozen @trainable(lr_scale=0.5)\n"
    (err,) = errors(module("      x -> matmul(w, transpose=NT) -> out\n", params=params))
    assert err[:3] == ("E008", 3, 15) and "contradict" in err[3]
    (err,) = errors(module("      x -> relu() -> out @memory(save) @memory(recompute)\n"))
    assert err[:2] == ("E008", 8) and "given twice" in err[3]


def test_an_element_type_the_primitive_does_not_take_is_e015():
    (err,) = errors(module("      x -> embedding(w) -> out\n"))
    assert err[:3] == ("E015", 8, 12) and "int32 or int64" in err[3]


@pytest.mark.parametrize("other, promoted", [("fp32", "fp32"), ("fp16", "fp32"), ("fp8_e4m3", "bf16")])
def test_float_operands_of_different_dtypes_are_promoted_to_the_widest(other, promoted):
    io = f"    in: (x: [B, d], y: [B, d, {other}])\n    out: [B, d, {promoted}]\n"
    ir = lower(module("      (x, y) -> add() -> out\n", io=io))
    text = print_ir(ir)
    assert "mdsl.graph.cast" in text and f"-> !mdsl.graph.tensor<[B, d], {promoted}>" in text
    assert verify_module(ir) == []


def test_float_and_integer_operands_are_e003():
    io = "    in: (x: [B, d], y: [B, d, int32])\n    out: [B, d]\n"
    (err,) = errors(module("      (x, y) -> add() -> out\n", io=io))
    assert err[:2] == ("E003", 8) and "element types differ" in err[3]
