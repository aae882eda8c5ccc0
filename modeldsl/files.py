"""Reading a file a user named: never blocking on a FIFO or reading a device without end.

:func:`read_regular_file` gives a file's bytes, or E028 with the reason for a missing path,
a folder, a FIFO or a device, which are refused by ``stat`` before anything opens them.
"""

from __future__ import annotations

import os
import stat

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
