"""The std Qwen3 in the Python DSL (the twin of std/models/qwen.module)."""

from modeldsl.dsl import (
    Array,
    Param,
    Tensor,
    field,
    forward,
    fuse,
    graph,
    hf_config,
    hf_export,
    hf_mapping,
    model,
    split,
    tied_to,
)
from modeldsl.std.python.blocks.dense import DenseTransformerBlock
from modeldsl.std.python.modules.norm import RMSNorm


@model
@hf_config(
    architecture="Qwen3ForCausalLM",
    config_class="Qwen3Config",
    param_mapping={
        "vocab_size": "vocab_size",
        "d_model": "hidden_size",
        "n_layers": "num_hidden_layers",
        "num_heads": "num_attention_heads",
        "num_kv_heads": field("num_key_value_heads", null="num_heads"),
        "head_dim": "head_dim",
        "d_ff": "intermediate_size",
        "max_seq": "max_position_embeddings",
        "eps": "rms_norm_eps",
        "rope_theta": field("rope_theta", absent=10000.0),
        "tie_embeddings": field("tie_word_embeddings", absent=False),
        "attention_bias": "attention_bias",
    },
    require={"hidden_act": "silu"},
)
@hf_mapping({
    "embedding": "model.embed_tokens.weight",
    "final_norm.weight": "model.norm.weight",
    "lm_head?": "lm_head.weight",
    "blocks[{layer}].ln1.weight": "model.layers.{layer}.input_layernorm.weight",
    "blocks[{layer}].attention.qkv_weight": fuse("model.layers.{layer}.self_attn.q_proj.weight",
                                                 "model.layers.{layer}.self_attn.k_proj.weight",
                                                 "model.layers.{layer}.self_attn.v_proj.weight", dim=0),
    "blocks[{layer}].attention.q_norm": "model.layers.{layer}.self_attn.q_norm.weight",
    "blocks[{layer}].attention.k_norm": "model.layers.{layer}.self_attn.k_norm.weight",
    "blocks[{layer}].attention.qkv_bias?": fuse("model.layers.{layer}.self_attn.q_proj.bias",
                                                "model.layers.{layer}.self_attn.k_proj.bias",
                                                "model.layers.{layer}.self_attn.v_proj.bias", dim=0),
    "blocks[{layer}].attention.out_weight": "model.layers.{layer}.self_attn.o_proj.weight",
    "blocks[{layer}].attention.out_bias?": "model.layers.{layer}.self_attn.o_proj.bias",
    "blocks[{layer}].ln2.weight": "model.layers.{layer}.post_attention_layernorm.weight",
    "blocks[{layer}].mlp.up_weight": fuse("model.layers.{layer}.mlp.gate_proj.weight",
                                          "model.layers.{layer}.mlp.up_proj.weight", dim=0),
    "blocks[{layer}].mlp.down_weight": "model.layers.{layer}.mlp.down_proj.weight",
})
@hf_export({
    "blocks[{layer}].attention.qkv_weight": split({
        "model.layers.{layer}.self_attn.q_proj.weight": [0, "num_heads * head_dim"],
        "model.layers.{layer}.self_attn.k_proj.weight": ["num_heads * head_dim",
                                                         "(num_heads + num_kv_heads) * head_dim"],
        "model.layers.{layer}.self_attn.v_proj.weight": ["(num_heads + num_kv_heads) * head_dim",
                                                         "(num_heads + 2 * num_kv_heads) * head_dim"],
    }, dim=0),
    "blocks[{layer}].mlp.up_weight": split({
        "model.layers.{layer}.mlp.gate_proj.weight": [0, "d_ff"],
        "model.layers.{layer}.mlp.up_proj.weight": ["d_ff", "2 * d_ff"],
    }, dim=0),
    "blocks[{layer}].attention.qkv_bias": split({
        "model.layers.{layer}.self_attn.q_proj.bias": [0, "num_heads * head_dim"],
        "model.layers.{layer}.self_attn.k_proj.bias": ["num_heads * head_dim",
                                                       "(num_heads + num_kv_heads) * head_dim"],
        "model.layers.{layer}.self_attn.v_proj.bias": ["(num_heads + num_kv_heads) * head_dim",
                                                       "(num_heads + 2 * num_kv_heads) * head_dim"],
    }, dim=0),
})
class Qwen3:
    """Qwen3 (dense): GQA with a per-head RMSNorm of q and k before RoPE; tied LM head in the small sizes.

    freqs are the RoPE (cos, sin) pairs of the T positions, computed by the
    runtime from rope_theta (and the checkpoint's rope_scaling).
    """

    def __init__(self, vocab_size: int = 151936, d_model: int = 1024, n_layers: int = 28, num_heads: int = 16,
                 num_kv_heads: int = 8, head_dim: int = 128, d_ff: int = 3072, max_seq: int = 40960,
                 eps: float = 1e-6, rope_theta: float = 1000000.0, tie_embeddings: bool = True,
                 attention_bias: bool = False):
        assert self.num_heads % self.num_kv_heads == 0, \
            "num_attention_heads must be a multiple of num_key_value_heads"

    embedding = Param(Tensor["vocab_size", "d_model"])
    blocks = Param(Array["n_layers", DenseTransformerBlock("d_model", "num_heads", "num_kv_heads", "head_dim",
                                                           "d_ff", "eps", "attention_bias", True, 0,
                                                           "attention_bias")])
    final_norm = Param(RMSNorm("d_model", "eps"))
    lm_head = Param(tied_to("embedding"), when="tie_embeddings")
    lm_head = Param(Tensor["vocab_size", "d_model"], when="not tie_embeddings")  # noqa: F811 - the other case

    @forward
    def forward(self, tokens: Tensor["B", "T", "int32"], freqs: Tensor["T", "head_dim // 2", 2, "fp32"]
                ) -> Tensor["B", "T", "vocab_size"]:
        with graph() as g:
            x0 = g.embedding(tokens, "embedding", hook="AfterEmbedding")
            xN = self.blocks(x0, freqs)
            xF = self.final_norm(xN, hook="BeforeLMHead")
            logits = g.matmul(xF, "lm_head", transpose="NT")
            return logits
