"""Name mutants: no misspelled or swapped word is accepted and ignored without a word.

A mutant is a seed program with one of its words replaced: a section key (``save:`` ->
``svae:``, ``recompute:``), an annotation name (``@nofuse`` -> ``@nofsue``, ``@hook``) or a
Python DSL decorator (``@forward`` -> ``@froward``, ``@recompute``), by a typo (a letter
dropped, doubled, swapped or changed) or by another word of the same vocabulary. The seeds are
the std models and modules (both DSLs), the frontend FileCheck inputs and the spec's DSL blocks
that lower as they are. Names a program chooses (a ``params:`` or ``let:`` entry, an annotation
it declares), prose and what a declaration of a built-in annotation says for its reader
(``applies_to:``, ``compiler_behavior:``) are no sites.

Every declaration of the seed and of the mutant is lowered; the mutant's :func:`outcome` is

- ``refused``: a coded error (parse or lowering),
- ``warned``: a diagnostic the seed does not give,
- ``changed``: the same diagnostics, but some declaration lowers to other IR,
- ``untaken``: the same diagnostics and IR where a word of the vocabulary replaced another inside
  an ``if``/``else`` branch, which the seed's configuration may not take (a typo there is refused),
- ``silent``: the same diagnostics and the same IR: the word was accepted and ignored.

No mutant may be ``silent``. Mutants are determined by ``(seed, index)``; a campaign::

    python tests/unit/name_mutants.py --seed 1 --count 3000
"""

from __future__ import annotations

import argparse
import random
import re
import sys
from collections import Counter
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from spec_blocks import spec_code_blocks

from modeldsl.diagnostics import DiagnosticError, DiagnosticSink
from modeldsl.dialects.annotations import ANNOTATION_BY_NAME
from modeldsl.frontend.python import parse_python_source
from modeldsl.frontend.python.decorators import CLASS_DECORATORS, METHOD_DECORATORS
from modeldsl.frontend.text.parser import parse_source
from modeldsl.ir import print_ir
from modeldsl.lower import lower_program
from modeldsl.resolve.sections import (
    BACKWARD_SECTIONS,
    DECLARATION_SECTIONS,
    FORWARD_SECTIONS,
    NESTED_SECTIONS,
)

ROOT = Path(__file__).resolve().parents[2]
LOWERABLE = ("module", "block", "model")

SECTIONS = sorted({*FORWARD_SECTIONS, *BACKWARD_SECTIONS, *(s for v in DECLARATION_SECTIONS.values() for s in v),
                   *(s for v in NESTED_SECTIONS.values() for s in v)})
ANNOTATIONS = sorted(ANNOTATION_BY_NAME)
DECORATORS = sorted({*CLASS_DECORATORS, *METHOD_DECORATORS, *ANNOTATIONS})

SECTION_KEY = re.compile(r"^[ \t]*([a-z_]+)(?=:)", re.M)
ANNOTATION = re.compile(r"@([A-Za-z_][A-Za-z0-9_]*)")
DECORATOR = re.compile(r"^[ \t]*@([A-Za-z_][A-Za-z0-9_.]*)", re.M)


@dataclass(frozen=True)
class Site:
    """A word of a seed that a mutant replaces: its span and the vocabulary it comes from."""

    start: int
    end: int
    vocabulary: tuple[str, ...]


@dataclass(frozen=True)
class Mutant:
    seed: str
    text: str
    old: str
    new: str
    line: int
    branch_swap: bool = False  # a word of the vocabulary in place of another, inside an if/else branch

    @property
    def python(self) -> bool:
        return self.seed.endswith(".py")


def in_comment_or_string(text: str, at: int) -> bool:
    """Whether ``at`` is after a ``#`` or inside quotes on its line, or inside a triple-quoted string."""
    if text.count('"""', 0, at) % 2:
        return True
    line = text[text.rfind("\n", 0, at) + 1:at]
    return "#" in line or line.count('"') % 2 == 1 or line.count("'") % 2 == 1


# words that mean the same here (a block is a module that may also be stacked; a model, one that
# mdsl-run runs: the three lower to the same IR)
SYNONYMS = ({"in", "inputs"}, {"out", "outputs"}, {"block", "module", "model"})
# sections whose keys are names the program chooses or prose, not words of the language (a
# primitive's memory: names its sizes: workspace:, saved:)
LISTS = ("params", "let", "compiler_behavior", "runtime_behavior", "memory")
# what a declaration of a built-in annotation says only for its reader (its params: are checked)
DOCUMENTATION = ("applies_to", "compiler_behavior", "runtime_behavior")


def same_word(old: str, new: str) -> bool:
    return any(old in words and new in words for words in SYNONYMS)


def in_parentheses(text: str, at: int) -> bool:
    """Whether ``at`` is inside ``( ... )``: ``out: (out: [B, T, D], lse: ...)`` names a tensor ``out``."""
    return text.count("(", 0, at) > text.count(")", 0, at)


def enclosing_lines(text: str, at: int) -> list[str]:
    """The stripped lines, innermost first, whose bodies hold the line of ``at`` (by indentation)."""
    start = text.rfind("\n", 0, at) + 1
    indent = len(text[start:at]) - len(text[start:at].lstrip())
    found = []
    for line in reversed(text[:start].split("\n")):
        stripped = line.lstrip()
        if stripped and not stripped.startswith("#") and len(line) - len(stripped) < indent:
            found.append(stripped)
            indent = len(line) - len(stripped)
    return found


def in_a_branch(text: str, at: int) -> bool:
    """Whether ``at`` is inside an ``if``/``elif``/``else`` body (which the configuration may not take)."""
    return any(re.match(r"(if|elif)\b|else:", line) for line in enclosing_lines(text, at))


def under_a_list(text: str, at: int) -> bool:
    """Whether the key at ``at`` is an entry of a ``params:`` or ``let:`` section (a name, not a section)."""
    parents = enclosing_lines(text, at)
    return bool(parents) and parents[0].split(":")[0] in LISTS


def documents_a_builtin(text: str, at: int) -> bool:
    """Whether ``at`` is in a declaration of a built-in annotation (``annotation @memory:``)."""
    header = re.findall(r"^annotation @(\w+):|^\S", text[:at], re.M)
    return bool(header) and header[-1] in ANNOTATION_BY_NAME


def declares_an_annotation(text: str, at: int) -> bool:
    """``annotation @name:``: the name is the program's own."""
    return text[text.rfind("\n", 0, at) + 1:at].strip() == "annotation @"


def sites(name: str, text: str) -> list[Site]:
    """The words of a seed a mutant may replace."""
    found = []
    if name.endswith(".py"):
        for m in DECORATOR.finditer(text):
            if m.group(1) in DECORATORS:
                found.append(Site(m.start(1), m.end(1), tuple(DECORATORS)))
        return found
    for m in SECTION_KEY.finditer(text):
        if m.group(1) in SECTIONS and not in_comment_or_string(text, m.start(1)) \
                and not in_parentheses(text, m.start(1)) and not under_a_list(text, m.start(1)) \
                and not (m.group(1) in DOCUMENTATION and documents_a_builtin(text, m.start(1))):
            found.append(Site(m.start(1), m.end(1), tuple(SECTIONS)))
    for m in ANNOTATION.finditer(text):
        if m.group(1) in ANNOTATIONS and not in_comment_or_string(text, m.start(1)) \
                and not declares_an_annotation(text, m.start(1)):
            found.append(Site(m.start(1), m.end(1), tuple(ANNOTATIONS)))
    return found


def typo(rng: random.Random, word: str) -> str:
    """The word with one letter dropped, doubled, swapped with the next or changed."""
    at = rng.randrange(len(word))
    kind = rng.randrange(4)
    if kind == 0 and len(word) > 1:
        return word[:at] + word[at + 1:]
    if kind == 1:
        return word[:at] + word[at] + word[at:]
    if kind == 2 and at + 1 < len(word):
        return word[:at] + word[at + 1] + word[at] + word[at + 2:]
    return word[:at] + rng.choice("abcdefghijklmnopqrstuvwxyz_") + word[at + 1:]


@cache
def seeds() -> tuple[tuple[str, str], ...]:
    """(name, text) of every seed whose declarations all lower without an error, and that has sites."""
    found = [(str(p.relative_to(ROOT)), p.read_text()) for p in sorted((ROOT / "modeldsl/std").rglob("*.module"))]
    found += [(str(p.relative_to(ROOT)), p.read_text())
              for p in sorted((ROOT / "tests/filecheck/frontend").glob("*.module"))]
    found += [(f"spec:{line}", text) for line, text in spec_code_blocks()]
    found += [(str(p.relative_to(ROOT)), p.read_text())
              for p in sorted((ROOT / "modeldsl/std/python").rglob("*.py"))]
    return tuple((name, text) for name, text in found
                 if sites(name, text) and not isinstance(lowered(name, text), str))


def lowered(name: str, text: str) -> tuple[frozenset, tuple] | str:
    """(the diagnostics, each declaration's IR) of a program, or ``"refused"`` on a coded error."""
    parse = parse_python_source if name.endswith(".py") else parse_source
    sink = DiagnosticSink()
    try:
        program = parse(text, name)
        decls = [d.name for d in program.declarations if d.kind in LOWERABLE] or [None]  # None: resolve them
        ir = tuple(print_ir(lower_program(program, decl, None, sink)) for decl in decls)
    except DiagnosticError:
        return "refused"
    return frozenset((d.code, d.message) for d in sink.diagnostics), ir


def mutant(rng: random.Random) -> Mutant:
    """One mutant of a seed drawn by ``rng``: a word typed wrong or swapped for another of its kind."""
    name, text = rng.choice(seeds())
    site = rng.choice(sites(name, text))
    old = text[site.start:site.end]
    new = old
    documentation = documents_a_builtin(text, site.start)
    while new == old or same_word(old, new) or documentation and new in DOCUMENTATION:
        new = typo(rng, old) if rng.random() < 0.6 else rng.choice(site.vocabulary)
    return Mutant(name, text[:site.start] + new + text[site.end:], old, new, text.count("\n", 0, site.start) + 1,
                  new in site.vocabulary and in_a_branch(text, site.start))


def mutants(seed: int, count: int) -> list[Mutant]:
    rng = random.Random(seed)
    return [mutant(rng) for _ in range(count)]


def outcome(m: Mutant) -> str:
    original = lowered(m.seed, dict(seeds())[m.seed])
    result = lowered(m.seed, m.text)
    if result == "refused":
        return "refused"
    if result[0] - original[0]:
        return "warned"
    if result[1] != original[1]:
        return "changed"
    return "untaken" if m.branch_swap else "silent"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--count", type=int, default=500)
    args = parser.parse_args(argv)
    counts: Counter[str] = Counter()
    for index, m in enumerate(mutants(args.seed, args.count)):
        kind = outcome(m)
        counts[kind] += 1
        if kind == "silent":
            print(f"silent #{index}: {m.seed}:{m.line}: {m.old} -> {m.new}", flush=True)
    print(", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    return 1 if counts["silent"] else 0


if __name__ == "__main__":
    sys.exit(main())
