"""The IR examples in the README parse and verify, so the documentation stays true."""

import re
from pathlib import Path

import pytest

from modeldsl.ir import make_context, parse_module, verify_module

README = Path(__file__).resolve().parents[2] / "README.md"
SNIPPETS = re.findall(r"```mlir\n(.*?)```", README.read_text(), re.S)


def test_readme_has_ir_examples():
    assert len(SNIPPETS) >= 2


@pytest.mark.parametrize("snippet", SNIPPETS)
def test_readme_ir_examples_verify(snippet):
    module, spans = parse_module(make_context(), snippet, "README.md")
    assert verify_module(module, spans) == []
