"""Saves touch only their own files: E044 for a folder that is not the run's, the user's files kept
through a replacement, atomic single files (modeldsl.files), and SIGKILL during a save."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from modeldsl.diagnostics import CODES, DiagnosticError
from modeldsl.files import replacing_file, write_file
from modeldsl.runtime.saves import MARKER, SaveTarget, previous_save, saved_run, saving_folder


def save(target: SaveTarget, **files: str) -> None:
    with saving_folder(target) as folder:
        for name, text in files.items():
            (folder / name).write_text(text)


def names(folder) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def code_of(call) -> str:
    with pytest.raises(DiagnosticError) as caught:
        call()
    (diagnostic,) = caught.value.diagnostics
    assert diagnostic.hint, diagnostic.render()
    return diagnostic.code


def test_the_codes_are_registered():
    assert {"E044", "E045"} <= set(CODES)


def test_a_new_or_empty_folder_is_written_and_marked(tmp_path):
    save(SaveTarget(tmp_path / "new", "run1"), a="1")
    (tmp_path / "empty").mkdir()
    save(SaveTarget(tmp_path / "empty", "run1"), a="1")
    for folder in (tmp_path / "new", tmp_path / "empty"):
        assert names(folder) == [MARKER, "a"] and saved_run(folder) == "run1"


def test_a_folder_of_the_users_is_e044_and_kept(tmp_path):
    out = tmp_path / "runs"
    (out / "old").mkdir(parents=True)
    (out / "old" / "notes.txt").write_text("keep")
    assert code_of(lambda: save(SaveTarget(out, "run1"), a="1")) == "E044"
    assert (out / "old" / "notes.txt").read_text() == "keep" and names(out) == ["old"]
    assert names(tmp_path) == ["runs"]  # no temporary folder left


def test_overwrite_replaces_the_folder_and_everything_in_it(tmp_path):
    out = tmp_path / "runs"
    (out / "old").mkdir(parents=True)
    save(SaveTarget(out, "run1", overwrite=True), a="1")
    assert names(out) == [MARKER, "a"]


def test_another_runs_save_is_e044(tmp_path):
    out = tmp_path / "out"
    save(SaveTarget(out, "run1"), a="1")
    with pytest.raises(DiagnosticError, match="not one of this run"):
        save(SaveTarget(out, "run2"), a="2")
    assert (out / "a").read_text() == "1"


def test_a_save_of_the_same_run_is_replaced_and_the_users_files_in_it_are_carried(tmp_path):
    out = tmp_path / "out"
    save(SaveTarget(out, "run1"), a="1", b="1")
    (out / "notes.txt").write_text("mine")
    (out / "sub").mkdir()
    (out / "sub" / "x").write_text("deep")
    inode = (out / "notes.txt").stat().st_ino
    save(SaveTarget(out, "run1"), a="2")  # b is no longer written: it was the save's, it goes
    assert names(out) == [MARKER, "a", "notes.txt", "sub"]
    assert (out / "a").read_text() == "2" and (out / "sub" / "x").read_text() == "deep"
    assert (out / "notes.txt").stat().st_ino == inode  # the same file, linked into the new folder
    save(SaveTarget(out, "run1"), a="3")  # and still the user's in the next save
    assert (out / "notes.txt").read_text() == "mine"


def test_a_users_file_with_the_name_of_a_saved_file_is_e044(tmp_path):
    out = tmp_path / "out"
    save(SaveTarget(out, "run1"), a="1")
    (out / "b").write_text("mine")
    assert code_of(lambda: previous_save(SaveTarget(out, "run1"), writes=("b",))) == "E044"
    assert code_of(lambda: save(SaveTarget(out, "run1"), a="2", b="2")) == "E044"
    assert (out / "b").read_text() == "mine" and (out / "a").read_text() == "1"


def test_the_folder_a_run_continues_is_its_own_even_without_a_marker(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "a").write_text("old save")
    (out / "notes.txt").write_text("mine")
    save(SaveTarget(out, "run1", continues=out), a="new")
    assert names(out) == [MARKER, "a", "notes.txt"] and (out / "a").read_text() == "new"


def test_the_working_folder_is_never_replaced(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert code_of(lambda: save(SaveTarget(tmp_path, "run1", overwrite=True), a="1")) == "E044"
    assert code_of(lambda: save(SaveTarget(tmp_path.parent, "run1", overwrite=True), a="1")) == "E044"


def test_a_file_is_e028(tmp_path):
    (tmp_path / "f").write_text("x")
    assert code_of(lambda: save(SaveTarget(tmp_path / "f", "run1", overwrite=True), a="1")) == "E028"


def test_a_failing_save_leaves_the_old_one_and_the_users_files(tmp_path):
    out = tmp_path / "out"
    save(SaveTarget(out, "run1"), a="1")
    (out / "notes.txt").write_text("mine")
    with pytest.raises(OSError), saving_folder(SaveTarget(out, "run1")) as folder:
        (folder / "a").write_text("half")
        raise OSError("disk full")
    assert names(out) == [MARKER, "a", "notes.txt"] and (out / "a").read_text() == "1"
    assert names(tmp_path) == ["out"]


CHILD = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from modeldsl.runtime.saves import SaveTarget, saving_folder

    out, ready = Path(sys.argv[1]), Path(sys.argv[2])
    with saving_folder(SaveTarget(out, "run1")) as folder:
        (folder / "a").write_text("new")
        ready.write_text("writing")
        time.sleep(60)
""")


def test_a_save_killed_midway_leaves_the_old_one_and_the_next_save_cleans_up(tmp_path):
    out, ready = tmp_path / "out", tmp_path / "ready"
    save(SaveTarget(out, "run1"), a="old")
    (out / "notes.txt").write_text("mine")
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(out), str(ready)])
    try:
        deadline = time.monotonic() + 60
        while not ready.exists() and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ready.exists(), "the child never got to write its save"
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    assert (out / "a").read_text() == "old" and (out / "notes.txt").read_text() == "mine"
    assert any(p.name.startswith(".out.tmp-") for p in tmp_path.iterdir())  # the killed save's folder
    save(SaveTarget(out, "run1"), a="next")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "ready"]
    assert names(out) == [MARKER, "a", "notes.txt"] and (out / "a").read_text() == "next"


# ---------------------------------------------------------------------------- single files
def test_a_named_file_is_replaced_whole_and_nothing_else_is_touched(tmp_path):
    (tmp_path / "x.txt").write_text("old")
    (tmp_path / "other").write_text("keep")
    write_file(tmp_path / "x.txt", "new")
    assert (tmp_path / "x.txt").read_text() == "new" and names(tmp_path) == ["other", "x.txt"]


def test_a_default_name_never_replaces_a_file(tmp_path):
    (tmp_path / "loss.png").write_text("the user's")
    with pytest.raises(FileExistsError):
        write_file(tmp_path / "loss.png", "ours", replace=False)
    assert (tmp_path / "loss.png").read_text() == "the user's" and names(tmp_path) == ["loss.png"]
    write_file(tmp_path / "fresh.png", "ours", replace=False)
    assert (tmp_path / "fresh.png").read_text() == "ours"


def test_a_failed_write_leaves_the_old_file_and_a_dead_processes_leftover_goes(tmp_path):
    target = tmp_path / "x.txt"
    target.write_text("old")
    dead = tmp_path / f".x.txt.tmp-{2 ** 22 + 12345}-abcd"  # above the default pid_max
    dead.write_text("half")
    with pytest.raises(RuntimeError), replacing_file(target) as tmp:
        tmp.write_text("half")
        raise RuntimeError("failed")
    assert target.read_text() == "old" and names(tmp_path) == ["x.txt"]


def test_a_folder_is_not_replaced_by_a_file(tmp_path):
    (tmp_path / "d").mkdir()
    with pytest.raises(IsADirectoryError):
        write_file(tmp_path / "d", "x")
    assert names(tmp_path) == ["d"]
