"""The std Gemma 3 (text) in the Python DSL (the twin of std/models/gemma3.module)."""

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
from modeldsl.std.python.blocks.gemma import Gemma3LayerGroup, GemmaLayer
from modeldsl.std.python.modules.norm import RMSNorm


@model
@hf_config(
    architecture=["Gemma3ForCausalLM", "Gemma3ForConditionalGeneration"],
    config_class="Gemma3TextConfig",
    model_type=["gemma3_text", "gemma3"],
    tensor_prefix={"Gemma3ForConditionalGeneration": "language_model."},
    ignore_tensors=["vision_tower.*", "multi_modal_projector.*"],
    param_mapping={
        "vocab_size": field("vocab_size", absent=262208),
        "d_model": field("hidden_size", absent=2304),
        "n_layers": field("num_hidden_layers", absent=26),
        "num_heads": field("num_attention_heads", absent=8),
        "num_kv_heads": field("num_key_value_heads", null="num_heads", absent=4),
        "head_dim": field("head_dim", absent=256),
        "d_ff": field("intermediate_size", absent=9216),
        "max_seq": field("max_position_embeddings", absent=131072),
        "eps": field("rms_norm_eps", absent=1e-6),
        "rope_theta": field("rope_theta", absent=1000000.0),
        "rope_local_theta": field("rope_local_base_freq", absent=10000.0),
        "tie_embeddings": field("tie_word_embeddings", absent=True),
        "query_pre_attn_scalar": field("query_pre_attn_scalar", absent=256),
        "final_softcap": field("final_logit_softcapping", null=0.0, absent=0.0),
        "sliding_window": field("sliding_window", absent=4096),
    },
    require={"hidden_activation": "gelu_pytorch_tanh",
             "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention", "sliding_attention",
                             "sliding_attention", "full_attention"],
             "sliding_window_pattern": 6},
    ignore=["attn_logit_softcapping"],
)
@hf_mapping({
    "embedding": "model.embed_tokens.weight",
    "final_norm.weight": "model.norm.weight",
    "lm_head?": "lm_head.weight",
    "groups[{layer}].local_{k}.input_norm.weight": "model.layers.{6 * layer + k}.input_layernorm.weight",
    "groups[{layer}].local_{k}.attention.qkv_weight": fuse("model.layers.{6 * layer + k}.self_attn.q_proj.weight", "model.layers.{6 * layer + k}.self_attn.k_proj.weight", "model.layers.{6 * layer + k}.self_attn.v_proj.weight", dim=0),
    "groups[{layer}].local_{k}.attention.q_norm": "model.layers.{6 * layer + k}.self_attn.q_norm.weight",
    "groups[{layer}].local_{k}.attention.k_norm": "model.layers.{6 * layer + k}.self_attn.k_norm.weight",
    "groups[{layer}].local_{k}.attention.out_weight": "model.layers.{6 * layer + k}.self_attn.o_proj.weight",
    "groups[{layer}].local_{k}.post_attention_norm.weight": "model.layers.{6 * layer + k}.post_attention_layernorm.weight",
    "groups[{layer}].local_{k}.pre_mlp_norm.weight": "model.layers.{6 * layer + k}.pre_feedforward_layernorm.weight",
    "groups[{layer}].local_{k}.mlp.up_weight": fuse("model.layers.{6 * layer + k}.mlp.gate_proj.weight", "model.layers.{6 * layer + k}.mlp.up_proj.weight", dim=0),
    "groups[{layer}].local_{k}.mlp.down_weight": "model.layers.{6 * layer + k}.mlp.down_proj.weight",
    "groups[{layer}].local_{k}.post_mlp_norm.weight": "model.layers.{6 * layer + k}.post_feedforward_layernorm.weight",
    "groups[{layer}].global_layer.input_norm.weight": "model.layers.{6 * layer + 5}.input_layernorm.weight",
    "groups[{layer}].global_layer.attention.qkv_weight": fuse("model.layers.{6 * layer + 5}.self_attn.q_proj.weight", "model.layers.{6 * layer + 5}.self_attn.k_proj.weight", "model.layers.{6 * layer + 5}.self_attn.v_proj.weight", dim=0),
    "groups[{layer}].global_layer.attention.q_norm": "model.layers.{6 * layer + 5}.self_attn.q_norm.weight",
    "groups[{layer}].global_layer.attention.k_norm": "model.layers.{6 * layer + 5}.self_attn.k_norm.weight",
    "groups[{layer}].global_layer.attention.out_weight": "model.layers.{6 * layer + 5}.self_attn.o_proj.weight",
    "groups[{layer}].global_layer.post_attention_norm.weight": "model.layers.{6 * layer + 5}.post_attention_layernorm.weight",
    "groups[{layer}].global_layer.pre_mlp_norm.weight": "model.layers.{6 * layer + 5}.pre_feedforward_layernorm.weight",
    "groups[{layer}].global_layer.mlp.up_weight": fuse("model.layers.{6 * layer + 5}.mlp.gate_proj.weight", "model.layers.{6 * layer + 5}.mlp.up_proj.weight", dim=0),
    "groups[{layer}].global_layer.mlp.down_weight": "model.layers.{6 * layer + 5}.mlp.down_proj.weight",
    "groups[{layer}].global_layer.post_mlp_norm.weight": "model.layers.{6 * layer + 5}.post_feedforward_layernorm.weight",
    "tail[{layer}].input_norm.weight": "model.layers.{6 * (n_layers // 6) + layer}.input_layernorm.weight",
    "tail[{layer}].attention.qkv_weight": fuse("model.layers.{6 * (n_layers // 6) + layer}.self_attn.q_proj.weight", "model.layers.{6 * (n_layers // 6) + layer}.self_attn.k_proj.weight", "model.layers.{6 * (n_layers // 6) + layer}.self_attn.v_proj.weight", dim=0),
    "tail[{layer}].attention.q_norm": "model.layers.{6 * (n_layers // 6) + layer}.self_attn.q_norm.weight",
    "tail[{layer}].attention.k_norm": "model.layers.{6 * (n_layers // 6) + layer}.self_attn.k_norm.weight",
    "tail[{layer}].attention.out_weight": "model.layers.{6 * (n_layers // 6) + layer}.self_attn.o_proj.weight",
    "tail[{layer}].post_attention_norm.weight": "model.layers.{6 * (n_layers // 6) + layer}.post_attention_layernorm.weight",
    "tail[{layer}].pre_mlp_norm.weight": "model.layers.{6 * (n_layers // 6) + layer}.pre_feedforward_layernorm.weight",
    "tail[{layer}].mlp.up_weight": fuse("model.layers.{6 * (n_layers // 6) + layer}.mlp.gate_proj.weight", "model.layers.{6 * (n_layers // 6) + layer}.mlp.up_proj.weight", dim=0),
    "tail[{layer}].mlp.down_weight": "model.layers.{6 * (n_layers // 6) + layer}.mlp.down_proj.weight",
    "tail[{layer}].post_mlp_norm.weight": "model.layers.{6 * (n_layers // 6) + layer}.post_feedforward_layernorm.weight",
})
@hf_export({
    "groups[{layer}].local_{k}.attention.qkv_weight": split({
        "model.layers.{6 * layer + k}.self_attn.q_proj.weight": [0, "num_heads * head_dim"],
        "model.layers.{6 * layer + k}.self_attn.k_proj.weight": ["num_heads * head_dim", "(num_heads + num_kv_heads) * head_dim"],
        "model.layers.{6 * layer + k}.self_attn.v_proj.weight": ["(num_heads + num_kv_heads) * head_dim", "(num_heads + 2 * num_kv_heads) * head_dim"],
    }, dim=0),
    "groups[{layer}].local_{k}.mlp.up_weight": split({
        "model.layers.{6 * layer + k}.mlp.gate_proj.weight": [0, "d_ff"],
        "model.layers.{6 * layer + k}.mlp.up_proj.weight": ["d_ff", "2 * d_ff"],
    }, dim=0),
    "groups[{layer}].global_layer.attention.qkv_weight": split({
        "model.layers.{6 * layer + 5}.self_attn.q_proj.weight": [0, "num_heads * head_dim"],
        "model.layers.{6 * layer + 5}.self_attn.k_proj.weight": ["num_heads * head_dim", "(num_heads + num_kv_heads) * head_dim"],
        "model.layers.{6 * layer + 5}.self_attn.v_proj.weight": ["(num_heads + num_kv_heads) * head_dim", "(num_heads + 2 * num_kv_heads) * head_dim"],
    }, dim=0),
    "groups[{layer}].global_layer.mlp.up_weight": split({
        "model.layers.{6 * layer + 5}.mlp.gate_proj.weight": [0, "d_ff"],
        "model.layers.{6 * layer + 5}.mlp.up_proj.weight": ["d_ff", "2 * d_ff"],
    }, dim=0),
    "tail[{layer}].attention.qkv_weight": split({
        "model.layers.{6 * (n_layers // 6) + layer}.self_attn.q_proj.weight": [0, "num_heads * head_dim"],
        "model.layers.{6 * (n_layers // 6) + layer}.self_attn.k_proj.weight": ["num_heads * head_dim", "(num_heads + num_kv_heads) * head_dim"],
        "model.layers.{6 * (n_layers // 6) + layer}.self_attn.v_proj.weight": ["(num_heads + num_kv_heads) * head_dim", "(num_heads + 2 * num_kv_heads) * head_dim"],
    }, dim=0),
    "tail[{layer}].mlp.up_weight": split({
        "model.layers.{6 * (n_layers // 6) + layer}.mlp.gate_proj.weight": [0, "d_ff"],
        "model.layers.{6 * (n_layers // 6) + layer}.mlp.up_proj.weight": ["d_ff", "2 * d_ff"],
    }, dim=0),
})
class Gemma3:
    """Gemma 3's text model (Gemma3ForCausalLM: the 270M and 1B checkpoints; the text model of the
    Gemma3ForConditionalGeneration ones, 4B to 27B, whose config.json holds it in text_config and whose
    tensors hold it under language_model., the vision tower carried through an export unread): Gemma 2's layers with per-head
    QK-norms of (1 + weight), in groups of six as transformers' default layer_types (sliding_window_pattern
    6): five local layers (attention within sliding_window) then a global one (full attention), held as
    a stack of n_layers // 6 Gemma3LayerGroup (std/blocks/gemma.module) and the n_layers % 6 local
    layers after them (the stack tail). Embeddings times sqrt(d_model); attention scores scaled by
    query_pre_attn_scalar ** -0.5; optional final-logit softcapping (0, a null in config.json, is
    none). transformers' Gemma 3 reads attn_logit_softcapping but its attention never applies it, and
    neither does this model (hf_config ignores it).

    freqs are the RoPE (cos, sin) pairs of the T positions for the global layers, computed by the
    runtime from rope_theta (and the checkpoint's rope_scaling); local_freqs those for the local
    layers, from rope_local_theta (rope_local_base_freq) unscaled.
    """

    def __init__(self, vocab_size: int = 262208, d_model: int = 2304, n_layers: int = 26, num_heads: int = 8,
                 num_kv_heads: int = 4, head_dim: int = 256, d_ff: int = 9216, max_seq: int = 131072,
                 eps: float = 1e-6, rope_theta: float = 1000000.0, rope_local_theta: float = 10000.0,
                 tie_embeddings: bool = True, query_pre_attn_scalar: int = 256, final_softcap: float = 0.0,
                 sliding_window: int = 4096,
                 softmax_scale: float = "query_pre_attn_scalar ** -0.5", embed_scale: float = "sqrt(d_model)"):
        assert self.num_heads % self.num_kv_heads == 0, \
            "num_attention_heads must be a multiple of num_key_value_heads"
        assert self.sliding_window > 0, "the sliding-attention layers need a positive sliding_window"
        assert self.query_pre_attn_scalar > 0, "query_pre_attn_scalar must be positive"
        assert self.final_softcap >= 0.0, "final_logit_softcapping is 0 (none) or positive"

    embedding = Param(Tensor["vocab_size", "d_model"])
    groups = Param(Array["n_layers // 6", Gemma3LayerGroup("d_model", "num_heads", "num_kv_heads", "head_dim", "d_ff",
                                                           "eps", "softmax_scale", "sliding_window")])
    tail = Param(Array["n_layers % 6", GemmaLayer("d_model", "num_heads", "num_kv_heads", "head_dim", "d_ff", "eps",
                                                  "softmax_scale", 0.0, "sliding_window", True)])
    final_norm = Param(RMSNorm("d_model", "eps", 1.0))
    lm_head = Param(tied_to("embedding"), when="tie_embeddings")
    lm_head = Param(Tensor["vocab_size", "d_model"], when="not tie_embeddings")  # noqa: F811 - the other case

    @forward
    def forward(self, tokens: Tensor["B", "T", "int32"], freqs: Tensor["T", "head_dim // 2", 2, "fp32"],
                local_freqs: Tensor["T", "head_dim // 2", 2, "fp32"]) -> Tensor["B", "T", "vocab_size"]:
        with graph() as g:
            embedded = g.embedding(tokens, "embedding")
            x0 = g.scale(embedded, factor=self.embed_scale, hook="AfterEmbedding")
            x_groups = self.groups(x0, freqs, local_freqs)
            xN = self.tail(x_groups, local_freqs)
            xF = self.final_norm(xN, hook="BeforeLMHead")
            if self.final_softcap > 0.0:
                raw_logits = g.matmul(xF, "lm_head", transpose="NT")
                scaled_logits = g.scale(raw_logits, factor=1.0 / self.final_softcap)
                capped_logits = g.tanh(scaled_logits)
                logits = g.scale(capped_logits, factor=self.final_softcap)
            else:
                logits = g.matmul(xF, "lm_head", transpose="NT")
            return logits
