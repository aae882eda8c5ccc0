"""Tiny random HuggingFace checkpoints built with transformers (fixed seeds), for tests."""

from pathlib import Path

TINY = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
ARCHITECTURES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
    "mistral": ("MistralConfig", "MistralForCausalLM"),
}


LLAMA3_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 16}
# The std models on tiny checkpoints of every family and feature: name -> (arch, module file, config)
CASES = {
    "llama-gqa": ("llama", "llama.module", {}),
    "llama-tied": ("llama", "llama.module", {"tie_word_embeddings": True}),
    "llama3-rope-scaling": ("llama", "llama.module", {"rope_parameters": {"rope_theta": 500000.0, **LLAMA3_SCALING}}),
    "qwen3-qk-norm": ("qwen3", "qwen.module", {"head_dim": 16}),
    "mistral-sliding-window": ("mistral", "mistral.module", {"sliding_window": 5}),
    "llama-yarn": ("llama", "llama.module", {"rope_parameters": {
        "rope_theta": 10000.0, "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}}),
}


def make_checkpoint(path: Path, arch: str = "llama", seed: int = 0, **config) -> Path:
    import torch
    import transformers

    config_class, model_class = (getattr(transformers, n) for n in ARCHITECTURES[arch])
    torch.manual_seed(seed)
    model = model_class(config_class(**{**TINY, **config}))
    # random init leaves norm weights at 1; perturb them so the tests see their mapping
    with torch.no_grad():
        for name, tensor in model.named_parameters():
            if "norm" in name:
                tensor.add_(torch.randn_like(tensor) * 0.1)
    model.save_pretrained(path)
    return path


def transformers_model(path: Path):
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(path).eval()
