"""The std router losses of a mixture of experts in the Python DSL (the twin of
std/modules/moe/router.module)."""

from modeldsl.dsl import Tensor, forward, graph, module


@module
class RouterStatistics:
    """One MoE layer's share of the router losses' running sums, added to the sums it is given (the
    losses are products of sums over every layer's tokens, which per-layer losses cannot give):
    assigned[e] counts the top_k assignments to expert e (from the expert offsets), probs[e] sums the
    softmax routing probability of e over the tokens, and z sums each token's squared log-sum-exp of
    its router logits (in fp32)."""

    def __init__(self, num_experts: int):
        pass

    @forward
    def forward(self, router_logits: Tensor["tokens", "num_experts"], offsets: Tensor["num_experts + 1", "int32"],
                assigned: Tensor["num_experts", "fp32"], probs: Tensor["num_experts", "fp32"], z: Tensor["fp32"]
                ) -> tuple[Tensor["num_experts", "fp32"], Tensor["num_experts", "fp32"], Tensor["fp32"]]:
        with graph() as g:
            offsets_f = g.cast(offsets, dtype="fp32")
            first, upper = g.split(offsets_f, [1, "num_experts"], dim=0)
            lower, last = g.split(offsets_f, ["num_experts", 1], dim=0)
            layer_assigned = g.sub(upper, lower)
            assigned_out = g.add(assigned, layer_assigned)
            router_probs = g.softmax(router_logits, dim=-1)
            layer_probs = g.reduce_sum(router_probs, dims=[0])
            probs_out = g.add(probs, layer_probs)
            logits32 = g.cast(router_logits, dtype="fp32")
            top, top_index = g.reduce_max(logits32, dim=1, keepdim=True)
            shifted = g.sub(logits32, top)
            shifted_exp = g.exp(shifted)
            total = g.reduce_sum(shifted_exp, dims=[1], keepdim=True)
            log_total = g.log(total)
            lse = g.add(log_total, top)
            lse_squared = g.mul(lse, lse)
            layer_z = g.reduce_sum(lse_squared, dims=[0, 1])
            z_out = g.add(z, layer_z)
            return assigned_out, probs_out, z_out


@module
class RouterAuxLoss:
    """The auxiliary loss of a mixture of experts from the sums RouterStatistics carries over the
    layers, 0 unless enabled (transformers' output_router_logits):
    - coef times transformers' load-balancing loss (load_balancing_loss_func): E * sum_e f_e P_e, f_e
      the share of the top_k assignments that went to expert e, P_e e's mean routing probability
      (sum(assigned) is top_k assignments per token and layer);
    - plus z_coef times the router z-loss (transformers' router_z_loss_func, ST-MoE): the mean over
      every layer's tokens of the squared log-sum-exp of the router logits."""

    def __init__(self, num_experts: int, top_k: int, coef: float = 0.001, z_coef: float = 0.0,
                 enabled: bool = False):
        pass

    @forward
    def forward(self, assigned: Tensor["num_experts", "fp32"], probs: Tensor["num_experts", "fp32"],
                z: Tensor["fp32"]) -> Tensor["fp32"]:
        with graph() as g:
            if self.enabled:
                weighted = g.mul(assigned, probs)
                balance = g.reduce_sum(weighted, dims=[0])
                assignments = g.reduce_sum(assigned, dims=[0])
                squared = g.mul(assignments, assignments)
                ratio = g.div(balance, squared)
                balance_loss = g.scale(ratio, factor="coef * num_experts * top_k * top_k")
                z_per_assignment = g.div(z, assignments)
                z_loss = g.scale(z_per_assignment, factor="z_coef * top_k")
                aux_loss = g.add(balance_loss, z_loss)
            else:
                aux_loss = g.zeros(shape=[], dtype="fp32")
            return aux_loss
