"""mdsl-run --train: per-step losses, the loss curve, atomic checkpoints, bit-exact resumption, coded errors."""

import contextlib
import io
import json
import os
import re
import shlex
import signal
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

import modeldsl
from modeldsl.hf import checkpoint as hf_checkpoint
from modeldsl.resolve.imports import STD_ROOT
from modeldsl.runtime.train import Trainer
from modeldsl.tools.run import main

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "tiny_llama"
LLAMA = STD_ROOT / "models" / "llama.module"
DATA = ROOT / "examples" / "tiny_corpus.txt"
RUN = [str(LLAMA), "--hf", str(EXAMPLE), "--train", str(DATA), "--steps", "4", "--batch", "2", "--seq", "32",
       "--lr", "1e-2", "--warmup", "1", "--grad-accum", "2"]
STEP = re.compile(r"^step (\d+) loss (\S+) lr (\S+) tokens/s (\S+) epoch (\d+)$", re.M)


@pytest.fixture(autouse=True)
def in_a_temporary_folder(tmp_path, monkeypatch):
    """Runs without --save draw ./loss.png: never into the repository."""
    monkeypatch.chdir(tmp_path)


def losses_of(out: str) -> dict[int, float]:
    return {int(m[1]): float(m[2]) for m in STEP.finditer(out)}


def train(capsys, *flags, code: int = 0) -> str:
    assert main([*RUN, *flags]) == code, capsys.readouterr().err
    return capsys.readouterr().out


def files_of(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """An uninterrupted 4-step run: its printed losses and its saved folder."""
    out = tmp_path_factory.mktemp("straight") / "out"
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(io.StringIO()):
        assert main([*RUN, "--save", str(out)]) == 0
    return stdout.getvalue(), out


# ------------------------------------------------------------------ (1) a run
def test_training_prints_falling_losses_and_writes_the_curve_and_a_loadable_checkpoint(straight):
    out, folder = straight
    losses = losses_of(out)
    assert sorted(losses) == [1, 2, 3, 4]
    assert losses[4] < losses[1] - 0.3 and all(losses[s + 1] < losses[s] + 0.05 for s in (1, 2, 3)), losses
    assert "tokens/s" in out and re.search(r"^trained 4 steps in [\d.]+ s \(512 tokens, [\d.]+ tokens/s\)", out, re.M)
    assert f"wrote the loss curve to {folder / 'loss.png'}" in out
    assert (folder / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert {"config.json", "tokenizer.json", "model.safetensors", "training_state.npz"} <= set(os.listdir(folder))
    trained, original = modeldsl.load(LLAMA, hf=folder), modeldsl.load(LLAMA, hf=EXAMPLE)
    assert set(trained.weights) == set(original.weights)
    assert all(not np.array_equal(trained.weights[n], original.weights[n]) for n in original.weights)
    # the reloaded model predicts its training text better than the original one
    ids = np.array(Tokenizer.from_file(str(EXAMPLE / "tokenizer.json")).encode(DATA.read_text()).ids[:65])[None]
    loss = {name: Trainer(m).accumulate(ids[:, :-1], ids[:, 1:])
            for name, m in (("trained", trained), ("original", original))}
    assert loss["trained"] < loss["original"] - 0.3, loss


def test_jsonl_data_wraps_around_and_the_plot_goes_where_asked(tmp_path, monkeypatch, capsys):
    data = tmp_path / "docs.jsonl"
    data.write_text("\n".join(json.dumps({"text": t}) for t in ("Hi.", "Boats.", "Night.")) + "\n")
    monkeypatch.chdir(tmp_path)
    out = train(capsys, "--train", str(data), "--seq", "8", "--batch", "1", "--steps", "4", "--grad-accum", "1")
    assert len(losses_of(out)) == 4 and "3 documents" in out
    assert int(STEP.findall(out)[-1][4]) >= 1  # the few tokens ran out: a later epoch
    assert "wrote the loss curve to loss.png" in out and (tmp_path / "loss.png").is_file()
    out = train(capsys, "--train", str(data), "--seq", "8", "--batch", "1", "--steps", "1",
                "--loss-plot", str(tmp_path / "curve.png"))
    assert (tmp_path / "curve.png").is_file() and f"to {tmp_path / 'curve.png'}" in out


def test_a_checkpoint_without_a_tokenizer_trains_on_utf8_bytes(tmp_path, capsys):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    for name in ("config.json", "model.safetensors"):
        (ckpt / name).write_bytes((EXAMPLE / name).read_bytes())
    out = train(capsys, "--hf", str(ckpt), "--steps", "1", "--loss-plot", str(tmp_path / "l.png"))
    assert "as UTF-8 bytes" in out and f"training on {len(DATA.read_bytes())} tokens" in out  # no EOS known
    assert len(losses_of(out)) == 1


def test_a_failing_plot_warns_and_still_saves(tmp_path, monkeypatch, capsys):
    import matplotlib.pyplot as plt

    def broken(*args, **kwargs):
        raise RuntimeError("no backend")

    monkeypatch.setattr(plt, "subplots", broken)
    out = tmp_path / "out"
    assert main([*RUN, "--steps", "1", "--save", str(out)]) == 0
    captured = capsys.readouterr()
    assert "warning[W007]" in captured.err and "no loss curve: matplotlib failed: RuntimeError" in captured.err
    assert (out / "training_state.npz").is_file() and not (out / "loss.png").exists()


# ------------------------------------------------------------------ (2) resumption
def test_stopping_and_resuming_gives_the_losses_of_an_uninterrupted_run_bit_for_bit(straight, tmp_path, capsys):
    expected, final = straight
    out = tmp_path / "out"
    first = train(capsys, "--stop-after", "2", "--save", str(out))
    assert sorted(losses_of(first)) == [1, 2] and "(step 2)" in first
    second = train(capsys, "--resume", str(out), "--save", str(out))  # settings come from the state
    assert sorted(losses_of(second)) == [3, 4]
    resumed = {**losses_of(first), **losses_of(second)}
    assert resumed == losses_of(expected)  # == on the floats: bit for bit
    assert [m[2] for m in STEP.finditer(first + second)] == [m[2] for m in STEP.finditer(expected)]
    saved, straight_files = files_of(out), files_of(final)
    assert saved["model.safetensors"] == straight_files["model.safetensors"]
    with np.load(out / "training_state.npz") as a, np.load(final / "training_state.npz") as b:
        assert a.files == b.files and all(np.array_equal(a[n], b[n]) for n in a.files if n != "state")
        assert json.loads(str(a["state"]))["meta"]["data"] == json.loads(str(b["state"]))["meta"]["data"]


def test_twenty_steps_stopped_after_ten_and_resumed_equal_an_uninterrupted_run(tmp_path, capsys):
    """The issue's check as stated: 10 + 10 steps give the 20 losses of a straight run, bit for bit."""
    twenty = ["--steps", "20", "--grad-accum", "1"]
    expected = losses_of(train(capsys, *twenty))
    out = tmp_path / "out"
    first = losses_of(train(capsys, *twenty, "--stop-after", "10", "--save", str(out)))
    second = losses_of(train(capsys, *twenty, "--resume", str(out), "--save", str(out)))
    assert sorted(first) == list(range(1, 11)) and sorted(second) == list(range(11, 21))
    assert {**first, **second} == expected


def test_bf16_mixed_precision_runs_saves_fp32_masters_and_resumes_bit_for_bit(tmp_path, capsys):
    expected = train(capsys, "--dtype", "bf16")
    assert "bf16 mixed precision" in expected
    out = tmp_path / "out"
    first = train(capsys, "--dtype", "bf16", "--stop-after", "2", "--save", str(out))
    second = train(capsys, "--resume", str(out), "--save", str(out))  # the dtype comes from the state
    assert {**losses_of(first), **losses_of(second)} == losses_of(expected)
    assert main([str(LLAMA), "--train", str(DATA), "--resume", str(out), "--dtype", "fp32"]) == 1
    err = capsys.readouterr().err
    assert "error[E029]" in err and "--dtype fp32 differs from the resumed run's bf16" in err


def test_ctrl_c_stops_after_the_step_saves_and_resumes_exactly(straight, tmp_path, monkeypatch, capsys):
    step = Trainer.train_step

    def interrupted(self, micro):
        loss = step(self, micro)
        if self.step == 3:
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C during step 3
        return loss

    monkeypatch.setattr(Trainer, "train_step", interrupted)
    out = tmp_path / "out"
    first = train(capsys, "--save", str(out), code=130)
    assert sorted(losses_of(first)) == [1, 2, 3] and "interrupted: stopped after step 3" in first
    monkeypatch.setattr(Trainer, "train_step", step)
    second = train(capsys, "--resume", str(out))
    assert {**losses_of(first), **losses_of(second)} == losses_of(straight[0])


def test_resuming_with_other_settings_or_a_finished_run_is_e029(straight, capsys):
    _, folder = straight
    for flags, words in ((["--lr", "2e-2"], "--lr 0.02 differs from the resumed run's 0.01"),
                         (["--batch", "3"], "--batch 3 differs"),
                         ([], "has finished: it is at step 4 of --steps 4")):
        assert main([str(LLAMA), "--train", str(DATA), "--resume", str(folder), *flags]) == 1
        err = capsys.readouterr().err
        assert "error[E029]" in err and words in err and "loading weights" not in err


def test_resuming_on_other_data_warns_w009(tmp_path, capsys):
    out = tmp_path / "out"
    train(capsys, "--steps", "2", "--stop-after", "1", "--save", str(out))
    other = tmp_path / "other.txt"
    other.write_text("Some other text entirely. " * 20)
    assert main([str(LLAMA), "--train", str(other), "--resume", str(out)]) == 0
    captured = capsys.readouterr()
    assert "warning[W009]" in captured.err and sorted(losses_of(captured.out)) == [2]


# ------------------------------------------------------------------ (3) atomic saves
def failing_writer(error: BaseException):
    def write(path, tensors, metadata=None):
        with open(path, "wb") as f:
            f.write(b"\x00" * 1000)  # part of the file, then the failure
        raise error
    return write


@pytest.mark.parametrize("error", [OSError(28, "No space left on device"), KeyboardInterrupt()],
                         ids=["disk-full", "killed"])
def test_a_save_that_fails_midway_leaves_the_previous_checkpoint_intact(tmp_path, monkeypatch, capsys, error):
    out = tmp_path / "out"
    train(capsys, "--steps", "3", "--stop-after", "1", "--save", str(out))
    before = files_of(out)
    weights = modeldsl.load(LLAMA, hf=out).weights
    monkeypatch.setattr(hf_checkpoint, "write_safetensors", failing_writer(error))
    args = [str(LLAMA), "--train", str(DATA), "--resume", str(out), "--stop-after", "2", "--save", str(out)]
    if isinstance(error, KeyboardInterrupt):
        with pytest.raises(KeyboardInterrupt):
            main(args)
    else:
        assert main(args) == 1
        err = capsys.readouterr().err
        assert "error[E028]" in err and "No space left on device" in err and "previous checkpoint" in err
    assert files_of(out) == before  # not a byte changed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no temporary folder left
    reloaded = modeldsl.load(LLAMA, hf=out).weights
    assert all(np.array_equal(reloaded[n], weights[n]) for n in weights)
    monkeypatch.undo()
    assert main([str(LLAMA), "--train", str(DATA), "--resume", str(out), "--save", str(out)]) == 0
    assert sorted(losses_of(capsys.readouterr().out)) == [2, 3]


# ------------------------------------------------------------------ (4) coded errors
@pytest.mark.parametrize("flags, code, words", [
    (["--steps", "0"], "E029", "--steps must be at least 1, got 0"),
    (["--batch", "0"], "E029", "--batch must be at least 1, got 0"),
    (["--grad-accum", "0"], "E029", "--grad-accum must be at least 1, got 0"),
    (["--seq", "0"], "E029", "--seq must be at least 1, got 0"),
    (["--lr", "-0.1"], "E029", "--lr must be a finite number > 0, got -0.1"),
    (["--lr", "nan"], "E029", "--lr must be a finite number > 0, got nan"),
    (["--warmup", "-1"], "E029", "--warmup must be non-negative"),
    (["--clip", "-1"], "E029", "--clip must be a finite number >= 0"),
    (["--stop-after", "5"], "E029", "--stop-after 5 is past --steps 4"),
    (["--prompt", "hi"], "E029", "--prompt does not apply to --train"),
    (["--train", "/nonexistent/data.txt"], "E028", "no such training data file '/nonexistent/data.txt'"),
    (["--train", str(ROOT / "tests")], "E028", "is a folder, not a file"),
    (["--resume", "/nonexistent/run"], "E028", "--resume: no such folder"),
    (["--resume", str(EXAMPLE)], "E028", "has no training_state.npz"),
    (["--save", str(DATA)], "E028", "is a file, not a folder"),
])
def test_bad_training_flags_are_coded_errors_before_loading(flags, code, words, capsys):
    assert main([*RUN, *flags]) == 1
    err = capsys.readouterr().err
    assert f"error[{code}]" in err and words in err and "hint:" in err
    assert "loading weights" not in err and "Traceback" not in err


def test_missing_and_misplaced_training_flags_are_e029(capsys):
    assert main([str(LLAMA), "--hf", str(EXAMPLE), "--train", str(DATA), "--steps", "2"]) == 1
    assert "--train needs --batch, --seq, --lr" in capsys.readouterr().err
    assert main([str(LLAMA), "--hf", str(EXAMPLE), "--tokens", "1", "--steps", "2"]) == 1
    assert "--steps is a training flag and needs --train DATA" in capsys.readouterr().err
    assert main([str(LLAMA), "--tokens", "1"]) == 1
    assert "error[E029]" in capsys.readouterr().err


def test_a_sequence_longer_than_the_positions_is_e029(capsys):
    assert main([*RUN, "--seq", "257"]) == 1
    err = capsys.readouterr().err
    assert "error[E029]" in err and "--seq 257 is more than the model's 256 positions" in err


def test_a_jsonl_line_without_text_is_e030_naming_file_and_line(tmp_path, capsys):
    data = tmp_path / "bad.jsonl"
    data.write_text('{"text": "fine"}\n{"txt": "typo"}\n')
    assert main([*RUN, "--train", str(data)]) == 1
    err = capsys.readouterr().err
    assert "error[E030]" in err
    assert f'{data}:2: the line has no "text", "prompt"/"completion" or "messages" field' in err
    assert "loading weights" not in err  # the data is read before the model


def test_a_corrupt_training_state_is_e034(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "training_state.npz").write_bytes(b"garbage")
    assert main([str(LLAMA), "--train", str(DATA), "--resume", str(out)]) == 1
    err = capsys.readouterr().err
    assert "error[E034]" in err and "training_state.npz" in err


# ------------------------------------------------------------------ the README
def test_the_readme_training_commands_run_as_written(tmp_path, monkeypatch, capsys):
    readme = (ROOT / "docs" / "training.md").read_text()  # the README links this page
    block = re.search(r"# Training: `mdsl-run --train`\n.*?```sh\n(.*?)```", readme, re.S).group(1)
    commands = [shlex.split(c) for c in block.replace("\\\n", " ").splitlines() if c.startswith("mdsl-run")]
    assert len(commands) == 3
    full, stopped, resumed = commands
    assert [a for a in stopped if a not in ("--stop-after", "30")][:-1] == full[:-1]  # the same run, stopped
    monkeypatch.chdir(ROOT)  # the README's paths are relative to the repository
    out = str(tmp_path / "run")
    losses = {}
    for argv in (stopped, resumed):
        argv = [out if a == "out/run" else a for a in argv]
        assert main(argv[1:]) == 0
        losses.update(losses_of(capsys.readouterr().out))
    assert sorted(losses) == list(range(1, 61))
    claim = re.search(r"takes the loss from ([\d.]+) to ([\d.]+) in 60 steps", " ".join(readme.split()))
    assert losses[1] == pytest.approx(float(claim[1]), abs=0.01)
    assert losses[60] == pytest.approx(float(claim[2]), abs=0.05)


# ------------------------------------------------------------------ recompute modes
def test_every_recompute_mode_trains_to_the_same_losses(capsys, straight):
    expected = losses_of(straight[0])
    for mode in ("none", "full", "auto:4KiB"):
        out = train(capsys, "--recompute", mode, "--loss-plot", f"loss-{mode.replace(':', '-')}.png")
        assert losses_of(out) == expected, mode


@pytest.mark.parametrize("spelling, message", [
    ("sometimes", "--recompute sometimes: the mode is none, annotated, full or auto[:BYTES]"),
    ("full:2GiB", "--recompute full:2GiB: only auto takes a budget"),
    ("auto:lots", "--recompute auto:lots: 'lots' is no byte count"),
])
def test_a_bad_recompute_mode_is_a_coded_error(capsys, spelling, message):
    assert main([*RUN, "--recompute", spelling]) == 1
    err = capsys.readouterr().err
    assert "error[E029]: mdsl-run: " + message in err and "Traceback" not in err
