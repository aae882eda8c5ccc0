"""The std dense transformer block in the Python DSL (the twin of std/blocks/dense.module)."""

from modeldsl.dsl import Param, Tensor, block, forward, graph
from modeldsl.std.python.modules.attention.gqa import GQA as CausalSelfAttention
from modeldsl.std.python.modules.mlp import SwiGLU_MLP
from modeldsl.std.python.modules.norm import RMSNorm


@block
class DenseTransformerBlock:
    """Pre-norm transformer block: x + attn(norm(x)), then + mlp(norm(.)).

    residual_multiplier scales each branch before its residual add (Granite); post_norm moves the
    norms after the branches, x + norm(attn(x)), then + norm(mlp(.)) (OLMo-2: ln1 is its
    post_attention_layernorm, ln2 its post_feedforward_layernorm). softmax_scale and qk_norm_whole
    go to the attention (see GQA).
    """

    def __init__(self, d_model: int, num_heads: int, num_kv_heads: int, head_dim: int, d_ff: int, eps: float = 1e-6,
                 use_qkv_bias: bool = False, use_qk_norm: bool = False, sliding_window: int = 0,
                 use_out_bias: bool = False, mlp_bias: bool = False, rotary_pass: int = 0,
                 softmax_scale: float = 0.0, qk_norm_whole: bool = False, residual_multiplier: float = 1.0,
                 post_norm: bool = False):
        pass

    ln1 = Param(RMSNorm("d_model", "eps"))
    attention = Param(CausalSelfAttention("d_model", "num_heads", "num_kv_heads", "head_dim", "use_qkv_bias",
                                          "use_qk_norm", "sliding_window", "eps", "use_out_bias",
                                          rotary_pass="rotary_pass", softmax_scale="softmax_scale",
                                          qk_norm_whole="qk_norm_whole"))
    ln2 = Param(RMSNorm("d_model", "eps"))
    mlp = Param(SwiGLU_MLP("d_model", "d_ff", "mlp_bias"))

    @forward
    def forward(self, x: Tensor["B", "T", "d_model"], freqs: Tensor["T", "(head_dim - rotary_pass) // 2", 2, "fp32"]
                ) -> Tensor["B", "T", "d_model"]:
        with graph() as g:
            if self.post_norm:
                attn_proj = self.attention(x, freqs, hook="AfterAttnOutProjection")
                attn_out = self.ln1(attn_proj)
            else:
                ln1_out = self.ln1(x)
                attn_out = self.attention(ln1_out, freqs, hook="AfterAttnOutProjection")
            if self.residual_multiplier != 1.0:
                attn_branch = g.scale(attn_out, factor=self.residual_multiplier)
            else:
                attn_branch = attn_out
            residual_mid = g.add(x, attn_branch)
            if self.post_norm:
                mlp_proj = self.mlp(residual_mid, hook="AfterMLPDownProjection")
                mlp_out = self.ln2(mlp_proj)
            else:
                ln2_out = self.ln2(residual_mid)
                mlp_out = self.mlp(ln2_out, hook="AfterMLPDownProjection")
            if self.residual_multiplier != 1.0:
                mlp_branch = g.scale(mlp_out, factor=self.residual_multiplier)
            else:
                mlp_branch = mlp_out
            out = g.add(residual_mid, mlp_branch)
