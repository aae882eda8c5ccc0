"""The README and docs/ speak to a user: the set-up comes first, and nothing refers to how the
project itself was developed (its internal documents, issue numbers or tools)."""

import re
from pathlib import Path

import pytest
from test_readme import MAIN_JOB

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "docs" / "spec").glob("*.txt"))]
FIRST_LINES = 30
SET_UP = (MAIN_JOB, "bash .ci/run", "Python 3.11")
# what a reader outside the project cannot know: development documents, tracker numbers, tooling
DEVELOPMENT = {
    "a development document": re.compile(r"\b(?:seeds?|specs?) 0\d\d\b", re.I),
    "an issue number": re.compile(r"\bissues? #?\d+\b|\bthe issue's\b", re.I),
    "a development session": re.compile(r"\bsessions?\b", re.I),
    "the development machine's tooling": re.compile(r"\bdevice tool\b|\bcarried wheels\b|\bcarry=", re.I),
}


def development_references(name: str, text: str) -> list[str]:
    """``name:line: what: the line`` for each line of ``text`` that refers to the development."""
    return [f"{name}:{number}: {what}: {line.strip()}" for number, line in enumerate(text.splitlines(), 1)
            for what, pattern in DEVELOPMENT.items() if pattern.search(line)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_page_refers_to_the_development(page):
    assert development_references(str(page.relative_to(ROOT)), page.read_text()) == []


def test_the_patterns_catch_what_they_are_for():
    lines = ["as seed 001 says", "Seed 002's slots", "the targets of issue 16", "in this session",
             "on the device tool", "spec 000's grammar", "random seed 0", "numerical issues", "spec 3.4"]
    found = development_references("page.md", "\n".join(lines))
    assert [entry.split(":")[1] for entry in found] == ["1", "2", "3", "4", "5", "6"]


def test_the_readme_starts_with_the_set_up_and_the_python_it_needs():
    first = "\n".join(README.read_text().splitlines()[:FIRST_LINES])
    for text in SET_UP:
        assert text in first, f"README.md: '{text}' is not within the first {FIRST_LINES} lines"
