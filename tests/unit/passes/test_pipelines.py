"""The named pipelines: ``mdsl-opt -p 'mdsl-train-step{...}'`` ends with the very program the trainer
executes (and likewise the optimizer update and a forward profile), prints every stage with
``--print-ir-after-all``, lists each pipeline's expansion, and places a refused option under it."""

from __future__ import annotations

from pathlib import Path

import pytest
from xdsl.context import Context
from xdsl.parser import Parser

import modeldsl
from modeldsl.diagnostics import DiagnosticError
from modeldsl.dialects.sched import ProgramOp
from modeldsl.ir import load_dialects, print_ir
from modeldsl.passes.pipelines import PIPELINES, TrainStep, expansion
from modeldsl.passes.registry import PASSES
from modeldsl.resolve.imports import STD_ROOT
from modeldsl.runtime.optim import AdamWConfig
from modeldsl.runtime.train import Trainer
from modeldsl.tools.opt import main
from modeldsl.tools.opt_pipeline import build_pipeline

LLAMA = STD_ROOT / "models" / "llama.module"
EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "tiny_llama"


@pytest.fixture(scope="module")
def trainer() -> Trainer:
    return Trainer(modeldsl.load(LLAMA, hf=EXAMPLE, dtype="fp32"), AdamWConfig(lr=1e-3))


def opt_programs(tmp_path: Path, pipeline: str, *flags: str) -> dict[str, ProgramOp]:
    """The programs ``mdsl-opt llama.module --hf tiny_llama -p PIPELINE`` ends with, by name."""
    out = tmp_path / "out.mlir"
    assert main([str(LLAMA), "--hf", str(EXAMPLE), "-p", pipeline, "-o", str(out), *flags]) == 0
    ctx = Context()
    load_dialects(ctx)
    module = Parser(ctx, out.read_text()).parse_module()
    return {op.sym_name.data: op for op in module.body.block.ops if isinstance(op, ProgramOp)}


def assert_same_program(printed: ProgramOp, executed: ProgramOp) -> None:
    assert print_ir(printed) == print_ir(executed)
    assert printed.is_structurally_equivalent(executed)


def test_mdsl_opt_ends_with_the_training_step_the_trainer_executes(tmp_path, trainer, capsys):
    (printed,) = opt_programs(tmp_path, "mdsl-train-step{B=2 T=16}", "--print-ir-after-all").values()
    stages = [line for line in capsys.readouterr().err.splitlines() if line.startswith("// -----// IR Dump After")]
    assert [line.split("(")[1].split(")")[0] for line in stages] == [
        "mdsl-specialize", "mdsl-adapters", "mdsl-attach-loss", "mdsl-fuse", "mdsl-autodiff", "mdsl-fuse",
        "mdsl-recompute", "mdsl-fuse", "mdsl-lower-to-sched", "mdsl-plan-memory"]
    assert_same_program(printed, trainer.executor(2, 16).program)
    names = [op.name for op in printed.walk()]
    assert "mdsl.sched.attention_backward" in names
    assert not any(op.name == "mdsl.sched.launch" and "attention" in op.kernel.data
                   for op in printed.walk())


def test_mdsl_opt_ends_with_the_optimizer_update_the_trainer_executes(tmp_path, trainer):
    (printed,) = opt_programs(tmp_path, "mdsl-optimizer-update{weight_decay=0.01}").values()
    assert_same_program(printed, trainer.optimizer.program)


def test_mdsl_opt_ends_with_the_forward_profile_the_model_runs(tmp_path, trainer):
    (printed,) = opt_programs(tmp_path, "mdsl-forward-profile{B=1 T=16}").values()
    assert_same_program(printed, trainer.model.schedule.profile(1, 16).program)


def test_a_pipeline_expands_into_its_stages_and_lists_them(capsys):
    passes = build_pipeline(PASSES, "cse,mdsl-train-step{B=1 T=4 recompute=full fuse=false}")
    assert [p.name for p in passes] == ["cse", "mdsl-specialize", "mdsl-adapters", "mdsl-attach-loss",
                                        "mdsl-autodiff", "mdsl-recompute", "mdsl-lower-to-sched", "mdsl-plan-memory"]
    assert passes[5].mode == "full" and passes[1].bindings == (("B", 1), ("T", 4))
    assert main(["--list-passes"]) == 0
    listed = capsys.readouterr().out
    for cls in PIPELINES:
        assert f"  {cls.name}\n" in listed and f"stages: {expansion(cls.example())}" in listed


@pytest.mark.parametrize("pipeline, option", [
    ("mdsl-train-step{B=2 T=0}", "T"),
    ("mdsl-train-step{B=2 T=16 recompute=sometimes}", "recompute"),
    ("mdsl-train-step{B=2 T=16 budget=lots}", "budget"),
    ("mdsl-train-step{B=2 T=16 disable=no_such}", "disable"),
    ("mdsl-forward-profile{B=1 T=4 storage=bf16}", "storage"),
    ("mdsl-generate-step{B=1 T=4 kv_cache=0}", "kv_cache"),
    ("mdsl-optimizer-update{storage=fp16}", "storage"),
])
def test_a_refused_pipeline_option_is_located_under_it(pipeline, option):
    with pytest.raises(DiagnosticError) as info:
        build_pipeline(PASSES, pipeline)
    (diag,) = info.value.diagnostics
    assert diag.code == "E029" and diag.span.text == option


def test_the_training_step_names_the_recompute_mode_option():
    with pytest.raises(ValueError, match="mode=sometimes") as info:
        TrainStep(B=1, T=1, recompute="sometimes")
    assert info.value.option == "recompute"
