"""The std muP-scaled attention and MLP in the Python DSL (the twins of std/modules/mup.module)."""

from modeldsl.dsl import Param, Tensor, forward, graph, module, save


@module
class ScaledSelfAttention:
    """Causal self-attention with grouped-query heads and RoPE whose keys are scaled by key_multiplier
    before RoPE (Falcon-H1's muP); q, k, v come from one fused projection [q; k; v], with optional
    biases on it and on the output projection."""

    def __init__(self, d_model: int, num_heads: int, num_kv_heads: int, head_dim: int, use_bias: bool = False,
                 key_multiplier: float = 1.0):
        self.q_dim = self.num_heads * self.head_dim
        self.kv_dim = self.num_kv_heads * self.head_dim
        assert self.num_heads % self.num_kv_heads == 0, "num_heads must be a multiple of num_kv_heads (GQA)"
        assert self.head_dim % 2 == 0, "RoPE needs an even head_dim"

    qkv_weight = Param(Tensor["q_dim + 2 * kv_dim", "d_model"])
    qkv_bias = Param(Tensor["q_dim + 2 * kv_dim"], when="use_bias")
    out_weight = Param(Tensor["d_model", "q_dim"])
    out_bias = Param(Tensor["d_model"], when="use_bias")

    @save("x", "q_rot", "k_rot", "v", "att", "lse")
    @forward
    def forward(self, x: Tensor["B", "T", "d_model"], freqs: Tensor["T", "head_dim // 2", 2, "fp32"]
                ) -> Tensor["B", "T", "d_model"]:
        with graph() as g:
            qkv_proj = g.matmul(x, "qkv_weight", transpose="NT")
            if self.use_bias:
                qkv = g.bias_add(qkv_proj, "qkv_bias")
            else:
                qkv = qkv_proj
            q_flat, k_raw, v_flat = g.split(qkv, ["q_dim", "kv_dim", "kv_dim"], dim=-1)
            k_flat = g.scale(k_raw, factor=self.key_multiplier)
            q = g.view(q_flat, ["B", "T", "num_heads", "head_dim"])
            k = g.view(k_flat, ["B", "T", "num_kv_heads", "head_dim"])
            v = g.view(v_flat, ["B", "T", "num_kv_heads", "head_dim"])
            q_rot, k_rot = g.rope(q, k, freqs, layout="bthd", hook="BeforeAttention")
            att, lse = g.flash_attention(q_rot, k_rot, v, causal=True, layout="bthd")
            att_flat = g.view(att, ["B", "T", "q_dim"], hook="AfterAttention")
            projected = g.matmul(att_flat, "out_weight", transpose="NT")
            if self.use_bias:
                out = g.bias_add(projected, "out_bias")
            else:
                out = projected


@module
class ScaledSwiGLU_MLP:
    """down(silu(gate(x) * gate_multiplier) * up(x)) * down_multiplier (Falcon-H1's mlp_multipliers);
    gate and up are fused in up_weight = [gate; up], with optional biases."""

    def __init__(self, d_model: int, d_ff: int, use_bias: bool = False, gate_multiplier: float = 1.0,
                 down_multiplier: float = 1.0):
        pass

    up_weight = Param(Tensor["2 * d_ff", "d_model"])
    up_bias = Param(Tensor["2 * d_ff"], when="use_bias")
    down_weight = Param(Tensor["d_model", "d_ff"])
    down_bias = Param(Tensor["d_model"], when="use_bias")

    @forward
    def forward(self, in_: Tensor["B", "T", "d_model"]) -> Tensor["B", "T", "d_model"]:
        with graph() as g:
            gate_up_proj = g.matmul(in_, "up_weight", transpose="NT")
            if self.use_bias:
                gate_up = g.bias_add(gate_up_proj, "up_bias")
            else:
                gate_up = gate_up_proj
            gate_raw, up = g.split(gate_up, ["d_ff", "d_ff"], dim=-1)
            gate = g.scale(gate_raw, factor=self.gate_multiplier)
            hidden = g.swiglu(gate, up)
            down_proj = g.matmul(hidden, "down_weight", transpose="NT")
            if self.use_bias:
                down = g.bias_add(down_proj, "down_bias")
            else:
                down = down_proj
            out = g.scale(down, factor=self.down_multiplier)
