"""The start-up benchmark's logic: the round-robin order, the medians, the table and its targets
(the real run is ``python -m modeldsl.tools.bench_startup``; no time is asserted here)."""

from __future__ import annotations

import sys

import pytest

from modeldsl.diagnostics import DiagnosticError
from modeldsl.tools import bench_startup
from modeldsl.tools.bench_startup import (
    COMMANDS,
    REFERENCE,
    Command,
    all_met,
    child_env,
    medians,
    round_robin,
    table,
    time_command,
)

FAST = Command("fast", ("fast",), 0.5)
SLOW = Command("slow", ("slow",), 1.0)


def test_rounds_alternate_between_the_commands():
    order = []
    times = round_robin([REFERENCE, FAST, SLOW], 2, lambda argv: order.append(argv[0]) or float(len(order)))
    assert order == ["xdsl-opt", "fast", "slow"] * 2
    assert times == {"xdsl-opt --help": [1.0, 4.0], "fast": [2.0, 5.0], "slow": [3.0, 6.0]}


def test_the_table_gives_medians_ratios_to_xdsl_opt_and_the_targets():
    median = medians({"xdsl-opt --help": [0.4, 0.5, 0.3], "fast": [0.4, 9.0, 0.2], "slow": [1.2, 1.1, 1.3]})
    assert median == {"xdsl-opt --help": 0.4, "fast": 0.4, "slow": 1.2}
    lines = table([REFERENCE, FAST, SLOW], median).splitlines()
    assert lines[0].split() == ["command", "median", "s", "x", "xdsl-opt", "target"]
    assert lines[1].split()[-3:] == ["0.400", "1.00x", "(reference)"]
    assert lines[2].split()[1:] == ["0.400", "1.00x", "<=", "0.5", "s:", "yes"]
    assert lines[3].split()[1:] == ["1.200", "3.00x", "<=", "1.0", "s:", "no"]
    assert not all_met([REFERENCE, FAST, SLOW], median) and all_met([REFERENCE, FAST], median)


def test_the_commands_and_targets_are_the_issues():
    assert [(c.label, c.target) for c in COMMANDS] == [
        ("xdsl-opt --help", None), ("mdsl-opt --help", 0.5), ("mdsl-run --help", 0.5),
        ("mdsl-opt examples/residual_mlp.module", 1.0)]
    assert bench_startup.EXAMPLE.is_file()


def test_a_command_is_timed_and_a_failing_one_is_e029():
    assert time_command([sys.executable, "-c", "pass"]) > 0
    with pytest.raises(DiagnosticError) as info:
        time_command([sys.executable, "-c", "import sys; sys.exit('no such model')"])
    (diag,) = info.value.diagnostics
    assert diag.code == "E029" and "exited with 1: no such model" in diag.message


def test_a_missing_program_is_e029(monkeypatch):
    monkeypatch.setenv("PATH", "")
    with pytest.raises(DiagnosticError) as info:
        bench_startup.program_path("no-such-mdsl-tool")
    assert info.value.diagnostics[0].code == "E029"


def test_the_pycache_prefix_turns_bytecode_writes_on(monkeypatch):
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    env = child_env("/tmp/pyc")
    assert "PYTHONDONTWRITEBYTECODE" not in env and env["PYTHONPYCACHEPREFIX"] == "/tmp/pyc"
    assert child_env(None)["PYTHONDONTWRITEBYTECODE"] == "1"


def test_a_run_prints_the_table(monkeypatch, capsys):
    timed = []
    monkeypatch.setattr(bench_startup, "program_path", lambda name: name)
    monkeypatch.setattr(bench_startup, "time_command", lambda argv, env=None: timed.append(argv) or 0.25)
    assert bench_startup.main(["--repeats", "1", "--warmup", "1"]) == 0
    out = capsys.readouterr().out
    assert len(timed) == 2 * len(COMMANDS) and "targets: all met" in out
    assert "mdsl-opt examples/residual_mlp.module     0.250      1.00x  <= 1.0 s: yes" in out
