"""The fusion patterns by name: the one list the frontend's checks, the annotations and ``mdsl-fuse`` read.

:data:`SPEC_PATTERNS` is spec 7.5.1's table: each pattern's operations, as kinds of primitives
in order (a primitive's kinds are in its registry record, ``fusion_kinds``).
:data:`PASS_PATTERNS` are the patterns ``mdsl-fuse`` implements (``passes/fuse/``), in the order
it applies them, each with the primitives it merges (its first rewrite's; for ``@fuse(ops=[...])``,
in any order: a scale may stand before or after its matmul). A pattern may be in both
(``residual_norm``, ``gated_mlp``, ...); ``norm_linear`` is the spec's alone. :data:`KNOWN` is every
name ``@fuse``/``@fuse_required`` may give. A pure module below the dialects, the frontend and the
passes (it imports nothing of the project); a unit test checks the fusion pass's pattern classes
against it.
"""

from __future__ import annotations

SPEC_PATTERNS: dict[str, tuple[str, ...]] = {
    "residual_norm": ("add", "norm"),
    "norm_linear": ("norm", "matmul"),
    "gated_mlp": ("split", "gated"),
    "attention_softmax": ("scale", "softmax"),
    "bias_activation": ("add", "activation"),
    "linear_bias_act": ("matmul", "add", "activation"),
}

PASS_PATTERNS: dict[str, tuple[str, ...]] = {
    "residual_norm": ("add", "rmsnorm"),
    "scalar_alpha": ("scale", "matmul"),
    "transpose_flag": ("transpose", "matmul"),
    "fold": ("scale",),
    "linear_bias_act": ("matmul", "bias_add", "relu", "gelu"),
    "bias_activation": ("bias_add", "relu", "gelu"),
    "lm_head_loss": ("matmul", "cross_entropy"),
    "gated_mlp": ("split", "swiglu"),
    "attention_layout": ("transpose", "flash_attention"),
    "dag_gelu": ("mul", "scale", "add", "tanh", "add_scalar"),
    "dag_silu": ("sigmoid", "mul"),
    "dag_softmax": ("reduce_max", "sub", "exp", "reduce_sum", "div"),
    "dag_rmsnorm": ("mul", "reduce_mean", "add_scalar", "rsqrt"),
    "attention_softmax": ("scale", "softmax"),
    "dag_attention": ("batched_matmul", "softmax"),
    "qk_norm_rope": ("qk_norm", "rope"),
}

KNOWN: tuple[str, ...] = (*SPEC_PATTERNS, *(name for name in PASS_PATTERNS if name not in SPEC_PATTERNS))
