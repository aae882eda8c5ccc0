"""The std Falcon-H1 in the Python DSL (the twin of std/models/falcon_h1.module)."""

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
from modeldsl.std.python.blocks.parallel import ParallelHybridBlock
from modeldsl.std.python.modules.norm import RMSNorm


@model
@hf_config(
    architecture="FalconH1ForCausalLM",
    config_class="FalconH1Config",
    model_type="falcon_h1",
    param_mapping={
        "vocab_size": "vocab_size",
        "d_model": "hidden_size",
        "n_layers": "num_hidden_layers",
        "num_heads": "num_attention_heads",
        "num_kv_heads": field("num_key_value_heads", null="num_heads"),
        "head_dim": "head_dim",
        "d_ff": "intermediate_size",
        "ssm_expand": "mamba_expand",
        "d_ssm": field("mamba_d_ssm", null="ssm_expand * d_model"),
        "ssm_heads": "mamba_n_heads",
        "ssm_groups": "mamba_n_groups",
        "d_state": "mamba_d_state",
        "d_conv": "mamba_d_conv",
        "max_seq": "max_position_embeddings",
        "eps": "rms_norm_eps",
        "rope_theta": field("rope_theta", absent=10000.0),
        "tie_embeddings": "tie_word_embeddings",
        "attention_bias": "attention_bias",
        "mlp_bias": "mlp_bias",
        "ssm_conv_bias": field("mamba_conv_bias", null=False),
        "ssm_proj_bias": field("mamba_proj_bias", null=False),
        "projectors_bias": field("projectors_bias", null=False),
        "ssm_norm": field("mamba_rms_norm", null=False),
        "ssm_norm_before_gate": field("mamba_norm_before_gate", null=False),
        "embedding_multiplier": "embedding_multiplier",
        "lm_head_multiplier": "lm_head_multiplier",
        "attention_in_multiplier": "attention_in_multiplier",
        "attention_out_multiplier": "attention_out_multiplier",
        "key_multiplier": "key_multiplier",
        "ssm_in_multiplier": "ssm_in_multiplier",
        "ssm_out_multiplier": "ssm_out_multiplier",
        "ssm_z_multiplier": field("ssm_multipliers", index=0, null=1.0),
        "ssm_x_multiplier": field("ssm_multipliers", index=1, null=1.0),
        "ssm_b_multiplier": field("ssm_multipliers", index=2, null=1.0),
        "ssm_c_multiplier": field("ssm_multipliers", index=3, null=1.0),
        "ssm_dt_multiplier": field("ssm_multipliers", index=4, null=1.0),
        "mlp_gate_multiplier": field("mlp_multipliers", index=0, null=1.0),
        "mlp_down_multiplier": field("mlp_multipliers", index=1, null=1.0),
    },
    require={"hidden_act": "silu"},
    ignore=["mamba_d_head", "mamba_chunk_size", "num_logits_to_keep", "attention_dropout", "initializer_range",
            "use_cache"],
)
@hf_mapping({
    "embedding": "model.embed_tokens.weight",
    "final_norm.weight": "model.final_layernorm.weight",
    "lm_head?": "lm_head.weight",
    "blocks[{layer}].ln1.weight": "model.layers.{layer}.input_layernorm.weight",
    "blocks[{layer}].attention.qkv_weight": fuse("model.layers.{layer}.self_attn.q_proj.weight",
                                                 "model.layers.{layer}.self_attn.k_proj.weight",
                                                 "model.layers.{layer}.self_attn.v_proj.weight", dim=0),
    "blocks[{layer}].attention.qkv_bias?": fuse("model.layers.{layer}.self_attn.q_proj.bias",
                                                "model.layers.{layer}.self_attn.k_proj.bias",
                                                "model.layers.{layer}.self_attn.v_proj.bias", dim=0),
    "blocks[{layer}].attention.out_weight": "model.layers.{layer}.self_attn.o_proj.weight",
    "blocks[{layer}].attention.out_bias?": "model.layers.{layer}.self_attn.o_proj.bias",
    "blocks[{layer}].mamba.in_proj": "model.layers.{layer}.mamba.in_proj.weight",
    "blocks[{layer}].mamba.in_proj_bias?": "model.layers.{layer}.mamba.in_proj.bias",
    "blocks[{layer}].mamba.conv_weight": "model.layers.{layer}.mamba.conv1d.weight",
    "blocks[{layer}].mamba.conv_bias?": "model.layers.{layer}.mamba.conv1d.bias",
    "blocks[{layer}].mamba.dt_bias": "model.layers.{layer}.mamba.dt_bias",
    "blocks[{layer}].mamba.A_log": "model.layers.{layer}.mamba.A_log",
    "blocks[{layer}].mamba.D": "model.layers.{layer}.mamba.D",
    "blocks[{layer}].mamba.norm_weight?": "model.layers.{layer}.mamba.norm.weight",
    "blocks[{layer}].mamba.out_proj": "model.layers.{layer}.mamba.out_proj.weight",
    "blocks[{layer}].mamba.out_proj_bias?": "model.layers.{layer}.mamba.out_proj.bias",
    "blocks[{layer}].ln2.weight": "model.layers.{layer}.pre_ff_layernorm.weight",
    "blocks[{layer}].feed_forward.up_weight": fuse("model.layers.{layer}.feed_forward.gate_proj.weight",
                                                   "model.layers.{layer}.feed_forward.up_proj.weight", dim=0),
    "blocks[{layer}].feed_forward.up_bias?": fuse("model.layers.{layer}.feed_forward.gate_proj.bias",
                                                  "model.layers.{layer}.feed_forward.up_proj.bias", dim=0),
    "blocks[{layer}].feed_forward.down_weight": "model.layers.{layer}.feed_forward.down_proj.weight",
    "blocks[{layer}].feed_forward.down_bias?": "model.layers.{layer}.feed_forward.down_proj.bias",
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
    "blocks[{layer}].feed_forward.up_weight": split({
        "model.layers.{layer}.feed_forward.gate_proj.weight": [0, "d_ff"],
        "model.layers.{layer}.feed_forward.up_proj.weight": ["d_ff", "2 * d_ff"],
    }, dim=0),
    "blocks[{layer}].feed_forward.up_bias": split({
        "model.layers.{layer}.feed_forward.gate_proj.bias": [0, "d_ff"],
        "model.layers.{layer}.feed_forward.up_proj.bias": ["d_ff", "2 * d_ff"],
    }, dim=0),
})
class FalconH1:
    """Falcon-H1 (FalconH1ForCausalLM): in every layer, GQA attention with RoPE and a Mamba-2 mixer
    (spec 11.3's, as Nemotron-H's) run side by side on the same normed input, then a SwiGLU MLP; the muP
    multipliers of the checkpoint scale the embedding, the logits, the attention's input, keys and output,
    the mixer's input, in_proj segments [z; x; B; C; dt] and output, and the MLP's gate and output.

    freqs are the RoPE (cos, sin) pairs of the T positions, computed by the
    runtime from rope_theta (and the checkpoint's rope_scaling).
    ssm_{z,x,b,c,dt}_multiplier are the five ssm_multipliers and mlp_{gate,down}_multiplier the two
    mlp_multipliers, read element by element (field(..., index=I); a null list is all 1.0, as in
    transformers) and written back as the lists. time_step_limit, Mamba-2's clamp of the step size, is
    not applied: only its default (0, inf) computes what transformers does, and nothing refuses another
    limit yet (modeldsl.hf.compat does not list the field, and require: cannot spell infinity).
    """

    def __init__(self, vocab_size: int = 128000, d_model: int = 4096, n_layers: int = 32, num_heads: int = 32,
                 num_kv_heads: int = 8, head_dim: int = "d_model // num_heads", d_ff: int = 14336,
                 ssm_expand: int = 2, d_ssm: int = 1024, ssm_heads: int = 128, ssm_groups: int = 1,
                 d_state: int = 256, d_conv: int = 4, max_seq: int = 8192, eps: float = 1e-5,
                 rope_theta: float = 10000.0, tie_embeddings: bool = False, attention_bias: bool = False,
                 mlp_bias: bool = False, ssm_conv_bias: bool = True, ssm_proj_bias: bool = False,
                 projectors_bias: bool = False, ssm_norm: bool = False, ssm_norm_before_gate: bool = True,
                 embedding_multiplier: float = 1.0, lm_head_multiplier: float = 1.0,
                 attention_in_multiplier: float = 1.0, attention_out_multiplier: float = 1.0,
                 key_multiplier: float = 1.0, ssm_in_multiplier: float = 1.0, ssm_out_multiplier: float = 1.0,
                 ssm_z_multiplier: float = 1.0, ssm_x_multiplier: float = 1.0, ssm_b_multiplier: float = 1.0,
                 ssm_c_multiplier: float = 1.0, ssm_dt_multiplier: float = 1.0, mlp_gate_multiplier: float = 1.0,
                 mlp_down_multiplier: float = 1.0):
        assert self.num_heads % self.num_kv_heads == 0, \
            "num_attention_heads must be a multiple of num_key_value_heads"

    embedding = Param(Tensor["vocab_size", "d_model"])
    blocks = Param(Array["n_layers", ParallelHybridBlock(
        "d_model", "num_heads", "num_kv_heads", "head_dim", "d_ff", "d_ssm", "ssm_heads", "ssm_groups", "d_state",
        "d_conv", "eps", "attention_bias", "mlp_bias", "ssm_conv_bias", "ssm_proj_bias", "projectors_bias",
        "ssm_norm", "ssm_norm_before_gate", "attention_in_multiplier", "attention_out_multiplier", "key_multiplier",
        "ssm_in_multiplier", "ssm_out_multiplier", "ssm_z_multiplier", "ssm_x_multiplier", "ssm_b_multiplier",
        "ssm_c_multiplier", "ssm_dt_multiplier", "mlp_gate_multiplier", "mlp_down_multiplier")])
    final_norm = Param(RMSNorm("d_model", "eps"))
    lm_head = Param(tied_to("embedding"), when="tie_embeddings")
    lm_head = Param(Tensor["vocab_size", "d_model"], when="not tie_embeddings")  # noqa: F811 - the other case

    @forward
    def forward(self, tokens: Tensor["B", "T", "int32"], freqs: Tensor["T", "head_dim // 2", 2, "fp32"]
                ) -> Tensor["B", "T", "vocab_size"]:
        with graph() as g:
            embedded = g.embedding(tokens, "embedding")
            x0 = g.scale(embedded, factor=self.embedding_multiplier, hook="AfterEmbedding")
            xN = self.blocks(x0, freqs)
            xF = self.final_norm(xN, hook="BeforeLMHead")
            raw_logits = g.matmul(xF, "lm_head", transpose="NT")
            logits = g.scale(raw_logits, factor=self.lm_head_multiplier)
            return logits
