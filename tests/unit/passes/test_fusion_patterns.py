"""The fusion pattern names have one source (``modeldsl.dialects.fusion_patterns``): the fusion
pass's pattern classes, the annotations' hints and the frontend's E013 checks agree with it, and
the checks import no pass."""

from __future__ import annotations

import subprocess
import sys

from modeldsl.dialects.annotations import FUSION_PATTERNS
from modeldsl.dialects.fusion_patterns import KNOWN, PASS_PATTERNS, SPEC_PATTERNS
from modeldsl.passes.fuse import PATTERNS
from modeldsl.resolve.annotation_checks import PATTERN_OPS, pass_patterns


def test_the_fusion_pass_implements_the_listed_patterns_in_their_order():
    assert list(PATTERNS) == list(PASS_PATTERNS)
    for name, classes in PATTERNS.items():
        assert all(cls.name == name for cls in classes), name
        assert classes[0].primitives == PASS_PATTERNS[name], name


def test_the_annotations_and_the_frontend_checks_read_the_one_table():
    assert FUSION_PATTERNS == tuple(SPEC_PATTERNS)
    assert PATTERN_OPS == SPEC_PATTERNS and pass_patterns() == PASS_PATTERNS
    assert set(KNOWN) == set(SPEC_PATTERNS) | set(PASS_PATTERNS) and len(KNOWN) == len(set(KNOWN))


def test_the_frontend_checks_import_no_fusion_pass():
    script = ("import sys, modeldsl.resolve.annotation_checks\n"
              "print(any(m.startswith('modeldsl.passes') for m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
