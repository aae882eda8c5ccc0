"""Replacing a folder atomically: the old folder stays intact until the new one is complete."""

import os

import pytest

from modeldsl.runtime import atomic
from modeldsl.runtime.atomic import recover, replacing_folder


def write(folder, **files):
    for name, text in files.items():
        (folder / name).write_text(text)


def siblings(tmp_path):
    return sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("."))


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "two-renames"])
def test_a_new_folder_replaces_the_old_one(tmp_path, monkeypatch, exchange):
    if not exchange:
        monkeypatch.setattr(atomic, "_exchange", lambda a, b: False)
    out = tmp_path / "out"
    with replacing_folder(out) as folder:
        write(folder, a="1", b="1")
    assert sorted(p.name for p in out.iterdir()) == ["a", "b"]
    with replacing_folder(out) as folder:
        assert folder.parent == tmp_path and not any(folder.iterdir())
        write(folder, a="2")
    assert sorted(p.name for p in out.iterdir()) == ["a"] and (out / "a").read_text() == "2"
    assert siblings(tmp_path) == []
    assert oct(out.stat().st_mode & 0o777) == oct(0o777 & ~_umask())


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@pytest.mark.parametrize("error", [OSError("disk full"), KeyboardInterrupt()])
def test_a_failed_write_leaves_the_old_folder_and_no_temporary_one(tmp_path, error):
    out = tmp_path / "out"
    with replacing_folder(out) as folder:
        write(folder, a="old")
    with pytest.raises(type(error)):
        with replacing_folder(out) as folder:
            write(folder, a="new", b="half")
            raise error
    assert sorted(p.name for p in out.iterdir()) == ["a"] and (out / "a").read_text() == "old"
    assert siblings(tmp_path) == []


def test_a_failed_second_rename_puts_the_old_folder_back(tmp_path, monkeypatch):
    monkeypatch.setattr(atomic, "_exchange", lambda a, b: False)
    out = tmp_path / "out"
    out.mkdir()
    write(out, a="old")
    real = os.rename

    def rename(src, dst):
        if ".tmp-" in str(src):
            raise OSError("injected")
        return real(src, dst)

    monkeypatch.setattr(atomic.os, "rename", rename)
    with pytest.raises(OSError, match="injected"):
        with replacing_folder(out) as folder:
            write(folder, a="new")
    assert (out / "a").read_text() == "old" and siblings(tmp_path) == []


def test_leftovers_of_dead_processes_are_cleaned_up(tmp_path):
    out = tmp_path / "out"
    dead = 2 ** 22 + 12345  # above the default pid_max
    (tmp_path / f".out.tmp-{dead}-abcd").mkdir()
    (tmp_path / f".out.old-{dead}-beef").mkdir()
    write(tmp_path / f".out.old-{dead}-beef", a="previous")
    recover(out)  # killed between the fallback's two renames: the previous folder comes back
    assert (out / "a").read_text() == "previous" and siblings(tmp_path) == []
    (tmp_path / f".out.tmp-{os.getpid()}-abcd").mkdir()  # a live process's folder stays
    recover(out)
    assert siblings(tmp_path) == [f".out.tmp-{os.getpid()}-abcd"]
