"""The std Gemma 2 and Gemma 3 layers in the Python DSL (the twins of std/blocks/gemma.module)."""

from modeldsl.dsl import Param, Tensor, block, forward, graph, module
from modeldsl.std.python.modules.attention.gqa import GQA
from modeldsl.std.python.modules.mlp import GeGLU_MLP
from modeldsl.std.python.modules.norm import RMSNorm


@module
class GemmaLayer:
    """One Gemma 2 or Gemma 3 decoder layer: RMSNorms of (1 + weight) before and after each branch,
    x + post_attention_norm(attn(input_norm(x))), then + post_mlp_norm(mlp(pre_mlp_norm(.))),
    the MLP a GeGLU of tanh-approximated GELU (gelu_pytorch_tanh). Gemma 3's layers take qk_norm:
    per-head RMSNorms of (1 + weight) on q and k before RoPE."""

    def __init__(self, d_model: int, num_heads: int, num_kv_heads: int, head_dim: int, d_ff: int,
                 eps: float = 1e-6, softmax_scale: float = 0.0625, softcap: float = 0.0,
                 sliding_window: int = 0, qk_norm: bool = False):
        pass

    input_norm = Param(RMSNorm("d_model", "eps", 1.0))
    attention = Param(GQA("d_model", "num_heads", "num_kv_heads", "head_dim", use_qk_norm="qk_norm",
                          sliding_window="sliding_window", eps="eps", softmax_scale="softmax_scale", softcap="softcap",
                          qk_norm_offset=1.0))
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

    local_layer = Param(GemmaLayer("d_model", "num_heads", "num_kv_heads", "head_dim", "d_ff", "eps", "softmax_scale",
                              "softcap", "sliding_window"))
    global_layer = Param(GemmaLayer("d_model", "num_heads", "num_kv_heads", "head_dim", "d_ff", "eps", "softmax_scale",
                                "softcap", 0))

    @forward
    def forward(self, x: Tensor["B", "T", "d_model"], freqs: Tensor["T", "head_dim // 2", 2, "fp32"]
                ) -> Tensor["B", "T", "d_model"]:
        with graph() as g:
            x_local = self.local_layer(x, freqs)
            out = self.global_layer(x_local, freqs)
            return out


@block
class Gemma3LayerGroup:
    """Six Gemma 3 layers, as transformers' default layer_types repeat them (sliding_window_pattern
    6): five local ones (attention within sliding_window, RoPE of local_freqs) then a global one
    (full attention, RoPE of freqs). A stack of these holds the model's layers."""

    def __init__(self, d_model: int, num_heads: int, num_kv_heads: int, head_dim: int, d_ff: int,
                 eps: float = 1e-6, softmax_scale: float = 0.0625, sliding_window: int = 4096):
        pass

    local_0 = Param(GemmaLayer("d_model", "num_heads", "num_kv_heads", "head_dim", "d_ff", "eps", "softmax_scale",
                                 0.0, "sliding_window", True))
    local_1 = Param(GemmaLayer("d_model", "num_heads", "num_kv_heads", "head_dim", "d_ff", "eps", "softmax_scale",
                                 0.0, "sliding_window", True))
    local_2 = Param(GemmaLayer("d_model", "num_heads", "num_kv_heads", "head_dim", "d_ff", "eps", "softmax_scale",
                                 0.0, "sliding_window", True))
    local_3 = Param(GemmaLayer("d_model", "num_heads", "num_kv_heads", "head_dim", "d_ff", "eps", "softmax_scale",
                                 0.0, "sliding_window", True))
    local_4 = Param(GemmaLayer("d_model", "num_heads", "num_kv_heads", "head_dim", "d_ff", "eps", "softmax_scale",
                                 0.0, "sliding_window", True))
    global_layer = Param(GemmaLayer("d_model", "num_heads", "num_kv_heads", "head_dim", "d_ff", "eps", "softmax_scale",
                                 0.0, 0, True))

    @forward
    def forward(self, x: Tensor["B", "T", "d_model"], freqs: Tensor["T", "head_dim // 2", 2, "fp32"],
                local_freqs: Tensor["T", "head_dim // 2", 2, "fp32"]) -> Tensor["B", "T", "d_model"]:
        with graph() as g:
            x1 = self.local_0(x, local_freqs)
            x2 = self.local_1(x1, local_freqs)
            x3 = self.local_2(x2, local_freqs)
            x4 = self.local_3(x3, local_freqs)
            x5 = self.local_4(x4, local_freqs)
            out = self.global_layer(x5, freqs)
            return out
