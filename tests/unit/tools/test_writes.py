"""Every writer touches only its own files: mdsl-run --save, --loss-plot, --logits, Model.save_hf,
mdsl-opt -o, --emit=memory-plot and --lock, each beside a folder of someone else's files."""

from pathlib import Path

import numpy as np
import pytest

import modeldsl
from modeldsl.diagnostics import DiagnosticError
from modeldsl.resolve.imports import STD_ROOT
from modeldsl.runtime.saves import MARKER, saved_run
from modeldsl.tools.opt import main as opt_main
from modeldsl.tools.run import main as run_main

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "tiny_llama"
LLAMA = STD_ROOT / "models" / "llama.module"
DATA = ROOT / "examples" / "tiny_corpus.txt"
TRAIN = [str(LLAMA), "--hf", str(EXAMPLE), "--train", str(DATA), "--steps", "2", "--batch", "1", "--seq", "16",
         "--lr", "1e-3"]
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(autouse=True)
def in_a_temporary_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def users_folder(folder: Path) -> dict[str, bytes]:
    """A folder of someone else's files (a subfolder too): what it holds, to compare after."""
    (folder / "old").mkdir(parents=True)
    (folder / "old" / "notes.txt").write_text("keep")
    (folder / "results.csv").write_text("1,2\n")
    return tree(folder)


def tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def failing(capsys, code: str, argv: list[str], runner=run_main) -> str:
    assert runner(argv) == 1
    err = capsys.readouterr().err
    assert f"error[{code}]" in err and "hint:" in err and "Traceback" not in err, err
    return err


# ------------------------------------------------------------------ mdsl-run --save
def test_save_into_a_folder_of_other_files_is_e044_and_touches_nothing(tmp_path, capsys):
    before = users_folder(tmp_path / "runs")
    err = failing(capsys, "E044", [*TRAIN, "--save", "runs"])
    assert "--overwrite" in err and "old/" in err
    assert tree(tmp_path / "runs") == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]  # refused before training: no loss.png either


def test_overwrite_replaces_the_folder(tmp_path, capsys):
    users_folder(tmp_path / "runs")
    assert run_main([*TRAIN, "--save", "runs", "--overwrite"]) == 0
    assert not (tmp_path / "runs" / "old").exists() and (tmp_path / "runs" / "model.safetensors").is_file()
    assert saved_run(tmp_path / "runs") is not None


def test_an_empty_folder_is_written_into(tmp_path, capsys):
    (tmp_path / "runs").mkdir()
    assert run_main([*TRAIN, "--save", "runs"]) == 0
    assert {"model.safetensors", "config.json", "training_state.npz", "loss.png", MARKER} <= {
        p.name for p in (tmp_path / "runs").iterdir()}


def test_another_runs_save_is_e044_and_resuming_it_keeps_the_users_files(tmp_path, capsys):
    assert run_main([*TRAIN, "--stop-after", "1", "--save", "out"]) == 0
    (tmp_path / "out" / "notes.txt").write_text("mine")
    saved = (tmp_path / "out" / "model.safetensors").read_bytes()
    err = failing(capsys, "E044", [*TRAIN, "--save", "out"])  # a new run: not its save to replace
    assert "not one of this run" in err and (tmp_path / "out" / "model.safetensors").read_bytes() == saved
    assert run_main([str(LLAMA), "--train", str(DATA), "--resume", "out", "--save", "out"]) == 0
    assert (tmp_path / "out" / "notes.txt").read_text() == "mine"
    assert (tmp_path / "out" / "model.safetensors").read_bytes() != saved  # the continued run's save


def test_a_users_file_under_a_saved_files_name_is_e044(tmp_path, capsys):
    assert run_main([*TRAIN, "--steps", "3", "--stop-after", "1", "--save", "out"]) == 0
    marker = (tmp_path / "out" / MARKER).read_text()
    (tmp_path / "out" / MARKER).write_text(marker.replace('"loss.png",', ""))  # as if that save drew no curve
    (tmp_path / "out" / "loss.png").write_bytes(b"the user's")
    failing(capsys, "E044", [str(LLAMA), "--train", str(DATA), "--resume", "out", "--save", "out"])
    assert (tmp_path / "out" / "loss.png").read_bytes() == b"the user's"


def test_save_dtype_needs_save(capsys):
    failing(capsys, "E029", [*TRAIN, "--save-dtype", "fp32"])


# ------------------------------------------------------------------ the loss curve
def test_an_existing_default_loss_png_is_e045_unless_overwrite(tmp_path, capsys):
    (tmp_path / "loss.png").write_bytes(b"someone's plot")
    err = failing(capsys, "E045", TRAIN)
    assert "--loss-plot" in err and "--overwrite" in err
    assert (tmp_path / "loss.png").read_bytes() == b"someone's plot"
    assert run_main([*TRAIN, "--overwrite"]) == 0
    assert (tmp_path / "loss.png").read_bytes()[:8] == PNG


def test_a_named_loss_plot_is_replaced_and_nothing_beside_it_is_touched(tmp_path, capsys):
    before = users_folder(tmp_path / "plots")
    (tmp_path / "plots" / "curve.png").write_bytes(b"old")
    assert run_main([*TRAIN, "--loss-plot", "plots/curve.png"]) == 0
    after = tree(tmp_path / "plots")
    assert after.pop("curve.png")[:8] == PNG and after == before
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == ["curve.png", "old", "results.csv"]


def test_a_loss_plot_in_the_save_folder_is_part_of_the_save(tmp_path, capsys):
    assert run_main([*TRAIN, "--save", "new/run", "--loss-plot", "new/run/curve.png"]) == 0
    assert "curve.png" in (tmp_path / "new" / "run" / MARKER).read_text()
    failing(capsys, "E029", [*TRAIN, "--save", "x", "--loss-plot", "x/config.json"])


# ------------------------------------------------------------------ mdsl-run --logits
def test_logits_replace_the_named_file_only(tmp_path, capsys):
    before = users_folder(tmp_path / "out")
    (tmp_path / "out" / "logits.npy").write_bytes(b"old")
    assert run_main([str(LLAMA), "--hf", str(EXAMPLE), "--tokens", "5,6,7", "--logits", "out/logits.npy"]) == 0
    after = tree(tmp_path / "out")
    np.testing.assert_array_equal(np.load(tmp_path / "out" / "logits.npy"),
                                  modeldsl.load(LLAMA, hf=EXAMPLE).forward([5, 6, 7]))
    after.pop("logits.npy")
    assert after == before and sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "logits.npy", "old", "results.csv"]


# ------------------------------------------------------------------ Model.save_hf
@pytest.fixture(scope="module")
def model():
    return modeldsl.load(LLAMA, hf=EXAMPLE)


def coded(call) -> str:
    with pytest.raises(DiagnosticError) as caught:
        call()
    (diagnostic,) = caught.value.diagnostics
    assert diagnostic.hint
    return diagnostic.code


def test_save_hf_into_a_folder_of_other_files_is_e044_unless_overwrite(model, tmp_path):
    before = users_folder(tmp_path / "out")
    assert coded(lambda: model.save_hf(tmp_path / "out")) == "E044"
    assert tree(tmp_path / "out") == before
    model.save_hf(tmp_path / "out", overwrite=True)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(
        [MARKER, "config.json", "generation_config.json", "model.safetensors", "tokenizer.json"])


def test_save_hf_replaces_its_own_save_and_keeps_the_users_files_in_it(model, tmp_path):
    model.save_hf(tmp_path / "out")
    (tmp_path / "out" / "README.md").write_text("my notes")
    model.save_hf(tmp_path / "out", dtype="bf16")
    assert (tmp_path / "out" / "README.md").read_text() == "my notes"
    other = modeldsl.load(LLAMA, hf=EXAMPLE)
    assert coded(lambda: other.save_hf(tmp_path / "out")) == "E044"  # another model's save
    assert coded(lambda: model.save_hf(EXAMPLE)) == "E044"  # the checkpoint it came from
    assert (EXAMPLE / "model.safetensors").is_file()


# ------------------------------------------------------------------ mdsl-opt
def test_opt_output_replaces_the_named_file_only(tmp_path, capsys):
    source = tmp_path / "in.mlir"
    source.write_text("builtin.module {}\n")
    before = users_folder(tmp_path / "out")
    (tmp_path / "out" / "ir.mlir").write_text("old")
    assert opt_main([str(source), "-o", "out/ir.mlir"]) == 0
    after = tree(tmp_path / "out")
    assert b"builtin.module" in after.pop("ir.mlir") and after == before
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["ir.mlir", "old", "results.csv"]
    failing(capsys, "E028", [str(source), "-o", "out/old"], opt_main)  # a folder is never replaced
    assert tree(tmp_path / "out" / "old") == {"notes.txt": b"keep"}


def test_a_memory_plot_replaces_the_named_file_only(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    source = tmp_path / "llama.module"
    source.write_text(LLAMA.read_text())
    ir = tmp_path / "planned.mlir"
    pipeline = "mdsl-specialize{B=1 T=8},mdsl-lower-to-sched,mdsl-plan-memory"
    config = ["--top", "Llama"]
    assert opt_main([str(source), *config, "-p", pipeline, "-o", str(ir)]) == 0, capsys.readouterr().err
    before = users_folder(tmp_path / "plots")
    (tmp_path / "plots" / "plan.png").write_bytes(b"old")
    assert opt_main([str(ir), "--emit=memory-plot", "plots/plan.png"]) == 0
    after = tree(tmp_path / "plots")
    assert after.pop("plan.png")[:8] == PNG and after == before
    failing(capsys, "E028", [str(ir), "--emit=memory-plot", "missing/plan.png"], opt_main)
    assert not (tmp_path / "missing").exists()


def test_lock_replaces_a_lock_file_only(tmp_path, capsys):
    module = tmp_path / "m.module"
    module.write_text("import std.primitives.matmul.v1\n\nmodule M(d: int = 8):\n  params:\n    w: [d, d]\n"
                      "  forward:\n    in: [B, d]\n    out: [B, d]\n    graph:\n      in -> matmul(w) -> out\n")
    lock = tmp_path / "m.module.lock"
    lock.write_text("my own notes, not a lock file\n")
    err = failing(capsys, "E045", [str(module), "--lock"], opt_main)
    assert "is not a lock file" in err and lock.read_text() == "my own notes, not a lock file\n"
    lock.unlink()
    assert opt_main([str(module), "--lock"]) == 0
    written = lock.read_text()
    lock.write_text(written + "  stale: v0 local@000000000000\n")
    assert opt_main([str(module), "--lock"]) == 0 and lock.read_text() == written  # an old lock is replaced
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.module", "m.module.lock"]
