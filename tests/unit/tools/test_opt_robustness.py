"""mdsl-opt on hostile IR: bounded time, coded diagnostics, never the catch-all."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from modeldsl.tools.opt import main

HANG_TIMEOUT_S = 10.0


def run_opt_subprocess(path) -> tuple[subprocess.CompletedProcess, float]:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "modeldsl.tools.opt", str(path)], capture_output=True, text=True,
                          timeout=HANG_TIMEOUT_S)
    return done, time.perf_counter() - start


@pytest.mark.parametrize("body", [
    "a" * 40,                      # xDSL's pattern backtracked 2^40 ways on this
    "\\\\" * 20 + "a" * 20,
    "ab\\n" * 15,
    "a" * 100_000,                 # 100 KB on one line
])
def test_an_unterminated_string_is_e001_within_the_time_bound(tmp_path, body):
    path = tmp_path / "hang.mlir"
    path.write_text('func.func @f() attributes {s = "' + body + "\n  func.return\n}\n")
    done, seconds = run_opt_subprocess(path)
    assert done.returncode == 1, done.stderr
    assert "hang.mlir:1:32: error[E001]: End of file reached before closing string literal." in done.stderr
    assert "internal error" not in done.stderr and seconds < HANG_TIMEOUT_S


def test_the_lexer_is_linear_in_process():
    from xdsl.utils.mlir_lexer import MLIRLexer

    import modeldsl.ir  # noqa: F401 - installs the linear string pattern

    text = '"' + "a" * 1_000_000
    start = time.perf_counter()
    assert MLIRLexer._unescaped_characters_regex.match(text) is None  # noqa: SLF001
    assert MLIRLexer._unescaped_characters_regex.match(text + '"') is not None  # noqa: SLF001
    assert time.perf_counter() - start < 1.0  # a second per MB, far below a second per KB


@pytest.mark.parametrize("pattern, accepted", [
    ('"plain"', True), ('"esc \\" \\n \\t \\\\ \\4A"', True), ('"bad \\q"', False), ('"line\nbreak"', False),
])
def test_the_string_pattern_accepts_what_xdsl_accepts(pattern, accepted):
    import re

    from xdsl.utils.mlir_lexer import MLIRLexer

    import modeldsl.ir  # noqa: F401

    xdsl_pattern = re.compile(r'"(?:[^"\\\n\v\f]+|\\(?:["nt\\]|[0-9A-Fa-f]{2}))*"')
    ours = MLIRLexer._unescaped_characters_regex  # noqa: SLF001
    assert (ours.fullmatch(pattern) is not None) == accepted == (xdsl_pattern.fullmatch(pattern) is not None)


@pytest.mark.parametrize("text, expected", [
    ("func.func @f(%a: i600) {\n  func.return\n}\n", "error[E001]: integer type 'i600' is wider than 64 bits"),
    ("!t = !mdsl.graph.tensor<[" + "(" * 500 + "B" + ")" * 500 + "], fp32>\n",
     "error[E001]: invalid dimension expression: dimension expression nests deeper than 100 levels"),
    ("!t = !mdsl.graph.tensor<[" + "- " * 3000 + "B], fp32>\n",
     "error[E001]: invalid dimension expression: dimension expression nests deeper than 100 levels"),
    ("!t = !mdsl.graph.tensor<[B" + " mod 3" * 3000 + "], fp32>\n", "dimension expression has 3000 divisions"),
    ("func.func @f() attributes {n = " + "9" * 4400 + " : i64} {\n  func.return\n}\n",
     "odd.mlir:1:32: error[E001]: integer literal of 4400 digits is too long (at most 4300)"),
    ("func.func @f() attributes {n = 99999999999999999999999 : i64} {\n  func.return\n}\n",
     "odd.mlir:1:32: error[E001]: Integer value 99999999999999999999999 is out of range for type i64"),
])
def test_odd_ir_is_a_coded_error(tmp_path, capsys, text, expected):
    path = tmp_path / "odd.mlir"
    path.write_text(text)
    assert main([str(path)]) == 1
    err = capsys.readouterr().err
    assert expected in err and "internal error" not in err


def test_widths_up_to_64_bits_parse(tmp_path, capsys):
    path = tmp_path / "ok.mlir"
    path.write_text("func.func @f(%a: i1, %b: i64, %c: si32, %d: ui8) {\n  func.return\n}\n")
    assert main([str(path)]) == 0
    assert "%b: i64" in capsys.readouterr().out


def test_disable_verify_does_not_outlive_its_run(tmp_path, capsys):
    """xDSL's --disable-verify turns attribute verification off for the whole process; a later
    run in the same process (the fuzz test, an API user) still verifies."""
    path = tmp_path / "odd.mlir"
    path.write_text("func.func @f() attributes {n = 99999999999999999999999 : i64} {\n  func.return\n}\n")
    assert main([str(path), "--disable-verify"]) == 0
    assert main([str(path)]) == 1 and "out of range for type i64" in capsys.readouterr().err


def test_a_pass_that_fails_on_ir_let_in_by_disable_verify_reports_the_ir(tmp_path, capsys):
    path = tmp_path / "empty-model.mlir"
    path.write_text("mdsl.graph.model @m {\n}\n")
    assert main([str(path), "-p", "mdsl-autodiff", "--disable-verify"]) == 1
    err = capsys.readouterr().err
    assert "empty-model.mlir:1:1: error[E041]" in err and "expected a single block" in err
    assert "--disable-verify let this invalid IR" in err and "internal error" not in err


def test_a_location_naming_a_fifo_is_never_opened(tmp_path, capsys):
    """A verifier error after a pass is shown at the op's loc(...) with that file's line; a FIFO
    named there would block the read."""
    import os
    import re
    import signal

    from modeldsl.resolve.imports import STD_ROOT

    lowered = tmp_path / "llama.mlir"
    assert main([str(STD_ROOT / "models" / "llama.module"), "--print-debuginfo", "-o", str(lowered)]) == 0
    fifo = tmp_path / "attention.module"
    os.mkfifo(fifo)
    lowered.write_text(re.sub(r'loc\("[^"]*attention/gqa\.module"', f'loc("{fifo}"', lowered.read_text()))
    capsys.readouterr()
    signal.signal(signal.SIGALRM, lambda *_: pytest.fail("reading the FIFO blocked"))
    signal.alarm(20)
    try:
        assert main([str(lowered), "-p", "mdsl-specialize{num_kv_heads=3}"]) == 1
    finally:
        signal.alarm(0)
    err = capsys.readouterr().err
    assert f"{fifo}:" in err and "error[E004]" in err and "internal error" not in err
