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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from modeldsl.diagnostics import Diagnostic, DiagnosticError, Span


def _error(code: str, message: str, hint: str = "", span: Span | None = None) -> DiagnosticError:
    return DiagnosticError([Diagnostic(code, message, span, hint)])


def read_documents(path: str | Path) -> list[str]:
    """The documents of ``path``: the whole text of a text file, or the ``"text"`` of each
    line of a ``.jsonl`` file (blank lines skipped; :func:`modeldsl.runtime.instructions.read_records`)."""
    from modeldsl.runtime.instructions import read_records

    records = read_records(path)
    if records and records[0].kind != "text":
        raise _error("E030", f"{path} holds {records[0].kind} examples, not documents",
                     "read it with modeldsl.runtime.instructions.read_examples")
    return [record.fields["text"] for record in records]


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
