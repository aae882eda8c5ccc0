"""mdsl-run's first run on a machine builds the CPU kernels: it says so on stderr, once, and the
prefill, decode and training speeds it reports leave the build out.

The build here links the real library into a fresh cache folder (no compile), and moves a clock of
the timers it would hide in forward by a million seconds: a reported time that held the build would
be at least that long."""

import re
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from modeldsl.kernels.cpu import compiled
from modeldsl.resolve.imports import STD_ROOT
from modeldsl.runtime import model as runtime_model
from modeldsl.tools import train as train_tool
from modeldsl.tools.run import main

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "tiny_llama"
LLAMA = STD_ROOT / "models" / "llama.module"
MAIN_JOB = [str(LLAMA), "--hf", str(EXAMPLE), "--prompt", "Hello, world", "--max-new-tokens", "4"]
BUILD_SECONDS = 1e6
TIMINGS = re.compile(r"(?:prefill: \d+ tokens|decode: \d+ steps|trained \d+ steps?) in ([\d.]+) (ms|s)")


@pytest.fixture
def slow_first_build(tmp_path, monkeypatch):
    """A fresh cache folder and a build that takes BUILD_SECONDS on the timers' clock."""
    if compiled.library() is None:
        pytest.skip("the compiled kernels do not build here (is ziglang installed?)")
    real = compiled.library_path()
    offset = [0.0]

    def build(target: Path) -> None:
        offset[0] += BUILD_SECONDS
        target.symlink_to(real)

    clock = SimpleNamespace(perf_counter=lambda: time.perf_counter() + offset[0])
    monkeypatch.setattr(runtime_model, "time", clock)
    monkeypatch.setattr(train_tool, "time", clock)
    monkeypatch.setenv(compiled.CACHE_ENV_VAR, str(tmp_path / "cache"))
    monkeypatch.setenv(compiled.ENV_VAR, "1")
    monkeypatch.setattr(compiled, "build", build)
    monkeypatch.chdir(tmp_path)  # a training run without --save draws ./loss.png
    compiled.library.cache_clear()
    yield
    compiled.library.cache_clear()


def seconds(out: str) -> list[float]:
    """Every time mdsl-run reports, in seconds."""
    return [float(value) / (1000 if unit == "ms" else 1) for value, unit in TIMINGS.findall(out)]


def announced(err: str) -> list[str]:
    return [line for line in err.splitlines() if "the CPU kernels" in line]


def test_the_main_job_announces_the_build_once_and_its_timings_leave_it_out(slow_first_build, capsys):
    assert main(MAIN_JOB) == 0
    out, err = capsys.readouterr()
    lines = announced(err)
    assert len(lines) == 2 and lines[0] == compiled.BUILDING and lines[1].startswith("built the CPU kernels in ")
    times = seconds(out)
    assert len(times) == 2 and all(t < BUILD_SECONDS for t in times), out
    compiled.library.cache_clear()  # a second run: a fresh process finds the library cached
    assert main(MAIN_JOB) == 0
    assert announced(capsys.readouterr().err) == []


def test_the_training_speed_leaves_the_build_out(slow_first_build, capsys):
    data = ROOT / "examples" / "tiny_corpus.txt"
    assert main([str(LLAMA), "--hf", str(EXAMPLE), "--train", str(data), "--steps", "1", "--batch", "1",
                 "--seq", "16", "--lr", "1e-3"]) == 0
    out, err = capsys.readouterr()
    assert len(announced(err)) == 2
    step_rates = [float(rate) for rate in re.findall(r"^step \d+ .* tokens/s (\S+) ", out, re.M)]
    times = seconds(out)
    assert step_rates and all(rate > 16 / BUILD_SECONDS for rate in step_rates), out
    assert len(times) == 1 and times[0] < BUILD_SECONDS, out
