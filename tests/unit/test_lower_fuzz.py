"""Seeded mutants of the spec's programs, the diagnostic cases and the frontend FileCheck
inputs: parsing and lowering each ends in coded diagnostics or in IR that verifies, never
in another exception (issue 13: no internal errors on any input)."""

import random
from pathlib import Path

from spec_blocks import spec_code_blocks

from modeldsl.diagnostics import DiagnosticError
from modeldsl.frontend.text.parser import parse_source
from modeldsl.ir import verify_module
from modeldsl.lower import lower_program

TESTS = Path(__file__).resolve().parents[1]
INSERTS = ["->", "(", ")", "[", "]", ",", ":", "if", "else", "None", "_", "?", "...", "x", "0", "-1", "int",
           "scalar", "out", "in", "[B, d]", "1e999", "2**99", "\n", "  ", "@fuse(x)", "@checkpoint", "@partition(1)",
           ".", "x[0]", "a if b else c", "@tag(", "-" * 300]


def sources() -> list[str]:
    files = sorted((TESTS / "unit" / "diagnostics" / "cases").glob("*.module"))
    files += sorted((TESTS / "filecheck" / "frontend").glob("*.module"))
    return [text for _, text in spec_code_blocks()] + [f.read_text(encoding="utf-8") for f in files]


def mutate(text: str, rng: random.Random) -> str:
    for _ in range(rng.randint(1, 3)):
        at = rng.randrange(len(text) + 1)
        kind = rng.random()
        if kind < 0.4:
            text = text[:at] + rng.choice(INSERTS) + text[at:]
        elif kind < 0.7:
            text = text[:at] + text[at + rng.randint(1, 8):]
        else:
            lines = text.split("\n")
            a, b = rng.randrange(len(lines)), rng.randrange(len(lines))
            lines[a], lines[b] = lines[b], lines[a]
            text = "\n".join(lines)
    return text


def outcome(text: str) -> str:
    """'refused' (coded diagnostics) or 'lowered' (verified IR) for every declaration."""
    try:
        program = parse_source(text, "mutant.module")
    except DiagnosticError:
        return "refused"
    for decl in program.declarations:
        if decl.kind in ("module", "block", "model"):
            try:
                module = lower_program(program, decl.name)
            except DiagnosticError:
                continue
            assert verify_module(module) == [], text
    return "lowered"


def test_mutants_lower_or_get_coded_diagnostics():
    rng = random.Random(13)
    pool = sources()
    seen = {outcome(mutate(rng.choice(pool), rng)) for _ in range(400)}
    assert seen == {"refused", "lowered"}
