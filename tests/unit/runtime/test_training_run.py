"""modeldsl.train: a training run from Python, which mdsl-run --train drives (the same losses),
with callbacks, evaluation and a save that mdsl-run --resume continues."""

import re
from pathlib import Path

import numpy as np
import pytest

import modeldsl
from modeldsl.diagnostics import DiagnosticError
from modeldsl.runtime.training_run import StepInfo
from modeldsl.tools.run import main

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "tiny_llama"
DATA = ROOT / "examples" / "tiny_corpus.txt"
LORA = dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
SETTINGS = dict(steps=4, batch=2, seq=16, lr=1e-2, warmup=1)
STEP = re.compile(r"^step (\d+) loss (\S+) ", re.M)


@pytest.fixture(autouse=True)
def in_a_temporary_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def cli_losses(capsys, *flags: str) -> list[float]:
    assert main(["--hf", str(EXAMPLE), "--train", str(DATA), "--steps", "4", "--batch", "2", "--seq", "16",
                 "--lr", "1e-2", "--warmup", "1", *flags]) == 0, capsys.readouterr().err
    return [float(loss) for _, loss in STEP.findall(capsys.readouterr().out)]


def test_a_python_lora_run_calls_back_each_step_and_trains_as_mdsl_run_does(capsys):
    seen: list[StepInfo] = []
    run = modeldsl.train(EXAMPLE, DATA, lora=LORA, callbacks=[seen.append], **SETTINGS)
    infos = run.run()
    assert [i.step for i in seen] == [1, 2, 3, 4] and seen == infos
    assert all(i.tokens_per_second > 0 and np.isfinite(i.grad_norm) for i in seen)
    assert [i.lr for i in seen] == [run.config.lr_at(k) for k in range(4)]
    assert [i.loss for i in seen] == cli_losses(capsys, "--lora", "4:8", "--lora-targets", "q,v")
    assert sorted(run.trainer.optimizer.grads) == sorted(p.sym_name.data for p in run.model.model.params()
                                                         if p.is_adapter)


def test_a_saved_python_run_resumes_from_the_command_line_bit_for_bit(capsys, tmp_path):
    straight = modeldsl.train(EXAMPLE, DATA, **SETTINGS)
    straight.run()
    half = modeldsl.train(EXAMPLE, DATA, **SETTINGS)
    half.run(until=2)
    half.save(tmp_path / "half")
    assert main(["--resume", str(tmp_path / "half"), "--train", str(DATA), "--loss-plot", "l.png"]) == 0
    resumed = [float(loss) for _, loss in STEP.findall(capsys.readouterr().out)]
    assert half.losses + resumed == straight.losses


def test_evaluation_is_the_mean_loss_over_the_evaluation_tokens(tmp_path):
    text = tmp_path / "eval.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 3)
    run = modeldsl.train(EXAMPLE, DATA, eval_data=text, eval_every=2, **SETTINGS)
    infos = run.run()
    assert [i.eval_loss is not None for i in infos] == [False, True, False, True]
    assert infos[-1].eval_loss == run.evaluate()
    run.trainer.sync_weights()
    rows = run.eval_data.evaluation_batches(2, 16)
    total, count = 0.0, 0
    for tokens, labels in rows:  # the same loss from the graph executor's logits, in float64
        for row, target in zip(tokens, labels):
            logits = np.asarray(run.model.forward(row), dtype=np.float64).reshape(len(row), -1)
            keep = target != -100
            shifted = logits - logits.max(-1, keepdims=True)
            logp = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
            total -= logp[keep, target[keep]].sum()
            count += int(keep.sum())
    assert run.evaluate() == pytest.approx(total / count, rel=1e-5)


def test_bad_settings_are_coded_errors():
    with pytest.raises(DiagnosticError, match="E029.*steps=0 is not an integer >= 1"):
        modeldsl.train(EXAMPLE, DATA, **{**SETTINGS, "steps": 0})
    with pytest.raises(DiagnosticError, match="E029.*lr=-1 is not a positive number"):
        modeldsl.train(EXAMPLE, DATA, **{**SETTINGS, "lr": -1})
    loaded = modeldsl.load(hf=EXAMPLE)
    with pytest.raises(DiagnosticError, match="lora= and base_dtype= need the checkpoint folder"):
        modeldsl.train(loaded, DATA, lora=LORA, **SETTINGS)
    with pytest.raises(DiagnosticError, match="E029.*data=int is not a file or a list of documents"):
        modeldsl.train(loaded, 3, **SETTINGS)
    # a resumed state's grad_accum of 10**30 (the fuzzer's) would cut batches forever
    with pytest.raises(DiagnosticError, match="E029.*grad_accum 10{30}: a step cuts all its micro-batches"):
        modeldsl.train(loaded, DATA, **{**SETTINGS, "grad_accum": 10**30})


def test_data_parallel_settings_that_cannot_run_are_e048():
    loaded = modeldsl.load(hf=EXAMPLE)
    with pytest.raises(DiagnosticError, match="E048.*batch 3 does not divide into dp=2 ranks' rows"):
        modeldsl.train(loaded, DATA, **{**SETTINGS, "batch": 3}, dp=2)
    with pytest.raises(DiagnosticError, match="E048.*dp=2 takes 2 ranks; the launcher started 1"):
        modeldsl.train(loaded, DATA, **{**SETTINGS, "batch": 2}, dp=2)
    with pytest.raises(DiagnosticError, match=r"E048.*zero shares the optimizer state .* needs dp > 1 \(dp=1\)"):
        modeldsl.train(loaded, DATA, **SETTINGS, zero=True)


def test_the_command_line_prints_the_evaluation_loss(capsys, tmp_path):
    text = tmp_path / "eval.txt"
    text.write_text("Lorem ipsum dolor sit amet. " * 4)
    assert main(["--hf", str(EXAMPLE), "--train", str(DATA), "--steps", "4", "--batch", "2", "--seq", "16",
                 "--lr", "1e-2", "--eval", str(text), "--eval-every", "2", "--loss-plot", "e.png"]) == 0
    out = capsys.readouterr().out
    evaluated = re.findall(rf"^step (\d+) eval loss (\S+) on '{re.escape(str(text))}'$", out, re.M)
    assert [step for step, _ in evaluated] == ["2", "4"] and all(np.isfinite(float(v)) for _, v in evaluated)
    assert main(["--hf", str(EXAMPLE), "--eval", str(text)]) == 1  # without --train: an evaluation of the checkpoint
    assert "--eval needs --batch, --seq" in capsys.readouterr().err


def test_an_adapter_evaluates_from_the_command_line_to_the_runs_own_evaluation(capsys, tmp_path):
    text = tmp_path / "eval.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 3)
    run = modeldsl.train(EXAMPLE, DATA, lora=LORA, eval_data=text, **SETTINGS)
    run.run()
    run.save(tmp_path / "adapter")
    assert main(["--hf", str(EXAMPLE), "--adapter", str(tmp_path / "adapter"), "--eval", str(text),
                 "--batch", "2", "--seq", "16"]) == 0
    printed = re.search(r"^eval loss (\S+) on ", capsys.readouterr().out, re.M)
    assert float(printed[1]) == run.evaluate()
    assert main(["--hf", str(EXAMPLE), "--eval", str(text), "--batch", "2", "--seq", "16", "--lr", "1"]) == 1
    assert "--lr does not apply to an evaluation" in capsys.readouterr().err
