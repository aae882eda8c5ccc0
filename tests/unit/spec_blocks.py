"""Code blocks of the Module DSL spec, for tests that run its examples.

The spec is vendored as ``docs/spec/module-dsl.txt`` so these tests run in a
clean clone; ``test_the_vendored_spec_is_the_shared_one`` keeps it equal to
the shared seed where that is beside the repository.
"""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SPEC = REPO / "docs" / "spec" / "module-dsl.txt"
SHARED_SPEC = REPO.parent / "shared" / "seeds" / "000_2373ac2d1ac196e6.txt"
PROGRAM_START = re.compile(r"^(module|block|model|primitive|recipe|annotation|import|from|abstract) ", re.M)


def spec_code_blocks(first_line: int = 0) -> list[tuple[int, str]]:
    """(line, text) of each fenced code block of the spec that holds DSL declarations."""
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
