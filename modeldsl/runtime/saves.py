"""Saving into a folder without touching what is not the save's own.

A save (``mdsl-run --save OUT``, ``Model.save_hf(OUT)``) writes a folder of its
own files and a marker, ``.modeldsl-save.json``, naming the run that wrote it
(a random id: one per training run, kept by ``--resume``; one per
:class:`~modeldsl.runtime.model.Model`) and the files it wrote. Where ``OUT``

- does not exist or is an empty folder, the save creates it;
- is a save of the same run (its marker's id), or the folder the run continues
  (``--resume OUT``, with or without a marker), the save replaces it
  atomically (:func:`modeldsl.runtime.atomic.replacing_folder`) and every entry
  the earlier save did not write (the user's notes, a subfolder) is carried
  into the new folder as it is (hard-linked, else copied), so it survives
  the swap; one whose name the new save writes too is E044;
- holds anything else (a folder of the user's, a checkpoint from elsewhere, a
  save of another run), the save is E044 unless ``overwrite``: then the folder
  is replaced, everything in it included, still atomically.

A folder that holds the working folder is E044 even with ``overwrite``.
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import shutil
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from modeldsl.diagnostics import Diagnostic, DiagnosticError
from modeldsl.runtime.atomic import replacing_folder

MARKER = ".modeldsl-save.json"
FORMAT = "modeldsl-save"


def new_run() -> str:
    """A fresh run id for the markers of a run's saves."""
    return secrets.token_hex(8)


def _marker(folder: Path) -> dict | None:
    """The marker of a save folder, or None (none, unreadable, or not one of ours)."""
    try:
        marker = json.loads((folder / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(marker, dict) or marker.get("format") != FORMAT or not isinstance(marker.get("run"), str):
        return None
    files = marker.get("files")
    if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
        return None
    return marker


def saved_run(folder: str | os.PathLike) -> str | None:
    """The run id of the save in ``folder`` (None: no modeldsl save marker there)."""
    marker = _marker(Path(folder))
    return marker["run"] if marker is not None else None


@dataclass(frozen=True)
class SaveTarget:
    """Where a save goes and what it may replace there.

    ``run``: the id of the run (or model) saving; ``continues``: a folder the run continues
    (``--resume``), its own even without a marker; ``overwrite``: replace whatever is there;
    ``what``: how messages name the target (``--save 'OUT'``); ``how``: how the user asks
    to overwrite (``--overwrite``, ``overwrite=True``); ``owner``: who saves (``this run``)."""

    path: Path
    run: str
    overwrite: bool = False
    continues: Path | None = None
    what: str = "the save folder"
    how: str = "--overwrite"
    owner: str = "this run"

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", resolved(self.path))

    def error(self, message: str, hint: str) -> DiagnosticError:
        return DiagnosticError([Diagnostic("E044", f"{self.what}: {message}", None, hint)])


def _entries(folder: Path) -> list[str]:
    try:
        return sorted(entry.name for entry in folder.iterdir())
    except FileNotFoundError:
        return []


def _shown(names: Iterable[str], folder: Path) -> str:
    names = list(names)
    shown = [n + ("/" if (folder / n).is_dir() else "") for n in names[:3]]
    return ", ".join(shown) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def _holds_working_folder(path: Path) -> bool:
    cwd, path = Path.cwd().resolve(), path.resolve()
    return cwd == path or path in cwd.parents


@dataclass(frozen=True)
class Previous:
    """The earlier save a new one replaces: the entries it wrote (``legacy``: a folder the run
    continues that has no marker, whose entries the new save writes are taken as its own)."""

    owned: frozenset[str]
    legacy: bool = False

    def mine(self, name: str, written: Iterable[str]) -> bool:
        return name in self.owned or (self.legacy and name in written)


def previous_save(target: SaveTarget, writes: Iterable[str] = ()) -> Previous | None:
    """The earlier save in ``target.path`` that the save replaces, or None where the save
    replaces the whole folder (it is new, empty, or overwritten). E044 where the folder is not
    the run's own, or (``writes``: names the save will write) where an entry of the user's
    there has the name of one the save writes; E028 for a file."""
    path = target.path
    if _holds_working_folder(path):
        raise target.error("the folder is the working folder or holds it", "give a folder of its own, such as "
                           "out/run")
    if not os.path.lexists(path):
        _check_parents(path)
        return None
    if not path.is_dir():
        raise DiagnosticError([Diagnostic("E028", f"{target.what} is a file, not a folder", None,
                                          "give a folder path for the checkpoint")])
    entries = _entries(path)
    if target.overwrite or not entries:
        return None
    marker = _marker(path)
    continued = target.continues is not None and resolved(target.continues) == path
    if (marker is None or marker["run"] != target.run) and not continued:
        raise target.error(_not_ours(target, marker, entries), f"give a new or empty folder, or {target.how} to "
                           "replace the folder and everything in it")
    if marker is None:  # the folder the run continues, saved before saves carried markers
        return Previous(frozenset(), legacy=True)
    previous = Previous(frozenset({MARKER, *marker["files"]}))
    clashes = sorted(name for name in set(writes) if name in entries and not previous.mine(name, ()))
    if clashes:
        raise _clash(target, clashes)
    return previous


def _check_parents(path: Path) -> None:
    """NotADirectoryError where the nearest existing parent of a new folder is not a folder."""
    ancestor = next(p for p in path.parents if os.path.lexists(p))
    if not ancestor.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(ancestor))


def _not_ours(target: SaveTarget, marker: dict | None, entries: list[str]) -> str:
    if marker is not None:
        return f"the folder holds a modeldsl save, but not one of {target.owner} (its run is {marker['run']})"
    return f"the folder holds files that are not a modeldsl save of {target.owner} ({_shown(entries, target.path)})"


def _clash(target: SaveTarget, names: list[str]) -> DiagnosticError:
    return target.error(f"the folder holds {_shown(names, target.path)}, which the earlier save there did not "
                        "write and this one would replace", f"move {'it' if len(names) == 1 else 'them'} out of "
                        f"the folder, or {target.how} to replace the folder and everything in it")


def _link_or_copy(source: str, destination: str) -> None:
    try:
        os.link(source, destination, follow_symlinks=False)
    except OSError:
        shutil.copy2(source, destination, follow_symlinks=False)


def _carry(source: Path, destination: Path) -> None:
    """``source`` (a file, link or folder of the user's) into ``destination``, sharing its files."""
    if source.is_symlink():
        os.symlink(os.readlink(source), destination)
    elif source.is_dir():
        shutil.copytree(source, destination, symlinks=True, copy_function=_link_or_copy)
    else:
        _link_or_copy(str(source), str(destination))


def _finish(target: SaveTarget, folder: Path, previous: Previous | None) -> None:
    """Mark the new save, then bring in what the earlier folder held that was not its save's."""
    written = _entries(folder)
    if previous is not None:
        foreign = [name for name in _entries(target.path) if not previous.mine(name, written)]
        clashes = [name for name in foreign if name in written]
        if clashes:
            raise _clash(target, clashes)
        for name in foreign:
            _carry(target.path / name, folder / name)
    marker = {"format": FORMAT, "version": 1, "run": target.run, "files": written}
    (folder / MARKER).write_text(json.dumps(marker, indent=1) + "\n", encoding="utf-8")


def resolved(path: str | os.PathLike) -> Path:
    """The absolute path a save replaces (a symbolic link's target, as replacing_folder does)."""
    path = Path(path)
    return (path.resolve() if path.is_symlink() else Path(os.path.abspath(path)))


@contextmanager
def saving_folder(target: SaveTarget) -> Iterator[Path]:
    """Yield an empty folder to write the save into; when the block succeeds it becomes
    ``target.path`` atomically, marked and with the user's entries of the earlier folder
    carried over (see the module). E044/E028 before anything is written where the folder is
    not the run's own."""
    previous = previous_save(target)
    with replacing_folder(target.path) as folder:
        yield folder
        _finish(target, folder, previous)
