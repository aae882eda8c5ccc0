"""The std Linear in the Python DSL (the twin of std/modules/linear.module)."""

from modeldsl.dsl import Param, Tensor, backward, forward, graph, module, save


@module
class Linear:
    """y = x @ W^T (+ b), W: [out_dim, in_dim] as in torch.nn.Linear."""

    def __init__(self, in_dim: int, out_dim: int, bias: bool = False):
        pass

    weight = Param(Tensor["out_dim", "in_dim"])
    bias = Param(Tensor["out_dim"], when="bias")

    @save("in_")
    @forward
    def forward(self, in_: Tensor["*", "in_dim"]) -> Tensor["*", "out_dim"]:
        with graph() as g:
            y = g.matmul(in_, "weight", transpose="NT")
            if self.bias:
                out = g.bias_add(y, "bias")
            else:
                out = y
            return out

    @backward
    def backward(self, d_out: Tensor["*", "out_dim"]) -> Tensor["*", "in_dim"]:
        with graph() as g:
            d_in = g.matmul(d_out, "weight", transpose="NN")
            d_weight = g.matmul(d_out, g.saved("in_"), transpose="TN", accumulate=True)
            if self.bias:
                d_bias = g.reduce_sum(d_out, dims=[0])
