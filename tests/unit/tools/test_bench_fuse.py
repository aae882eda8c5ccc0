"""tools/bench_fuse.py runs (tiny shape on the CPU) and prints one row per fusion variant, measured
step times, and the verdict on the logits."""

from modeldsl.passes.fuse import PATTERNS
from modeldsl.tools.bench_fuse import main


def test_the_benchmark_prints_every_variant_and_its_verdicts(capsys):
    assert main(["--shapes", "tiny", "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    rows = {line[13:31].strip(): line[31:].split() for line in out.splitlines() if line.startswith("tiny (CPU) ")}
    assert list(rows) == ["off", *PATTERNS, "all on"]
    assert rows["off"][-3] == "yes" and rows["all on"][-3] == "no"  # a logits GEMM in the plan
    assert int(rows["all on"][0]) < int(rows["off"][0])  # fewer launches
    assert all(float(cells[-2]) > 0 for cells in rows.values())  # measured step times
    assert "tiny (CPU): logits in the plan with all on: no (met)" in out


def test_an_unknown_shape_is_a_coded_error(capsys):
    assert main(["--shapes", "gpt-5"]) == 1
    assert "error[E029]: bench_fuse: no shape gpt-5" in capsys.readouterr().err
