"""Replacing a folder atomically: write a new one beside it, then swap it in.

:func:`replacing_folder` yields a fresh hidden sibling of the target
(``.NAME.tmp-PID-XXXX``); when the block finishes, its files are flushed to
disk and the folder takes the target's place in one step (Linux
``renameat2(RENAME_EXCHANGE)``; elsewhere two renames, undone if the second
fails). Until then the target is untouched, and if the block fails (an
exception, ``KeyboardInterrupt`` included) the temporary folder is removed,
so a reader sees the old folder or the new one, never a mix. Siblings left by
processes that were killed (``SIGKILL``, power loss) are removed by the next
replacement of the same target; if one was killed between the two renames of
the fallback, the previous folder is put back first.
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import secrets
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from modeldsl.files import process_alive

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def _sibling(target: Path, kind: str) -> Path:
    return target.parent / f".{target.name}.{kind}-{os.getpid()}-{secrets.token_hex(4)}"


def recover(target: Path) -> None:
    """Remove the temporary siblings of ``target`` left by dead processes (putting a previous
    folder back first where the target is missing)."""
    pattern = re.compile(rf"^\.{re.escape(target.name)}\.(tmp|old)-(\d+)-[0-9a-f]+$")
    try:
        entries = sorted(target.parent.iterdir())
    except OSError:
        return
    for entry in entries:
        match = pattern.match(entry.name)
        if not match or process_alive(int(match[2])):
            continue
        if match[1] == "old" and not os.path.lexists(target):
            os.rename(entry, target)
        else:
            shutil.rmtree(entry, ignore_errors=True)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux renameat2); False where the system cannot."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    renameat2.restype = ctypes.c_int
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False  # a file system without exchange: fall back to two renames
    raise OSError(code, os.strerror(code), str(b))


def _fsync_tree(folder: Path) -> None:
    for root, _, files in os.walk(folder):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(Path(root))


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return  # e.g. a system that cannot open folders
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def swap_in(new: Path, target: Path) -> None:
    """Put the folder ``new`` at ``target`` (replacing a folder there) in one step."""
    if not os.path.lexists(target):
        os.rename(new, target)
    elif _exchange(new, target):
        shutil.rmtree(new)  # now the previous folder
    else:
        old = _sibling(target, "old")
        os.rename(target, old)
        try:
            os.rename(new, target)
        except BaseException:
            os.rename(old, target)
            raise
        shutil.rmtree(old, ignore_errors=True)
    _fsync_dir(target.parent)


@contextmanager
def replacing_folder(target: str | Path) -> Iterator[Path]:
    """Yield an empty temporary sibling folder of ``target`` to write into; on success it
    replaces ``target`` atomically, on failure it is removed and ``target`` stays as it was."""
    target = Path(target)
    if target.is_symlink():
        target = target.resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    recover(target)
    new = _sibling(target, "tmp")
    os.mkdir(new)
    try:
        yield new
        _fsync_tree(new)
        swap_in(new, target)
    except BaseException:
        shutil.rmtree(new, ignore_errors=True)
        raise
