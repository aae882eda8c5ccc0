"""Imports: search order, versions, conflicts (E023), alias shadowing (E024), W001, W002, module.lock."""

from pathlib import Path

import pytest

from modeldsl.diagnostics import DiagnosticSink
from modeldsl.frontend.text.parser import parse_source
from modeldsl.resolve.imports import STD_ROOT, resolve_program

MODULE = "module {name}(d: int = 4):\n  forward:\n    in: [d]\n    graph:\n      in -> out\n"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "llama.module").write_text(MODULE.format(name="Attention") + MODULE.format(name="MLP"))
    (tmp_path / "models" / "qwen.module").write_text(MODULE.format(name="Attention"))
    (tmp_path / "lib.v1.module").write_text(MODULE.format(name="Old"))
    (tmp_path / "lib.v2.module").write_text(MODULE.format(name="New"))
    return tmp_path


def resolve(project: Path, text: str):
    sink = DiagnosticSink()
    resolved = resolve_program(parse_source(text, str(project / "main.module")), sink)
    return resolved, [(d.code, d.message) for d in sink.diagnostics]


def test_file_declaration_and_brace_imports(project):
    resolved, diags = resolve(project, "import models.llama\nimport models.qwen.Attention as QAttn\n"
                                       "from models.llama import MLP as M2\n")
    assert diags == []
    assert {"Attention", "MLP", "QAttn", "M2"} <= set(resolved.decls)
    assert resolved.decls["QAttn"].span.source.name.endswith("qwen.module")
    resolved, diags = resolve(project, "import models.llama.{Attention, MLP}\n")
    assert diags == [] and {"Attention", "MLP"} <= set(resolved.decls)


def test_a_declaration_of_a_folder_of_files_by_its_dotted_path(project):
    """Spec 11.1's ``import std.modules.attention.GQA as CausalSelfAttention``: GQA is declared in
    one of the folder's files (attention/gqa.module)."""
    resolved, diags = resolve(project, "import std.modules.attention.GQA as CausalSelfAttention\n")
    assert diags == []
    assert resolved.decls["CausalSelfAttention"].span.source.name.endswith("attention/gqa.module")
    _, diags = resolve(project, "import std.modules.attention.Nope\n")
    assert diags[0][0] == "E002" and "has no declaration 'Nope'" in diags[0][1]


def test_versions_exact_and_latest(project):
    resolved, _ = resolve(project, "import lib.v1\n")
    assert "Old" in resolved.decls and "New" not in resolved.decls
    resolved, _ = resolve(project, "import lib\n")
    assert "New" in resolved.decls
    _, diags = resolve(project, "import lib.v3\n")
    assert diags[0][0] == "E002" and "cannot find module 'lib.v3'" in diags[0][1]


def test_the_standard_library_is_searched_first(project):
    resolved, diags = resolve(project, "import std.primitives.matmul.v1\n")
    assert diags == [] and resolved.decls["matmul"].kind == "primitive"
    assert resolved.loaded["std.primitives.matmul.v1"].is_relative_to(STD_ROOT)


def test_conflicting_imports_are_e023(project):
    _, diags = resolve(project, "import models.llama.Attention\nimport models.qwen.Attention\n")
    assert diags[0][0] == "E023" and "'Attention' is imported from both models.llama and models.qwen" in diags[0][1]


def test_alias_shadowing_an_import_is_e024(project):
    _, diags = resolve(project, "import models.llama.Attention\nimport models.qwen.Attention as Attention\n")
    assert diags[0][0] == "E024"


def test_local_shadowing_warnings(project):
    _, diags = resolve(project, "import models.llama.MLP\n" + MODULE.format(name="MLP") + MODULE.format(name="matmul"))
    assert [c for c, _ in diags] == ["W002", "W001"]


def test_missing_declarations_and_modules_are_e002(project):
    _, diags = resolve(project, "from models.llama import Nope\nimport nowhere.at_all\n")
    assert [c for c, _ in diags] == ["E002", "E002"]
    assert "models.llama has no declaration 'Nope'" in diags[0][1]


def test_lock_manifest(project):
    resolved, _ = resolve(project, "import lib.v1\nimport std.primitives.matmul.v1\n")
    lock = resolved.lock_manifest()
    assert lock.startswith("version: 1\nresolved_modules:\n")
    assert "  lib.v1: v1 local@" in lock and "  std.primitives.matmul.v1: v1 std@" in lock
