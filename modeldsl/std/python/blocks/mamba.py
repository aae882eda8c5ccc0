"""The std Mamba block in the Python DSL (the twin of std/blocks/mamba.module)."""

from modeldsl.dsl import Param, Tensor, block, forward, graph
from modeldsl.std.python.modules.norm import RMSNorm


@block
class MambaBlock:
    """A pre-norm Mamba (selective state space) block, HF MambaForCausalLM's mixer: x + mixer(norm(x)).

    in_proj gives the inner stream and its gate z; a causal depthwise conv (with SiLU) mixes each
    channel over d_conv steps; x_proj gives the low-rank step size and the B, C of every position;
    dt_proj lifts the step size to d_inner channels (its bias is the scan's dt_bias); the selective scan
    runs h[t] = exp(dt A) h[t-1] + dt B[t] u[t], y = C[t] h[t] + D u; y * silu(z) goes through out_proj.
    The conv and the scan take channels first ([B, d_inner, T]).
    """

    def __init__(self, d_model: int, d_inner: int, d_state: int = 16, dt_rank: int = 1, d_conv: int = 4,
                 eps: float = 1e-5):
        pass

    norm = Param(RMSNorm("d_model", "eps"))
    in_proj = Param(Tensor["2 * d_inner", "d_model"])
    conv_weight = Param(Tensor["d_inner", 1, "d_conv"])
    conv_bias = Param(Tensor["d_inner"])
    x_proj = Param(Tensor["dt_rank + 2 * d_state", "d_inner"])
    dt_proj = Param(Tensor["d_inner", "dt_rank"])
    dt_bias = Param(Tensor["d_inner"])
    A_log = Param(Tensor["d_inner", "d_state"])
    D = Param(Tensor["d_inner"])
    out_proj = Param(Tensor["d_model", "d_inner"])

    @forward
    def forward(self, in_: Tensor["B", "T", "d_model"]) -> Tensor["B", "T", "d_model"]:
        with graph() as g:
            h = self.norm(in_)
            xz = g.matmul(h, "in_proj", transpose="NT")
            xs, z = g.split(xz, ["d_inner", "d_inner"], dim=-1)
            xs_channels = g.transpose(xs, dim0=1, dim1=2)
            u = g.mamba_conv1d(xs_channels, "conv_weight", "conv_bias", kernel_size=self.d_conv)
            u_tokens = g.transpose(u, dim0=1, dim1=2)
            ssm_params = g.matmul(u_tokens, "x_proj", transpose="NT")
            dt_low, b_tokens, c_tokens = g.split(ssm_params, ["dt_rank", "d_state", "d_state"], dim=-1)
            delta = g.transpose(g.matmul(dt_low, "dt_proj", transpose="NT"), dim0=1, dim1=2)
            b_proj = g.view(g.transpose(b_tokens, dim0=1, dim1=2), ["B", 1, "d_state", "T"])
            c_proj = g.view(g.transpose(c_tokens, dim0=1, dim1=2), ["B", 1, "d_state", "T"])
            y, ssm_state = g.mamba_selective_scan(u, delta, "A_log", b_proj, c_proj, "D", "dt_bias")
            y_tokens = g.transpose(y, dim0=1, dim1=2)
            gated = g.swiglu(z, y_tokens)
            mixed = g.matmul(gated, "out_proj", transpose="NT")
            out = g.add(in_, mixed)
