"""The std multi-query attention in the Python DSL (the twin of std/modules/attention/mqa.module)."""

from modeldsl.dsl import Param, Tensor, forward, graph, module, save
from modeldsl.std.python.modules.attention.gqa import GQA


@module
class MQA:
    """Causal multi-query self-attention with RoPE: GQA with one key/value head for all query heads.

    Its one child is GQA with num_kv_heads = 1 ('extends' cannot fix a parameter of its
    base), so it lowers to GQA's graph with that setting and its parameters are GQA's under
    gqa.: gqa.qkv_weight is [(num_heads + 2) * head_dim, d_model].
    """

    def __init__(self, d_model: int, num_heads: int, head_dim: int, use_qkv_bias: bool = False,
                 use_qk_norm: bool = False, sliding_window: int = 0, eps: float = 1e-6):
        pass

    gqa = Param(GQA("d_model", "num_heads", 1, "head_dim", "use_qkv_bias", "use_qk_norm", "sliding_window",
                    "eps"))

    @save("x")  # GQA saves its input, which is the top's input where this module is lowered on its own
    @forward
    def forward(self, x: Tensor["B", "T", "d_model"], freqs: Tensor["T", "head_dim // 2", 2, "fp32"]
                ) -> Tensor["B", "T", "d_model"]:
        with graph() as g:
            out = self.gqa(x, freqs)
