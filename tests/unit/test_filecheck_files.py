"""The FileCheck tests' RUN lines (tests/filecheck): variants of an input are files of their own
(an ``Inputs/`` folder, which lit does not run) or ``--split-input-file`` cases, never text edited
by ``sed`` (a substitution that stops matching would go unnoticed, testing the unchanged input)."""

import re
from pathlib import Path

import pytest

FILECHECK = Path(__file__).resolve().parents[1] / "filecheck"
SUFFIXES = (".mlir", ".module", ".py")  # lit.cfg.py's config.suffixes
RUN = re.compile(r"^\s*(?:#|//)\s*RUN:(.*)$")
SED = re.compile(r"(?<![\w.-])sed(?![\w.-])")  # the word, not 'used' or 'unfused'
INPUT = re.compile(r"%S/([\w./-]+)")
SEPARATOR = "// -----"  # where mdsl-opt --split-input-file cuts its input


def _files(tests: bool) -> list[Path]:
    """The tests lit runs (``tests``), or the inputs under Inputs/ folders (not ``tests``);
    never lit's Output/ folders."""
    out = []
    for path in sorted(FILECHECK.rglob("*")):
        parts = path.relative_to(FILECHECK).parts
        if not path.is_file() or "Output" in parts or path.name == "lit.cfg.py":
            continue
        if ("Inputs" in parts) != tests and path.suffix in SUFFIXES:
            out.append(path)
    return out


def _run_lines(path: Path) -> list[str]:
    lines, joined = [], ""
    for line in path.read_text(encoding="utf-8").splitlines():
        match = RUN.match(line)
        if match:
            joined += match.group(1).strip()
            if joined.endswith("\\"):
                joined = joined[:-1] + " "
                continue
            lines.append(joined)
            joined = ""
    return lines


def _inputs(path: Path, command: str) -> list[Path]:
    """The paths a RUN line reads: %s and the %S/... paths (files, or checkpoint folders)."""
    found = [path.parent / name for name in INPUT.findall(command)]
    return found + ([path] if re.search(r"%s(?![\w/])", command) else [])


TESTS = _files(tests=True)
IDS = [str(p.relative_to(FILECHECK)) for p in TESTS]


def test_the_tests_are_found():
    assert len(TESTS) > 50
    assert all(_run_lines(p) for p in TESTS if p.suffix != ".py" or "RUN:" in p.read_text(encoding="utf-8"))


@pytest.mark.parametrize("path", TESTS, ids=IDS)
def test_no_run_line_edits_its_input_with_sed(path):
    bad = [line for line in _run_lines(path) if SED.search(line)]
    assert not bad, (f"{path.name}: a RUN line runs sed; write the variant as a file under Inputs/ "
                     f"or as a --split-input-file case: {bad}")


@pytest.mark.parametrize("path", TESTS, ids=IDS)
def test_split_input_files_have_cases(path):
    """A ``--split-input-file`` input holds at least two cases, and is IR: the Module DSL
    frontend does not split its input (a RUN line that expects the flag's error on it is ``not ...``)."""
    for command in _run_lines(path):
        if "--split-input-file" not in command or command.startswith("not "):
            continue
        for source in filter(Path.is_file, _inputs(path, command)):
            assert source.suffix == ".mlir", f"{path.name}: --split-input-file on {source.name}, not IR"
            cases = source.read_text(encoding="utf-8").count(SEPARATOR) + 1
            assert cases >= 2, f"{path.name}: --split-input-file on {source.name}, which holds one case"


@pytest.mark.parametrize("path", TESTS, ids=IDS)
def test_inputs_a_run_line_names_exist(path):
    for command in _run_lines(path):
        for source in _inputs(path, command):
            assert source.exists(), f"{path.name}: a RUN line reads {source}, which is missing"


def test_every_input_file_is_read_by_a_test():
    """No variant under Inputs/ that no RUN line reads (a test that silently stopped running)."""
    read = {source.resolve() for path in TESTS for command in _run_lines(path)
            for source in _inputs(path, command)}
    unread = [str(p.relative_to(FILECHECK)) for p in _files(tests=False) if p.resolve() not in read]
    assert not unread, f"inputs no RUN line reads: {unread}"
