"""The served families at the dimensions of their published configs (hidden sizes, heads, head dims,
vocabularies, RoPE settings, multipliers as on the Hub), random weights and fewer layers, against
transformers in fp32. Slow (large vocabularies): the tiny checkpoints of hf_checkpoints.CASES run the
same code in the default run; ``python -m pytest -m slow tests/unit/hf/test_published_configs.py``."""

import json

import numpy as np
import pytest

import modeldsl

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TOKENS = [2, 818, 5279, 529, 7001, 563, 496, 4706, 1600, 2361, 107, 11]
LONG = [1.0 + 0.05 * i for i in range(48)]  # 48 longrope factors: rotary dim 96
PUBLISHED = {
    "Qwen2.5-0.5B": ("Qwen2Config", "Qwen2ForCausalLM", {
        "hidden_size": 896, "intermediate_size": 4864, "num_attention_heads": 14, "num_key_value_heads": 2,
        "num_hidden_layers": 3, "vocab_size": 151936, "max_position_embeddings": 32768, "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "use_sliding_window": False, "sliding_window": 32768,
        "max_window_layers": 21}),
    "Phi-3.5-mini": ("Phi3Config", "Phi3ForCausalLM", {
        "hidden_size": 3072, "intermediate_size": 8192, "num_attention_heads": 32, "num_key_value_heads": 32,
        "num_hidden_layers": 2, "vocab_size": 32064, "max_position_embeddings": 131072,
        "original_max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "sliding_window": 262144,
        "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 32000, "pad_token_id": 32000,
        "rope_scaling": {"type": "longrope", "short_factor": LONG, "long_factor": [2 * f for f in LONG]}}),
    "Phi-4-mini": ("Phi3Config", "Phi3ForCausalLM", {
        "hidden_size": 3072, "intermediate_size": 8192, "num_attention_heads": 24, "num_key_value_heads": 8,
        "num_hidden_layers": 2, "vocab_size": 200064, "max_position_embeddings": 131072,
        "original_max_position_embeddings": 4096, "partial_rotary_factor": 0.75, "rms_norm_eps": 1e-5,
        "tie_word_embeddings": True, "bos_token_id": 199999, "eos_token_id": 199999, "pad_token_id": 199999,
        "rope_scaling": {"type": "longrope", "short_factor": LONG, "long_factor": [3 * f for f in LONG]}}),
    "Granite-3.1-2B": ("GraniteConfig", "GraniteForCausalLM", {
        "hidden_size": 2048, "intermediate_size": 8192, "num_attention_heads": 32, "num_key_value_heads": 8,
        "num_hidden_layers": 2, "vocab_size": 49155, "max_position_embeddings": 131072, "rope_theta": 5000000.0,
        "embedding_multiplier": 12.0, "attention_multiplier": 0.015625, "residual_multiplier": 0.22,
        "logits_scaling": 8.0, "tie_word_embeddings": True, "rms_norm_eps": 1e-5}),
    "OLMo-2-1B": ("Olmo2Config", "Olmo2ForCausalLM", {
        "hidden_size": 2048, "intermediate_size": 8192, "num_attention_heads": 16, "num_key_value_heads": 16,
        "num_hidden_layers": 2, "vocab_size": 100352, "max_position_embeddings": 4096, "rope_theta": 500000.0,
        "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "pad_token_id": 100277, "eos_token_id": 100257}),
    "Gemma-2-2B": ("Gemma2Config", "Gemma2ForCausalLM", {
        "hidden_size": 2304, "intermediate_size": 9216, "num_attention_heads": 8, "num_key_value_heads": 4,
        "head_dim": 256, "num_hidden_layers": 3, "vocab_size": 256000, "max_position_embeddings": 8192,
        "query_pre_attn_scalar": 256, "sliding_window": 4096, "attn_logit_softcapping": 50.0,
        "final_logit_softcapping": 30.0}),
    "Gemma-3-1B": ("Gemma3TextConfig", "Gemma3ForCausalLM", {
        "hidden_size": 1152, "intermediate_size": 6912, "num_attention_heads": 4, "num_key_value_heads": 1,
        "head_dim": 256, "num_hidden_layers": 7, "vocab_size": 262144, "max_position_embeddings": 32768,
        "query_pre_attn_scalar": 256, "sliding_window": 512, "rope_local_base_freq": 10000.0,
        "rope_theta": 1000000.0}),
    # the Hub's config lists these text fields only (the rest are Gemma3TextConfig's defaults); a tiny vision tower
    "Gemma-3-4B": ("Gemma3Config", "Gemma3ForConditionalGeneration", {
        "text_config": {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
                        "num_hidden_layers": 7, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                        "sliding_window": 1024},
        "vision_config": {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
                          "num_attention_heads": 2, "image_size": 28, "patch_size": 14},
        "mm_tokens_per_image": 4}),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_a_published_configuration_matches_transformers(name, tmp_path):
    config_class, model_class, config = PUBLISHED[name]
    torch.manual_seed(0)
    hf = getattr(transformers, model_class)(getattr(transformers, config_class)(**config)).eval()
    with torch.no_grad():  # random init leaves norms at 1 (0 for Gemma's 1 + w): perturb them
        for tensor_name, tensor in hf.named_parameters():
            if "norm" in tensor_name:
                tensor.add_(torch.randn_like(tensor) * 0.1)
        expected = hf(input_ids=torch.tensor([TOKENS])).logits[0].numpy()
    hf.save_pretrained(tmp_path)
    del hf
    model = modeldsl.load(hf=tmp_path)
    assert model.model.sym_name.data in json.loads((tmp_path / "config.json").read_text())["architectures"][0]
    assert np.abs(model.forward(TOKENS) - expected).max() <= 1e-4
