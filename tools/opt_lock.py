"""``mdsl-opt --lock`` and ``--locked``: the lock file of a Module DSL program (spec 4.7.1).

``--lock`` writes ``NAME.module.lock`` beside ``NAME.module``: every import the
program resolves, with its version, where it came from and a hash of its
content (atomically, replacing an earlier lock file; a file of that name
that is not a lock file is E045 and stays as it was). ``--locked`` resolves the imports again
and compares: an import whose version, origin or content differs from the lock file's, one the lock file does
not list and one it lists that is no longer imported are E039 (at the lock
file's line, naming the import, with a hint to rerun ``--lock``); a missing
lock file is E028.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from modeldsl.diagnostics import Diagnostic, DiagnosticError, DiagnosticSink, Source, Span

_ENTRY = re.compile(r"^  (?P<name>[^:\s]+): (?P<value>.+)$")
LOCK_HEADER = b"version: 1\nresolved_modules:\n"  # how every lock file begins (ResolvedProgram.lock_manifest)


def lock_path(module_path: str) -> Path:
    """``NAME.module.lock`` beside ``NAME.module``."""
    path = Path(module_path)
    return path.with_name(path.name + ".lock")


def resolved_manifest(program) -> str:
    """The lock text of a parsed program (its import errors raised)."""
    from modeldsl.resolve.imports import resolve_program

    sink = DiagnosticSink()
    resolved = resolve_program(program, sink)
    sink.raise_if_errors()
    return resolved.lock_manifest()


def write_lock(program, module_path: str) -> Path:
    """Write the lock file beside the program's file, atomically, replacing an earlier lock file
    only: a file of that name that is not one is E045; E028 when it cannot be written."""
    from modeldsl.files import write_file

    lock = lock_path(module_path)
    manifest = resolved_manifest(program)
    if os.path.lexists(lock) and not _is_lock_file(lock):
        raise DiagnosticError([Diagnostic("E045", f"--lock: '{lock}' exists and is not a lock file; it is kept",
                                          None, f"move '{lock}' away, then rerun mdsl-opt --lock {module_path}")])
    try:
        write_file(lock, manifest)
    except OSError as err:
        raise DiagnosticError([Diagnostic("E028", f"cannot write '{lock}': {err.strerror or err}", None,
                                          "check that the folder of the .module file is writable")]) from None
    return lock


def _is_lock_file(path: Path) -> bool:
    """Whether ``path`` is a regular file that begins as ``--lock`` writes them."""
    if not path.is_file() or path.is_symlink():
        return False
    try:
        with open(path, "rb") as f:
            return f.read(len(LOCK_HEADER)) == LOCK_HEADER
    except OSError:
        return False


def check_lock(program, module_path: str) -> None:
    """E039 for each import that differs from the lock file; E028 when there is none."""
    lock = lock_path(module_path)
    try:
        if lock.exists() and not lock.is_file():  # a folder, FIFO or device: never read (a FIFO would block)
            raise IsADirectoryError(0, "it is not a regular file")
        text = lock.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        reason = ("it does not exist" if isinstance(err, FileNotFoundError)
                  else getattr(err, "strerror", None) or str(err))
        raise DiagnosticError([Diagnostic("E028", f"--locked: cannot read the lock file '{lock}': {reason}", None,
                                          f"write it with mdsl-opt --lock {module_path}")]) from None
    locked = _entries(text)
    current = {name: value for name, (value, _) in _entries(resolved_manifest(program)).items()}
    source = Source(str(lock), text)
    problems = [_mismatch(name, locked.get(name), current.get(name), source, module_path)
                for name in sorted(set(locked) | set(current))
                if (locked.get(name) or (None,))[0] != current.get(name)]
    if problems:
        raise DiagnosticError(problems)


def _entries(text: str) -> dict[str, tuple[str, int]]:
    """Each locked import's ``version origin@hash`` and its line."""
    found = {}
    for number, line in enumerate(text.splitlines(), start=1):
        match = _ENTRY.match(line)
        if match is not None:
            found[match.group("name")] = (match.group("value").strip(), number)
    return found


def _mismatch(name: str, locked: tuple[str, int] | None, current: str | None, source: Source,
              module_path: str) -> Diagnostic:
    hint = f"if the change is intended, rerun mdsl-opt --lock {module_path}"
    if locked is None:
        return Diagnostic("E039", f"import {name} ({current}) is not in the lock file {source.name}", None, hint)
    value, line = locked
    span = Span(source, line, 3, line, len(source.line(line)) + 1)
    if current is None:
        return Diagnostic("E039", f"import {name} is locked but the program no longer imports it", span, hint)
    return Diagnostic("E039", f"import {name} resolves to {current}, the lock file has {value}", span, hint)
