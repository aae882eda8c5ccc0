"""mdsl-opt's pipeline handling: the pass list, located pipeline errors, IR dumps, timing."""

from __future__ import annotations

import dataclasses
import json

import pytest

from modeldsl.diagnostics import DiagnosticError
from modeldsl.passes.registry import LISTINGS, PASSES, describe_pass
from modeldsl.tools.opt import main
from modeldsl.tools.opt_pipeline import build_pipeline, listing_of_class, normalize_pipeline, pass_list

IR = """!x = !mdsl.graph.tensor<[B, 64], fp32>
mdsl.graph.model @m {
  mdsl.graph.func @f(%x: !x) -> !x {
    %a = mdsl.graph.relu %x : (!x) -> !x
    %b = mdsl.graph.relu %x : (!x) -> !x
    mdsl.graph.return %a : !x
  }
}
"""


@pytest.mark.parametrize("name", list(PASSES))
def test_every_pass_has_a_one_line_description_and_listed_options(name):
    cls = PASSES[name]()
    text = describe_pass(name, cls)
    assert text and "\n" not in text and not text.startswith(cls.__name__ + "(")
    listed = pass_list({name: PASSES[name]})
    for field in dataclasses.fields(cls):
        if field.init and field.name != "name" and name != "mdsl-specialize":
            assert f"{field.name}=" in listed


@pytest.mark.parametrize("name", list(PASSES))
def test_the_registry_listing_is_what_the_pass_class_says(name):
    """--list-passes prints LISTINGS (so that it imports no pass): each entry must match the class."""
    derived = listing_of_class(name, PASSES[name]())
    assert LISTINGS.get(name) == derived, f"update LISTINGS[{name!r}] in passes/registry.py to {derived!r}"


def test_list_passes_lists_each_passs_rewrite_patterns_under_it():
    """mdsl-fuse's pattern names (those its only=/disable= take) with their classes and mdsl-recompute's
    patterns, each under its pass; passes without a pattern table list none."""
    from modeldsl.passes.fuse import PATTERNS as FUSE_PATTERNS
    from modeldsl.passes.recompute import PATTERNS as RECOMPUTE_PATTERNS

    assert [n for n, _ in LISTINGS["mdsl-fuse"].patterns] == list(FUSE_PATTERNS)
    assert [n for n, _ in LISTINGS["mdsl-recompute"].patterns] == list(RECOMPUTE_PATTERNS)
    listed = pass_list({name: PASSES[name] for name in ("mdsl-fuse", "mdsl-plan-memory", "mdsl-recompute")})
    fuse, plan, recompute = listed.split("\n  mdsl-")[1:]
    assert "      patterns:\n        residual_norm" in fuse and "ResidualNorm, ResidualNormBackward" in fuse
    assert all(f"        {name} " in fuse for name in FUSE_PATTERNS)
    assert "patterns:" not in plan
    assert "        layer_tensors                RecomputeLayerTensors" in recompute


def test_the_registry_lists_only_registered_passes():
    assert set(LISTINGS) == set(PASSES)


def test_a_pass_without_a_listing_is_listed_from_its_class():
    listed = pass_list({"unlisted-cse": PASSES["cse"]})
    assert listed.startswith("Available passes:\n  unlisted-cse\n      ") and len(listed.splitlines()) == 3


def test_pipeline_positions_survive_the_builtin_module_wrapper():
    shown = "builtin.module(cse,mdsl-plan-memory{strateg=best-fit})"
    text, offset = normalize_pipeline(shown)
    assert shown[offset:].startswith(text)
    passes = build_pipeline(PASSES, "cse,mdsl-plan-memory{strategy=first-fit alignment=64}")
    assert [p.name for p in passes] == ["cse", "mdsl-plan-memory"] and passes[1].alignment == 64
    with pytest.raises(DiagnosticError) as info:
        build_pipeline(PASSES, text, offset, shown)
    (diag,) = info.value.diagnostics
    assert diag.code == "E029" and diag.span.text == "strateg" and diag.span.source.text == shown
    assert diag.hint == "did you mean 'strategy'?"


def test_unknown_option_is_located_under_the_option(capsys):
    with pytest.raises(DiagnosticError) as info:
        build_pipeline(PASSES, "mdsl-lower-to-sched{kv_cach=4}")
    (diag,) = info.value.diagnostics
    assert (diag.span.column, diag.span.end_column) == (21, 28) and diag.hint == "did you mean 'kv_cache'?"


def test_pipeline_errors_as_json(tmp_path, capsys):
    path = tmp_path / "in.mlir"
    path.write_text(IR)
    assert main([str(path), "-p", "dcee", "--diagnostics-format=json"]) == 1
    (diag,) = json.loads(capsys.readouterr().out)
    assert diag["code"] == "E029" and diag["location"]["file"] == "<pipeline>" and diag["hint"] == "did you mean 'dce'?"


def test_print_ir_after_change_skips_passes_that_change_nothing(tmp_path, capsys):
    path = tmp_path / "in.mlir"
    path.write_text(IR)
    assert main([str(path), "-p", "cse,cse,dce,dce", "--print-ir-after-change"]) == 0
    err = capsys.readouterr().err
    # the first cse merges %b into %a; after it nothing changes
    assert err.count("IR Dump After") == 1 and "IR Dump After CommonSubexpressionElimination (cse)" in err
    assert main([str(path), "-p", "dce,cse", "--print-ir-after-change"]) == 0
    err = capsys.readouterr().err
    # dce drops the unused %b first; then cse has nothing to merge
    assert err.count("IR Dump After") == 1 and "IR Dump After DeadCodeElimination (dce)" in err


def test_timing_report_covers_every_step_and_adds_up(tmp_path, capsys):
    path = tmp_path / "in.mlir"
    path.write_text(IR)
    assert main([str(path), "-p", "cse,dce", "--mlir-timing", "-o", str(tmp_path / "out.mlir")]) == 0
    lines = capsys.readouterr().err.splitlines()
    rows = [line for line in lines if "%)" in line]
    names = [row.split("%)", 1)[1].strip() for row in rows]
    assert names[:3] == ["Read input", "Parser", "Verifier"] and names[-1] == "Total"
    assert "CommonSubexpressionElimination (cse)" in names and "Write output" in names
    top = [float(r.split()[0]) for r, n in zip(rows, names) if not r.split("%)", 1)[1].startswith("    ")
           and n != "Total"]
    total = float(rows[-1].split()[0])
    assert abs(sum(top) - total) < 1e-3 * max(1.0, total) + 1e-3
    assert (tmp_path / "out.mlir").read_text().startswith("builtin.module")
