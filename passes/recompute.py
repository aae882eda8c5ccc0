"""``mdsl-recompute``: what a training step saves for its backward, and what it recomputes.

Runs on ``mdsl.graph`` after ``mdsl-autodiff``. For each looped stack (a
``stack @<body>_fwd`` whose collected results are the layer's saved tensors,
and its ``stack @<body>_bwd reverse``) and for the forward part of each
gradient function, every forward tensor gets a memory mode by the precedence
ladder of spec 7.2.0 (:func:`modeldsl.dialects.annotations.effective_memory_policy`):

1. the tensor's ``@memory`` annotation; 2. the ``preserve`` list of the
   ``@checkpoint`` on the flow that made it; 3. that flow's ``@checkpoint``,
   else the one on the stack (``x -> blocks -> y @checkpoint``: the block
   input is saved, everything else recomputed); 4. the module's ``save:``
   list; 5. its ``recompute:`` list; 6. the default: what the backward reads
   is saved, the rest is temporary.

A tensor the backward reads whose mode is ``recompute`` or ``temporary`` is
recomputed, subject to its ``@memory(..., policy=...)`` (seed 002):
``always``, ``lora_only`` (only while adapters are trained: ``finetune=lora``,
or ``auto`` and the model has ``@frozen`` parameters), ``never``. Its
**recompute frontier** is the smallest set of saved tensors, parameters and
inputs it derives from: walking its producers back, a walk stops at a tensor
that stays saved, at a tensor explicitly saved (which becomes saved), at a
parameter, a shared value or a layer slice, and at the block's carried input
(which becomes saved: layer ``l``'s input is layer ``l - 1``'s output).
The forward ops on the way are cloned into the backward, with their
attributes, just before the first op that reads what they compute, inside the
layer loop; an op with several results is cloned once for all of them. The
clones carry ``recompute = "<segment>"`` (named after the first tensor they
recompute), which ``mdsl-lower-to-sched`` turns into ``recompute_segment``s.
The recomputed tensors leave the forward stack's collected results and the
backward body's arguments.

* **E021**: a tensor to recompute derives from a function input that its
  ``save:``/``recompute:`` list marks ``recompute`` (nothing computes an input).
* **E022**: it derives from a block's carried input marked ``recompute``:
  that input is the previous layer's output, whose own recompute starts from
  the input again: a circular dependency through the layer loop.

Options: ``mode=annotated`` (the ladder above), ``none`` (save everything the
backward reads; a written backward's own ``recompute:`` section still runs),
``full`` (every stack checkpointed: its block input saved, the rest
recomputed; instance annotations still rank above it), ``auto`` (implied by
``budget``): ``budget=BYTES`` (or ``64MiB``, ``2GiB``) is the memory for saved
activations; starting from everything saved, the tensors whose recompute
costs the fewest FLOPs per byte saved are recomputed (elementwise ops, norms
and RoPE before GEMM and attention outputs) until the saved tensors fit;
``@memory`` annotations and ``policy=never`` still bind. ``budget=auto``
fits the device's free memory, which the caller gives as ``free_memory=BYTES``
(``mdsl-opt`` and the trainer measure it: CUDA when present, else the host's
available memory; a pass imports no runtime), less the parameters, gradients
and AdamW state. The automatic mode's choice is a table (tensor, bytes per
layer, recompute FLOPs per layer, decision, with the saved total) that the
pass hands to its ``report`` callback (:meth:`RecomputePass.reporting`;
``mdsl-opt --emit=recompute-report`` prints it).

The pass runs once where a pipeline puts it: the :class:`Planner` takes each
model's reverse stacks and gradient functions as they stand when it starts
(``Planner.pending``), and its two patterns rewrite each of them once (the
ops a rewrite makes are not pending).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from xdsl.context import Context
from xdsl.dialects.builtin import ArrayAttr, FileLineColLoc, IntAttr, ModuleOp, StringAttr
from xdsl.ir import Block, BlockArgument, Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.pattern_rewriter import (
    GreedyRewritePatternApplier,
    PatternRewriter,
    PatternRewriteWalker,
    RewritePattern,
    op_type_rewrite_pattern,
)
from xdsl.rewriter import InsertPoint

from modeldsl.diagnostics import Diagnostic, DiagnosticError, PassOptionError
from modeldsl.dialects.annotations import (
    CheckpointAttr,
    MemoryAttr,
    effective_memory_policy,
    find_annotation,
    is_frozen,
)
from modeldsl.dialects.graph import FuncOp, ModelOp, ParamRefOp, ReturnOp, StackOp
from modeldsl.dialects.graph_types import TensorType
from modeldsl.flops import FlopsUnknown, graph_op_flops
from modeldsl.ir import span_of_location
from modeldsl.symbolic import SymbolicError

MODES = ("none", "annotated", "full", "auto")
FINETUNE = ("auto", "full", "lora")
NOT_KEPT = ("recompute", "temporary")
UNITS = {"": 1, "b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "kb": 10**3, "mb": 10**6, "gb": 10**9}


@dataclass(frozen=True)
class RecomputePass(ModulePass):
    name = "mdsl-recompute"

    mode: str = "annotated"
    budget: str | int = ""
    finetune: str = "auto"
    free_memory: int = 0
    # where the automatic mode's table goes (not an option: set by reporting())
    report: Callable[[str], None] | None = field(default=None, init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        self.settings()  # refuse bad options where the pass is made (mdsl-opt points at them)

    def reporting(self, report: Callable[[str], None] | None) -> RecomputePass:
        """This pass, handing the automatic mode's table to ``report``."""
        copy = replace(self)
        object.__setattr__(copy, "report", report)
        return copy

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        settings = self.settings()
        for model in [m for m in op.walk() if isinstance(m, ModelOp)]:
            planner = Planner(model, settings)
            walker = PatternRewriteWalker(GreedyRewritePatternApplier(
                [cls(planner) for classes in PATTERNS.values() for cls in classes]), apply_recursively=False)
            walker.rewrite_module(op)
            if settings.mode == "auto" and self.report is not None:
                self.report(planner.table())

    def settings(self) -> "Settings":
        """The options checked (PassOptionError, E029, for a bad one)."""
        budget = str(self.budget)
        if self.mode not in MODES:
            raise PassOptionError(f"mdsl-recompute: mode={self.mode} is not one of {', '.join(MODES)}", "mode",
                                  "mode=annotated, or budget=BYTES for the automatic mode")
        if budget and self.mode not in ("annotated", "auto"):
            raise PassOptionError(f"mdsl-recompute: budget={budget} is for the automatic mode, not mode={self.mode}",
                                  "budget", "leave out mode= (a budget implies mode=auto)")
        if self.mode == "auto" and not budget:
            raise PassOptionError("mdsl-recompute: mode=auto needs a budget", "mode", "budget=2GiB, or budget=auto")
        if self.finetune not in FINETUNE:
            raise PassOptionError(f"mdsl-recompute: finetune={self.finetune} is not one of {', '.join(FINETUNE)}",
                                  "finetune", "finetune=auto: lora where the model has @frozen parameters")
        if isinstance(self.free_memory, bool) or not isinstance(self.free_memory, int) or self.free_memory < 0:
            raise PassOptionError(f"mdsl-recompute: free_memory={self.free_memory} is not a byte count",
                                  "free_memory", "the device's free memory in bytes, for budget=auto")
        return Settings("auto" if budget else self.mode, parse_budget(budget) if budget else None, self.finetune,
                        self.free_memory)


@dataclass(frozen=True)
class Settings:
    mode: str
    budget: int | str | None  # bytes, "auto" or None
    finetune: str
    free_memory: int = 0  # the device's, for budget=auto


def parse_budget(text: str) -> int | str:
    """``auto`` or a byte count (``1000000``, ``64MiB``, ``2GiB``, ``1.5GB``)."""
    if text == "auto":
        return text
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", text)
    if match is None or match.group(2).lower() not in UNITS:
        raise PassOptionError(f"mdsl-recompute: budget={text} is no byte count", "budget",
                              "budget=268435456, budget=256MiB, budget=2GiB or budget=auto")
    return int(float(match.group(1)) * UNITS[match.group(2).lower()])


# ---------------------------------------------------------------------------- the decisions


@dataclass
class Region:
    """Forward values, where each one is available to the backward, and the ops a recompute may replay.

    ``available`` maps a value the backward can read as it is (parameters, shared values,
    layer slices, inputs) to its backward counterpart (None: the same value); ``carried``
    are the inputs that must be saved to be read (a block's carried inputs)."""

    ops: list[Operation]
    needed: list[SSAValue]  # what the backward reads, in forward order
    available: dict[SSAValue, SSAValue | None]
    carried: list[SSAValue]
    input_modes: dict[SSAValue, tuple[str, str]]  # input -> (mode, "file:line:col" of the list entry)
    checkpoint: CheckpointAttr | None  # on the stack, or mode=full
    layers: int = 1
    name: str = ""  # the block body's, for the automatic mode's table


@dataclass
class Choice:
    """What a region keeps and what it replays."""

    keep: list[SSAValue]
    recomputed: list[SSAValue]
    replay: list[Operation]


@dataclass
class TableRow:
    tensor: str
    bytes_per_layer: int
    flops_per_layer: int
    layers: int
    decision: str


class Planner:
    """The memory mode of every forward tensor, the recompute frontiers and (``auto``) the budget."""

    def __init__(self, model: ModelOp, settings: Settings):
        self.model, self.settings = model, settings
        self.lora = settings.finetune == "lora" or (
            settings.finetune == "auto" and any(is_frozen(p) for p in model.params()))
        self.rows: list[TableRow] = []
        self.pending: set[Operation] = {op for op in model.walk() if _plans(op)}  # each rewritten once
        self.budget_bytes: int | None = None
        self.forced: dict[SSAValue, bool] = {}  # auto mode: value -> recomputed
        self.full = settings.mode == "full"
        if settings.mode == "auto":
            try:
                self.choose_automatically()
            except (SymbolicError, FlopsUnknown) as err:
                raise DiagnosticError([Diagnostic(
                    "E029", f"mdsl-recompute: the automatic mode weighs bytes and FLOPs of concrete shapes ({err})",
                    None, "bind the sizes first: mdsl-specialize{B=1 T=64}, before mdsl-autodiff")]) from None

    # ------------------------------------------------------------------ modes
    def mode(self, value: SSAValue, region: Region) -> tuple[str, str]:
        """(mode, rung) of a forward value."""
        if value in region.input_modes:
            if region.checkpoint is not None and region.checkpoint["granularity"] != "none":
                return ("save", "checkpoint")  # a checkpoint saves its boundary inputs
            mode, _ = region.input_modes[value]
            return (mode, "list")
        owner = value.owner
        if not isinstance(owner, Operation):
            return ("save", "default")
        name = value.name_hint or ""
        memory = find_annotation(owner, MemoryAttr)
        listed = _memory_entry(owner, value)
        instance = owner.attributes.get("checkpoint")
        policy = effective_memory_policy(
            name, annotations=[memory] if memory is not None else [],
            instance_checkpoint=instance if isinstance(instance, CheckpointAttr) else None,
            block_checkpoint=region.checkpoint,
            save=[name] if listed == "save" else [], recompute=[name] if listed == "recompute" else [],
            needed_by_backward=value in region.needed)
        return (policy.mode, policy.source)

    def recomputes(self, value: SSAValue, region: Region) -> bool:
        """Whether a value the backward reads is recomputed (its mode, then its policy)."""
        if self.settings.mode == "none":
            return False
        if value in self.forced:
            return self.forced[value]
        mode, _ = self.mode(value, region)
        return mode in NOT_KEPT and self.policy_allows(value)

    def policy_allows(self, value: SSAValue) -> bool:
        owner = value.owner
        memory = find_annotation(owner, MemoryAttr) \
            if isinstance(owner, Operation) else None
        policy = memory["policy"] if memory is not None else "always"
        return policy == "always" or (policy == "lora_only" and self.lora)

    def explicitly_saved(self, value: SSAValue, mode: str, rung: str) -> bool:
        """Whether a tensor on a recompute's way is saved by its annotations: marked ``save``, or
        marked ``recompute`` under a policy that does not apply (``lora_only`` without adapters,
        ``never``)."""
        if rung == "default":
            return False
        return mode == "save" or (mode in NOT_KEPT and not self.policy_allows(value))

    # ------------------------------------------------------------------ frontiers
    def choose(self, region: Region) -> Choice:
        """What ``region`` keeps, recomputes and replays (E021/E022 where a recompute cannot be)."""
        recomputed = [v for v in region.needed if self.recomputes(v, region)]
        keep = [v for v in region.needed if v not in recomputed]
        replay: set[Operation] = set()
        for value in recomputed:
            self.derive(value, region, keep, replay, value, set(recomputed))
        order = {op: i for i, op in enumerate(region.ops)}
        return Choice(keep, recomputed, sorted(replay, key=order.__getitem__))

    def derive(self, value: SSAValue, region: Region, keep: list[SSAValue], replay: set[Operation],
               target: SSAValue, recomputed: set[SSAValue]) -> None:
        """Walk ``value``'s producers back to the frontier, adding the ops to replay."""
        if value in region.available or value in keep:
            return
        mode, rung = self.mode(value, region)
        if not isinstance(value.owner, Operation):
            if value in region.input_modes and mode in NOT_KEPT:
                self.not_derivable(value, target, region)
            keep.append(value)  # a carried input: saved
            return
        if value not in recomputed and self.explicitly_saved(value, mode, rung):
            keep.append(value)  # part of the frontier
            return
        op = value.owner
        if op in replay:
            return
        replay.add(op)
        for operand in op.operands:
            self.derive(operand, region, keep, replay, target, recomputed)

    def not_derivable(self, value: SSAValue, target: SSAValue, region: Region) -> None:
        _, where = region.input_modes[value]
        name = value.name_hint or "?"
        needs = f"the backward reads the input '{name}'" if value is target else \
            f"recomputing '{target.name_hint or '?'}' needs the input '{name}'"
        if value in region.carried:
            raise DiagnosticError([Diagnostic(
                "E022", f"{needs} of a stacked block, which is marked recompute: it is the previous layer's "
                f"output, whose recompute would start from '{name}' again (a cycle through the layer loop)",
                _span(where, name), f"save the block input (drop '{name}' from recompute:, or list it in save:)")])
        raise DiagnosticError([Diagnostic(
            "E021", f"{needs}, which is marked recompute, but nothing computes an input: it is not derivable "
            "from saved tensors", _span(where, name), f"save '{name}' (drop it from recompute:)")])

    # ------------------------------------------------------------------ automatic mode
    def choose_automatically(self) -> None:
        """Recompute the cheapest tensors per byte until the saved ones fit the budget."""
        regions = [r for r in (layer_region(self.model, s, False) for s in backward_stacks(self.model)) if r]
        self.budget_bytes = self.settings.budget if isinstance(self.settings.budget, int) else \
            auto_budget(self.model, self.settings.free_memory)
        self.fixed = sum(self.top_level_saved_bytes(top) for top in self.top_level_regions())
        candidates, bound = [], set()
        for region in regions:
            for value in region.needed:
                if not isinstance(value.owner, Operation):
                    continue
                memory = find_annotation(value.owner, MemoryAttr)
                if memory is not None:  # rung 1 binds in every mode
                    self.forced[value] = memory["mode"] in NOT_KEPT and self.policy_allows(value)
                    bound.add(value)
                    continue
                self.forced[value] = False
                candidates.append((self.replay_flops(value, region) / max(_nbytes(value), 1), value, region))
        candidates.sort(key=lambda c: (c[0], -_nbytes(c[1])))
        self.saved_total = self.saved_bytes(regions)
        for _, value, _region in candidates:
            if self.saved_total <= self.budget_bytes:
                break
            self.forced[value] = True
            self.saved_total = self.saved_bytes(regions)
        for region in regions:
            for value in region.needed:
                decision = "save (block input)" if not isinstance(value.owner, Operation) else \
                    ("recompute" if self.forced[value] else "save") + (" (@memory)" if value in bound else "")
                self.rows.append(TableRow(f"{region.name}.{value.name_hint or '?'}", _nbytes(value),
                                          self.replay_flops(value, region) if isinstance(value.owner, Operation)
                                          else 0, region.layers, decision))

    def replay_flops(self, value: SSAValue, region: Region) -> int:
        """FLOPs of recomputing ``value`` alone (everything else the backward reads saved)."""
        keep = [v for v in region.needed if v is not value]
        replay: set[Operation] = set()
        self.derive(value, region, keep, replay, value, {value})
        return sum(graph_op_flops(op) for op in replay)

    def saved_bytes(self, regions: list[Region]) -> int:
        """The saved bytes of the layer loops (all layers) and, fixed, of the tensors outside them."""
        return self.fixed + sum(region.layers * sum(_nbytes(v) for v in self.choose(region).keep)
                                for region in regions)

    def top_level_saved_bytes(self, region: Region) -> int:
        """What the forward part of a gradient function keeps for its backward: the forward values
        it saves, and the carried results of its stacks the backward reads (not its inputs)."""
        kept = [v for v in self.choose(region).keep if isinstance(v.owner, Operation)]
        carried = [r for op in region.ops if isinstance(op, StackOp) for r in op.carried_results
                   if any(u.operation not in region.ops and not isinstance(u.operation, ReturnOp) for u in r.uses)]
        return sum(_nbytes(v) for v in [*kept, *carried])

    def top_level_regions(self) -> list[Region]:
        """The forward part of each gradient function (outside its stacks)."""
        funcs = [f for f in self.model.funcs() if "forward_ops" in f.attributes]
        return [top_level_region(self.model, f) for f in funcs]

    def table(self) -> str:
        lines = [f"mdsl-recompute: automatic mode, {_human(self.budget_bytes)} for saved activations",
                 f"{'tensor':<24} {'bytes/layer':>12} {'recompute FLOPs/layer':>22}  decision"]
        for row in self.rows:
            lines.append(f"{row.tensor:<24} {row.bytes_per_layer:>12} {row.flops_per_layer:>22}  {row.decision}")
        lines.append(f"saved activations: {_human(self.saved_total)}, {_human(self.fixed)} of them outside "
                     f"the layer loops ({'fits' if self.saved_total <= self.budget_bytes else 'over the budget'})")
        return "\n".join(lines)


def _plans(op: Operation) -> bool:
    """Whether the pass plans ``op``: a gradient function (its forward part), or a reverse stack."""
    return (isinstance(op, FuncOp) and "forward_ops" in op.attributes) or \
        (isinstance(op, StackOp) and op.reverse is not None)


def auto_budget(model: ModelOp, free_memory: int) -> int:
    """The device's ``free_memory`` less parameters, gradients and AdamW state (E029 where the caller
    did not measure it)."""
    if free_memory <= 0:
        raise DiagnosticError([Diagnostic(
            "E029", "mdsl-recompute: budget=auto, but no free memory was given", None,
            "give free_memory=BYTES (mdsl-opt and mdsl-run measure the device's), or a budget: budget=2GiB")])
    state = 0
    for param in model.params():
        numel = math.prod(_dims(param.param_type))
        state += param.param_type.dtype.byte_size(numel)
        if not is_frozen(param):
            state += 12 * numel + (4 * numel if param.param_type.dtype.bits < 32 else 0)
    return max(int(0.8 * (free_memory - state)), 0)


def _dims(t: TensorType) -> list[int]:
    return [d.evaluate({}) for d in t.shape]


def _nbytes(value: SSAValue) -> int:
    t = value.type
    return t.dtype.byte_size(math.prod(_dims(t))) if isinstance(t, TensorType) else 0


def _human(n: int | None) -> str:
    if n is None:
        return "?"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"


def _memory_entry(op: Operation, value: SSAValue) -> str:
    """The mode lowering recorded for a result from the lists and annotations (``auto``: none)."""
    memory = op.attributes.get("memory")
    if not isinstance(memory, ArrayAttr) or value not in op.results:
        return "auto"
    modes = [a.data for a in memory.data]
    index = list(op.results).index(value)
    return modes[index] if index < len(modes) else "auto"


def _span(where: str, word: str):
    """The span of a ``file:line:col`` recorded by lowering."""
    path, line, column = where.rsplit(":", 2)
    return span_of_location(FileLineColLoc(StringAttr(path), IntAttr(int(line)), IntAttr(int(column))), word)


# ---------------------------------------------------------------------------- regions of the IR


def backward_stacks(model: ModelOp) -> list[StackOp]:
    return [op for op in model.walk() if isinstance(op, StackOp) and op.reverse is not None
            and "forward" in _func(model, op).attributes]


def _func(model: ModelOp, stack: StackOp) -> FuncOp:
    return model.lookup(stack.body.root_reference.data)


@dataclass
class LoopedPair:
    """A forward stack of ``@<body>_fwd`` and the reverse stack of its ``@<body>_bwd``."""

    forward_stack: StackOp
    backward_stack: StackOp
    fwd: FuncOp
    bwd: FuncOp

    @property
    def carried(self) -> int:
        return len(self.forward_stack.carried)

    @property
    def inputs(self) -> int:
        return len(self.forward_stack.carried) + len(self.forward_stack.shared) + len(self.forward_stack.per_layer)

    @property
    def saved(self) -> list[SSAValue]:
        return list(self.fwd.body.block.last_op.operands[self.carried:])

    @property
    def saved_args(self) -> list[BlockArgument]:
        first = len(self.bwd.body.block.args) - len(self.saved)
        return list(self.bwd.body.block.args[first:])


def looped_pair(model: ModelOp, backward: StackOp) -> LoopedPair | None:
    bwd = _func(model, backward)
    fwd = model.lookup(bwd.attributes["forward"].root_reference.data)
    if not isinstance(fwd, FuncOp):
        return None
    forward = next((v.owner for v in backward.per_layer if isinstance(v.owner, StackOp)
                    and v.owner.body.root_reference.data == fwd.sym_name.data), None)
    if forward is None:
        return None
    return LoopedPair(forward, backward, fwd, bwd)


def layer_region(model: ModelOp, backward: StackOp, full: bool) -> Region | None:
    pair = looped_pair(model, backward)
    return pair_region(pair, full) if pair is not None else None


def pair_region(pair: LoopedPair, full: bool) -> Region:
    """The forward body of a looped pair (``full``: checkpointed whatever the stack says)."""
    block = pair.fwd.body.block
    args = list(block.args)
    carried = args[:pair.carried]
    bwd_args = list(pair.bwd.body.block.args)
    available: dict[SSAValue, SSAValue | None] = {a: b for a, b in zip(args[pair.carried:],
                                                                       bwd_args[pair.carried:pair.inputs])}
    checkpoint = find_annotation(pair.forward_stack, CheckpointAttr)
    return Region([op for op in block.ops if not isinstance(op, ReturnOp)], pair.saved, available, carried,
                  _input_modes(pair.fwd, args), CheckpointAttr.of() if full else checkpoint,
                  pair.forward_stack.count.data.evaluate({}) if pair.forward_stack.count.data.is_const() else 1,
                  pair.fwd.sym_name.data.removesuffix("_fwd"))


def _input_modes(func: FuncOp, args: list[SSAValue]) -> dict[SSAValue, tuple[str, str]]:
    modes, places = func.attributes.get("input_memory"), func.attributes.get("input_memory_at")
    if modes is None:
        return {}
    found = {}
    for arg in args:
        if arg.name_hint in modes.data:
            found[arg] = (modes.data[arg.name_hint].data, places.data[arg.name_hint].data)
    return found


# ---------------------------------------------------------------------------- rewriting


@dataclass
class Readers:
    """Where the backward reads a recomputed tensor: the uses of ``value`` (a backward body's saved
    argument, or the forward value itself) by the ops ``within`` (None: every use)."""

    value: SSAValue
    within: set[Operation] | None = None

    def operations(self) -> list[Operation]:
        return [u.operation for u in self.value.uses if self.within is None or u.operation in self.within]

    def redirect(self, replay: SSAValue, rewriter: PatternRewriter) -> None:
        """These reads now read ``replay``."""
        if self.within is None:
            rewriter.replace_all_uses_with(self.value, replay)
        else:
            within = self.within
            rewriter.replace_uses_with_if(self.value, replay, lambda use: use.operation in within)


def clone_replay(ops: list[Operation], block: Block, mapping: dict[SSAValue, SSAValue],
                 needed: dict[SSAValue, Readers], segment_of, rewriter: PatternRewriter) -> None:
    """Clone ``ops`` (forward order) into ``block``, each just before the first op that reads what it
    computes; ``mapping`` gives the block's counterpart of each forward value the clones read, and
    ``needed`` says where the backward reads each recomputed forward value."""
    position = {op: i for i, op in enumerate(block.ops)}
    anchors: dict[Operation, Operation] = {}
    for op in reversed(ops):
        users = [user for r in op.results if r in needed for user in needed[r].operations()]
        users += [anchors[u.operation] for r in op.results for u in r.uses if u.operation in anchors]
        users = [u for u in users if u in position]
        anchors[op] = min(users, key=position.__getitem__) if users else block.last_op
    for op in ops:
        clone = op.clone(value_mapper=dict(mapping))
        for key in ("memory", "checkpoint", "annotations", "user_annotations"):  # no hook fires twice
            clone.attributes.pop(key, None)
        clone.attributes["recompute"] = StringAttr(segment_of(anchors[op]))
        rewriter.insert(clone, InsertPoint.before(anchors[op]))
        for old, new in zip(op.results, clone.results):
            new.name_hint = old.name_hint
            mapping[old] = new
    for value, readers in needed.items():
        readers.redirect(mapping[value], rewriter)


class RecomputeLayerTensors(RewritePattern):
    """A reverse stack: the layer's recomputed tensors replayed in its body, the rest saved."""

    def __init__(self, planner: Planner):
        self.planner = planner

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: StackOp, rewriter: PatternRewriter) -> None:
        model = self.planner.model
        if op not in self.planner.pending:
            return
        self.planner.pending.discard(op)
        bwd = _func(model, op)
        if "forward" not in bwd.attributes:
            return
        pair = looped_pair(model, op)
        if pair is None:
            return
        region = pair_region(pair, self.planner.full)
        choice = self.planner.choose(region)
        new_saved = [v for v in pair.saved if v in choice.keep] + \
            [v for v in choice.keep if v not in pair.saved]
        self.rewrite_backward_body(pair, region, choice, new_saved, rewriter)
        self.rewrite_forward_body(pair, new_saved)
        self.rewrite_stacks(pair, new_saved, rewriter)

    def rewrite_backward_body(self, pair: LoopedPair, region: Region, choice: Choice,
                              new_saved: list[SSAValue], rewriter: PatternRewriter) -> None:
        block = pair.bwd.body.block
        old_saved, old_args = pair.saved, pair.saved_args
        stand_ins = dict(zip(old_saved, old_args))
        for value in new_saved:
            if value not in stand_ins:
                stand_ins[value] = block.insert_arg(value.type, len(block.args))
                stand_ins[value].name_hint = f"saved_{value.name_hint}" if value.name_hint else None
        mapping: dict[SSAValue, SSAValue] = {k: v for k, v in region.available.items() if v is not None}
        mapping.update({v: stand_ins[v] for v in new_saved})
        needed = {v: Readers(stand_ins[v]) for v in choice.recomputed}
        names = {}
        segment = lambda anchor: names.setdefault(anchor, _segment_name(anchor, choice, needed))  # noqa: E731
        clone_replay(choice.replay, block, mapping, needed, segment, rewriter)
        for value in choice.recomputed:
            block.erase_arg(stand_ins[value])
        pair.bwd.function_type = type(pair.bwd.function_type).from_lists(
            [a.type for a in block.args], pair.bwd.function_type.outputs.data)

    def rewrite_forward_body(self, pair: LoopedPair, new_saved: list[SSAValue]) -> None:
        block = pair.fwd.body.block
        ret = block.last_op
        outputs = list(ret.operands[:pair.carried])
        ret.detach()
        ret.erase()
        block.add_op(ReturnOp(*outputs, *new_saved))
        pair.fwd.function_type = type(pair.fwd.function_type).from_lists(
            pair.fwd.function_type.inputs.data, [v.type for v in [*outputs, *new_saved]])
        pair.fwd.attributes["saved"] = ArrayAttr([StringAttr(v.name_hint or f"v{i}") for i, v in enumerate(new_saved)])

    def rewrite_stacks(self, pair: LoopedPair, new_saved: list[SSAValue], rewriter: PatternRewriter) -> None:
        old_forward, old_backward = pair.forward_stack, pair.backward_stack
        count = old_forward.count
        forward = StackOp(pair.fwd.sym_name.data, count, list(old_forward.carried), list(old_forward.per_layer),
                          list(old_forward.shared), [StackOp.stacked_type(count, v.type) for v in new_saved])
        forward.attributes |= {k: v for k, v in old_forward.attributes.items()}
        forward.location = old_forward.location  # (where an @assert on the stack's result stands)
        rewriter.insert(forward, InsertPoint.before(old_forward))
        body = old_forward.body.root_reference.data
        for new, old in zip(forward.carried_results, old_forward.carried_results):
            new.name_hint = old.name_hint
            old.replace_all_uses_with(new)
        for new, value in zip(forward.collected, new_saved):
            new.name_hint = f"{body.removesuffix('_fwd')}_{value.name_hint}" if value.name_hint else None
        layers = len(old_forward.per_layer)
        backward = StackOp(pair.bwd.sym_name.data, count, list(old_backward.carried),
                           [*old_backward.per_layer[:layers], *forward.collected], list(old_backward.shared),
                           [r.type for r in old_backward.collected], reverse=True)
        backward.attributes |= {k: v for k, v in old_backward.attributes.items()}
        rewriter.replace(old_backward, backward)
        for new, old in zip(backward.res, old_backward.res):
            new.name_hint = old.name_hint
        rewriter.erase(old_forward)


def _segment_name(anchor: Operation, choice: Choice, needed: dict[SSAValue, Readers]) -> str:
    """A recompute segment is named after the first recomputed tensor its anchor reads."""
    for value in choice.recomputed:
        if any(user is anchor for user in needed[value].operations()):
            return value.name_hint or "recompute"
    return choice.recomputed[0].name_hint or "recompute" if choice.recomputed else "recompute"


class RecomputeTopLevelTensors(RewritePattern):
    """A gradient function: the forward tensors outside stacks that are recomputed, replayed
    before their first use in the backward part."""

    def __init__(self, planner: Planner):
        self.planner = planner

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: FuncOp, rewriter: PatternRewriter) -> None:
        if op not in self.planner.pending:
            return
        self.planner.pending.discard(op)
        block = op.body.block
        backward = list(block.ops)[op.attributes["forward_ops"].value.data:]
        region = top_level_region(self.planner.model, op)
        choice = self.planner.choose(region)
        if not choice.replay:
            return
        members = set(backward)  # the backward's reads move to the replays
        needed = {value: Readers(value, members) for value in choice.recomputed}
        names: dict[Operation, str] = {}
        segment = lambda anchor: names.setdefault(anchor, _segment_name(anchor, choice, needed))  # noqa: E731
        clone_replay(choice.replay, block, {}, needed, segment, rewriter)


def top_level_region(model: ModelOp, func: FuncOp) -> Region:
    """The forward part of a gradient function: its first ``forward_ops`` ops."""
    ops = list(func.body.block.ops)
    count = func.attributes["forward_ops"].value.data
    forward, backward = ops[:count], ops[count:]
    produced = {r for o in forward for r in o.results}
    args = list(func.body.block.args)
    needed: list[SSAValue] = []
    for o in backward:
        for operand in o.operands:
            if (operand in produced or operand in args) and operand not in needed and \
                    not isinstance(operand.owner, ParamRefOp):
                needed.append(operand)
    available = {r: None for o in forward if isinstance(o, ParamRefOp) for r in o.results}
    available |= {a: None for a in args}
    forward_func = model.lookup("forward")
    modes = {}
    if isinstance(forward_func, FuncOp):
        by_name = _input_modes(forward_func, list(forward_func.body.block.args))
        names = {a.name_hint: m for a, m in by_name.items()}
        modes = {a: names[a.name_hint] for a in args if a.name_hint in names}
    for arg in modes:
        available.pop(arg, None)  # an input marked recompute: not there for the backward
    stacks = {r for o in forward if isinstance(o, StackOp) for r in o.res}
    needed = [v for v in needed if v not in stacks]  # a stack's results belong to its loops
    available |= {r: None for r in stacks}
    return Region(forward, needed, available, [], modes, None)


# The pass's rewrite patterns by name (``mdsl-opt --list-passes`` lists them).
PATTERNS: dict[str, tuple[type[RewritePattern], ...]] = {
    "layer_tensors": (RecomputeLayerTensors,),
    "top_level_tensors": (RecomputeTopLevelTensors,),
}
