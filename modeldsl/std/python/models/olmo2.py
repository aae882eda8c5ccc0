"""The std OLMo-2 in the Python DSL (the twin of std/models/olmo2.module)."""

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
    architecture="Olmo2ForCausalLM",
    config_class="Olmo2Config",
    param_mapping={
        "vocab_size": "vocab_size",
        "d_model": "hidden_size",
        "n_layers": "num_hidden_layers",
        "num_heads": "num_attention_heads",
        "num_kv_heads": field("num_key_value_heads", null="num_heads", absent="num_heads"),
        "head_dim": field("head_dim", null="default"),
        "d_ff": "intermediate_size",
        "max_seq": "max_position_embeddings",
        "eps": field("rms_norm_eps", absent=1e-5),
        "rope_theta": field("rope_theta", absent=10000.0),
        "tie_embeddings": field("tie_word_embeddings", absent=False),
        "attention_bias": field("attention_bias", absent=False),
    },
    require={"hidden_act": "silu"},
)
@hf_mapping({
    "embedding": "model.embed_tokens.weight",
    "final_norm.weight": "model.norm.weight",
    "lm_head?": "lm_head.weight",
    "blocks[{layer}].attention.qkv_weight": fuse("model.layers.{layer}.self_attn.q_proj.weight",
                                                 "model.layers.{layer}.self_attn.k_proj.weight",
                                                 "model.layers.{layer}.self_attn.v_proj.weight", dim=0),
    "blocks[{layer}].attention.qkv_bias?": fuse("model.layers.{layer}.self_attn.q_proj.bias",
                                                "model.layers.{layer}.self_attn.k_proj.bias",
                                                "model.layers.{layer}.self_attn.v_proj.bias", dim=0),
    "blocks[{layer}].attention.q_norm": "model.layers.{layer}.self_attn.q_norm.weight",
    "blocks[{layer}].attention.k_norm": "model.layers.{layer}.self_attn.k_norm.weight",
    "blocks[{layer}].attention.out_weight": "model.layers.{layer}.self_attn.o_proj.weight",
    "blocks[{layer}].attention.out_bias?": "model.layers.{layer}.self_attn.o_proj.bias",
    "blocks[{layer}].ln1.weight": "model.layers.{layer}.post_attention_layernorm.weight",
    "blocks[{layer}].mlp.up_weight": fuse("model.layers.{layer}.mlp.gate_proj.weight",
                                          "model.layers.{layer}.mlp.up_proj.weight", dim=0),
    "blocks[{layer}].mlp.down_weight": "model.layers.{layer}.mlp.down_proj.weight",
    "blocks[{layer}].ln2.weight": "model.layers.{layer}.post_feedforward_layernorm.weight",
})
@hf_export({
    "blocks[{layer}].attention.qkv_weight": split({
        "model.layers.{layer}.self_attn.q_proj.weight": [0, "num_heads * head_dim"],
        "model.layers.{layer}.self_attn.k_proj.weight": ["num_heads * head_dim",
                                                         "(num_heads + num_kv_heads) * head_dim"],
        "model.layers.{layer}.self_attn.v_proj.weight": ["(num_heads + num_kv_heads) * head_dim",
                                                         "(num_heads + 2 * num_kv_heads) * head_dim"],
    }, dim=0),
    "blocks[{layer}].attention.qkv_bias": split({
        "model.layers.{layer}.self_attn.q_proj.bias": [0, "num_heads * head_dim"],
        "model.layers.{layer}.self_attn.k_proj.bias": ["num_heads * head_dim",
                                                       "(num_heads + num_kv_heads) * head_dim"],
        "model.layers.{layer}.self_attn.v_proj.bias": ["(num_heads + num_kv_heads) * head_dim",
                                                       "(num_heads + 2 * num_kv_heads) * head_dim"],
    }, dim=0),
    "blocks[{layer}].mlp.up_weight": split({
        "model.layers.{layer}.mlp.gate_proj.weight": [0, "d_ff"],
        "model.layers.{layer}.mlp.up_proj.weight": ["d_ff", "2 * d_ff"],
    }, dim=0),
})
class Olmo2:
    """OLMo-2 (Olmo2ForCausalLM): post-norm blocks, x + norm(attn(x)), then + norm(mlp(.)), with no
    norm before either branch; QK-norm as one RMSNorm over the whole q projection [num_heads *
    head_dim] and one over the whole k projection [num_kv_heads * head_dim], before the head split
    and RoPE; GQA through num_kv_heads; biases on the q/k/v/o projections with attention_bias (none
    on the MLP); tied or untied LM head.

    freqs are the RoPE (cos, sin) pairs of the T positions, computed by the
    runtime from rope_theta (and the checkpoint's rope_scaling).
    """

    def __init__(self, vocab_size: int = 50304, d_model: int = 4096, n_layers: int = 32, num_heads: int = 32,
                 num_kv_heads: int = 32, head_dim: int = "d_model // num_heads", d_ff: int = 11008,
                 max_seq: int = 2048, eps: float = 1e-5, rope_theta: float = 10000.0, tie_embeddings: bool = False,
                 attention_bias: bool = False):
        assert self.num_heads % self.num_kv_heads == 0, \
            "num_attention_heads must be a multiple of num_key_value_heads"

    embedding = Param(Tensor["vocab_size", "d_model"])
    blocks = Param(Array["n_layers", DenseTransformerBlock("d_model", "num_heads", "num_kv_heads", "head_dim",
                                                           "d_ff", "eps", "attention_bias", False, 0,
                                                           "attention_bias", False, qk_norm_whole=True,
                                                           post_norm=True)])
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
