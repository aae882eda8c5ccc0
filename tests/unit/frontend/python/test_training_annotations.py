"""``@gradient``, ``@trainable(grad_clip=)`` and ``@assert`` in the Python DSL: keywords of a step
(``gradient=``, ``assert_=``: ``assert`` is a Python keyword) and of ``Param`` lower to the IR of
their Module DSL twin; an ``@assert``'s condition and message are text, as written."""

from __future__ import annotations

import re
import textwrap

import pytest

from modeldsl.diagnostics import DiagnosticError, DiagnosticSink
from modeldsl.frontend.read import read_model
from modeldsl.ir import print_ir
from modeldsl.lower import lower_program

PYTHON = '''
from modeldsl.dsl import Param, Tensor, forward, graph, module


@module
class A:
    def __init__(self, d: int = 4):
        pass

    w = Param(Tensor["d", "d"], trainable={"grad_clip": 1.0})
    v = Param(Tensor["d", "d"], gradient={"scale": 0.5})

    @forward
    def forward(self, x: Tensor["B", "d"]) -> Tensor["B", "d"]:
        with graph() as g:
            h = g.matmul(x, "w", transpose="NT", gradient=("accumulate", {"clip": 0.5}),
                         assert_=("!has_nan(h) && all(h > -1e4)", "NaN in h"))
            out = g.matmul(h, "v", transpose="NT", assert_={"condition": "all(out <= 100.0)", "message": "big"})
'''

TEXT = '''
module A(d: int = 4):
  params:
    w: [d, d] @trainable(grad_clip=1.0)
    v: [d, d] @gradient(scale=0.5)
  forward:
    in: x: [B, d]
    out: [B, d]
    graph:
      x -> matmul(w, transpose=NT) -> h @gradient(accumulate, clip=0.5)
        @assert(!has_nan(h) && all(h > -1e4), "NaN in h")
      h -> matmul(v, transpose=NT) -> out @assert(condition="all(out <= 100.0)", message="big")
'''


def ir_of(path) -> str:
    return re.sub(r" loc\([^)]*\)", "", print_ir(lower_program(read_model(path)[0], "A", None, DiagnosticSink())))


def test_the_python_annotations_are_their_text_twins(tmp_path):
    (tmp_path / "a.py").write_text(PYTHON)
    (tmp_path / "a.module").write_text(textwrap.dedent(TEXT))
    python, text = ir_of(tmp_path / "a.py"), ir_of(tmp_path / "a.module")
    assert python == text
    assert '#mdsl.graph.assert<"!has_nan(h) && all(h > -10000)", "NaN in h">' in text
    assert "#mdsl.graph.gradient<accumulate, clip = 0.5>" in text and "#mdsl.graph.trainable<grad_clip = 1.0>" in text


def test_a_bad_python_condition_is_e008_at_the_step(tmp_path):
    (tmp_path / "a.py").write_text(PYTHON.replace("!has_nan(h) && all(h > -1e4)", "has_nan(h)"))
    with pytest.raises(DiagnosticError) as failed:
        lower_program(read_model(tmp_path / "a.py")[0], "A", None, DiagnosticSink())
    (diagnostic,) = failed.value.errors
    assert diagnostic.code == "E008" and "'has_nan(...)' asserts the tensor holds a nan" in diagnostic.message
    assert (diagnostic.span.line, diagnostic.span.column) == (17, 26)  # the assert_= keyword
