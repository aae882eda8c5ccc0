"""The Module DSL parser: every construct of the spec, its examples, and syntax errors."""

import random
import re

import pytest
from spec_blocks import SHARED_SPEC, SPEC, spec_code_blocks

from modeldsl.diagnostics import DiagnosticError
from modeldsl.frontend.text import ast
from modeldsl.frontend.text.parser import parse_source


def test_the_vendored_spec_is_the_shared_one():
    if not SHARED_SPEC.exists():
        pytest.skip("the shared seeds are not beside the repository")
    assert SPEC.read_text() == SHARED_SPEC.read_text()


def test_every_program_of_spec_sections_10_and_11_parses():
    blocks = spec_code_blocks(first_line=5875)
    assert len(blocks) >= 7
    for line, text in blocks:
        program = parse_source(text, f"spec:{line}")
        assert program.declarations, f"block at spec line {line} has no declaration"


# Blocks of the spec that are prose or pseudocode, not DSL: each is rejected with E001.
PSEUDOCODE = {"module    block     model", "models.llama.Attention(...)", "for i in range",
              "x must be contiguous", "if not contiguous, else no-op"}


def test_every_dsl_block_of_the_spec_parses_or_is_pseudocode_with_a_located_e001():
    parsed = rejected = 0
    for line, text in spec_code_blocks():
        try:
            parse_source(text, f"spec:{line}")
            parsed += 1
        except DiagnosticError as err:
            (diag,) = err.diagnostics
            assert diag.code == "E001" and diag.span is not None
            assert any(p in diag.span.source.line(diag.span.line) for p in PSEUDOCODE), diag.render()
            rejected += 1
    assert parsed >= 119 and rejected <= 5


def parse_decl(text: str) -> ast.Decl:
    (decl,) = parse_source(text).declarations
    return decl


def section(body: list, name: str) -> ast.Section:
    return next(s for s in body if isinstance(s, ast.Section) and s.name == name)


def graph_of(decl: ast.Decl) -> list:
    return section(section(decl.body, "forward").body, "graph").body


MODULE = '''
module M(d: int, n: int = 2, use_bias: bool = false):
  """Doc string."""
  let:
    h = d // n
    constraint:
      d % n == 0, "d must divide"
  params:
    w: [d, d] @shard(column, tp_size=4) @frozen
    b: [d] if use_bias
    +extra: [n, 2, d // n]
  forward:
    in: x: [B, T, d]
    out: [B, T, d]
    graph:
      x -> matmul(w, transpose=NT) -> y
        @hook(AfterQKVProjection, mode=modify)
      if use_bias:
        (y, b) -> add() -> out
      else:
        y -> out
    save: [x]
'''


def test_module_structure_and_spans():
    decl = parse_decl(MODULE)
    assert (decl.kind, decl.name, decl.doc) == ("module", "M", "Doc string.")
    assert [p.name for p in decl.params] == ["d", "n", "use_bias"]
    assert isinstance(decl.params[1].default, ast.Int) and decl.params[1].default.value == 2
    assert (decl.span.line, decl.span.column) == (2, 1)
    let = section(decl.body, "let")
    assert isinstance(let.body[0], ast.Binding) and let.body[0].name == "h"
    constraint = section(let.body, "constraint").body[0]
    assert isinstance(constraint, ast.Constraint) and constraint.message == "d must divide"
    params = section(decl.body, "params").body
    assert [a.name for a in params[0].value.annotations] == ["shard", "frozen"]
    assert params[0].value.annotations[0].args[1].name == "tp_size"
    assert isinstance(params[1].value.guard, ast.Name)
    assert params[2].added and params[2].name == "extra"


def test_continuation_lines_join_the_flow_they_follow():
    flow, conditional = graph_of(parse_decl(MODULE))
    assert isinstance(flow, ast.Flow)
    assert [type(e).__name__ for e in flow.chain] == ["Name", "Call", "Name"]
    assert flow.annotations[0].name == "hook" and flow.annotations[0].span.line == 17
    assert isinstance(conditional, ast.If) and conditional.orelse is not None


@pytest.mark.parametrize(
    "flow, kinds",
    [
        ("x -> y", ["Name", "Name"]),
        ("(a, b) -> add() -> (c, _)", ["TupleExpr", "Call", "TupleExpr"]),
        ("saved.x -> relu() -> y", ["Attribute", "Call", "Name"]),
        ("x[0] -> y", ["Index", "Name"]),
        ("x[:, :T] -> y", ["Index", "Name"]),
        ("x[..., -1] -> y", ["Index", "Name"]),
        ("zeros([B, T, d]) -> r0", ["Call", "Name"]),
        ("ln_out -> attention -> attn_out", ["Name", "Name", "Name"]),
        ("(d, saved.x, mlp) -> mlp.backward() -> (dx, dp)", ["TupleExpr", "Call", "TupleExpr"]),
        ("x -> scale(1.0 / sqrt(d)) -> y", ["Name", "Call", "Name"]),
        ("r -> router() -> (w, i, aux @gradient(skip))", ["Name", "Call", "TupleExpr"]),
    ],
)
def test_data_flow_forms(flow, kinds):
    decl = parse_decl(f"module M():\n  forward:\n    graph:\n      {flow}\n")
    (stmt,) = graph_of(decl)
    assert [type(e).__name__ for e in stmt.chain] == kinds


def test_slices_and_ellipsis():
    decl = parse_decl("module M():\n  forward:\n    graph:\n      x[:, :T, ..., -1] -> y\n")
    index = graph_of(decl)[0].chain[0]
    s0, s1, s2, s3 = index.subscripts
    assert isinstance(s0, ast.Slice) and s0.lower is None and s0.upper is None
    assert isinstance(s1, ast.Slice) and isinstance(s1.upper, ast.Name)
    assert isinstance(s2, ast.EllipsisLit)
    assert isinstance(s3, ast.Unary) and s3.op == "-"


@pytest.mark.parametrize("array", ["[n_layers] x Block(d, h)", "[n_layers] × Block(d, h)", "Array<n_layers, Block>"])
def test_array_types(array):
    decl = parse_decl(f"model M(n_layers: int):\n  params:\n    blocks: {array}\n")
    value = section(decl.body, "params").body[0].value.expr
    assert isinstance(value, ast.ArrayType)
    assert isinstance(value.count, ast.Name) and value.count.id == "n_layers"


def test_x_stays_a_name_everywhere_else():
    decl = parse_decl("module M():\n  forward:\n    in: x: [B, x]\n    graph:\n      x -> f(x) -> y\n")
    flow = graph_of(decl)[0]
    assert flow.chain[0] == ast.Name(None, "x")


def test_imports():
    program = parse_source(
        "import std.primitives.matmul.v1\n"
        "import std.modules.attention.v2 as Attn\n"
        "import std.modules.{Linear, SwiGLU_MLP}\n"
        "from models.qwen import QwenMLP as MLP, Other\n"
    )
    a, b, c, d = program.imports
    assert a.path == ["std", "primitives", "matmul", "v1"] and a.alias is None
    assert b.alias == "Attn"
    assert c.path == ["std", "modules"] and c.names == ["Linear", "SwiGLU_MLP"]
    assert d.path == ["models", "qwen"] and d.items == [("QwenMLP", "MLP"), ("Other", None)]


def test_weight_mapping_sections():
    decl = parse_decl(
        '''model M():
  params:
    embedding: [V, d]
    lm_head: tied_to(embedding)
  hf_config:
    architecture: "LlamaForCausalLM"
    param_mapping:
      d: hidden_size
  hf_mapping:
    embedding: "model.embed_tokens.weight"
    blocks[{i}].attention.qkv_weight: fuse(
      "model.layers.{i}.q.weight",
      "model.layers.{i}.k.weight",
      dim=0
    )
    blocks[{layer}].qkv_bias?: "model.layers.{layer}.bias"
    blocks[{layer}].mamba.A_log: transform("model.layers.{layer}.A_log", fn: negate_exp)
  hf_export:
    blocks[{layer}].attention.qkv_weight -> split(
      "q.weight": [0, q_dim],
      "k.weight": [q_dim, q_dim + kv_dim],
      dim=0
    )
'''
    )
    mapping = section(decl.body, "hf_mapping").body
    fuse = mapping[1].value.expr
    assert isinstance(fuse, ast.Call) and [a.name for a in fuse.args] == [None, None, "dim"]
    key = mapping[1].key
    assert isinstance(key, ast.Attribute) and isinstance(key.base.base.subscripts[0], ast.Placeholder)
    assert isinstance(mapping[2].key, ast.Optional_)
    transform = mapping[3].value.expr
    assert transform.args[1].style == ":" and transform.args[1].name == "fn"
    export = section(decl.body, "hf_export").body[0]
    split = export.chain[1]
    assert [a.style for a in split.args] == ["str:", "str:", "="]
    hf_config = section(decl.body, "hf_config").body
    assert isinstance(hf_config[0].value.expr, ast.Str)
    assert section(hf_config, "param_mapping").body[0].name == "d"


def test_block_pattern_primitive_and_recipe():
    program = parse_source(
        '''block B(d: int):
  params:
    norm1: RMSNormParams
  pattern: sequential_residual
    sublayers:
      - (norm1, sublayer1)
      - (norm2, sublayer2)

primitive matmul:
  """C = A @ B."""
  params:
    transpose: enum(NN, NT, TN, TT) = NN
  forward:
    in: (A: [M, K], B: [K, N])
    out: C: [M, N]
  backward:
    d_A = matmul(d_C, B, transpose=NT)
  impl:
    forward: kernels.matmul
  invariants:
    - backward_uses: [out]
  fusion:
    patterns:
      - [split, swiglu] -> fused_split_swiglu

recipe FP8:
  forward_activation_dtype: fp8_e4m3
  amax_history_len: 16

model Big(d: int, ...):
  @recipe(FP8)
  params:
    w: [d]
  forward:
    graph:
      ...
'''
    )
    block, primitive, recipe, model = program.declarations
    pattern = section(block.body, "pattern")
    assert pattern.value.expr.id == "sequential_residual"
    items = section(pattern.body, "sublayers").body
    assert all(isinstance(i, ast.ListItem) for i in items)
    transpose = section(primitive.body, "params").body[0].value
    assert isinstance(transpose.expr, ast.Call) and transpose.default.id == "NN"
    inputs = section(section(primitive.body, "forward").body, "in").value.expr
    assert isinstance(inputs, ast.NamedTuple) and [f.name for f in inputs.fields] == ["A", "B"]
    assert isinstance(section(primitive.body, "backward").body[0], ast.Binding)
    fused = section(section(primitive.body, "fusion").body, "patterns").body[0]
    assert len(fused.chain) == 1
    assert recipe.kind == "recipe" and len(recipe.body) == 2
    assert model.params[-1].rest
    assert isinstance(model.body[0], ast.AnnotationStmt)
    placeholder = graph_of(model)[0]
    assert isinstance(placeholder, ast.ExprStmt) and isinstance(placeholder.expr, ast.EllipsisLit)


def test_abstract_module_and_extends():
    program = parse_source(
        "abstract module Base(d: int):\n  params:\n    w: [d, d]\n  forward:\n    in: [B, d]\n"
        "module Child(d, h) extends Base:\n  params:\n    +freqs: [h, 2]\n  forward:\n    graph:\n      x -> y\n"
    )
    base, child = program.declarations
    assert base.abstract and not child.abstract
    assert child.extends == "Base" and [p.type for p in child.params] == [None, None]


@pytest.mark.parametrize(
    "text, line, column, message",
    [
        ("module M(:\n", 1, 10, "unexpected ':'"),
        ("module M():\n  forward:\n    graph:\n      x -> -> y\n", 4, 12, "unexpected '->'"),
        ("module M():\n  params\n    w: [d]\n", 3, 5, "unexpected indentation"),
        ("module M():\n  params:\n    w: [d, d\n", 3, 13, "unexpected end of input"),
        ('module M():\n  """doc\n', 2, 3, "unexpected character"),
        ("module M():\n    a: 1\n  b: 2\n", 3, 3, "inconsistent indentation"),
        ("model M():\nparams:\n", 2, 1, "unexpected 'params'"),
    ],
)
def test_syntax_errors_are_located_e001_with_a_hint(text, line, column, message):
    with pytest.raises(DiagnosticError) as info:
        parse_source(text, "bad.module")
    (diag,) = info.value.diagnostics
    assert diag.code == "E001"
    assert message in diag.message
    assert (diag.span.line, diag.span.column) == (line, column), diag.render()
    rendered = diag.render()
    assert rendered.startswith(f"bad.module:{line}:{column}: error[E001]")
    assert "^" in rendered


def test_syntax_error_hint_lists_what_was_expected():
    with pytest.raises(DiagnosticError) as info:
        parse_source("module M():\n  params\n    w: [d]\n")
    assert "':'" in info.value.diagnostics[0].hint


def mutations(text: str, rng: random.Random, count: int):
    """Token- and line-level mutations: delete, duplicate or swap."""
    tokens = re.findall(r"\s+|\w+|[^\w\s]", text)
    lines = text.split("\n")
    for _ in range(count):
        kind = rng.randrange(5)
        if kind < 3:
            t = list(tokens)
            i, j = rng.randrange(len(t)), rng.randrange(len(t))
            if kind == 0:
                del t[i]
            elif kind == 1:
                t.insert(i, t[j])
            else:
                t[i], t[j] = t[j], t[i]
            yield "".join(t)
        else:
            ls = list(lines)
            i, j = rng.randrange(len(ls)), rng.randrange(len(ls))
            if kind == 3:
                ls.insert(i, ls[j])
            else:
                ls[i], ls[j] = ls[j], ls[i]
            yield "\n".join(ls)


def test_mutated_spec_programs_fail_only_with_located_diagnostics():
    rng = random.Random(1234)
    blocks = [text for _, text in spec_code_blocks(first_line=5875)]
    failures = 0
    for text in blocks:
        for mutant in mutations(text, rng, 80):
            try:
                parse_source(mutant, "mutant.module")
            except DiagnosticError as err:
                failures += 1
                assert all(d.code == "E001" for d in err.diagnostics)
                assert err.diagnostics[0].render()
    assert failures > 100
