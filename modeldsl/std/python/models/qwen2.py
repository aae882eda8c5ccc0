"""The std Qwen2 in the Python DSL (the twin of std/models/qwen2.module)."""

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
    architecture="Qwen2ForCausalLM",
    config_class="Qwen2Config",
    param_mapping={
        "vocab_size": "vocab_size",
        "d_model": "hidden_size",
        "n_layers": "num_hidden_layers",
        "num_heads": "num_attention_heads",
        "num_kv_heads": field("num_key_value_heads", null="num_heads", absent="num_heads"),
        "head_dim": field("head_dim", null="default"),
        "d_ff": "intermediate_size",
        "max_seq": "max_position_embeddings",
        "eps": field("rms_norm_eps", absent=1e-6),
        "rope_theta": field("rope_theta", absent=10000.0),
        "tie_embeddings": field("tie_word_embeddings", absent=False),
        "use_sliding_window": field("use_sliding_window", absent=False),
        "sliding_window": field("sliding_window", null=0, absent=0),
        "max_window_layers": field("max_window_layers", absent=28),
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
    "blocks[{layer}].attention.qkv_bias": fuse("model.layers.{layer}.self_attn.q_proj.bias",
                                               "model.layers.{layer}.self_attn.k_proj.bias",
                                               "model.layers.{layer}.self_attn.v_proj.bias", dim=0),
    "blocks[{layer}].attention.out_weight": "model.layers.{layer}.self_attn.o_proj.weight",
    "blocks[{layer}].ln2.weight": "model.layers.{layer}.post_attention_layernorm.weight",
    "blocks[{layer}].mlp.up_weight": fuse("model.layers.{layer}.mlp.gate_proj.weight",
                                          "model.layers.{layer}.mlp.up_proj.weight", dim=0),
    "blocks[{layer}].mlp.down_weight": "model.layers.{layer}.mlp.down_proj.weight",
    "window_blocks[{layer}].ln1.weight": "model.layers.{layer + first_window_layer}.input_layernorm.weight",
    "window_blocks[{layer}].attention.qkv_weight": fuse("model.layers.{layer + first_window_layer}.self_attn.q_proj.weight",
                                                 "model.layers.{layer + first_window_layer}.self_attn.k_proj.weight",
                                                 "model.layers.{layer + first_window_layer}.self_attn.v_proj.weight", dim=0),
    "window_blocks[{layer}].attention.qkv_bias": fuse("model.layers.{layer + first_window_layer}.self_attn.q_proj.bias",
                                               "model.layers.{layer + first_window_layer}.self_attn.k_proj.bias",
                                               "model.layers.{layer + first_window_layer}.self_attn.v_proj.bias", dim=0),
    "window_blocks[{layer}].attention.out_weight": "model.layers.{layer + first_window_layer}.self_attn.o_proj.weight",
    "window_blocks[{layer}].ln2.weight": "model.layers.{layer + first_window_layer}.post_attention_layernorm.weight",
    "window_blocks[{layer}].mlp.up_weight": fuse("model.layers.{layer + first_window_layer}.mlp.gate_proj.weight",
                                          "model.layers.{layer + first_window_layer}.mlp.up_proj.weight", dim=0),
    "window_blocks[{layer}].mlp.down_weight": "model.layers.{layer + first_window_layer}.mlp.down_proj.weight",

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
    "window_blocks[{layer}].attention.qkv_weight": split({
        "model.layers.{layer + first_window_layer}.self_attn.q_proj.weight": [0, "num_heads * head_dim"],
        "model.layers.{layer + first_window_layer}.self_attn.k_proj.weight": ["num_heads * head_dim",
                                                         "(num_heads + num_kv_heads) * head_dim"],
        "model.layers.{layer + first_window_layer}.self_attn.v_proj.weight": ["(num_heads + num_kv_heads) * head_dim",
                                                         "(num_heads + 2 * num_kv_heads) * head_dim"],
    }, dim=0),
    "window_blocks[{layer}].attention.qkv_bias": split({
        "model.layers.{layer + first_window_layer}.self_attn.q_proj.bias": [0, "num_heads * head_dim"],
        "model.layers.{layer + first_window_layer}.self_attn.k_proj.bias": ["num_heads * head_dim",
                                                       "(num_heads + num_kv_heads) * head_dim"],
        "model.layers.{layer + first_window_layer}.self_attn.v_proj.bias": ["(num_heads + num_kv_heads) * head_dim",
                                                       "(num_heads + 2 * num_kv_heads) * head_dim"],
    }, dim=0),
    "window_blocks[{layer}].mlp.up_weight": split({
        "model.layers.{layer + first_window_layer}.mlp.gate_proj.weight": [0, "d_ff"],
        "model.layers.{layer + first_window_layer}.mlp.up_proj.weight": ["d_ff", "2 * d_ff"],
    }, dim=0),
})
class Qwen2:
    """Qwen2 and Qwen2.5 (and the DeepSeek-R1-Distill-Qwen and Qwen2.5-Coder checkpoints): Llama-style
    blocks with biases on the q, k and v projections (none on o), no QK-norm, head_dim = d_model /
    num_heads.

    With use_sliding_window, the layers from max_window_layers on attend within sliding_window
    (transformers' layer_types): blocks holds the layers before first_window_layer (full attention)
    and window_blocks the layers from it on, each stack of identical blocks.

    freqs are the RoPE (cos, sin) pairs of the T positions, computed by the
    runtime from rope_theta (and the checkpoint's rope_scaling).
    """

    def __init__(self, vocab_size: int = 151936, d_model: int = 4096, n_layers: int = 32, num_heads: int = 32,
                 num_kv_heads: int = 32, head_dim: int = "d_model // num_heads", d_ff: int = 22016,
                 max_seq: int = 32768, eps: float = 1e-6, rope_theta: float = 10000.0, tie_embeddings: bool = False,
                 use_sliding_window: bool = False, sliding_window: int = 0, max_window_layers: int = 28,
                 first_window_layer: int = ("min(max_window_layers, n_layers) if use_sliding_window and "
                                            "sliding_window > 0 else n_layers")):
        assert self.num_heads % self.num_kv_heads == 0, \
            "num_attention_heads must be a multiple of num_key_value_heads"
        assert 0 <= self.first_window_layer and self.first_window_layer <= self.n_layers, \
            "first_window_layer is a layer index (0 to n_layers)"

    embedding = Param(Tensor["vocab_size", "d_model"])
    blocks = Param(Array["first_window_layer", DenseTransformerBlock("d_model", "num_heads", "num_kv_heads",
                                                                     "head_dim", "d_ff", "eps", True, False, 0)])
    window_blocks = Param(Array["n_layers - first_window_layer",
                                DenseTransformerBlock("d_model", "num_heads", "num_kv_heads", "head_dim", "d_ff", "eps",
                                                      True, False, "sliding_window")])
    final_norm = Param(RMSNorm("d_model", "eps"))
    lm_head = Param(tied_to("embedding"), when="tie_embeddings")
    lm_head = Param(Tensor["vocab_size", "d_model"], when="not tie_embeddings")  # noqa: F811 - the other case

    @forward
    def forward(self, tokens: Tensor["B", "T", "int32"], freqs: Tensor["T", "head_dim // 2", 2, "fp32"]
                ) -> Tensor["B", "T", "vocab_size"]:
        with graph() as g:
            x0 = g.embedding(tokens, "embedding", hook="AfterEmbedding")
            x_full = self.blocks(x0, freqs)
            xN = self.window_blocks(x_full, freqs)
            xF = self.final_norm(xN, hook="BeforeLMHead")
            logits = g.matmul(xF, "lm_head", transpose="NT")
            return logits
