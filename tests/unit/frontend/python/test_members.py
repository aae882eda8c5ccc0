"""The members of a Python DSL class its sections 4, 6, 9 and 10 spell: ``@param`` methods, stacks
of a block named by a string, ``Param(hf_mapping=)``, ``@hf_mapping.indexed`` and gradient slots,
each the IR of its Module DSL twin or a coded diagnostic at its place."""

from __future__ import annotations

import textwrap

import pytest

from tests.unit.frontend.python.twins import assert_twins, at, first_problem

HEADER = ("from modeldsl.dsl import Activation, Array, Gradient, Param, Tensor, block, forward, graph, hf_mapping, "
          "model, module, param, tied_to\n\n\n")


def test_method_style_parameters_are_their_class_attribute_twins(tmp_path):
    assert_twins(tmp_path, HEADER + '''
@model
class M:
    def __init__(self, d: int = 4, vocab: int = 16, use_bias: bool = False):
        pass

    @param
    def embedding(self) -> Tensor["vocab", "d"]:
        ...

    @param(condition=lambda self: self.use_bias)
    def bias(self) -> Tensor["d"]:
        """Only with use_bias."""

    @param(frozen=True)
    def table(self) -> Tensor["d", "d"]:
        ...

    @param
    @tied_to("embedding")
    def lm_head(self) -> Tensor["vocab", "d"]:
        ...

    @forward
    def forward(self, tokens: Tensor["B", "T", "int32"]) -> Tensor["B", "T", "vocab"]:
        with graph() as g:
            x = g.embedding(tokens, "embedding")
            h = g.matmul(x, "table", transpose="NT")
            logits = g.matmul(h, "lm_head", transpose="NT")
            return logits
''', '''
model M(d: int = 4, vocab: int = 16, use_bias: bool = false):
  params:
    embedding: [vocab, d]
    bias: [d] if use_bias
    table: [d, d] @frozen
    lm_head: tied_to(embedding)
  forward:
    inputs:
      tokens: [B, T, int32]
    out: logits: [B, T, vocab]
    graph:
      (tokens, embedding) -> embedding() -> x
      (x, table) -> matmul(transpose=NT) -> h
      (h, lm_head) -> matmul(transpose=NT) -> logits
''', "M")


BLOCK = '''
@block
class Blk:
    def __init__(self, d: int, eps: float = 1e-6, width: int = 2):
        pass

    w = Param(Tensor["d"])

    @forward
    def forward(self, x: Tensor["B", "d"]) -> Tensor["B", "d"]:
        with graph() as g:
            out = g.mul(x, "w")
'''

BLOCK_TWIN = '''
block Blk(d: int, eps: float = 1e-6, width: int = 2):
  params:
    w: [d]
  forward:
    inputs:
      x: [B, d]
    out: [B, d]
    graph:
      (x, w) -> mul() -> out
'''

MODEL = '''
@model
class M:
    def __init__(self, d: int = 4, n_layers: int = 3, eps: float = 1e-5):
        pass

    blocks = Param(Array["n_layers", {element}])

    @forward
    def forward(self, x: Tensor["B", "d"]) -> Tensor["B", "d"]:
        with graph() as g:
            y = self.blocks(x)
            return y
'''

MODEL_TWIN = '''
model M(d: int = 4, n_layers: int = 3, eps: float = 1e-5):
  params:
    blocks: [n_layers] x Blk(d=d, eps=eps)
  forward:
    inputs:
      x: [B, d]
    out: y: [B, d]
    graph:
      x -> blocks -> y
'''


@pytest.mark.parametrize("element", ['"Blk"', "Blk"])
def test_a_stack_of_a_block_named_by_a_string_binds_its_parameters_by_name(tmp_path, element):
    """``Array["n_layers", "Blk"]``: Blk's parameters that the model also has (d, eps) are bound to
    them; its others keep their defaults."""
    assert_twins(tmp_path, HEADER + BLOCK + MODEL.replace("{element}", element), BLOCK_TWIN + MODEL_TWIN, "M")


def test_a_block_named_by_a_string_may_be_imported(tmp_path):
    (tmp_path / "blocks.py").write_text(HEADER + BLOCK)
    (tmp_path / "blocks_twin.module").write_text(textwrap.dedent(BLOCK_TWIN))
    python = HEADER + "from .blocks import Blk\n" + MODEL.replace("{element}", '"Blk"')
    assert_twins(tmp_path, python, "from blocks_twin import Blk\n" + MODEL_TWIN, "M")


def test_a_parameter_the_model_lacks_is_e012_at_the_string():
    source = HEADER + BLOCK.replace("d: int,", "d: int, depth: int,") + MODEL.replace("{element}", '"Blk"')
    diagnostic = first_problem(source, "M")
    assert diagnostic.code == "E012" and "'depth'" in diagnostic.message and at(diagnostic, source, 'Blk"]')


MAPPED = '''
@model
@hf_mapping(final="model.norm.weight")
@hf_mapping.indexed("blocks", w="model.layers.{layer}.weight")
class M:
    def __init__(self, d: int = 4, n_layers: int = 3, vocab: int = 16):
        pass

    embedding = Param(Tensor["vocab", "d"], hf_mapping="model.embed_tokens.weight")
    final = Param(Tensor["d"])
    blocks = Param(Array["n_layers", Blk("d")])

    @forward
    def forward(self, tokens: Tensor["B", "int32"]) -> Tensor["B", "d"]:
        with graph() as g:
            x = g.embedding(tokens, "embedding")
            h = self.blocks(x)
            y = g.mul(h, "final")
            return y
'''

MAPPED_TWIN = '''
model M(d: int = 4, n_layers: int = 3, vocab: int = 16):
  params:
    embedding: [vocab, d]
    final: [d]
    blocks: [n_layers] x Blk(d)
  forward:
    inputs:
      tokens: [B, int32]
    out: y: [B, d]
    graph:
      (tokens, embedding) -> embedding() -> x
      x -> blocks -> h
      (h, final) -> mul() -> y
  hf_mapping:
    final: "model.norm.weight"
    blocks[{layer}].w: "model.layers.{layer}.weight"
    embedding: "model.embed_tokens.weight"
'''


def test_hf_mapping_indexed_and_a_parameters_hf_mapping_join_the_models_mapping(tmp_path):
    ir = assert_twins(tmp_path, HEADER + BLOCK + MAPPED, BLOCK_TWIN + MAPPED_TWIN, "M")
    assert "model.layers.{layer}.weight" in ir and "model.embed_tokens.weight" in ir


def test_hf_block_mappings_are_the_blocks_stacks_indexed_mapping(tmp_path):
    python = MAPPED.replace('@hf_mapping.indexed("blocks", w="model.layers.{layer}.weight")\n', "").replace(
        '    final = Param(Tensor["d"])', '    final = Param(Tensor["d"])\n    _hf_block_mappings_ = {"w": '
        '"model.layers.{layer}.weight"}')
    twin = MAPPED_TWIN.replace('''    blocks[{layer}].w: "model.layers.{layer}.weight"
    embedding: "model.embed_tokens.weight"''', '''    blocks[{layer}].w: "model.layers.{layer}.weight"
    embedding: "model.embed_tokens.weight"''')
    assert_twins(tmp_path, HEADER + BLOCK + python, BLOCK_TWIN + twin, "M")


@pytest.mark.parametrize("change, code, place", [
    (('final = Param(Tensor["d"])', 'final = Param(Tensor["d"], hf_mapping="x")'), "E010", 'hf_mapping="x"'),
    (('@hf_mapping.indexed(', '@hf_mapping.indexd('), "E008", "hf_mapping.indexd"),
    (('@hf_mapping.indexed("blocks", ', '@hf_mapping.indexed('), "E001", "hf_mapping.indexed"),
])
def test_a_wrong_mapping_is_reported_at_its_place(change, code, place):
    source = HEADER + BLOCK + MAPPED.replace(*change)
    diagnostic = first_problem(source, "M")
    assert diagnostic.code == code and at(diagnostic, source, place), diagnostic.render()
    if code == "E008":
        assert "did you mean @hf_mapping.indexed?" in diagnostic.hint


def test_a_mapping_on_a_block_is_e010():
    source = HEADER + BLOCK.replace('w = Param(Tensor["d"])', 'w = Param(Tensor["d"], hf_mapping="x.weight")') + \
        MAPPED
    diagnostic = first_problem(source, "M")
    assert diagnostic.code == "E010" and "block has no HuggingFace mapping" in diagnostic.message
    assert at(diagnostic, source, 'hf_mapping="x.weight"')


SLOTS = '''
@module
class Norm2:
    def __init__(self, d: int, eps: float = 1e-6):
        pass

    weight = Param(Tensor["d"])
    {slots}

    @forward
    def forward(self, x: Tensor["B", "T", "d"]) -> Tensor["B", "T", "d"]:
        with graph() as g:
            h, rstd = g.rmsnorm(x, "weight", eps=self.eps)
            y = g.silu(h)
            out = g.mul(y, "weight")
'''

SLOTS_TWIN = '''
module Norm2(d: int, eps: float = 1e-6):
  params:
    weight: [d]
  forward:
    inputs:
      x: [B, T, d]
    out: [B, T, d]
    graph:
      (x, weight) -> rmsnorm(eps=eps) -> (h, rstd)
      h -> silu() -> [B, T, d] -> y
      (y, weight) -> mul() -> out
'''


def test_gradient_slots_check_their_tensors_type_where_the_forward_writes_it(tmp_path):
    slots = ('d_y = Gradient(Tensor["B", "T", "d"], gradient_of="y", scope="gradient", description="of y")\n'
             '    d_h = Gradient(Tensor["B", "T", "d"], gradient_of="h", when="eps")\n'
             '    d_x = Gradient(Tensor["B", "T", "d"], gradient_of="x")')
    assert_twins(tmp_path, HEADER + SLOTS.replace("{slots}", slots), SLOTS_TWIN, "Norm2", {"d": 4})


@pytest.mark.parametrize("slot, code, message, place", [
    ('d_y = Gradient(Tensor["B", "T", "2 * d"], gradient_of="y")', "E004", "not the stated",
     'Tensor["B", "T", "2 * d"]'),
    ('d_x = Gradient(Tensor["B", "d"], gradient_of="x")', "E018", "the gradient of 'x'", 'Tensor["B", "d"]'),
    ('d_y = Gradient(Tensor["B", "T", "d"], gradient_of="yy")', "E002", "neither takes nor writes", 'yy"'),
    ('d_y = Gradient(Tensor["B", "T", "d"])', "E012", "names no tensor", "Gradient("),
    ('d_y = Gradient(Tensor["B", "T", "d"], gradient_of="y", dtype="fp32")', "E001", "takes no 'dtype'", "dtype="),
    ('d_y = Gradient(Tensor["B", "T", "d"], gradient_of="y", scope="block")', "E001", "scope", '"block"'),
])
def test_a_wrong_gradient_slot_is_reported_at_its_place(slot, code, message, place):
    source = HEADER + SLOTS.replace("{slots}", slot)
    diagnostic = first_problem(source, "Norm2", {"d": 4})
    assert diagnostic.code == code and message in diagnostic.message and at(diagnostic, source, place), \
        diagnostic.render()
    if code == "E002":
        assert "did you mean 'y'?" in diagnostic.hint


def test_an_activation_and_a_gradient_slot_of_one_tensor_both_state_its_type(tmp_path):
    slots = ('y = Activation(Tensor["B", "T", "d"])\n'
             '    d_y = Gradient(Tensor["B", "T", "d"], gradient_of="y")')
    twin = SLOTS_TWIN.replace("h -> silu() -> [B, T, d] -> y", "h -> silu() -> [B, T, d] -> [B, T, d] -> y")
    assert_twins(tmp_path, HEADER + SLOTS.replace("{slots}", slots), twin, "Norm2", {"d": 4})
