"""Reading a file a user named, and writing one without touching anything else.

:func:`read_regular_file` gives a file's bytes, or E028 with the reason for a missing path,
a folder, a FIFO or a device, which are refused by ``stat`` before anything opens them.

:func:`replacing_file` (and :func:`write_file`) write a file atomically: into a hidden
sibling (``.NAME.tmp-PID-XXXX``), flushed, then renamed over the target (``replace=True``:
a file the user named) or linked in only where no file of that name exists
(``replace=False``: a default name the user did not give; :class:`FileExistsError`
otherwise). A reader sees the old file or the whole new one; a failed write leaves the
target as it was, and siblings of killed processes are removed by the next write of the
same target.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from modeldsl.diagnostics import Diagnostic, DiagnosticError


def read_regular_file(path: str | os.PathLike, hint: str = "check the path of the input file") -> bytes:
    """The bytes of ``path``; E028 (with ``hint``) for a missing path, a folder, a FIFO or a device."""
    try:
        mode = os.stat(path).st_mode
        if not stat.S_ISREG(mode):
            kind = "a folder" if stat.S_ISDIR(mode) else "not a regular file"
            raise IsADirectoryError(0, f"it is {kind}")
        with open(path, "rb") as f:
            return f.read()
    except OSError as err:
        reason = err.strerror if err.strerror else str(err)
        raise DiagnosticError([Diagnostic("E028", f"cannot read '{path}': {reason}", None, hint)]) from None


def process_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (this one does; one we may not signal does too)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def _remove_stale_siblings(target: Path) -> None:
    """Unlink the temporary files of ``target`` left by processes that no longer run."""
    pattern = re.compile(rf"^\.{re.escape(target.name)}\.tmp-(\d+)-[0-9a-f]+$")
    try:
        entries = list(target.parent.iterdir())
    except OSError:
        return
    for entry in entries:
        match = pattern.match(entry.name)
        if match and not process_alive(int(match[1])) and entry.is_file():
            with contextlib.suppress(OSError):
                entry.unlink()


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _link_new(tmp: Path, target: Path) -> None:
    """Put ``tmp`` at ``target`` only where nothing is there (FileExistsError otherwise)."""
    try:
        os.link(tmp, target)
    except FileExistsError:
        raise
    except OSError as err:
        if err.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
            raise
        if os.path.lexists(target):  # a file system without hard links: check, then rename
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(target)) from None
        os.replace(tmp, target)
        return
    tmp.unlink()


@contextmanager
def replacing_file(target: str | os.PathLike, replace: bool = True) -> Iterator[Path]:
    """Yield a temporary sibling path of ``target`` to write; when the block succeeds it becomes
    ``target`` in one step (``replace=False``: FileExistsError where ``target`` exists, which is
    then untouched); when it fails the sibling is removed. A folder at ``target`` is
    IsADirectoryError."""
    target = Path(target)
    if target.is_dir():
        raise IsADirectoryError(errno.EISDIR, "it is a folder", str(target))
    _remove_stale_siblings(target)
    tmp = target.parent / f".{target.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        yield tmp
        _fsync(tmp)
        if replace:
            os.replace(tmp, target)
        else:
            _link_new(tmp, target)
    finally:
        if os.path.lexists(tmp):
            tmp.unlink()


def write_file(target: str | os.PathLike, data: bytes | str, replace: bool = True) -> None:
    """Write ``data`` (text as UTF-8) to ``target`` atomically (see :func:`replacing_file`)."""
    with replacing_file(target, replace) as tmp:
        tmp.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
