"""tools/bench_recompute.py runs (tiny shape) and prints one row per mode, the targets and compile times."""

from modeldsl.tools.bench_recompute import main


def test_the_benchmark_prints_every_mode_and_its_verdicts(capsys):
    assert main(["--shapes", "tiny", "--compile-layers", "2,4"]) == 0
    out = capsys.readouterr().out
    rows = [line.split()[1] for line in out.splitlines() if line.startswith("tiny ")]
    assert rows == ["none", "annotated", "full", "auto", "auto"]
    assert out.count(": met") + out.count(": MISSED") == 3
    assert "2 layers:" in out and "4 layers:" in out


def test_an_unknown_shape_is_a_coded_error(capsys):
    assert main(["--shapes", "gpt-5"]) == 1
    assert "error[E029]: bench_recompute: no shape gpt-5" in capsys.readouterr().err
