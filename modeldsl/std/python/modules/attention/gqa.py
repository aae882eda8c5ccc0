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

    With rotary_pass > 0 (Phi-3's partial_rotary_factor), RoPE rotates only the first
    head_dim - rotary_pass dims of each q and k head and passes the last rotary_pass through
    unchanged; freqs is then [T, (head_dim - rotary_pass) // 2, 2].

    softmax_scale > 0 replaces attention's 1/sqrt(head_dim) (Granite's attention_multiplier);
    qk_norm_whole RMS-normalizes the whole q projection [q_dim] and k projection [kv_dim]
    before the head split and RoPE, weights q_norm [q_dim] and k_norm [kv_dim] (OLMo-2);
    softcap > 0 caps the scaled scores to softcap * tanh(s / softcap) (Gemma 2);
    qk_norm_offset 1.0 multiplies the per-head q and k norms by (1 + weight) (Gemma 3).
    """

    def __init__(self, d_model: int, num_heads: int, num_kv_heads: int, head_dim: int, use_qkv_bias: bool = False,
                 use_qk_norm: bool = False, sliding_window: int = 0, eps: float = 1e-6,
                 use_out_bias: bool = False, rotary_pass: int = 0, softmax_scale: float = 0.0,
                 qk_norm_whole: bool = False, softcap: float = 0.0, qk_norm_offset: float = 0.0):
        self.q_dim = self.num_heads * self.head_dim
        self.kv_dim = self.num_kv_heads * self.head_dim
        assert self.num_heads % self.num_kv_heads == 0, "num_heads must be a multiple of num_kv_heads (GQA)"
        assert self.head_dim % 2 == 0, "RoPE needs an even head_dim"
        assert self.rotary_pass % 2 == 0 and 0 <= self.rotary_pass and self.rotary_pass < self.head_dim, \
            ("RoPE rotates an even number of the head dims: rotary_pass, the last dims it leaves, "
             "is even and below head_dim")
        assert self.sliding_window >= 0, "sliding_window must be 0 (none) or a positive window"
        assert not (self.use_qk_norm and self.qk_norm_whole), \
            "use_qk_norm (per head) and qk_norm_whole (over the whole q and k projections) exclude each other"
        assert self.softmax_scale >= 0.0, "softmax_scale must be 0 (1/sqrt(head_dim)) or a positive scale"
        assert self.softcap >= 0.0, "softcap must be 0 (none) or positive"

    qkv_weight = Param(Tensor["q_dim + 2 * kv_dim", "d_model"], shard="column")
    qkv_bias = Param(Tensor["q_dim + 2 * kv_dim"], when="use_qkv_bias", shard="column")
    q_norm = Param(Tensor["head_dim"], when="use_qk_norm")
    k_norm = Param(Tensor["head_dim"], when="use_qk_norm")
    q_norm = Param(Tensor["q_dim"], when="qk_norm_whole")  # noqa: F811 - the other case
    k_norm = Param(Tensor["kv_dim"], when="qk_norm_whole")  # noqa: F811 - the other case
    out_weight = Param(Tensor["d_model", "q_dim"], shard="row")
    out_bias = Param(Tensor["d_model"], when="use_out_bias")

    @save("x", "q_rot", "k_rot", "v", "att", "lse")
    @forward
    def forward(self, x: Tensor["B", "T", "d_model"], freqs: Tensor["T", "(head_dim - rotary_pass) // 2", 2, "fp32"]
                ) -> Tensor["B", "T", "d_model"]:
        with graph() as g:
            qkv_proj = g.matmul(x, "qkv_weight", transpose="NT")
            if self.use_qkv_bias:
                qkv = g.bias_add(qkv_proj, "qkv_bias")
            else:
                qkv = qkv_proj
            q_flat, k_flat, v_flat = g.split(qkv, ["q_dim", "kv_dim", "kv_dim"], dim=-1)
            if self.qk_norm_whole:
                q_normed, q_rstd = g.rmsnorm(q_flat, "q_norm", eps=self.eps)
                k_normed, k_rstd = g.rmsnorm(k_flat, "k_norm", eps=self.eps)
            else:
                q_normed = q_flat
                k_normed = k_flat
            q_heads = g.view(q_normed, ["B", "T", "num_heads", "head_dim"])
            k_heads = g.view(k_normed, ["B", "T", "num_kv_heads", "head_dim"])
            v = g.view(v_flat, ["B", "T", "num_kv_heads", "head_dim"])
            if self.use_qk_norm:
                if self.qk_norm_offset != 0.0:
                    q_norm_weight = g.add_scalar("q_norm", value=self.qk_norm_offset)
                    k_norm_weight = g.add_scalar("k_norm", value=self.qk_norm_offset)
                    q, k, q_rstd, k_rstd = g.qk_norm(q_heads, k_heads, q_norm_weight, k_norm_weight, eps=self.eps)
                else:
                    q, k, q_rstd, k_rstd = g.qk_norm(q_heads, k_heads, "q_norm", "k_norm", eps=self.eps)
            else:
                q = q_heads
                k = k_heads
            if self.rotary_pass > 0:
                q_part, q_pass = g.split(q, ["head_dim - rotary_pass", "rotary_pass"], dim=-1)
                k_part, k_pass = g.split(k, ["head_dim - rotary_pass", "rotary_pass"], dim=-1)
                q_part_rot, k_part_rot = g.rope(q_part, k_part, freqs, layout="bthd")
                q_rot = g.concat(q_part_rot, q_pass, dim=-1, hook="BeforeAttention")
                k_rot = g.concat(k_part_rot, k_pass, dim=-1, hook="BeforeAttention")
            else:
                q_rot, k_rot = g.rope(q, k, freqs, layout="bthd", hook="BeforeAttention")
            if self.sliding_window > 0:
                if self.softmax_scale > 0.0:
                    att, lse = g.flash_attention(q_rot, k_rot, v, causal=True, softmax_scale=self.softmax_scale,
                                                 window_size=self.sliding_window, layout="bthd", softcap=self.softcap)
                else:
                    att, lse = g.flash_attention(q_rot, k_rot, v, causal=True, window_size=self.sliding_window,
                                                 layout="bthd", softcap=self.softcap)
            else:
                if self.softmax_scale > 0.0:
                    att, lse = g.flash_attention(q_rot, k_rot, v, causal=True, softmax_scale=self.softmax_scale,
                                                 layout="bthd", softcap=self.softcap)
                else:
                    att, lse = g.flash_attention(q_rot, k_rot, v, causal=True, layout="bthd", softcap=self.softcap)
            att_flat = g.view(att, ["B", "T", "q_dim"], hook="AfterAttention")
            if self.use_out_bias:
                out_proj = g.matmul(att_flat, "out_weight", transpose="NT")
                out = g.bias_add(out_proj, "out_bias")
            else:
                out = g.matmul(att_flat, "out_weight", transpose="NT")
