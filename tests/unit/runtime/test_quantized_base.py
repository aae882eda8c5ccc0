"""A low-precision frozen base for LoRA (``modeldsl.load(..., lora=..., base_dtype="bf16" | "fp8")``).

The tolerances are what the stored dtype gives. fp8 e4m3 keeps 3 mantissa bits: rounding to
nearest moves a weight by at most 2^-4 of itself (in the normal range, which per-channel scaling
puts every value within a factor 2^14 of its row's largest in), and the errors of independent
weights do not add up in a dot product, so the logits move by about the weights' own relative
error: on the tiny Llama 2.4% of the weights' norm and 2.5-2.8% of the logits' (measured; the
bound checked is 2^-4 = 6.25%). bf16 keeps 7 bits: 2^-8 = 0.39% (measured 0.18%). The
cross-entropy moves by at most twice the largest logit change (``|d(lse(z) - z_y)| <= 2 max|dz|``):
about 0.011 on the tiny Llama (measured), so 20 AdamW steps of LoRA on an fp8 base stay within
0.03 of the fp32 base's losses (measured: 0.005), on a bf16 one within 0.002 (measured 0.0004).
"""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest
from hf_checkpoints import cached_checkpoint

import modeldsl
from modeldsl.diagnostics import DiagnosticError
from modeldsl.dialects.dtypes import DType
from modeldsl.dialects.sched import BufferOp, GemmOp, LaunchOp
from modeldsl.kernels.reference import dequantize, quantize
from modeldsl.memory_report import format_training, program_memory, program_report, stored_base, training_memory
from modeldsl.resolve.imports import STD_ROOT
from modeldsl.runtime.optim import AdamWConfig
from modeldsl.runtime.profiles import compile_profile
from modeldsl.runtime.train import Trainer, compile_training_step

LLAMA = STD_ROOT / "models" / "llama.module"
MODULES = {"llama": "llama.module", "qwen3": "qwen.module"}
ALL_LINEAR = dict(r=4, lora_alpha=8, target_modules="all-linear")
# the frozen linear weights of the tiny Llama (2 layers, d 32, 4 + 2 + 2 heads of 8, d_ff 48, vocab 64)
STORED = {"blocks.attention.qkv_weight": (2, 64, 32), "blocks.attention.out_weight": (2, 32, 32),
          "blocks.mlp.up_weight": (2, 96, 32), "blocks.mlp.down_weight": (2, 32, 48), "lm_head": (64, 32)}
FP8_ULP = 2.0**-4  # e4m3: 3 mantissa bits, round to nearest
BF16_ULP = 2.0**-8  # bf16: 7 mantissa bits
TOKENS = np.array([[3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3]])


def load(base_dtype=None, lora=ALL_LINEAR, arch="llama", **kw):
    path = cached_checkpoint(arch, head_dim=16) if arch == "qwen3" else cached_checkpoint(arch)
    return modeldsl.load(STD_ROOT / "models" / MODULES[arch], hf=path, lora=lora, base_dtype=base_dtype, **kw)


def randomize_b(model, seed: int = 1) -> None:
    """Nonzero lora_B, so that the adapters change the logits."""
    rng = np.random.default_rng(seed)
    for param in model.model.params():
        if param.is_adapter and param.attributes["adapter"].data["role"].data == "B":
            view = model.weights[param.sym_name.data]
            np.copyto(view, rng.standard_normal(view.shape) * 0.1, casting="unsafe")


def logits(model, tokens=TOKENS) -> np.ndarray:
    return np.stack([model.forward(row) for row in tokens])


def relative(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def shifted(tokens: np.ndarray) -> np.ndarray:
    labels = np.full_like(tokens, -100)
    labels[:, :-1] = tokens[:, 1:]
    return labels


# ----------------------------------------------------------------------------- the stored weights


def test_the_stored_weights_are_the_checkpoints_quantized_per_output_channel():
    """In the params arena each frozen linear weight is fp8 e4m3 with an fp32 scale per output channel
    (``max|W[o, :]| / 448``), the checkpoint's values quantized bit for bit as the numpy reference does
    (torch's fp8 bits: tests/unit/kernels/test_reference.py); widened, each is within 2^-4 of the
    checkpoint's value. The embedding, norms and adapters are held as before."""
    base, fp8 = load(), load("fp8")
    for name, shape in STORED.items():
        q, scale = fp8.weights[name], fp8.weights[f"{name}.scale"]
        assert q.dtype == ml_dtypes.float8_e4m3fn and q.shape == shape
        assert scale.dtype == np.float32 and scale.shape == shape[:-1]
        assert np.shares_memory(q, fp8.params.views[name])  # held once, in the params arena
        want_q, want_scale = quantize(base.weights[name])
        np.testing.assert_array_equal(q.view(np.uint8), want_q.view(np.uint8))
        np.testing.assert_array_equal(scale, want_scale)
        np.testing.assert_array_equal(scale, np.abs(base.weights[name]).max(axis=-1) / np.float32(448))
        w, error = base.weights[name], np.abs(dequantize(q, scale) - base.weights[name])
        normal = np.abs(w) >= scale[..., None] * 2.0**-6  # e4m3's smallest normal, times the row's scale
        assert np.all(error[normal] <= FP8_ULP * np.abs(w)[normal])
        half_step = np.broadcast_to(scale[..., None] * 2.0**-10, w.shape)  # half of e4m3's subnormal step
        assert np.all(error[~normal] <= half_step[~normal])
    for name, value in base.weights.items():
        if name not in STORED:
            assert fp8.weights[name].dtype == value.dtype, name
            if not fp8.model.lookup(name).is_adapter:
                np.testing.assert_array_equal(fp8.weights[name], value, err_msg=name)


def test_bf16_stores_the_weights_rounded_to_nearest_even():
    base, bf16 = load(), load("bf16")
    for name in STORED:
        assert bf16.weights[name].dtype == ml_dtypes.bfloat16
        np.testing.assert_array_equal(bf16.weights[name], base.weights[name].astype(ml_dtypes.bfloat16))
        assert f"{name}.scale" not in bf16.weights


# ----------------------------------------------------------------------------- what it computes


@pytest.mark.parametrize("arch", MODULES)
def test_the_logits_on_an_fp8_base_are_within_what_fp8_weights_give(arch):
    base, fp8, bf16 = (load(dtype, arch=arch) for dtype in (None, "fp8", "bf16"))
    for model in (fp8, bf16):
        for name, value in model.weights.items():
            if model.model.lookup(name).is_adapter:
                np.copyto(value, base.weights[name])
    randomize_b(base), randomize_b(fp8), randomize_b(bf16)
    reference = logits(base)
    error = relative(logits(fp8), reference)
    assert 1e-3 < error < FP8_ULP, error  # measured 0.026 (llama)
    assert 0 < relative(logits(bf16), reference) < BF16_ULP
    # the graph interpreter (the oracle) runs the same dequantize: the schedule's logits are its own
    np.testing.assert_allclose(fp8.forward(TOKENS[0], engine="graph"), logits(fp8)[0], rtol=1e-5, atol=1e-6)


def test_twenty_adamw_steps_on_an_fp8_base_track_the_fp32_base():
    """The adapters alone train (gradients and moments for them only), with losses within twice the
    logits' error of the fp32 base's."""
    config = AdamWConfig(lr=1e-2, beta1=0.9, beta2=0.95, weight_decay=0.1, warmup_steps=0, total_steps=20,
                         clip_norm=1.0)
    losses = {}
    for base_dtype in (None, "fp8", "bf16"):
        model = load(base_dtype)
        trainer = Trainer(model, config)
        assert all(model.model.lookup(name).is_adapter for name in trainer.optimizer.grads)
        rng = np.random.default_rng(0)
        losses[base_dtype] = np.array([trainer.train_step([(tokens, shifted(tokens))]) for tokens in
                                       (rng.integers(0, 64, (2, 8)) for _ in range(20))])
        if base_dtype == "fp8":
            assert all(np.isfinite(losses[base_dtype]))
            for name in STORED:  # the base did not move
                assert model.weights[name].dtype == ml_dtypes.float8_e4m3fn
    fp8_gap = np.abs(losses["fp8"] - losses[None]).max()
    assert 1e-5 < fp8_gap < 0.03, fp8_gap  # measured 0.005
    assert np.abs(losses["bf16"] - losses[None]).max() < 0.002


def test_a_mixed_precision_trainer_keeps_the_stored_base():
    model = load("fp8")
    trainer = Trainer(model, AdamWConfig(lr=1e-2), dtype="bf16")
    tokens = np.random.default_rng(2).integers(0, 64, (2, 8))
    assert np.isfinite(trainer.train_step([(tokens, shifted(tokens))]))
    assert trainer.schedule.params is not model.params.arena  # the bf16 programs' own arena, fp8 base in it
    assert {d for n, (_, _, d) in trainer.schedule.param_layout.items() if n in STORED} == {"fp8_e4m3"}


# ----------------------------------------------------------------------------- memory


def stored_counts() -> tuple[int, int]:
    """(values, output channels) of the tiny Llama's frozen linear weights."""
    values = sum(int(np.prod(s)) for s in STORED.values())
    channels = sum(int(np.prod(s[:-1])) for s in STORED.values())
    return values, channels


def test_the_params_arena_is_smaller_by_three_bytes_a_weight_less_four_a_channel():
    """fp32 -> fp8: 4 -> 1 byte per stored value plus 4 bytes per output channel (its scale); fp32 ->
    bf16: 4 -> 2. The tiny Llama's buffers are multiples of the arena's 256-byte alignment, so the
    arenas differ by exactly that; the memory reports say the same."""
    values, channels = stored_counts()
    assert (values, channels) == (17408, 512)
    arenas = {dtype: load(dtype).params.arena.nbytes for dtype in (None, "fp8", "bf16")}
    assert arenas[None] - arenas["fp8"] == 3 * values - 4 * channels == 50176
    assert arenas[None] - arenas["bf16"] == 2 * values
    model = load("fp8")
    step = compile_training_step(model.model, 2, 8)
    memory = training_memory(step)
    assert memory.params == arenas["fp8"] and memory.params_saved == 3 * values - 4 * channels
    assert (memory.base.dtypes, memory.base.weights, memory.base.values, memory.base.stored_bytes,
            memory.base.scale_bytes) == (("fp8_e4m3",), 5, values, values, 4 * channels)
    line = (f"params hold the frozen base in fp8_e4m3: 5 weights, {values} values in {values} bytes + "
            f"{4 * channels} bytes of fp32 scales (fp32: {4 * values} bytes; 50176 bytes saved)")
    assert line in program_report(step) and line in format_training(memory)
    assert stored_base(compile_profile(load().model, 1, 16, "fp32")) is None


def test_the_gemms_widen_the_stored_weights_a_tile_at_a_time():
    """Every GEMM that reads a stored weight as its B takes it with its scale (``mdsl.sched.gemm ...
    scale``): no dequantize launch, no widened weight in the activations arena; in the training step
    the backward's ``dy @ W`` reads it so too, and only the fused LM-head loss (not a GEMM) has the
    head widened, a transient of its two steps."""
    model = load("fp8")
    forward = compile_profile(model.model, 1, 16, "fp32")
    assert not [op for op in forward.walk() if isinstance(op, LaunchOp) and op.kernel.data == "dequantize"]
    scaled = [op for op in forward.walk() if isinstance(op, GemmOp) and op.scale_b is not None]
    assert len(scaled) == 5  # qkv, out, gate/up, down in the layer loop; the head
    assert all(op.b.type.dtype == DType.FP8_E4M3 and op.transb.value.data for op in scaled)
    memory = program_memory(forward)
    assert not [b for b in memory.buffers if b.arena == "activations" and
                b.name in ("attention_qkv_weight", "up_weight", "down_weight", "lm_head")]
    step = compile_training_step(model.model, 2, 8)
    saved = {op.result.name_hint for op in step.walk() if isinstance(op, BufferOp) and "saved" in op.attributes}
    assert not {n for n in saved if n and n.endswith("_weight")}, saved
    backward = [op for op in step.walk() if isinstance(op, GemmOp) and op.scale_b is not None
                and not op.transb.value.data]
    assert len(backward) == 4  # d_x of qkv, out, gate/up, down
    widened = [op for op in step.walk() if isinstance(op, LaunchOp) and op.kernel.data == "dequantize"]
    assert [op.inputs[0].name_hint for op in widened] == ["lm_head"]


@pytest.mark.usefixtures("numpy_cpu_kernels")
def test_the_emulated_cuda_device_runs_the_scaled_gemms_as_the_cpu_does():
    """The CUDA executor's GEMM commands carry the scale (on the emulated device: the reference)."""
    cpu, emulated = load("fp8"), load("fp8", device="emulated")
    for model in (cpu, emulated):
        randomize_b(model)
    np.testing.assert_array_equal(logits(emulated), logits(cpu))


# ----------------------------------------------------------------------------- files


def test_an_adapter_trained_on_an_fp8_base_loads_on_a_full_precision_base(tmp_path):
    """PEFT's files do not change: the adapters saved from an fp8 base are the trained fp32 tensors,
    which load on the full-precision base (logits within fp8's error of the fp8 model's) and on an fp8
    base again (the same logits bit for bit)."""
    model = load("fp8")
    trainer = Trainer(model, AdamWConfig(lr=1e-2))
    rng = np.random.default_rng(4)
    for _ in range(3):
        tokens = rng.integers(0, 64, (2, 8))
        trainer.train_step([(tokens, shifted(tokens))])
    model.save_adapter(tmp_path / "adapter")
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["r"] == 4 and "base_dtype" not in json.dumps(config)
    full = load(None, lora=None, adapter=tmp_path / "adapter")
    for name, value in full.weights.items():
        if full.model.lookup(name).is_adapter:
            np.testing.assert_array_equal(value, model.weights[name], err_msg=name)
    assert relative(logits(model), logits(full)) < FP8_ULP
    again = load("fp8", lora=None, adapter=tmp_path / "adapter")
    np.testing.assert_array_equal(logits(again), logits(model))


def test_a_merged_save_of_an_fp8_base_holds_the_dequantized_weights(tmp_path):
    model = load("fp8")
    randomize_b(model)
    model.save_hf(tmp_path / "merged")
    plain = modeldsl.load(LLAMA, hf=tmp_path / "merged")
    a = plain.weights["blocks.mlp.down_weight"]
    np.testing.assert_allclose(plain.weights["lm_head"], dequantize(model.weights["lm_head"],
                                                                    model.weights["lm_head.scale"]), rtol=0, atol=0)
    assert a.dtype == np.float32
    np.testing.assert_allclose(logits(plain), logits(model), rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- errors


@pytest.mark.parametrize("base_dtype, words", [
    ("int4", "base_dtype='int4' is not one of 'bf16', 'fp8'"),
    ("fp32", "base_dtype='fp32' is not one of"),
    (8, "base_dtype=8 is not one of"),
    (["fp8"], "base_dtype=['fp8'] is not one of"),
])
def test_a_wrong_base_dtype_is_e029(base_dtype, words):
    with pytest.raises(DiagnosticError) as info:
        load(base_dtype)
    (diagnostic,) = info.value.diagnostics
    assert diagnostic.code == "E029" and words in diagnostic.message


def test_a_base_dtype_without_a_frozen_base_is_e029():
    with pytest.raises(DiagnosticError) as info:
        load("fp8", lora=None)
    (diagnostic,) = info.value.diagnostics
    assert diagnostic.code == "E029" and "no frozen linear weight" in diagnostic.message
    assert "lora=" in diagnostic.hint
