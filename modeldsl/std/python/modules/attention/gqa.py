"""The std causal self-attention in the Python DSL (the twin of std/modules/attention/gqa.module)."""

from modeldsl.dsl import Param, Tensor, forward, graph, module, save


@module
class GQA:
    """Causal self-attention with grouped-query heads (GQA) and RoPE.

    num_heads query heads share num_kv_heads key/value heads, num_heads // num_kv_heads
    each; MHA (mha.py) and MQA (mqa.py) are this module with num_kv_heads fixed
    to num_heads and to 1.

    q, k, v come from one fused projection [q; k; v]; optional QKV bias (Qwen2) and output
    projection bias (Llama's and Qwen3's attention_bias set both),
    optional per-head RMSNorm of q and k (Qwen3), optional sliding window
    (Mistral). freqs holds (cos, sin) of each position: [T, head_dim // 2, 2].
    """

    def __init__(self, d_model: int, num_heads: int, num_kv_heads: int, head_dim: int, use_qkv_bias: bool = False,
                 use_qk_norm: bool = False, sliding_window: int = 0, eps: float = 1e-6,
                 use_out_bias: bool = False):
        self.q_dim = self.num_heads * self.head_dim
        self.kv_dim = self.num_kv_heads * self.head_dim
        assert self.num_heads % self.num_kv_heads == 0, "num_heads must be a multiple of num_kv_heads (GQA)"
        assert self.head_dim % 2 == 0, "RoPE needs an even head_dim"
        assert self.sliding_window >= 0, "sliding_window must be 0 (none) or a positive window"

    qkv_weight = Param(Tensor["q_dim + 2 * kv_dim", "d_model"])
    qkv_bias = Param(Tensor["q_dim + 2 * kv_dim"], when="use_qkv_bias")
    q_norm = Param(Tensor["head_dim"], when="use_qk_norm")
    k_norm = Param(Tensor["head_dim"], when="use_qk_norm")
    out_weight = Param(Tensor["d_model", "q_dim"])
    out_bias = Param(Tensor["d_model"], when="use_out_bias")

    @save("x", "q_rot", "k_rot", "v", "att", "lse")
    @forward
    def forward(self, x: Tensor["B", "T", "d_model"], freqs: Tensor["T", "head_dim // 2", 2, "fp32"]
                ) -> Tensor["B", "T", "d_model"]:
        with graph() as g:
            qkv_proj = g.matmul(x, "qkv_weight", transpose="NT")
            if self.use_qkv_bias:
                qkv = g.bias_add(qkv_proj, "qkv_bias")
            else:
                qkv = qkv_proj
            q_flat, k_flat, v_flat = g.split(qkv, ["q_dim", "kv_dim", "kv_dim"], dim=-1)
            q_heads = g.view(q_flat, ["B", "T", "num_heads", "head_dim"])
            k_heads = g.view(k_flat, ["B", "T", "num_kv_heads", "head_dim"])
            v = g.view(v_flat, ["B", "T", "num_kv_heads", "head_dim"])
            if self.use_qk_norm:
                q, k, q_rstd, k_rstd = g.qk_norm(q_heads, k_heads, "q_norm", "k_norm", eps=self.eps)
            else:
                q = q_heads
                k = k_heads
            q_rot, k_rot = g.rope(q, k, freqs, layout="bthd", hook="BeforeAttention")
            if self.sliding_window > 0:
                att, lse = g.flash_attention(q_rot, k_rot, v, causal=True, window_size=self.sliding_window,
                                             layout="bthd")
            else:
                att, lse = g.flash_attention(q_rot, k_rot, v, causal=True, layout="bthd")
            att_flat = g.view(att, ["B", "T", "q_dim"], hook="AfterAttention")
            if self.use_out_bias:
                out_proj = g.matmul(att_flat, "out_weight", transpose="NT")
                out = g.bias_add(out_proj, "out_bias")
            else:
                out = g.matmul(att_flat, "out_weight", transpose="NT")
