"""Tiny random HuggingFace checkpoints built with transformers (fixed seeds), for tests.

:func:`cached_checkpoint` builds each (family, config) once per test process, in one
temporary folder removed at exit; tests that change a checkpoint copy it first."""

import atexit
import json
import shutil
import tempfile
from pathlib import Path

TINY = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
ARCHITECTURES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
    "mistral": ("MistralConfig", "MistralForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "granite": ("GraniteConfig", "GraniteForCausalLM"),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM"),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM"),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM"),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM"),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM"),
    "mamba": ("MambaConfig", "MambaForCausalLM"),
    "falcon_h1": ("FalconH1Config", "FalconH1ForCausalLM"),
    "phi3": ("Phi3Config", "Phi3ForCausalLM"),
}
# Checkpoints of other families that fit the std Llama's tensor names and shapes, with what a
# public config of the family sets (Granite-3's multipliers, Gemma-2's defaults): name -> (arch, config)
OTHER_FAMILIES = {
    "qwen2": ("qwen2", {}),
    "granite": ("granite", {"embedding_multiplier": 12.0, "residual_multiplier": 0.22, "logits_scaling": 8.0,
                            "attention_multiplier": 0.015625}),
    "gemma2": ("gemma2", {"head_dim": 8}),
}


# Falcon-H1 (attention and a Mamba-2 mixer side by side in every layer): 4 SSM heads of 8 channels in 2 groups
FALCON_H1 = {"mamba_d_ssm": 32, "mamba_n_heads": 4, "mamba_n_groups": 2, "mamba_d_state": 8, "mamba_d_conv": 4,
             "mamba_rms_norm": True}
LLAMA3_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 16}
# The std models on tiny checkpoints of every family and feature: name -> (arch, module file, config)
CASES = {
    "llama-gqa": ("llama", "llama.module", {}),
    "llama-tied": ("llama", "llama.module", {"tie_word_embeddings": True}),
    "llama-biases": ("llama", "llama.module", {"attention_bias": True, "mlp_bias": True}),
    "qwen3-attention-bias": ("qwen3", "qwen.module", {"head_dim": 16, "attention_bias": True}),
    "qwen2-qkv-bias": ("qwen2", "qwen2.module", {}),
    "qwen2-sliding-window": ("qwen2", "qwen2.module", {"use_sliding_window": True, "max_window_layers": 0,
                                                       "sliding_window": 5, "tie_word_embeddings": True}),
    # layer 0 full attention, layers 1 and 2 in a window of 5 (two stacks)
    "qwen2-mixed-windows": ("qwen2", "qwen2.module", {"use_sliding_window": True, "max_window_layers": 1,
                                                      "sliding_window": 5, "num_hidden_layers": 3}),
    "llama3-rope-scaling": ("llama", "llama.module", {"rope_parameters": {"rope_theta": 500000.0, **LLAMA3_SCALING}}),
    "qwen3-qk-norm": ("qwen3", "qwen.module", {"head_dim": 16}),
    "mistral-sliding-window": ("mistral", "mistral.module", {"sliding_window": 5}),
    "mixtral-moe": ("mixtral", "mixtral.module", {"num_local_experts": 4, "num_experts_per_tok": 2}),
    "qwen3-moe": ("qwen3_moe", "qwen3_moe.module", {"num_experts": 4, "num_experts_per_tok": 2,
                                                    "moe_intermediate_size": 24, "head_dim": 16,
                                                    "norm_topk_prob": True}),
    "mamba-ssm": ("mamba", "mamba.module", {"state_size": 4, "expand": 2, "conv_kernel": 4, "time_step_rank": 2}),
    "llama-yarn": ("llama", "llama.module", {"rope_parameters": {
        "rope_theta": 10000.0, "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}}),
    "falcon-h1-hybrid": ("falcon_h1", "falcon_h1.module", FALCON_H1),
    # Granite: the muP scalars of the public Granite-3 configs, with biases; tied with other scalars. Weights 10x
    # the default init so the scores are large enough to see the softmax scale (1/sqrt(head_dim) is off by 0.03)
    "granite-multipliers": ("granite", "granite.module", {"embedding_multiplier": 12.0,
                                                          "attention_multiplier": 0.015625,
                                                          "residual_multiplier": 0.22, "logits_scaling": 8.0,
                                                          "attention_bias": True, "mlp_bias": True,
                                                          "initializer_range": 0.2}),
    "granite-tied": ("granite", "granite.module", {"tie_word_embeddings": True, "embedding_multiplier": 6.0,
                                                   "attention_multiplier": 0.25, "residual_multiplier": 0.5,
                                                   "logits_scaling": 2.0, "initializer_range": 0.2}),
    # OLMo-2 (post-norm, QK-norm over the whole q and k projections; its eos id 50279 lies outside the tiny
    # vocabulary, and its pad id 1 would make transformers' nn.Embedding(padding_idx=1) drop that row's
    # gradient): untied GQA; tied with biases on q/k/v/o
    "olmo2-gqa": ("olmo2", "olmo2.module", {"pad_token_id": None, "eos_token_id": None}),
    "olmo2-tied-biases": ("olmo2", "olmo2.module", {"pad_token_id": None, "eos_token_id": None,
                                                    "tie_word_embeddings": True, "attention_bias": True}),
    # Phi-3 (fused qkv_proj and gate_up_proj; its pad/eos ids 32000 lie outside the tiny vocabulary): GQA in a
    # window of 5; RoPE on half of each head; Phi-4-mini-like longrope on 6 of the 8 head dims, tied, its factors
    # long past original_max_position_embeddings 8 (the 12-token sequences; generation from 6 tokens switches
    # and recomputes) and short below 64
    "phi3-gqa-sliding-window": ("phi3", "phi3.module", {"pad_token_id": None, "eos_token_id": None,
                                                        "sliding_window": 5}),
    "phi3-partial-rotary": ("phi3", "phi3.module", {"pad_token_id": None, "eos_token_id": None,
                                                    "partial_rotary_factor": 0.5}),
    **{f"phi3-longrope{suffix}": ("phi3", "phi3.module", {
        "pad_token_id": None, "eos_token_id": None, "partial_rotary_factor": 0.75, "tie_word_embeddings": True,
        "original_max_position_embeddings": original, "rope_parameters": {
            "rope_theta": 10000.0, "rope_type": "longrope", "short_factor": [1.0, 1.7, 3.1],
            "long_factor": [1.3, 5.0, 23.0]}}) for suffix, original in (("", 8), ("-short", 64))},
    # 4 layers alternating a window of 5 (below the 12-token sequences) and full attention, held as 2 pairs;
    # softcaps small enough to bend the tiny model's scores and logits; query_pre_attn_scalar != head_dim
    "gemma2-softcap": ("gemma2", "gemma2.module", {"num_hidden_layers": 4, "head_dim": 8, "sliding_window": 5,
                                                   "attn_logit_softcapping": 2.0, "final_logit_softcapping": 3.0,
                                                   "query_pre_attn_scalar": 12}),
    # 3 layers: a pair and a last local layer (the stack tail)
    "gemma2-odd-layers": ("gemma2", "gemma2.module", {"num_hidden_layers": 3, "head_dim": 8, "sliding_window": 5}),
    # Gemma 3: 8 layers, a group of five local layers and a global one, then two local ones (the stack tail);
    # the global RoPE linearly scaled, the local one of another theta (a model that swapped the tables fails);
    # attn_logit_softcapping set, as transformers' Gemma 3 reads and never applies it
    "gemma3-groups": ("gemma3", "gemma3.module", {
        "num_hidden_layers": 8, "head_dim": 8, "sliding_window": 5, "query_pre_attn_scalar": 12,
        "final_logit_softcapping": 3.0, "attn_logit_softcapping": 2.0, "rope_parameters": {
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 10000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 100.0}}}),
    # 3 local layers only (no group), untied, a 1B-like top-level rope_local_base_freq
    "gemma3-local-untied": ("gemma3", "gemma3.module", {"num_hidden_layers": 3, "head_dim": 8, "sliding_window": 5,
                                                        "tie_word_embeddings": False, "rope_local_base_freq": 50.0}),
}


def make_checkpoint(path: Path, arch: str = "llama", seed: int = 0, dtype: str | None = None, **config) -> Path:
    """A random checkpoint of ``arch`` (``dtype``: saved in that torch dtype, e.g. ``bfloat16``)."""
    import torch
    import transformers

    config_class, model_class = (getattr(transformers, n) for n in ARCHITECTURES[arch])
    torch.manual_seed(seed)
    model = model_class(config_class(**{**TINY, **config}))
    # random init leaves norm weights at 1 and biases at 0; perturb them so the tests see their mapping
    with torch.no_grad():
        for name, tensor in model.named_parameters():
            if "norm" in name or name.endswith(".bias"):
                tensor.add_(torch.randn_like(tensor) * 0.1)
    if dtype is not None:
        model = model.to(getattr(torch, dtype))
    model.save_pretrained(path)
    return path


_CACHE: dict[str, Path] = {}
_ROOT: list[Path] = []


def cached_checkpoint(arch: str = "llama", seed: int = 0, **config) -> Path:
    """A checkpoint built once per test process for these arguments (do not modify it: copy it)."""
    key = json.dumps([arch, seed, config], sort_keys=True)
    if key not in _CACHE:
        if not _ROOT:
            _ROOT.append(Path(tempfile.mkdtemp(prefix="mdsl-checkpoints-")))
            atexit.register(shutil.rmtree, _ROOT[0], True)
        _CACHE[key] = make_checkpoint(_ROOT[0] / f"{len(_CACHE)}-{arch}", arch, seed, **config)
    return _CACHE[key]


def transformers_model(path: Path):
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(path).eval()


def trainer_and_autograd_gradients(module_file: Path, path: Path, seed: int = 0):
    """The gradients of one next-token cross-entropy micro-batch ([2, 8] tokens) of the DSL model
    (its trainer's grads arena, by parameter) and of the transformers model (its parameters by
    name, each with ``.grad``), after checking the two losses agree within 1e-5 (with the router's
    auxiliary loss where the config asks transformers for it, and its z-loss, transformers'
    router_z_loss_func over every layer's router logits, where the config sets router_z_loss_coef)."""
    import numpy as np
    import pytest
    import torch

    import modeldsl
    from modeldsl.runtime.optim import AdamWConfig
    from modeldsl.runtime.train import Trainer

    tokens = np.random.default_rng(seed).integers(0, 64, (2, 9))
    trainer = Trainer(modeldsl.load(module_file, hf=path), AdamWConfig(lr=1e-3))
    loss = trainer.accumulate(tokens[:, :-1], tokens[:, 1:])
    reference = transformers_model(path).train()
    out = reference(torch.tensor(tokens[:, :-1]))
    logits = out.logits
    torch_loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                   torch.tensor(tokens[:, 1:]).reshape(-1))
    if getattr(out, "aux_loss", None) is not None:  # output_router_logits: as transformers adds it to its loss
        torch_loss = torch_loss + reference.config.router_aux_loss_coef * out.aux_loss
        z_coef = getattr(reference.config, "router_z_loss_coef", 0.0)
        if z_coef:
            from transformers.models.switch_transformers.modeling_switch_transformers import router_z_loss_func

            torch_loss = torch_loss + z_coef * router_z_loss_func(torch.stack(out.router_logits))
    torch_loss.backward()
    assert loss == pytest.approx(torch_loss.item(), rel=1e-5)
    return trainer.optimizer.grads, dict(reference.named_parameters())
