"""The std Gemma 2 layers in the Python DSL (the twins of std/blocks/gemma.module)."""

from modeldsl.dsl import Param, Tensor, block, forward, graph, module, save
from modeldsl.std.python.modules.mlp import GeGLU_MLP
from modeldsl.std.python.modules.norm import RMSNorm


@module
class Gemma2Attention:
    """Gemma 2's causal GQA self-attention with RoPE: no biases, scores scaled by softmax_scale
    (query_pre_attn_scalar ** -0.5; 0.0625 is 256 ** -0.5) and, with softcap > 0, capped to softcap * tanh(s / softcap)
    before the mask (attn_logit_softcapping); a sliding window with sliding_window > 0.
    q, k, v come from one fused projection [q; k; v]; freqs holds (cos, sin) of each position.
    """

    def __init__(self, d_model: int, num_heads: int, num_kv_heads: int, head_dim: int,
                 softmax_scale: float = 0.0625, softcap: float = 0.0, sliding_window: int = 0):
        self.q_dim = self.num_heads * self.head_dim
        self.kv_dim = self.num_kv_heads * self.head_dim
        assert self.num_heads % self.num_kv_heads == 0, "num_heads must be a multiple of num_kv_heads (GQA)"
        assert self.head_dim % 2 == 0, "RoPE needs an even head_dim"
        assert self.sliding_window >= 0, "sliding_window must be 0 (none) or a positive window"
        assert self.softcap >= 0.0, "softcap must be 0 (none) or positive"
        assert self.softmax_scale > 0.0, "softmax_scale must be positive"

    qkv_weight = Param(Tensor["q_dim + 2 * kv_dim", "d_model"])
    out_weight = Param(Tensor["d_model", "q_dim"])

    @save("x", "q_rot", "k_rot", "v", "att", "lse")
    @forward
    def forward(self, x: Tensor["B", "T", "d_model"], freqs: Tensor["T", "head_dim // 2", 2, "fp32"]
                ) -> Tensor["B", "T", "d_model"]:
        with graph() as g:
            qkv = g.matmul(x, "qkv_weight", transpose="NT")
            q_flat, k_flat, v_flat = g.split(qkv, ["q_dim", "kv_dim", "kv_dim"], dim=-1)
            q = g.view(q_flat, ["B", "T", "num_heads", "head_dim"])
            k = g.view(k_flat, ["B", "T", "num_kv_heads", "head_dim"])
            v = g.view(v_flat, ["B", "T", "num_kv_heads", "head_dim"])
            q_rot, k_rot = g.rope(q, k, freqs, layout="bthd", hook="BeforeAttention")
            if self.sliding_window > 0:
                if self.softcap > 0.0:
                    att, lse = g.flash_attention(q_rot, k_rot, v, causal=True, softmax_scale=self.softmax_scale,
                                                 window_size=self.sliding_window, layout="bthd",
                                                 softcap=self.softcap)
                else:
                    att, lse = g.flash_attention(q_rot, k_rot, v, causal=True, softmax_scale=self.softmax_scale,
                                                 window_size=self.sliding_window, layout="bthd")
            else:
                if self.softcap > 0.0:
                    att, lse = g.flash_attention(q_rot, k_rot, v, causal=True, softmax_scale=self.softmax_scale,
                                                 layout="bthd", softcap=self.softcap)
                else:
                    att, lse = g.flash_attention(q_rot, k_rot, v, causal=True, softmax_scale=self.softmax_scale,
                                                 layout="bthd")
            att_flat = g.view(att, ["B", "T", "q_dim"], hook="AfterAttention")
            out = g.matmul(att_flat, "out_weight", transpose="NT")
            return out


@module
class Gemma2Layer:
    """One Gemma 2 decoder layer: RMSNorms of (1 + weight) before and after each branch,
    x + post_attention_norm(attn(input_norm(x))), then + post_mlp_norm(mlp(pre_mlp_norm(.))),
    the MLP a GeGLU of tanh-approximated GELU (gelu_pytorch_tanh)."""

    def __init__(self, d_model: int, num_heads: int, num_kv_heads: int, head_dim: int, d_ff: int,
                 eps: float = 1e-6, softmax_scale: float = 0.0625, softcap: float = 0.0,
                 sliding_window: int = 0):
        pass

    input_norm = Param(RMSNorm("d_model", "eps", 1.0))
    attention = Param(Gemma2Attention("d_model", "num_heads", "num_kv_heads", "head_dim", "softmax_scale", "softcap",
                                      "sliding_window"))
    post_attention_norm = Param(RMSNorm("d_model", "eps", 1.0))
    pre_mlp_norm = Param(RMSNorm("d_model", "eps", 1.0))
    mlp = Param(GeGLU_MLP("d_model", "d_ff", True))
    post_mlp_norm = Param(RMSNorm("d_model", "eps", 1.0))

    @forward
    def forward(self, x: Tensor["B", "T", "d_model"], freqs: Tensor["T", "head_dim // 2", 2, "fp32"]
                ) -> Tensor["B", "T", "d_model"]:
        with graph() as g:
            attn_in = self.input_norm(x)
            attn_out = self.attention(attn_in, freqs, hook="AfterAttnOutProjection")
            attn_normed = self.post_attention_norm(attn_out)
            residual_mid = g.add(x, attn_normed)
            mlp_in = self.pre_mlp_norm(residual_mid)
            mlp_out = self.mlp(mlp_in, hook="AfterMLPDownProjection")
            mlp_normed = self.post_mlp_norm(mlp_out)
            out = g.add(residual_mid, mlp_normed)
            return out


@block
class Gemma2LayerPair:
    """Two Gemma 2 layers, as transformers' default layer_types alternate them: local (attention
    within sliding_window) then global (full attention). A stack of these is the model's layers."""

    def __init__(self, d_model: int, num_heads: int, num_kv_heads: int, head_dim: int, d_ff: int,
                 eps: float = 1e-6, softmax_scale: float = 0.0625, softcap: float = 0.0,
                 sliding_window: int = 0):
        pass

    local_layer = Param(Gemma2Layer("d_model", "num_heads", "num_kv_heads", "head_dim", "d_ff", "eps", "softmax_scale",
                              "softcap", "sliding_window"))
    global_layer = Param(Gemma2Layer("d_model", "num_heads", "num_kv_heads", "head_dim", "d_ff", "eps", "softmax_scale",
                                "softcap", 0))

    @forward
    def forward(self, x: Tensor["B", "T", "d_model"], freqs: Tensor["T", "head_dim // 2", 2, "fp32"]
                ) -> Tensor["B", "T", "d_model"]:
        with graph() as g:
            x_local = self.local_layer(x, freqs)
            out = self.global_layer(x_local, freqs)
            return out
