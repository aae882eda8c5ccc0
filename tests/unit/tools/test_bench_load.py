"""The load benchmark's harness on tiny shapes (the real run is ``python -m modeldsl.tools.bench_load``):
its checkpoints are what transformers saves, its runners alternate, its table's ratios and targets."""

import argparse
import json
import math

import numpy as np
import pytest

from modeldsl.tools import bench_load
from modeldsl.tools.bench_load import Row, main, measure, table

MiB = 1 << 20
TINY_MIXTRAL = ("MixtralConfig", dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=2, num_local_experts=2,
                                      max_position_embeddings=64))
TINY_TIED = ("Gemma3TextConfig", dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=1, head_dim=8,
                                      max_position_embeddings=64))


@pytest.fixture
def torch_installed():
    pytest.importorskip("torch")
    pytest.importorskip("transformers")


@pytest.mark.parametrize("shape", [TINY_MIXTRAL, TINY_TIED], ids=["mixtral", "gemma3-tied"])
def test_its_checkpoints_hold_the_tensors_save_pretrained_writes(torch_installed, tmp_path, monkeypatch, shape):
    import torch
    import transformers

    from modeldsl.hf.safetensors_io import SafetensorsFile

    monkeypatch.setitem(bench_load.SHAPES, "t", shape)
    model = transformers.AutoModelForCausalLM.from_config(getattr(transformers, shape[0])(**shape[1]))
    model.save_pretrained(tmp_path / "hf")
    theirs = SafetensorsFile(tmp_path / "hf" / "model.safetensors")
    ours = SafetensorsFile(bench_load.write_checkpoint("t", tmp_path / "ours", "bf16") / "model.safetensors")
    assert {n: theirs.shape(n) for n in theirs.keys()} == {n: ours.shape(n) for n in ours.keys()}
    assert {str(ours.dtype(n)) for n in ours.keys()} == {"bfloat16"}
    config = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert config["architectures"] == [type(model).__name__]
    values = ours.array(next(iter(ours.keys()))).astype(np.float32)
    assert abs(float(values.std()) - 0.02) < 0.005
    assert transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "ours", dtype=torch.float32) is not None


def test_the_runners_alternate_and_each_row_keeps_its_highest_peaks(monkeypatch):
    calls = []

    def child(spec):
        calls.append(spec["runner"])
        peak = 100 * MiB * len(calls)
        return {"baseline": 10 * MiB, "load_peak": peak, "forward_peak": peak + MiB, "held": peak, "held_file": 0,
                "seconds": 5.0 - len(calls), "forward_seconds": 1.0, "peak_reset": True, "finite": True}

    monkeypatch.setattr(bench_load, "warm_page_cache", lambda directory: None)
    monkeypatch.setattr(bench_load, "memory_problem", lambda weights, headroom: "")
    args = argparse.Namespace(runners=["modeldsl", "transformers"], repeats=2, threads=1, headroom=2.0)
    rows = measure("tiny", bench_load.Path("/nowhere"), 50 * MiB, args, child)
    assert calls == ["modeldsl", "transformers", "modeldsl", "transformers"]
    assert [(r.runner, r.load_peak, r.load_delta, r.seconds) for r in rows] == [
        ("modeldsl", 300 * MiB, 290 * MiB, 2.0), ("transformers", 400 * MiB, 390 * MiB, 1.0)]


def test_a_shape_that_does_not_fit_in_memory_is_skipped_with_the_reason(monkeypatch):
    monkeypatch.setattr("modeldsl.runtime.fits.available_bytes", lambda: 2 << 30)
    args = argparse.Namespace(runners=["modeldsl"], repeats=1, threads=1, headroom=2.0)
    (row,) = measure("tiny", bench_load.Path("/nowhere"), 1 << 30, args, lambda spec: pytest.fail("ran"))
    assert row.load_peak is None and "may need 3.0 GiB of memory, 2.0 GiB are available" in row.note


def test_the_table_gives_peaks_against_the_weights_and_transformers_in_total_and_over_the_baseline():
    rows = [Row("m", "modeldsl", 1000 * MiB, 100 * MiB, 1150 * MiB, 1200 * MiB, 3.0, 1.0),
            Row("m", "transformers", 1000 * MiB, 300 * MiB, 400 * MiB, 1300 * MiB, 1.0, 2.0)]
    text = table(rows)
    dsl = text.splitlines()[1].split()
    assert dsl[:13] == ["m", "modeldsl", "1,000", "100", "1,150", "1.15x", "2.88x", "1,050", "1.05x", "10.50x",
                        "1,200", "1.20x", "0.92x"]
    assert "m: load peak <= 1.1x the fp32 weights: no (1.15x; over the baseline yes, 1.05x)" in text
    assert "<= 1.0x transformers': no (2.88x; over the baseline no, 10.50x)" in text
    assert ("load + forward peak <= 1.1x the fp32 weights: no (1.20x; over the baseline yes, 1.10x), "
            "<= 1.0x transformers': yes (0.92x; over the baseline no, 1.10x)") in text


def test_a_quick_run_loads_the_tiny_shape_with_both_runners_and_writes_the_rows(torch_installed, tmp_path, capsys):
    out = tmp_path / "rows.json"
    assert main(["--shapes", "tiny", "--repeats", "1", "--threads", "1", "--cache-dir", str(tmp_path / "cache"),
                 "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["runner"] for r in rows] == ["modeldsl", "transformers"]
    for row in rows:
        assert row["note"] == "" and row["load_peak"] >= row["baseline"] > 0 and row["forward_peak"] > 0, row
        assert row["weight_bytes"] == 4 * sum(math.prod(s) for _, s in bench_load.checkpoint_tensors("tiny")[1])
    assert "tiny: load peak <= 1.1x the fp32 weights" in capsys.readouterr().out


@pytest.mark.parametrize("flags, words", [(["--shapes", "gpt-5"], "--shapes: unknown gpt-5"),
                                          (["--runners", "jax"], "--runners: unknown jax"),
                                          (["--repeats", "0"], "--repeats and --threads must be at least 1")])
def test_bad_flags_are_refused(flags, words, capsys):
    with pytest.raises(SystemExit):
        main(flags)
    assert words in capsys.readouterr().err
