"""The std Mamba-2 mixer in the Python DSL (the twin of std/modules/mamba2.module)."""

from modeldsl.dsl import Param, Tensor, forward, graph, module


@module
class Mamba2Mixer:
    """The Mamba-2 mixer (spec 11.3, Nemotron-H's and Falcon-H1's): n_heads heads of head_dim channels,
    each with one step size dt, one decay A = -exp(A_log), one skip D and one dt_bias, over n_groups
    groups of B and C.

    in_proj gives [z; x; B; C; dt] (each segment scaled by its multiplier, Falcon-H1's ssm_multipliers;
    the input first by in_multiplier); a causal depthwise conv with SiLU mixes [x; B; C] over d_conv
    steps; the selective scan runs per channel, so each head's dt, A_log, D and dt_bias are repeated
    over its head_dim channels (a broadcasting mul by ones: the gradients sum back per head). Then
    y * silu(z), or with gated_norm an RMSNorm over each group of d_ssm / n_groups channels, before
    the gate (norm(y) * silu(z)) or after it (norm(y * silu(z))); out_proj maps back to d_model.
    """

    def __init__(self, d_model: int, d_ssm: int, n_heads: int, n_groups: int = 1, d_state: int = 128,
                 d_conv: int = 4, eps: float = 1e-5, use_conv_bias: bool = True, use_proj_bias: bool = False,
                 use_out_bias: bool = False, gated_norm: bool = False, norm_before_gate: bool = True,
                 in_multiplier: float = 1.0, z_multiplier: float = 1.0, x_multiplier: float = 1.0,
                 b_multiplier: float = 1.0, c_multiplier: float = 1.0, dt_multiplier: float = 1.0):
        self.head_dim = self.d_ssm // self.n_heads
        self.group_dim = self.d_ssm // self.n_groups
        self.gn = self.n_groups * self.d_state
        self.conv_dim = self.d_ssm + 2 * self.gn
        assert self.d_ssm % self.n_heads == 0, "the SSM heads must divide the SSM channels (mamba_d_ssm)"
        assert self.n_heads % self.n_groups == 0, "the SSM groups must divide the SSM heads"

    in_proj = Param(Tensor["d_ssm + conv_dim + n_heads", "d_model"])
    in_proj_bias = Param(Tensor["d_ssm + conv_dim + n_heads"], when="use_proj_bias")
    conv_weight = Param(Tensor["conv_dim", 1, "d_conv"])
    conv_bias = Param(Tensor["conv_dim"], when="use_conv_bias")
    dt_bias = Param(Tensor["n_heads"])
    A_log = Param(Tensor["n_heads"])
    D = Param(Tensor["n_heads"])
    norm_weight = Param(Tensor["d_ssm"], when="gated_norm")
    out_proj = Param(Tensor["d_model", "d_ssm"])
    out_proj_bias = Param(Tensor["d_model"], when="use_out_bias")

    @forward
    def forward(self, in_: Tensor["B", "T", "d_model"]) -> Tensor["B", "T", "d_model"]:
        with graph() as g:
            h = g.scale(in_, factor=self.in_multiplier)
            proj_raw = g.matmul(h, "in_proj", transpose="NT")
            if self.use_proj_bias:
                proj = g.bias_add(proj_raw, "in_proj_bias")
            else:
                proj = proj_raw
            z_raw, x_raw, b_raw, c_raw, dt_raw = g.split(proj, ["d_ssm", "d_ssm", "gn", "gn", "n_heads"], dim=-1)
            z = g.scale(z_raw, factor=self.z_multiplier)
            xs = g.scale(x_raw, factor=self.x_multiplier)
            bs = g.scale(b_raw, factor=self.b_multiplier)
            cs = g.scale(c_raw, factor=self.c_multiplier)
            dt = g.scale(dt_raw, factor=self.dt_multiplier)
            xbc = g.concat(xs, bs, cs, dim=-1)
            xbc_channels = g.transpose(xbc, dim0=1, dim1=2)
            if self.use_conv_bias:
                xbc_conv = g.mamba_conv1d(xbc_channels, "conv_weight", "conv_bias", kernel_size=self.d_conv)
            else:
                xbc_conv = g.mamba_conv1d(xbc_channels, "conv_weight", kernel_size=self.d_conv)
            u, b_channels, c_channels = g.split(xbc_conv, ["d_ssm", "gn", "gn"], dim=1)
            b_proj = g.view(b_channels, ["B", "n_groups", "d_state", "T"])
            c_proj = g.view(c_channels, ["B", "n_groups", "d_state", "T"])
            per_head = g.ones(shape=["head_dim"], dtype="bf16")
            per_head_state = g.ones(shape=["head_dim", "d_state"], dtype="bf16")
            dt_heads = g.view(dt, ["B", "T", "n_heads", 1])
            delta = g.transpose(g.view(g.mul(dt_heads, per_head), ["B", "T", "d_ssm"]), dim0=1, dim1=2)
            a_heads = g.view("A_log", ["n_heads", 1, 1])
            a_log = g.view(g.mul(a_heads, per_head_state), ["d_ssm", "d_state"])
            d_heads = g.view("D", ["n_heads", 1])
            d_skip = g.view(g.mul(d_heads, per_head), ["d_ssm"])
            dt_bias_heads = g.view("dt_bias", ["n_heads", 1])
            dt_bias_channels = g.view(g.mul(dt_bias_heads, per_head), ["d_ssm"])
            y, ssm_state = g.mamba_selective_scan(u, delta, a_log, b_proj, c_proj, d_skip, dt_bias_channels)
            y_tokens = g.transpose(y, dim0=1, dim1=2)
            if self.gated_norm:
                unit = g.ones(shape=["group_dim"], dtype="bf16")
                if self.norm_before_gate:
                    y_groups = g.view(y_tokens, ["B", "T", "n_groups", "group_dim"])
                    y_normed, y_rstd = g.rmsnorm(y_groups, unit, eps=self.eps)
                    y_flat = g.view(y_normed, ["B", "T", "d_ssm"])
                    y_scaled = g.mul(y_flat, "norm_weight")
                    gated = g.swiglu(z, y_scaled)
                else:
                    y_gated = g.swiglu(z, y_tokens)
                    g_groups = g.view(y_gated, ["B", "T", "n_groups", "group_dim"])
                    g_normed, g_rstd = g.rmsnorm(g_groups, unit, eps=self.eps)
                    g_flat = g.view(g_normed, ["B", "T", "d_ssm"])
                    gated = g.mul(g_flat, "norm_weight")
            else:
                gated = g.swiglu(z, y_tokens)
            mixed = g.matmul(gated, "out_proj", transpose="NT")
            if self.use_out_bias:
                out = g.bias_add(mixed, "out_proj_bias")
            else:
                out = mixed
