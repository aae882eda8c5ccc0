"""The annotation walk: every annotation the spec names either changes the compiled program or
warns where it is written (W013).

Each annotation of the table in ``modeldsl.dialects.annotations`` (the list below is checked
complete against it) is attached to a small causal language model where it would act; the
training step (``mdsl-train-step``) and the optimizer step (``mdsl-optimizer-update``) are
compiled and compared, as printed IR, with those of the unannotated model. An annotation passes
when they differ, or when lowering warned W013 at that very annotation.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from modeldsl.diagnostics import DiagnosticError, DiagnosticSink
from modeldsl.dialects.annotations import ANNOTATION_BY_NAME
from modeldsl.dialects.graph import ModelOp
from modeldsl.frontend.text.parser import parse_source
from modeldsl.ir import print_ir
from modeldsl.lower import lower_program
from modeldsl.passes.fuse import FusePass
from modeldsl.runtime.optim import AdamWConfig
from modeldsl.runtime.train import compile_optimizer_step, compile_training_step

MODEL = """\
{declarations}model TinyLM(vocab: int = 32, d: int = 16, d_ff: int = 32):
{model}  params:
    embed: [vocab, d]
    norm_w: [d]
    w1: [d_ff, d] {w1}
    w2: [d, d_ff]
    norm_f: [d]
    head: [vocab, d]
  forward:
    in: tokens: [B, T, int64]
    out: [B, T, vocab]
    graph:
      (tokens, embed) -> embedding() -> x
      (x, norm_w) -> rmsnorm() -> (n, _)
      n -> matmul(w1, transpose=NT) -> h {h}
      h -> silu() -> a {a}
      a -> matmul(w2, transpose=NT) -> y {y}
      (x, y) -> add() -> r {r}
      (r, norm_f) -> rmsnorm() -> (f, _) {f}
      f -> matmul(head, transpose=NT) -> logits {logits}
      logits -> out
"""
PLACES = ("model", "w1", "h", "a", "y", "r", "f", "logits")
MERGED = {  # the flow that ends at a place, written as one with the flow before it
    "y": ("      h -> silu() -> a\n      a -> matmul(w2, transpose=NT) -> y",
          "      h -> silu() -> matmul(w2, transpose=NT) -> y"),
    "f": ("      (x, y) -> add() -> r\n      (r, norm_f) -> rmsnorm() -> (f, _)",
          "      (x, y) -> add() -> rmsnorm(norm_f) -> (f, _)"),
}
NO_AUTO_FUSION = FusePass(auto=False)  # where @fuse asks for a pattern the default run applies anyway


@dataclass(frozen=True)
class Case:
    """An annotation (its text) at one of :data:`PLACES`, with what it needs around it."""

    name: str
    text: str
    place: str
    declarations: str = ""
    fuse: object = True
    owner: str = ""  # another part of the compiler makes it take effect
    merge: bool = False  # the flows around its place as one (a checkpoint region, a fusion)


OTHER = "being implemented"
CASES = [
    Case("memory", "@memory(recompute)", "h"),
    Case("checkpoint", "@checkpoint", "y", merge=True),  # the silu in it is recomputed
    Case("lifetime", "@lifetime(global)", "h"),
    Case("hook", "@hook(BeforeResidualAdd)", "r"),  # keeps the residual add out of residual_norm
    Case("adapter", "@adapter(lora, rank=4)", "h"),
    Case("probe", '@probe("residual")', "r"),
    Case("dtype", "@dtype(fp32)", "h"),
    Case("precision", "@precision(policy=fp32)", "h"),
    Case("scaling", "@scaling(per_tensor)", "h"),
    Case("recipe", "@recipe(Hybrid)", "model", declarations="recipe Hybrid:\n  output_dtype: bf16\n\n"),
    Case("fuse", "@fuse(residual_norm)", "f", fuse=NO_AUTO_FUSION, merge=True),
    Case("fuse_required", "@fuse_required(residual_norm)", "f", fuse=NO_AUTO_FUSION, merge=True),
    Case("nofuse", "@nofuse", "r"),
    Case("kernel", '@kernel("cublaslt")', "h"),
    Case("shard", "@shard(column, tp_size=2)", "w1"),
    Case("partition", "@partition(0)", "h"),
    Case("comm", "@comm(all_reduce)", "y"),
    Case("assert", '@assert("!has_nan(h)")', "h"),
    Case("assert", '@assert(!has_nan(h) && all(h < 1e4), "h blew up")', "h"),
    Case("profile", '@profile("mlp")', "y"),
    Case("trace", "@trace(tensors)", "y"),
    Case("frozen", "@frozen", "w1"),
    Case("trainable", "@trainable(lr_scale=0.5)", "w1"),
    Case("trainable", "@trainable(grad_clip=1.0)", "w1"),
    Case("gradient", "@gradient(scale=0.5)", "h"),
    Case("gradient", "@gradient(clip=1.0)", "h"),
    Case("gradient", "@gradient(skip)", "a"),
    Case("gradient", "@gradient(accumulate, clip=1.0)", "w1"),
    Case("gradient", "@gradient(accumulate)", "h"),  # what every gradient does: W013
    Case("gradient", "@gradient(checkpoint)", "w1"),
    Case("noalias", "@noalias", "a"),
    Case("barrier", "@barrier", "r"),
]
# @alias states a fact the compiler checks instead: see test_alias_is_a_checked_statement.
CHECKED = {"alias"}


def source(case: Case | None) -> str:
    slots = {p: "" for p in PLACES}
    declarations = ""
    if case is not None:
        slots[case.place] = f"  {case.text}\n" if case.place == "model" else case.text
        declarations = case.declarations
    text = MODEL.format(declarations=declarations, **slots).replace(" \n", "\n")
    if case is not None and case.merge:
        written, merged = MERGED[case.place]
        assert written in text
        text = text.replace(written, merged)
    return text


def compiled(case: Case | None, fuse: object = True) -> tuple[str, str, DiagnosticSink]:
    """(training step, optimizer step) as printed IR, and the lowering's diagnostics."""
    sink = DiagnosticSink()
    module = lower_program(parse_source(source(case), "walk.module"), None, None, sink)
    model = next(op for op in module.walk() if isinstance(op, ModelOp))
    step = compile_training_step(model, 2, 4, fuse=fuse)
    update = compile_optimizer_step(model, AdamWConfig())
    return print_ir(step), print_ir(update), sink


_BASELINES: dict[int, tuple[str, str]] = {}


def baseline(fuse: object) -> tuple[str, str]:
    if id(fuse) not in _BASELINES:
        step, update, sink = compiled(None, fuse)
        assert sink.diagnostics == []
        _BASELINES[id(fuse)] = (step, update)
    return _BASELINES[id(fuse)]


def test_the_walk_covers_every_annotation_of_the_table():
    assert {c.name for c in CASES} | CHECKED == set(ANNOTATION_BY_NAME)


def _param(case: Case):
    marks = [pytest.mark.xfail(reason=case.owner, strict=False)] if case.owner else []
    return pytest.param(case, id=f"{case.name}:{case.text}", marks=marks)


@pytest.mark.parametrize("case", [_param(c) for c in CASES])
def test_each_annotation_changes_the_program_or_warns_where_it_is_written(case: Case):
    step, update, sink = compiled(case, case.fuse)
    warned = [d for d in sink.diagnostics if d.code == "W013" and d.span is not None and d.span.text == case.text]
    if warned:
        assert warned[0].message.startswith("`@") and " has no effect in this version: " in warned[0].message
        return
    assert not [d for d in sink.diagnostics if d.code == "W013"], [d.render() for d in sink.diagnostics]
    assert (step, update) != baseline(case.fuse), f"{case.text} neither changes the program nor warns"


def test_alias_is_a_checked_statement():
    """``x -> y @alias`` is what the flow does (the program is the unannotated one); on a flow that
    computes a new tensor it is E008, so no @alias goes unheeded."""
    stated = MODEL.replace("      logits -> out\n", "      logits -> out @alias\n")
    sink = DiagnosticSink()
    lower_program(parse_source(source(None).replace("      logits -> out\n", "      logits -> out @alias\n"),
                               "walk.module"), None, None, sink)
    assert sink.diagnostics == [] and "@alias" in stated
    with pytest.raises(DiagnosticError) as info:
        lower_program(parse_source(source(Case("alias", "@alias", "a")), "walk.module"), None, None,
                      DiagnosticSink())
    assert [d.code for d in info.value.diagnostics] == ["E008"]
