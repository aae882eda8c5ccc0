"""A save keeps the checkpoint's dtype: a bf16 checkpoint trained with mdsl-run --save is written in
bf16 (the fp32 masters rounded to nearest even, and kept in the training state so --resume continues
bit for bit), its config says bfloat16 and transformers reloads it whole; --save-dtype fp32 and
save_hf(dtype="fp32") write float32 and say so."""

import json
import re
import struct
from pathlib import Path

import numpy as np
import pytest
from hf_checkpoints import make_checkpoint

import modeldsl
from modeldsl.resolve.imports import STD_ROOT
from modeldsl.runtime.train import load_training_state
from modeldsl.tools.run import main

ROOT = Path(__file__).resolve().parents[3]
LLAMA = STD_ROOT / "models" / "llama.module"
DATA = ROOT / "examples" / "tiny_corpus.txt"
TOKENS = [5, 17, 99, 3, 42, 250, 7, 64]
STEP = re.compile(r"^step (\d+) loss (\S+) ", re.M)


@pytest.fixture(scope="module")
def bf16_checkpoint(tmp_path_factory):
    """A random tiny Llama saved by transformers in bf16 (vocabulary 300: the data trains as UTF-8 bytes)."""
    return make_checkpoint(tmp_path_factory.mktemp("bf16") / "ckpt", "llama", seed=3, dtype="bfloat16",
                           vocab_size=300)


@pytest.fixture(autouse=True)
def in_a_temporary_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def header(path: Path) -> dict:
    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        entries = json.loads(f.read(size))
    entries.pop("__metadata__", None)
    return entries


def dtypes(folder: Path) -> set[str]:
    return {entry["dtype"] for entry in header(folder / "model.safetensors").values()}


def config_dtype(folder: Path) -> str:
    return json.loads((folder / "config.json").read_text())["dtype"]


def train(capsys, checkpoint: Path, *flags: str) -> dict[int, float]:
    argv = [str(LLAMA), "--hf", str(checkpoint), "--train", str(DATA), "--batch", "1", "--seq", "16",
            "--lr", "1e-2", *flags]
    assert main(argv) == 0, capsys.readouterr().err
    return {int(m[1]): float(m[2]) for m in STEP.finditer(capsys.readouterr().out)}


def round_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """fp32 -> bf16 bits, round to nearest even (numpy bit operations; the values are finite)."""
    bits = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def test_the_checkpoint_is_bf16(bf16_checkpoint):
    assert dtypes(bf16_checkpoint) == {"BF16"} and config_dtype(bf16_checkpoint) == "bfloat16"


def test_a_trained_bf16_checkpoint_is_saved_in_bf16_and_transformers_reloads_it(bf16_checkpoint, tmp_path, capsys):
    import torch
    import transformers

    train(capsys, bf16_checkpoint, "--steps", "2", "--save", "out")
    out = tmp_path / "out"
    assert dtypes(out) == {"BF16"} and config_dtype(out) == "bfloat16"
    masters = {k.removeprefix("master."): v for k, v in load_training_state(out / "training_state.npz").arrays.items()
               if k.startswith("master.")}
    saved = modeldsl.load(LLAMA, hf=out, dtype="bf16").record.arrays
    assert masters and "lm_head" in masters
    (lm_head,) = saved[("lm_head", None)]
    np.testing.assert_array_equal(np.asarray(lm_head).view(np.uint16), round_to_bf16_bits(masters["lm_head"]))
    before = modeldsl.load(LLAMA, hf=bf16_checkpoint).weights["lm_head"]
    assert not np.array_equal(before, masters["lm_head"])  # it did train

    reloaded, info = transformers.AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    assert not any(info.values()), info
    assert reloaded.dtype == torch.bfloat16
    ours = modeldsl.load(LLAMA, hf=out).forward(TOKENS)  # fp32 compute on the bf16 weights
    with torch.no_grad():
        theirs = reloaded.eval()(torch.tensor([TOKENS])).logits[0].float().numpy()
        exact = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()(
            torch.tensor([TOKENS])).logits[0].numpy()
    scale = np.abs(exact).max()
    assert np.abs(ours - exact).max() <= 1e-4 * max(scale, 1.0)  # the same weights, both in fp32
    assert np.abs(ours - theirs).max() <= 0.05 * max(scale, 1.0)  # transformers computing in bf16


def test_resuming_a_bf16_save_continues_bit_for_bit(bf16_checkpoint, capsys):
    straight = train(capsys, bf16_checkpoint, "--steps", "3", "--save", "straight")
    first = train(capsys, bf16_checkpoint, "--steps", "3", "--stop-after", "1", "--save", "run")
    assert dtypes(Path("run")) == {"BF16"}
    argv = [str(LLAMA), "--train", str(DATA), "--resume", "run", "--save", "run"]
    assert main(argv) == 0, capsys.readouterr().err
    second = {int(m[1]): float(m[2]) for m in STEP.finditer(capsys.readouterr().out)}
    assert first | second == straight
    assert (Path("run") / "model.safetensors").read_bytes() == (Path("straight") / "model.safetensors").read_bytes()


def test_save_dtype_fp32_writes_float32_and_says_so(bf16_checkpoint, tmp_path, capsys):
    import transformers

    train(capsys, bf16_checkpoint, "--steps", "1", "--save", "out", "--save-dtype", "fp32")
    out = tmp_path / "out"
    assert dtypes(out) == {"F32"} and config_dtype(out) == "float32"
    assert not any(k.startswith("master.") for k in load_training_state(out / "training_state.npz").arrays)
    reloaded, info = transformers.AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    assert not any(info.values()) and str(reloaded.dtype) == "torch.float32"


def test_save_hf_keeps_the_dtype_unless_told(bf16_checkpoint, tmp_path):
    model = modeldsl.load(LLAMA, hf=bf16_checkpoint)
    model.save_hf(tmp_path / "same")
    assert (tmp_path / "same" / "model.safetensors").read_bytes() == (
        bf16_checkpoint / "model.safetensors").read_bytes()  # unchanged weights: the original bytes
    assert (tmp_path / "same" / "config.json").read_bytes() == (bf16_checkpoint / "config.json").read_bytes()
    model.save_hf(tmp_path / "wide", dtype="fp32")
    assert dtypes(tmp_path / "wide") == {"F32"} and config_dtype(tmp_path / "wide") == "float32"
    config = json.loads((tmp_path / "wide" / "config.json").read_text())
    assert {k: v for k, v in json.loads((bf16_checkpoint / "config.json").read_text()).items() if k != "dtype"} == {
        k: v for k, v in config.items() if k != "dtype"}  # nothing else in the config changed
