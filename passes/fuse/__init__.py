"""``mdsl-fuse``: fusion as rewrite patterns on ``mdsl.graph``.

Each pattern is a :class:`~modeldsl.passes.fuse.common.FusionPattern` of its own, one family per
module of this package (``passes/fuse/<family>.py``), named as spec 7.5.1's pattern table names it
where it is there; ``PATTERNS`` lists them, in the order and with the names of
:data:`modeldsl.dialects.fusion_patterns.PASS_PATTERNS` (docs/internals.md, "Fusion", says what each rewrites):

* ``residual_norm`` (norm): add + rmsnorm and its backward pair -> fused_residual_rmsnorm(_backward);
* ``scalar_alpha``, ``transpose_flag`` (gemm): a scale, a transpose into the GEMM's alpha, flags;
* ``fold`` (fold): identities, transpose pairs, view chains and scale chains folded;
* ``linear_bias_act``, ``bias_activation`` (epilogue): bias and ReLU/GELU as GEMM epilogues;
* ``lm_head_loss`` (loss): the LM head and cross-entropy, forward and backward, chunked (one pass when
  the loss gradient is known before the forward);
* ``gated_mlp`` (mlp): the packed gate/up split + swiglu/geglu and its backward concat;
* ``attention_layout`` (layout): head transposes around rope/attention -> layout bthd;
* ``attention_softmax``, ``dag_attention`` (attention): the scores' scale, written-out attention;
* ``dag_gelu``, ``dag_silu``, ``dag_softmax``, ``dag_rmsnorm`` (dag): written-out functions;
* ``qk_norm_rope`` (rope): qk_norm + rope and their backward pair -> fused_qk_norm_rope(_backward).

Options: ``disable=a,b`` turns patterns off, ``only=a,b`` runs just those, ``auto=false`` fuses only
what ``@fuse``/``@fuse_required`` request, ``lm_head_chunk=N`` sets the fused loss's rows per chunk.
Patterns apply in every function of the module (block bodies included), after ``mdsl-autodiff`` and
``mdsl-recompute`` in a training step (the named pipelines, :mod:`modeldsl.passes.pipelines`, say where
each pattern runs: some run before autodiff or recompute too); barriers are in
:mod:`modeldsl.passes.fuse.common`. CSE runs
after the patterns; a gradient function's ``forward_ops`` count is kept true as ops merge, and a
``@fuse_required`` flow that no requested pattern merged is E013.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import IntegerAttr, ModuleOp, i64
from xdsl.ir import Operation
from xdsl.passes import ModulePass
from xdsl.pattern_rewriter import GreedyRewritePatternApplier, PatternRewriteWalker
from xdsl.rewriter import InsertPoint, Rewriter
from xdsl.transforms.common_subexpression_elimination import CommonSubexpressionElimination

from modeldsl.diagnostics import Diagnostic, DiagnosticError, PassOptionError
from modeldsl.dialects.annotations import FuseRequiredAttr, find_annotation
from modeldsl.dialects.graph import BackwardStartOp, FuncOp
from modeldsl.ir import span_of_annotation
from modeldsl.passes.fuse.attention import AttentionSoftmax, DagAttention
from modeldsl.passes.fuse.common import FusionPattern, FusionSwitch, is_ordering_point, requests_pattern
from modeldsl.passes.fuse.dag import DagGelu, DagRmsnorm, DagSilu, DagSoftmax
from modeldsl.passes.fuse.epilogue import BiasActivation, LinearBiasAct
from modeldsl.passes.fuse.fold import FoldIdentity, FoldScales, FoldTransposes, FoldViews
from modeldsl.passes.fuse.gemm import AlphaFromScale, ScaleIntoAlpha, TransposeIntoFlags
from modeldsl.passes.fuse.layout import AttentionLayout
from modeldsl.passes.fuse.loss import LmHeadLoss, LmHeadLossBackward, LmHeadLossGrad
from modeldsl.passes.fuse.mlp import SplitGated, SplitGatedBackward
from modeldsl.passes.fuse.norm import ResidualNorm, ResidualNormBackward
from modeldsl.passes.fuse.rope import QkNormRope, QkNormRopeBackward

PATTERNS: dict[str, tuple[type[FusionPattern], ...]] = {  # in the order of fusion_patterns.PASS_PATTERNS
    "residual_norm": (ResidualNorm, ResidualNormBackward),
    "scalar_alpha": (ScaleIntoAlpha, AlphaFromScale),
    "transpose_flag": (TransposeIntoFlags,),
    "fold": (FoldIdentity, FoldTransposes, FoldViews, FoldScales),
    "linear_bias_act": (LinearBiasAct,),
    "bias_activation": (BiasActivation,),
    "lm_head_loss": (LmHeadLossBackward, LmHeadLoss, LmHeadLossGrad),
    "gated_mlp": (SplitGated, SplitGatedBackward),
    "attention_layout": (AttentionLayout,),
    "dag_gelu": (DagGelu,),
    "dag_silu": (DagSilu,),
    "dag_softmax": (DagSoftmax,),
    "dag_rmsnorm": (DagRmsnorm,),
    "attention_softmax": (AttentionSoftmax,),
    "dag_attention": (DagAttention,),
    "qk_norm_rope": (QkNormRope, QkNormRopeBackward),
}


@dataclass(frozen=True)
class FusePass(ModulePass):
    name = "mdsl-fuse"

    disable: tuple[str, ...] = ()
    auto: bool = True
    lm_head_chunk: int = 0
    only: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        self.disabled()  # refuse an unknown pattern or a bad chunk where the pass is made
        self.running()
        if self.lm_head_chunk < 0:
            raise PassOptionError(f"mdsl-fuse: lm_head_chunk={self.lm_head_chunk} is negative", "lm_head_chunk",
                                  "give the rows of logits per chunk, or 0 to let the pass choose")

    def disabled(self) -> set[str]:
        return _pattern_names(self.disable, "disable")

    def running(self) -> set[str]:
        """The patterns this run applies: those ``only`` names, else all of them."""
        return _pattern_names(self.only, "only") or set(PATTERNS)

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        running = self.running()
        on = frozenset(running - self.disabled()) if self.auto else frozenset()
        switch = FusionSwitch(on, lm_head_chunk=self.lm_head_chunk,
                              barrier_blocks={id(o.parent) for o in op.walk() if is_ordering_point(o)})
        required = _required_fusions(op, running)
        boundaries = mark_backward_starts(op)
        patterns = [cls(switch) for name, classes in PATTERNS.items() if name in running for cls in classes]
        PatternRewriteWalker(GreedyRewritePatternApplier(patterns)).rewrite_module(op)
        CommonSubexpressionElimination().apply(ctx, op)
        count_forward_ops(boundaries)
        _check_required(required, switch)


def _pattern_names(given: str | tuple[str, ...], option: str) -> set[str]:
    """The pattern names of a ``disable=``/``only=`` option (PassOptionError for an unknown one)."""
    items = [given] if isinstance(given, str) else list(given)
    names = {n.strip() for item in items for n in item.split(",") if n.strip()}
    for name in sorted(names - set(PATTERNS)):
        close = difflib.get_close_matches(name, PATTERNS, n=1)
        raise PassOptionError(f"mdsl-fuse: no fusion pattern '{name}'", option,
                              (f"did you mean '{close[0]}'? " if close else "")
                              + f"the patterns: {', '.join(PATTERNS)}")
    return names


def _required_fusions(module: ModuleOp, running: set[str]) -> list[tuple[Operation, list[str]]]:
    """Each op with ``@fuse_required`` asking for a pattern of this run, and the patterns it asks
    for (one asking only for others is checked by the run that applies them)."""
    found = []
    for op in module.walk():
        annotation = find_annotation(op, FuseRequiredAttr)
        if annotation is None:
            continue
        names = [name for name in PATTERNS if requests_pattern(annotation, name)]
        if not names or set(names) & running:
            found.append((op, [n for n in names if n in running]))
    return found


def _check_required(required: list[tuple[Operation, list[str]]], switch: FusionSwitch) -> None:
    """E013 for each ``@fuse_required`` flow that no requested pattern merged."""
    errors = []
    for op, names in required:
        if any(op in switch.merged.get(name, ()) for name in names):
            continue
        asked = ", ".join(names) or "no pattern mdsl-fuse implements"
        errors.append(Diagnostic(
            "E013", f"@fuse_required: the flow was not fused ({asked})",
            span_of_annotation(op.location, "@fuse_required"),
            "a fusion fails on a barrier (@nofuse, @hook, @probe), an intermediate another op also reads, "
            f"or operands of other shapes or dtypes; the patterns: {', '.join(PATTERNS)}"))
    if errors:
        raise DiagnosticError(errors)


def count_forward_ops(boundaries: dict[FuncOp, BackwardStartOp]) -> None:
    """Each gradient function's ``forward_ops``: the ops before its marker, which goes."""
    for func, marker in boundaries.items():
        func.attributes["forward_ops"] = IntegerAttr(list(func.body.block.ops).index(marker), i64)
        Rewriter.erase_op(marker)


def mark_backward_starts(module: ModuleOp) -> dict[FuncOp, BackwardStartOp]:
    """A ``backward_start`` marker before the first backward op of each gradient function, so its
    ``forward_ops`` count stays true as patterns merge, replace and erase ops on either side."""
    found = {}
    for func in module.walk():
        if isinstance(func, FuncOp) and "forward_ops" in func.attributes:
            first_backward = list(func.body.block.ops)[func.attributes["forward_ops"].value.data]
            marker = BackwardStartOp()
            Rewriter.insert_op(marker, InsertPoint.before(first_backward))
            found[func] = marker
    return found
