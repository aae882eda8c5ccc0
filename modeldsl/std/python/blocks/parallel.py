"""The std parallel hybrid block in the Python DSL (the twin of std/blocks/parallel.module)."""

from modeldsl.dsl import Param, Tensor, block, forward, graph
from modeldsl.std.python.modules.mamba2 import Mamba2Mixer
from modeldsl.std.python.modules.mup import ScaledSelfAttention, ScaledSwiGLU_MLP
from modeldsl.std.python.modules.norm import RMSNorm


@block
class ParallelHybridBlock:
    """A pre-norm block with attention and a Mamba-2 mixer side by side on the same normed input
    (Falcon-H1's decoder layer; spec 10.1's parallel block):
    x + mamba(h) * ssm_out_multiplier + attention(h * attention_in_multiplier) * attention_out_multiplier
    with h = norm(x), then + mlp(norm(.)).
    """

    def __init__(self, d_model: int, num_heads: int, num_kv_heads: int, head_dim: int, d_ff: int, d_ssm: int,
                 ssm_heads: int, ssm_groups: int = 1, d_state: int = 128, d_conv: int = 4, eps: float = 1e-5,
                 attention_bias: bool = False, mlp_bias: bool = False, ssm_conv_bias: bool = True,
                 ssm_proj_bias: bool = False, ssm_out_bias: bool = False, ssm_norm: bool = False,
                 ssm_norm_before_gate: bool = True, attention_in_multiplier: float = 1.0,
                 attention_out_multiplier: float = 1.0, key_multiplier: float = 1.0, ssm_in_multiplier: float = 1.0,
                 ssm_out_multiplier: float = 1.0, ssm_z_multiplier: float = 1.0, ssm_x_multiplier: float = 1.0,
                 ssm_b_multiplier: float = 1.0, ssm_c_multiplier: float = 1.0, ssm_dt_multiplier: float = 1.0,
                 mlp_gate_multiplier: float = 1.0, mlp_down_multiplier: float = 1.0):
        pass

    ln1 = Param(RMSNorm("d_model", "eps"))
    attention = Param(ScaledSelfAttention("d_model", "num_heads", "num_kv_heads", "head_dim", "attention_bias",
                                          "key_multiplier"))
    mamba = Param(Mamba2Mixer("d_model", "d_ssm", "ssm_heads", "ssm_groups", "d_state", "d_conv", "eps",
                              "ssm_conv_bias", "ssm_proj_bias", "ssm_out_bias", "ssm_norm", "ssm_norm_before_gate",
                              "ssm_in_multiplier", "ssm_z_multiplier", "ssm_x_multiplier", "ssm_b_multiplier",
                              "ssm_c_multiplier", "ssm_dt_multiplier"))
    ln2 = Param(RMSNorm("d_model", "eps"))
    feed_forward = Param(ScaledSwiGLU_MLP("d_model", "d_ff", "mlp_bias", "mlp_gate_multiplier", "mlp_down_multiplier"))

    @forward
    def forward(self, x: Tensor["B", "T", "d_model"], freqs: Tensor["T", "head_dim // 2", 2, "fp32"]
                ) -> Tensor["B", "T", "d_model"]:
        with graph() as g:
            h = self.ln1(x)
            ssm_raw = self.mamba(h)
            ssm_out = g.scale(ssm_raw, factor=self.ssm_out_multiplier)
            h_attn = g.scale(h, factor=self.attention_in_multiplier)
            attn_raw = self.attention(h_attn, freqs, hook="AfterAttnOutProjection")
            attn_out = g.scale(attn_raw, factor=self.attention_out_multiplier)
            mixed = g.add(ssm_out, attn_out)
            residual_mid = g.add(x, mixed)
            h2 = self.ln2(residual_mid)
            mlp_out = self.feed_forward(h2, hook="AfterMLPDownProjection")
            out = g.add(residual_mid, mlp_out)
