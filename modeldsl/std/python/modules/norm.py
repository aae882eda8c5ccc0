"""The std normalization modules in the Python DSL (the twins of std/modules/norm.module)."""

from modeldsl.dsl import Param, Tensor, forward, graph, module, save


@module
class RMSNorm:
    """y = x / sqrt(mean(x^2) + eps) * (weight + offset); offset 1.0 is Gemma's (1 + weight), with
    weights stored around 0."""

    def __init__(self, d: int, eps: float = 1e-6, offset: float = 0.0):
        pass

    weight = Param(Tensor["d"])

    @save("in_", "rstd")
    @forward
    def forward(self, in_: Tensor["*", "d"]) -> Tensor["*", "d"]:
        with graph() as g:
            if self.offset != 0.0:
                offset_weight = g.add_scalar("weight", value=self.offset)
                out, rstd = g.rmsnorm(in_, offset_weight, eps=self.eps)
            else:
                out, rstd = g.rmsnorm(in_, "weight", eps=self.eps)
            return out


@module
class LayerNorm:
    """y = (x - mean) / sqrt(var + eps) * weight (+ bias)."""

    def __init__(self, d: int, eps: float = 1e-5, bias: bool = True):
        pass

    weight = Param(Tensor["d"])
    bias = Param(Tensor["d"], when="bias")

    @save("in_", "mean", "rstd")
    @forward
    def forward(self, in_: Tensor["*", "d"]) -> Tensor["*", "d"]:
        with graph() as g:
            if self.bias:
                out, mean, rstd = g.layernorm(in_, "weight", "bias", eps=self.eps)
            else:
                out, mean, rstd = g.layernorm(in_, "weight", eps=self.eps)
            return out
