"""``mdsl-pack-sequences``: a model's forward on packed rows, each example attending only to itself.

Instruction data packs several examples into one row of T tokens (their example
ids ``segments`` and their positions, restarting at 0 with every example). On
the ``@forward`` of each model (in the training pipeline after
``mdsl-attach-loss``, before ``mdsl-autodiff``; ``mdsl-train-step{packed=true}``)
the pass

* adds the function input ``segments: [B, T, int32]`` (after the forward's
  other inputs; B and T are those of its token ids, its integer ``[B, T]``
  input), the example id of every token of a row;
* makes every RoPE table input ``freqs: [T, D/2, 2]`` (an fp32 input of that
  shape that the forward's rope ops read) a table per row, ``[B, T, D/2, 2]``:
  each token's (cos, sin) at its own position (the runtime's
  :func:`modeldsl.runtime.rope.tables_at`), which ``rope``,
  ``fused_qk_norm_rope`` and their backwards read row by row;
* gives every causal ``flash_attention`` the segment ids (``segments``
  operand): a query sees the keys of its own example only, a block-diagonal
  causal mask (with a sliding window too, where the attention has one);
* threads both through the functions between: a block body gets ``segments``
  after its shared inputs (the stacks pass it as one more shared value), a
  called function as its last input, and a function calling the forward
  (``@train_loss``) right after the inputs it passes on (``@train_loss(tokens,
  freqs, segments, labels)``), its table inputs per row too.

A forward the pass cannot pack is E029 naming the op: a non-causal
``flash_attention`` (it would see the other examples' later tokens), a written-out
attention (``causal_mask``: ``mdsl-fuse``'s ``dag_attention`` makes it a
``flash_attention`` first) or a recurrent op (Mamba's conv and scan carry their
state across examples); a RoPE table read by anything else than the RoPE ops and
the calls between; a function with a written backward that would need the
segments; a forward without token ids. A forward that has a ``segments`` input
is left as it is (packed already).

Its rewrites, after :class:`Packing` (the analysis and the new function
signatures): ``segment_attention`` (:class:`SegmentAttention`, the attention
ops of a packed function take its ``segments``) and ``pass_segments``
(:class:`SegmentCalls`, :class:`SegmentStacks`: calls and stacks of a function
that takes ``segments`` pass it on).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from xdsl.context import Context
from xdsl.dialects.builtin import ArrayAttr, DictionaryAttr, ModuleOp
from xdsl.ir import BlockArgument, Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.pattern_rewriter import (
    GreedyRewritePatternApplier,
    PatternRewriter,
    PatternRewriteWalker,
    RewritePattern,
    op_type_rewrite_pattern,
)
from xdsl.rewriter import Rewriter

from modeldsl.diagnostics import Diagnostic, DiagnosticError
from modeldsl.dialects.dtypes import DType
from modeldsl.dialects.graph import CallOp, FuncOp, ModelOp, StackOp
from modeldsl.dialects.graph_primitives import (
    CausalMaskOp,
    FlashAttentionBackwardOp,
    FlashAttentionOp,
    FusedQkNormRopeBackwardOp,
    FusedQkNormRopeOp,
    MambaConv1dOp,
    MambaSelectiveScanOp,
    RopeBackwardOp,
    RopeOp,
)
from modeldsl.dialects.graph_types import TensorType
from modeldsl.ir import replace_with_twin, span_of_location
from modeldsl.symbolic import Dim

SEGMENTS = "segments"
ROPE_OPS = (RopeOp, RopeBackwardOp, FusedQkNormRopeOp, FusedQkNormRopeBackwardOp)  # each reads its ``freqs``
ATTENTION_OPS = (FlashAttentionOp, FlashAttentionBackwardOp)
# ops that mix tokens of a row in ways segment ids cannot separate
UNPACKABLE = {CausalMaskOp: "a written-out attention (its causal_mask): mdsl-fuse's dag_attention makes it a "
                            "flash_attention, which the pass packs",
              MambaConv1dOp: "a recurrent op: its state runs across the examples of a row",
              MambaSelectiveScanOp: "a recurrent op: its state runs across the examples of a row"}


def _error(message: str, op: Operation | None = None, hint: str | None = None) -> DiagnosticError:
    span = span_of_location(op.location) if op is not None else None
    return DiagnosticError([Diagnostic("E029", f"mdsl-pack-sequences: {message}", span, hint)])


# ----------------------------------------------------------------------------- the call graph


@dataclass(frozen=True)
class Site:
    """A call of a function: a ``call`` or a ``stack`` in ``caller``; ``operands[i]`` is the callee's
    input ``inputs[i]`` (a stack's per-layer operands stand for slices: not forwarded)."""

    caller: FuncOp
    op: CallOp | StackOp
    callee: str

    def pairs(self) -> Iterator[tuple[SSAValue, int]]:
        """(operand, the callee's input index) of the values the callee receives as they are."""
        if isinstance(self.op, CallOp):
            yield from ((v, i) for i, v in enumerate(self.op.arguments))
            return
        yield from ((v, i) for i, v in enumerate([*self.op.carried, *self.op.shared]))

    def segments_index(self, callee: FuncOp) -> int:
        """Where the callee takes ``segments``: after a stack body's shared inputs, else last."""
        if isinstance(self.op, StackOp):
            return len(self.op.carried) + len(self.op.shared)
        return len(callee.body.block.args)


def _sites(model: ModelOp) -> list[Site]:
    sites = []
    for func in model.funcs():
        for op in func.body.block.ops:
            if isinstance(op, CallOp):
                sites.append(Site(func, op, op.callee.root_reference.data))
            elif isinstance(op, StackOp):
                sites.append(Site(func, op, op.body.root_reference.data))
    return sites


# ----------------------------------------------------------------------------- the analysis


@dataclass
class Packing:
    """What the pass does to one model: the functions that take ``segments`` (with where), the RoPE
    table inputs that become per row, and, once :meth:`rewrite_signatures` ran, each function's
    ``segments`` argument (the patterns read it)."""

    model: ModelOp
    forward: FuncOp
    batch: Dim  # the token ids' B and T
    tokens: Dim
    funcs: dict[str, FuncOp] = field(default_factory=dict)
    sites: list[Site] = field(default_factory=list)
    tables: set[tuple[str, int]] = field(default_factory=set)  # (function, input index)
    needs: dict[str, int] = field(default_factory=dict)  # function -> where it takes segments
    segments: dict[str, BlockArgument] = field(default_factory=dict)

    @classmethod
    def of(cls, model: ModelOp) -> Packing | None:
        """The packing of ``model``'s forward (None: it has no forward, or one packed already)."""
        forward = model.lookup("forward")
        if not isinstance(forward, FuncOp) or any(a.name_hint == SEGMENTS for a in forward.body.block.args):
            return None
        ids = next((a.type for a in forward.body.block.args if isinstance(a.type, TensorType)
                    and not a.type.dtype.is_float and not a.type.is_variadic and a.type.rank == 2), None)
        if ids is None:
            raise _error(f"@{model.sym_name.data}'s forward takes no token ids [B, T]: nothing says the rows "
                         "that segments would split", None, "pack a causal language model's forward")
        packing = cls(model, forward, ids.shape[0], ids.shape[1], {f.sym_name.data: f for f in model.funcs()},
                      _sites(model))
        packing.find_tables()
        packing.find_needs()
        return packing

    def reachable(self) -> list[str]:
        """The forward and every function it calls, transitively (in the order found)."""
        order, todo = [], ["forward"]
        while todo:
            name = todo.pop()
            if name in order or name not in self.funcs:
                continue
            order.append(name)
            todo += [s.callee for s in self.sites if s.caller is self.funcs[name]]
        return order

    def callers(self, name: str) -> list[Site]:
        return [s for s in self.sites if s.callee == name]

    # -- RoPE tables: the forward's [T, D/2, 2] fp32 inputs, followed into and out of the calls
    def is_table_type(self, t) -> bool:
        return (isinstance(t, TensorType) and t.dtype is DType.FP32 and not t.is_variadic and t.rank == 3
                and t.shape[2].const_value() == 2 and t.shape[0] == self.tokens)

    def find_tables(self) -> None:
        todo = [("forward", i) for i, a in enumerate(self.forward.body.block.args) if self.is_table_type(a.type)]
        while todo:
            entry = todo.pop()
            if entry in self.tables:
                continue
            self.tables.add(entry)
            name, index = entry
            func = self.funcs[name]
            arg = func.body.block.args[index]
            for site in self.callers(name):  # upward: the caller passes its own input on
                operand = next(v for v, i in site.pairs() if i == index) if index < _received(site) else None
                if not isinstance(operand, BlockArgument):
                    raise _error(f"@{site.caller.sym_name.data} passes @{name} a RoPE table it computes "
                                 f"({arg.name_hint or index}); packing makes the tables inputs of each row",
                                 site.op)
                todo.append((site.caller.sym_name.data, operand.index))
            for use in arg.uses:  # downward: the RoPE ops and the calls that pass it on
                user = use.operation
                if isinstance(user, ROPE_OPS) and user.freqs is arg:
                    continue
                site = next((s for s in self.sites if s.op is user), None)
                forwarded = [i for v, i in site.pairs() if v is arg] if site is not None else []
                if not forwarded:
                    raise _error(f"the RoPE table %{arg.name_hint or index} of @{name} is read by {user.name}; "
                                 "packed rows give each row its own table, which only the RoPE ops read", user,
                                 "read the RoPE tables with rope or fused_qk_norm_rope")
                todo += [(site.callee, i) for i in forwarded]

    # -- segments: the functions with attention, those calling them, and the forward's callers
    def find_needs(self) -> None:
        reachable = self.reachable()
        attends = {name: self.check_ops(self.funcs[name]) for name in reachable}
        changed = True
        while changed:  # a function takes segments where it attends or calls one that does
            changed = False
            for site in self.sites:
                name = site.caller.sym_name.data
                if name in attends and attends.get(site.callee) and not attends[name]:
                    attends[name] = changed = True
        attends["forward"] = True
        for name in reachable:
            if attends[name]:
                self.need(name)
        todo = ["forward"]
        while todo:  # upward: whatever calls the forward gives it the segments
            for site in self.callers(todo.pop()):
                name = site.caller.sym_name.data
                if name not in self.needs:
                    self.need(name)
                    todo.append(name)
        self.check_sites()

    def need(self, name: str) -> None:
        """``name`` takes segments: last (the forward), where its stacks or calls pass them (a function
        the forward reaches), or after the inputs it passes on (a function calling the forward)."""
        func = self.funcs[name]
        if "backward" in func.attributes or func.attributes.get("kind") in ("backward", "block_backward"):
            raise _error(f"@{name} has a written backward: the attention it holds cannot take the segment ids",
                         None, "write the module without a backward: section, or train on padded rows")
        if name == "forward":
            self.needs[name] = len(func.body.block.args)
        elif name in self.reachable():
            places = {s.segments_index(func) for s in self.callers(name)}
            if len(places) != 1:
                raise _error(f"@{name} is called as a stack body and as a function: the pass cannot place its "
                             "segments input", self.callers(name)[0].op)
            self.needs[name] = places.pop()
        else:
            calls = [s.op for s in self.sites if s.caller is func and s.callee in self.needs]
            passed = [v.index for op in calls for v in op.operands
                      if isinstance(v, BlockArgument) and v.block is func.body.block]
            self.needs[name] = max(passed) + 1 if passed else len(func.body.block.args)

    def check_sites(self) -> None:
        """Every call of a function that takes segments stands in one that has them to pass on."""
        for site in self.sites:
            if site.callee in self.needs and site.caller.sym_name.data not in self.needs:
                raise _error(f"@{site.caller.sym_name.data} calls @{site.callee}, which packing gives segment ids, "
                             "but is not reached from the forward nor calls it", site.op)

    def check_ops(self, func: FuncOp) -> bool:
        """Whether ``func`` attends (E029 for what packing cannot separate)."""
        attends = False
        for op in func.body.block.ops:
            for kind, why in UNPACKABLE.items():
                if isinstance(op, kind):
                    raise _error(f"{op.name} in @{func.sym_name.data} mixes the tokens of a row: {why}", op,
                                 "packed rows need attention that takes segment ids (flash_attention)")
            if isinstance(op, ATTENTION_OPS):
                if not op.causal.value.data:
                    raise _error(f"{op.name} in @{func.sym_name.data} is not causal: on packed rows its queries would "
                                 "see the later examples", op, "pack causal attention only (or train on padded rows)")
                if op.segments is not None:
                    raise _error(f"{op.name} in @{func.sym_name.data} has segment ids already", op)
                attends = True
        return attends

    # -- the new signatures
    def rewrite_signatures(self) -> None:
        """Each table input per row ``[B, T, D/2, 2]``, ``segments [B, T]`` int32 where it is needed."""
        ids = TensorType([self.batch, self.tokens], DType.INT32)
        for name, index in sorted(self.tables):
            arg = self.funcs[name].body.block.args[index]
            hint = arg.name_hint
            new = Rewriter.replace_value_with_new_type(arg, arg.type.with_shape([self.batch, *arg.type.shape]))
            new.name_hint = hint
        for name, index in self.needs.items():
            func = self.funcs[name]
            arg = func.body.block.insert_arg(ids, index)
            arg.name_hint = SEGMENTS
            self.segments[name] = arg
            if func.arg_attrs is not None:
                attrs = list(func.arg_attrs.data)
                func.arg_attrs = ArrayAttr([*attrs[:index], DictionaryAttr({}), *attrs[index:]])
        for func in self.funcs.values():
            func.function_type = type(func.function_type).from_lists(list(func.body.block.arg_types),
                                                                     func.function_type.outputs.data)

    def segments_of(self, op: Operation) -> BlockArgument | None:
        """The ``segments`` argument of the function ``op`` stands in (None: it takes none)."""
        func = op.parent_op()
        return self.segments.get(func.sym_name.data) if isinstance(func, FuncOp) else None


def _received(site: Site) -> int:
    """How many of the callee's inputs the site passes as they are."""
    return len(site.op.arguments) if isinstance(site.op, CallOp) else len(site.op.carried) + len(site.op.shared)


# ----------------------------------------------------------------------------- the rewrites


class SegmentAttention(RewritePattern):
    """A causal ``flash_attention`` (or its backward) in a function that takes ``segments``: the same op
    with them (a block-diagonal causal mask)."""

    def __init__(self, packing: Packing):
        self.packing = packing

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: FlashAttentionOp | FlashAttentionBackwardOp, rewriter: PatternRewriter) -> None:
        segments = self.packing.segments_of(op)
        if segments is None or op.segments is not None:
            return
        tensors = op.operands[:len(op.operands) - (op.alibi_slopes is not None)]  # q, k, v (d_out .. lse)
        new = type(op).make([*tensors, op.alibi_slopes, segments], [r.type for r in op.results], dict(op.attributes))
        replace_with_twin(op, new, rewriter)


class SegmentCalls(RewritePattern):
    """A call of a function that takes ``segments`` passes the caller's (its last input)."""

    def __init__(self, packing: Packing):
        self.packing = packing

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: CallOp, rewriter: PatternRewriter) -> None:
        name = op.callee.root_reference.data
        segments = self.packing.segments_of(op)
        callee = self.packing.funcs.get(name)
        if segments is None or name not in self.packing.segments or len(op.arguments) == len(callee.body.block.args):
            return
        arguments = list(op.arguments)
        arguments.insert(self.packing.needs[name], segments)
        replace_with_twin(op, CallOp(name, arguments, [r.type for r in op.res]), rewriter)


class SegmentStacks(RewritePattern):
    """A stack of a block body that takes ``segments`` passes the caller's as one more shared value."""

    def __init__(self, packing: Packing):
        self.packing = packing

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: StackOp, rewriter: PatternRewriter) -> None:
        name = op.body.root_reference.data
        segments = self.packing.segments_of(op)
        if segments is None or name not in self.packing.segments or segments in op.shared:
            return
        new = StackOp(name, op.count, list(op.carried), list(op.per_layer), [*op.shared, segments],
                      [r.type for r in op.collected], reverse=op.reverse is not None)
        replace_with_twin(op, new, rewriter)


# The pass's rewrite patterns by name (``mdsl-opt --list-passes`` lists them).
PATTERNS: dict[str, tuple[type[RewritePattern], ...]] = {
    "segment_attention": (SegmentAttention,),
    "pass_segments": (SegmentCalls, SegmentStacks),
}


@dataclass(frozen=True)
class PackSequencesPass(ModulePass):
    name = "mdsl-pack-sequences"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for model in [m for m in op.walk() if isinstance(m, ModelOp)]:
            packing = Packing.of(model)
            if packing is None:
                continue
            packing.rewrite_signatures()
            PatternRewriteWalker(GreedyRewritePatternApplier(
                [cls(packing) for classes in PATTERNS.values() for cls in classes]),
                apply_recursively=False).rewrite_module(model)
