"""Every Module DSL example of spec 000 that is a complete program lowers (issue 13).

A module, block or model of a fenced spec block is a complete program when its
forward: declares its inputs (``in:``) and a ``graph:``, and nothing of it is
left out (``...``, ``params...``). Each such declaration is lowered on its own
(the blocks of sections 10.x show std files without their imports, which the
std library supplies) and must verify. The examples the spec marks as errors
(``# E016: ...``) must fail with that code. A few complete programs stay
refused, each for a reason of the spec's own (REFUSED, with the code they get).
"""

from __future__ import annotations

import re
from dataclasses import fields

import pytest
from spec_blocks import spec_code_blocks

from modeldsl.diagnostics import DiagnosticError
from modeldsl.frontend.text import ast
from modeldsl.frontend.text.parser import parse_source
from modeldsl.ir import verify_module
from modeldsl.lower import lower_program

STD_IMPORTS = ("from std.modules.linear import Linear\nfrom std.modules.mlp import SwiGLU_MLP\n"
               "from std.modules.attention import GQA as CausalSelfAttention\n")
STD_SECTION = range(5875, 6041)  # spec 10.x: std files shown without their imports

TRANSPOSE = "writes x @ W^T as matmul(W, transpose=TN), which 6.1.1 defines as A^T @ B (the spec contradicts itself)"
UNTYPED_INTS = "writes integer inputs without a dtype, which makes them bf16 activations (spec 3.3)"
# (spec line of the block, declaration) -> (code, why the spec's own text refuses it)
REFUSED = {
    (874, "PartialBackward"): ("E014", "uses Linear, apply_mask and weight_grad, which the spec never declares"),
    (1213, "MoEExperts"): ("E015", UNTYPED_INTS),
    (1544, "SwiGLU_MLP"): ("E004", TRANSPOSE),
    (2013, "CausalSelfAttention"): ("E004", TRANSPOSE),
    (2858, "ComputeRMS"): ("E012", "add(eps) adds a scalar and sqrt() is no primitive of section 6"),
    (2944, "TokenEmbedding"): ("E015", UNTYPED_INTS),
    (3097, "MoEPermute"): ("E015", UNTYPED_INTS),
    (3295, "MambaBlock"): ("E004", TRANSPOSE),
    (5911, "Linear"): ("E004", TRANSPOSE),
    (5939, "SwiGLU_MLP"): ("E004", TRANSPOSE),
}
MARK = re.compile(r"^\s*[^#\s].*#.*\b(E\d{3})\b", re.M)  # a code in a comment after code


def _left_out(node) -> bool:
    """Whether a node holds the spec's ``...`` placeholder (or a ``params...`` rest)."""
    stack = [node]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.EllipsisLit, ast.Splat)) or isinstance(node, ast.Param) and node.rest:
            return True
        if isinstance(node, list):
            stack += node
        elif isinstance(node, ast.Node):
            stack += [getattr(node, f.name) for f in fields(node) if f.name != "span"]
    return False


def is_complete(decl: ast.Decl) -> bool:
    forward = decl.sections("forward")
    names = {s.name for s in forward[0].body if isinstance(s, ast.Section)} if forward else set()
    return {"in", "graph"} <= names and not _left_out(decl.body) and not _left_out(decl.params or [])


def complete_programs() -> list[tuple[int, str, str]]:
    """(spec line, declaration name, program text) of every complete program of the spec."""
    found = []
    for line, text in spec_code_blocks():
        try:
            program = parse_source(text, f"spec{line}.module")
        except DiagnosticError:
            continue  # pseudocode; test_parser checks these
        found += [(line, d.name, text) for d in program.declarations
                  if d.kind in ("module", "block", "model") and is_complete(d)]
    return found


def marked_errors() -> list[tuple[int, str, str, str]]:
    """(spec line, declaration, code, text) of the lowerable examples the spec marks ``# EXXX``."""
    found = []
    for line, text in spec_code_blocks():
        codes = MARK.findall(text)
        if not codes:
            continue
        try:
            program = parse_source(text, f"spec{line}.module")
        except DiagnosticError:
            continue  # E023's block is pseudocode; E025's example is commented out
        found += [(line, d.name, codes[0], text) for d in program.declarations
                  if d.kind in ("module", "block", "model")]
    return found


def lower_example(line: int, name: str, text: str) -> list[str]:
    """The error codes of lowering one declaration of a spec block ([] when it lowers and verifies)."""
    prelude = STD_IMPORTS if line in STD_SECTION else ""
    try:
        module = lower_program(parse_source(prelude + text, f"spec{line}.module"), name)
    except DiagnosticError as err:
        return [d.code for d in err.diagnostics if d.code.startswith("E")]
    assert verify_module(module) == [], (line, name)
    return []


PROGRAMS = complete_programs()


def test_the_spec_has_the_complete_programs_this_test_expects():
    keys = {(line, name) for line, name, _ in PROGRAMS}
    assert len(PROGRAMS) >= 30
    assert set(REFUSED) <= keys, set(REFUSED) - keys


@pytest.mark.parametrize("line, name, text", PROGRAMS, ids=[f"{line}-{name}" for line, name, _ in PROGRAMS])
def test_every_complete_spec_program_lowers(line, name, text):
    codes = lower_example(line, name, text)
    if (line, name) in REFUSED:
        code, why = REFUSED[(line, name)]
        assert code in codes, f"spec line {line} {name} should be refused with {code} ({why}), got {codes}"
    else:
        assert codes == [], f"spec line {line} {name} does not lower: {codes}"


@pytest.mark.parametrize("line, name, code, text", marked_errors(), ids=lambda v: str(v)[:20])
def test_spec_examples_marked_as_errors_fail_with_the_spec_code(line, name, code, text):
    assert code in lower_example(line, name, text)
