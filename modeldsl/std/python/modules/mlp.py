"""The std gated MLPs in the Python DSL (the twins of std/modules/mlp.module)."""

from modeldsl.dsl import Param, Tensor, backward, forward, graph, module, recompute, save


@module
class SwiGLU_MLP:
    """down(silu(gate(x)) * up(x)); gate and up are fused in up_weight = [gate; up] (and their
    biases, with bias, in up_bias = [gate; up]: Llama's mlp_bias)."""

    def __init__(self, d_model: int, d_ff: int, bias: bool = False):
        pass

    up_weight = Param(Tensor["2 * d_ff", "d_model"], shard="column")
    up_bias = Param(Tensor["2 * d_ff"], when="bias", shard="column")
    down_weight = Param(Tensor["d_model", "d_ff"], shard="row")
    down_bias = Param(Tensor["d_model"], when="bias")

    @save("in_", "gate_up")
    @recompute("gate", "up", "hidden")
    @forward
    def forward(self, in_: Tensor["B", "T", "d_model"]) -> Tensor["B", "T", "d_model"]:
        with graph() as g:
            if self.bias:
                gate_up_proj = g.matmul(in_, "up_weight", transpose="NT")
                gate_up = g.bias_add(gate_up_proj, "up_bias")
            else:
                gate_up = g.matmul(in_, "up_weight", transpose="NT")
            gate, up = g.split(gate_up, ["d_ff", "d_ff"], dim=-1)
            hidden = g.swiglu(gate, up)
            if self.bias:
                down_proj = g.matmul(hidden, "down_weight", transpose="NT")
                out = g.bias_add(down_proj, "down_bias")
            else:
                out = g.matmul(hidden, "down_weight", transpose="NT")

    @backward
    def backward(self, d_out: Tensor["B", "T", "d_model"]) -> Tensor["B", "T", "d_model"]:
        with graph() as g:
            with g.recompute():
                gate, up = g.split(g.saved("gate_up"), ["d_ff", "d_ff"], dim=-1)
                hidden = g.swiglu(gate, up)
            d_hidden = g.matmul(d_out, "down_weight", transpose="NN")
            d_down_weight = g.matmul(d_out, hidden, transpose="TN", accumulate=True)
            d_gate, d_up = g.swiglu_backward(d_hidden, gate, up)
            d_gate_up = g.concat(d_gate, d_up, dim=-1)
            d_in = g.matmul(d_gate_up, "up_weight", transpose="NN")
            d_up_weight = g.matmul(d_gate_up, g.saved("in_"), transpose="TN", accumulate=True)
            if self.bias:
                d_down_bias = g.reduce_sum(d_out, dims=[0, 1])
                d_up_bias = g.reduce_sum(d_gate_up, dims=[0, 1])


@module
class GeGLU_MLP:
    """down(gelu(gate(x)) * up(x)); gate and up are fused in up_weight = [gate; up]."""

    def __init__(self, d_model: int, d_ff: int, approximate: bool = True):
        pass

    up_weight = Param(Tensor["2 * d_ff", "d_model"], shard="column")
    down_weight = Param(Tensor["d_model", "d_ff"], shard="row")

    @save("in_", "gate_up")
    @recompute("gate", "up", "gelu_gate", "hidden")
    @forward
    def forward(self, in_: Tensor["B", "T", "d_model"]) -> Tensor["B", "T", "d_model"]:
        with graph() as g:
            gate_up = g.matmul(in_, "up_weight", transpose="NT")
            gate, up = g.split(gate_up, ["d_ff", "d_ff"], dim=-1)
            if self.approximate:
                gelu_gate = g.gelu(gate, approximate=True)
                hidden = g.mul(gelu_gate, up)
            else:
                hidden = g.geglu(gate, up)
            out = g.matmul(hidden, "down_weight", transpose="NT")
