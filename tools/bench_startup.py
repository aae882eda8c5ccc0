"""Benchmark (not a test): the start-up time of the command-line tools against ``xdsl-opt``'s, in one run.

``python -m modeldsl.tools.bench_startup`` times fresh processes of

* ``xdsl-opt --help``: the reference, xDSL's own driver, which ``mdsl-opt`` is built on;
* ``mdsl-opt --help`` and ``mdsl-run --help`` (target: at most 0.5 s each);
* ``mdsl-opt examples/residual_mlp.module``: parse, check, lower and print a small model
  (target: at most 1.0 s).

The machine is shared and noisy, so the commands alternate round-robin (xdsl-opt, mdsl-opt,
mdsl-run, ..., then the next round) for ``--repeats`` rounds (default 5), after ``--warmup``
untimed rounds (default 1: the OS's file cache is warm, as for a user's second run); each
command's time is its median, wall seconds from spawn to exit. The
table gives each command's median, its ratio to ``xdsl-opt --help`` in the same run, and its
target with whether the median meets it. The commands are the console scripts beside the
running Python (a virtual environment's), else on ``PATH``; their output is discarded, and a
command that fails or is missing stops the benchmark with E029. Where ``PYTHONDONTWRITEBYTECODE``
is set, a module without a current ``.pyc`` is compiled in every process (the header says so);
``--pycache-prefix DIR`` lets the warm-up write the bytecode there instead, as an installed
package has it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from modeldsl.diagnostics import Diagnostic, DiagnosticError
from modeldsl.tools.bench_deps import reporting_diagnostics

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "residual_mlp.module"  # in a source checkout


@dataclass(frozen=True)
class Command:
    """One timed command: its label in the table, its program and arguments, its target in seconds
    (None for the reference)."""

    label: str
    argv: tuple[str, ...]
    target: float | None = None


REFERENCE = Command("xdsl-opt --help", ("xdsl-opt", "--help"))
COMMANDS: tuple[Command, ...] = (
    REFERENCE,
    Command("mdsl-opt --help", ("mdsl-opt", "--help"), 0.5),
    Command("mdsl-run --help", ("mdsl-run", "--help"), 0.5),
    Command("mdsl-opt examples/residual_mlp.module", ("mdsl-opt", str(EXAMPLE)), 1.0),
)


# ---------------------------------------------------------------------------- running
def program_path(name: str) -> str:
    """The console script ``name`` beside the running Python, else on PATH; E029 where neither has it."""
    beside = Path(sys.executable).parent / name
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which(name)
    if found is None:
        raise DiagnosticError([Diagnostic("E029", f"bench_startup: no '{name}' beside {sys.executable} or on PATH",
                                          None, "install modeldsl (pip install -e .) in this environment")])
    return found


def child_env(pycache_prefix: str | None) -> dict[str, str]:
    """The commands' environment: this one, or with ``pycache_prefix`` bytecode written there."""
    env = dict(os.environ)
    if pycache_prefix is not None:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = pycache_prefix
    return env


def time_command(argv: Sequence[str], env: dict[str, str] | None = None) -> float:
    """Wall seconds of one fresh process of ``argv``, its output discarded; E029 when it fails."""
    start = time.perf_counter()
    done = subprocess.run(list(argv), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, check=False)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        stderr = done.stderr.decode("utf-8", "replace").strip().splitlines()
        raise DiagnosticError([Diagnostic("E029", f"bench_startup: '{' '.join(argv)}' exited with "
                                          f"{done.returncode}: {stderr[-1] if stderr else 'no message'}", None,
                                          "run the command by hand to see what fails")])
    return seconds


def round_robin(commands: Sequence[Command], repeats: int,
                run: Callable[[Sequence[str]], float]) -> dict[str, list[float]]:
    """``repeats`` rounds, each running every command once in order: the seconds of each, by label."""
    times: dict[str, list[float]] = {c.label: [] for c in commands}
    for _ in range(repeats):
        for command in commands:
            times[command.label].append(run(command.argv))
    return times


def resolved(commands: Sequence[Command]) -> list[Command]:
    """The commands with their programs' full paths (the labels stay as typed)."""
    return [Command(c.label, (program_path(c.argv[0]), *c.argv[1:]), c.target) for c in commands]


# ---------------------------------------------------------------------------- the table
def medians(times: dict[str, list[float]]) -> dict[str, float]:
    """Each command's median seconds."""
    return {label: statistics.median(seconds) for label, seconds in times.items()}


def verdict(seconds: float, target: float | None) -> str:
    """``<= 0.5 s: yes`` (or ``no``); ``(reference)`` for the reference."""
    if target is None:
        return "(reference)"
    return f"<= {target} s: {'yes' if seconds <= target else 'no'}"


def table(commands: Sequence[Command], median: dict[str, float]) -> str:
    """One row per command: its median seconds, the ratio to the reference's, its target and whether it is met."""
    width = max(len(c.label) for c in commands)
    reference = median.get(REFERENCE.label)
    lines = [f"{'command':<{width}} {'median s':>9} {'x xdsl-opt':>10}  target"]
    for command in commands:
        seconds = median[command.label]
        ratio = f"{seconds / reference:.2f}x" if reference else "-"
        lines.append(f"{command.label:<{width}} {seconds:>9.3f} {ratio:>10}  {verdict(seconds, command.target)}")
    return "\n".join(lines)


def all_met(commands: Sequence[Command], median: dict[str, float]) -> bool:
    return all(c.target is None or median[c.label] <= c.target for c in commands)


# ---------------------------------------------------------------------------- the command
def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m modeldsl.tools.bench_startup", description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5, help="timed rounds; each command's median counts")
    p.add_argument("--warmup", type=int, default=1, help="untimed rounds first (the file cache)")
    p.add_argument("--pycache-prefix", metavar="DIR", help="the commands write and read their bytecode in DIR "
                   "(PYTHONPYCACHEPREFIX), even where PYTHONDONTWRITEBYTECODE is set")
    args = p.parse_args(argv)
    if args.repeats < 1 or args.warmup < 0:
        p.error("--repeats must be at least 1 and --warmup not negative")
    return args


def load_average() -> str:
    return "load average {:.1f} {:.1f} {:.1f}".format(*os.getloadavg())


def bytecode_note(env: dict[str, str]) -> str:
    """Where the commands find their bytecode (or that modules without a .pyc compile every time)."""
    if env.get("PYTHONDONTWRITEBYTECODE"):
        return "PYTHONDONTWRITEBYTECODE is set: modules without a current .pyc compile in every process"
    prefix = env.get("PYTHONPYCACHEPREFIX")
    return f"bytecode cached in {prefix}" if prefix else "bytecode cached in __pycache__"


def run(argv: Sequence[str] | None) -> int:
    args = parse_args(argv)
    if not EXAMPLE.is_file():
        raise DiagnosticError([Diagnostic("E029", f"bench_startup: no {EXAMPLE} (the benchmark runs in a source "
                                          "checkout)", None, "run it from a clone of the repository")])
    commands = resolved(COMMANDS)
    env = child_env(args.pycache_prefix)
    print(f"start-up benchmark: {args.repeats} alternating rounds of fresh processes after {args.warmup} untimed, "
          f"each command's median wall seconds; {bytecode_note(env)}; {load_average()}", flush=True)

    def timed(argv: Sequence[str]) -> float:
        return time_command(argv, env)

    round_robin(commands, args.warmup, timed)
    median = medians(round_robin(commands, args.repeats, timed))
    print(f"{load_average()} (others' processes slow every command down)")
    print(table(commands, median))
    print(f"targets: {'all met' if all_met(commands, median) else 'not all met'}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return reporting_diagnostics(lambda: run(argv))


if __name__ == "__main__":
    sys.exit(main())
