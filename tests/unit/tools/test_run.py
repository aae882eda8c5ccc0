"""mdsl-run on the bundled tiny checkpoint, and its coded errors."""

import json
import shutil
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
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "prompt (9 tokens): 'Hello, world'"
    assert lines[1].startswith("continuation (5 new tokens): '")
    assert lines[2].startswith("prefill: 9 tokens in") and lines[3].startswith("decode: 4 steps")
    assert not any(line.startswith(("prompt tokens:", "new tokens:")) for line in lines)  # the text says it all


def test_the_continuation_is_the_text_of_the_generated_tokens(capsys):
    from modeldsl.tokenizer import Tokenizer

    assert main([str(LLAMA), "--hf", str(EXAMPLE), "--prompt", "Hello, world"]) == 0
    out = capsys.readouterr().out
    tokenizer = Tokenizer(EXAMPLE)
    ids = tokenizer.encode("Hello, world")
    generated = modeldsl.load(LLAMA, hf=EXAMPLE).generate(ids, 16)
    continuation = tokenizer.decode(ids + generated)[len(tokenizer.decode(ids)):]
    assert f"continuation (16 new tokens): {continuation!r}\n" in out


def test_max_new_tokens_defaults_to_16_and_help_shows_the_defaults(capsys):
    assert main([str(LLAMA), "--hf", str(EXAMPLE), "--tokens", "5,6,7"]) == 0
    assert len(tokens_of(capsys.readouterr().out)) == 16
    with pytest.raises(SystemExit):
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    assert "--max-new-tokens N tokens to generate after the prompt (0: only run the prompt) (default: 16)" in text
    assert "(default: 0.0)" in text and "(default: cpu)" in text and "(default: None)" not in text
    assert "a Module DSL .module file (e.g. modeldsl/std/models/llama.module) or a Python DSL .py file" in text


def test_without_a_tokenizer_the_token_ids_are_shown(tmp_path, capsys):
    ckpt = copy_example(tmp_path)
    (ckpt / "tokenizer.json").unlink()
    assert main([str(LLAMA), "--hf", str(ckpt), "--prompt", "Hi", "--max-new-tokens", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "prompt (2 tokens): 'Hi'" and lines[1].startswith("continuation (3 new tokens): ")
    assert lines[2] == "prompt tokens: 72,105" and len(tokens_of("\n".join(lines))) == 3


def test_a_file_given_as_the_checkpoint_folder_is_e028(capsys):
    assert main([str(LLAMA), "--hf", str(EXAMPLE / "config.json"), "--tokens", "1"]) == 1
    err = capsys.readouterr().err
    assert "error[E028]" in err and "is a file, expected a checkpoint folder" in err
    assert f"(here: '{EXAMPLE}')" in err and "loading weights" not in err


@pytest.mark.parametrize("flags, env, words", [
    (["--threads", "0"], None, "--threads must be a whole number of threads from 1 to"),
    (["--threads", "many"], None, "got 'many'"),
    (["--threads", "100000"], None, "got '100000'"),
    ([], "-3", "MDSL_NUM_THREADS must be a whole number of threads from 1 to"),
])
def test_bad_thread_counts_are_e029(flags, env, words, monkeypatch, capsys):
    if env is not None:
        monkeypatch.setenv("MDSL_NUM_THREADS", env)
    assert main([*ARGS, "--tokens", "1", "--max-new-tokens", "1", *flags]) == 1
    err = capsys.readouterr().err
    assert "error[E029]" in err and words in err and "internal error" not in err


def test_threads_sets_the_pool_of_the_executors_for_this_run_only(monkeypatch, capsys):
    from modeldsl.runtime import sched_executor, threads

    pools = []
    monkeypatch.setattr(sched_executor, "pool_size", lambda: pools.append(threads.pool_size()) or pools[-1])
    monkeypatch.delenv("MDSL_NUM_THREADS", raising=False)
    assert main([*ARGS, "--tokens", "5,6", "--max-new-tokens", "2", "--threads", "3"]) == 0
    assert pools and set(pools) == {3}
    assert threads.pool_size() == threads.usable_cores()


def test_writes_the_prompt_logits(tmp_path, capsys):
    target = tmp_path / "logits.npy"
    assert main([str(LLAMA), "--hf", str(EXAMPLE), "--tokens", "5,6,7", "--logits", str(target)]) == 0
    expected = modeldsl.load(LLAMA, hf=EXAMPLE).forward([5, 6, 7])
    np.testing.assert_array_equal(np.load(target), expected)


def test_greedy_tokens_equal_with_and_without_the_cache_and_with_either_engine(capsys):
    args = [str(LLAMA), "--hf", str(EXAMPLE), "--tokens", "5,6,7", "--max-new-tokens", "6"]
    main(args)
    cached = tokens_of(capsys.readouterr().out)
    main(args + ["--no-cache"])
    assert cached == tokens_of(capsys.readouterr().out)
    main(args + ["--engine", "graph"])
    assert cached == tokens_of(capsys.readouterr().out)


@pytest.mark.parametrize("args, code, words", [
    (["--tokens", "1,x"], "E029", "comma-separated integers"),
    (["--tokens", "100000"], "E029", "outside the vocabulary"),
    (["--max-new-tokens", "-1", "--tokens", "1"], "E029", "must not be negative"),
    (["--temperature", "hot"], "E029", "invalid float value"),
    (["--tokens", "1,2", "--temperature", "nan", "--max-new-tokens", "3"], "E029",
     "--temperature must be a finite number >= 0 (0 is greedy), got nan"),
    (["--tokens", "1,2", "--temperature", "inf", "--max-new-tokens", "3"], "E029",
     "--temperature must be a finite number >= 0 (0 is greedy), got inf"),
    (["--tokens", "1", "--seed", "-5", "--temperature", "1"], "E029", "--seed must not be negative, got -5"),
    (["--tokens", "1", "--top-k", "-2", "--temperature", "1"], "E029", "--top-k must not be negative, got -2"),
    (["--prompt", "a", "--tokens", "1"], "E029", "not allowed with"),
])
def test_bad_flags_are_coded_errors(args, code, words, capsys):
    assert main([str(LLAMA), "--hf", str(EXAMPLE), *args]) == 1
    err = capsys.readouterr().err
    assert f"error[{code}]" in err and words in err and "Traceback" not in err


def test_missing_files_are_e028(tmp_path, capsys):
    assert main([str(tmp_path / "nope.module"), "--hf", str(EXAMPLE)]) == 1
    assert "error[E028]" in capsys.readouterr().err
    assert main([str(tmp_path / "nope.py"), "--hf", str(EXAMPLE)]) == 1
    assert "give the path of a .module or .py model file" in capsys.readouterr().err
    assert main([str(LLAMA), "--hf", str(tmp_path / "nope"), "--tokens", "1"]) == 1
    assert "error[E028]" in capsys.readouterr().err


def test_a_folder_without_config_is_e030(tmp_path, capsys):
    assert main([str(LLAMA), "--hf", str(tmp_path), "--tokens", "1"]) == 1
    assert "error[E030]" in capsys.readouterr().err


ARGS = [str(LLAMA), "--hf", str(EXAMPLE)]


def tokens_of(out: str) -> list[int]:
    """The generated token ids that mdsl-run printed."""
    (line,) = [line for line in out.splitlines() if line.startswith("new tokens:")]
    return [int(t) for t in line.removeprefix("new tokens:").strip().split(",") if t]


def copy_example(tmp_path: Path, **config) -> Path:
    """examples/tiny_llama copied, with config.json fields replaced (None removes one)."""
    target = shutil.copytree(EXAMPLE, tmp_path / "ckpt")
    path = target / "config.json"
    data = json.loads(path.read_text())
    for key, value in config.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    path.write_text(json.dumps(data))
    return target


# ------------------------------------------------------------------ sampling
def sampled(capsys, *flags) -> list[int]:
    assert main([*ARGS, "--tokens", "5,6,7", "--max-new-tokens", "8", *flags]) == 0
    return tokens_of(capsys.readouterr().out)


def test_top_k_1_samples_the_greedy_tokens(capsys):
    greedy = sampled(capsys)
    assert sampled(capsys, "--temperature", "1.0", "--top-k", "1", "--seed", "0") == greedy
    assert sampled(capsys, "--temperature", "5.0", "--top-k", "1", "--seed", "7") == greedy


def test_the_seed_and_the_temperature_change_the_sampled_tokens(capsys):
    first = sampled(capsys, "--temperature", "1.0", "--seed", "0")
    assert sampled(capsys, "--temperature", "1.0", "--seed", "0") == first  # reproducible
    assert sampled(capsys, "--temperature", "1.0", "--seed", "1") != first
    assert sampled(capsys, "--temperature", "0.5", "--seed", "0") != first
    assert first != sampled(capsys)  # not the greedy continuation


@pytest.mark.parametrize("flags, words", [
    (["--seed", "3"], "--seed has no effect with greedy decoding"),
    (["--top-k", "5"], "--top-k has no effect with greedy decoding"),
    (["--top-k", "5", "--seed", "3", "--temperature", "0"], "--top-k and --seed have no effect"),
])
def test_sampling_flags_with_greedy_decoding_warn_w007(flags, words, capsys):
    greedy = sampled(capsys)
    assert sampled(capsys, *flags) == greedy
    assert main([*ARGS, "--tokens", "5,6,7", "--max-new-tokens", "2", *flags]) == 0
    err = capsys.readouterr().err
    assert "warning[W007]" in err and words in err and "hint:" in err


def test_sampling_flags_do_not_warn_when_sampling(capsys):
    assert main([*ARGS, "--tokens", "5", "--max-new-tokens", "2", "--temperature", "1", "--seed", "1"]) == 0
    assert "W007" not in capsys.readouterr().err


# ------------------------------------------------------------------ --logits
def test_logits_into_a_missing_folder_is_e028_before_loading(capsys):
    assert main([*ARGS, "--tokens", "1", "--logits", "/nonexistent/dir/x.npy"]) == 1
    err = capsys.readouterr().err
    assert "error[E028]" in err and "'/nonexistent/dir'" in err and "hint:" in err
    assert "loading weights" not in err  # refused before the model loads


def test_logits_name_without_npy_prints_the_file_written(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main([*ARGS, "--tokens", "5,6", "--logits", "out"]) == 0
    assert (tmp_path / "out.npy").is_file() and not (tmp_path / "out").exists()
    assert "to out.npy" in capsys.readouterr().out


def test_logits_onto_a_folder_is_e029(tmp_path, capsys):
    (tmp_path / "x.npy").mkdir()
    assert main([*ARGS, "--tokens", "1", "--logits", str(tmp_path / "x.npy")]) == 1
    assert "error[E029]" in capsys.readouterr().err


# ------------------------------------------------------------------ positions
def test_a_prompt_longer_than_the_positions_is_e029(capsys):
    assert main([*ARGS, "--tokens", ",".join(["5"] * 257)]) == 1
    err = capsys.readouterr().err
    assert "error[E029]" in err and "257 tokens, more than the model's 256 positions" in err


def test_generation_stops_at_the_last_position_with_w008(capsys):
    assert main([*ARGS, "--tokens", ",".join(["5"] * 250), "--max-new-tokens", "10"]) == 0
    captured = capsys.readouterr()
    assert len(tokens_of(captured.out)) == 6
    assert "warning[W008]" in captured.err and "generating 6 tokens" in captured.err


# ------------------------------------------------------------------ broken checkpoints
def test_a_corrupt_tokenizer_is_e030_naming_the_file(tmp_path, capsys):
    ckpt = copy_example(tmp_path)
    (ckpt / "tokenizer.json").write_text("{bad")
    assert main([str(LLAMA), "--hf", str(ckpt), "--prompt", "hi"]) == 1
    err = capsys.readouterr().err
    assert "error[E030]" in err and str(ckpt / "tokenizer.json") in err and "hint:" in err


def test_a_folder_named_like_the_weights_is_e028(tmp_path, capsys):
    ckpt = copy_example(tmp_path)
    (ckpt / "model.safetensors").unlink()
    (ckpt / "model.safetensors").mkdir()
    assert main([str(LLAMA), "--hf", str(ckpt), "--tokens", "1"]) == 1
    err = capsys.readouterr().err
    assert "error[E028]" in err and str(ckpt / "model.safetensors") in err and "internal error" not in err


@pytest.mark.parametrize("config, words", [
    ({"rope_scaling": {"rope_type": "mrope", "factor": 2.0}},
     "'rope_scaling' has rope_type 'mrope', which is not supported (supported: default, linear, dynamic"),
    ({"rope_scaling": {"rope_type": "llama3"}}, "'rope_scaling' has no 'factor', which rope_type 'llama3' needs"),
    ({"rope_scaling": "bad"}, "'rope_scaling' is 'bad', not an object"),
    ({"rope_parameters": {"rope_theta": 10000.0, "rope_type": "linear", "factor": -2}},
     "'rope_parameters' has 'factor': -2, which must be a positive number"),
])
def test_bad_rope_scaling_is_e030_naming_the_field(tmp_path, config, words, capsys):
    ckpt = copy_example(tmp_path, **config)
    assert main([str(LLAMA), "--hf", str(ckpt), "--tokens", "1"]) == 1
    err = capsys.readouterr().err
    assert "error[E030]" in err and str(ckpt / "config.json") in err and words in err and "hint:" in err


@pytest.mark.parametrize("scaling", [
    {"rope_type": "yarn", "factor": 2.0},
    {"rope_type": "dynamic", "factor": 2.0},
    {"rope_type": "linear", "factor": 2.0},
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0},
])
def test_supported_rope_scalings_run(tmp_path, scaling, capsys):
    ckpt = copy_example(tmp_path, rope_scaling=scaling)
    assert main([str(LLAMA), "--hf", str(ckpt), "--tokens", "1,2", "--max-new-tokens", "2"]) == 0
    assert len(tokens_of(capsys.readouterr().out)) == 2
