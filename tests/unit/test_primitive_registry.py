"""The one coverage test of the primitives: every op of ``PRIMITIVE_OPS`` against every table it must have.

A primitive's facts are its record in :mod:`modeldsl.prims` (keyed by the op class, one module per
family); its kernels live in :mod:`modeldsl.kernels` under its name. This test holds the two
together: a record per op, a shape rule and a FLOP rule, a VJP rule for every forward op (or the
reason it has none) and none for a backward op, a numpy reference, the CUDA launch plan its record
says it has (and no plan it does not claim), the fast CPU kernel likewise, a std declaration, and
reuse, inference parameters, fusion kinds and training attributes that fit the op.
"""

from __future__ import annotations

import re

import pytest

from modeldsl.dialects.graph_primitives import PRIMITIVE_OPS
from modeldsl.frontend.text.parser import parse_source
from modeldsl.kernels import cuda
from modeldsl.kernels.cpu import CPU_KERNELS, JIT_KERNELS
from modeldsl.kernels.reference import REFERENCES
from modeldsl.primitives import lookup_primitive
from modeldsl.prims import by_name, registry
from modeldsl.resolve.annotation_checks import PATTERN_OPS
from modeldsl.resolve.imports import STD_ROOT

# the kinds of operation spec 7.5.1's patterns name (attention_softmax: Scale + Softmax + Dropout)
FUSION_KINDS = {kind for kinds in PATTERN_OPS.values() for kind in kinds} | {"dropout"}


def std_declared() -> set[str]:
    """Every primitive std/primitives declares: its own name, and NAME_backward where its backward:
    section describes that op (in:/out:)."""
    names = set()
    for path in sorted((STD_ROOT / "primitives").glob("*.module")):
        if re.search(r"\.v\d+\.module$", path.name):
            continue
        for decl in parse_source(path.read_text(), str(path)).declarations:
            names.add(decl.name)
            sections = [s for b in decl.sections("backward") for s in b.body
                        if getattr(s, "name", None) in ("in", "out")]
            if sections and sections[-1].value.default is None:
                names.add(f"{decl.name}_backward")
    return names


OPS = sorted(PRIMITIVE_OPS, key=lambda op: op.name)
DECLARED = std_declared()


def test_one_record_per_op_and_no_other():
    assert set(registry()) == set(PRIMITIVE_OPS)
    assert len(by_name()) == len(PRIMITIVE_OPS)


def test_no_record_or_declaration_without_an_op():
    assert sorted(DECLARED - set(by_name())) == []


@pytest.mark.parametrize("op", OPS, ids=lambda op: op.name.removeprefix("mdsl.graph."))
def test_every_table(op):
    entry = registry()[op]
    name, sig = entry.name, lookup_primitive(entry.name)
    assert callable(entry.infer) and callable(entry.flops)
    if sig.is_backward:
        assert entry.vjp is None and not entry.no_vjp, f"{name}: a backward op has no VJP rule"
    else:
        assert (entry.vjp is not None) != bool(entry.no_vjp), f"{name}: a VJP rule, or the reason it has none"
    assert name in REFERENCES, f"{name} has no numpy reference"
    assert (entry.cuda == "kernel") == (name in cuda.PRIMITIVES), f"{name}: cuda={entry.cuda!r} and the CUDA table"
    assert entry.cpu == (name in CPU_KERNELS or name in JIT_KERNELS), f"{name}: cpu={entry.cpu} and the CPU kernels"
    assert name in DECLARED, f"{name} is not declared in std/primitives"
    assert all(0 <= o < len(sig.outputs) and 0 <= i < len(sig.inputs) for o, i in entry.reuse.items())
    attributes = {p.name for p in sig.params}
    # the result type's shape and dtype (no attributes), then attributes in positional order (fill's value)
    assert set(entry.inference_params) <= attributes | {"shape", "dtype"}, name
    assert set(entry.fusion_kinds) <= FUSION_KINDS
    assert set(entry.training) <= attributes
    if entry.accumulates:
        assert len(sig.outputs) == 1
