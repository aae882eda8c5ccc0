"""Annotations that do not change the compiled program in this version: W013 where they are written.

Every annotation either changes the compiled program or warns at its location. This module is
the one list of what does not (yet): :func:`inert_reason` says, for a checked annotation and
the kind of thing it annotates, whether it takes effect, and if not what is missing. The
lowering reports each such annotation once as ``W013 `@X` has no effect in this version: ...``.

Targets: ``flow`` (the value a forward flow or one of its stages computes, a stack call),
``backward`` (a flow of a written ``backward:`` graph), ``param`` (a parameter declaration),
``instance`` (a module instance among the parameters: each of its parameters takes the annotation),
``model`` (an annotation line of the top declaration) and ``declaration`` (an annotation line of
a module or block that is instantiated, not lowered as the top).
"""

from __future__ import annotations

from modeldsl.dialects.annotations import AnnotationAttr
from modeldsl.dialects.fusion_patterns import PASS_PATTERNS
from modeldsl.resolve.annotation_checks import fusion_problem

TARGETS = ("flow", "backward", "param", "instance", "model", "declaration")

# Annotations another part of the compiler is making take effect: never reported here.
OWNED_ELSEWHERE = frozenset({"gradient", "assert"})

NO_OFFLOAD = "nothing is offloaded or streamed: every tensor and parameter stays in device memory"
NO_DISTRIBUTION = ("mdsl-shard distributes data parallelism (dp), which needs no annotation, and tensor parallelism "
                   "(tp) of the parameters declared @shard(column), @shard(row) or @shard(replicated)")
TENSOR_PARALLEL = ("column", "row", "replicated")  # the @shard strategies of parameters mdsl-shard{tp} applies

# Annotations that take effect nowhere yet, whatever they annotate.
NOWHERE: dict[str, str] = {
    "precision": "no pass changes an op's compute, accumulation or output dtype (@dtype on the value casts it)",
    "scaling": "there is no fp8/fp4 quantization with scale factors",
    "recipe": "precision recipes are recorded on the model, but no pass applies them",
    "comm": NO_DISTRIBUTION,
    "partition": f"{NO_DISTRIBUTION} (@partition only feeds the E025 check of checkpoints)",
    "profile": "the executors record no profile regions",
    "trace": "the executors trace no ops",
}

ON_INSTANCES = ("frozen", "trainable", "adapter")  # what an instance passes on to its parameters
ADAPTER_TARGETS = ("flow", "param", "instance", "model")

# What each kind of target lacks, for the annotations it does not apply.
OFF_TARGET = {
    "instance": "on a module instance only @frozen, @trainable and @adapter apply (to each of its parameters)",
    "param": "it applies to the values flows compute, not to parameter declarations",
    "model": "annotations written on a declaration (not on a flow) are not applied",
    "declaration": "annotations written on a declaration (not on a flow) are not applied",
}
# The annotations of parameter declarations (the others on a parameter are OFF_TARGET).
ON_PARAMETERS = ("frozen", "trainable")


def inert_reason(attr: AnnotationAttr, target: str) -> tuple[str, str] | None:
    """``(label, what is missing)`` for an annotation that does not change the compiled program
    where it is written (``label`` the annotation as the warning names it, ``@memory(offload)``),
    None for one that takes effect (or that :data:`OWNED_ELSEWHERE` makes take effect)."""
    name = attr.dsl_name
    values, given = attr.values, attr.args.data
    if name == "gradient":
        return _gradient_reason(values, target)
    if name in OWNED_ELSEWHERE or name == "trainable" and set(given) <= {"grad_clip"} and given:
        return None
    if name == "shard":
        return _shard_reason(values, given, target)
    if name in NOWHERE:
        return f"@{name}", NOWHERE[name]
    if name == "adapter":
        return _adapter_reason(values, target)
    if target == "instance":
        return None if name in ON_INSTANCES else (f"@{name}", OFF_TARGET["instance"])
    if target in ("model", "declaration"):
        return f"@{name}", OFF_TARGET[target]
    if target == "param":
        if name == "memory":
            return f"@memory({values['mode']})", NO_OFFLOAD if values["mode"] in ("pin", "offload", "stream") \
                else "parameters are always kept; memory modes of activations apply to flows"
        if name == "dtype":
            return "@dtype", f"a parameter keeps its declared dtype (declare it in the shape: [..., {values['type']}])"
        return None if name in ON_PARAMETERS else (f"@{name}", OFF_TARGET["param"])
    if name in ON_PARAMETERS:
        return f"@{name}", "it applies to parameter declarations"
    if name == "memory":
        if values["mode"] in ("pin", "offload", "stream"):
            return f"@memory({values['mode']})", NO_OFFLOAD
        if target == "backward":
            return f"@memory({values['mode']})", "memory modes apply to forward tensors (what a backward saves)"
        if "async" in given:
            return f"@memory(async={'true' if values['async'] else 'false'})", \
                "memory operations are not asynchronous"
        return None
    if name == "checkpoint" and target == "backward":
        return "@checkpoint", "checkpoints apply to forward flows"
    if name == "lifetime" and values["start"] is None and values["scope"] in ("operation", "sublayer"):
        return f"@lifetime({values['scope']})", "the memory planner frees every tensor after its last use already"
    if name == "kernel" and "autotune" in given:
        return f"@kernel(autotune={'true' if values['autotune'] else 'false'})", "kernels are not autotuned"
    if name == "fuse":
        return _fusion_reason(values)
    return None


def _adapter_reason(values: dict, target: str) -> tuple[str, str] | None:
    """``@adapter(lora, ...)`` adds LoRA adapters (``mdsl-adapters``) where it is written on a flow,
    a parameter, an instance or the model; the other adapter types are not generated."""
    if values["type"] != "lora":
        return f"@adapter({values['type']})", "only LoRA adapters are generated (@adapter(lora, ...))"
    if target not in ADAPTER_TARGETS:
        where = "a written backward" if target == "backward" else "a module's declaration"
        return "@adapter(lora)", f"on {where} it adds nothing: write it on a flow, a parameter, an instance " \
            "or the model"
    return None


def _shard_reason(values: dict, given: dict, target: str) -> tuple[str, str] | None:
    """``@shard(column|row|replicated)`` on a parameter declaration is what tensor parallelism
    (``mdsl-shard{tp=N}``) shards it by; the other strategies, the options and activations are not applied."""
    options = sorted(set(given) - {"strategy"})
    if target == "param" and values["strategy"] in TENSOR_PARALLEL and not options:
        return None
    if target == "param" and values["strategy"] in TENSOR_PARALLEL:
        return f"@shard({values['strategy']}, {options[0]}=...)", f"{NO_DISTRIBUTION}: the size is mdsl-shard's tp, " \
            "and the collectives are blocking"
    return "@shard", NO_DISTRIBUTION


def _gradient_reason(values: dict, target: str) -> tuple[str, str] | None:
    """``@gradient(compute|accumulate|checkpoint)`` without ``scale=`` or ``clip=`` asks for what every
    gradient does already (a written backward's flows: :mod:`modeldsl.lower.flows` says)."""
    if target in ("model", "declaration"):
        return "@gradient", OFF_TARGET[target]
    mode = values["mode"]
    if target in ("flow", "param") and mode != "skip" and values["scale"] == 1.0 and values["clip"] is None:
        what = "what a backward saves or recomputes is @memory's and @checkpoint's" if mode == "checkpoint" \
            else "every gradient is computed and summed over the uses of its value already"
        return f"@gradient({mode})", f"{what}; scale=, clip= or skip change the gradient"
    return None


def _fusion_reason(values: dict) -> tuple[str, str] | None:
    """``@fuse(pattern)`` or ``@fuse(ops=[...])`` that asks for nothing ``mdsl-fuse`` implements."""
    pattern, ops = values["pattern"], values["ops"]
    if pattern is not None and pattern not in PASS_PATTERNS:
        return f"@fuse({pattern})", "no mdsl-fuse pattern implements it"
    if ops is not None and not any(fusion_problem(p, None, list(ops)) is None for p in PASS_PATTERNS):
        return f"@fuse(ops=[{', '.join(ops)}])", "no mdsl-fuse pattern merges these operations"
    return None


def inert_message(label: str, missing: str) -> str:
    return f"`{label}` has no effect in this version: {missing}"
