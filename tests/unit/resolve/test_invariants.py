"""A primitive's ``invariants:`` section (spec 9.8.3): checked at the declaration, kept on the
model op, E006 where a module's save: list or its written backward lacks what one names, and
held by the backward ``mdsl-opt --verify-backward`` checks."""

import pytest
from xdsl.utils.exceptions import VerifyException

from modeldsl.diagnostics import DiagnosticError, DiagnosticSink
from modeldsl.frontend.text.parser import parse_source
from modeldsl.invariants import backward_problems, graph_problems, model_invariants
from modeldsl.ir import make_context, parse_module, print_ir
from modeldsl.lower import lower_program
from modeldsl.resolve.imports import STD_ROOT
from modeldsl.resolve.invariants import check_declared_invariants
from modeldsl.resolve.primitive_decls import check_primitive_decls
from modeldsl.tools.opt import main

SOFTMAX = """primitive softmax:
  params:
    dim: int = -1
  forward:
    in: x: [*]
    out: [*]
  backward:
    in: (d_out: [*], out: [*])
    out: d_x: [*]
  save: [out]
  invariants:
    - backward_uses: [out]
"""

DERIVED = SOFTMAX + """
module Probs(d: int = 4):
  params:
    w: [d, d]
    w2: [d, d]
  forward:
    in: x: [2, d, fp32]
    out: [2, d, fp32]
    graph:
      (x, w) -> matmul(transpose=NT) -> h
      h -> softmax() -> p
      (p, w2) -> matmul(transpose=NT) -> out
    save: [x, p]
"""

WRITTEN = SOFTMAX + """
module Probs(d: int = 4):
  params:
    w: [d, d, fp32]
  forward:
    in: x: [B, d, fp32]
    out: [B, d, fp32]
    graph:
      x -> matmul(w, transpose=NT) -> h
      h -> softmax() -> out
    save: [x, out]
  backward:
    d_out: [B, d, fp32]
    graph:
      (d_out, saved.out) -> softmax_backward() -> d_h
      (d_h, w) -> matmul(transpose=NN) -> d_x
      (d_h, saved.x) -> matmul(transpose=TN, accumulate=true) -> d_w
"""

# the written backward recomputes the softmax from h instead of taking its saved output
RECOMPUTED = WRITTEN.replace("save: [x, out]", "save: [x, h]").replace(
    "      (d_out, saved.out) -> softmax_backward() -> d_h",
    "      recompute:\n        saved.h -> softmax() -> p\n      (d_out, p) -> softmax_backward() -> d_h")


def declaration_diagnostics(text: str) -> list[tuple[str, int, int, str]]:
    sink = DiagnosticSink()
    decls = parse_source(text, "p.module").declarations
    check_primitive_decls(decls, sink)
    check_declared_invariants(decls, sink)
    return [(d.code, d.span.line, d.span.column, d.message) for d in sink.diagnostics]


def lowered(text: str, name: str = "m.module"):
    """The lowered program and the diagnostics lowering gave."""
    sink = DiagnosticSink()
    try:
        module = lower_program(parse_source(text, name), sink=sink)
    except DiagnosticError as error:
        return None, error.diagnostics
    return module, sink.diagnostics


def model_of(module):
    return next(iter(module.ops))


def test_a_well_formed_declaration_gives_no_diagnostic():
    assert declaration_diagnostics(SOFTMAX) == []


@pytest.mark.parametrize("entry, code, column, words", [
    ("- backward_usse: [out]", "E001", 7, "unknown invariant 'backward_usse'"),
    ("- backward_uses: [outt]", "E002", 23, "names 'outt', which is no tensor of its forward"),
    ("backward_uses: [out]", "E001", 5, "an invariant is `- backward_uses: [tensor, ...]`"),
    ("- backward_uses: out", "E001", 5, "an invariant is"),
    ("- backward_uses: [x]", "E006", 23, "backward uses 'x' (backward_uses), but its save: list leaves it out"),
])
def test_a_wrong_entry_is_a_coded_error_at_its_word(entry, code, column, words):
    found = declaration_diagnostics(SOFTMAX.replace("- backward_uses: [out]", entry))
    assert [(c, line, col) for c, line, col, _ in found] == [(code, 12, column)]
    assert words in found[0][3]


def test_a_tensor_the_backward_kernel_does_not_take_is_e006():
    text = SOFTMAX.replace("save: [out]", "save: [x, out]").replace("backward_uses: [out]", "backward_uses: [x]")
    found = declaration_diagnostics(text)
    assert [(c, line, col) for c, line, col, _ in found] == [(code, 12, 23) for code in ("E006",)]
    assert "its backward's in: takes d_out, out" in found[0][3]


def test_the_declaration_may_name_a_tensor_by_its_op_slot_or_its_written_name():
    named = SOFTMAX.replace("in: x: [*]", "in: logits: [*]").replace("save: [out]", "save: [logits, out]")
    for entry in ("- backward_uses: [out]", "- backward_uses: [out, out]"):
        assert declaration_diagnostics(named.replace("- backward_uses: [out]", entry)) == []


def test_the_std_softmax_declares_the_spec_invariant():
    decl = next(d for d in parse_source((STD_ROOT / "primitives" / "activation.module").read_text(),
                                        "activation.module").declarations if d.name == "softmax")
    assert [s.name for s in decl.sections("invariants")] == ["invariants"]


def test_the_lowered_model_keeps_the_invariants_of_the_primitives_it_uses():
    module, diagnostics = lowered(DERIVED)
    assert not [d for d in diagnostics if d.severity == "error"]
    model = model_of(module)
    assert model_invariants(model) == {"softmax": {"backward_uses": ["out"]}}
    assert model.attributes["invariants"].data["softmax"].data["at"].data == "m.module:12:5"
    text = print_ir(module)
    assert print_ir(parse_module(make_context(), text)[0]) == text


def test_a_program_that_does_not_use_the_primitive_keeps_nothing():
    module, _ = lowered(DERIVED.replace("h -> softmax() -> p", "h -> silu() -> p"))
    assert "invariants" not in model_of(module).attributes


def test_a_derived_backward_whose_save_list_leaves_out_the_tensor_is_e006_at_its_name():
    _, diagnostics = lowered(DERIVED.replace("save: [x, p]", "save: [x]"))
    errors = [d for d in diagnostics if d.code == "E006"]
    assert [(d.span.line, d.span.column) for d in errors] == [(23, 25)]
    assert "softmax's backward uses 'p'" in errors[0].message and errors[0].hint == "add it: save: [x, p]"
    assert not [d for d in diagnostics if d.code == "W003"]  # the error, not the recompute warning


def test_an_invariant_the_vjp_rule_contradicts_is_e006_at_the_invariant():
    text = DERIVED.replace("save: [out]", "save: [x, out]").replace("backward_uses: [out]", "backward_uses: [x]")
    _, diagnostics = lowered(text.replace("in: (d_out: [*], out: [*])", "in: (d_out: [*], x: [*])"))
    assert [(d.code, d.span.line, d.span.column) for d in diagnostics if d.severity == "error"] == [("E006", 12, 23)]
    assert "the gradient the compiler derives for it (its VJP rule) does not read x" in diagnostics[0].message
    model = model_of(lowered(DERIVED)[0])
    assert graph_problems(model) == []


def test_the_model_verifier_checks_the_attribute():
    module, _ = lowered(DERIVED)
    model = model_of(module)
    model.verify()
    text = print_ir(module).replace('backward_uses = ["out"]', 'backward_uses = ["logits"]')
    with pytest.raises(VerifyException, match="names 'logits', which is none of its operands and results"):
        parse_module(make_context(), text)[0].verify()


@pytest.mark.parametrize("source, which", [(DERIVED, "derived"), (WRITTEN, "written")])
def test_verify_backward_reports_the_invariants_held(tmp_path, capsys, source, which):
    path = tmp_path / "m.module"
    path.write_text(source)
    assert main([str(path), "--verify-backward", "--verify-shapes", "d=4"]) == 0
    out = capsys.readouterr().out
    assert f"invariants held by the {which} backward: softmax backward_uses: [out]\n" in out


def test_a_written_backward_that_does_not_take_the_saved_tensor_fails_verify_backward(tmp_path, capsys):
    path = tmp_path / "m.module"
    path.write_text(RECOMPUTED)
    assert main([str(path), "--verify-backward"]) == 1
    err = capsys.readouterr().err
    assert "error[E006]: the written backward @backward does not take 'out', which softmax's backward uses" in err
    assert "m.module:22:12" in err
    model = model_of(lowered(RECOMPUTED, str(path))[0])
    assert [p.code for p in backward_problems(model, "written")] == ["E006"]
    assert backward_problems(model, "derived") == []
