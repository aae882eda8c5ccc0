"""The std Gemma 2 in the Python DSL (the twin of std/models/gemma2.module)."""

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
from modeldsl.std.python.blocks.gemma import Gemma2LayerPair, GemmaLayer
from modeldsl.std.python.modules.norm import RMSNorm


@model
@hf_config(
    architecture="Gemma2ForCausalLM",
    config_class="Gemma2Config",
    param_mapping={
        "vocab_size": "vocab_size",
        "d_model": "hidden_size",
        "n_layers": "num_hidden_layers",
        "num_heads": "num_attention_heads",
        "num_kv_heads": field("num_key_value_heads", null="num_heads", absent="num_heads"),
        "head_dim": field("head_dim", absent=256),
        "d_ff": "intermediate_size",
        "max_seq": "max_position_embeddings",
        "eps": field("rms_norm_eps", absent=1e-6),
        "rope_theta": field("rope_theta", absent=10000.0),
        "tie_embeddings": field("tie_word_embeddings", absent=True),
        "query_pre_attn_scalar": field("query_pre_attn_scalar", absent=256),
        "attn_softcap": field("attn_logit_softcapping", null=0.0, absent=50.0),
        "final_softcap": field("final_logit_softcapping", null=0.0, absent=30.0),
        "sliding_window": field("sliding_window", absent=4096),
    },
    require={"hidden_activation": "gelu_pytorch_tanh", "layer_types": ["sliding_attention", "full_attention"]},
)
@hf_mapping({
    "embedding": "model.embed_tokens.weight",
    "final_norm.weight": "model.norm.weight",
    "lm_head?": "lm_head.weight",
    "pairs[{layer}].local_layer.input_norm.weight": "model.layers.{2 * layer}.input_layernorm.weight",
    "pairs[{layer}].local_layer.attention.qkv_weight": fuse("model.layers.{2 * layer}.self_attn.q_proj.weight", "model.layers.{2 * layer}.self_attn.k_proj.weight", "model.layers.{2 * layer}.self_attn.v_proj.weight", dim=0),
    "pairs[{layer}].local_layer.attention.out_weight": "model.layers.{2 * layer}.self_attn.o_proj.weight",
    "pairs[{layer}].local_layer.post_attention_norm.weight": "model.layers.{2 * layer}.post_attention_layernorm.weight",
    "pairs[{layer}].local_layer.pre_mlp_norm.weight": "model.layers.{2 * layer}.pre_feedforward_layernorm.weight",
    "pairs[{layer}].local_layer.mlp.up_weight": fuse("model.layers.{2 * layer}.mlp.gate_proj.weight", "model.layers.{2 * layer}.mlp.up_proj.weight", dim=0),
    "pairs[{layer}].local_layer.mlp.down_weight": "model.layers.{2 * layer}.mlp.down_proj.weight",
    "pairs[{layer}].local_layer.post_mlp_norm.weight": "model.layers.{2 * layer}.post_feedforward_layernorm.weight",
    "pairs[{layer}].global_layer.input_norm.weight": "model.layers.{2 * layer + 1}.input_layernorm.weight",
    "pairs[{layer}].global_layer.attention.qkv_weight": fuse("model.layers.{2 * layer + 1}.self_attn.q_proj.weight", "model.layers.{2 * layer + 1}.self_attn.k_proj.weight", "model.layers.{2 * layer + 1}.self_attn.v_proj.weight", dim=0),
    "pairs[{layer}].global_layer.attention.out_weight": "model.layers.{2 * layer + 1}.self_attn.o_proj.weight",
    "pairs[{layer}].global_layer.post_attention_norm.weight": "model.layers.{2 * layer + 1}.post_attention_layernorm.weight",
    "pairs[{layer}].global_layer.pre_mlp_norm.weight": "model.layers.{2 * layer + 1}.pre_feedforward_layernorm.weight",
    "pairs[{layer}].global_layer.mlp.up_weight": fuse("model.layers.{2 * layer + 1}.mlp.gate_proj.weight", "model.layers.{2 * layer + 1}.mlp.up_proj.weight", dim=0),
    "pairs[{layer}].global_layer.mlp.down_weight": "model.layers.{2 * layer + 1}.mlp.down_proj.weight",
    "pairs[{layer}].global_layer.post_mlp_norm.weight": "model.layers.{2 * layer + 1}.post_feedforward_layernorm.weight",
    "tail[{layer}].input_norm.weight": "model.layers.{2 * (n_layers // 2) + layer}.input_layernorm.weight",
    "tail[{layer}].attention.qkv_weight": fuse("model.layers.{2 * (n_layers // 2) + layer}.self_attn.q_proj.weight", "model.layers.{2 * (n_layers // 2) + layer}.self_attn.k_proj.weight", "model.layers.{2 * (n_layers // 2) + layer}.self_attn.v_proj.weight", dim=0),
    "tail[{layer}].attention.out_weight": "model.layers.{2 * (n_layers // 2) + layer}.self_attn.o_proj.weight",
    "tail[{layer}].post_attention_norm.weight": "model.layers.{2 * (n_layers // 2) + layer}.post_attention_layernorm.weight",
    "tail[{layer}].pre_mlp_norm.weight": "model.layers.{2 * (n_layers // 2) + layer}.pre_feedforward_layernorm.weight",
    "tail[{layer}].mlp.up_weight": fuse("model.layers.{2 * (n_layers // 2) + layer}.mlp.gate_proj.weight", "model.layers.{2 * (n_layers // 2) + layer}.mlp.up_proj.weight", dim=0),
    "tail[{layer}].mlp.down_weight": "model.layers.{2 * (n_layers // 2) + layer}.mlp.down_proj.weight",
    "tail[{layer}].post_mlp_norm.weight": "model.layers.{2 * (n_layers // 2) + layer}.post_feedforward_layernorm.weight",
})
@hf_export({
    "pairs[{layer}].local_layer.attention.qkv_weight": split({
        "model.layers.{2 * layer}.self_attn.q_proj.weight": [0, "num_heads * head_dim"],
        "model.layers.{2 * layer}.self_attn.k_proj.weight": ["num_heads * head_dim", "(num_heads + num_kv_heads) * head_dim"],
        "model.layers.{2 * layer}.self_attn.v_proj.weight": ["(num_heads + num_kv_heads) * head_dim", "(num_heads + 2 * num_kv_heads) * head_dim"],
    }, dim=0),
    "pairs[{layer}].local_layer.mlp.up_weight": split({
        "model.layers.{2 * layer}.mlp.gate_proj.weight": [0, "d_ff"],
        "model.layers.{2 * layer}.mlp.up_proj.weight": ["d_ff", "2 * d_ff"],
    }, dim=0),
    "pairs[{layer}].global_layer.attention.qkv_weight": split({
        "model.layers.{2 * layer + 1}.self_attn.q_proj.weight": [0, "num_heads * head_dim"],
        "model.layers.{2 * layer + 1}.self_attn.k_proj.weight": ["num_heads * head_dim", "(num_heads + num_kv_heads) * head_dim"],
        "model.layers.{2 * layer + 1}.self_attn.v_proj.weight": ["(num_heads + num_kv_heads) * head_dim", "(num_heads + 2 * num_kv_heads) * head_dim"],
    }, dim=0),
    "pairs[{layer}].global_layer.mlp.up_weight": split({
        "model.layers.{2 * layer + 1}.mlp.gate_proj.weight": [0, "d_ff"],
        "model.layers.{2 * layer + 1}.mlp.up_proj.weight": ["d_ff", "2 * d_ff"],
    }, dim=0),
    "tail[{layer}].attention.qkv_weight": split({
        "model.layers.{2 * (n_layers // 2) + layer}.self_attn.q_proj.weight": [0, "num_heads * head_dim"],
        "model.layers.{2 * (n_layers // 2) + layer}.self_attn.k_proj.weight": ["num_heads * head_dim", "(num_heads + num_kv_heads) * head_dim"],
        "model.layers.{2 * (n_layers // 2) + layer}.self_attn.v_proj.weight": ["(num_heads + num_kv_heads) * head_dim", "(num_heads + 2 * num_kv_heads) * head_dim"],
    }, dim=0),
    "tail[{layer}].mlp.up_weight": split({
        "model.layers.{2 * (n_layers // 2) + layer}.mlp.gate_proj.weight": [0, "d_ff"],
        "model.layers.{2 * (n_layers // 2) + layer}.mlp.up_proj.weight": ["d_ff", "2 * d_ff"],
    }, dim=0),
})
class Gemma2:
    """Gemma 2: embeddings times sqrt(d_model); layers that alternate a local one (attention within
    sliding_window) and a global one (full attention), as transformers' default layer_types, held as
    a stack of n_layers // 2 Gemma2LayerPair (std/blocks/gemma.module) and, for an odd number of
    layers, a last local one (the stack tail); RMSNorms of (1 + weight)
    before and after attention and the GeGLU MLP (tanh GELU); attention scores scaled by
    query_pre_attn_scalar ** -0.5 and capped to attn_softcap * tanh(s / attn_softcap); logits capped
    to final_softcap * tanh(l / final_softcap) (a softcap of 0, a null in config.json, is none).

    freqs are the RoPE (cos, sin) pairs of the T positions, computed by the
    runtime from rope_theta (and the checkpoint's rope_scaling).
    """

    def __init__(self, vocab_size: int = 256000, d_model: int = 2304, n_layers: int = 26, num_heads: int = 8,
                 num_kv_heads: int = 4, head_dim: int = 256, d_ff: int = 9216, max_seq: int = 8192,
                 eps: float = 1e-6, rope_theta: float = 10000.0, tie_embeddings: bool = True,
                 query_pre_attn_scalar: int = 256, attn_softcap: float = 50.0, final_softcap: float = 30.0,
                 sliding_window: int = 4096, softmax_scale: float = "query_pre_attn_scalar ** -0.5",
                 embed_scale: float = "sqrt(d_model)"):
        assert self.num_heads % self.num_kv_heads == 0, \
            "num_attention_heads must be a multiple of num_key_value_heads"
        assert self.sliding_window > 0, "the sliding-attention layers need a positive sliding_window"
        assert self.query_pre_attn_scalar > 0, "query_pre_attn_scalar must be positive"
        assert self.attn_softcap >= 0.0 and self.final_softcap >= 0.0, "a softcapping is 0 (none) or positive"

    embedding = Param(Tensor["vocab_size", "d_model"])
    pairs = Param(Array["n_layers // 2", Gemma2LayerPair("d_model", "num_heads", "num_kv_heads", "head_dim", "d_ff",
                                                         "eps", "softmax_scale", "attn_softcap", "sliding_window")])
    tail = Param(Array["n_layers % 2", GemmaLayer("d_model", "num_heads", "num_kv_heads", "head_dim", "d_ff", "eps",
                                                  "softmax_scale", "attn_softcap", "sliding_window")])
    final_norm = Param(RMSNorm("d_model", "eps", 1.0))
    lm_head = Param(tied_to("embedding"), when="tie_embeddings")
    lm_head = Param(Tensor["vocab_size", "d_model"], when="not tie_embeddings")  # noqa: F811 - the other case

    @forward
    def forward(self, tokens: Tensor["B", "T", "int32"], freqs: Tensor["T", "head_dim // 2", 2, "fp32"]
                ) -> Tensor["B", "T", "vocab_size"]:
        with graph() as g:
            embedded = g.embedding(tokens, "embedding")
            x0 = g.scale(embedded, factor=self.embed_scale, hook="AfterEmbedding")
            x_pairs = self.pairs(x0, freqs)
            xN = self.tail(x_pairs, freqs)
            xF = self.final_norm(xN, hook="BeforeLMHead")
            if self.final_softcap > 0.0:
                raw_logits = g.matmul(xF, "lm_head", transpose="NT")
                scaled_logits = g.scale(raw_logits, factor=1.0 / self.final_softcap)
                capped_logits = g.tanh(scaled_logits)
                logits = g.scale(capped_logits, factor=self.final_softcap)
            else:
                logits = g.matmul(xF, "lm_head", transpose="NT")
            return logits
