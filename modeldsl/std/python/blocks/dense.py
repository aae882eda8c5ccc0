"""The std dense transformer block in the Python DSL (the twin of std/blocks/dense.module)."""

from modeldsl.dsl import Param, Tensor, block, forward, graph
from modeldsl.std.python.modules.attention.gqa import GQA as CausalSelfAttention
from modeldsl.std.python.modules.mlp import SwiGLU_MLP
from modeldsl.std.python.modules.norm import RMSNorm


@block
class DenseTransformerBlock:
    """Pre-norm transformer block: x + attn(norm(x)), then + mlp(norm(.))."""

    def __init__(self, d_model: int, num_heads: int, num_kv_heads: int, head_dim: int, d_ff: int, eps: float = 1e-6,
                 use_qkv_bias: bool = False, use_qk_norm: bool = False, sliding_window: int = 0,
                 use_out_bias: bool = False, mlp_bias: bool = False):
        pass

    ln1 = Param(RMSNorm("d_model", "eps"))
    attention = Param(CausalSelfAttention("d_model", "num_heads", "num_kv_heads", "head_dim", "use_qkv_bias",
                                          "use_qk_norm", "sliding_window", "eps", "use_out_bias"))
    ln2 = Param(RMSNorm("d_model", "eps"))
    mlp = Param(SwiGLU_MLP("d_model", "d_ff", "mlp_bias"))

    @forward
    def forward(self, x: Tensor["B", "T", "d_model"], freqs: Tensor["T", "head_dim // 2", 2, "fp32"]
                ) -> Tensor["B", "T", "d_model"]:
        with graph() as g:
            ln1_out = self.ln1(x)
            attn_out = self.attention(ln1_out, freqs, hook="AfterAttnOutProjection")
            residual_mid = g.add(x, attn_out)
            ln2_out = self.ln2(residual_mid)
            mlp_out = self.mlp(ln2_out, hook="AfterMLPDownProjection")
            out = g.add(residual_mid, mlp_out)
