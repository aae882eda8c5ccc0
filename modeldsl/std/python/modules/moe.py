"""The std sparse mixture of experts in the Python DSL (the twin of std/modules/moe.module)."""

from modeldsl.dsl import Param, Tensor, forward, graph, module


@module
class SparseMoE_MLP:
    """xtral-style sparse mixture of SwiGLU experts (spec 6.9.3's MoELayer with the gate and up
    projections apart, as the checkpoints store them).

    A softmax router over num_experts picks top_k experts per token (their weights renormalized to sum
    1 when normalize); the tokens are permuted into expert order (moe_compute_offsets, moe_permute),
    each expert runs down(silu(gate(x)) * up(x)) through grouped GEMMs over its rows, and
    moe_unpermute sums each token's expert outputs with its routing weights.

    It also adds this layer's share of the load-balancing statistics to the running sums it is given
    (transformers' load_balancing_loss_func, summed over the layers): assigned[e] counts the top_k
    assignments to expert e, and probs[e] sums the softmax routing probability of e over the tokens. The
    model turns the sums into the auxiliary loss. The router's own per-layer aux_loss is left unused.
    """

    def __init__(self, d_model: int, d_ff: int, num_experts: int = 8, top_k: int = 2, normalize: bool = True):
        pass

    router = Param(Tensor["num_experts", "d_model"])
    experts_gate = Param(Tensor["num_experts", "d_ff", "d_model"])
    experts_up = Param(Tensor["num_experts", "d_ff", "d_model"])
    experts_down = Param(Tensor["num_experts", "d_model", "d_ff"])

    @forward
    def forward(self, in_: Tensor["B", "T", "d_model"], assigned: Tensor["num_experts", "fp32"],
                probs: Tensor["num_experts", "fp32"]
                ) -> tuple[Tensor["B", "T", "d_model"], Tensor["num_experts", "fp32"], Tensor["num_experts", "fp32"]]:
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
            offsets_f = g.cast(offsets, dtype="fp32")
            first, upper = g.split(offsets_f, [1, "num_experts"], dim=0)
            lower, last = g.split(offsets_f, ["num_experts", 1], dim=0)
            layer_assigned = g.sub(upper, lower)
            assigned_out = g.add(assigned, layer_assigned)
            router_logits = g.matmul(flat, "router", transpose="NT")
            router_probs = g.softmax(router_logits, dim=-1)
            layer_probs = g.reduce_sum(router_probs, dims=[0])
            probs_out = g.add(probs, layer_probs)
            return out, assigned_out, probs_out


@module
class LoadBalancingLoss:
    """transformers' load-balancing loss of a mixture of experts (load_balancing_loss_func) from the
    sums SparseMoE_MLP carries over the layers, times coef: E * sum_e f_e P_e, f_e the share of the
    top_k assignments that went to expert e, P_e e's mean routing probability (sum(assigned) is
    top_k assignments per token and layer). 0 unless enabled (output_router_logits)."""

    def __init__(self, num_experts: int, top_k: int, coef: float = 0.001, enabled: bool = False):
        pass

    @forward
    def forward(self, assigned: Tensor["num_experts", "fp32"], probs: Tensor["num_experts", "fp32"]
                ) -> Tensor["fp32"]:
        with graph() as g:
            if self.enabled:
                weighted = g.mul(assigned, probs)
                balance = g.reduce_sum(weighted, dims=[0])
                assignments = g.reduce_sum(assigned, dims=[0])
                squared = g.mul(assignments, assignments)
                ratio = g.div(balance, squared)
                aux_loss = g.scale(ratio, factor="coef * num_experts * top_k * top_k")
            else:
                aux_loss = g.zeros(shape=[], dtype="fp32")
            return aux_loss
