"""Annotations (spec section 7): schemas, canonical printing and round trips, verify(),
the frontend constructor make_annotation, annotations on ops, and the memory precedence of 7.2.0."""

import pytest
from xdsl.context import Context
from xdsl.dialects.builtin import (
    ArrayAttr,
    Builtin,
    DictionaryAttr,
    FloatAttr,
    IntegerAttr,
    StringAttr,
    f64,
    i64,
)
from xdsl.ir import Dialect
from xdsl.parser import Parser
from xdsl.utils.exceptions import ParseError, VerifyException

from modeldsl.dialects.annotations import (
    ANNOTATION_BY_NAME,
    ANNOTATIONS,
    ANNOTATIONS_ATTR_NAME,
    AdapterAttr,
    AnnotationAttr,
    AnnotationError,
    CheckpointAttr,
    DtypeAttr,
    FrozenAttr,
    HookAttr,
    MemoryAttr,
    NofuseAttr,
    PrecisionAttr,
    ShardAttr,
    TrainableAttr,
    annotations_of,
    check_annotation_set,
    check_annotations,
    effective_memory_policy,
    find_annotation,
    make_annotation,
)


@pytest.fixture(scope="module")
def ctx():
    context = Context()
    context.load_dialect(Builtin)
    context.load_dialect(Dialect("mdsl.graph", [], list(ANNOTATIONS)))
    return context


def parse(ctx, text):
    return Parser(ctx, text).parse_attribute()


# ----------------------------------------------------------------------------
# The set of annotations
# ----------------------------------------------------------------------------


def test_every_annotation_of_the_spec_is_defined():
    section_7 = {
        "memory", "checkpoint", "lifetime", "hook", "adapter", "probe", "dtype", "precision", "scaling",
        "fuse", "nofuse", "kernel", "shard", "partition", "comm", "assert", "profile", "trace",
        "frozen", "trainable", "gradient", "recipe", "fuse_required",
    }
    elsewhere = {"alias", "noalias", "barrier"}  # 5.11.2, 5.11.5
    assert section_7 | elsewhere == set(ANNOTATION_BY_NAME)
    assert len(ANNOTATIONS) == len(ANNOTATION_BY_NAME)
    for cls in ANNOTATIONS:
        assert issubclass(cls, AnnotationAttr)
        assert cls.name == f"mdsl.graph.{cls.dsl_name}"
        assert cls.dsl_name == cls.DSL_NAME and ANNOTATION_BY_NAME[cls.dsl_name] is cls
        assert cls.__doc__


def test_binding_annotations_are_marked():
    assert {cls.dsl_name for cls in ANNOTATIONS if cls.BINDING} == {"dtype", "nofuse", "fuse_required"}


# ----------------------------------------------------------------------------
# Printing and parsing: (text as written, canonical text); defaults are dropped
# ----------------------------------------------------------------------------

ROUND_TRIPS = [
    ("#mdsl.graph.memory<recompute>", "#mdsl.graph.memory<recompute>"),
    ("#mdsl.graph.memory<mode = offload, priority = 2, prefetch = true>", "#mdsl.graph.memory<offload, priority = 2>"),
    ("#mdsl.graph.memory<stream, prefetch = false, async = false>",
     "#mdsl.graph.memory<stream, prefetch = false, async = false>"),
    ("#mdsl.graph.checkpoint<full>", "#mdsl.graph.checkpoint"),
    ("#mdsl.graph.checkpoint<granularity = selective, preserve = [\"attn_out\"]>",
     '#mdsl.graph.checkpoint<selective, preserve = ["attn_out"]>'),
    ('#mdsl.graph.checkpoint<preserve = ["a", "b"]>', '#mdsl.graph.checkpoint<preserve = ["a", "b"]>'),
    ("#mdsl.graph.lifetime<sublayer>", "#mdsl.graph.lifetime<sublayer>"),
    ('#mdsl.graph.lifetime<operation, start = "op1", end = "op3">', '#mdsl.graph.lifetime<start = "op1", end = "op3">'),
    ("#mdsl.graph.hook<AfterQKVProjection, mode = observe>", "#mdsl.graph.hook<AfterQKVProjection>"),
    ('#mdsl.graph.hook<"attn_out", mode = modify, priority = 2>',
     "#mdsl.graph.hook<attn_out, mode = modify, priority = 2>"),
    ("#mdsl.graph.adapter<lora, rank = 8, alpha = 16.0, targets = [\"q\", \"v\"]>",
     '#mdsl.graph.adapter<lora, rank = 8, alpha = 16.0, targets = ["q", "v"]>'),
    ("#mdsl.graph.adapter<type = ia3>", "#mdsl.graph.adapter<ia3>"),
    ("#mdsl.graph.adapter<prefix, length = 20, hidden_dim = 512>",
     "#mdsl.graph.adapter<prefix, length = 20, hidden_dim = 512>"),
    ("#mdsl.graph.adapter<adapter, bottleneck_dim = 32, activation = gelu>",
     "#mdsl.graph.adapter<adapter, bottleneck_dim = 32, activation = gelu>"),
    ('#mdsl.graph.probe<"logits", capture = histogram, frequency = 100>',
     '#mdsl.graph.probe<"logits", capture = histogram, frequency = 100>'),
    ('#mdsl.graph.probe<name = "attn", capture = stats, condition = "has_nan_or_inf(out)">',
     '#mdsl.graph.probe<"attn", condition = "has_nan_or_inf(out)">'),
    ("#mdsl.graph.dtype<bf16>", "#mdsl.graph.dtype<bf16>"),
    ("#mdsl.graph.dtype<type = fp8_e4m3>", "#mdsl.graph.dtype<fp8_e4m3>"),
    ("#mdsl.graph.precision<compute = fp8_e4m3, accumulate = fp32, output = bf16>",
     "#mdsl.graph.precision<compute = fp8_e4m3, output = bf16>"),
    ("#mdsl.graph.precision<policy = fp8_hybrid>", "#mdsl.graph.precision<policy = fp8_hybrid>"),
    ("#mdsl.graph.scaling<delayed, history_len = 16, update_interval = 4>",
     "#mdsl.graph.scaling<delayed, update_interval = 4>"),
    ("#mdsl.graph.scaling<per_block, block_size = [16, 16]>", "#mdsl.graph.scaling<per_block, block_size = [16, 16]>"),
    ("#mdsl.graph.scaling<dynamic, margin = 0.1>", "#mdsl.graph.scaling<dynamic, margin = 0.1>"),
    ("#mdsl.graph.recipe<FP8HybridRecipe>", "#mdsl.graph.recipe<FP8HybridRecipe>"),
    ("#mdsl.graph.fuse<pattern = residual_norm, scope = local>", "#mdsl.graph.fuse<residual_norm>"),
    ('#mdsl.graph.fuse<ops = ["matmul", "add", "silu"]>', '#mdsl.graph.fuse<ops = ["matmul", "add", "silu"]>'),
    ("#mdsl.graph.fuse<scope = global>", "#mdsl.graph.fuse<scope = global>"),
    ("#mdsl.graph.fuse_required<gated_mlp>", "#mdsl.graph.fuse_required<gated_mlp>"),
    ("#mdsl.graph.nofuse", "#mdsl.graph.nofuse"),
    ('#mdsl.graph.nofuse<reason = "checking for \\"NaN\\" source">',
     '#mdsl.graph.nofuse<"checking for \\"NaN\\" source">'),
    ('#mdsl.graph.kernel<"cudnn_fmha_v2", fallback = true>', '#mdsl.graph.kernel<"cudnn_fmha_v2">'),
    ('#mdsl.graph.kernel<"cutlass", autotune = false, workspace = 1024, fallback = false>',
     '#mdsl.graph.kernel<"cutlass", autotune = false, workspace = 1024, fallback = false>'),
    ("#mdsl.graph.shard<column, tp_size = 8>", "#mdsl.graph.shard<column, tp_size = 8>"),
    ("#mdsl.graph.shard<strategy = expert, ep_size = 8, async_comm = false, reduce_scatter = true>",
     "#mdsl.graph.shard<expert, ep_size = 8, async_comm = false>"),
    ("#mdsl.graph.partition<0>", "#mdsl.graph.partition<0>"),
    ("#mdsl.graph.partition<stage = 3, micro_batch = false, recompute = true>",
     "#mdsl.graph.partition<3, micro_batch = false, recompute = true>"),
    ('#mdsl.graph.comm<all_reduce, group = "dp", bucket_size = 25000000>',
     '#mdsl.graph.comm<all_reduce, group = "dp", bucket_size = 25000000>'),
    ('#mdsl.graph.comm<send, group = "default", async = true>', "#mdsl.graph.comm<send>"),
    ('#mdsl.graph.assert<"!has_nan(out)", message = "NaN in attention output">',
     '#mdsl.graph.assert<"!has_nan(out)", "NaN in attention output">'),
    ('#mdsl.graph.assert<condition = "all(x >= 0)", enabled = false>',
     '#mdsl.graph.assert<"all(x >= 0)", enabled = false>'),
    ('#mdsl.graph.profile<"attention", memory = true, nvtx = true>', '#mdsl.graph.profile<"attention", memory = true>'),
    ("#mdsl.graph.trace<ops>", "#mdsl.graph.trace"),
    ("#mdsl.graph.trace<level = tensors>", "#mdsl.graph.trace<tensors>"),
    ("#mdsl.graph.frozen", "#mdsl.graph.frozen"),
    ("#mdsl.graph.trainable", "#mdsl.graph.trainable"),
    ("#mdsl.graph.trainable<lr_scale = 0.1, wd_scale = 0.0>", "#mdsl.graph.trainable<lr_scale = 0.1, wd_scale = 0.0>"),
    ("#mdsl.graph.trainable<grad_clip = 1.0e-05>", "#mdsl.graph.trainable<grad_clip = 1.0e-05>"),
    ("#mdsl.graph.gradient<skip>", "#mdsl.graph.gradient<skip>"),
    ("#mdsl.graph.gradient<compute, scale = -0.5, clip = 1.0>", "#mdsl.graph.gradient<scale = -0.5, clip = 1.0>"),
    ("#mdsl.graph.alias", "#mdsl.graph.alias"),
    ("#mdsl.graph.noalias", "#mdsl.graph.noalias"),
    ("#mdsl.graph.barrier", "#mdsl.graph.barrier"),
]


@pytest.mark.parametrize("written, canonical", ROUND_TRIPS)
def test_parse_prints_canonically_and_round_trips(ctx, written, canonical):
    attr = parse(ctx, written)
    attr.verify()
    assert str(attr) == canonical
    again = parse(ctx, canonical)
    assert again == attr
    assert str(again) == canonical


def test_round_trips_cover_every_annotation():
    covered = {text.split("<")[0].removeprefix("#mdsl.graph.") for text, _ in ROUND_TRIPS}
    assert covered == set(ANNOTATION_BY_NAME)


@pytest.mark.parametrize(
    "text, message",
    [
        ("#mdsl.graph.memory", "@memory needs 'mode'"),
        ("#mdsl.graph.memory<sometimes>", "'sometimes' is not one of save, recompute"),
        ("#mdsl.graph.memory<save, pin>", "expected a parameter name of @memory"),
        ("#mdsl.graph.memory<save, mode = pin>", "'mode' is given twice"),
        ("#mdsl.graph.shard<column, size = 4>", "@shard has no parameter 'size'"),
        ("#mdsl.graph.partition<-1>", "@partition(stage=...) must be >= 0, got -1"),
        ("#mdsl.graph.hook<mode = modify>", "@hook needs 'point'"),
        ("#mdsl.graph.adapter<ia3, rank = 4>", "@adapter(ia3) does not take rank"),
        ("#mdsl.graph.dtype<float>", "'float' is not a dtype"),
        ("#mdsl.graph.frozen<1>", "expected a parameter name of @frozen"),
    ],
)
def test_malformed_text_is_a_located_parse_error(ctx, text, message):
    with pytest.raises(ParseError) as info:
        parse(ctx, text)
    assert message in str(info.value)


# ----------------------------------------------------------------------------
# verify()
# ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cls, args, message",
    [
        (MemoryAttr, {"mode": StringAttr("save"), "priority": IntegerAttr(0, i64)},
         "'priority' equals its default and must be omitted"),
        (ShardAttr, {"strategy": StringAttr("row"), "size": IntegerAttr(2, i64)}, "@shard has no parameter 'size'"),
        (MemoryAttr, {"mode": IntegerAttr(1, i64)}, "@memory(mode=...) expects a word"),
        (MemoryAttr, {"mode": StringAttr("always")}, "'always' is not one of"),
        (MemoryAttr, {}, "@memory needs 'mode'"),
        (MemoryAttr, {"mode": StringAttr("save"), "priority": IntegerAttr(3, i64)},
         "@memory(save) does not take priority"),
        (HookAttr, {"point": StringAttr("after attention")}, "'after attention' is not a name"),
        (HookAttr, {"point": StringAttr("P"), "priority": IntegerAttr(-1, i64)}, "@hook(priority=...) must be >= 0"),
        (AdapterAttr, {"type": StringAttr("lora"), "dropout": FloatAttr(1.5, f64)},
         "@adapter dropout must be in [0, 1), got 1.5"),
        (TrainableAttr, {"lr_scale": FloatAttr(-1.0, f64)}, "@trainable(lr_scale=...) must be >= 0, got -1.0"),
        (TrainableAttr, {"grad_clip": FloatAttr(0.0, f64)}, "@trainable(grad_clip=...) must be > 0"),
    ],
)
def test_verify_reports_what_the_spec_forbids(cls, args, message):
    with pytest.raises(VerifyException) as info:
        cls(DictionaryAttr(args))
    assert message in str(info.value)


def test_verify_runs_the_cross_parameter_rules():
    with pytest.raises(VerifyException, match="granularity=none"):
        CheckpointAttr(DictionaryAttr({"granularity": StringAttr("none"), "preserve": ArrayAttr([StringAttr("x")])}))
    with pytest.raises(VerifyException, match="'policy' or explicit dtypes"):
        PrecisionAttr(DictionaryAttr({"policy": StringAttr("bf16"), "compute": StringAttr("fp32")}))


# ----------------------------------------------------------------------------
# make_annotation: the frontend's constructor
# ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, args, kwargs, printed",
    [
        ("memory", ["recompute"], {}, "#mdsl.graph.memory<recompute>"),
        ("memory", [], {"mode": "offload", "priority": 3, "prefetch": True},
         "#mdsl.graph.memory<offload, priority = 3>"),
        ("memory", ["offload"], {"priority": 1}, "#mdsl.graph.memory<offload, priority = 1>"),
        ("checkpoint", [], {}, "#mdsl.graph.checkpoint"),
        ("checkpoint", [], {"granularity": "selective", "preserve": ["attn_out"]},
         '#mdsl.graph.checkpoint<selective, preserve = ["attn_out"]>'),
        ("lifetime", [], {"scope": "sublayer"}, "#mdsl.graph.lifetime<sublayer>"),
        ("lifetime", [], {"start": "op1", "end": "op3"}, '#mdsl.graph.lifetime<start = "op1", end = "op3">'),
        ("hook", ["AfterQKVProjection"], {"mode": "modify"}, "#mdsl.graph.hook<AfterQKVProjection, mode = modify>"),
        ("hook", ["BeforeLMHead"], {"mode": "observe"}, "#mdsl.graph.hook<BeforeLMHead>"),
        ("adapter", ["lora"], {"rank": 16, "alpha": 32, "targets": ["q", "k", "v"]},
         '#mdsl.graph.adapter<lora, targets = ["q", "k", "v"]>'),
        ("adapter", ["lora"], {"rank": 8, "alpha": 16}, "#mdsl.graph.adapter<lora, rank = 8, alpha = 16.0>"),
        ("probe", ["qkv_output"], {"capture": "stats"}, '#mdsl.graph.probe<"qkv_output">'),
        ("dtype", ["bf16"], {}, "#mdsl.graph.dtype<bf16>"),
        ("precision", [], {"compute": "fp8_e4m3", "output": "bf16"},
         "#mdsl.graph.precision<compute = fp8_e4m3, output = bf16>"),
        ("precision", [], {"policy": "fp32"}, "#mdsl.graph.precision<policy = fp32>"),
        ("scaling", ["delayed"], {"history_len": 32}, "#mdsl.graph.scaling<delayed, history_len = 32>"),
        ("scaling", ["per_block"], {"block_size": [32, 32]}, "#mdsl.graph.scaling<per_block>"),
        ("recipe", ["FP8HybridRecipe"], {}, "#mdsl.graph.recipe<FP8HybridRecipe>"),
        ("fuse", ["residual_norm"], {}, "#mdsl.graph.fuse<residual_norm>"),
        ("fuse", [], {"ops": ["matmul", "add", "silu"]}, '#mdsl.graph.fuse<ops = ["matmul", "add", "silu"]>'),
        ("fuse", [], {"scope": "global"}, "#mdsl.graph.fuse<scope = global>"),
        ("fuse_required", ["gated_mlp"], {}, "#mdsl.graph.fuse_required<gated_mlp>"),
        ("nofuse", [], {}, "#mdsl.graph.nofuse"),
        ("nofuse", [], {"reason": "profiling"}, '#mdsl.graph.nofuse<"profiling">'),
        ("kernel", ["my_experimental_kernel"], {"fallback": True}, '#mdsl.graph.kernel<"my_experimental_kernel">'),
        ("shard", ["column"], {"tp_size": 4}, "#mdsl.graph.shard<column, tp_size = 4>"),
        ("shard", ["replicated"], {}, "#mdsl.graph.shard<replicated>"),
        ("partition", [0], {}, "#mdsl.graph.partition<0>"),
        ("comm", ["all_reduce"], {"group": "dp", "bucket_size": 25_000_000},
         '#mdsl.graph.comm<all_reduce, group = "dp", bucket_size = 25000000>'),
        ("assert", ["all(x > 0)"], {"message": "bad"}, '#mdsl.graph.assert<"all(x > 0)", "bad">'),
        ("assert", ["!has_nan(x)", "bad"], {}, '#mdsl.graph.assert<"!has_nan(x)", "bad">'),
        ("profile", ["forward"], {"nvtx": True}, '#mdsl.graph.profile<"forward">'),
        ("trace", [], {"level": "tensors"}, "#mdsl.graph.trace<tensors>"),
        ("frozen", [], {}, "#mdsl.graph.frozen"),
        ("trainable", [], {"lr_scale": 0.1, "wd_scale": 0}, "#mdsl.graph.trainable<lr_scale = 0.1, wd_scale = 0.0>"),
        ("gradient", ["skip"], {}, "#mdsl.graph.gradient<skip>"),
        ("gradient", [], {"scale": 0.1}, "#mdsl.graph.gradient<scale = 0.1>"),
        ("alias", [], {}, "#mdsl.graph.alias"),
        ("barrier", [], {}, "#mdsl.graph.barrier"),
    ],
)
def test_make_annotation_maps_dsl_arguments(ctx, name, args, kwargs, printed):
    attr = make_annotation(name, args, kwargs)
    assert isinstance(attr, ANNOTATION_BY_NAME[name])
    attr.verify()
    assert str(attr) == printed
    assert parse(ctx, printed) == attr


def test_values_include_defaults():
    attr = make_annotation("memory", ["offload"], {})
    assert attr.values == {"mode": "offload", "priority": 0, "prefetch": True, "async": True, "policy": "always"}
    assert attr["mode"] == "offload"
    assert MemoryAttr.of(mode="offload") == attr
    assert make_annotation("lifetime", [], {})["start"] is None
    assert make_annotation("scaling", ["per_block"])["block_size"] == [32, 32]


def test_positional_and_keyword_forms_are_the_same_attribute():
    assert make_annotation("hook", ["AfterAttention"], {"mode": "modify"}) == make_annotation(
        "hook", [], {"mode": "modify", "point": "AfterAttention"}
    )
    assert make_annotation("scaling", ["per_block"], {"block_size": (16, 16)})["block_size"] == [16, 16]


@pytest.mark.parametrize(
    "name, args, kwargs, message",
    [
        ("remember", [], {}, "unknown annotation @remember"),
        ("memory", [], {}, "@memory needs 'mode'"),
        ("memory", ["sometimes"], {}, "'sometimes' is not one of"),
        ("memory", ["save", "pin"], {}, "@memory takes at most 1 positional argument(s), got 2"),
        ("memory", ["save"], {"mode": "pin"}, "@memory takes no positional arguments, got 1"),
        ("memory", ["pin"], {"priority": 2}, "@memory(pin) does not take priority"),
        ("memory", ["offload"], {"priority": -1}, "@memory(priority=...) must be >= 0"),
        ("shard", ["column"], {"tp": 4}, "@shard has no parameter 'tp'"),
        ("shard", ["column"], {"tp_size": "4"}, "expects an integer"),
        ("shard", ["column"], {"tp_size": 0}, "must be >= 1"),
        ("shard", ["replicated"], {"tp_size": 2}, "@shard(replicated) keeps a full copy and takes no tp_size"),
        ("trainable", [], {"lr_scale": True}, "expects a finite number"),
        ("trainable", [], {"lr_scale": float("inf")}, "expects a finite number"),
        ("trainable", [], {"grad_clip": 0}, "@trainable(grad_clip=...) must be > 0"),
        ("frozen", [True], {}, "@frozen takes no positional arguments, got 1"),
        ("dtype", ["float"], {}, "is not a dtype"),
        ("dtype", [], {}, "@dtype needs 'type'"),
        ("checkpoint", [], {"preserve": "x"}, "expects a list of strings"),
        ("checkpoint", ["none"], {"preserve": ["x"]}, "takes no 'preserve' list"),
        ("checkpoint", ["sometimes"], {}, "'sometimes' is not one of full, selective, none"),
        ("lifetime", [], {"start": "a"}, "@lifetime needs both 'start' and 'end', or neither"),
        ("lifetime", ["block"], {"start": "a", "end": "b"}, "@lifetime takes a 'scope' or 'start' and 'end', not both"),
        ("hook", [], {"mode": "modify"}, "@hook needs 'point'"),
        ("hook", ["AfterAttention"], {"mode": "rewrite"}, "'rewrite' is not one of observe, modify, replace"),
        ("adapter", ["lora"], {"dropout": 1.0}, "@adapter dropout must be in [0, 1)"),
        ("adapter", ["lora"], {"rank": 0}, "@adapter(rank=...) must be >= 1"),
        ("adapter", ["lora"], {"targets": ["q", "q"]}, "targets repeat a name"),
        ("adapter", ["prompt"], {"hidden_dim": 64}, "@adapter(prompt) does not take hidden_dim"),
        ("adapter", ["ia3"], {"rank": 4, "activation": "gelu"}, "@adapter(ia3) does not take activation, rank"),
        ("probe", [""], {}, "@probe(name=...) must not be empty"),
        ("probe", ["p"], {"frequency": 0}, "@probe(frequency=...) must be >= 1"),
        ("precision", [], {"policy": "bf16", "compute": "fp32"}, "takes a 'policy' or explicit dtypes, not both"),
        ("precision", [], {"policy": "bf16", "accumulate": "bf16"}, "takes a 'policy' or explicit dtypes, not both"),
        ("precision", [], {"policy": "tf32"}, "'tf32' is not one of fp32, bf16, fp16, fp8_hybrid, fp8_pure, fp4"),
        ("precision", [], {"accumulate": "fp8_e4m3"}, "accumulate must be a 16- or 32-bit float type"),
        ("scaling", ["per_block"], {"block_size": [32]}, "block_size must be two positive integers"),
        ("scaling", ["per_tensor"], {"history_len": 8}, "@scaling(per_tensor) does not take history_len"),
        ("scaling", ["per_block"], {"margin": 0.5}, "@scaling(per_block) does not take margin"),
        ("fuse", ["residual_norm"], {"ops": ["add", "rmsnorm"]}, "takes a pattern name or an 'ops' list, not both"),
        ("fuse", [], {"ops": ["add"]}, "ops must name at least two operations"),
        ("fuse", ["not a name"], {}, "is not a name"),
        ("fuse_required", [], {"scope": "global"}, "@fuse_required needs a pattern name or an 'ops' list"),
        ("kernel", [], {}, "@kernel needs 'name'"),
        ("kernel", ["k"], {"workspace": -1}, "@kernel(workspace=...) must be >= 0"),
        ("partition", [1.0], {}, "@partition(stage=...) expects an integer"),
        ("comm", ["all_reduce"], {"group": ""}, "@comm group must not be empty"),
        ("comm", ["scatter"], {}, "'scatter' is not one of"),
        ("assert", [], {"message": "m"}, "@assert needs 'condition'"),
        ("assert", ["x > 0"], {}, "'x' is no check in the condition 'x > 0'"),
        ("assert", ["!has_nan(x) || all(x > 0)"], {}, "'||' in the condition"),
        ("assert", ["all(x >= 0"], {}, "expected ')' in the condition"),
        ("profile", ["p"], {"memory": 1}, "@profile(memory=...) expects true or false"),
        ("trace", ["everything"], {}, "'everything' is not one of ops, tensors, values"),
        ("gradient", ["skip"], {"scale": 0.5}, "@gradient(skip) computes no gradient and takes no scale"),
        ("gradient", [], {"clip": -1.0}, "@gradient(clip=...) must be > 0"),
        ("recipe", ["not-a-name"], {}, "is not a name"),
    ],
)
def test_bad_annotations_raise_annotation_error(name, args, kwargs, message):
    with pytest.raises(AnnotationError) as info:
        make_annotation(name, args, kwargs)
    assert message in info.value.message
    assert str(info.value) == info.value.message


def test_annotation_errors_carry_hints():
    with pytest.raises(AnnotationError) as info:
        make_annotation("frozn")
    assert "frozen" in info.value.hint
    with pytest.raises(AnnotationError) as info:
        make_annotation("memory", [], {})
    assert info.value.hint.startswith("usage: @memory(mode, priority=0")
    with pytest.raises(AnnotationError) as info:
        make_annotation("shard", ["column"], {"tp": 4})
    assert "tp_size" in info.value.hint
    with pytest.raises(AnnotationError) as info:
        make_annotation("adapter", ["prompt"], {"rank": 4})
    assert info.value.hint == "prompt takes length"


# ----------------------------------------------------------------------------
# Annotations on ops
# ----------------------------------------------------------------------------


def module_with(ctx, annotations: str):
    return Parser(ctx, f"builtin.module attributes {{{ANNOTATIONS_ATTR_NAME} = [{annotations}]}} {{}}").parse_module()


def test_annotations_of_an_op(ctx):
    module = module_with(ctx, "#mdsl.graph.frozen, #mdsl.graph.trainable<lr_scale = 0.5>, 7")
    found = annotations_of(module)
    assert [type(a) for a in found] == [FrozenAttr, TrainableAttr]
    assert found[1]["lr_scale"] == 0.5
    assert find_annotation(module, TrainableAttr) == found[1]
    assert find_annotation(module, MemoryAttr) is None
    assert annotations_of(Parser(ctx, "builtin.module {}").parse_module()) == []


def test_check_annotations_of_an_op(ctx):
    check_annotations(module_with(ctx, "#mdsl.graph.hook<A>, #mdsl.graph.hook<B>, #mdsl.graph.memory<save>"))
    with pytest.raises(VerifyException, match="must be an array of #mdsl.graph annotations"):
        check_annotations(module_with(ctx, '"frozen"'))
    with pytest.raises(VerifyException, match="@frozen and @trainable contradict each other"):
        check_annotations(module_with(ctx, "#mdsl.graph.frozen, #mdsl.graph.trainable"))


def test_check_annotation_set():
    check_annotation_set([make_annotation("hook", ["A"]), make_annotation("hook", ["B"]),
                          make_annotation("assert", ["!has_nan(c)"])])
    check_annotation_set([DtypeAttr.of(type="bf16"), PrecisionAttr.of(compute="fp8_e4m3", output="bf16")])
    check_annotation_set([DtypeAttr.of(type="bf16"), PrecisionAttr.of(policy="fp8_hybrid")])
    cases = [
        ([MemoryAttr.of(mode="save"), MemoryAttr.of(mode="pin")], "@memory is given twice on one target"),
        ([make_annotation("alias"), make_annotation("noalias")], "@alias and @noalias contradict"),
        ([make_annotation("fuse", ["gated_mlp"]), NofuseAttr.of()], "@fuse and @nofuse contradict"),
        ([DtypeAttr.of(type="fp32"), PrecisionAttr.of(policy="bf16")],
         "@dtype(fp32) contradicts the @precision output dtype bf16"),
    ]
    for annotations, message in cases:
        with pytest.raises(AnnotationError) as info:
            check_annotation_set(annotations)
        assert message in info.value.message


def test_precision_resolves_policies_by_the_spec_table():
    assert PrecisionAttr.of(policy="fp8_hybrid").resolved() == ("fp8_e4m3", "fp32", "bf16")
    assert PrecisionAttr.of(compute="fp8_e5m2", output="fp32").resolved() == ("fp8_e5m2", "fp32", "fp32")
    assert PrecisionAttr.of().resolved() == (None, "fp32", None)


# ----------------------------------------------------------------------------
# Memory policy precedence (7.2.0)
# ----------------------------------------------------------------------------


def memory(mode):
    return [make_annotation("memory", [mode])]


class TestMemoryPrecedence:
    """The ladder of spec 7.2.0, rung by rung, and its worked example."""

    def test_spec_example(self):
        # in -> op1() -> x @memory(save); x -> op2() -> y; y -> op3() -> z @memory(recompute);
        # z -> op4() -> w;  save: [y]; recompute: []
        save, recompute = ["y"], []
        x = effective_memory_policy("x", annotations=memory("save"), save=save, recompute=recompute)
        y = effective_memory_policy("y", save=save, recompute=recompute, needed_by_backward=True)
        z = effective_memory_policy("z", annotations=memory("recompute"), save=save, recompute=recompute)
        w = effective_memory_policy("w", save=save, recompute=recompute)
        assert (x.mode, x.source) == ("save", "annotation")
        assert (y.mode, y.source) == ("save", "save_list")
        assert (z.mode, z.source) == ("recompute", "annotation")
        assert (w.mode, w.source) == ("temporary", "default")

    def test_1_annotation_beats_everything(self):
        preserve = CheckpointAttr.of(preserve=["a"])
        policy = effective_memory_policy(
            "a", annotations=memory("temporary"), instance_checkpoint=preserve,
            block_checkpoint=CheckpointAttr.of(), save=["a"], recompute=["a"], needed_by_backward=True,
        )
        assert (policy.mode, policy.source) == ("temporary", "annotation")

    def test_2_instance_preserve_beats_block_checkpoint_and_lists(self):
        preserve = CheckpointAttr.of(preserve=["attn_out"])
        policy = effective_memory_policy("attn_out", instance_checkpoint=preserve, block_checkpoint=CheckpointAttr.of(),
                                         recompute=["attn_out"])
        assert (policy.mode, policy.source) == ("save", "checkpoint_preserve")

    def test_3_region_checkpoint_beats_the_lists(self):
        full = CheckpointAttr.of()
        policy = effective_memory_policy("h", block_checkpoint=full, save=["h"], needed_by_backward=True)
        assert (policy.mode, policy.source) == ("recompute", "checkpoint")
        assert effective_memory_policy("h", instance_checkpoint=full, save=["h"]).mode == "recompute"
        # a preserve list on a block-level checkpoint saves what it names
        block = CheckpointAttr.of(preserve=["h"])
        assert effective_memory_policy("h", block_checkpoint=block, recompute=["h"]) == effective_memory_policy(
            "h", block_checkpoint=block
        )
        assert effective_memory_policy("h", block_checkpoint=block).mode == "save"

    def test_3_granularities(self):
        selective = CheckpointAttr.of(granularity="selective", preserve=["attn_out"])
        assert effective_memory_policy("attn_out", block_checkpoint=selective).mode == "save"
        other = effective_memory_policy("h", block_checkpoint=selective, recompute=["h"])
        assert (other.mode, other.source) == ("recompute", "recompute_list")
        unmarked = effective_memory_policy("g", block_checkpoint=selective, needed_by_backward=True)
        assert (unmarked.mode, unmarked.source) == ("save", "default")
        none = CheckpointAttr.of(granularity="none")
        assert effective_memory_policy("h", block_checkpoint=none, save=["h"]).source == "save_list"

    def test_3_innermost_checkpoint_decides(self):
        none, full = CheckpointAttr.of(granularity="none"), CheckpointAttr.of()
        disabled = effective_memory_policy("h", instance_checkpoint=none, block_checkpoint=full,
                                           needed_by_backward=True)
        assert (disabled.mode, disabled.source) == ("save", "default")
        enabled = effective_memory_policy("h", instance_checkpoint=full, block_checkpoint=none)
        assert (enabled.mode, enabled.source) == ("recompute", "checkpoint")

    def test_4_save_list_beats_5_recompute_list(self):
        assert effective_memory_policy("h", save=["h"], recompute=["h"]).source == "save_list"
        policy = effective_memory_policy("h", recompute=["h"], needed_by_backward=True)
        assert (policy.mode, policy.source) == ("recompute", "recompute_list")

    def test_lists_take_wildcards(self):
        assert effective_memory_policy("ln1_out", save=["ln*_out"]).source == "save_list"
        assert effective_memory_policy("attn_rstd", recompute=["*_rstd"]).source == "recompute_list"
        assert effective_memory_policy("x", save=["*"]).mode == "save"
        assert effective_memory_policy("ln1_in", save=["ln*_out"]).source == "default"
        assert effective_memory_policy("q_1", instance_checkpoint=CheckpointAttr.of(preserve=["q_*"])).mode == "save"

    def test_6_defaults(self):
        assert effective_memory_policy("h", needed_by_backward=True) == effective_memory_policy(
            "h", save=[], needed_by_backward=True)
        assert effective_memory_policy("h", needed_by_backward=True).mode == "save"
        assert effective_memory_policy("h").mode == "temporary"

    def test_parameters_pin_unless_annotated(self):
        policy = effective_memory_policy("w", is_parameter=True, block_checkpoint=CheckpointAttr.of(), recompute=["w"])
        assert (policy.mode, policy.source) == ("pin", "default")
        for mode in ("offload", "stream"):
            assert effective_memory_policy("w", annotations=memory(mode), is_parameter=True).mode == mode
        with pytest.raises(AnnotationError, match="parameter 'w' cannot be @memory\\(recompute\\)"):
            effective_memory_policy("w", annotations=memory("recompute"), is_parameter=True)
