"""The std Qwen3-MoE in the Python DSL (the twin of std/models/qwen3_moe.module)."""

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
    stack_experts,
    tied_to,
)
from modeldsl.std.python.blocks.moe import MoETransformerBlock
from modeldsl.std.python.modules.moe.router import RouterAuxLoss
from modeldsl.std.python.modules.norm import RMSNorm


@model
@hf_config(
    architecture="Qwen3MoeForCausalLM",
    config_class="Qwen3MoeConfig",
    param_mapping={
        "vocab_size": "vocab_size",
        "d_model": "hidden_size",
        "n_layers": "num_hidden_layers",
        "num_heads": "num_attention_heads",
        "num_kv_heads": field("num_key_value_heads", null="num_heads"),
        "head_dim": "head_dim",
        "d_ff": "moe_intermediate_size",
        "num_experts": "num_experts",
        "top_k": "num_experts_per_tok",
        "normalize": "norm_topk_prob",
        "max_seq": "max_position_embeddings",
        "eps": "rms_norm_eps",
        "rope_theta": field("rope_theta", absent=10000.0),
        "tie_embeddings": field("tie_word_embeddings", absent=False),
        "attention_bias": "attention_bias",
        "router_aux_loss": field("output_router_logits", absent=False),
        "router_aux_loss_coef": field("router_aux_loss_coef", absent=0.001),
        "router_z_loss_coef": field("router_z_loss_coef", absent=0.0),
    },
    require={"hidden_act": "silu", "decoder_sparse_step": 1, "mlp_only_layers": []},
    ignore=["intermediate_size", "num_local_experts"],
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
    "blocks[{layer}].ln2.weight": "model.layers.{layer}.post_attention_layernorm.weight",
    "blocks[{layer}].mlp.router": "model.layers.{layer}.mlp.gate.weight",
    "blocks[{layer}].mlp.experts_gate": stack_experts("model.layers.{layer}.mlp.experts.{expert}.gate_proj.weight",
                                                      n="num_experts"),
    "blocks[{layer}].mlp.experts_up": stack_experts("model.layers.{layer}.mlp.experts.{expert}.up_proj.weight",
                                                    n="num_experts"),
    "blocks[{layer}].mlp.experts_down": stack_experts("model.layers.{layer}.mlp.experts.{expert}.down_proj.weight",
                                                      n="num_experts"),
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
})
class Qwen3Moe:
    """Qwen3-MoE: Qwen3 attention (a per-head RMSNorm of q and k) with a sparse mixture of SwiGLU experts
    in every layer (decoder_sparse_step 1, no mlp_only_layers; normalize is norm_topk_prob).

    aux_loss is transformers' load-balancing loss when router_aux_loss (output_router_logits), else 0,
    plus router_z_loss_coef times the router z-loss (0 unless the config sets router_z_loss_coef;
    RouterAuxLoss). Training adds it to the cross-entropy as transformers does.

    freqs are the RoPE (cos, sin) pairs of the T positions, computed by the
    runtime from rope_theta (and the checkpoint's rope_scaling).
    """

    def __init__(self, vocab_size: int = 151936, d_model: int = 2048, n_layers: int = 48, num_heads: int = 32,
                 num_kv_heads: int = 4, head_dim: int = 128, d_ff: int = 768, num_experts: int = 128,
                 top_k: int = 8, normalize: bool = True, max_seq: int = 40960,
                 eps: float = 1e-6, rope_theta: float = 1000000.0, tie_embeddings: bool = False,
                 attention_bias: bool = False, router_aux_loss: bool = False, router_aux_loss_coef: float = 0.001,
                 router_z_loss_coef: float = 0.0):
        assert self.num_heads % self.num_kv_heads == 0, \
            "num_attention_heads must be a multiple of num_key_value_heads"

    embedding = Param(Tensor["vocab_size", "d_model"])
    blocks = Param(Array["n_layers", MoETransformerBlock("d_model", "num_heads", "num_kv_heads", "head_dim", "d_ff",
                                                         "num_experts", "top_k", "eps", 0, "normalize",
                                                         "attention_bias", True)])
    final_norm = Param(RMSNorm("d_model", "eps"))
    balance = Param(RouterAuxLoss("num_experts", "top_k", "router_aux_loss_coef", "router_z_loss_coef",
                                  "router_aux_loss"))
    lm_head = Param(tied_to("embedding"), when="tie_embeddings")
    lm_head = Param(Tensor["vocab_size", "d_model"], when="not tie_embeddings")  # noqa: F811 - the other case

    @forward
    def forward(self, tokens: Tensor["B", "T", "int32"], freqs: Tensor["T", "head_dim // 2", 2, "fp32"]
                ) -> tuple[Tensor["B", "T", "vocab_size"], Tensor["fp32"]]:
        with graph() as g:
            x0 = g.embedding(tokens, "embedding", hook="AfterEmbedding")
            assigned0 = g.zeros(shape=["num_experts"], dtype="fp32")
            probs0 = g.zeros(shape=["num_experts"], dtype="fp32")
            z0 = g.zeros(shape=[], dtype="fp32")
            xN, assigned, probs, z = self.blocks(x0, assigned0, probs0, z0, freqs)
            xF = self.final_norm(xN, hook="BeforeLMHead")
            logits = g.matmul(xF, "lm_head", transpose="NT")
            aux_loss = self.balance(assigned, probs, z)
            return logits, aux_loss
