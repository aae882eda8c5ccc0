"""tools/bench_lora.py: the planned memory at the real shapes (its arithmetic checked against counts made
from the shapes by hand) and a ``--quick`` throughput run against PEFT (its output, not its speed)."""

import re

import pytest

from modeldsl.tools.bench import SHAPES
from modeldsl.tools.bench_lora import RANK, Speed, main, memory_shapes, plan, verdict

ALIGNMENT = 256  # mdsl-plan-memory's: every buffer starts at a multiple of it
BYTES_PER_TRAINABLE = {"fp32": 4 + 2 * 4, "bf16": 4 + 4 + 2 * 4}  # grad + moments (+ fp32 master of a bf16 one)
ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def linear_shapes(hf: dict) -> dict[str, tuple[int, int]]:
    """(in, out) of every linear module of one layer, from a HuggingFace config."""
    h, i = hf["hidden_size"], hf["intermediate_size"]
    d = hf.get("head_dim", h // hf["num_attention_heads"])
    q, kv = hf["num_attention_heads"] * d, hf["num_key_value_heads"] * d
    return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
            "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}


def adapter_count(hf: dict, rank: int, modules=ALL_LINEAR) -> int:
    """LoRA's trainable parameters: A [r, in] and B [out, r] per targeted module per layer."""
    shapes = linear_shapes(hf)
    return hf["num_hidden_layers"] * sum(rank * (shapes[m][0] + shapes[m][1]) for m in modules)


def full_count(hf: dict, qk_norm: bool) -> int:
    """Every parameter of the tied-embedding model: embeddings, the layers (linears, two norms, Qwen3's
    q/k norms of head_dim each) and the final norm."""
    h = hf["hidden_size"]
    d = hf.get("head_dim", h // hf["num_attention_heads"])
    layer = sum(a * b for a, b in linear_shapes(hf).values()) + 2 * h + (2 * d if qk_norm else 0)
    assert hf["tie_word_embeddings"]
    return hf["vocab_size"] * h + hf["num_hidden_layers"] * layer + h


@pytest.fixture(scope="module")
def shapes():
    return {s.name: s for s in memory_shapes()}


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("name", ["qwen3-0.6b", "llama-1b"])
def test_the_real_shapes_trainable_state_is_its_bytes_per_adapter_parameter(shapes, name, precision):
    shape, hf = shapes[name], SHAPES[name][2]
    assert (shape.batch, shape.tokens) == (8, 1024)
    per = BYTES_PER_TRAINABLE[precision]
    lora, full = plan(shape, "all-linear", precision), plan(shape, None, precision)

    count = adapter_count(hf, RANK)
    assert lora.trainable_parameters == count
    buffers = 3 * 2 * len(ALL_LINEAR)  # a grad and two moments (masters in the optimizer arena too) of A and B
    assert per * count <= lora.trainable_state <= per * count + (buffers + 7) * ALIGNMENT
    assert 4 * count <= lora.grads <= 4 * count + 2 * len(ALL_LINEAR) * ALIGNMENT  # fp32 gradients

    total = full_count(hf, qk_norm=name.startswith("qwen"))
    assert full.trainable_parameters == full.parameters == total
    assert lora.parameters == total + count  # the frozen base and the adapters
    assert per * total <= full.trainable_state <= per * total + 3 * 64 * ALIGNMENT  # fewer than 64 parameters
    assert lora.trainable_state / full.trainable_state <= 0.02
    assert lora.params >= (4 if precision == "fp32" else 2) * total  # the frozen base is held in full
    assert lora.activations > 0 and lora.activations == lora.saved + lora.transient + lora.workspace


def test_qwen3_0_6b_has_its_published_parameter_counts():
    hf = SHAPES["qwen3-0.6b"][2]
    assert full_count(hf, qk_norm=True) == 596_049_920
    assert adapter_count(hf, 16) == 10_092_544  # PEFT's count of r=16 all-linear on Qwen3-0.6B


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("name", ["qwen3-0.6b", "llama-1b"])
def test_an_fp8_base_holds_a_byte_per_frozen_linear_weight_and_a_scale_per_channel(shapes, name, precision):
    """The params arena of LoRA on an fp8 base: every frozen linear weight (the tied embedding stays) in
    1 byte instead of 4 (fp32) or 2 (bf16), plus an fp32 scale per output channel; the trainable state
    is LoRA's own."""
    shape, hf = shapes[name], SHAPES[name][2]
    lora, fp8 = plan(shape, "all-linear", precision), plan(shape, "all-linear", precision, "fp8_e4m3")
    layers, linears = hf["num_hidden_layers"], linear_shapes(hf).values()
    values = layers * sum(a * b for a, b in linears)
    channels = layers * sum(out for _, out in linears)
    saved = ((4 if precision == "fp32" else 2) - 1) * values - 4 * channels
    assert abs(lora.params - fp8.params - saved) <= 8 * ALIGNMENT  # 4 packed weights and their 4 scales, aligned
    assert (fp8.parameters, fp8.trainable_parameters, fp8.grads, fp8.optimizer) == \
        (lora.parameters, lora.trainable_parameters, lora.grads, lora.optimizer)
    assert fp8.saved == lora.saved  # the widened weights are replayed in the backward, not saved


def test_the_memory_table_has_every_setting(capsys):
    assert main(["--only", "memory"]) == 0
    out = capsys.readouterr().out
    assert out.count("B=8 T=1024") == 2  # fp32 and bf16 mixed precision
    for name in ("qwen3-0.6b", "llama-1b"):
        rows = [line for line in out.splitlines() if line.startswith(name)]
        assert [" ".join(line.split()[1:3]) for line in rows] == ["full fine-tune", "LoRA r=16", "LoRA on"] * 2
        assert all(re.match(rf"{name} +LoRA on fp8 base +[\d,]+ +[\d.]+% ", line) for line in rows[2::3])
        mib = [re.findall(r"(?<![\d.,])[\d,]+\.\d(?!\d)", line[len(name):]) for line in rows]  # grads .. activ.
        params = [float(cells[3].replace(",", "")) for cells in mib]
        assert params[2] < params[1] and params[5] < params[4]  # the fp8 base's params arena is the smaller
    assert out.count("(target <= 2%: met)") == 8
    assert "CPU LoRA training" not in out


def test_a_quick_run_prints_both_sides_and_their_ratio(capsys):
    for package in ("torch", "transformers", "peft"):
        pytest.importorskip(package)
    assert main(["--quick", "--only", "speed", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "1 thread each; 1 warm-up + 1 timed step per process, 1 alternating round, median" in out
    progress = re.findall(r"^  round 1 LoRA (\S+) +(modeldsl|PEFT) +([\d,]+) tokens/s on 1 thread, first loss "
                          r"([\d.]+)", out, re.M)
    assert sorted((t, r) for t, r, _, _ in progress) == [(t, r) for t in ("all-linear", "q,v")
                                                         for r in ("PEFT", "modeldsl")]
    assert len({loss for *_, loss in progress}) == 1  # the same weights, lora_B = 0: the same first loss
    rows = re.findall(r"^(q,v|all-linear) +(modeldsl|PEFT) +([\d,]+) +[\d,]+\.\.[\d,]+ \(1\) +1 +([\d,]+) ", out, re.M)
    assert [(t, r) for t, r, _, _ in rows] == [(t, r) for t in ("q,v", "all-linear") for r in ("modeldsl", "PEFT")]
    assert all(int(speed.replace(",", "")) > 0 for _, _, speed, _ in rows)
    assert rows[0][3] == rows[1][3] and rows[2][3] == rows[3][3]  # both train the same adapters
    ratios = re.findall(r"^(q,v|all-linear) +modeldsl / PEFT: ([\d.]+)x \(median tokens/s; target >= 1\.0x: "
                        r"(met|MISSED)\); best / best [\d.]+x$", out, re.M)
    assert [t for t, _, _ in ratios] == ["q,v", "all-linear"]


def test_the_verdict_is_the_ratio_of_the_medians_and_names_a_mismatch():
    ours = Speed("q,v", "modeldsl", [90.0, 300.0, 100.0], 7.0, {2}, 10)
    peft = Speed("q,v", "PEFT", [200.0], 7.0, {2}, 10)
    assert verdict(ours, peft) == "modeldsl / PEFT: 0.50x (median tokens/s; target >= 1.0x: MISSED); best / best 1.50x"
    peft.samples, peft.trainable, peft.first_loss = [50.0], 12, 7.5
    text = verdict(ours, peft)
    assert text.startswith("modeldsl / PEFT: 2.00x") and "met" in text
    assert "trainable parameters differ: 10 vs 12" in text and "first losses differ" in text
    assert verdict(ours, Speed("q,v", "PEFT", notes=["failed: x"])).endswith("(a side has no measurement)")


@pytest.mark.parametrize("flags, words", [(["--threads", "0"], "--threads must be at least 1"),
                                          (["--rounds", "0"], "--rounds must be at least 1"),
                                          (["--only", "disk"], "invalid choice")])
def test_bad_flags_are_usage_errors(flags, words, capsys):
    with pytest.raises(SystemExit) as info:
        main(flags)
    assert info.value.code == 2 and words in capsys.readouterr().err
