"""The std Mamba in the Python DSL (the twin of std/models/mamba.module)."""

from modeldsl.dsl import Array, Param, Tensor, field, forward, graph, hf_config, hf_mapping, model, tied_to
from modeldsl.std.python.blocks.mamba import MambaBlock
from modeldsl.std.python.modules.norm import RMSNorm


@model
@hf_config(
    architecture="MambaForCausalLM",
    config_class="MambaConfig",
    param_mapping={
        "vocab_size": "vocab_size",
        "d_model": "hidden_size",
        "n_layers": "num_hidden_layers",
        "d_inner": "intermediate_size",
        "d_state": "state_size",
        "dt_rank": "time_step_rank",
        "d_conv": "conv_kernel",
        "eps": "layer_norm_epsilon",
        "tie_embeddings": field("tie_word_embeddings", absent=True),
    },
    require={"hidden_act": "silu", "use_bias": False, "use_conv_bias": True},
    ignore=["expand", "residual_in_fp32", "rescale_prenorm_residual", "time_step_scale", "time_step_min",
            "time_step_max", "time_step_floor", "time_step_init_scheme", "initializer_range", "use_mambapy",
            "use_cache"],
)
@hf_mapping({
    "embedding": "backbone.embeddings.weight",
    "final_norm.weight": "backbone.norm_f.weight",
    "lm_head?": "lm_head.weight",
    "blocks[{layer}].norm.weight": "backbone.layers.{layer}.norm.weight",
    "blocks[{layer}].in_proj": "backbone.layers.{layer}.mixer.in_proj.weight",
    "blocks[{layer}].conv_weight": "backbone.layers.{layer}.mixer.conv1d.weight",
    "blocks[{layer}].conv_bias": "backbone.layers.{layer}.mixer.conv1d.bias",
    "blocks[{layer}].x_proj": "backbone.layers.{layer}.mixer.x_proj.weight",
    "blocks[{layer}].dt_proj": "backbone.layers.{layer}.mixer.dt_proj.weight",
    "blocks[{layer}].dt_bias": "backbone.layers.{layer}.mixer.dt_proj.bias",
    "blocks[{layer}].A_log": "backbone.layers.{layer}.mixer.A_log",
    "blocks[{layer}].D": "backbone.layers.{layer}.mixer.D",
    "blocks[{layer}].out_proj": "backbone.layers.{layer}.mixer.out_proj.weight",
})
class Mamba:
    """Mamba (MambaForCausalLM): a stack of selective state space blocks, no attention and no positions."""

    def __init__(self, vocab_size: int = 50280, d_model: int = 768, n_layers: int = 24,
                 d_inner: int = "2 * d_model", d_state: int = 16, dt_rank: int = "(d_model + 15) // 16",
                 d_conv: int = 4, eps: float = 1e-5, tie_embeddings: bool = True):
        pass

    embedding = Param(Tensor["vocab_size", "d_model"])
    blocks = Param(Array["n_layers", MambaBlock("d_model", "d_inner", "d_state", "dt_rank", "d_conv", "eps")])
    final_norm = Param(RMSNorm("d_model", "eps"))
    lm_head = Param(tied_to("embedding"), when="tie_embeddings")
    lm_head = Param(Tensor["vocab_size", "d_model"], when="not tie_embeddings")  # noqa: F811 - the other case

    @forward
    def forward(self, tokens: Tensor["B", "T", "int32"]) -> Tensor["B", "T", "vocab_size"]:
        with graph() as g:
            x0 = g.embedding(tokens, "embedding", hook="AfterEmbedding")
            xN = self.blocks(x0)
            xF = self.final_norm(xN, hook="BeforeLMHead")
            logits = g.matmul(xF, "lm_head", transpose="NT")
            return logits
