"""mdsl-run with LoRA: --train --lora saves a PEFT adapter, --resume continues it, --adapter and
--merge-lora use it, bad flags are coded errors."""

import json
import re
from pathlib import Path

import numpy as np
import pytest

import modeldsl
from modeldsl.resolve.imports import STD_ROOT
from modeldsl.tools.run import main

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "tiny_llama"
DATA = ROOT / "examples" / "tiny_corpus.txt"
RUN = ["--hf", str(EXAMPLE), "--train", str(DATA), "--steps", "3", "--batch", "1", "--seq", "16", "--lr", "1e-2",
       "--lora", "4:8", "--lora-targets", "q,v,down"]
STEP = re.compile(r"^step (\d+) loss (\S+) ", re.M)


@pytest.fixture(autouse=True)
def in_a_temporary_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def run(capsys, *flags: str, code: int = 0) -> str:
    assert main(list(flags)) == code, capsys.readouterr().err
    return capsys.readouterr().out


def test_a_lora_run_saves_a_peft_adapter_that_resumes_bit_for_bit(tmp_path, capsys):
    straight = run(capsys, *RUN, "--save", "a")
    assert "saved the LoRA adapter and training state (step 3)" in straight
    line = re.search(r"LoRA on down_proj, q_proj, v_proj: ([\d,]+) trainable parameters of [\d,]+ \([\d.]+%\); "
                     r"gradients and optimizer state ([\d.,]+) KiB", straight)
    trainable = int(line[1].replace(",", ""))
    exact = trainable * 4 * 3 / 1024  # fp32 gradients and two moments of the adapters alone
    assert exact <= float(line[2].replace(",", "")) <= exact + 6 * 3 * 256 / 1024  # each buffer 256-byte aligned
    config = json.loads((tmp_path / "a" / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["target_modules"]) == (4, 8.0, ["down_proj", "q_proj", "v_proj"])
    assert not (tmp_path / "a" / "model.safetensors").exists()  # the base stays where it is
    run(capsys, *RUN, "--save", "b", "--stop-after", "2")
    resumed = run(capsys, "--train", str(DATA), "--resume", "b", "--save", "b")
    assert STEP.findall(resumed) == STEP.findall(straight)[2:]
    a, b = (modeldsl.load(hf=EXAMPLE, adapter=tmp_path / name).forward([1, 2, 3]) for name in "ab")
    np.testing.assert_array_equal(a, b)


def test_generation_with_an_adapter_and_its_merged_checkpoint_agree(tmp_path, capsys):
    run(capsys, *RUN, "--save", "a", "--merge-lora", "merged")
    adapted = run(capsys, "--hf", str(EXAMPLE), "--adapter", "a", "--tokens", "1,2,3", "--max-new-tokens", "5")
    merged = run(capsys, "--hf", "merged", "--tokens", "1,2,3", "--max-new-tokens", "5")
    new_tokens = re.compile(r"^new tokens: (.*)$", re.M)
    assert new_tokens.findall(adapted) == new_tokens.findall(merged)
    plain = modeldsl.load(STD_ROOT / "models" / "llama.module", hf=tmp_path / "merged").forward([1, 2, 3])
    with_adapter = modeldsl.load(hf=EXAMPLE, adapter=tmp_path / "a").forward([1, 2, 3])
    np.testing.assert_allclose(plain, with_adapter, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("flags, code, words", [
    (["--lora", "8:x"], "E029", "--lora 8:x is not R or R:ALPHA"),
    (["--lora", "0"], "E029", "r=0 is not a positive integer"),
    (["--rslora"], "E029", "--rslora needs --lora R"),
    (["--lora", "4", "--lora-targets", "q,w"], "E047", "the target 'w' names no linear module"),
    (["--lora", "4", "--adapter", "."], "E029", "--adapter DIR and --lora R both give adapters"),
    (["--lora", "4", "--lora-dropout", "1.5"], "E029", "--lora-dropout must be a number in [0, 0.99]"),
])
def test_bad_lora_flags_are_coded_errors(capsys, flags, code, words):
    base = ["--hf", str(EXAMPLE), "--train", str(DATA), "--steps", "1", "--batch", "1", "--seq", "8", "--lr", "1e-3"]
    assert main([*base, *flags]) != 0
    err = capsys.readouterr().err
    assert f"error[{code}]" in err and words in err, err


def test_merge_without_adapters_and_a_missing_adapter_folder_are_coded_errors(capsys):
    assert main(["--hf", str(EXAMPLE), "--merge-lora", "m"]) != 0
    assert "error[E029]: mdsl-run: --merge-lora OUT has no adapters to merge" in capsys.readouterr().err
    assert main(["--hf", str(EXAMPLE), "--adapter", "nowhere", "--prompt", "x"]) != 0
    assert "error[E028]: --adapter: no such folder 'nowhere'" in capsys.readouterr().err


def prompt_completion_file(path: Path, count: int = 6, long: int = 0) -> Path:
    lines = [{"prompt": f"Question {i}: what is {i} and {i}?", "completion": f" It is {2 * i}."} for i in range(count)]
    lines += [{"prompt": "x " * 60, "completion": " y"} for _ in range(long)]  # no target inside --seq 48 + 1
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def instruction_run(data: Path) -> list[str]:
    flags = [*RUN[:2], "--train", str(data), *RUN[4:]]
    flags[flags.index("--seq") + 1] = "48"
    return flags


def test_prompt_completion_data_trains_on_completions_and_resumes_bit_for_bit(tmp_path, capsys):
    data = prompt_completion_file(tmp_path / "pc.jsonl", long=1)
    straight = run(capsys, *instruction_run(data), "--loss-plot", "straight.png")
    assert "(6 prompt/completion examples, the loss on their completion tokens, one per sequence" in straight
    half = run(capsys, *instruction_run(data), "--save", "h", "--stop-after", "1")
    rest = run(capsys, "--resume", "h", "--train", str(data))
    assert STEP.findall(half) + STEP.findall(rest) == STEP.findall(straight)


def test_instruction_data_warns_about_examples_it_leaves_out_and_refuses_malformed_lines(tmp_path, capsys):
    data = prompt_completion_file(tmp_path / "pc.jsonl", long=2)
    assert main([*instruction_run(data), "--loss-plot", "w.png"]) == 0
    err = capsys.readouterr().err
    assert "warning[W014]: the training data" in err and "2 examples have no target token in the first 49" in err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a", "completion": "b"}\n{"prompt": "a", "completion": 3}\n')
    assert main(instruction_run(bad)) == 1
    err = capsys.readouterr().err
    assert "error[E030]" in err and "bad.jsonl:2:" in err and "^" in err and "Traceback" not in err


def test_lora_on_an_fp8_base_reports_the_bytes_saved_and_resumes_bit_for_bit(capsys):
    straight = run(capsys, *RUN, "--base-dtype", "fp8", "--loss-plot", "s.png")
    saved = re.search(r"^params hold the frozen base in fp8_e4m3: (\d+) weights, (\d+) values in (\d+) bytes "
                      r"\+ (\d+) bytes of fp32 scales \(fp32: (\d+) bytes; (\d+) bytes saved\)$", straight, re.M)
    values, stored, scales, fp32, kept = (int(saved[i]) for i in range(2, 7))
    assert stored == values and fp32 == 4 * values and kept == fp32 - stored - scales > 0
    half = run(capsys, *RUN, "--base-dtype", "fp8", "--save", "h", "--stop-after", "1")
    rest = run(capsys, "--resume", "h", "--train", str(DATA))
    assert STEP.findall(half) + STEP.findall(rest) == STEP.findall(straight)
    plain = run(capsys, *RUN, "--loss-plot", "p.png")
    assert STEP.findall(plain) != STEP.findall(straight)  # the base is stored in fp8: other losses
    assert main(["--hf", str(EXAMPLE), "--train", str(DATA), "--steps", "1", "--batch", "1", "--seq", "8",
                 "--lr", "1e-3", "--base-dtype", "fp8"]) == 1
    assert "--base-dtype needs --lora R or --adapter DIR" in capsys.readouterr().err


def test_packed_instruction_data_trains_and_resumes_bit_for_bit(tmp_path, capsys):
    data = prompt_completion_file(tmp_path / "pc.jsonl", count=8)
    flags = instruction_run(data)
    flags[flags.index("--seq") + 1] = "96"  # three examples to a row
    straight = run(capsys, *flags, "--packing", "packed", "--loss-plot", "s.png")
    assert "at step 3 of 3, epoch 1, example 1 of 8" in straight  # 9 examples read in 3 rows
    assert "the loss on their completion tokens, packed, attending within each example" in straight
    half = run(capsys, *flags, "--packing", "packed", "--save", "h", "--stop-after", "1")
    rest = run(capsys, "--resume", "h", "--train", str(data))
    assert STEP.findall(half) + STEP.findall(rest) == STEP.findall(straight)
    padded = run(capsys, *flags, "--loss-plot", "p.png")
    assert STEP.findall(padded) != STEP.findall(straight)
    assert main([*RUN, "--packing", "packed", "--loss-plot", "t.png"]) == 1
    assert "--packing packed applies to instruction data" in capsys.readouterr().err
