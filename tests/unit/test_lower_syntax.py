"""Lowering the Module DSL syntax of issue 13: signatures, conditionals, indexing, qualified
names, imports without ``std.``, compile-time arguments, user annotations and recipes."""

from pathlib import Path

import pytest

from modeldsl.diagnostics import DiagnosticError
from modeldsl.frontend.text.parser import parse_source
from modeldsl.ir import print_ir, verify_module
from modeldsl.lower import lower_program
from modeldsl.resolve.imports import STD_ROOT

TESTS_DIR = Path(__file__).resolve().parents[1]


def lower(text: str, top: str | None = None, name: str = "m.module"):
    module = lower_program(parse_source(text, name), top)
    assert verify_module(module) == []
    return module


def errors(text: str, top: str | None = None) -> list[tuple[str, int, int, str]]:
    with pytest.raises(DiagnosticError) as info:
        lower_program(parse_source(text, "m.module"), top)
    return [(d.code, d.span.line, d.span.column, d.message) for d in info.value.diagnostics]


def ops(module, name: str) -> list:
    return [op for op in module.walk() if op.name == f"mdsl.graph.{name}"]


def forward_types(module) -> tuple[list[str], list[str]]:
    func = next(op for op in module.walk() if op.name == "mdsl.graph.func")
    return [str(t) for t in func.function_type.inputs.data], [str(t) for t in func.function_type.outputs.data]


PAIR = """module Pair(d: int = 8):
  forward:
    in: (x: [B, d], extra: [B, d]?)
    out: ([B, d], [B, d])
    graph:
      x -> relu() -> a
      x -> silu() -> b
      (a, b) -> out
"""


def test_a_tuple_out_type_declares_two_outputs_that_out_binds():
    inputs, outputs = forward_types(lower(PAIR))
    assert len(inputs) == 2 and outputs == ["!mdsl.graph.tensor<[B, d], bf16>"] * 2


def test_an_optional_input_may_be_left_out_by_a_caller_but_not_then_used():
    caller = PAIR + ("module C(d: int = 8):\n  params:\n    p: Pair(d)\n  forward:\n    in: x: [B, d]\n"
                     "    out: [B, d]\n    graph:\n      x -> p() -> (a, b)\n      (a, b) -> add() -> out\n")
    assert len(ops(lower(caller, "C"), "relu")) == 1
    used = caller.replace("      (a, b) -> out\n", "      (a, extra) -> out\n", 1)
    ((code, line, _, message),) = errors(used, "C")
    assert (code, line) == ("E003", 8) and "'extra' is an optional input that this call leaves out" in message


def test_int_inputs_are_sizes_and_scalar_outputs_have_rank_zero():
    text = ("module Loss():\n  forward:\n    in: (x: [B * T], B: int, T: int)\n    out: scalar\n    graph:\n"
            "      x -> view([B, T]) -> grid\n      grid -> reduce_sum(dims=[0, 1]) -> out\n")
    inputs, outputs = forward_types(lower(text))
    assert inputs == ["!mdsl.graph.tensor<[B*T], bf16>"] and outputs == ["!mdsl.graph.tensor<[], bf16>"]
    ((code, line, _, message),) = errors(text.replace("dims=[0, 1]", "dims=[0]"))
    assert (code, line) == ("E004", 4) and "declared scalar" in message
    ((code, _, _, message),) = errors(text.replace("T: int", "T: float"))
    assert code == "E003" and "a graph input is a tensor or an int size" in message


def test_integer_outputs_written_without_a_dtype_keep_their_dtype():
    text = ("module M():\n  forward:\n    in: ids: [B, T, int32]\n    out: [B * T]\n    graph:\n"
            "      ids -> view([B * T]) -> out\n")
    assert forward_types(lower(text))[1] == ["!mdsl.graph.tensor<[B*T], int32>"]


def test_a_trailing_discard_may_name_an_optional_output_the_op_does_not_produce():
    text = ("module Conv(d: int = 4):\n  params:\n    weight: [d, 1, 4]\n  forward:\n    in: x: [B, d, T]\n"
            "    out: [B, d, T]\n    graph:\n      (x, weight) -> mamba_conv1d() -> (out, _)\n")
    assert len(ops(lower(text), "mamba_conv1d")) == 1
    ((code, _, _, message),) = errors(text.replace("(out, _)", "(out, _, _)"))
    assert code == "E003" and "names 3" in message


COND = """from std.modules.linear import Linear
module M(d: int = 8, use_bias: bool = true):
  let:
    factor = 2.0 if use_bias else 3.0
  params:
    w: [d, d]
    b: [d] if use_bias
  forward:
    in: x: [B, d]
    out: [B, d]
    graph:
      x -> Linear(w, bias=b if use_bias else None) -> y
      y -> scale(factor) -> out
"""


@pytest.mark.parametrize("use_bias, factor, bias_adds", [("true", 2.0, 1), ("false", 3.0, 0)])
def test_the_inline_conditional_picks_its_branch_at_compile_time(use_bias, factor, bias_adds):
    module = lower(COND.replace("use_bias: bool = true", f"use_bias: bool = {use_bias}"))
    (scale,) = ops(module, "scale")
    assert scale.attributes["factor"].value.data == factor and len(ops(module, "bias_add")) == bias_adds


def test_a_conditional_on_a_tensor_is_e016():
    text = COND.replace("bias=b if use_bias else None", "bias=b if x else None")
    ((code, line, column, message),) = errors(text)
    assert (code, line, column) == ("E016", 12, 32) and "'x'" in message


SLICES = """module S(d: int = 8, keep: int = 4):
  forward:
    in: x: [B, T, d]
    out: [B, d]
    graph:
      x[:, :keep] -> head
      x[0] -> first
      x[..., 2:5] -> middle
      x[:, -1] -> out
"""


def test_indexing_and_slicing_lower_to_views():
    module = lower(SLICES)
    shapes = {op.results[0].name_hint: str(op.results[0].type) for op in module.walk() if op.results}
    assert shapes["first"] == "!mdsl.graph.tensor<[T, d], bf16>"
    middle = next(r for op in ops(module, "split") for r in op.results if r.name_hint == "middle")
    assert str(middle.type) == "!mdsl.graph.tensor<[B, T, 3], bf16>"
    assert forward_types(module)[1] == ["!mdsl.graph.tensor<[B, d], bf16>"]


@pytest.mark.parametrize("index, words", [("x[:, :, 9:12]", "out of range for a dimension of size 8"),
                                          ("x[0, 0, 0, 0]", "4 subscripts for a tensor of rank 3"),
                                          ("x[..., ...]", "at most one '...'")])
def test_bad_indexes_are_located_errors(index, words):
    text = SLICES.replace("x[..., 2:5]", index).replace("in: x: [B, T, d]", "in: x: [B, T, 8]")
    ((code, line, _, message),) = errors(text)
    assert code in ("E001", "E004") and line == 8 and words in message


def test_qualified_names_and_std_paths_without_the_prefix_resolve():
    text = ("import primitives\nmodule M(d: int = 8):\n  params:\n    w: [d, d]\n    lin: modules.linear.Linear(d, d)\n"
            "  forward:\n    in: x: [B, d]\n    out: [B, d]\n    graph:\n      x -> std.modules.linear.Linear(w) -> y\n"
            "      y -> lin() -> out\n")
    module = lower(text)
    assert [op.sym_name.data for op in ops(module, "param")] == ["w", "lin.weight"]
    ((code, line, column, message),) = errors(text.replace("std.modules.linear.Linear(w)",
                                                           "std.modules.linar.Linear(w)"))
    assert (code, line, column) == ("E014", 10, 12) and "'std.modules.linar.Linear'" in message


def test_a_missing_single_name_import_names_the_module():
    ((code, _, _, message),) = errors("import nosuch\nmodule M:\n"
                                      "  forward:\n    in: [4]\n    graph:\n      in -> out\n")
    assert (code, message) == ("E002", "cannot find module 'nosuch'")


def test_float_and_annotation_arguments_take_int_config_values():
    text = ("module M(d: int = 8, d_head: int = 4, tp_size: int = 2):\n  params:\n"
            "    w: [d, d] @shard(column, tp_size=tp_size)\n  forward:\n    in: x: [B, d]\n    out: [B, d]\n"
            "    graph:\n      x -> matmul(w, transpose=NT) -> y\n      y -> scale(1.0 / sqrt(d_head)) -> out\n")
    printed = print_ir(lower(text))
    assert "factor = 5.000000e-01" in printed and "#mdsl.graph.shard<column, tp_size = 2>" in printed
    assert 'baked = ["d_head", "tp_size"]' in printed
    # without a value the factor stays symbolic until mdsl-specialize binds d_head (spec 3.7)
    printed = print_ir(lower(text.replace("d_head: int = 4", "d_head: int")))
    assert "factor = #mdsl.graph.sym<1.0 / sqrt(d_head) : f64>" in printed and 'baked = ["tp_size"]' in printed


ANNOTATED = """annotation @tag:
  params:
    level: enum(low, high)
    note: string? = None
  applies_to: [operation, parameter]
  compiler_behavior:
    - keep it as metadata

recipe Fp8:
  forward_activation_dtype: fp8_e4m3

model M(d: int = 8):
  @recipe(Fp8)
  params:
    w: [d, d] @tag(high)
  forward:
    in: x: [B, d]
    out: [B, d]
    graph:
      x -> matmul(w, transpose=NT) -> out @tag(level=low, note="n")
"""


def test_declared_annotations_are_kept_and_recipes_are_on_the_model():
    printed = print_ir(lower(ANNOTATED))
    assert 'user_annotations = [{name = "tag", level = "high"}]' in printed
    assert 'user_annotations = [{name = "tag", level = "low", note = "n"}]' in printed
    assert 'recipes = {Fp8 = {forward_activation_dtype = "fp8_e4m3"}}' in printed


@pytest.mark.parametrize("old, new, line, words", [
    ("@tag(high)", "@tag(mid)", 15, "'mid' is not one of low, high"),
    ("@tag(high)", "@tag(high, oops=1)", 15, "@tag has no parameter 'oops'"),
    ("@tag(high)", "@tag()", 15, "@tag needs its parameter 'level'"),
    ("@tag(high)", "@tagg(high)", 15, "unknown annotation @tagg"),
    ("@recipe(Fp8)", "@recipe(Fp9)", 13, "unknown recipe 'Fp9'"),
])
def test_bad_uses_of_declared_annotations_and_recipes_are_e008(old, new, line, words):
    ((code, at, _, message),) = [e for e in errors(ANNOTATED.replace(old, new)) if e[0] != "W013"]  # the recipe's
    assert (code, at) == ("E008", line) and words in message


def test_a_dtype_typo_is_e003_at_the_type_with_no_follow_on_errors():
    text = ("module M(d: int = 8):\n  params:\n    w: [d, d, fp31]\n  forward:\n    in: x: [B, d, bf61]\n"
            "    out: [B, d]\n    graph:\n      x -> matmul(w, transpose=NT) -> out\n")
    found = errors(text)
    assert [(c, line, col) for c, line, col, _ in found] == [("E003", 3, 15), ("E003", 5, 19)]
    assert "unknown dtype 'fp31'" in found[0][3]


@pytest.mark.parametrize("call", ["cast(dtype=fp31)", "cast(fp31)"])
def test_a_dtype_typo_in_an_argument_is_e003_at_the_argument(call):
    text = f"module M():\n  forward:\n    in: x: [B, 4]\n    out: [B, 4, fp32]\n    graph:\n      x -> {call} -> out\n"
    ((code, line, column, message),) = errors(text)
    assert (code, line, column) == ("E003", 6, 12 + call.index("fp31")) and "unknown dtype 'fp31'" in message


def test_a_type_in_a_chain_states_the_shape():
    text = ("module M(d: int = 8):\n  forward:\n    in: x: [B, T, d]\n    out: [B, d, T]\n    graph:\n"
            "      x -> transpose(1, 2) -> [B, d, T] -> relu() -> out\n")
    assert len(ops(lower(text), "relu")) == 1
    ((code, line, column, _),) = errors(text.replace("-> [B, d, T] ->", "-> [B, T, d] ->"))
    assert (code, line, column) == ("E004", 6, 31)


def test_a_file_of_primitive_declarations_is_checked_and_lowers_to_an_empty_module():
    for path in sorted((STD_ROOT / "primitives").glob("*.module")):
        if path.name != "matmul.module":  # its grouped_gemm modes are being changed beside this issue
            module = lower_program(parse_source(path.read_text(), str(path)))
            assert list(module.ops) == []
    bad = "primitive matmul:\n  params:\n    transpose: enum(NN) = NN\n  forward:\n    in: (A, B)\n    out: C\n"
    assert errors(bad)[0][0] == "E003"


def test_deep_expressions_below_the_limit_lower_without_recursion_errors():
    terms = "+".join(["d"] * 140)
    text = (f"module M(d: int = 8):\n  let:\n    a = {terms}\n  params:\n    w: [{terms}, d]\n  forward:\n"
            f"    in: x: [B, d]\n    graph:\n      x -> matmul(w, transpose=NT) -> y\n"
            f"      y -> scale({'-' * 130}1.0) -> out\n")
    assert "140*d" in print_ir(lower(text)).replace(" ", "")


OPTIONAL_GRAD = """module L(d: int = 8, use_bias: bool = false):
  params:
    weight: [d, d]
    bias: [d] if use_bias
  forward:
    in: [B, d]
    out: [B, d]
    graph:
      in -> matmul(weight, transpose=NT) -> y
      if use_bias:
        (y, bias) -> bias_add() -> out
      else:
        y -> out
    save: [in]
  backward:
    d_out: [B, d]
    d_in: [B, d]
    d_bias: [d]
    graph:
      (d_out, weight) -> matmul() -> d_in
      (d_out, saved.in) -> matmul(transpose=TN) -> d_weight
      if use_bias:
        d_out -> reduce_sum(dims=[0]) -> d_bias
"""


@pytest.mark.parametrize("use_bias, grads", [("false", 2), ("true", 3)])
def test_a_backward_may_declare_an_optional_gradient_without_a_question_mark(use_bias, grads):
    module = lower(OPTIONAL_GRAD.replace("use_bias: bool = false", f"use_bias: bool = {use_bias}"))
    backward = next(op for op in module.walk() if op.name == "mdsl.graph.func" and op.sym_name.data == "backward")
    assert len(backward.attributes["grads"].data) == grads
    ((code, line, _, _),) = errors(OPTIONAL_GRAD.replace("    d_bias: [d]\n", "    d_bais: [d]\n"))
    assert (code, line) == ("E002", 18)


W003 = """module MLP(d: int = 8, f: int = 16):
  params:
    w1: [f, d]
    w2: [d, f]
  forward:
    in: [B, d]
    out: [B, d]
    graph:
      in -> matmul(w1, transpose=NT) -> h1
      h1 -> relu() -> h2
      h2 -> view([B, f]) -> h3
      h3 -> matmul(w2, transpose=NT) -> out
    save: [in, h1, h2]
"""


@pytest.mark.parametrize("save, warned", [("[in, h1, h2]", []), ("[in, h1]", ["h3"]), ("[in]", ["h1", "h3"])])
def test_w003_names_the_unsaved_tensors_a_derived_gradient_reads_but_not_views_of_kept_ones(save, warned):
    from modeldsl.diagnostics import DiagnosticSink

    sink = DiagnosticSink()
    lower_program(parse_source(W003.replace("[in, h1, h2]", save), "m.module"), sink=sink)
    assert [d.message.split("'")[1] for d in sink.diagnostics if d.code == "W003"] == warned


def test_an_unknown_module_the_std_library_declares_gets_an_import_hint():
    text = ("module M(d: int = 8):\n  params:\n    w: [d, d]\n  forward:\n    in: x: [B, d]\n    out: [B, d]\n"
            "    graph:\n      x -> Linear(w) -> out\n")
    with pytest.raises(DiagnosticError) as info:
        lower_program(parse_source(text, "m.module"))
    (diag,) = info.value.diagnostics
    assert diag.code == "E014" and diag.hint == "import it: from std.modules.linear import Linear"


OPTIONAL_BIAS = """module AddBias(d: int = 8):
  forward:
    in: (x: [B, d], bias: [d]?)
    out: [B, d]
    graph:
      x -> relu() -> y
      if bias:
        (y, bias) -> bias_add() -> out
      else:
        y -> out

module M(d: int = 8):
  params:
    inner: AddBias(d)
    b: [d]
  forward:
    in: x: [B, d]
    out: [B, d]
    graph:
      CALL -> out
"""


@pytest.mark.parametrize("call, bias_adds", [("x -> inner()", 0), ("(x, b) -> inner()", 1)])
def test_if_on_an_optional_input_tests_whether_the_call_gives_it(call, bias_adds):
    assert len(ops(lower(OPTIONAL_BIAS.replace("CALL -> out", f"{call} -> out"), "M"), "bias_add")) == bias_adds


def test_top_naming_a_primitive_or_nothing_is_a_clear_e002():
    text = ("primitive relu:\n  forward:\n    in: x\n    out: y\n"
            "module M:\n  forward:\n    in: [4]\n    graph:\n      in -> out\n")
    assert errors(text, "relu")[0][:2] == ("E002", 1) and "is a primitive declaration" in errors(text, "relu")[0][3]
    assert errors(text, "Nope")[0][3] == "no declaration named 'Nope'"


def test_a_misspelled_declared_annotation_gets_a_did_you_mean():
    with pytest.raises(DiagnosticError) as info:
        lower_program(parse_source(ANNOTATED.replace("@tag(high)", "@tagg(high)"), "m.module"))
    assert info.value.diagnostics[0].hint.startswith("did you mean @tag?")


def test_stack_ranges_compute_what_the_whole_stack_computes():
    import numpy as np
    from xdsl.context import Context

    from modeldsl.passes.specialize import SpecializePass
    from modeldsl.runtime.executor import GraphExecutor

    text = (TESTS_DIR / "filecheck" / "frontend" / "stack-slices.module").read_text()
    ranged = ("      x0 -> blocks[0:8]() @partition(0) -> x8 @checkpoint\n"
              "      x8 -> blocks[8:n]() -> out @partition(1) @checkpoint\n")
    assert ranged in text
    rng = np.random.default_rng(0)
    weights = {"blocks.w": (np.eye(8) + 0.2 * rng.standard_normal((16, 8, 8))).astype(np.float32)}
    x = rng.standard_normal((2, 8)).astype(np.float32)
    outs = []
    for source in (text, text.replace(ranged, "      x0 -> blocks() -> out\n")):
        module = lower(source, name="pipeline.module")
        SpecializePass.of(B=2).apply(Context(), module)
        outs.append(GraphExecutor(module, weights, np.float32).run("forward", x)[0])
    assert np.abs(outs[1]).max() > 0.1 and np.array_equal(outs[0], outs[1])
    assert len([f for f in lower(text).walk() if f.name == "mdsl.graph.func" and f.sym_name.data == "blocks"]) == 1
    ((code, line, _, message),) = errors(text.replace("blocks[0:8]()", "blocks[0]()"))
    range_line = text[:text.index("blocks[0:8]()")].count("\n") + 1
    assert (code, line) == ("E004", range_line) and "a range of its layers" in message


def test_in_and_out_may_be_written_once_a_tensor_while_other_sections_may_not_repeat():
    text = ("module M(d: int = 8):\n  forward:\n    in: x: [B, d]\n    in: y: [B, d]\n    out: [B, d]\n"
            "    graph:\n      (x, y) -> add() -> out\n")
    inputs, _ = forward_types(lower(text))
    assert len(inputs) == 2
    repeated = text.replace("    graph:", "    save: []\n    save: []\n    graph:")
    assert [(c, line) for c, line, _, _ in errors(repeated)] == [("E001", 7)]
