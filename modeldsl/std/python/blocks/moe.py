"""The std mixture-of-experts block in the Python DSL (the twin of std/blocks/moe.module)."""

from modeldsl.dsl import Param, Tensor, block, forward, graph
from modeldsl.std.python.modules.attention.gqa import GQA as CausalSelfAttention
from modeldsl.std.python.modules.moe.expert import SparseMoE_MLP
from modeldsl.std.python.modules.norm import RMSNorm


@block
class MoETransformerBlock:
    """Pre-norm mixture-of-experts block (Mixtral, Qwen3-MoE): x + attn(norm(x)), then + moe(norm(.)).

    assigned, probs and z carry the router losses' sums from layer to layer (RouterStatistics)."""

    def __init__(self, d_model: int, num_heads: int, num_kv_heads: int, head_dim: int, d_ff: int,
                 num_experts: int = 8, top_k: int = 2, eps: float = 1e-6, sliding_window: int = 0,
                 normalize: bool = True, use_qkv_bias: bool = False, use_qk_norm: bool = False):
        pass

    ln1 = Param(RMSNorm("d_model", "eps"))
    attention = Param(CausalSelfAttention("d_model", "num_heads", "num_kv_heads", "head_dim", "use_qkv_bias",
                                          "use_qk_norm", "sliding_window", "eps"))
    ln2 = Param(RMSNorm("d_model", "eps"))
    mlp = Param(SparseMoE_MLP("d_model", "d_ff", "num_experts", "top_k", "normalize"))

    @forward
    def forward(self, x: Tensor["B", "T", "d_model"], assigned: Tensor["num_experts", "fp32"],
                probs: Tensor["num_experts", "fp32"], z: Tensor["fp32"],
                freqs: Tensor["T", "head_dim // 2", 2, "fp32"]
                ) -> tuple[Tensor["B", "T", "d_model"], Tensor["num_experts", "fp32"], Tensor["num_experts", "fp32"],
                           Tensor["fp32"]]:
        with graph() as g:
            ln1_out = self.ln1(x)
            attn_out = self.attention(ln1_out, freqs, hook="AfterAttnOutProjection")
            residual_mid = g.add(x, attn_out)
            ln2_out = self.ln2(residual_mid)
            mlp_out, assigned_out, probs_out, z_out = self.mlp(ln2_out, assigned, probs, z,
                                                               hook="AfterMLPDownProjection")
            out = g.add(residual_mid, mlp_out)
            return out, assigned_out, probs_out, z_out
