"""An unknown word in Module DSL text is an error with its code, its file:line:col, a caret and the
closest known word (difflib), never dropped: a section name at any place whose keys are words of
the language (modeldsl/resolve/sections.py), a flow stage that calls no primitive or module (E014),
a parameter's module that is not declared (E002). The Python DSL's half is
tests/unit/frontend/python/test_unknown_words.py."""

from __future__ import annotations

import pytest

from modeldsl.diagnostics import DiagnosticError, DiagnosticSink
from modeldsl.frontend.text.parser import parse_source
from modeldsl.lower import lower_program
from modeldsl.resolve.sections import check_sections

MODULE = '''\
from std.modules.linear import Linear

module M(d: int = 8):
  let:
    h = d * 2
    constraint:
      d > 0, "d is positive"
  params:
    w: [d, d]
  forward:
    in: x: [B, d]
    out: [B, d]
    graph:
      x -> matmul(w, transpose=NT) -> y
      y -> relu() -> out
    save: [x]
    recompute: [y]
'''

BLOCK = '''\
block Layer(d: int = 8):
  params:
    w: [d]
  forward:
    in: x: [B, d]
    out: [B, d]
    graph:
      (x, w) -> mul() -> out
'''

BACKWARD = '''\
module S(d: int = 4):
  params:
    s: [d]
  forward:
    in: [B, d]
    out: [B, d]
    graph:
      (in, s) -> mul() -> out
    save: [in]
  backward:
    d_out: [B, d]
    graph:
      (d_out, s) -> mul() -> d_in
      (d_out, saved.in) -> mul() -> g
      g -> reduce_sum(dims=[0]) -> d_s
'''

PRIMITIVE = '''\
primitive relu:
  forward:
    in: x: [*]
    out: y: [*]
  backward:
    in: (d_y, x)
    out: d_x
  impl:
    forward: kernels.relu
    backward: kernels.relu_backward
'''


def problems(source: str, top: str | None = None) -> list:
    with pytest.raises(DiagnosticError) as err:
        lower_program(parse_source(source, "bad.module"), top, None, DiagnosticSink())
    return err.value.diagnostics


def at(diagnostic, source: str, text: str, occurrence: int = 1) -> bool:
    """Located at the ``occurrence``-th ``text`` of ``source`` (in bad.module), with a caret under it."""
    index = -1
    for _ in range(occurrence):
        index = source.index(text, index + 1)
    line = source.count("\n", 0, index) + 1
    column = index - (source.rfind("\n", 0, index) + 1) + 1
    rendered = diagnostic.render()
    return (diagnostic.span.line, diagnostic.span.column) == (line, column) and \
        diagnostic.span.source.name == "bad.module" and f"bad.module:{line}:{column}:" in rendered and "^" in rendered


def test_the_well_spelled_sections_lower():
    for source, top in ((MODULE, "M"), (BLOCK, "Layer"), (BACKWARD, "S"), (PRIMITIVE + BLOCK, "Layer")):
        lower_program(parse_source(source, "ok.module"), top, None, DiagnosticSink())


@pytest.mark.parametrize("source, wrong, right, where", [
    (MODULE, "    recompute:", "    recompte:", "the forward: section of module M"),
    (MODULE, "    save:", "    saev:", "the forward: section of module M"),
    (MODULE, "    graph:", "    grpah:", "the forward: section of module M"),
    (MODULE, "    out:", "    otu:", "the forward: section of module M"),
    (MODULE, "  params:", "  parms:", "module M"),
    (MODULE, "  forward:", "  froward:", "module M"),
    (MODULE, "    constraint:", "    constraints:", "the let: section of module M"),
    (BLOCK, "  params:", "  paramss:", "block Layer"),
    (BACKWARD, "  backward:", "  backwrd:", "module S"),
    (BACKWARD, "    graph:\n      (d_out", "    grap:\n      (d_out", "the backward: section of module S"),
    (PRIMITIVE, "  impl:", "  impel:", "primitive relu"),
    (PRIMITIVE, "    backward: kernels", "    bakward: kernels", "the impl: section of primitive relu"),
    (PRIMITIVE, "    out: d_x", "    outs: d_x", "the backward: section of primitive relu"),
])
def test_a_misspelled_section_is_e001_with_the_closest_word(source, wrong, right, where):
    assert source.count(wrong) == 1
    bad = source.replace(wrong, right)
    word, expected = right.split(":")[0].strip(), wrong.split(":")[0].strip()
    top = {id(MODULE): "M", id(BLOCK): "Layer", id(BACKWARD): "S"}.get(id(source), "Layer")
    program = bad + (BLOCK if source is PRIMITIVE else "")
    found = [d for d in problems(program, top) if d.code == "E001" and "unknown section" in d.message]
    assert len(found) == 1, [d.render() for d in found]
    (diagnostic,) = found
    assert diagnostic.message == f"unknown section '{word}:' in {where}"
    assert at(diagnostic, bad, word + ":") and f"did you mean '{expected}:'?" in diagnostic.hint


def test_a_section_of_another_kind_says_whose_it_is():
    bad = MODULE.replace("    recompute: [y]\n", "    recompute: [y]\n  hf_mapping:\n    w: \"x.weight\"\n")
    (diagnostic,) = [d for d in problems(bad, "M") if d.code == "E001"]
    assert diagnostic.message == "module M has a hf_mapping: section, which is a model's"
    assert at(diagnostic, bad, "hf_mapping") and "a module takes let:, params:, forward:, backward:" in diagnostic.hint


def test_a_constants_section_is_refused_with_what_to_write_instead():
    bad = MODULE.replace("  params:\n", "  constants:\n    freqs: precompute_rope_freqs(d)\n  params:\n")
    (diagnostic,) = [d for d in problems(bad, "M") if d.code == "E001"]
    assert "has a constants: section, which this compiler does not lower" in diagnostic.message
    assert at(diagnostic, bad, "constants") and "declare the tensor as a forward input" in diagnostic.hint


def test_gradient_declarations_are_the_backwards_own_names():
    sink = DiagnosticSink()
    check_sections(parse_source(BACKWARD.replace("d_out: [B, d]", "d_out: [B, d]\n    d_in: [B, d]"),
                                "ok.module").declarations, sink)
    assert not sink.diagnostics


def test_imported_files_are_checked_too(tmp_path):
    (tmp_path / "lib.module").write_text(BLOCK.replace("  forward:", "  froward:"))
    main = tmp_path / "main.module"
    main.write_text("from lib import Layer\n\nmodel M(d: int = 8):\n  params:\n    l: Layer(d)\n  forward:\n"
                    "    in: x: [B, d]\n    out: [B, d]\n    graph:\n      x -> l -> out\n")
    with pytest.raises(DiagnosticError) as err:
        lower_program(parse_source(main.read_text(), str(main)), "M", None, DiagnosticSink())
    (diagnostic,) = [d for d in err.value.diagnostics if "unknown section" in d.message]
    assert diagnostic.span.source.name.endswith("lib.module") and (diagnostic.span.line, diagnostic.span.column) \
        == (4, 3) and "did you mean 'forward:'?" in diagnostic.hint


@pytest.mark.parametrize("wrong, right, close", [
    ("relu()", "rellu()", "relu"),
    ("relu()", "rmsnrom()", "rmsnorm"),
    ("relu()", "Linaer(w)", "Linear"),
])
def test_an_unknown_call_in_a_flow_is_e014_with_the_closest_primitive_or_module(wrong, right, close):
    bad = MODULE.replace(wrong, right)
    (diagnostic,) = problems(bad, "M")
    word = right.split("(")[0]
    assert diagnostic.code == "E014" and diagnostic.message == f"unknown primitive or module '{word}'"
    assert at(diagnostic, bad, word) and diagnostic.hint.startswith(f"did you mean '{close}'?")


def test_a_stack_or_instance_is_offered_for_a_misspelled_stage():
    source = BLOCK + '''
model N(d: int = 8, n: int = 2):
  params:
    blocks: [n] x Layer(d)
  forward:
    in: x: [B, d]
    out: [B, d]
    graph:
      x -> blokcs -> out
'''
    (diagnostic,) = problems(source, "N")
    assert diagnostic.code == "E014" and at(diagnostic, source, "blokcs") and "did you mean 'blocks'?" in \
        diagnostic.hint


def test_an_undeclared_parameter_module_is_e002_with_the_closest_or_its_std_import():
    bad = MODULE.replace("    w: [d, d]\n", "    w: [d, d]\n    lin: Linaer(d, d)\n    mlp: SwiGLU_MLP(d, d)\n")
    first, second = problems(bad, "M")
    assert first.code == second.code == "E002"
    assert at(first, bad, "Linaer") and first.hint.startswith("did you mean 'Linear'?")
    assert at(second, bad, "SwiGLU_MLP") and second.hint == "import it: from std.modules.mlp import SwiGLU_MLP"
