"""The training data pipeline: documents, the token stream with EOS, packing and wrap-around."""

import json

import numpy as np
import pytest

from modeldsl.diagnostics import DiagnosticError
from modeldsl.runtime.data import PackedBatches, check_vocabulary, fingerprint, read_documents, token_stream


def byte_ids(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def code_of(excinfo) -> tuple[str, str]:
    (diagnostic,) = excinfo.value.diagnostics
    return diagnostic.code, diagnostic.render()


def test_a_text_file_is_one_document(tmp_path):
    path = tmp_path / "a.txt"
    path.write_text("line one\n\nline two\n", encoding="utf-8")
    assert read_documents(path) == ["line one\n\nline two\n"]


def test_a_byte_order_mark_is_dropped(tmp_path):
    path = tmp_path / "a.txt"
    path.write_bytes("\ufeffhi".encode("utf-8"))
    assert read_documents(path) == ["hi"]


def test_jsonl_documents_in_order_skipping_blank_lines(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"text": "first", "id": 1}) + "\n\n" + json.dumps({"text": "sécond"}) + "\n")
    assert read_documents(path) == ["first", "sécond"]


@pytest.mark.parametrize("lines, words", [
    (['{"text": "ok"}', '{"body": "no text"}'], 'd.jsonl:2: the line has no "text", "prompt"/"completion" or'),
    (['{"text": "ok"}', '[1, 2]'], "d.jsonl:2: the line is a JSON list, not an object"),
    (['{"text": 5}'], 'd.jsonl:1: "text" is a int, not a string'),
    (['{"text": "ok"}', '', '{"text": '], "d.jsonl:3: not a JSON object"),
])
def test_bad_jsonl_lines_are_e030_naming_file_and_line(tmp_path, lines, words):
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DiagnosticError) as excinfo:
        read_documents(path)
    code, text = code_of(excinfo)
    assert code == "E030" and words in text and "hint:" in text


def test_missing_data_and_folders_are_e028(tmp_path):
    for path in (tmp_path / "nope.txt", tmp_path):
        with pytest.raises(DiagnosticError) as excinfo:
            read_documents(path)
        assert code_of(excinfo)[0] == "E028"


def test_text_that_is_not_utf8_is_e030_with_its_position(tmp_path):
    path = tmp_path / "latin1.txt"
    path.write_bytes(b"ok\ncaf\xe9\n")
    with pytest.raises(DiagnosticError) as excinfo:
        read_documents(path)
    code, text = code_of(excinfo)
    assert code == "E030" and "latin1.txt:2:4" in text and "0xe9" in text


def test_the_stream_puts_eos_after_every_document():
    stream = token_stream(["ab", "", "c"], byte_ids, eos=1)
    assert stream.tolist() == [97, 98, 1, 99, 1] and stream.dtype == np.int64
    assert token_stream(["ab", "c"], byte_ids, eos=None).tolist() == [97, 98, 99]


def test_data_without_tokens_is_e030():
    with pytest.raises(DiagnosticError) as excinfo:
        token_stream(["", ""], byte_ids, eos=None)
    assert code_of(excinfo)[0] == "E030"


def test_ids_outside_the_vocabulary_are_e030():
    check_vocabulary(np.array([0, 63]), 64, "data", "bytes")
    with pytest.raises(DiagnosticError) as excinfo:
        check_vocabulary(np.array([3, 97]), 64, "data", "as UTF-8 bytes")
    code, text = code_of(excinfo)
    assert code == "E030" and "id 97 at token 1" in text and "[0, 64)" in text


def test_sequences_are_packed_in_order_labels_shifted_by_one():
    batches = PackedBatches(np.arange(20), seq=3)
    inputs, labels = batches.next_batch(2)
    assert inputs.tolist() == [[0, 1, 2], [4, 5, 6]]
    assert labels.tolist() == [[1, 2, 3], [5, 6, 7]]
    assert batches.state() == {"position": 8, "epoch": 0}


def test_the_stream_wraps_around_and_counts_epochs():
    batches = PackedBatches(np.arange(10), seq=3)
    rows = [batches.next_sequence().tolist() for _ in range(3)]
    assert rows == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 0, 1]]
    assert batches.state() == {"position": 2, "epoch": 1}
    short = PackedBatches(np.arange(3), seq=7)  # shorter than one sequence: read cyclically
    assert short.next_sequence().tolist() == [0, 1, 2, 0, 1, 2, 0, 1] and short.epoch == 2


def test_a_restored_position_reads_the_same_batches():
    tokens = np.random.default_rng(0).integers(0, 50, 101)
    first = PackedBatches(tokens, seq=8)
    first.micro_batches(3, 2)
    again = PackedBatches(tokens, seq=8, **first.state())
    for (a_in, a_lab), (b_in, b_lab) in zip(first.micro_batches(3, 5), again.micro_batches(3, 5)):
        assert np.array_equal(a_in, b_in) and np.array_equal(a_lab, b_lab)
    assert first.state() == again.state() and first.epoch >= 1


def test_the_fingerprint_tells_streams_apart():
    assert fingerprint(np.arange(5)) == fingerprint(np.arange(5, dtype=np.int32))
    assert fingerprint(np.arange(5)) != fingerprint(np.arange(6))
