"""The tokenizer of a checkpoint: its ``tokenizer.json`` read offline with HuggingFace's
``tokenizers`` (imported only when there is one), else UTF-8 bytes as token ids.

``mdsl-run`` tokenizes its ``--prompt`` with it and ``mdsl-run --train`` its data. A
``tokenizer.json`` that is not a regular file is E028 (never read: a FIFO would block), one
that ``tokenizers`` cannot read E030.
"""

from __future__ import annotations

from pathlib import Path

from modeldsl.diagnostics import Diagnostic, DiagnosticError


class Tokenizer:
    """The checkpoint's ``tokenizer.json`` (offline), or UTF-8 bytes."""

    def __init__(self, directory: Path):
        path = directory / "tokenizer.json"
        self.inner = None
        if path.exists() and not path.is_file():  # a folder, FIFO or device: never read (a FIFO would block)
            raise DiagnosticError([Diagnostic("E028", f"the tokenizer '{path}' is not a file", None,
                                              "replace it with the checkpoint's tokenizer.json, or remove it to "
                                              "tokenize as UTF-8 bytes (or pass --tokens)")])
        if path.is_file():
            from tokenizers import Tokenizer as HFTokenizer

            try:
                self.inner = HFTokenizer.from_file(str(path))
            except Exception as err:  # noqa: BLE001 - tokenizers raises plain Exception for bad files
                raise DiagnosticError([Diagnostic("E030", f"cannot read the tokenizer {path}: {err}", None,
                                                  "replace tokenizer.json with the checkpoint's original one, or "
                                                  "remove it to tokenize as UTF-8 bytes (or pass --tokens)")]) from None

    def encode(self, text: str) -> list[int]:
        return self.inner.encode(text).ids if self.inner is not None else list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        if self.inner is not None:
            return self.inner.decode(ids)
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")
