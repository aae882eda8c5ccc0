"""The std DSL models on tiny random transformers checkpoints: logits, generation, bf16."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from hf_checkpoints import CASES, cached_checkpoint, transformers_model

import modeldsl
from modeldsl.diagnostics import DiagnosticError
from modeldsl.hf.safetensors_io import SafetensorsFile
from modeldsl.resolve.imports import STD_ROOT

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

MODELS = STD_ROOT / "models"
EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "tiny_llama"  # vocab 384, 256 positions
TOKENS = [3, 17, 42, 5, 9, 33, 2, 61, 7, 12, 40, 8]  # T = 12 >= twice the window


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request):
    arch, module, config = CASES[request.param]
    path = cached_checkpoint(arch, **config)
    return request.param, path, modeldsl.load(MODELS / module, hf=path)


def reference_logits(path, tokens):
    with torch.no_grad():
        return transformers_model(path)(torch.tensor([tokens])).logits[0].numpy()


def test_logits_match_transformers_in_fp32(case):
    name, path, model = case
    logits = model.forward(TOKENS)
    expected = reference_logits(path, TOKENS)
    assert np.abs(logits - expected).max() <= 1e-4, name


def test_batched_forward_equals_rows(case):
    _, _, model = case
    batch = np.array([TOKENS, TOKENS[::-1]])
    logits = model.forward(batch)
    np.testing.assert_allclose(logits[1], model.forward(TOKENS[::-1]), atol=1e-5)


def test_greedy_generation_with_the_kv_cache_equals_recomputation_and_transformers(case):
    name, path, model = case
    prompt = TOKENS[:6]
    cached = model.generate(prompt, 16)
    assert cached == model.generate(prompt, 16, use_cache=False), name
    reference = transformers_model(path)
    with torch.no_grad():
        expected = reference.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False,
                                      pad_token_id=0)[0, len(prompt):].tolist()
    assert cached[:len(expected)] == expected, name
    assert len(expected) == 16 or expected[-1] == reference.generation_config.eos_token_id  # transformers stops there


def test_sampling_is_reproducible_with_a_seed(case):
    _, _, model = case
    first = model.generate(TOKENS[:4], 6, temperature=0.8, top_k=10, seed=3)
    assert first == model.generate(TOKENS[:4], 6, temperature=0.8, top_k=10, seed=3)


def test_bf16_storage_stays_close_to_fp32():
    path = cached_checkpoint("llama")
    fp32 = modeldsl.load(MODELS / "llama.module", hf=path).forward(TOKENS)
    bf16 = modeldsl.load(MODELS / "llama.module", hf=path, dtype="bf16")
    assert next(iter(bf16.weights.values())).dtype.name == "bfloat16"
    assert np.abs(bf16.forward(TOKENS) - fp32).max() < 0.05 * np.abs(fp32).max()


LLAMA_LONGROPE = ("llama", "llama.module", {"rope_parameters": {
    "rope_theta": 10000.0, "rope_type": "longrope", "original_max_position_embeddings": 8,
    "short_factor": [1.0, 1.7, 3.1, 4.0], "long_factor": [1.3, 5.0, 23.0, 40.0]}})


@pytest.mark.parametrize("engine", ["schedule", "graph"])
@pytest.mark.parametrize("name", ["phi3-longrope", "llama-longrope"])
def test_longrope_generation_takes_the_long_factors_as_transformers_does(name, engine):
    """Past original_max_position_embeddings (8) longrope takes its long factors. Phi-3's transformers
    generation then drops its cache and runs the whole sequence again; Llama's keeps the keys rotated
    with the short ones. Every step's logits are transformers' generation's (for Phi-3, keeping the
    short keys would be 1e-3 off)."""
    arch, module, config = CASES[name] if name in CASES else LLAMA_LONGROPE
    path = cached_checkpoint(arch, **config)
    model = modeldsl.load(MODELS / module, hf=path)
    reference = transformers_model(path)
    prompt = TOKENS[:6]
    with torch.no_grad():
        out = reference.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False, pad_token_id=0,
                                 output_logits=True, return_dict_in_generate=True)
    sequence = out.sequences[0].tolist()
    assert model.rope.uses_long(9) and not model.rope.uses_long(8)
    assert model.rope.recomputes(8, 9) == (arch == "phi3") and not model.rope.recomputes(9, 10)
    step = model.decoder(len(sequence), use_cache=True, engine=engine)
    for i, expected in enumerate(out.logits):
        fed = len(prompt) + i
        logits = step(sequence[:fed], 0 if i == 0 else fed - 1)
        assert np.abs(logits - expected[0].numpy()).max() <= 1e-4, i


def test_save_hf_round_trips_through_the_model(tmp_path):
    path = cached_checkpoint("llama")
    model = modeldsl.load(MODELS / "llama.module", hf=path)
    model.save_hf(tmp_path / "out")
    again = modeldsl.load(MODELS / "llama.module", hf=tmp_path / "out")
    np.testing.assert_array_equal(again.forward(TOKENS), model.forward(TOKENS))


@pytest.mark.parametrize("name", ["llama-biases", "qwen3-attention-bias", "qwen2-qkv-bias", "qwen2-sliding-window",
                                  "qwen2-mixed-windows", "gemma2-softcap", "granite-multipliers", "granite-tied",
                                  "phi3-gqa-sliding-window", "phi3-partial-rotary", "phi3-longrope", "olmo2-gqa",
                                  "olmo2-tied-biases", "gemma2-odd-layers", "gemma3-groups",
                                  "gemma3-local-untied"])
def test_save_hf_writes_the_checkpoint_back_bitwise_and_transformers_reloads_it_whole(name, tmp_path):
    arch, module, config = CASES[name]
    path = cached_checkpoint(arch, **config)
    modeldsl.load(MODELS / module, hf=path).save_hf(tmp_path)
    original, written = SafetensorsFile(path / "model.safetensors"), SafetensorsFile(tmp_path / "model.safetensors")
    assert sorted(written.keys()) == sorted(original.keys())
    for tensor in original.keys():
        np.testing.assert_array_equal(written.array(tensor), original.array(tensor), err_msg=tensor)
    import transformers

    _, info = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    assert not any(info.values()), info


@pytest.mark.parametrize("module, extra", [
    ("llama.module", {}), ("qwen.module", {}), ("mistral.module", {}),
    ("llama.module", {"attention_bias": True, "mlp_bias": True}), ("qwen.module", {"attention_bias": True}),
    ("qwen2.module", {}), ("qwen2.module", {"use_sliding_window": True, "sliding_window": 5, "max_window_layers": 0}),
    ("phi3.module", {}), ("granite.module", {}), ("olmo2.module", {}), ("gemma2.module", {"n_layers": 3}),
    ("gemma3.module", {"n_layers": 7, "sliding_window": 5}),
], ids=["llama", "qwen3", "mistral", "llama-biases", "qwen3-attention-bias", "qwen2", "qwen2-sliding-window", "phi3",
        "granite", "olmo2", "gemma2-odd-layers", "gemma3"])
def test_a_random_model_exports_a_checkpoint_transformers_loads(module, extra, tmp_path):
    config = {**dict(vocab_size=64, d_model=32, n_layers=2, num_heads=4, num_kv_heads=2, head_dim=8, d_ff=48, eps=1e-6),
              **extra}
    model = modeldsl.load(MODELS / module, config=config)
    model.save_hf(tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())
    assert [written[f] for f in ("bos_token_id", "eos_token_id", "pad_token_id")] == [None] * 3  # no tokenizer
    np.testing.assert_allclose(model.forward(TOKENS), reference_logits(tmp_path, TOKENS), atol=1e-5)


# ------------------------------------------------------------------ bad API arguments are coded diagnostics
@pytest.fixture(scope="module")
def tiny():
    return modeldsl.load(MODELS / "llama.module", hf=EXAMPLE)


def coded(call, code="E029"):
    with pytest.raises(DiagnosticError) as info:
        call()
    (diagnostic,) = info.value.diagnostics
    assert diagnostic.code == code and diagnostic.hint
    return diagnostic.message


@pytest.mark.parametrize("tokens, words", [
    ([-1], "token id -1 at position 0 is outside the vocabulary [0, 384)"),
    ([5, 384], "token id 384 at position 1 is outside the vocabulary [0, 384)"),
    ([[1, 2], [3, 400]], "token id 400 at position [1, 1] is outside"),
    ([1.7], "token id 1.7 is not an integer"),
    ([3, 2.0], "token id 3.0 is not an integer"),
    ([True], "token id True is not an integer"),
    (["a"], "token id 'a' is not an integer"),
    ([], "the token ids are empty"),
    ([[]], "the token ids are empty"),
    ([[1, 2], [3]], "do not form one"),
    (7, "got an array of shape ()"),
    ([1] * 257, "the sequence would reach 257 positions, more than the model's 256"),
])
def test_forward_refuses_bad_token_ids(tiny, tokens, words):
    assert words in coded(lambda: tiny.forward(tokens))


def test_forward_checks_the_positions_of_a_cached_sequence(tiny):
    from modeldsl.runtime.executor import KVCache

    cache = KVCache()
    tiny.forward([1] * 255, cache)
    tiny.forward([2], cache)
    assert "would reach 257 positions" in coded(lambda: tiny.forward([3], cache))


@pytest.mark.parametrize("args, words", [
    (([], 2), "the token ids are empty"),
    (([[1, 2]], 2), "must be a list of token ids"),
    (([1, -3], 2), "token id -3 at position 1"),
    (([1], -1), "max_new_tokens must not be negative"),
    (([1], 2.5), "max_new_tokens must be a non-negative integer"),
    (([1], 2, float("nan")), "temperature must be a finite number >= 0"),
    (([1], 2, float("inf")), "temperature must be a finite number >= 0"),
    (([1], 2, -0.5), "temperature must be a finite number >= 0"),
    (([1], 2, 1.0, -1), "top_k must not be negative"),
    (([1], 2, 1.0, None, -5), "seed must not be negative, got -5"),
    (([1], 2, 1.0, None, 1.5), "seed must be a non-negative integer"),
    (([1] * 250, 7), "the prompt (250 tokens) and max_new_tokens=7 exceed the model's 256 positions"),
])
def test_generate_refuses_bad_arguments(tiny, args, words):
    assert words in coded(lambda: tiny.generate(*args))


def test_generate_runs_up_to_the_last_position(tiny):
    assert len(tiny.generate([1] * 250, 6)) == 6


def test_save_hf_under_a_regular_file_is_e028(tiny, tmp_path):
    (tmp_path / "file").write_text("x")
    target = tmp_path / "file" / "out"
    message = coded(lambda: tiny.save_hf(target), "E028")
    assert str(target) in message and "Not a directory" in message


@pytest.mark.parametrize("scaling", [{"rope_type": "linear", "factor": 2.0}, {"rope_type": "dynamic", "factor": 2.0}])
def test_phi3_takes_only_the_rope_types_of_transformers_phi3(scaling, tmp_path):
    """transformers' Phi3Config refuses every rope type but default and longrope; so does the std Phi-3 (E030),
    where the std Llama computes them."""
    arch, _, checkpoint_config = CASES["phi3-partial-rotary"]
    path = shutil.copytree(cached_checkpoint(arch, **checkpoint_config), tmp_path / "phi3")
    config = json.loads((path / "config.json").read_text())
    config["rope_parameters"] = {**config["rope_parameters"], **scaling}
    (path / "config.json").write_text(json.dumps(config))
    message = coded(lambda: modeldsl.load(MODELS / "phi3.module", hf=path), "E030")
    assert f"rope_type '{scaling['rope_type']}', which Phi3ForCausalLM does not take" in message
