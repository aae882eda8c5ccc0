"""examples/residual_mlp.module in the Python DSL: the same model, lowered to the same IR."""

from modeldsl.dsl import Param, Tensor, forward, graph, model
from modeldsl.std.python.modules.norm import RMSNorm


@model
class TinyMLP:
    """A residual MLP block: x + W2 silu(W1 norm(x))."""

    def __init__(self, d_model: int = 64, d_ff: int = 256):
        pass

    norm = Param(RMSNorm("d_model"))
    w1 = Param(Tensor["d_ff", "d_model"])
    w2 = Param(Tensor["d_model", "d_ff"])

    @forward
    def forward(self, in_: Tensor["B", "T", "d_model"]) -> Tensor["B", "T", "d_model"]:
        with graph() as g:
            h = self.norm(in_)
            y = g.matmul(g.silu(g.matmul(h, "w1", transpose="NT")), "w2", transpose="NT")
            out = g.add(in_, y)
