"""Lowering written backward sections (spec 5.10-5.12) and the graph evaluation order (5.11.5)."""

from pathlib import Path

import pytest

from modeldsl.diagnostics import DiagnosticError, DiagnosticSink
from modeldsl.frontend.text.parser import parse_source
from modeldsl.ir import make_context, parse_module, print_ir, verify_module
from modeldsl.lower import lower_program

STD = Path(__file__).resolve().parents[2] / "modeldsl" / "std" / "modules"

FORWARD = """module M(d: int = 8):
  params:
    w: [d, d]
{params}  forward:
    in: {inputs}
    out: [B, d]
    graph:
{forward}    save: [{save}]
  backward:
{declared}    graph:
{backward}"""

LINEAR_BACKWARD = (
    "      (d_out, w) -> matmul(transpose=NN) -> d_x\n"
    "      (d_out, saved.x) -> matmul(transpose=TN) -> d_w\n"
)


def source(backward=LINEAR_BACKWARD, forward="      x -> matmul(w, transpose=NT) -> out\n", save="x",
           params="", inputs="x: [B, d]", declared="    d_out: [B, d]\n"):
    return FORWARD.format(params=params, inputs=inputs, forward=forward, save=save, declared=declared,
                          backward=backward)


def lower(text, sink=None, top=None, config=None):
    return lower_program(parse_source(text, "m.module"), top, config, sink)


def errors(text):
    with pytest.raises(DiagnosticError) as info:
        lower(text)
    return [(d.code, d.span.line, d.span.column, d.message) for d in info.value.diagnostics]


def backward_func(ir):
    return next(op for op in ir.walk() if op.name == "mdsl.graph.func" and op.sym_name.data == "backward")


def names(attr):
    return [a.data for a in attr.data]


def test_backward_takes_output_gradients_and_saved_tensors_and_returns_required_gradients():
    ir = lower(source())
    assert verify_module(ir) == []
    func = backward_func(ir)
    assert [a.name_hint for a in func.body.block.args] == ["d_out", "saved_x"]
    assert names(func.attributes["saved"]) == ["x"] and names(func.attributes["grads"]) == ["d_x", "d_w"]
    assert [str(t) for t in func.function_type.outputs.data] == [
        "!mdsl.graph.tensor<[B, d], bf16>", "!mdsl.graph.tensor<[d, d], bf16>"]


def test_missing_gradient_of_a_parameter_is_e005():
    (err,) = errors(source(backward="      (d_out, w) -> matmul(transpose=NN) -> d_x\n", save="x"
                           ).replace("save: [x]", "save: []"))
    assert err[0] == "E005" and "d_w" in err[3] and "parameter 'w'" in err[3]


def test_frozen_parameters_and_skipped_inputs_need_no_gradient():
    text = source(params="    s: [d] @frozen\n", inputs="(x: [B, d], mask: [B, d] @gradient(skip))",
                  forward="      (x, mask) -> mul() -> xm\n      xm -> matmul(w, transpose=NT) -> out\n",
                  save="x, xm",
                  backward="      (d_out, w) -> matmul(transpose=NN) -> d_x\n"
                           "      (d_out, saved.xm) -> matmul(transpose=TN) -> d_w\n"
                           "      saved.x -> relu() -> unused\n")
    func = backward_func(lower(text))
    assert names(func.attributes["grads"]) == ["d_x", "d_w"]


def test_missing_gradient_of_an_input_is_e005():
    (err,) = errors(source(backward="      (d_out, saved.x) -> matmul(transpose=TN) -> d_w\n"))
    assert err[0] == "E005" and "d_x" in err[3] and "input 'x'" in err[3]


def test_saved_name_not_in_the_save_list_is_e006():
    text = source(forward="      x -> relu() -> h\n      h -> matmul(w, transpose=NT) -> out\n",
                  backward="      (d_out, w) -> matmul(transpose=NN) -> d_x\n"
                           "      (d_out, saved.h) -> matmul(transpose=TN) -> d_w\n")
    codes = errors(text)
    assert codes[0][:3] == ("E006", 15, 15) and "'h' is not in the forward's save: list" in codes[0][3]


def test_forward_tensor_read_without_saved_is_e006():
    warning, err = errors(source(backward="      (d_out, w) -> matmul(transpose=NN) -> d_x\n"
                                          "      (d_out, x) -> matmul(transpose=TN) -> d_w\n"))
    assert warning[0] == "W004"  # saved but read without saved.
    assert err[:3] == ("E006", 14, 15) and "not available in the backward" in err[3]


def test_unused_saved_tensor_is_w004():
    sink = DiagnosticSink()
    text = source(forward="      x -> relu() -> h\n      h -> matmul(w, transpose=NT) -> out\n", save="x, h",
                  backward="      (d_out, w) -> matmul(transpose=NN) -> d_h\n"
                           "      (d_h, saved.x) -> relu_backward() -> d_x\n"
                           "      (d_out, saved.h) -> matmul(transpose=TN) -> d_w\n")
    lower(text, sink)
    assert [(d.code, d.span.line) for d in sink.diagnostics] == []
    lower(text.replace("save: [x, h]", "save: [x, h, out]"), sink)
    (warning,) = sink.diagnostics
    assert warning.code == "W004" and "'out' is never read" in warning.message


def test_gradient_of_the_wrong_shape_is_e018():
    codes = errors(source(backward="      (d_out, w) -> matmul(transpose=NN) -> d_x\n"
                                   "      (saved.x, d_out) -> matmul(transpose=TN) -> d_w\n"
                                   "      d_w -> transpose(0, 1) -> d_wt\n",
                          declared="    d_out: [B, d]\n    d_x: [B, 2 * d]\n"))
    assert codes[0][:2] == ("E018", 12) and "gradient 'd_x'" in codes[0][3]


def test_computed_gradient_of_the_wrong_shape_is_e018():
    text = source(backward="      (d_out, w) -> matmul(transpose=NN) -> d_x\n"
                           "      (d_out, saved.x) -> matmul(transpose=TN) -> dw\n"
                           "      (dw, dw) -> concat(dim=0) -> d_w\n")
    (err,) = errors(text)
    assert err[0] == "E018" and "gradient 'd_w'" in err[3]


def test_gradient_of_a_non_float_dtype_is_e020():
    (err,) = errors(source(declared="    d_out: [B, d, int32]\n"))
    assert err[:2] == ("E020", 11) and "int32" in err[3]


def test_wider_gradient_dtypes_are_compatible_and_cast():
    sink = DiagnosticSink()
    func = backward_func(lower(source(declared="    d_out: [B, d, fp32]\n"), sink))
    assert str(func.body.block.args[0].type) == "!mdsl.graph.tensor<[B, d], fp32>"
    assert "mdsl.graph.cast" in print_ir(func)


def test_circular_gradient_dependency_is_e019():
    text = source(backward="      (d_y, w) -> matmul(transpose=NN) -> d_x\n"
                           "      (d_x, w) -> matmul(transpose=NN) -> d_y\n"
                           "      (d_out, saved.x) -> matmul(transpose=TN) -> d_w\n")
    codes = errors(text)
    assert codes[0][:3] == ("E019", 13, 7)
    assert "d_x <- d_y <- d_x" in codes[0][3] or "d_y <- d_x <- d_y" in codes[0][3]
    assert [c[0] for c in codes] == ["E019"]  # the names on the cycle stay quiet afterwards


def test_circular_forward_dependency_is_e007_and_order_is_topological():
    (err,) = errors(source(forward="      a -> relu() -> b\n      b -> relu() -> a\n"
                                   "      x -> matmul(w, transpose=NT) -> out\n"))
    assert err[0] == "E007" and "circular data dependency" in err[3]
    ir = lower(source(forward="      h -> matmul(w, transpose=NT) -> out\n      x -> relu() -> h\n", save="x, h",
                      backward="      (d_out, w) -> matmul(transpose=NN) -> d_h\n"
                               "      (d_h, saved.x) -> relu_backward() -> d_x\n"
                               "      (d_out, saved.h) -> matmul(transpose=TN) -> d_w\n"))
    forward = next(op for op in ir.walk() if op.name == "mdsl.graph.func")
    assert [op.name for op in forward.body.block.ops][:2] == ["mdsl.graph.relu", "mdsl.graph.param_ref"]


def test_accumulate_true_adds_contributions_and_tied_names_share_a_gradient():
    text = """module Tied(d: int = 8):
  params:
    w: [d, d]
    w2: tied_to(w)
  forward:
    in: x: [B, d]
    out: [B, d]
    graph:
      x -> matmul(w, transpose=NT) -> h
      h -> matmul(w2, transpose=NT) -> out
    save: [x, h]
  backward:
    graph:
      (d_out, w2) -> matmul(transpose=NN) -> d_h
      (d_out, saved.h) -> matmul(transpose=TN, accumulate=true) -> d_w
      (d_h, w) -> matmul(transpose=NN) -> d_x
      (d_h, saved.x) -> matmul(transpose=TN, accumulate=true) -> d_w
      (d_h, saved.x) -> matmul(transpose=TN) -> d_w2
"""
    func = backward_func(lower(text))
    ops = [op.name for op in func.body.block.ops]
    assert ops.count("mdsl.graph.add") == 2  # two accumulations into d_w, then d_w2 joins d_w
    assert names(func.attributes["grads"]) == ["d_x", "d_w"]
    assert "accumulate" not in print_ir(func)


def test_a_second_assignment_without_accumulate_is_e017():
    codes = errors(source(backward=LINEAR_BACKWARD + "      (d_out, saved.x) -> matmul(transpose=TN) -> d_w\n"))
    assert codes[0][0] == "E017"


def test_recompute_blocks_rebuild_forward_tensors_and_read_only_saved_ones():
    text = source(forward="      x -> relu() -> h\n      h -> matmul(w, transpose=NT) -> out\n",
                  backward="      recompute:\n"
                           "        saved.x -> relu() -> h\n"
                           "      (d_out, w) -> matmul(transpose=NN) -> d_h\n"
                           "      (d_h, saved.x) -> relu_backward() -> d_x\n"
                           "      (d_out, h) -> matmul(transpose=TN) -> d_w\n")
    func = backward_func(lower(text))
    relu = next(op for op in func.body.block.ops if op.name == "mdsl.graph.relu")
    assert "recompute" in relu.attributes
    bad = text.replace("saved.x -> relu() -> h", "d_out -> relu() -> h")
    assert [c[:2] for c in errors(bad)] == [("E021", 15)]


def test_recompute_cycle_is_e022():
    text = source(backward="      recompute:\n"
                           "        a -> relu() -> b\n"
                           "        b -> relu() -> a\n" + LINEAR_BACKWARD)
    codes = errors(text)
    assert [c[:2] for c in codes] == [("E022", 14)]


def test_unknown_gradient_declaration_and_recompute_in_forward_are_reported():
    codes = errors(source(declared="    d_out: [B, d]\n    d_nothing: [B, d]\n"))
    assert codes[0][:2] == ("E002", 12) and "d_nothing" in codes[0][3]
    codes = errors(source(forward="      recompute:\n        x -> relu() -> y\n"
                                  "      x -> matmul(w, transpose=NT) -> out\n"))
    assert codes[0][0] == "E001" and "backward graph" in codes[0][3]


@pytest.mark.parametrize("top, config, grads", [
    ("Linear", {"in_dim": 8, "out_dim": 4}, ["d_in", "d_weight"]),
    ("Linear", {"in_dim": 8, "out_dim": 4, "bias": True}, ["d_in", "d_weight", "d_bias"]),
])
def test_std_linear_backward(top, config, grads):
    ir = lower((STD / "linear.module").read_text(), top=top, config=config)
    assert verify_module(ir) == []
    assert names(backward_func(ir).attributes["grads"]) == grads


def test_std_swiglu_backward_recomputes_the_hidden_activations():
    ir = lower((STD / "mlp.module").read_text(), top="SwiGLU_MLP", config={"d_model": 16, "d_ff": 32})
    func = backward_func(ir)
    assert names(func.attributes["saved"]) == ["in", "gate_up"]  # the projection is saved, not replayed
    assert names(func.attributes["grads"]) == ["d_in", "d_up_weight", "d_down_weight"]
    recomputed = [op.name for op in func.body.block.ops if "recompute" in op.attributes]
    assert recomputed == ["mdsl.graph.split", "mdsl.graph.swiglu"]


# ---------------------------------------------------------------------------- sub-modules with a written backward

NESTED = """module Proj(d: int):
  params:
    weight: [d, d]
    norm: [d] @frozen
  forward:
    in: (x: [*, d], gate: [*, d] @gradient(skip))
    out: [*, d]
    graph:
      (x, gate) -> mul() -> xg
      xg -> matmul(weight, transpose=NT) -> out
    save: [xg]
  backward:
    d_out: [*, d, fp32]
    graph:
      (d_out, weight) -> matmul(transpose=NN) -> d_xg
      (d_xg, gate) -> mul() -> d_x
      (d_out, saved.xg) -> matmul(transpose=TN) -> d_weight

model M(d: int = 8):
  params:
    proj: Proj(d)
  forward:
    in: (x: [B, T, d], g: [B, T, d])
    out: [B, T, d]
    graph:
      (x, g) -> proj -> out
"""


def test_a_sub_module_with_a_written_backward_is_called_with_its_parameters_as_arguments():
    ir = lower(NESTED.replace("(d_xg, gate)", "(d_xg, saved.gate)").replace("save: [xg]", "save: [xg, gate]"))
    assert verify_module(ir) == []
    funcs = {op.sym_name.data: op for op in ir.walk() if op.name == "mdsl.graph.func"}
    assert list(funcs) == ["forward", "proj_forward", "proj_backward"]  # helpers after the model's own
    (call,) = [op for op in funcs["forward"].body.block.ops if op.name == "mdsl.graph.call"]
    assert call.callee.root_reference.data == "proj_forward"
    assert [v.name_hint for v in call.arguments] == ["x", "g", "proj_weight", "proj_norm"]
    forward = funcs["proj_forward"]
    assert forward.kind.data == "helper" and forward.attributes["backward"].root_reference.data == "proj_backward"
    assert names(forward.attributes["saved"]) == ["gate", "xg"] and names(forward.attributes["params"]) == [
        "weight", "norm"]
    # the call's types, not the declared [*, d]; the outputs, then the saved tensors
    assert [str(t) for t in forward.function_type.outputs.data] == ["!mdsl.graph.tensor<[B, T, d], bf16>"] * 3
    backward = funcs["proj_backward"]
    assert backward.kind.data == "backward"
    assert [a.name_hint for a in backward.body.block.args] == ["d_out", "saved_gate", "saved_xg", "weight", "norm"]
    assert str(backward.body.block.args[0].type) == "!mdsl.graph.tensor<[B, T, d], fp32>"  # the declared dtype
    # d_gate skipped, d_norm frozen; grad_args index the forward's arguments (x, gate, weight, norm)
    assert names(backward.attributes["grads"]) == ["d_x", "d_weight"]
    assert list(backward.attributes["grad_args"].get_values()) == [0, 2]
    assert "backward" not in funcs  # the top has no backward of its own
    parsed, _ = parse_module(make_context(), print_ir(ir))
    assert verify_module(parsed) == [] and print_ir(parsed) == print_ir(ir)  # it round-trips


def test_a_sub_modules_backward_reading_a_forward_tensor_without_saved_is_e006_at_its_line():
    codes = [c for c in errors(NESTED) if c[0].startswith("E")]
    assert codes == [("E006", 16, 14, "the forward tensor 'gate' is not available in the backward")]


def test_the_instances_inside_a_called_module_stay_inlined_under_its_written_backward():
    text = """module Inner(d: int):
  params:
    w: [d]
  forward:
    in: [*, d]
    out: [*, d]
    graph:
      (in, w) -> mul() -> out
  backward:
    graph:
      (d_out, w) -> mul() -> d_in
      d_out -> reduce_sum(dims=[0, 1]) -> d_w

module Outer(d: int):
  params:
    inner: Inner(d)
  forward:
    in: [*, d]
    out: [*, d]
    graph:
      in -> inner -> h
      h -> relu() -> out
    save: [h]
  backward:
    graph:
      (d_out, saved.h) -> relu_backward() -> d_h
      (d_h, inner.w) -> mul() -> d_in
      d_h -> reduce_sum(dims=[0, 1]) -> d_inner_w

model M(d: int = 8):
  params:
    outer: Outer(d)
  forward:
    in: x: [B, T, d]
    out: [B, T, d]
    graph:
      x -> outer -> out
"""
    ir = lower(text)
    funcs = {op.sym_name.data: op for op in ir.walk() if op.name == "mdsl.graph.func"}
    assert list(funcs) == ["forward", "outer_forward", "outer_backward"]  # no inner_forward
    assert [op.name for op in funcs["outer_forward"].body.block.ops] == [
        "mdsl.graph.mul", "mdsl.graph.relu", "mdsl.graph.return"]
    assert names(funcs["outer_backward"].attributes["grads"]) == ["d_in", "d_inner_w"]
    assert names(funcs["outer_forward"].attributes["params"]) == ["inner_w"]
