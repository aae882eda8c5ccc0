"""No misspelled or swapped word of the language is accepted and ignored (see ``name_mutants``).

A fixed sample of mutants runs here; ``python tests/unit/name_mutants.py --seed N --count M`` runs
a campaign of any size.
"""

from __future__ import annotations

import random
from contextlib import contextmanager
from unittest import mock

import name_mutants
import pytest
from name_mutants import Mutant, in_a_branch, mutant, mutants, outcome, seeds, sites

SAMPLE = mutants(seed=7, count=150)


@contextmanager
def patch_seeds(table: dict[str, str]):
    with mock.patch.object(name_mutants, "seeds", lambda: tuple(table.items())):
        yield


@pytest.mark.parametrize("index", range(len(SAMPLE)))
def test_a_mutated_word_is_refused_warned_or_changes_the_ir(index):
    m = SAMPLE[index]
    assert outcome(m) != "silent", f"{m.seed}:{m.line}: '{m.old}' -> '{m.new}' was accepted and ignored"


def test_the_seeds_span_both_dsls_the_whole_std_library_and_the_spec():
    names = {name for name, _ in seeds()}
    std = {str(p.relative_to(name_mutants.ROOT)) for p in (name_mutants.ROOT / "modeldsl/std").rglob("*")
           if p.suffix == ".module" or p.suffix == ".py" and "python" in p.parts and p.name != "__init__.py"}
    assert std - names == set()  # a check that refuses a std file would drop it from the seeds
    assert sum(n.startswith("spec:") for n in names) >= 50


def test_a_tensor_named_like_a_section_is_no_site():
    text = "primitive p:\n  forward:\n    out: (\n      out: [B, D],\n      lse: [B]\n    )\n"
    words = [text[s.start:s.end] for s in sites("p.module", text)]
    assert words == ["forward", "out"]  # the section out:, not the tensor out inside ( )


def test_names_a_program_chooses_are_no_sites():
    text = "module M():\n  params:\n    save: [4]\n  forward:\n    save: [h]  # recompute: h\n"
    words = [text[s.start:s.end] for s in sites("m.module", text)]
    assert words == ["params", "forward", "save"]


def test_a_mutant_replaces_one_word_and_keeps_the_rest():
    m: Mutant = mutant(random.Random(0))
    original = dict(seeds())[m.seed]
    before, after = original.split("\n"), m.text.split("\n")
    assert m.old != m.new and len(before) == len(after)
    assert [i + 1 for i, (a, b) in enumerate(zip(before, after)) if a != b] == [m.line]
    assert m.old in before[m.line - 1] and m.new in after[m.line - 1]


def test_a_silent_mutant_is_reported():
    name, text = next((n, t) for n, t in seeds() if "# " in t and not n.endswith(".py"))
    same = Mutant(name, text + "\n# a comment\n", "x", "y", 1)
    assert outcome(same) == "silent"


BRANCHED = """module M(d: int = 8, gated: bool = false):
  params:
    w: [d, d]
  forward:
    in: x: [B, d]
    out: [B, d]
    graph:
      x -> matmul(w, transpose=NT) -> h
      if gated:
        h -> relu() -> out @nofuse
      else:
        h -> silu() -> out
"""


def test_a_swap_in_an_untaken_branch_is_untaken_and_a_typo_there_is_refused():
    at = BRANCHED.index("@nofuse") + 1
    assert in_a_branch(BRANCHED, at) and not in_a_branch(BRANCHED, BRANCHED.index("matmul"))
    name = "branched.module"
    with_seed = {**dict(seeds()), name: BRANCHED}
    swap = Mutant(name, BRANCHED.replace("@nofuse", "@barrier"), "nofuse", "barrier", 10, branch_swap=True)
    typo = Mutant(name, BRANCHED.replace("@nofuse", "@nofsue"), "nofuse", "nofsue", 10)
    with patch_seeds(with_seed):
        assert outcome(swap) == "untaken"
        assert outcome(typo) == "refused"
