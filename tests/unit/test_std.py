"""The bundled standard library: every file parses, every module and model lowers and verifies."""

from pathlib import Path

import pytest

from modeldsl.diagnostics import DiagnosticSink
from modeldsl.frontend.text.parser import parse_source
from modeldsl.ir import verify_module
from modeldsl.lower import lower_program
from modeldsl.resolve.imports import STD_ROOT
from modeldsl.resolve.primitive_decls import check_primitive_decl

STD_FILES = sorted(STD_ROOT.rglob("*.module"))


def load(path: Path):
    return parse_source(path.read_text(), str(path))


def test_the_std_tree_has_the_spec_layout():
    names = {p.relative_to(STD_ROOT).as_posix() for p in STD_FILES}
    assert {"modules/linear.module", "modules/mlp.module", "modules/attention.module", "modules/norm.module",
            "blocks/dense.module", "models/llama.module", "models/qwen.module", "models/mistral.module",
            "primitives/matmul.module", "primitives/rmsnorm.module", "primitives/attention.module"} <= names


@pytest.mark.parametrize("path", STD_FILES, ids=lambda p: p.relative_to(STD_ROOT).as_posix())
def test_every_declaration_lowers_and_verifies_or_agrees_with_its_primitive_op(path):
    """Modules, blocks and models lower and verify without warnings; primitive declarations are
    checked against the op registry (they document ops, and do not lower)."""
    program = load(path)
    for decl in program.declarations:
        if decl.kind == "primitive":
            sink = DiagnosticSink()
            check_primitive_decl(decl, sink)
            assert sink.diagnostics == [], "\n".join(d.render() for d in sink.diagnostics)
            continue
        sink = DiagnosticSink()
        module = lower_program(program, decl.name, sink=sink)
        assert verify_module(module) == [], decl.name
        assert sink.diagnostics == [], "\n".join(d.render() for d in sink.diagnostics)


@pytest.mark.parametrize(
    "config, has_lm_head, qk_norm",
    [({}, False, True), ({"tie_embeddings": False}, True, True)],
)
def test_qwen3_config_overrides(config, has_lm_head, qk_norm):
    module = lower_program(load(STD_ROOT / "models" / "qwen.module"), "Qwen3", config)
    params = {op.sym_name.data for op in module.walk() if op.name == "mdsl.graph.param"}
    assert ("lm_head" in params) == has_lm_head
    assert any(op.name == "mdsl.graph.qk_norm" for op in module.walk()) == qk_norm


def test_mistral_without_sliding_window():
    module = lower_program(load(STD_ROOT / "models" / "mistral.module"), "Mistral", {"sliding_window": 0})
    attention = next(op for op in module.walk() if op.name == "mdsl.graph.flash_attention")
    assert "window_size" not in attention.attributes


def test_ir_size_does_not_grow_with_depth():
    program = load(STD_ROOT / "models" / "llama.module")
    sizes = {n: sum(1 for _ in lower_program(program, "Llama", {"n_layers": n}).walk()) for n in (2, 32, 80)}
    assert len(set(sizes.values())) == 1, sizes


def test_500_mutations_of_the_std_models_fail_only_with_located_coded_diagnostics():
    """Delete, duplicate and swap tokens and lines of the std models: every failure
    is a coded diagnostic with a location, never a traceback."""
    import random

    from frontend.test_parser import mutations
    from modeldsl.diagnostics import CODES, DiagnosticError

    rng = random.Random(500)
    refused = 0
    models = [STD_ROOT / "models" / f"{name}.module" for name in ("llama", "qwen", "mistral")]
    for index, mutant in enumerate(m for path in models for m in mutations(path.read_text(), rng, 167)):
        try:
            lower_program(parse_source(mutant, str(STD_ROOT / "models" / f"mutant{index}.module")))
        except DiagnosticError as err:
            refused += 1
            for diagnostic in err.diagnostics:
                assert diagnostic.code in CODES and diagnostic.span is not None, diagnostic.render()
    assert refused > 150
