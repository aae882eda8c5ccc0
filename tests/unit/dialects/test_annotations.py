"""Annotations: schemas, canonical printing, the frontend constructor, memory precedence."""

import pytest
from xdsl.parser import Parser
from xdsl.utils.exceptions import VerifyException

from modeldsl.dialects.annotations import (
    ANNOTATION_BY_NAME,
    ANNOTATIONS,
    AnnotationError,
    CheckpointAttr,
    FrozenAttr,
    MemoryAttr,
    ShardAttr,
    TrainableAttr,
    annotations_of,
    effective_memory_policy,
    make_annotation,
)
from modeldsl.ir import make_context


def reparse(attr):
    return Parser(make_context(), str(attr)).parse_attribute()


def test_every_annotation_of_the_spec_is_defined():
    spec_names = {
        "memory", "checkpoint", "lifetime", "hook", "adapter", "probe", "dtype", "precision", "scaling",
        "fuse", "nofuse", "kernel", "shard", "partition", "comm", "assert", "profile", "trace",
        "frozen", "trainable", "gradient",
    }
    assert spec_names <= set(ANNOTATION_BY_NAME)
    assert all(a.name == f"mdsl.graph.{a.DSL_NAME}" for a in ANNOTATIONS)


@pytest.mark.parametrize(
    "name, args, kwargs, printed",
    [
        ("memory", ["recompute"], {}, "#mdsl.graph.memory<recompute>"),
        ("memory", [], {"mode": "offload", "priority": 3, "prefetch": True}, "#mdsl.graph.memory<offload, priority = 3>"),
        ("checkpoint", [], {}, "#mdsl.graph.checkpoint"),
        ("checkpoint", [], {"preserve": ["attn_out"]}, '#mdsl.graph.checkpoint<preserve = ["attn_out"]>'),
        ("hook", ["AfterQKVProjection"], {"mode": "modify"}, "#mdsl.graph.hook<AfterQKVProjection, mode = modify>"),
        ("adapter", ["lora"], {"rank": 8, "targets": ["q", "v"]}, '#mdsl.graph.adapter<lora, rank = 8, targets = ["q", "v"]>'),
        ("probe", ["attn"], {"capture": "stats"}, '#mdsl.graph.probe<"attn">'),
        ("dtype", ["bf16"], {}, "#mdsl.graph.dtype<bf16>"),
        ("precision", [], {"policy": "fp8_hybrid"}, "#mdsl.graph.precision<policy = fp8_hybrid>"),
        ("scaling", ["delayed"], {"history_len": 32}, "#mdsl.graph.scaling<delayed, history_len = 32>"),
        ("fuse", ["residual_norm"], {}, "#mdsl.graph.fuse<residual_norm>"),
        ("nofuse", [], {}, "#mdsl.graph.nofuse"),
        ("kernel", ["flash3"], {"fallback": False}, '#mdsl.graph.kernel<"flash3", fallback = false>'),
        ("shard", ["column"], {"tp_size": 4}, "#mdsl.graph.shard<column, tp_size = 4>"),
        ("partition", [0], {}, "#mdsl.graph.partition<0>"),
        ("comm", ["all_gather"], {"group": "tp"}, '#mdsl.graph.comm<all_gather, group = "tp">'),
        ("assert", ["x > 0"], {}, '#mdsl.graph.assert<"x > 0">'),
        ("profile", ["attn"], {"nvtx": False}, '#mdsl.graph.profile<"attn", nvtx = false>'),
        ("trace", [], {"level": "values"}, "#mdsl.graph.trace<values>"),
        ("frozen", [], {}, "#mdsl.graph.frozen"),
        ("trainable", [], {"lr_scale": 0.1, "wd_scale": 0}, "#mdsl.graph.trainable<lr_scale = 0.1, wd_scale = 0.0>"),
        ("gradient", ["skip"], {}, "#mdsl.graph.gradient<skip>"),
        ("lifetime", ["block"], {}, "#mdsl.graph.lifetime<block>"),
    ],
)
def test_make_annotation_prints_canonically_and_round_trips(name, args, kwargs, printed):
    attr = make_annotation(name, args, kwargs)
    attr.verify()
    assert str(attr) == printed
    assert reparse(attr) == attr


def test_values_include_defaults():
    attr = make_annotation("memory", ["offload"], {})
    assert attr.values == {"mode": "offload", "priority": 0, "prefetch": True, "async": True}
    assert attr["mode"] == "offload"
    assert MemoryAttr.of(mode="save") == make_annotation("memory", ["save"])


@pytest.mark.parametrize(
    "name, args, kwargs, message",
    [
        ("remember", [], {}, "unknown annotation @remember"),
        ("memory", [], {}, "@memory needs 'mode'"),
        ("memory", ["sometimes"], {}, "'sometimes' is not one of"),
        ("memory", ["save", "pin"], {}, "takes at most 1 positional argument"),
        ("shard", ["column"], {"tp": 4}, "@shard has no parameter 'tp'"),
        ("shard", ["column"], {"tp_size": "4"}, "expects an integer"),
        ("shard", ["column"], {"tp_size": 0}, "must be >= 1"),
        ("trainable", [], {"lr_scale": True}, "expects a number"),
        ("frozen", [True], {}, "takes at most 0 positional"),
        ("dtype", ["float"], {}, "is not a dtype"),
        ("checkpoint", [], {"preserve": "x"}, "expects a list of strings"),
        ("fuse", [], {}, "@fuse needs a pattern name or an 'ops' list"),
        ("scaling", ["per_block"], {"block_size": [32]}, "block_size must be two positive integers"),
    ],
)
def test_bad_annotations_raise_annotation_error_with_a_hint(name, args, kwargs, message):
    with pytest.raises(AnnotationError, match=message.replace("(", r"\(").replace(")", r"\)")) as info:
        make_annotation(name, args, kwargs)
    assert info.value.message


def test_unknown_annotation_hint_lists_known_ones():
    with pytest.raises(AnnotationError) as info:
        make_annotation("frozn")
    assert "frozen" in info.value.hint


def test_verify_rejects_stored_defaults_and_unknown_keys():
    from xdsl.dialects.builtin import DictionaryAttr, IntegerAttr, StringAttr, i64

    with pytest.raises(VerifyException, match="equals its default"):
        MemoryAttr(DictionaryAttr({"mode": StringAttr("save"), "priority": IntegerAttr(0, i64)})).verify()
    with pytest.raises(VerifyException, match="no parameter 'size'"):
        ShardAttr(DictionaryAttr({"strategy": StringAttr("row"), "size": IntegerAttr(2, i64)})).verify()


def test_annotations_of_an_op():
    module = Parser(
        make_context(),
        """mdsl.graph.model @m {
          mdsl.graph.param @w : !mdsl.graph.tensor<[4], bf16> {annotations = [#mdsl.graph.frozen, #mdsl.graph.trainable<lr_scale = 0.5>]}
        }""",
    ).parse_module()
    param = next(op for op in module.walk() if op.name == "mdsl.graph.param")
    found = annotations_of(param)
    assert isinstance(found[0], FrozenAttr) and isinstance(found[1], TrainableAttr)
    assert found[1]["lr_scale"] == 0.5


class TestMemoryPrecedence:
    """The ladder of spec 7.2.0, including its worked example."""

    def test_spec_example(self):
        save, recompute = ["y"], []
        x = effective_memory_policy("x", annotations=[make_annotation("memory", ["save"])], save=save, recompute=recompute)
        y = effective_memory_policy("y", save=save, recompute=recompute, needed_by_backward=True)
        z = effective_memory_policy("z", annotations=[make_annotation("memory", ["recompute"])], save=save)
        w = effective_memory_policy("w", save=save, recompute=recompute)
        assert (x.mode, x.source) == ("save", "annotation")
        assert (y.mode, y.source) == ("save", "save_list")
        assert (z.mode, z.source) == ("recompute", "annotation")
        assert (w.mode, w.source) == ("temporary", "default")

    def test_annotation_beats_checkpoint_and_lists(self):
        policy = effective_memory_policy(
            "a", annotations=[make_annotation("memory", ["pin"])], block_checkpoint=CheckpointAttr.of(), save=["a"]
        )
        assert policy.mode == "pin"

    def test_checkpoint_preserve_beats_block_checkpoint(self):
        preserve = CheckpointAttr.of(preserve=["attn_out"])
        assert effective_memory_policy("attn_out", instance_checkpoint=preserve, block_checkpoint=CheckpointAttr.of()).source == "checkpoint_preserve"
        assert effective_memory_policy("other", instance_checkpoint=preserve, needed_by_backward=True).mode == "recompute"

    def test_block_checkpoint_beats_save_list_unless_none_or_selective(self):
        assert effective_memory_policy("h", block_checkpoint=CheckpointAttr.of(), save=["h"]).mode == "recompute"
        none = CheckpointAttr.of(granularity="none")
        assert effective_memory_policy("h", block_checkpoint=none, save=["h"]).source == "save_list"
        selective = CheckpointAttr.of(granularity="selective")
        assert effective_memory_policy("h", block_checkpoint=selective, recompute=["h"]).source == "recompute_list"

    def test_save_list_beats_recompute_list(self):
        assert effective_memory_policy("h", save=["h"], recompute=["h"]).mode == "save"

    def test_defaults(self):
        assert effective_memory_policy("w", is_parameter=True).mode == "pin"
        assert effective_memory_policy("w", is_parameter=True, block_checkpoint=CheckpointAttr.of()).mode == "pin"
        assert effective_memory_policy("h", needed_by_backward=True).mode == "save"
        assert effective_memory_policy("h").mode == "temporary"
