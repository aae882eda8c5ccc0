"""The bundled standard library: every file parses, every module and model lowers and verifies."""

from pathlib import Path

import numpy as np
import pytest
from xdsl.context import Context

from modeldsl.diagnostics import DiagnosticSink
from modeldsl.dialects.graph import ModelOp, ParamOp
from modeldsl.dialects.graph_primitives import FlashAttentionOp
from modeldsl.frontend.text.parser import parse_source
from modeldsl.ir import verify_module
from modeldsl.lower import lower_program
from modeldsl.passes.specialize import SpecializePass
from modeldsl.resolve.imports import STD_ROOT
from modeldsl.resolve.primitive_decls import check_primitive_decl
from modeldsl.runtime.executor import GraphExecutor

STD_FILES = sorted(STD_ROOT.rglob("*.module"))


def load(path: Path):
    return parse_source(path.read_text(), str(path))


def test_the_std_tree_has_the_spec_layout():
    names = {p.relative_to(STD_ROOT).as_posix() for p in STD_FILES}
    assert {"modules/linear.module", "modules/mlp.module", "modules/attention/mha.module",
            "modules/attention/gqa.module", "modules/attention/mqa.module", "modules/norm.module",
            "modules/moe/router.module", "modules/moe/expert.module", "blocks/moe.module", "blocks/mamba.module",
            "blocks/parallel.module", "models/mixtral.module",
            "blocks/dense.module", "models/llama.module", "models/qwen.module", "models/mistral.module",
            "primitives/matmul.module", "primitives/rmsnorm.module", "primitives/attention.module"} <= names
    # a file std/modules/attention.module would hide the folder from `from std.modules.attention import GQA`
    assert not {"modules/attention.module", "modules/moe.module"} & names


@pytest.mark.parametrize("path", STD_FILES, ids=lambda p: p.relative_to(STD_ROOT).as_posix())
def test_every_declaration_lowers_and_verifies_or_agrees_with_its_primitive_op(path):
    """Modules, blocks and models lower and verify without warnings; primitive declarations are
    checked against the op registry (they document ops, and do not lower)."""
    program = load(path)
    for decl in program.declarations:
        if decl.kind == "primitive":
            sink = DiagnosticSink()
            check_primitive_decl(decl, sink)
            assert sink.diagnostics == [], "\n".join(d.render() for d in sink.diagnostics)
            continue
        sink = DiagnosticSink()
        module = lower_program(program, decl.name, sink=sink)
        assert verify_module(module) == [], decl.name
        assert sink.diagnostics == [], "\n".join(d.render() for d in sink.diagnostics)


@pytest.mark.parametrize(
    "config, has_lm_head, qk_norm",
    [({}, False, True), ({"tie_embeddings": False}, True, True)],
)
def test_qwen3_config_overrides(config, has_lm_head, qk_norm):
    module = lower_program(load(STD_ROOT / "models" / "qwen.module"), "Qwen3", config)
    params = {op.sym_name.data for op in module.walk() if op.name == "mdsl.graph.param"}
    assert ("lm_head" in params) == has_lm_head
    assert any(op.name == "mdsl.graph.qk_norm" for op in module.walk()) == qk_norm


def test_mistral_without_sliding_window():
    module = lower_program(load(STD_ROOT / "models" / "mistral.module"), "Mistral", {"sliding_window": 0})
    attention = next(op for op in module.walk() if op.name == "mdsl.graph.flash_attention")
    assert "window_size" not in attention.attributes


ATTENTION_SIZES = {"d_model": 32, "num_heads": 4, "head_dim": 8}
ATTENTION_OPTIONS = [{}, {"use_qkv_bias": True, "use_qk_norm": True, "sliding_window": 3}]


def attention_model(name: str, config: dict) -> ModelOp:
    """``name`` of the std attention folder (its file ``name.lower().module``), lowered with ``config``
    and specialized (B=2, T=6)."""
    module = lower_program(load(STD_ROOT / "modules" / "attention" / f"{name.lower()}.module"), name, config)
    SpecializePass.of(B=2, T=6).apply(Context(), module)
    return next(op for op in module.walk() if isinstance(op, ModelOp))


def param_shapes(model: ModelOp) -> dict[str, tuple[int, ...]]:
    return {op.sym_name.data: tuple(int(str(d)) for d in op.param_type.shape) for op in model.walk()
            if isinstance(op, ParamOp)}


@pytest.mark.parametrize("options", ATTENTION_OPTIONS, ids=["plain", "bias-qknorm-window"])
@pytest.mark.parametrize("name, kv_heads", [("MHA", 4), ("MQA", 1), ("GQA", 2)])
def test_mha_and_mqa_are_gqa_with_their_kv_heads_bitwise(name, kv_heads, options):
    """MHA is GQA with num_kv_heads = num_heads, MQA with one kv head: the fused [q; k; v] weight is
    [(H + 2 Hkv) D, d_model] (k's rows: H*D for MHA, D for MQA), the attention reads Hkv key and value
    heads, and the forward is GQA's with that kv-head count, bitwise (its parameters under gqa.)."""
    heads, head_dim, d_model = ATTENTION_SIZES["num_heads"], ATTENTION_SIZES["head_dim"], ATTENTION_SIZES["d_model"]
    own = {} if name != "GQA" else {"num_kv_heads": kv_heads}
    model = attention_model(name, {**ATTENTION_SIZES, **own, **options})
    gqa = attention_model("GQA", {**ATTENTION_SIZES, "num_kv_heads": kv_heads, **options})
    prefix = "" if name == "GQA" else "gqa."
    shapes = param_shapes(model)
    assert shapes[f"{prefix}qkv_weight"] == ((heads + 2 * kv_heads) * head_dim, d_model)
    assert shapes[f"{prefix}out_weight"] == (d_model, heads * head_dim)
    assert {k.removeprefix(prefix): v for k, v in shapes.items()} == param_shapes(gqa)
    (attention,) = [op for op in model.walk() if isinstance(op, FlashAttentionOp)]
    q, k, v = (tuple(int(str(d)) for d in operand.type.shape) for operand in attention.operands[:3])
    assert q == (2, 6, heads, head_dim) and k == v == (2, 6, kv_heads, head_dim)

    rng = np.random.default_rng(7)
    weights = {path: (0.2 * rng.standard_normal(shape)).astype(np.float32) for path, shape in shapes.items()}
    x = rng.standard_normal((2, 6, d_model)).astype(np.float32)
    angles = np.arange(6)[:, None] * 10000.0 ** (-np.arange(head_dim // 2) / (head_dim // 2))
    freqs = np.stack([np.cos(angles), np.sin(angles)], axis=-1).astype(np.float32)
    (got,) = GraphExecutor(model, weights, np.float32).run("forward", x, freqs)
    (expected,) = GraphExecutor(gqa, {p.removeprefix(prefix): w for p, w in weights.items()}, np.float32).run(
        "forward", x, freqs)
    assert got.shape == (2, 6, d_model) and np.abs(got).max() > 0
    assert np.array_equal(got, expected)


def test_ir_size_does_not_grow_with_depth():
    program = load(STD_ROOT / "models" / "llama.module")
    sizes = {n: sum(1 for _ in lower_program(program, "Llama", {"n_layers": n}).walk()) for n in (2, 32, 80)}
    assert len(set(sizes.values())) == 1, sizes


def test_500_mutations_of_the_std_models_fail_only_with_located_coded_diagnostics():
    """Delete, duplicate and swap tokens and lines of the std models: every failure
    is a coded diagnostic with a location, never a traceback."""
    import random

    from frontend.test_parser import mutations

    from modeldsl.diagnostics import CODES, DiagnosticError

    rng = random.Random(500)
    refused = 0
    models = [STD_ROOT / "models" / f"{name}.module" for name in ("llama", "qwen", "mistral")]
    for index, mutant in enumerate(m for path in models for m in mutations(path.read_text(), rng, 167)):
        try:
            lower_program(parse_source(mutant, str(STD_ROOT / "models" / f"mutant{index}.module")))
        except DiagnosticError as err:
            refused += 1
            for diagnostic in err.diagnostics:
                assert diagnostic.code in CODES and diagnostic.span is not None, diagnostic.render()
    assert refused > 150
