"""The training-step benchmark's harness, run on the CPU with the tiny shape (the real runs are on a GPU)."""

import json

import numpy as np
import pytest

from modeldsl.tools.bench import Row, main, table

pytest.importorskip("torch")
pytest.importorskip("transformers")


def test_the_tiny_cpu_run_prints_the_table_and_writes_the_rows(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert main(["--device", "cpu", "--shapes", "tiny", "--runners", "modeldsl,eager", "--batch", "2", "--seq", "16",
                 "--steps", "2", "--warmup", "1", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "(ratios against eager)" in text
    rows = json.loads(out.read_text())["rows"]
    assert [r["runner"] for r in rows] == ["modeldsl", "eager"]
    for row in rows:
        assert row["tokens_per_s"] > 0 and len(row["losses"]) == 3 and row["note"] == ""
    assert rows[0]["peak_bytes"] > 0  # modeldsl's planned arenas


def test_each_recompute_mode_and_fusion_setting_is_a_row_with_the_same_losses(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert main(["--device", "cpu", "--shapes", "tiny", "--runners", "modeldsl", "--batch", "2", "--seq", "16",
                 "--steps", "2", "--warmup", "1", "--recompute", "annotated,full", "--fuse", "on,off",
                 "--json", str(out)]) == 0
    assert "tiny        modeldsl[full,nofuse] " in capsys.readouterr().out
    rows = json.loads(out.read_text())["rows"]
    assert [r["runner"] for r in rows] == ["modeldsl", "modeldsl[nofuse]", "modeldsl[full]", "modeldsl[full,nofuse]"]
    assert rows[0]["losses"] == rows[2]["losses"] and len(rows[0]["losses"]) == 3  # recompute: bitwise
    assert rows[1]["losses"] == rows[3]["losses"]
    np.testing.assert_allclose(rows[0]["losses"], rows[1]["losses"], rtol=1e-2)  # bf16: fusion rounds otherwise


def test_ratios_are_against_torch_compile_and_missing_runs_say_why():
    rows = [Row("s", "modeldsl", 150.0, 10 << 30), Row("s", "eager", 50.0, 30 << 30),
            Row("s", "compile", 100.0, 20 << 30), Row("t", "modeldsl", note="no CUDA executor yet")]
    text = table(rows)
    assert "1.50x" in text and "0.50x" in text and "(ratios against compile)" in text
    assert "no CUDA executor yet" in text


@pytest.mark.parametrize("flags, words", [
    (["--shapes", "gpt5"], "--shapes: unknown gpt5"),
    (["--runners", "jax"], "--runners: unknown jax"),
    (["--steps", "0"], "--steps must be at least 1"),
    (["--recompute", "full,fast"], "--recompute fast: the mode is none, annotated, full or auto[:BYTES]"),
    (["--fuse", "maybe"], "--fuse: unknown maybe"),
])
def test_bad_flags_are_usage_errors(flags, words, capsys):
    with pytest.raises(SystemExit) as info:
        main(flags)
    assert info.value.code == 2 and words in capsys.readouterr().err


def test_the_gpu_check_script_parses_and_names_every_step():
    import subprocess
    from pathlib import Path

    script = Path(__file__).resolve().parents[3] / "tools" / "gpu_check.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    text = script.read_text()
    for step in ("nvidia-smi", "install", "build-kernels", "pytest-gpu", "bench"):
        assert f"step {step} " in text
