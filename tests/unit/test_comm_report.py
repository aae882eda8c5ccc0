"""``--emit=comm-report`` (modeldsl.comm_report): the bytes each rank sends, against the analytic
count of the layout."""

from __future__ import annotations

from pathlib import Path

import pytest

import modeldsl
from modeldsl.comm_report import comm_report, program_traffic, sent_bytes
from modeldsl.runtime.train import compile_training_step
from modeldsl.tools.opt import main as opt_main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "tiny_llama"


@pytest.fixture(scope="module")
def model():
    return modeldsl.load(hf=EXAMPLE, dtype="fp32")


@pytest.mark.parametrize("dp", [2, 4])
def test_data_parallel_sends_a_ring_all_reduce_of_every_gradient(model, dp):
    """Each rank sends 2 (n - 1) / n of the fp32 gradients' bytes: every parameter's, once a micro-batch."""
    program = compile_training_step(model.model, 2, 8, dp=dp)
    traffic = program_traffic(program)
    gradient_bytes = 4 * sum(weight.size for weight in model.weights.values())
    (row,) = traffic.rows.values()
    assert (row.kind, row.group, row.size, row.moved) == ("all_reduce", "dp", dp, gradient_bytes)
    assert traffic.sent == 2 * (dp - 1) / dp * gradient_bytes


def test_one_process_sends_nothing(model):
    from xdsl.dialects.builtin import ModuleOp

    program = compile_training_step(model.model, 2, 8)
    assert program_traffic(program).sent == 0
    assert "no collectives" in comm_report(ModuleOp([program]))


@pytest.mark.parametrize("kind, size, moved, sent", [
    ("all_reduce", 4, 1000, 1500.0), ("all_gather", 4, 1000, 750.0), ("reduce_scatter", 2, 1000, 500.0),
    ("all_to_all", 4, 1000, 750.0), ("broadcast", 8, 1000, 1000.0), ("send", 2, 1000, 1000.0),
    ("all_reduce", 1, 1000, 0.0),
])
def test_what_a_rank_sends_for_each_collective(kind, size, moved, sent):
    assert sent_bytes(kind, size, moved) == sent


def test_mdsl_opt_prints_the_report(capsys):
    assert opt_main([str(ROOT / "modeldsl/std/models/llama.module"), "--hf", str(EXAMPLE), "-p",
                     "mdsl-train-step{B=1 T=8 dp=2}", "--emit=comm-report"]) == 0
    out = capsys.readouterr().out
    assert "program @train_loss_grad: bytes each rank sends per run" in out
    assert "all_reduce      dp           2     15         560,384         560,384" in out  # 6 stacked x 2 layers + 3
    assert opt_main([str(ROOT / "modeldsl/std/models/llama.module"), "--hf", str(EXAMPLE), "-p",
                     "mdsl-specialize{B=1 T=8}", "--emit=comm-report"]) == 1
    assert "error[E029]: --emit=comm-report: the pipeline made no mdsl.sched program" in capsys.readouterr().err
