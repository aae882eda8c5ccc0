"""The std multi-head attention in the Python DSL (the twin of std/modules/attention/mha.module)."""

from modeldsl.dsl import Param, Tensor, forward, graph, module, save
from modeldsl.std.python.modules.attention.gqa import GQA


@module
class MHA:
    """Causal multi-head self-attention with RoPE: GQA with a key/value head per query head.

    Its one child is GQA with num_kv_heads = num_heads ('extends' cannot fix a parameter of its
    base), so it lowers to GQA's graph with that setting and its parameters are GQA's under
    gqa.: gqa.qkv_weight is [3 * num_heads * head_dim, d_model].
    """

    def __init__(self, d_model: int, num_heads: int, head_dim: int, use_qkv_bias: bool = False,
                 use_qk_norm: bool = False, sliding_window: int = 0, eps: float = 1e-6):
        pass

    gqa = Param(GQA("d_model", "num_heads", "num_heads", "head_dim", "use_qkv_bias", "use_qk_norm", "sliding_window",
                    "eps"))

    @save("x")  # GQA saves its input, which is the top's input where this module is lowered on its own
    @forward
    def forward(self, x: Tensor["B", "T", "d_model"], freqs: Tensor["T", "head_dim // 2", 2, "fp32"]
                ) -> Tensor["B", "T", "d_model"]:
        with graph() as g:
            out = self.gqa(x, freqs)
