"""mdsl-run on the bundled tiny checkpoint, and its coded errors."""

from pathlib import Path

import numpy as np
import pytest

import modeldsl
from modeldsl.resolve.imports import STD_ROOT
from modeldsl.tools.run import main

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "tiny_llama"
LLAMA = STD_ROOT / "models" / "llama.module"


def test_generates_from_a_prompt_with_the_checkpoint_tokenizer(capsys):
    assert main([str(LLAMA), "--hf", str(EXAMPLE), "--prompt", "Hello, world", "--max-new-tokens", "5"]) == 0
    out = capsys.readouterr().out
    assert "prefill:" in out and "tokens/s" in out and "decode: 4 steps" in out
    assert "text: 'Hello, world" in out


def test_writes_the_prompt_logits(tmp_path, capsys):
    target = tmp_path / "logits.npy"
    assert main([str(LLAMA), "--hf", str(EXAMPLE), "--tokens", "5,6,7", "--logits", str(target)]) == 0
    expected = modeldsl.load(LLAMA, hf=EXAMPLE).forward([5, 6, 7])
    np.testing.assert_array_equal(np.load(target), expected)


def test_greedy_tokens_equal_with_and_without_the_cache(capsys):
    args = [str(LLAMA), "--hf", str(EXAMPLE), "--tokens", "5,6,7", "--max-new-tokens", "6"]
    main(args)
    cached = [line for line in capsys.readouterr().out.splitlines() if line.startswith("tokens:")]
    main(args + ["--no-cache"])
    assert cached == [line for line in capsys.readouterr().out.splitlines() if line.startswith("tokens:")]


@pytest.mark.parametrize("args, code, words", [
    (["--tokens", "1,x"], "E029", "comma-separated integers"),
    (["--tokens", "100000"], "E029", "outside the vocabulary"),
    (["--max-new-tokens", "-1", "--tokens", "1"], "E029", "must not be negative"),
    (["--temperature", "hot"], "E029", "invalid float value"),
    (["--prompt", "a", "--tokens", "1"], "E029", "not allowed with"),
])
def test_bad_flags_are_coded_errors(args, code, words, capsys):
    assert main([str(LLAMA), "--hf", str(EXAMPLE), *args]) == 1
    err = capsys.readouterr().err
    assert f"error[{code}]" in err and words in err and "Traceback" not in err


def test_missing_files_are_e028(tmp_path, capsys):
    assert main([str(tmp_path / "nope.module"), "--hf", str(EXAMPLE)]) == 1
    assert "error[E028]" in capsys.readouterr().err
    assert main([str(LLAMA), "--hf", str(tmp_path / "nope"), "--tokens", "1"]) == 1
    assert "error[E028]" in capsys.readouterr().err


def test_a_folder_without_config_is_e030(tmp_path, capsys):
    assert main([str(LLAMA), "--hf", str(tmp_path), "--tokens", "1"]) == 1
    assert "error[E030]" in capsys.readouterr().err
