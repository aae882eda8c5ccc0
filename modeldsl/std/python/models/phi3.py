"""The std Phi-3 in the Python DSL (the twin of std/models/phi3.module)."""

from modeldsl.dsl import Array, Param, Tensor, field, forward, graph, hf_config, hf_mapping, model, tied_to
from modeldsl.std.python.blocks.dense import DenseTransformerBlock
from modeldsl.std.python.modules.norm import RMSNorm


@model
@hf_config(
    architecture="Phi3ForCausalLM",
    config_class="Phi3Config",
    param_mapping={
        "vocab_size": "vocab_size",
        "d_model": "hidden_size",
        "n_layers": "num_hidden_layers",
        "num_heads": "num_attention_heads",
        "num_kv_heads": field("num_key_value_heads", null="num_heads", absent="num_heads"),
        "head_dim": field("head_dim", null="default"),
        "d_ff": "intermediate_size",
        "max_seq": "max_position_embeddings",
        "original_max_seq": field("original_max_position_embeddings", absent=4096),
        "eps": field("rms_norm_eps", absent=1e-5),
        "rope_theta": field("rope_theta", absent=10000.0),
        "tie_embeddings": field("tie_word_embeddings", absent=False),
        "sliding_window": field("sliding_window", null=0, absent=0),
        "partial_rotary_factor": field("partial_rotary_factor", absent=1.0),
    },
    require={"hidden_act": "silu"},
)
@hf_mapping({
    "embedding": "model.embed_tokens.weight",
    "final_norm.weight": "model.norm.weight",
    "lm_head?": "lm_head.weight",
    "blocks[{layer}].ln1.weight": "model.layers.{layer}.input_layernorm.weight",
    "blocks[{layer}].attention.qkv_weight": "model.layers.{layer}.self_attn.qkv_proj.weight",
    "blocks[{layer}].attention.out_weight": "model.layers.{layer}.self_attn.o_proj.weight",
    "blocks[{layer}].ln2.weight": "model.layers.{layer}.post_attention_layernorm.weight",
    "blocks[{layer}].mlp.up_weight": "model.layers.{layer}.mlp.gate_up_proj.weight",
    "blocks[{layer}].mlp.down_weight": "model.layers.{layer}.mlp.down_proj.weight",
})
class Phi3:
    """Phi-3, Phi-3.5 and Phi-4-mini (transformers' Phi3ForCausalLM): Llama-style blocks with the
    q, k and v projections fused in one qkv_proj ([q; k; v], GQA's qkv_weight as it is) and gate
    and up in one gate_up_proj ([gate; up], SwiGLU_MLP's up_weight), no biases, tied or untied LM
    head, an optional sliding window (every layer; transformers 5 applies the config's
    sliding_window), and RoPE on the first rotary_dim = int(head_dim * partial_rotary_factor) dims
    of each head only (Phi-4-mini: 0.75).

    freqs are the RoPE (cos, sin) pairs of the T positions for the rotary_dim dims, computed by
    the runtime from rope_theta and the checkpoint's rope_scaling: LongRoPE (Phi-3-128k, Phi-3.5,
    Phi-4-mini) divides the frequencies by short_factor, or by long_factor once the sequence is
    longer than original_max_seq (original_max_position_embeddings), and scales cos and sin by
    its attention factor. Generation that crosses original_max_seq recomputes the whole sequence
    with the long factors, as transformers' Phi-3 does. Dropout (resid_pdrop, embd_pdrop,
    attention_dropout) is training-time only, and the trainer applies none.
    """

    def __init__(self, vocab_size: int = 32064, d_model: int = 3072, n_layers: int = 32, num_heads: int = 32,
                 num_kv_heads: int = 32, head_dim: int = "d_model // num_heads", d_ff: int = 8192,
                 max_seq: int = 4096, original_max_seq: int = 4096, eps: float = 1e-5, rope_theta: float = 10000.0,
                 tie_embeddings: bool = False, sliding_window: int = 0, partial_rotary_factor: float = 1.0,
                 rotary_dim: int = "int(head_dim * partial_rotary_factor)"):
        assert self.num_heads % self.num_kv_heads == 0, \
            "num_attention_heads must be a multiple of num_key_value_heads"
        assert self.rotary_dim % 2 == 0 and 0 < self.rotary_dim and self.rotary_dim <= self.head_dim, \
            ("RoPE rotates an even number of each head's dims: int(head_dim * partial_rotary_factor) must be even, "
             "positive and at most head_dim")

    embedding = Param(Tensor["vocab_size", "d_model"])
    blocks = Param(Array["n_layers", DenseTransformerBlock("d_model", "num_heads", "num_kv_heads", "head_dim",
                                                           "d_ff", "eps", False, False, "sliding_window",
                                                           rotary_pass="head_dim - rotary_dim")])
    final_norm = Param(RMSNorm("d_model", "eps"))
    lm_head = Param(tied_to("embedding"), when="tie_embeddings")
    lm_head = Param(Tensor["vocab_size", "d_model"], when="not tie_embeddings")  # noqa: F811 - the other case

    @forward
    def forward(self, tokens: Tensor["B", "T", "int32"], freqs: Tensor["T", "rotary_dim // 2", 2, "fp32"]
                ) -> Tensor["B", "T", "vocab_size"]:
        with graph() as g:
            x0 = g.embedding(tokens, "embedding", hook="AfterEmbedding")
            xN = self.blocks(x0, freqs)
            xF = self.final_norm(xN, hook="BeforeLMHead")
            logits = g.matmul(xF, "lm_head", transpose="NT")
            return logits
