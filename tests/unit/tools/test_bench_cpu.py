"""The CPU benchmark's harness, run end to end on the tests' tiny Llama (the real run is
``python -m modeldsl.tools.bench_cpu --threads 2``)."""

import json
import sys

import pytest

from modeldsl.tools.bench_cpu import Row, load_table, main, table


@pytest.fixture
def torch_installed():
    pytest.importorskip("torch")
    pytest.importorskip("transformers")


QUICK = ["--shapes", "tiny", "--steps", "1", "--warmup", "1", "--repeats", "1", "--prefill", "16", "--prompt", "8",
         "--decode", "4", "--threads", "1"]


def test_a_quick_run_prints_every_runner_row_with_ratios_and_writes_them(torch_installed, tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert main([*QUICK, "--runners", "modeldsl,eager", "--checkpoint", "none", "--load", "--load-shape", "tiny",
                 "--cache-dir", str(tmp_path / "cache"), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    rows = json.loads(out.read_text())["rows"]
    groups = [("train", "tiny"), ("prefill T=16", "tiny"), ("decode", "tiny"), ("load", "tiny")]
    assert [(r["section"], r["shape"], r["runner"]) for r in rows] == [
        (section, shape, runner) for section, shape in groups
        for runner in ("modeldsl", "transformers" if section == "load" else "eager")]
    for row in rows:
        assert row["value"] > 0 and row["peak_rss"] > 0 and row["note"] == "", row
    assert rows[-2]["weight_bytes"] > 0  # modeldsl's fp32 weights of the load section
    assert "speed >= 1.0x eager:" in text and "speed >= 2.0x eager:" in text and "RSS <= 0.5x eager:" in text
    assert "1.00x" in text and "targets: time " in text and "of the fp32 weights (<= 1.1x:" in text


@pytest.mark.slow
def test_the_training_rows_of_torch_compile_and_the_bundled_checkpoint(torch_installed, tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert main([*QUICK, "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    train = [(r["shape"], r["runner"]) for r in rows if r["section"] == "train"]
    assert train == [(shape, runner) for shape in ("tiny", "tiny_llama") for runner in ("modeldsl", "eager", "compile")]
    assert all(r["value"] for r in rows), rows


def test_ratios_are_against_eager_and_compile_with_the_targets():
    rows = [Row("train", "s", "modeldsl", 150.0, 100 << 20), Row("train", "s", "eager", 100.0, 400 << 20),
            Row("train", "s", "compile", 300.0, 500 << 20), Row("decode", "s", "modeldsl", 150.0, 100 << 20),
            Row("decode", "s", "eager", 100.0, 150 << 20), Row("prefill T=64", "s", "modeldsl", note="failed: x")]
    lines = table(rows).splitlines()
    assert lines[1].split()[3:10] == ["150", "1.50x", "0.50x", "100", "0.25x", "0.20x", "speed"]
    assert lines[1].endswith("speed >= 1.0x eager: yes; RSS <= 0.5x eager: yes")
    assert lines[4].endswith("speed >= 2.0x eager: no; RSS <= 0.5x eager: no")
    assert "failed: x" in lines[6]


def test_the_load_table_compares_time_with_transformers_and_rss_with_the_weights():
    rows = [Row("load", "m", "modeldsl", 3.0, 1100 << 20, 1000 << 20),
            Row("load", "m", "transformers", 2.0, 2000 << 20)]
    text = load_table(rows)
    assert "time 1.50x of transformers' (<= 1.0x: no)" in text
    assert "peak RSS 1.10x of the fp32 weights (<= 1.1x: yes)" in text


def test_without_torch_it_is_e029_naming_the_install(monkeypatch, capsys):
    for name in ("torch", "transformers"):
        monkeypatch.setitem(sys.modules, name, None)
    assert main(["--shapes", "tiny"]) == 1
    err = capsys.readouterr().err
    assert "error[E029]" in err and "needs torch and transformers" in err and "Traceback" not in err


@pytest.mark.parametrize("flags, words", [
    (["--shapes", "gpt-5"], "--shapes: unknown gpt-5"),
    (["--runners", "jax"], "--runners: unknown jax"),
    (["--threads", "0"], "--threads must be at least 1"),
    (["--prefill", "64,x"], "--prefill: '64,x' is not comma-separated whole numbers"),
    (["--checkpoint", "/nonexistent"], "no config.json there"),
])
def test_bad_flags_are_usage_errors(flags, words, capsys):
    with pytest.raises(SystemExit) as info:
        main(flags)
    assert info.value.code == 2 and words in capsys.readouterr().err
