"""The std sparse mixture of experts in the Python DSL (the twin of std/modules/moe/expert.module)."""

from modeldsl.dsl import Param, Tensor, forward, graph, module
from modeldsl.std.python.modules.moe.router import RouterStatistics


@module
class SparseMoE_MLP:
    """Mixtral-style sparse mixture of SwiGLU experts (spec 6.9.3's MoELayer with the gate and up
    projections apart, as the checkpoints store them).

    A softmax router over num_experts picks top_k experts per token (their weights renormalized to sum
    1 when normalize); the tokens are permuted into expert order (moe_compute_offsets, moe_permute),
    each expert runs down(silu(gate(x)) * up(x)) through grouped GEMMs over its rows, and
    moe_unpermute sums each token's expert outputs with its routing weights.

    It also adds this layer's share to the router losses' running sums it is given (RouterStatistics;
    RouterAuxLoss turns them into the auxiliary loss). The router's own per-layer aux_loss is left unused.
    """

    def __init__(self, d_model: int, d_ff: int, num_experts: int = 8, top_k: int = 2, normalize: bool = True):
        pass

    router = Param(Tensor["num_experts", "d_model"])
    experts_gate = Param(Tensor["num_experts", "d_ff", "d_model"])
    experts_up = Param(Tensor["num_experts", "d_ff", "d_model"])
    experts_down = Param(Tensor["num_experts", "d_model", "d_ff"])
    statistics = Param(RouterStatistics("num_experts"))

    @forward
    def forward(self, in_: Tensor["B", "T", "d_model"], assigned: Tensor["num_experts", "fp32"],
                probs: Tensor["num_experts", "fp32"], z: Tensor["fp32"]
                ) -> tuple[Tensor["B", "T", "d_model"], Tensor["num_experts", "fp32"], Tensor["num_experts", "fp32"],
                           Tensor["fp32"]]:
        with graph() as g:
            flat = g.view(in_, ["B * T", "d_model"])
            weights, indices, aux_loss = g.moe_router(flat, "router", top_k=self.top_k, normalize=self.normalize)
            offsets = g.moe_compute_offsets(indices, num_experts=self.num_experts)
            permuted, scatter = g.moe_permute(flat, indices, offsets)
            gate = g.grouped_gemm(permuted, "experts_gate", offsets, transpose="TN")
            up = g.grouped_gemm(permuted, "experts_up", offsets, transpose="TN")
            hidden = g.swiglu(gate, up)
            expert_out = g.grouped_gemm(hidden, "experts_down", offsets, transpose="TN")
            combined = g.moe_unpermute(expert_out, weights, scatter)
            out = g.view(combined, ["B", "T", "d_model"])
            router_logits = g.matmul(flat, "router", transpose="NT")
            assigned_out, probs_out, z_out = self.statistics(router_logits, offsets, assigned, probs, z)
            return out, assigned_out, probs_out, z_out
