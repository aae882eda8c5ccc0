"""``hf_mapping`` keys name the model's parameters (seed 001 section 9.3's ``@hf_mapping.indexed`` and
the Module DSL's ``blocks[{layer}].w``): checked when the model lowers, each problem E010 at the key
(or the tensor name) with the closest name, before any checkpoint is read. And
``@hf_mapping.indexed("blocks", {...})`` is the same mapping as the ``blocks[{layer}].`` keys it
stands for: the std Python Llama with its block entries written that way lowers to the same IR."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from modeldsl.diagnostics import DiagnosticError, DiagnosticSink
from modeldsl.frontend.python import parse_python_source
from modeldsl.frontend.text.parser import parse_source
from modeldsl.ir import print_ir
from modeldsl.lower import lower_program

MODEL = '''\
block Layer(d: int, use_bias: bool = false):
  params:
    w: [d, d]
    bias: [d] if use_bias
    norm: Norm(d)
  forward:
    in: x: [B, d]
    out: [B, d]
    graph:
      x -> matmul(w, transpose=NT) -> out

module Norm(d: int):
  params:
    weight: [d]
  forward:
    in: x: [B, d]
    out: [B, d]
    graph:
      (x, weight) -> mul() -> out

model M(d: int = 4, n_layers: int = 2, first: int = 0):
  params:
    embedding: [16, d]
    blocks: [n_layers] x Layer(d)
    final: [d]
  forward:
    in: tokens: [B, int32]
    out: [B, d]
    graph:
      (tokens, embedding) -> embedding() -> x
      x -> blocks -> h
      (h, final) -> mul() -> out
  hf_mapping:
    embedding: "model.embed_tokens.weight"
    final: "model.norm.weight"
    blocks[{layer}].w: "model.layers.{layer + first}.weight"
    blocks[{layer}].bias?: "model.layers.{layer}.bias"
    blocks[{layer}].norm.weight: "model.layers.{layer}.norm.weight"
'''


def lowered(source: str):
    return lower_program(parse_source(source, "m.module"), "M", None, DiagnosticSink())


def problem(source: str):
    with pytest.raises(DiagnosticError) as err:
        lowered(source)
    (diagnostic,) = err.value.diagnostics
    return diagnostic


def test_keys_that_name_declared_parameters_lower_guarded_ones_included():
    assert "blocks[{layer}].bias?" in print_ir(lowered(MODEL))  # bias is declared under `if use_bias`


@pytest.mark.parametrize("old, new, message, hint, at", [
    ("blocks[{layer}].w:", "blokcs[{layer}].w:", "model M has no parameter 'blokcs'", "did you mean 'blocks'?",
     "blokcs[{layer}].w"),
    ("blocks[{layer}].w:", "blocks[{layer}].ww:", "'blocks' has no parameter 'ww'", "did you mean 'w'?",
     "blocks[{layer}].ww"),
    ("blocks[{layer}].norm.weight:", "blocks[{layer}].norm.wieght:", "'blocks.norm' has no parameter 'wieght'",
     "did you mean 'weight'?", "blocks[{layer}].norm.wieght"),
    ('final: "model', 'final[{layer}]: "model', "'final' is no stack, so [{layer}] indexes nothing",
     "index a stack's elements", "final[{layer}]"),
    ('final: "model', 'final.weight: "model', "'final' is a tensor, which has no parameter 'weight'", "its own path",
     "final.weight"),
    ("{layer + first}", "{layr + first}", "has '{layr + first}', but 'layr' is no index of the key",
     "did you mean 'layer'?", '"model.layers.{layr + first}'),
    ('final: "model.norm.weight"', 'final: "model.norm.{layer}"', "has '{layer}', but 'layer' is no index",
     "the key has no index", '"model.norm.{layer}"'),
])
def test_a_key_or_tensor_name_that_leaves_the_model_is_e010_at_it(old, new, message, hint, at):
    source = MODEL.replace(old, new)
    diagnostic = problem(source)
    assert diagnostic.code == "E010" and message in diagnostic.message and hint in diagnostic.hint, \
        diagnostic.render()
    index = source.index(at)
    line, column = source.count("\n", 0, index) + 1, index - source.rfind("\n", 0, index)
    assert (diagnostic.span.line, diagnostic.span.column) == (line, column) and "^" in diagnostic.render()


PYTHON = '''
from modeldsl.dsl import Array, Param, Tensor, block, forward, graph, hf_mapping, model


@block
class Layer:
    def __init__(self, d: int):
        pass

    w = Param(Tensor["d", "d"])

    @forward
    def forward(self, x: Tensor["B", "d"]) -> Tensor["B", "d"]:
        with graph() as g:
            out = g.matmul(x, "w", transpose="NT")
            return out


@model
@hf_mapping(embedding="model.embed_tokens.weight")
@hf_mapping.indexed("blocks", w="model.layers.{layer}.weight")
class M:
    def __init__(self, d: int = 4, n_layers: int = 2):
        pass

    embedding = Param(Tensor[16, "d"])
    blocks = Param(Array["n_layers", "Layer"])

    @forward
    def forward(self, tokens: Tensor["B", "int32"]) -> Tensor["B", "d"]:
        with graph() as g:
            x = g.embedding(tokens, "embedding")
            h = self.blocks(x)
            return h
'''


@pytest.mark.parametrize("old, new, message, hint, at", [
    ('indexed("blocks"', 'indexed("blokcs"', "model M has no parameter 'blokcs'", "did you mean 'blocks'?",
     'w="model.layers'),
    ('w="model.layers', 'ww="model.layers', "'blocks' has no parameter 'ww'", "did you mean 'w'?", "ww="),
    ("{layer}.weight", "{layr}.weight", "'layr' is no index of the key", "did you mean 'layer'?",
     '"model.layers.{layr}'),
])
def test_a_wrong_indexed_mapping_of_the_python_dsl_is_e010_at_its_entry(old, new, message, hint, at):
    source = PYTHON.replace(old, new)
    with pytest.raises(DiagnosticError) as err:
        lower_program(parse_python_source(source, "bad.py"), "M", None, DiagnosticSink())
    (diagnostic,) = err.value.diagnostics
    assert diagnostic.code == "E010" and message in diagnostic.message and hint in diagnostic.hint
    index = source.index(at)
    assert (diagnostic.span.line, diagnostic.span.column) == (source.count("\n", 0, index) + 1,
                                                              index - source.rfind("\n", 0, index))


LLAMA = Path(__file__).resolve().parents[2] / "modeldsl" / "std" / "python" / "models" / "llama.py"


def test_hf_mapping_indexed_is_the_mapping_of_the_keys_it_stands_for():
    """The std Python Llama's ``blocks[{layer}].`` entries moved into ``@hf_mapping.indexed("blocks", {...})``
    (seed 001 section 9.3) give the same IR, its hf_mapping included."""
    text = LLAMA.read_text()
    start = text.index("@hf_mapping({")
    end = text.index("})\n", start) + 3
    entries = text[start + len("@hf_mapping({"):end - 3]
    items = re.split(r'\n    (?=")', "\n" + entries.strip("\n"))
    top = [i for i in items if i.strip() and not i.lstrip().startswith('"blocks[{layer}].')]
    blocks = [i.replace('"blocks[{layer}].', '"', 1) for i in items if i.lstrip().startswith('"blocks[{layer}].')]
    assert len(blocks) == 10 and len(top) == 3
    rewritten = ("@hf_mapping({\n    " + "\n    ".join(t.strip() for t in top) + "\n})\n"
                 + '@hf_mapping.indexed("blocks", {\n    ' + "\n    ".join(b.strip() for b in blocks) + "\n})\n")
    indexed = text[:start] + rewritten + text[end:]

    def ir(source: str) -> str:
        module = lower_program(parse_python_source(source, str(LLAMA)), "Llama", None, DiagnosticSink())
        return re.sub(r'"[^"]*\.py:\d+:\d+"', '"LOC"', print_ir(module))

    original, moved = ir(text), ir(indexed)
    assert '"blocks[{layer}].mlp.down_bias?" = "model.layers.{layer}.mlp.down_proj.bias"' in moved
    assert moved == original
