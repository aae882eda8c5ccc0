"""``primitive`` declarations against the op registry: the std declarations, user
declarations that disagree (E003, E004, E009, E014), and ``import std.primitives``."""

import re
from pathlib import Path

import pytest
from spec_blocks import SPEC, spec_code_blocks

from modeldsl.diagnostics import DiagnosticError, DiagnosticSink
from modeldsl.frontend.text.parser import parse_source
from modeldsl.lower import lower_program
from modeldsl.primitives import lookup_primitive
from modeldsl.resolve.imports import STD_ROOT, resolve_program
from modeldsl.resolve.primitive_decls import check_primitive_decls, declared_params, positional_params

PRIMITIVES_DIR = STD_ROOT / "primitives"
PRIMITIVE_FILES = sorted(PRIMITIVES_DIR.glob("*.module"))


def check(text: str, name: str = "user.module"):
    """(code, line, column, message) of every diagnostic of the declarations of ``text``."""
    sink = DiagnosticSink()
    check_primitive_decls(parse_source(text, name).declarations, sink)
    return [(d.code, d.span.line, d.span.column, d.message) for d in sink.diagnostics]


def std_declarations():
    """Every declaration of the std primitives (the newest file of each name) by name."""
    decls = {}
    for path in PRIMITIVE_FILES:
        if re.search(r"\.v\d+\.module$", path.name):
            continue
        for decl in parse_source(path.read_text(), str(path)).declarations:
            assert decl.name not in decls, f"{decl.name} is declared twice in std/primitives"
            decls[decl.name] = decl
    return decls


def backward_kernels(decl) -> list[str]:
    """``NAME_backward`` when the declaration's backward: section describes that kernel (in:/out:)."""
    sections = [s for b in decl.sections("backward") for s in b.body if getattr(s, "name", None) in ("in", "out")]
    return [f"{decl.name}_backward"] if sections and sections[-1].value.default is None else []


def section_6_primitives() -> list[str]:
    lines = SPEC.read_text().split("\n")
    start = next(i for i, line in enumerate(lines, 1) if line.startswith("## 6. "))
    end = next(i for i, line in enumerate(lines, 1) if line.startswith("## 7. "))
    return [m.group(1) for line, text in spec_code_blocks()
            if start < line < end and (m := re.match(r"primitive (\w+):", text))]


# ----------------------------------------------------------------------------- std


@pytest.mark.parametrize("path", PRIMITIVE_FILES, ids=lambda p: p.name)
def test_every_std_primitives_file_parses_resolves_and_agrees_with_the_registry(path):
    program = parse_source(path.read_text(), str(path))
    assert program.declarations and all(d.kind == "primitive" for d in program.declarations)
    sink = DiagnosticSink()
    resolve_program(program, sink)
    assert sink.diagnostics == [], "\n".join(d.render() for d in sink.diagnostics)


def test_every_section_6_primitive_is_a_registry_op_declared_in_std():
    names = section_6_primitives()
    assert len(names) == 39 and len(set(names)) == 39
    assert [n for n in names if lookup_primitive(n) is None] == []
    assert sorted(set(names) - set(std_declarations())) == []


def test_a_backward_op_is_declared_in_its_forwards_backward_section():
    """(That every op is declared: tests/unit/test_primitive_registry.py.)"""
    assert [n for n in std_declarations() if n.endswith("_backward")] == []


def test_std_declarations_list_the_ops_parameters_in_positional_order():
    for name, decl in std_declarations().items():
        written = [p.name for p in declared_params(decl)[0]]
        assert written == [p.name for p in positional_params(lookup_primitive(name))], name


def test_the_std_files_follow_the_spec_10_1_layout():
    names = {p.name for p in PRIMITIVE_FILES}
    assert {"matmul.module", "matmul.v1.module", "rmsnorm.module", "attention.module"} <= names


# Where the spec's own section-6 blocks still disagree with the registry, each deliberately:
# primitive -> [(code, spec line, column)]. The std declarations say the same with valid DSL.
SPEC_DISAGREEMENTS = {
    # prose in the block, not Module DSL (spec 3's grammar has no comprehension, no free text there)
    "split": [("E001", 2246, 33)],  # out: tuple([*, sizes[i], *] for i in range(len(sizes)))
    "view": [("E001", 2374, 9)],  # constraints: - x must be contiguous
    "contiguous": [("E001", 2543, 44)],  # impl: kernels.copy if not contiguous, else no-op
    # broadcast(d_out, original_shape) names no primitive of section 6: without the reduced dims a
    # broadcast back to x's shape is ambiguous; the VJP writes it as mul(ones(x's shape), view(d_out))
    "reduce_sum": [("E014", 2796, 16)],
    "reduce_mean": [("E014", 2851, 16)],
    # in: (d_combined, weights, scatter_indices) cannot give d_weights = <d_combined, expert_outputs>:
    # the backward kernel takes expert_outputs too
    "moe_unpermute": [("E004", 3140, 9)],
}


def test_the_spec_section_6_blocks_disagree_with_the_registry_exactly_where_known():
    found = {}
    lines = SPEC.read_text().split("\n")
    start = next(i for i, line in enumerate(lines, 1) if line.startswith("## 6. "))
    end = next(i for i, line in enumerate(lines, 1) if line.startswith("## 7. "))
    for line, text in spec_code_blocks():
        match = re.match(r"primitive (\w+):", text)
        if not (start < line < end and match):
            continue
        try:
            diagnostics = [(c, line + at, col) for c, at, col, _ in check(text, f"spec{line}.module")]
        except DiagnosticError as err:
            diagnostics = [(d.code, line + d.span.line, d.span.column) for d in err.diagnostics]
        if diagnostics:
            found[match.group(1)] = diagnostics
    assert found == SPEC_DISAGREEMENTS


# ------------------------------------------------------------------------- users


SOFTMAX = """primitive softmax:
  params:
    dim: int = -1
  forward:
    in: x: [*]
    out: [*]
  backward:
    in: (d_out, out)
    out: d_x
"""


def test_a_declaration_that_agrees_has_no_diagnostics():
    assert check(SOFTMAX) == []


@pytest.mark.parametrize(
    "old, new, code, line, column, words",
    [
        ("dim: int = -1", "dim: float = -1", "E003", 3, 10, "is float here but int in the op"),
        ("dim: int = -1", "dim: int = 0", "E003", 3, 16, "defaults to 0 here but to -1 in the op"),
        ("dim: int = -1", "dim: int", "E003", 3, 5, "has no default here but the op's default is -1"),
        ("dim: int = -1", "dim: int? = None", "E003", 3, 10, "is optional here but not optional in the op"),
        ("dim: int = -1", "dim: int = -1\n    axis: int = 0", "E003", 4, 5, "has no parameter 'axis'"),
        ("dim: int = -1", "dim: int = -1\n    dim: int = -1", "E009", 4, 5, "declares the parameter 'dim' twice"),
        ("in: x: [*]", "in: (x: [*], y: [*])", "E004", 5, 9,
         "declares 2 tensor input(s) (x, y) but the op softmax has 1"),
        ("out: [*]", "out: (y: [*], stats: [*])", "E004", 6, 10, "declares 2 output(s)"),
        ("in: x: [*]", "in: x: [*]?", "E004", 5, 9, "optional or variadic in other places"),
        ("in: (d_out, out)", "in: (d_out, x, out)", "E004", 8, 9, "softmax_backward declares 3 tensor input(s)"),
        ("primitive softmax:", "primitive softmaxx:", "E014", 1, 11, "no kernel registered for primitive softmaxx"),
    ],
)
def test_a_declaration_that_disagrees_is_located_and_coded(old, new, code, line, column, words):
    assert old in SOFTMAX
    found = check(SOFTMAX.replace(old, new))
    assert len(found) == 1, found
    assert found[0][:3] == (code, line, column) and words in found[0][3], found


def test_missing_parameters_are_named_with_the_declaration_they_need():
    text = "primitive transpose:\n  forward:\n    in: x: [*]\n    out: [*]\n"
    sink = DiagnosticSink()
    check_primitive_decls(parse_source(text).declarations, sink)
    (diag,) = sink.diagnostics
    assert (diag.code, diag.span.line, diag.span.column) == ("E003", 1, 11)
    assert "does not declare the parameter(s) dim0, dim1" in diag.message
    assert diag.hint == "declare dim0: int; dim1: int" and "^^^^^^^^^" in diag.render()
    (found,) = check("primitive transpose:\n  params:\n    dim0: int\n  forward:\n    in: x: [*]\n    out: [*]\n")
    assert found[:3] == ("E003", 2, 3) and "does not declare the parameter(s) dim1" in found[3]


def test_a_parameter_with_a_default_may_be_left_out_where_no_declared_one_follows_it():
    assert check(SOFTMAX.replace("  params:\n    dim: int = -1\n", "")) == []
    head = "primitive matmul:\n  params:\n    transpose: enum(NN, NT, TN, TT) = NN\n"
    tail = "  forward:\n    in: (A: [M, K], B: [K, N])\n    out: C: [M, N]\n"
    assert check(head + "    accumulate: bool = false\n" + tail) == []  # alpha and beta left out
    # calls pass parameters positionally in the op's order: beta would take the place of accumulate
    (found,) = check(head + "    beta: float = 0.0\n" + tail)
    assert found[:3] == ("E003", 4, 5), found
    assert "leaves out the parameter(s) accumulate, alpha but declares beta after them" in found[3]


def spec_declaration(name: str) -> str:
    """The spec's own block ``primitive NAME:``, verbatim."""
    (text,) = [text for _, text in spec_code_blocks() if text.startswith(f"primitive {name}:")]
    return text


@pytest.mark.parametrize("name", ["batched_matmul", "rope", "flash_attention"])
def test_the_spec_declarations_that_leave_out_defaulted_parameters_agree_with_the_registry(name):
    """Spec 6.1.2's batched_matmul has no alpha, 6.4.2's rope no layout, 6.4.1's flash_attention no
    layout or softcap (all defaulted) and spells the optional tensor alibi_slopes as a parameter."""
    text = spec_declaration(name)
    assert {"batched_matmul": "accumulate: bool", "rope": "interleaved: bool",
            "flash_attention": "alibi_slopes: [H]? = None"}[name] in text
    assert check(text, f"{name}.module") == []


SPEC_ATTENTION_USER = """
module Scores():
  forward:
    in: (q: [1, 2, 4, 8], k: [1, 2, 4, 8])
    out: [1, 2, 4, 4]
    graph:
      (q, k) -> batched_matmul(transpose=NT) -> out

module Attention():
  forward:
    in: (q: [1, 2, 4, 8], k: [1, 2, 4, 8], v: [1, 2, 4, 8], slopes: [2])
    out: [1, 2, 4, 8]
    graph:
      (q, k, v) -> flash_attention(true, alibi_slopes=slopes) -> out
"""


def test_a_program_with_the_spec_declarations_verbatim_lowers_and_runs():
    import numpy as np

    from modeldsl.ir import verify_module
    from modeldsl.runtime.executor import GraphExecutor

    text = "\n".join(spec_declaration(n) for n in ("batched_matmul", "rope", "flash_attention")) + SPEC_ATTENTION_USER
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 2, 4, 8)) for _ in range(3))
    slopes = np.array([0.5, 0.25])
    scores = GraphExecutor(lower_program(parse_source(text, "spec.module"), "Scores"), {},
                           float_dtype=np.float64).run("forward", q, k)[0]
    np.testing.assert_allclose(scores, q @ np.swapaxes(k, -1, -2), rtol=1e-12)
    module = lower_program(parse_source(text, "spec.module"), "Attention")
    assert verify_module(module) == []
    (op,) = [op for op in module.walk() if op.name == "mdsl.graph.flash_attention"]
    assert [a.name_hint for a in op.operands] == ["q", "k", "v", "slopes"]  # the parameter is the tensor operand
    (got,) = GraphExecutor(module, {}, float_dtype=np.float64).run("forward", q, k, v, slopes)
    distance = np.abs(np.arange(4)[:, None] - np.arange(4)[None, :])
    logits = q @ np.swapaxes(k, -1, -2) / np.sqrt(8) - slopes.reshape(1, 2, 1, 1) * distance
    logits = np.where(np.tril(np.ones((4, 4), bool)), logits, -np.inf)
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    np.testing.assert_allclose(got, weights / weights.sum(-1, keepdims=True) @ v, rtol=1e-10)


@pytest.mark.parametrize(
    "params, code, line, column, words",
    [
        # enum choices, order, required and optional parameters of the op
        ("    transpose: enum(NN, NT) = NN\n    accumulate: bool = false\n    alpha: float = 1.0\n"
         "    beta: float = 0.0\n",
         "E003", 3, 16, "allows NN, NT here but the op allows NN, NT, TN, TT"),
        ("    transpose: enum(NN, NT, TN, TT) = XY\n    accumulate: bool = false\n    alpha: float = 1.0\n"
         "    beta: float = 0.0\n", "E003", 3, 39, "defaults to XY here but to NN"),
        ("    accumulate: bool = false\n    transpose: enum(NN, NT, TN, TT) = NN\n    alpha: float = 1.0\n"
         "    beta: float = 0.0\n", "E003", 3, 5, "calls pass them positionally as transpose, accumulate"),
        ("    transpose: enum(NN, NT, TN, TT) = NN\n    accumulate: bool = 0\n    alpha: float = 1.0\n"
         "    beta: float = 0.0\n", "E003", 4, 24, "defaults to 0 here but to false"),
        ("    transpose: enum(NN, NT, TN, TT) = NN\n    accumulate: bool = false\n    alpha: float = 1.0\n"
         "    beta: float = 0.0\n    gamma: float = 0.0\n", "E003", 7, 5, "has no parameter 'gamma'"),
    ],
)
def test_matmul_parameters_that_disagree(params, code, line, column, words):
    text = f"primitive matmul:\n  params:\n{params}  forward:\n    in: (A: [M, K], B: [K, N])\n    out: C: [M, N]\n"
    found = check(text)
    assert len(found) == 1, found
    assert found[0][:3] == (code, line, column) and words in found[0][3], found


def test_required_optional_and_tensor_parameters():
    router = ("primitive moe_router:\n  params:\n    top_k: int = 2\n    normalize: bool = true\n"
              "    aux_loss_coef: float = 0.01\n    use_sigmoid: bool = false\n"
              "  forward:\n    in: (x, gate)\n    out: (weights, indices, aux_loss)\n")
    (found,) = check(router)
    assert found[:3] == ("E003", 3, 18) and "has a default here but the op requires it" in found[3]
    attention = ("primitive flash_attention:\n  params:\n    causal: bool = true\n    softmax_scale: float? = None\n"
                 "    window_size: int? = None\n    layout: enum(bhtd, bthd) = bhtd\n    softcap: float = 0.0\n"
                 "    alibi_slopes: [H]? = None\n"
                 "  forward:\n    in: (q, k, v)\n    out: (out, lse)\n")
    assert check(attention) == []  # spec 6.4.1: the optional tensor alibi_slopes is a parameter
    found = check(attention.replace("softmax_scale: float? = None", "softmax_scale: float = 1.0"))
    assert [f[:3] for f in found] == [("E003", 4, 20)] and "is not optional here but optional in the op" in found[0][3]
    found = check(attention.replace("alibi_slopes: [H]? = None", "alibi_slopes: [H]"))
    assert [f[:3] for f in found] == [("E003", 8, 19)] and "is not optional here but optional" in found[0][3], found
    found = check(attention.replace("in: (q, k, v)", "in: (q, k, v, alibi_slopes?)"))
    assert [f[:3] for f in found] == [("E004", 10, 9)] and "declares 4 tensor input(s)" in found[0][3], found
    found = check(attention.replace("alibi_slopes: [H]? = None", "alibi_slopes: float? = None"))
    assert [f[:3] for f in found] == [("E003", 8, 19)] and "is float here but a tensor in the op" in found[0][3], found


def test_backward_kernels_and_formulas_are_checked():
    text = ("primitive add3:\n  forward:\n    in: (a, b, c)\n    out: d\n  backward:\n    in: d_out\n"
            "    out: (d_a, d_b, d_c)\n"
            "primitive scale:\n  params:\n    factor: float\n  forward:\n    in: x\n    out: y\n  backward:\n"
            "    d_x = broadcast(d_out, factor)\n"
            "primitive transpose:\n  params:\n    dim0: int\n    dim1: int\n  forward:\n    in: x\n    out: y\n"
            "  backward:\n    d_x = transpose(d_out, dim0, dim1, dims=[0])\n"
            "primitive batched_matmul:\n  params:\n    transpose: enum(NN, NT, TN, TT) = NN\n"
            "    accumulate: bool = false\n    alpha: float = 1.0\n"
            "  forward:\n    in: (A, B)\n    out: C\n  backward:\n"
            "    d_A = batched_matmul(d_C, B, transpose=XT)\n    d_B = batched_matmul(A, d_C, transpose=TN)\n")
    found = check(text)
    assert [f[:3] for f in found] == [("E014", 5, 3), ("E014", 15, 11), ("E003", 24, 40), ("E003", 34, 44)], found
    assert "no kernel registered for primitive add3_backward" in found[0][3]
    assert "no kernel registered for primitive broadcast" in found[1][3]
    assert "transpose has no parameter 'dims'" in found[2][3]
    assert "'XT' is not one of NN, NT, TN, TT" in found[3][3]


def test_an_elided_declaration_is_checked_for_what_it_writes():
    # spec 9.8.3 writes softmax with '...'
    assert check("primitive softmax:\n  ...\n  backward:\n    in: (d_out, out)\n    ...\n") == []
    (found,) = check("primitive softmax:\n  ...\n  backward:\n    in: (d_out, x, out)\n    ...\n")
    assert found[:3] == ("E004", 4, 9)


def test_the_check_runs_when_a_program_is_lowered():
    text = ("primitive relu:\n  params:\n    slope: float = 0.0\n  forward:\n    in: x: [*]\n    out: [*]\n"
            "primitive rmsnrom:\n  forward:\n    in: x: [*]\n    out: [*]\n"
            "module M(d: int = 4):\n  forward:\n    in: [d]\n    out: [d]\n    graph:\n      in -> relu() -> out\n")
    with pytest.raises(DiagnosticError) as err:
        lower_program(parse_source(text, "user.module"), "M")
    diagnostics = [(d.code, d.span.line, d.span.column) for d in err.value.diagnostics]
    assert diagnostics == [("E003", 3, 5), ("E014", 7, 11)]
    rendered = err.value.diagnostics[1].render()
    assert "user.module:7:11: error[E014]: no kernel registered for primitive rmsnrom" in rendered
    assert "    7 | primitive rmsnrom:\n      |           ^^^^^^^\n" in rendered
    assert "hint: did you mean 'rmsnorm'?" in rendered


def test_every_parameter_of_a_std_declaration_is_checked():
    """Change each default of each std declaration: the check notices every change."""
    for path in PRIMITIVE_FILES:
        text = path.read_text()
        program = parse_source(text, str(path))
        for decl in program.declarations:
            for param in declared_params(decl)[0]:
                if param.default_span is None:
                    continue
                lines = text.split("\n")
                row = lines[param.default_span.line - 1]
                start, stop = param.default_span.column - 1, param.default_span.end_column - 1
                lines[param.default_span.line - 1] = row[:start] + "7" + row[stop:]
                found = check("\n".join(lines), str(path))
                assert [(f[0], f[1]) for f in found] == [("E003", param.default_span.line)], (
                    decl.name, param.name, found)


# ------------------------------------------------------------------------ imports


def resolve(text: str, where: Path):
    sink = DiagnosticSink()
    resolved = resolve_program(parse_source(text, str(where / "main.module")), sink)
    return resolved, [(d.code, d.message) for d in sink.diagnostics]


def test_import_std_primitives_imports_every_primitive_declaration(tmp_path):
    resolved, diags = resolve("import std.primitives\n", tmp_path)
    assert diags == []
    declared = {n for n, d in resolved.decls.items() if d.kind == "primitive"}
    assert set(section_6_primitives()) <= declared
    # the newest file of each name: matmul.module, not matmul.v1.module
    assert resolved.loaded["std.primitives.matmul"] == PRIMITIVES_DIR / "matmul.module"
    assert "std.primitives.matmul.v1" not in resolved.loaded
    assert "batched_matmul" in resolved.decls


def test_versioned_brace_and_from_imports_of_std_primitives(tmp_path):
    resolved, diags = resolve("import std.primitives.matmul.v1\n", tmp_path)
    assert diags == [] and resolved.loaded["std.primitives.matmul.v1"] == PRIMITIVES_DIR / "matmul.v1.module"
    assert "batched_matmul" not in resolved.decls
    resolved, diags = resolve("import std.primitives.{rmsnorm, swiglu}\nfrom std.primitives import matmul as mm\n",
                              tmp_path)
    assert diags == [] and {"rmsnorm", "swiglu", "mm"} <= set(resolved.decls)
    _, diags = resolve("from std.primitives import no_such_op\n", tmp_path)
    assert diags[0][0] == "E002" and "std.primitives has no declaration 'no_such_op'" in diags[0][1]
    _, diags = resolve("import std.primitives as P\n", tmp_path)
    assert diags[0][0] == "E002" and "names a folder of modules" in diags[0][1]


def test_a_program_importing_std_primitives_lowers(tmp_path):
    text = ("import std.primitives\n\nmodule M(d: int = 8):\n  params:\n    w: [d, d]\n  forward:\n    in: [B, d]\n"
            "    out: [B, d]\n    graph:\n      (in, w) -> matmul(transpose=NT) -> h\n      h -> relu() -> out\n")
    module = lower_program(parse_source(text, str(tmp_path / "main.module")), "M")
    assert [op.name for op in module.walk() if op.name in ("mdsl.graph.matmul", "mdsl.graph.relu")] == [
        "mdsl.graph.matmul", "mdsl.graph.relu"]


def test_an_imported_folder_with_a_bad_declaration_reports_it_in_its_file(tmp_path):
    (tmp_path / "prims").mkdir()
    (tmp_path / "prims" / "ok.module").write_text(SOFTMAX)
    (tmp_path / "prims" / "bad.module").write_text(SOFTMAX.replace("softmax", "softmaxx", 1))
    _, diags = resolve("import prims\n", tmp_path)
    assert [c for c, _ in diags] == ["E014"] and "softmaxx" in diags[0][1]
    sink = DiagnosticSink()
    resolve_program(parse_source("import prims.{softmax}\n", str(tmp_path / "main.module")), sink)
    (diag,) = sink.diagnostics
    assert diag.span.source.name == str(tmp_path / "prims" / "bad.module") and diag.span.line == 1
