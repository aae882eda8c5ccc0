"""Tiny random HuggingFace checkpoints built with transformers (fixed seeds), for tests."""

from pathlib import Path

TINY = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
ARCHITECTURES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
    "mistral": ("MistralConfig", "MistralForCausalLM"),
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
