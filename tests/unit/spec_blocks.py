"""Code blocks of the Module DSL spec, for tests that run its examples."""

import re
from pathlib import Path

import pytest

SPEC = Path(__file__).resolve().parents[2].parent / "shared" / "seeds" / "000_2373ac2d1ac196e6.txt"
PROGRAM_START = re.compile(r"^(module|block|model|primitive|recipe|import|from|abstract) ", re.M)


def spec_code_blocks(first_line: int = 0) -> list[tuple[int, str]]:
    """(line, text) of each fenced code block of the spec that holds DSL declarations."""
    if not SPEC.exists():
        pytest.skip("the spec is not beside the repository")
    blocks, current, start = [], None, 0
    for number, line in enumerate(SPEC.read_text().split("\n"), 1):
        if line.startswith("```"):
            if current is None:
                current, start, lang = [], number, line[3:].strip()
            else:
                text = "\n".join(current)
                if lang == "" and start >= first_line and PROGRAM_START.search(text):
                    blocks.append((start, text))
                current = None
        elif current is not None:
            current.append(line)
    return blocks
