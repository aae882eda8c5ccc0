"""mdsl-fuse attention_layout: the [B, T, H, D] ("bthd") attention computes the same values as the
transposed [B, H, T, D] one, bitwise (references of rope, flash_attention and their backwards, the
KV-cache attention). The std models attend in bthd as written; a copy of them written heads first
([B, H, T, D], transposes around rope and attention) gives, with the pattern on, the logits of the
pattern off, bitwise, once its @hook(BeforeAttention) is taken off (the hook observes the rotated q
and k heads first: with it the pattern must not fire, and does not); its training step keeps its
transposes (the saved q, k, v and attention output are read by the backward)."""

from pathlib import Path

import numpy as np
import pytest
from training_steps import BATCH, FAMILIES, FAMILY_IDS, TOKENS, load_std
from xdsl.context import Context
from xdsl.dialects.builtin import ArrayAttr, ModuleOp

from modeldsl.dialects.annotations import HookAttr, annotations_of
from modeldsl.dialects.graph import ModelOp
from modeldsl.dialects.graph_primitives import FlashAttentionOp, RopeOp, TransposeOp
from modeldsl.dialects.graph_types import TensorType
from modeldsl.dialects.sched import AttentionOp, LaunchOp
from modeldsl.infer import infer_result_types
from modeldsl.kernels import reference as ref
from modeldsl.passes.fuse import FusePass
from modeldsl.passes.lower_to_sched import lower_function
from modeldsl.passes.specialize import SpecializePass
from modeldsl.resolve.imports import STD_ROOT
from modeldsl.runtime.profiles import ProfiledForward, compile_profile, plan
from modeldsl.runtime.train import compile_training_step

OFF = ("attention_layout",)


def bthd(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.swapaxes(x, 1, 2))


def attention_inputs(rng, b=2, hq=4, hkv=2, t=6, d=8):
    q = rng.standard_normal((b, hq, t, d)).astype(np.float32)
    k, v = (rng.standard_normal((b, hkv, t, d)).astype(np.float32) for _ in range(2))
    return q, k, v


@pytest.mark.parametrize("window", [None, 3])
def test_flash_attention_in_bthd_is_the_transposed_bhtd(window):
    rng = np.random.default_rng(0)
    q, k, v = attention_inputs(rng)
    out, lse = ref.flash_attention(q, k, v, window_size=window)
    out_t, lse_t = ref.flash_attention(bthd(q), bthd(k), bthd(v), window_size=window, layout="bthd")
    assert out_t.shape == (2, 6, 4, 8) and lse_t.shape == lse.shape
    assert np.array_equal(out_t, bthd(out)) and np.array_equal(lse_t, lse)
    d_out = rng.standard_normal(out.shape).astype(np.float32)
    grads = ref.flash_attention_backward(d_out, q, k, v, out, lse, window_size=window)
    grads_t = ref.flash_attention_backward(bthd(d_out), bthd(q), bthd(k), bthd(v), bthd(out), lse,
                                           window_size=window, layout="bthd")
    for g, g_t in zip(grads, grads_t):
        assert np.array_equal(g_t, bthd(g))


@pytest.mark.parametrize("interleaved", [False, True])
def test_rope_in_bthd_rotates_by_the_t_axis(interleaved):
    rng = np.random.default_rng(1)
    q, k, _ = attention_inputs(rng)
    freqs = rng.standard_normal((6, 4, 2)).astype(np.float32)
    for fn in (ref.rope, ref.rope_backward):
        a, b = fn(q, k, freqs, interleaved=interleaved)
        a_t, b_t = fn(bthd(q), bthd(k), freqs, interleaved=interleaved, layout="bthd")
        assert np.array_equal(a_t, bthd(a)) and np.array_equal(b_t, bthd(b))
    with pytest.raises(ValueError, match="layout"):
        ref.rope(q, k, freqs, layout="tbhd")


def test_kv_cache_attention_in_bthd_fills_the_same_bhtd_cache():
    rng = np.random.default_rng(2)
    q, k, v = attention_inputs(rng, t=3)
    caches = [np.zeros((2, 2, 8, 8), np.float32) for _ in range(4)]
    position = np.array([2])
    out, lse, kc, vc = ref.kv_cache_attention(q, k, v, caches[0], caches[1], position)
    out_t, lse_t, kc_t, vc_t = ref.kv_cache_attention(bthd(q), bthd(k), bthd(v), caches[2], caches[3], position,
                                                      layout="bthd")
    assert np.array_equal(out_t, bthd(out)) and np.array_equal(lse_t, lse)
    assert np.array_equal(kc_t, kc) and np.array_equal(vc_t, vc)


def heads_first_models(root: Path) -> Path:
    """The std models, block and attention copied under ``root``, the attention written heads first
    (``transpose(1, 2)`` after the head views and before the output view, rope and attention in bhtd)."""
    attention = (STD_ROOT / "modules" / "attention" / "gqa.module").read_text()
    for head in ("q_heads", "k_heads", "v\n"):
        attention = attention.replace(f"head_dim]) -> {head}", f"head_dim]) -> transpose(1, 2) -> {head}")
    attention = attention.replace("rope(layout=bthd)", "rope()").replace(", layout=bthd)", ")")
    attention = attention.replace(", layout=bthd, ", ", ")
    attention = attention.replace("att -> view([B, T, q_dim])", "att -> transpose(1, 2) -> view([B, T, q_dim])")
    assert attention.count("transpose(1, 2)") == 4 and "bthd" not in attention
    (root / "modules" / "attention").mkdir(parents=True, exist_ok=True)
    (root / "modules" / "attention" / "gqa.module").write_text(attention)
    dense = (STD_ROOT / "blocks" / "dense.module").read_text()
    assert "from std.modules.attention import" in dense  # the folder: the copy imports its own
    (root / "dense.module").write_text(dense.replace("std.modules.attention", "modules.attention"))
    for _, module, _ in FAMILIES:
        text = (STD_ROOT / "models" / module).read_text()
        (root / module).write_text(text.replace("std.blocks.dense", "dense"))
    return root


@pytest.fixture(scope="module")
def heads_first(tmp_path_factory) -> Path:
    return heads_first_models(tmp_path_factory.mktemp("heads_first"))


def without_hooks(model: ModelOp) -> ModelOp:
    """A copy of ``model`` with no @hook on any rope (the std models observe q and k there)."""
    copy = model.clone()
    for op in copy.walk():
        if isinstance(op, RopeOp) and any(isinstance(a, HookAttr) for a in annotations_of(op)):
            kept = [a for a in op.attributes["annotations"].data if not isinstance(a, HookAttr)]
            if kept:
                op.attributes["annotations"] = ArrayAttr(kept)
            else:
                del op.attributes["annotations"]
    return copy


def fused_forward(model: ModelOp, fuse: FusePass) -> tuple[ModelOp, object]:
    """The specialized, fused model and its planned forward program (fp32)."""
    module = ModuleOp([model.clone()])
    SpecializePass.of(B=BATCH, T=TOKENS).apply(Context(), module)
    fuse.apply(Context(), module)
    specialized = next(op for op in module.body.block.ops if isinstance(op, ModelOp))
    return specialized, plan(lower_function(specialized, "forward", "fp32", 0, True))


def logits(model, program) -> np.ndarray:
    tokens = np.random.default_rng(3).integers(0, model.config("vocab_size"), size=(BATCH, TOKENS))
    return np.asarray(model.schedule.executor(program).execute(*model.inputs(tokens.astype(np.int32), 0))[0]).copy()


def layouts(program) -> list[str]:
    return [op.layout.data for op in program.walk() if isinstance(op, AttentionOp)]


def transposes(model: ModelOp) -> int:
    return sum(isinstance(op, TransposeOp) for op in model.walk())


@pytest.mark.parametrize("arch, module, config", FAMILIES, ids=FAMILY_IDS)
def test_forward_logits_with_the_layout_pattern_are_bitwise_those_without(arch, module, config, heads_first):
    model = load_std(arch, module, config, heads_first)
    bare = without_hooks(model.model)
    fused, on = fused_forward(bare, FusePass())
    unfused, off = fused_forward(bare, FusePass(disable=OFF))
    assert transposes(fused) == 0 and transposes(unfused) == 4  # q, k, v in and the output back
    assert {op.layout.data for op in fused.walk() if isinstance(op, (RopeOp, FlashAttentionOp))} == {"bthd"}
    assert layouts(on) == ["bthd"] and layouts(off) == ["bhtd"]
    assert "transpose" not in {op.kernel.data for op in on.walk() if isinstance(op, LaunchOp)}
    assert np.array_equal(logits(model, on), logits(model, off))


def test_the_hook_on_rope_keeps_the_written_layout(heads_first):
    model = load_std("llama", "llama.module", {}, heads_first)
    fused, program = fused_forward(model.model, FusePass())
    assert transposes(fused) == 4 and layouts(program) == ["bhtd"]


@pytest.mark.parametrize("arch, module, config", FAMILIES, ids=FAMILY_IDS)
def test_the_std_models_attend_in_bthd_without_transposes(arch, module, config, heads_first):
    """The std attention is written in bthd: forward and training step move no head transposes, and
    give the logits of the heads-first copy bitwise."""
    model = load_std(arch, module, config)
    fused, program = fused_forward(model.model, FusePass(disable=OFF))
    assert transposes(fused) == 0 and layouts(program) == ["bthd"]
    step = compile_training_step(model.model, BATCH, TOKENS)
    assert set(layouts(step)) == {"bthd"} and "transpose" not in {op.kernel.data for op in step.walk()
                                                                    if isinstance(op, LaunchOp)}
    copy = load_std(arch, module, config, heads_first)
    _, heads_first_program = fused_forward(copy.model, FusePass(disable=OFF))
    assert np.array_equal(logits(model, program), logits(copy, heads_first_program))


def test_the_training_step_keeps_its_saved_layout(heads_first):
    """The backward reads the saved q, k, v and attention output in [B, H, T, D]: nothing fires,
    with the hook or without it, and the step compiles."""
    model = load_std("llama", "llama.module", {}, heads_first)
    for source in (model.model, without_hooks(model.model)):
        program = compile_training_step(source, BATCH, TOKENS)
        assert set(layouts(program)) == {"bhtd"}


def test_shape_inference_keeps_lse_heads_first_in_bthd():
    def tensor(*dims, dtype="bf16"):
        return TensorType([str(d) for d in dims], dtype)

    q, kv = tensor("B", "T", 8, 16), tensor("B", "T", 2, 16)
    out, lse = infer_result_types("flash_attention", [q, kv, kv], {"layout": "bthd"})
    assert out == q and lse == tensor("B", 8, "T", dtype="fp32")
    assert infer_result_types("flash_attention", [q, kv, kv], {})[1] == tensor("B", "T", 8, dtype="fp32")


def test_kv_cache_decoding_in_bthd_gives_the_same_tokens(heads_first):
    """Without the hook the decoding profiles attend in bthd (the cache stays [B, Hkv, capacity, D])."""
    model = load_std("llama", "llama.module", {}, heads_first)
    expected = model.generate([1, 5, 9, 3], 5)
    bare = without_hooks(model.model)
    program = compile_profile(bare, 1, 4, "fp32", kv_cache=16)
    cached = [op for op in program.walk() if isinstance(op, LaunchOp) and op.kernel.data == "kv_cache_attention"]
    assert [op.attributes["layout"].data for op in cached] == ["bthd"]
    model.schedule = ProfiledForward(bare, model.weights, storage="fp32")
    assert model.generate([1, 5, 9, 3], 5) == expected
