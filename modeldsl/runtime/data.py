"""The training data pipeline of ``mdsl-run --train DATA``: documents, one token stream, packed batches.

``DATA`` is a text file (one document) or a ``.jsonl`` file with one JSON
object per line whose ``"text"`` field is a document (blank lines are
skipped). :func:`token_stream` tokenizes every document and concatenates
them with the tokenizer's EOS id after each one (where it is known), so that
the stream, read cyclically, has an EOS between any two documents, also where
it wraps around. :class:`PackedBatches` cuts the stream in order into
sequences of ``T + 1`` tokens (inputs: the first ``T``, labels: the next
``T``) and groups ``B`` of them into a batch; when the stream runs out it
continues from its start (a sequence may straddle the end) and counts an
epoch. Its position (token offset and epoch) is all the state it has, so a
resumed run that restores it reads the very same batches.

Problems are coded diagnostics: a missing or unreadable file E028; a file
that is not UTF-8, a ``.jsonl`` line that is not a JSON object with a string
``"text"`` (naming ``file:line``), data without a single token, or token ids
outside the model's vocabulary E030.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from modeldsl.diagnostics import Diagnostic, DiagnosticError, Source, Span


def _error(code: str, message: str, hint: str = "", span: Span | None = None) -> DiagnosticError:
    return DiagnosticError([Diagnostic(code, message, span, hint)])


def read_documents(path: str | Path) -> list[str]:
    """The documents of ``path``: the whole text of a text file, or the ``"text"`` of each
    line of a ``.jsonl`` file (blank lines skipped)."""
    path = Path(path)
    if path.exists() and not path.is_file() and not path.is_dir():  # a FIFO or device: reading would block
        raise _error("E028", f"the training data '{path}' is not a regular file (a FIFO, device or socket)",
                     "give a text file or a .jsonl file with a \"text\" field per line")
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise _error("E028", f"no such training data file '{path}'",
                     "give a text file or a .jsonl file with a \"text\" field per line") from None
    except IsADirectoryError:
        raise _error("E028", f"the training data '{path}' is a folder, not a file",
                     "give a text file or a .jsonl file with a \"text\" field per line") from None
    except OSError as err:
        raise _error("E028", f"cannot read the training data '{path}': {err.strerror or err}",
                     "give a readable file") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw.count(b"\n", 0, err.start) + 1
        column = err.start - (raw.rfind(b"\n", 0, err.start) + 1) + 1
        raise _error("E030", f"{path}:{line}:{column}: the training data is not UTF-8 text (byte "
                     f"0x{raw[err.start]:02x} at offset {err.start})",
                     "convert the file to UTF-8") from None
    if text.startswith("\ufeff"):
        text = text[1:]  # a byte-order mark is no part of the text
    if path.suffix.lower() != ".jsonl":
        return [text]
    source = Source(str(path), text)
    documents = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            span = Span(source, number, err.colno, number, err.colno + 1)
            raise _error("E030", f"{path}:{number}: not a JSON object: {err.msg}",
                         "each line of a .jsonl file is one JSON object such as {\"text\": \"...\"}", span) from None
        if not isinstance(record, dict) or "text" not in record:
            what = "has no \"text\" field" if isinstance(record, dict) else f"is a JSON {type(record).__name__}, " \
                                                                              "not an object"
            raise _error("E030", f"{path}:{number}: the line {what}",
                         "each line of a .jsonl file is one JSON object with the document in \"text\"",
                         Span(source, number, 1, number, len(line) + 1))
        if not isinstance(record["text"], str):
            raise _error("E030", f"{path}:{number}: \"text\" is a {type(record['text']).__name__}, not a string",
                         "each line's \"text\" field holds the document as a string",
                         Span(source, number, 1, number, len(line) + 1))
        documents.append(record["text"])
    return documents


def token_stream(documents: Sequence[str], encode: Callable[[str], list[int]], eos: int | None,
                 where: str = "the training data") -> np.ndarray:
    """Every document's tokens, in order, each followed by ``eos`` where known (int64)."""
    pieces = []
    for document in documents:
        ids = list(encode(document))
        if eos is not None and (ids or document):
            ids.append(eos)
        if ids:
            pieces.append(np.asarray(ids, dtype=np.int64))
    if not pieces or sum(len(p) for p in pieces) < 2:
        raise _error("E030", f"{where} holds fewer than two tokens", "give a file with some text to train on")
    return np.concatenate(pieces)


def check_vocabulary(tokens: np.ndarray, vocab: int | None, where: str, how: str) -> None:
    """E030 when a token id is outside ``[0, vocab)`` (``how`` says how the data was tokenized)."""
    if vocab is None:
        return
    outside = np.flatnonzero((tokens < 0) | (tokens >= vocab))
    if outside.size:
        raise _error("E030", f"{where} tokenizes ({how}) to id {int(tokens[outside[0]])} at token "
                     f"{int(outside[0])}, outside the model's vocabulary [0, {vocab})",
                     "train with the checkpoint's tokenizer.json (UTF-8 bytes need a vocabulary of 256 or more)")


def fingerprint(tokens: np.ndarray) -> str:
    """The sha256 of the token stream (a resumed run checks it is reading the same data)."""
    return hashlib.sha256(np.ascontiguousarray(tokens, dtype="<i8").tobytes()).hexdigest()


@dataclass
class PackedBatches:
    """Sequences of ``seq + 1`` tokens cut in order from the cyclic token stream."""

    tokens: np.ndarray
    seq: int
    position: int = 0  # the offset of the next sequence's first token, in [0, len(tokens))
    epoch: int = 0  # how many times the stream has wrapped around

    def __post_init__(self) -> None:
        if self.seq < 1:
            raise ValueError(f"seq must be at least 1, got {self.seq}")
        self.tokens = np.asarray(self.tokens, dtype=np.int64)
        if len(self.tokens) == 0:
            raise ValueError("the token stream is empty")
        self.position, wraps = self.position % len(self.tokens), self.position // len(self.tokens)
        self.epoch += wraps

    def next_sequence(self) -> np.ndarray:
        """The next ``seq + 1`` tokens, wrapping around (and counting the epoch) at the end."""
        size = len(self.tokens)
        end = self.position + self.seq + 1
        indices = np.arange(self.position, end) % size
        self.position = end % size
        self.epoch += end // size
        return self.tokens[indices]

    def next_batch(self, batch: int) -> tuple[np.ndarray, np.ndarray]:
        """``(inputs, labels)``, both ``[batch, seq]`` int64: labels are the inputs shifted by one."""
        rows = np.stack([self.next_sequence() for _ in range(batch)])
        return rows[:, :-1], rows[:, 1:]

    def micro_batches(self, batch: int, count: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """The ``count`` micro-batches of one optimizer step."""
        return [self.next_batch(batch) for _ in range(count)]

    def state(self) -> dict[str, int]:
        return {"position": int(self.position), "epoch": int(self.epoch)}
