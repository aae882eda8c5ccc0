"""``mdsl-lower-to-sched``: a specialized ``mdsl.graph`` function becomes an ``mdsl.sched`` program.

Every tensor becomes a buffer: parameters in the ``params`` arena (tagged
``param = "name"``), the function's arguments and results in ``external``
(``input = i`` / ``output = i``), everything else in ``activations``, and
the scratch a kernel asks for through the kernel registry in ``workspace``
(a trailing output of its launch, marked ``scratch``). Buffers get no offsets
here; ``mdsl-plan-memory`` places them. Every program declares all the
model's parameters first, in the model's order (used or not), so all
programs of a model lay out the ``params`` arena alike and can share it.

With ``grads_arena=true``, a gradient function (``mdsl-autodiff``'s, whose
``grads`` attribute names the parameters of its gradient results) adds its
parameter gradients into the ``grads`` arena instead of returning them: one
fp32 buffer per trainable (not ``@frozen``) parameter, declared after the
parameters in the model's order (tagged ``grad = "name"``), so a training
step accumulates over micro-batches and an optimizer program
(``mdsl-optimizer-step``) reads them. A gradient computed by a GEMM that
nothing else reads becomes that GEMM with ``beta = 1`` on the gradient
buffer (or on its layer's slice of it, through the concat and views that
join the layers of a stacked parameter), a kernel that accumulates natively
(the embedding gradient's scatter-add) becomes a launch marked ``accumulate``
into it, and the terms of a sum over uses (a tied weight) go in one by one;
any other gradient is added by an in-place ``add`` launch. A gradient returned
through an ``all_reduce`` (``mdsl-shard{dp}``) is added so, then its grads buffer
(or its layer's slice, inside the loop) is all-reduced in place. The remaining
results (the loss, input gradients) are the program's outputs, numbered in order. A gradient function's
``saved`` attribute (the forward values its backward reads) is copied onto
the program, for the recompute passes.

Each primitive becomes a launch of its registry kernel, except:
* ``matmul`` and ``batched_matmul`` become ``gemm``; a ``transpose`` of the
  last two dims that only feeds GEMMs is absorbed into their flags, and a
  weight-gradient matmul (``TN`` over leading dims) reads 2-d views; a
  ``dequantize`` of a weight stored in fp8 that a GEMM reads as B is that
  GEMM's ``scale`` operand (it widens B a tile at a time; the widened
  weight is not held; any other reader gets the ``dequantize`` launch); a
  projection ``x @ W^T`` whose only use is a split of its last dim (fused
  QKV, gate/up) becomes one GEMM per piece on row slices of ``W``, so the
  fused result is never held (``split_gemms=false`` keeps one GEMM and the
  split: the graph interpreter's exact arithmetic, where BLAS rounds a
  narrower GEMM differently in the last bit);
* ``flash_attention`` (without ALiBi) becomes ``attention``, and its backward
  ``flash_attention_backward`` (without ALiBi) ``attention_backward``, with the
  segment ids of packed rows (``mdsl-pack-sequences``) where it has them;
* ``view``, ``contiguous`` and splits along the outermost non-unit dim become
  aliases of their input at a byte offset: no copy.
A ``stack`` becomes a ``layer_loop`` (``reverse`` for a reverse stack): the
body reads layer ``l`` of each stacked parameter through ``layer_view`` and
carries its state in buffers that the loop updates. A collected result is a
stacked ``activations`` buffer (marked ``saved``: the forward values a
gradient function's backward reads are, in loops and outside) that the body
writes layer by layer, its value's buffer becoming the layer's slice where
only the body touches it; a collected parameter gradient is added into its
layer's slice of the ``grads`` buffer as above. Consecutive ops marked
``recompute`` (by ``mdsl-recompute``, or a written backward's ``recompute:``
section) go into one ``recompute_segment`` (``layer(%l)`` inside a loop).
Ops run in the graph's (topological) order.

Options: ``func`` (default ``forward``), ``storage=fp32`` to hold 16-bit
floats as fp32 (an fp32 run of a bf16 model, as the graph interpreter's
``float_dtype``), ``kv_cache=C`` for decoding: every attention becomes a
``kv_cache_attention`` launch that writes the new keys and values into a
cache of capacity ``C`` (state buffers in ``external``, tagged ``state``,
stacked per layer inside loops) at the runtime ``position`` (one more
external input) and attends over the cache up to them. A Mamba conv or scan
that takes no state operand becomes ``mamba_conv1d_step`` /
``mamba_selective_scan_step``, which start from a state buffer (tagged
``convN`` / ``ssmN``, zero at position 0) and leave the state after the run's
real steps there; their number is one more external input, ``valid``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import (
    DenseArrayBase,
    FileLineColLoc,
    FloatAttr,
    IntegerAttr,
    ModuleOp,
    StringAttr,
    UnitAttr,
    f64,
    i64,
)
from xdsl.ir import Attribute, Block, Operation, SSAValue
from xdsl.passes import ModulePass

from modeldsl.diagnostics import Diagnostic, DiagnosticError
from modeldsl.dialects.annotations import (
    AssertAttr,
    LifetimeAttr,
    NoaliasAttr,
    annotations_of,
    find_annotation,
    is_frozen,
)
from modeldsl.dialects.dtypes import DType
from modeldsl.dialects.graph import (
    QUANTIZED_ATTR,
    CallOp,
    CustomOp,
    FuncOp,
    ModelOp,
    ParamOp,
    ParamRefOp,
    ReturnOp,
    StackOp,
)
from modeldsl.dialects.graph_primitives import AllReduceOp, DequantizeOp
from modeldsl.dialects.graph_types import TensorType
from modeldsl.dialects.sched import (
    KEYED_BY_LAYER,
    AssertOp,
    AttentionBackwardOp,
    AttentionOp,
    BufferOp,
    BufferType,
    CollectiveOp,
    CopyOp,
    GemmOp,
    LaunchOp,
    LayerLoopOp,
    LayerViewOp,
    ProgramOp,
    RecomputeSegmentOp,
    SchedOp,
    kernel_choice_attributes,
)
from modeldsl.graph_builder import op_attr
from modeldsl.ir import span_of_location
from modeldsl.kernel_choice import KernelChoice, kernel_choice
from modeldsl.kernels import dropout_mask
from modeldsl.kernels.registry import entry
from modeldsl.passes import lower_gemm_epilogues as epilogues
from modeldsl.passes.specialize import require_bound_attributes
from modeldsl.primitives import PrimitiveSignature, builtin_primitives, signature_of_op
from modeldsl.symbolic import SymbolicError

# attributes of graph ops that are not kernel parameters
NOT_PARAMS = {"annotations", "result_annotations", "memory", "recompute", "operandSegmentSizes",
              "resultSegmentSizes"}
RNG_STEP = "rng_step"  # the tag (and name) of a program's step counter input


def rng_step_input(program: ProgramOp) -> int | None:
    """The number of ``program``'s step counter input (``rng_step``, an int64 ``[1]``: its dropout
    masks' counter), None when it has none (no dropout active in it)."""
    for op in program.body.block.ops:
        if isinstance(op, BufferOp) and RNG_STEP in op.attributes and "input" in op.attributes:
            return op.attributes["input"].value.data
    return None


@dataclass(frozen=True)
class LowerToSchedPass(ModulePass):
    name = "mdsl-lower-to-sched"

    func: str = "forward"
    storage: str = ""
    kv_cache: int = 0
    split_gemms: bool = True
    grads_arena: bool = False

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for model in [m for m in op.body.block.ops if isinstance(m, ModelOp)]:
            program = lower_function(model, self.func, self.storage or None, self.kv_cache, self.split_gemms,
                                     self.grads_arena)
            op.body.block.insert_op_after(program, model)


def lower_function(model: ModelOp, func_name: str = "forward", storage: str | None = None,
                   kv_cache: int = 0, split_gemms: bool = True, grads_arena: bool = False) -> ProgramOp:
    """The schedule of ``@func_name`` of a specialized model (decoding with a KV cache of
    ``kv_cache`` positions when it is positive; parameter gradients added into the ``grads``
    arena with ``grads_arena``)."""
    funcs = {f.sym_name.data: f for f in model.body.block.ops if isinstance(f, FuncOp)}
    if func_name not in funcs:
        raise _error(f"@{model.sym_name.data} has no function @{func_name}", f"functions: {', '.join(funcs)}")
    if storage not in (None, "fp32"):
        raise _error(f"mdsl-lower-to-sched: storage={storage} is not fp32", "storage=fp32 or leave it out")
    if isinstance(kv_cache, bool) or not isinstance(kv_cache, int) or kv_cache < 0:
        raise _error(f"mdsl-lower-to-sched: kv_cache={kv_cache} is not a number of positions", "kv_cache=256")
    require_bound_attributes(model, "mdsl-lower-to-sched")
    func = funcs[func_name]
    if grads_arena and "grads" not in func.attributes:
        raise _error(f"mdsl-lower-to-sched: grads_arena=true, but @{func_name} is no gradient function",
                     "derive one first: mdsl-autodiff, then func=forward_grad")
    return ScheduleBuilder(model, funcs, storage == "fp32", kv_cache, split_gemms).lower(func, grads_arena)


def parameter_buffers(model: ModelOp, fp32_storage: bool) -> list[BufferOp]:
    """One ``params`` buffer per parameter of a specialized model, in the model's order. A parameter
    ``mdsl-quantize-frozen`` stores narrower keeps its stored dtype with ``fp32_storage`` too, and its
    buffer carries its ``quantized`` dictionary (and so does its scale's), for the memory report."""
    buffers = []
    for param in (p for p in model.body.block.ops if isinstance(p, ParamOp)):
        stored = QUANTIZED_ATTR in param.attributes
        op = BufferOp("params", concrete_buffer_type(param.param_type, fp32_storage and not stored))
        op.attributes["param"] = StringAttr(param.sym_name.data)
        if stored:
            op.attributes[QUANTIZED_ATTR] = param.attributes[QUANTIZED_ATTR]
        op.result.name_hint = param.sym_name.data
        buffers.append(op)
    return buffers


def gradient_buffers(model: ModelOp, fp32_storage: bool) -> list[BufferOp]:
    """One fp32 ``grads`` buffer per trainable (not ``@frozen``) parameter, in the model's order."""
    buffers = []
    for param in (p for p in model.body.block.ops if isinstance(p, ParamOp) and not is_frozen(p)):
        shape = concrete_buffer_type(param.param_type, fp32_storage).shape
        op = BufferOp("grads", BufferType(shape, DType.FP32))
        op.attributes["grad"] = StringAttr(param.sym_name.data)
        op.result.name_hint = f"d_{param.sym_name.data}"
        buffers.append(op)
    return buffers


def concrete_buffer_type(t: TensorType, fp32_storage: bool) -> BufferType:
    """The buffer type of a tensor type with concrete dims (16-bit floats as fp32 with ``fp32_storage``)."""
    try:
        shape = [d.evaluate({}) for d in t.shape]
    except (SymbolicError, AttributeError):
        raise _error(f"mdsl-lower-to-sched needs concrete shapes, got {t}",
                     "bind the sizes first: mdsl-specialize{B=1 T=64}") from None
    dtype = t.dtype
    if fp32_storage and dtype in (DType.BF16, DType.FP16):
        dtype = DType.FP32
    return BufferType(shape, dtype)


def _error(message: str, hint: str | None = None) -> DiagnosticError:
    return DiagnosticError([Diagnostic("E029", message, None, hint)])


def _unknown_op(op: Operation) -> DiagnosticError:
    if isinstance(op, CustomOp):  # a user primitive this process has not registered
        return DiagnosticError([Diagnostic("E014", f"mdsl-lower-to-sched: no primitive '{op.primitive}' is "
                                           "registered", span_of_location(op.location),
                                           "register it first: modeldsl.register_primitive(...)")])
    return _error(f"mdsl-lower-to-sched cannot lower {op.name}")



def collective_op(op: Operation, kind: str, source: SSAValue, target: SSAValue,
                  reduction: str | None = None) -> CollectiveOp:
    """The ``mdsl.sched.collective`` of graph collective ``op`` (its group and size) from ``source`` into ``target``."""
    return CollectiveOp(kind, source, target, op_attr(op, "group", "world"), op=reduction, size=op_attr(op, "size", 1))

class ScheduleBuilder:
    """Walks graph functions in order, creating buffers and work ops."""

    def __init__(self, model: ModelOp, funcs: dict[str, FuncOp], fp32_storage: bool, kv_cache: int = 0,
                 split_gemms: bool = True):
        self.model, self.funcs, self.fp32_storage, self.kv_cache = model, funcs, fp32_storage, kv_cache
        self.split_projections = split_gemms
        self.loops: list[tuple[LayerLoopOp, int]] = []
        self.position: SSAValue | None = None
        self.valid: SSAValue | None = None  # decoding with recurrent state: the real steps of a run
        self.rng: SSAValue | None = None  # training with dropout: the step counter its masks are keyed with
        self.caches = 0
        self.recurrent = 0
        self.buffers: list[BufferOp] = []
        self.block = Block()
        self.values: dict[SSAValue, SSAValue] = {}
        self.params: dict[str, SSAValue] = {}
        self.deferred: dict[SSAValue, Operation] = {}  # transposes not (yet) materialized
        self.folded_reductions: dict[SSAValue, Operation] = {}  # gradient -> the all_reduce of its grads buffer
        # split -> (x, W, W's scale or None, alpha)
        self.split_gemms: dict[Operation, tuple[SSAValue, SSAValue, SSAValue | None, float]] = {}
        self.outputs: dict[SSAValue, int] = {}
        self.in_loop_grads: dict[SSAValue, SSAValue] = {}  # collected parameter gradient -> its grads buffer
        self.signatures = {sig.op.name: sig for sig in builtin_primitives().values()}

    # ------------------------------------------------------------------ program
    def lower(self, func: FuncOp, grads_arena: bool = False) -> ProgramOp:
        for op in parameter_buffers(self.model, self.fp32_storage):
            self.buffers.append(op)
            self.params[op.attributes["param"].data] = op.result
        ret = func.body.block.last_op
        assert isinstance(ret, ReturnOp)
        accumulated = self.gradient_results(func, ret) if grads_arena else {}
        for index, arg in enumerate(func.body.block.args):
            self.values[arg] = self.new_buffer(arg, "external", {"input": IntegerAttr(index, i64)})
        if self.kv_cache:
            index = IntegerAttr(len(func.body.block.args), i64)
            self.position = self.new_buffer(None, "external", {"input": index}, btype=BufferType([1], DType.INT32))
            self.position.name_hint = "position"
        returned = [(i, v) for i, v in enumerate(ret.values) if i not in accumulated]
        for index, (_, value) in enumerate(returned):
            if value not in self.outputs and isinstance(value.owner, Operation) and value not in func.body.block.args:
                self.outputs[value] = index
        gradients = {p: self.reduced_gradient(ret.values[p]) for p in accumulated}
        self.in_loop_grads = {gradients[p]: t for p, t in accumulated.items() if _collected_once(gradients[p])}
        self.run_body(func.body.block, self.values)
        self.mark_saved(func)
        for position, target in accumulated.items():
            if gradients[position] not in self.in_loop_grads:
                self.accumulate(gradients[position], target)
                self.reduce_accumulated(gradients[position], target)
        for index, (_, value) in enumerate(returned):
            source = self.buffer(value)
            if not _is_output(source, index):  # an argument, a view, loop state or a repeated value
                out = self.new_buffer(value, "external", {"output": IntegerAttr(index, i64)}, btype=source.type)
                self.block.add_op(CopyOp(source, out))
        program = ProgramOp(func.sym_name.data, {})
        program.attributes["model"] = StringAttr(self.model.sym_name.data)
        if "saved" in func.attributes:  # the forward values a gradient function's backward reads
            program.attributes["saved"] = func.attributes["saved"]
        body = program.body.block
        body.add_ops(self.buffers)
        for op in list(self.block.ops):
            op.detach()
            body.add_op(op)
        return program

    def mark_saved(self, func: FuncOp) -> None:
        """Mark ``saved`` the buffers of the forward values a gradient function's backward reads."""
        if "forward_ops" not in func.attributes:
            return
        ops = list(func.body.block.ops)
        forward = {r for op in ops[:func.attributes["forward_ops"].value.data] for r in op.results}
        for op in ops[func.attributes["forward_ops"].value.data:]:
            for value in [] if isinstance(op, ReturnOp) else op.operands:
                buf = self.values.get(value) if value in forward else None
                while buf is not None and isinstance(buf.owner, BufferOp) and buf.owner.alias_of is not None:
                    buf = buf.owner.alias_of
                if buf is not None and isinstance(buf.owner, BufferOp) and buf.owner.arena.data == "activations":
                    buf.owner.attributes["saved"] = UnitAttr()

    # ------------------------------------------------------------------ gradients
    def gradient_results(self, func: FuncOp, ret: ReturnOp) -> dict[int, SSAValue]:
        """Return position -> ``grads`` buffer of each parameter gradient of a gradient function
        (all trainable parameters' buffers are declared, in the model's order)."""
        targets = {}
        for op in gradient_buffers(self.model, self.fp32_storage):
            self.buffers.append(op)
            targets[op.attributes["grad"].data] = op.result
        names = [a.data for a in func.attributes["grads"].data]
        first = len(ret.values) - len(names) - len(func.attributes["input_grads"].data)
        found = {}
        for position, name in enumerate(names, first):
            if name not in targets:
                raise _error(f"mdsl-lower-to-sched: @{func.sym_name.data} returns the gradient of '{name}', "
                             "which is no trainable parameter of the model")
            found[position] = targets[name]
        return found

    def reduced_gradient(self, value: SSAValue) -> SSAValue:
        """The gradient a returned ``all_reduce(g)`` reduces (``g``), the reduction kept for after
        ``g`` is added into its grads buffer (:meth:`reduce_accumulated`); any other value itself."""
        producer = value.owner
        if isinstance(producer, AllReduceOp) and len(list(value.uses)) == 1 and len(list(producer.x.uses)) == 1:
            self.folded_reductions[producer.x] = producer
            return producer.x
        return value

    def reduce_accumulated(self, gradient: SSAValue, target: SSAValue) -> None:
        """The in-place all-reduce of a grads buffer (or its layer's slice) once ``gradient`` is in it."""
        reduction = self.folded_reductions.get(gradient)
        if reduction is not None:
            self.block.add_op(collective_op(reduction, "all_reduce", target, target, op_attr(reduction, "op", "sum")))

    def accumulate(self, value: SSAValue, target: SSAValue) -> None:
        """Add a gradient into its fp32 ``grads`` buffer (or a slice of it): fold it into the GEMM
        or the per-layer pieces that compute it when nothing else reads them (a GEMM of 16-bit
        operands then accumulates in fp32), else launch an add."""
        source = self.buffer(value)
        producer = value.owner
        if len(list(value.uses)) == 1 and isinstance(producer, Operation):
            terms = list(producer.operands)
            if producer.name == "mdsl.graph.add" and len(set(terms)) == len(terms) \
                    and all(x.type.shape == value.type.shape for x in terms) and self.drop_launch(source, "add"):
                self.discard(source.owner)
                for term in terms:  # a gradient summed over uses (tied weights): each term
                    self.accumulate(term, target)
                return
            if producer.name == "mdsl.graph.concat" and _is_outermost(producer) and \
                    all(_sliceable(target, self.shape(piece)) for piece in producer.operands) and \
                    self.drop_launch(source, "concat"):
                self.discard(source.owner)
                offset = 0
                for piece in producer.operands:
                    piece_target = self.slice_of(target, offset, self.shape(piece))
                    self.accumulate(piece, piece_target)
                    offset += piece_target.type.nbytes
                return
            if producer.name == "mdsl.graph.view" and isinstance(source.owner, BufferOp) and \
                    _sliceable(target, self.shape(producer.operands[0])) and \
                    source.owner.alias_of is not None and source.owner.offset.value.data == 0 and not list(source.uses):
                self.discard(source.owner)
                piece = producer.operands[0]
                self.accumulate(piece, self.slice_of(target, 0, self.shape(piece)))
                return
            gemm = self.writer(source, GemmOp)
            if gemm is not None and gemm.beta.value.data == 0.0 and source.type.shape == target.type.shape:
                gemm.operands[len(gemm.operands) - 1] = target
                gemm.beta = FloatAttr(1.0, f64)
                self.discard(source.owner)
                return
            launch = self.writer(source, LaunchOp)
            if launch is not None and entry(launch.kernel.data).accumulates and len(launch.outputs) == 1 \
                    and source.type.shape == target.type.shape:
                launch.operands[len(launch.operands) - 1] = target
                launch.accumulate = UnitAttr()
                self.discard(source.owner)
                return
        self.block.add_op(LaunchOp("add", [target, source], [target], inplace=True))

    def slice_of(self, target: SSAValue, offset: int, shape: tuple[int, ...]) -> SSAValue | None:
        """A view of ``shape`` (in the gradient's fp32) at byte ``offset`` of a ``grads`` buffer or of a
        layer's slice of one (there only whole rows: None otherwise)."""
        btype = BufferType(shape, target.type.dtype)
        if offset == 0 and target.type == btype:
            return target
        if isinstance(target.owner, LayerViewOp):
            return self.layer_rows(target.owner, offset, btype)
        op = BufferOp("grads", btype, offset, btype.nbytes, target)
        op.result.name_hint = target.name_hint
        self.buffers.append(op)
        return op.result

    def layer_rows(self, view: LayerViewOp, offset: int, btype: BufferType) -> SSAValue | None:
        """Rows of a layer view starting ``offset`` bytes into it, shaped ``btype`` (None where that is no
        row range)."""
        shape = view.result.type.shape
        row_bytes = view.result.type.nbytes // shape[0] if shape and shape[0] else 0
        if not row_bytes or offset % row_bytes or btype.shape[1:] != shape[1:] or btype.dtype != view.result.type.dtype:
            return None
        start = offset // row_bytes + (view.row_range[0] if view.row_range else 0)
        rows = LayerViewOp(view.stacked, view.layer, (start, btype.shape[0]))
        rows.result.name_hint = view.result.name_hint
        self.at_body_start(rows)
        return rows.result

    def at_body_start(self, op: Operation) -> None:
        """Insert a view op first in the block being built (before any op that may use it)."""
        if self.block.first_op is None:
            self.block.add_op(op)
        else:
            self.block.insert_op_before(op, self.block.first_op)

    def writer(self, buf: SSAValue, kind: type) -> Operation | None:
        """The one op of ``kind`` (top level) that writes ``buf``, when it is a root buffer no other op touches."""
        owner = buf.owner
        if not isinstance(owner, BufferOp) or owner.alias_of is not None or owner.arena.data != "activations":
            return None
        users = list({id(u.operation): u.operation for u in buf.uses
                      if u.operation.parent_block() is self.block and not isinstance(u.operation, BufferOp)}.values())
        if len(users) != 1 or not isinstance(users[0], kind):
            return None
        op = users[0]
        written = [op.operands[-1]] if isinstance(op, GemmOp) else list(op.outputs)
        return op if written == [buf] else None

    def drop_launch(self, buf: SSAValue, kernel: str) -> bool:
        """Drop the launch of ``kernel`` that alone writes ``buf`` (a concat whose pieces go to slices
        of a gradient buffer, an add whose terms are added into it one by one)."""
        op = self.writer(buf, LaunchOp)
        if op is None or op.kernel.data != kernel:
            return False
        op.detach()
        op.erase()
        return True

    def discard(self, buffer: BufferOp) -> None:
        """Forget a buffer op that nothing uses any more."""
        self.buffers.remove(buffer)
        buffer.erase()

    def run_body(self, block: Block, values: dict[SSAValue, SSAValue]) -> list[SSAValue]:
        """Lower a function body; the values it returns. Consecutive ops marked ``recompute``
        (by ``mdsl-recompute``, or a written backward's ``recompute:`` section) go into one
        ``recompute_segment``."""
        segment: RecomputeSegmentOp | None = None
        for op in block.ops:
            if isinstance(op, ReturnOp):
                return list(op.values)
            name = _segment_name(op)
            if name is None:
                segment = None
                self.lower_op(op)
                continue
            if segment is None or segment.segment.data != name or segment is not self.block.last_op:
                segment = RecomputeSegmentOp(name, layer=self.loops[-1][0].index if self.loops else None)
                self.block.add_op(segment)
            outer, self.block = self.block, segment.body.block
            try:
                self.lower_op(op)
            finally:
                self.block = outer
        raise AssertionError("a function without return")

    # ------------------------------------------------------------------ buffers
    def buffer_type(self, t: TensorType) -> BufferType:
        return concrete_buffer_type(t, self.fp32_storage)

    def new_buffer(self, value: SSAValue, arena: str, attrs: dict[str, Attribute] | None = None,
                   alias_of: SSAValue | None = None, offset: int | None = None,
                   btype: BufferType | None = None) -> SSAValue:
        btype = btype or self.buffer_type(value.type)
        if alias_of is None and arena == "activations" and value is not None and value in self.outputs:
            arena, attrs = "external", {"output": IntegerAttr(self.outputs[value], i64)}
        op = BufferOp(arena, btype, offset, None if alias_of is None else btype.nbytes, alias_of)
        op.attributes |= attrs or {}
        op.result.name_hint = value.name_hint if value is not None else None
        self.buffers.append(op)
        return op.result

    def result_buffer(self, value: SSAValue) -> SSAValue:
        buf = self.new_buffer(value, "activations")
        self.values[value] = buf
        lifetime = find_annotation(value.owner, LifetimeAttr) \
            if isinstance(value.owner, Operation) else None
        if lifetime is not None:  # for mdsl-plan-memory, with where the annotation is
            buf.owner.attributes["lifetime"] = lifetime
            buf.owner.location = value.owner.location
        if isinstance(value.owner, Operation) and find_annotation(value.owner, NoaliasAttr) is not None:
            buf.owner.attributes["noalias"] = UnitAttr()  # mdsl-plan-memory shares its storage with no other
        return buf

    def buffer(self, value: SSAValue) -> SSAValue:
        """The buffer of a graph value, materializing a deferred transpose."""
        if value in self.deferred:
            op = self.deferred.pop(value)
            self.launch(self.signatures[op.name], op)
        return self.values[value]

    def alias(self, value: SSAValue, base: SSAValue, offset: int = 0,
              btype: BufferType | None = None) -> SSAValue | None:
        """A view of ``base`` (a buffer op's result) at a byte offset; None where ``base`` is a layer view."""
        if not isinstance(base.owner, BufferOp):
            return None
        buf = self.new_buffer(value, base.owner.arena.data, alias_of=base, offset=offset, btype=btype)
        self.values[value] = buf
        return buf

    def param(self, op: ParamRefOp) -> SSAValue:
        return self.params[op.param.root_reference.data]

    # ------------------------------------------------------------------ ops
    def lower_op(self, op: Operation) -> None:
        if isinstance(op, ParamRefOp):
            self.values[op.result] = self.param(op)
        elif isinstance(op, StackOp):
            self.layer_loop(op)
        elif isinstance(op, CallOp):
            callee = self.funcs[op.callee.root_reference.data]
            for arg, value in zip(callee.body.block.args, op.arguments):
                self.values[arg] = self.buffer(value)
            for result, value in zip(op.res, self.run_body(callee.body.block, self.values)):
                self.values[result] = self.buffer(value)
        else:
            sig = signature_of_op(op)  # a user primitive's (mdsl.graph.custom): a launch of its reference
            if sig is None:
                raise _unknown_op(op)
            choice = kernel_choice(op, sig.name)  # @kernel: E043 where a binding choice cannot run it
            before = self.block.last_op
            lower = None if sig.custom else getattr(self, f"lower_{sig.name}", None)
            if lower is None or not lower(op):
                self.launch(sig, op)
            if choice is not None:
                self.record_choice(choice, sig.name, before)
        self.assertions(op)

    def assertions(self, op: Operation) -> None:
        """``@assert`` (spec 7.7.1) on the values ``op`` made: one ``mdsl.sched.assert`` per runtime
        check, right after the work that wrote them; a shape check (one the frontend left to the
        bound sizes) is decided here, E027 where it fails. Nothing without ``@assert``."""
        for attr in annotations_of(op):
            if not isinstance(attr, AssertAttr) or not attr["enabled"]:
                continue
            floats = [r for r in op.results if isinstance(r.type, TensorType) and r.type.dtype.is_float]
            for check in attr.checks():
                value = next((r for r in op.results if r.name_hint == check.tensor), None)
                value = value if value is not None else floats[0] if len(floats) == 1 else None
                if value is None:
                    raise _error(f"mdsl-lower-to-sched: @assert checks '{check.tensor}', which {op.name} does not "
                                 "compute", "assert on the tensors the flow computes")
                at = op.location
                where = f"{at.filename.data}:{at.line.data}:{at.column.data}" if isinstance(at, FileLineColLoc) \
                    else None
                if check.kind == "shape":
                    self.shape_assertion(check, value, attr, where)
                    continue
                self.block.add_op(AssertOp(check.kind, self.buffer(value), check.tensor, attr["message"] or "",
                                           check.bound, attr["condition"], where))

    def shape_assertion(self, check, value: SSAValue, attr: AssertAttr, where: str | None) -> None:
        """``x.shape[i] == size`` once the sizes are bound (``size`` an integer or a config value)."""
        shape = self.shape(value)
        size = check.size
        if isinstance(size, str):
            config = self.model.config.data if self.model.config is not None else {}
            found = config.get(size)
            size = found.value.data if isinstance(found, IntegerAttr) else None
        if size is None:
            raise _error(f"mdsl-lower-to-sched: @assert({check.text}) cannot be decided: '{check.size}' is no "
                         "size of the model", "compare with an integer or a config value of the model")
        if not -len(shape) <= check.dim < len(shape) or shape[check.dim] != size:
            place = f" (the flow at {where})" if where else ""
            raise DiagnosticError([Diagnostic("E027", f"@assert({check.text}) fails{place}: '{check.tensor}' is "
                                              f"{list(shape)}: {attr['message'] or 'assertion failed'}", None)])

    def record_choice(self, choice: KernelChoice, primitive: str, before: Operation | None) -> None:
        """Put an op's ``@kernel`` choice on the work ops after ``before`` that run its primitive."""
        op = before.next_op if before is not None else self.block.first_op
        while op is not None:
            runs = op.primitive if isinstance(op, SchedOp) else None
            if runs == primitive or (isinstance(op, GemmOp) and primitive in ("matmul", "batched_matmul",
                                                                               "linear_bias_act")):
                op.attributes |= kernel_choice_attributes(choice.name, choice.fallback, choice.workspace)
            op = op.next_op

    def launch(self, sig: PrimitiveSignature, op: Operation) -> None:
        inputs = [self.buffer(v) for v in op.operands]
        outputs = [self.result_buffer(r) for r in op.results]
        attrs = {k: v for k, v in op.attributes.items() if k not in NOT_PARAMS}
        kernel = entry(sig.name)
        scratch = kernel.scratch_bytes([self.shape(v) for v in inputs], [self.shape(v) for v in outputs],
                                       {k: op_attr(op, k) for k, v in attrs.items()
                                        if isinstance(v, (IntegerAttr, FloatAttr, StringAttr))})
        if scratch:
            btype = BufferType([scratch], DType.INT8)
            space = BufferOp("workspace", btype)
            space.result.name_hint = f"{op.results[0].name_hint or sig.name}_scratch"
            self.buffers.append(space)
            outputs.append(space.result)
            attrs["scratch"] = UnitAttr()
        absent = sig.absent_inputs(op)
        if absent:
            attrs["absent"] = DenseArrayBase.from_list(i64, list(absent))
        self.block.add_op(LaunchOp(sig.name, inputs, outputs, attrs))

    @staticmethod
    def shape(value: SSAValue) -> tuple[int, ...]:
        return tuple(d if isinstance(d, int) else d.evaluate({}) for d in value.type.shape)

    # views ---------------------------------------------------------------
    def lower_view(self, op: Operation) -> bool:
        return self.alias(op.results[0], self.buffer(op.operands[0])) is not None

    lower_contiguous = lower_view

    def lower_cast(self, op: Operation) -> bool:
        """A cast of a parameter (or of its layer's slice) to the buffer type it is held in already
        (a bf16 weight ``mdsl-quantize-frozen`` stores, read in bf16) is that buffer: no copy."""
        source = self.buffer(op.operands[0])
        root = source.owner.stacked if isinstance(source.owner, LayerViewOp) else source
        while isinstance(root.owner, BufferOp) and root.owner.alias_of is not None:
            root = root.owner.alias_of
        if not isinstance(root.owner, BufferOp) or root.owner.arena.data != "params" or \
                source.type != self.buffer_type(op.results[0].type):
            return False
        self.values[op.results[0]] = source
        return True

    def lower_split(self, op: Operation) -> bool:
        if op in self.split_gemms:
            x, weight, scale, alpha = self.split_gemms.pop(op)
            row = 0
            for result in op.results:
                rows = result.type.shape[-1].evaluate({})
                piece = self.weight_rows(weight, row, rows)
                scales = None if scale is None else self.weight_rows(scale, row, rows)
                self.block.add_op(GemmOp(x, piece, self.result_buffer(result), transb=True, alpha=alpha,
                                         scale_b=scales))
                row += rows
            return True
        source = op.operands[0].type
        shape = [d.evaluate({}) for d in source.shape]
        dim = op.attributes["dim"].value.data % len(shape) if "dim" in op.attributes else len(shape) - 1
        if math.prod(shape[:dim]) != 1:
            return False  # the pieces interleave in memory: a split kernel copies them
        base = self.buffer(op.operands[0])
        if not isinstance(base.owner, BufferOp):
            return False
        offset = 0
        for result in op.results:
            btype = self.buffer_type(result.type)
            self.alias(result, base, offset, btype)
            offset += btype.nbytes
        return True

    def lower_transpose(self, op: Operation) -> bool:
        self.deferred[op.results[0]] = op  # a GEMM may take it as a flag
        return True

    def lower_dequantize(self, op: Operation) -> bool:
        self.deferred[op.results[0]] = op  # a GEMM may take it as its scaled B
        return True

    def scaled_operand(self, value: SSAValue, like: SSAValue) -> tuple[SSAValue, SSAValue] | None:
        """(stored values, scales) of a deferred ``dequantize`` into ``like``'s dtype, for a GEMM
        to read as its B (``scale_b``); None for any other value (its buffer is made as usual)."""
        producer = self.deferred.get(value)
        if not isinstance(producer, DequantizeOp) or self.buffer_type(value.type).dtype != like.type.dtype:
            return None
        return self.buffer(producer.operands[0]), self.buffer(producer.operands[1])

    # GEMMs ---------------------------------------------------------------
    def gemm_operand(self, value: SSAValue, transposed: bool) -> tuple[SSAValue, bool]:
        """(buffer, transposed) with a last-two-dims transpose folded into the flag."""
        producer = self.deferred.get(value)
        if producer is not None and _swaps_last_two(producer):
            return self.buffer(producer.operands[0]), not transposed
        return self.buffer(value), transposed

    def lower_matmul(self, op: Operation) -> bool:
        if op_attr(op, "accumulate", False) or op_attr(op, "beta", 0.0) != 0.0:
            return False
        mode = op_attr(op, "transpose", "NN")
        if _keeps_leading_dims(op):  # x @ op(W) over x's rows: x's transpose cannot fold into the flag
            a, transa = self.buffer(op.operands[0]), False
        else:
            a, transa = self.gemm_operand(op.operands[0], mode[0] == "T")
        scaled = self.scaled_operand(op.operands[1], a)
        b, transb = (scaled[0], mode[1] == "T") if scaled else self.gemm_operand(op.operands[1], mode[1] == "T")
        scale = scaled[1] if scaled else None
        split = _only_user_splits_last_dim(op.results[0]) if self.split_projections else None
        if split is not None and split is op.next_op and transb and not transa and len(self.shape(b)) == 2 \
                and find_annotation(op, AssertAttr) is None:  # (an asserted projection is held)
            self.split_gemms[split] = (a, b, scale, op_attr(op, "alpha", 1.0))
            return True
        if transa and len(self.shape(a)) > 2:  # a weight gradient: contract over every leading dim
            a, b = self.flat(a), self.flat(b)
            if a is None or b is None:
                return False
        elif len(self.shape(b)) > 2:
            return False
        bias, epilogue = epilogues.bias_gradient_epilogue(self, op, transa, transb)
        c = self.result_buffer(op.results[0])
        self.block.add_op(GemmOp(a, b, c, bias, transa=transa, transb=transb, alpha=op_attr(op, "alpha", 1.0),
                                 epilogue=epilogue, scale_b=scale))
        return True

    # GEMM epilogues (passes/lower_gemm_epilogues.py) ----------------------
    def lower_linear_bias_act(self, op: Operation) -> bool:
        return epilogues.lower_linear_bias_act(self, op)

    def lower_gelu_backward(self, op: Operation) -> bool:
        return epilogues.lower_gelu_backward(self, op)

    def lower_reduce_sum(self, op: Operation) -> bool:
        return epilogues.lower_reduce_sum(self, op)

    def lower_batched_matmul(self, op: Operation) -> bool:
        if op_attr(op, "accumulate", False):
            return False
        mode = op_attr(op, "transpose", "NN")
        a, transa = self.gemm_operand(op.operands[0], mode[0] == "T")
        b, transb = self.gemm_operand(op.operands[1], mode[1] == "T")
        if self.shape(a)[:-2] != self.shape(b)[:-2]:
            return False
        c = self.result_buffer(op.results[0])
        self.block.add_op(GemmOp(a, b, c, transa=transa, transb=transb, alpha=op_attr(op, "alpha", 1.0)))
        return True

    def weight_rows(self, weight: SSAValue, start: int, count: int) -> SSAValue:
        """Rows ``start .. start+count`` of a 2-d weight: an alias, or a row range of a layer view."""
        shape = self.shape(weight)
        btype = BufferType([count, *shape[1:]], weight.type.dtype)
        if isinstance(weight.owner, LayerViewOp) and weight.owner.rows is None:
            view = LayerViewOp(weight.owner.stacked, weight.owner.layer, (start, count))
            view.result.name_hint = f"{weight.name_hint}_rows{start}" if weight.name_hint else None
            self.block.add_op(view)
            return view.result
        offset = start * btype.nbytes // count if count else 0  # no rows (a size bound to 0): nothing to offset
        op = BufferOp(weight.owner.arena.data, btype, offset, btype.nbytes, weight)
        op.result.name_hint = f"{weight.name_hint}_rows{start}" if weight.name_hint else None
        self.buffers.append(op)
        return op.result

    def flat(self, buf: SSAValue) -> SSAValue | None:
        """A 2-d view ``[rows, cols]`` of a buffer or of a whole layer's slice (None for a row range)."""
        shape = self.shape(buf)
        btype = BufferType([math.prod(shape[:-1]), shape[-1]], buf.type.dtype)
        owner = buf.owner
        if isinstance(owner, LayerViewOp) and owner.rows is None and isinstance(owner.stacked.owner, BufferOp):
            stacked = owner.stacked.type
            flat = BufferOp(owner.stacked.owner.arena.data, BufferType([stacked.shape[0], *btype.shape], btype.dtype),
                            0, stacked.nbytes, owner.stacked)
            flat.result.name_hint = f"{owner.stacked.name_hint}_2d" if owner.stacked.name_hint else None
            self.buffers.append(flat)
            view = LayerViewOp(flat.result, owner.layer)
            self.at_body_start(view)
            return view.result
        if not isinstance(owner, BufferOp):
            return None
        op = BufferOp(buf.owner.arena.data, btype, 0, btype.nbytes, buf)
        op.result.name_hint = f"{buf.name_hint}_2d" if buf.name_hint else None
        self.buffers.append(op)
        return op.result

    # collectives -----------------------------------------------------------
    def lower_all_reduce(self, op: Operation) -> bool:
        if op.operands[0] in self.folded_reductions:  # a returned gradient's: on its grads buffer, in place
            return True
        return self.collective(op, "all_reduce", reduction=op_attr(op, "op", "sum"))

    def lower_all_gather(self, op: Operation) -> bool:
        return self.collective(op, "all_gather", gathered=op.results[0])

    def lower_reduce_scatter(self, op: Operation) -> bool:
        return self.collective(op, "reduce_scatter", gathered=op.operands[0], reduction=op_attr(op, "op", "sum"))

    def collective(self, op: Operation, kind: str, gathered: SSAValue | None = None,
                   reduction: str | None = None) -> bool:
        """``mdsl.sched.collective`` over the op's group into a new buffer. The shards of an
        all_gather or reduce_scatter join along their outermost dim that is not 1 (a whole
        contiguous block per rank), else E029: the transports move contiguous blocks."""
        if gathered is not None:
            shape, dim = self.shape(gathered), op_attr(op, "dim", 0) % len(self.shape(gathered))
            if math.prod(shape[:dim]) != 1:
                raise _error(f"mdsl-lower-to-sched: {kind} along dim {dim} of {list(shape)} interleaves the ranks' "
                             "shards", "gather or scatter along the outermost dim that is not 1")
        source = self.buffer(op.operands[0])
        self.block.add_op(collective_op(op, kind, source, self.result_buffer(op.results[0]), reduction))
        return True

    # attention -----------------------------------------------------------
    def lower_flash_attention(self, op: Operation) -> bool:
        if op.alibi_slopes is not None:
            return False  # ALiBi slopes: the reference kernel
        if op.segments is not None and self.kv_cache:
            raise _error("mdsl-lower-to-sched: an attention of packed rows (segment ids) does not decode with a KV "
                         "cache", "pack sequences for training steps only")
        q, k, v = (self.buffer(x) for x in (op.q, op.k, op.v))
        segments = None if op.segments is None else self.buffer(op.segments)
        out, lse = (self.result_buffer(r) for r in op.results)
        layout = op_attr(op, "layout", "bhtd")
        if self.kv_cache:
            caches = [self.cache_buffer(k, name, layout) for name in ("k", "v")]
            attrs = {name: op.attributes[name] for name in ("causal", "softmax_scale", "window_size")
                     if name in op.attributes}
            if op_attr(op, "softcap", 0.0):
                attrs["softcap"] = op.attributes["softcap"]
            if layout != "bhtd":
                attrs["layout"] = op.attributes["layout"]
            self.block.add_op(LaunchOp("kv_cache_attention", [q, k, v, *caches, self.position],
                                       [out, lse, *caches], attrs, inplace=True))
            return True
        self.block.add_op(AttentionOp(q, k, v, out, lse, segments, **_attention_options(op)))
        return True

    def lower_flash_attention_backward(self, op: Operation) -> bool:
        if op.alibi_slopes is not None:
            return False  # ALiBi slopes: the reference kernel
        d_out, q, k, v, out, lse = (self.buffer(x) for x in (op.d_out, op.q, op.k, op.v, op.out, op.lse))
        segments = None if op.segments is None else self.buffer(op.segments)
        d_q, d_k, d_v = (self.result_buffer(r) for r in op.results)
        self.block.add_op(AttentionBackwardOp(q, k, v, out, d_out, lse, d_q, d_k, d_v, segments,
                                              **_attention_options(op)))
        return True

    def cache_buffer(self, like: SSAValue, role: str, layout: str = "bhtd") -> SSAValue:
        """The cache of ``like``'s keys or values: ``[B, Hkv, capacity, D]`` (whatever ``like``'s
        attention layout), stacked per layer in a loop."""
        b, h, _, d = self.shape(like)
        if layout == "bthd":
            b, _, h, d = self.shape(like)
        self.caches += 1
        return self.decode_state([b, h, self.kv_cache, d], like.type.dtype, f"kv{(self.caches - 1) // 2}.{role}",
                                 f"{role}_cache")

    def decode_state(self, shape: list[int], dtype: DType, tag: str, hint: str) -> SSAValue:
        """A buffer that keeps its contents from one decoding step to the next (``state`` in
        ``external``), stacked per layer in a loop: the layer's slice."""
        if len(self.loops) > 1:
            raise _error("mdsl-lower-to-sched: decoding state inside nested layer loops is not supported")
        if self.loops:
            shape = [self.loops[-1][1], *shape]
        op = BufferOp("external", BufferType(shape, dtype))
        op.attributes["state"] = StringAttr(tag)
        op.result.name_hint = hint
        self.buffers.append(op)
        if not self.loops:
            return op.result
        view = LayerViewOp(op.result, self.loops[-1][0].index)
        self.block.add_op(view)
        return view.result

    # runtime inputs of the schedule's own ----------------------------------
    def next_input(self) -> int:
        """The number of the next external input (after the function's and those added so far)."""
        taken = [b.attributes["input"].value.data for b in self.buffers
                 if isinstance(b.attributes.get("input"), IntegerAttr)]
        return max(taken, default=-1) + 1

    def rng_step(self) -> SSAValue:
        """The program's step counter (an int64 ``[1]`` external input tagged ``rng_step``): what its
        dropout launches key their masks with, one more each training step."""
        if self.rng is None:
            index = IntegerAttr(self.next_input(), i64)
            self.rng = self.new_buffer(None, "external", {"input": index, RNG_STEP: UnitAttr()},
                                       btype=BufferType([1], DType.INT64))
            self.rng.name_hint = RNG_STEP
        return self.rng

    # dropout -------------------------------------------------------------
    def lower_dropout(self, op: Operation) -> bool:
        """Outside training (or with p = 0) an alias of x: no launch. In training a launch reading the
        step counter (the op's ``step``, else the program's ``rng_step``), marked ``keyed_by_layer``
        inside a layer loop: the executors mix the layers of the loops around it into its key."""
        if not dropout_mask.active(op_attr(op, "p", 0.5), op_attr(op, "training", False)):
            base = self.buffer(op.operands[0])
            if self.alias(op.results[0], base) is None:  # a layer view: its result is the same slice
                self.values[op.results[0]] = base
            return True
        step = self.buffer(op.step) if op.step is not None else self.rng_step()
        attrs = {k: v for k, v in op.attributes.items() if k not in NOT_PARAMS}
        if self.loops:
            attrs[KEYED_BY_LAYER] = UnitAttr()
        self.block.add_op(LaunchOp("dropout", [self.buffer(op.operands[0]), step],
                                   [self.result_buffer(op.results[0])], attrs))
        return True

    def lower_clip_norm(self, op: Operation) -> bool:
        """``@gradient(clip=C)``'s clipping: the optimizer's kernels on one tensor, ``global_norm`` into an
        fp32 scalar, ``clip_factor`` (torch's ``clip_grad_norm_`` coefficient), the factor cast to the
        tensor's dtype where that is not fp32, and a ``mul`` by it."""
        x, name = self.buffer(op.operands[0]), op.results[0].name_hint or "clipped"
        norm, factor = (self.workspace_scalar(f"{name}_{what}", DType.FP32) for what in ("norm", "factor"))
        self.block.add_op(LaunchOp("global_norm", [x], [norm]))
        self.block.add_op(LaunchOp("clip_factor", [norm], [factor], {"max_norm": op.attributes["max_norm"]}))
        dtype = x.type.dtype
        if dtype != DType.FP32:
            cast = self.workspace_scalar(f"{name}_factor_{dtype.value}", dtype)
            self.block.add_op(LaunchOp("cast", [factor], [cast]))
            factor = cast
        self.block.add_op(LaunchOp("mul", [x, factor], [self.result_buffer(op.results[0])]))
        return True

    def workspace_scalar(self, name: str, dtype: DType) -> SSAValue:
        """A rank-0 buffer in ``workspace``."""
        op = BufferOp("workspace", BufferType([], dtype))
        op.result.name_hint = name
        self.buffers.append(op)
        return op.result

    # recurrent state (Mamba) ---------------------------------------------
    def steps_input(self) -> SSAValue:
        """The ``valid`` input of a decoding program with recurrent state: how many of the run's
        steps are real (the rest pad the shape bucket and must not reach the state)."""
        if self.valid is None:  # the input after the position (and any other runtime input)
            assert self.position is not None and isinstance(self.position.owner, BufferOp)
            index = IntegerAttr(self.next_input(), i64)
            self.valid = self.new_buffer(None, "external", {"input": index}, btype=BufferType([1], DType.INT32))
            self.valid.name_hint = "valid"
        return self.valid

    def lower_mamba_conv1d(self, op: Operation) -> bool:
        if not self.kv_cache or op.conv_state is not None:
            return False
        x, weight = self.buffer(op.x), self.buffer(op.weight)
        b, d, _ = self.shape(x)
        k = op_attr(op, "kernel_size", 4)
        state = self.decode_state([b, d, k - 1], x.type.dtype, f"conv{self.recurrent}", "conv_state")
        self.recurrent += 1
        bias = [self.buffer(op.bias)] if op.bias is not None else []
        attrs = {name: op.attributes[name] for name in ("kernel_size", "activation") if name in op.attributes}
        self.block.add_op(LaunchOp("mamba_conv1d_step", [x, weight, state, self.position, self.steps_input(), *bias],
                                   [self.result_buffer(op.y), state], attrs, inplace=True))
        return True

    def lower_mamba_selective_scan(self, op: Operation) -> bool:
        if not self.kv_cache or op.ssm_state is not None:
            return False
        operands = [self.buffer(v) for v in op.operands]
        b, d, _ = self.shape(operands[0])
        n = self.shape(operands[2])[1]
        state = self.decode_state([b, d, n], operands[0].type.dtype, f"ssm{self.recurrent}", "ssm_state")
        self.recurrent += 1
        self.values[op.ssm_state_out] = state
        attrs = {name: op.attributes[name] for name in ("chunk_size",) if name in op.attributes}
        self.block.add_op(LaunchOp("mamba_selective_scan_step", [*operands, state, self.position, self.steps_input()],
                                   [self.result_buffer(op.y), state], attrs, inplace=True))
        return True

    # stacks --------------------------------------------------------------
    def layer_loop(self, op: StackOp) -> None:
        """A ``layer_loop`` (``reverse`` for a reverse stack); a collected result is a stacked
        ``activations`` buffer the body writes layer by layer, or, for a parameter gradient,
        added into the layer's slice of its ``grads`` buffer."""
        body = self.funcs[op.body.root_reference.data]
        count = op.count.data.evaluate({})
        state = [self.state_buffer(v, op) for v in op.carried]
        shared = [self.buffer(v) for v in op.shared]
        stacked = [self.buffer(v) for v in op.per_layer]
        collected = [self.in_loop_grads.get(r) or self.saved_buffer(r) for r in op.collected]
        loop = LayerLoopOp(0, count, reverse=op.reverse is not None)
        outer, self.block = self.block, loop.body.block
        self.loops.append((loop, count))
        views = [LayerViewOp(s, loop.index) for s in stacked]
        self.block.add_ops(views)
        for arg, buf in zip(body.body.block.args, [*state, *shared, *(v.result for v in views)]):
            self.values[arg] = buf
        returned = self.run_body(body.body.block, self.values)
        for value, result, target in zip(returned[len(state):], op.collected, collected, strict=True):
            layer = LayerViewOp(target, loop.index)
            self.at_body_start(layer)
            if result in self.in_loop_grads:
                self.accumulate(value, layer.result)
                self.reduce_accumulated(result, layer.result)
            else:
                self.write_layer(value, layer.result, state)
        for value, target in zip(returned, state):  # after the collected: they may read a carried input
            source = self.buffer(value)
            if source is not target:
                self.block.add_op(CopyOp(source, target))
        self.loops.pop()
        self.block = outer
        self.block.add_op(loop)
        for result, buf in zip([*op.carried_results, *op.collected], [*state, *collected]):
            self.values[result] = buf

    def saved_buffer(self, value: SSAValue) -> SSAValue:
        """A stacked ``activations`` buffer of saved tensors (marked ``saved`` for the memory report)."""
        buf = self.new_buffer(value, "activations")
        buf.owner.attributes["saved"] = UnitAttr()
        return buf

    def write_layer(self, value: SSAValue, layer: SSAValue, state: list[SSAValue]) -> None:
        """Make the layer's slice of a collected result hold ``value``: its buffer becomes that slice
        where only ops of this loop body touch it, else a copy."""
        source = self.buffer(value)
        owner = source.owner
        users = [u.operation for u in source.uses]
        if (isinstance(owner, BufferOp) and owner.alias_of is None and owner.arena.data == "activations"
                and source not in state and users
                and all(not isinstance(u, BufferOp) and self.block.is_ancestor(u) for u in users)):
            source.replace_all_uses_with(layer)
            for key, buf in list(self.values.items()):
                if buf is source:
                    self.values[key] = layer
            self.discard(owner)
            return
        self.block.add_op(CopyOp(source, layer))

    def state_buffer(self, value: SSAValue, stack: StackOp) -> SSAValue:
        """The buffer a loop carries a value in: the value's own when the stack is its last use."""
        source = self.buffer(value)
        owner = source.owner
        last_use = all(use.operation is stack or use.operation.is_before_in_block(stack) for use in value.uses)
        if (last_use and list(stack.carried).count(value) == 1 and isinstance(owner, BufferOp)
                and owner.alias_of is None and owner.arena.data == "activations"):
            return source
        state = self.new_buffer(value, "activations")
        self.block.add_op(CopyOp(source, state))
        return state


def _attention_options(op: Operation) -> dict[str, bool | int | float | str | None]:
    """The ``attention``/``attention_backward`` attributes of a graph attention op (forward or backward)."""
    window = op.attributes.get("window_size")
    scale = op.attributes.get("softmax_scale")
    return {"causal": op_attr(op, "causal", True), "window": window.value.data if window is not None else 0,
            "scale": scale.value.data if scale is not None else None, "layout": op_attr(op, "layout", "bhtd"),
            "softcap": op_attr(op, "softcap", 0.0)}


def _only_user_splits_last_dim(value: SSAValue) -> Operation | None:
    """The split that is ``value``'s only use, when it splits the last dim. (The GEMMs run where the
    split stands, so the caller also asks that it follows the matmul: nothing may write the
    matmul's inputs in between.)"""
    uses = list(value.uses)
    if len(uses) != 1 or uses[0].operation.name != "mdsl.graph.split":
        return None
    split = uses[0].operation
    rank = len(value.type.shape)
    dim = split.attributes["dim"].value.data if "dim" in split.attributes else -1
    return split if dim % rank == rank - 1 else None


def _segment_name(op: Operation) -> str | None:
    """The recompute segment an op belongs to: ``recompute = "name"``; a written backward's
    ``recompute`` unit attribute names it after the op's first result."""
    mark = op.attributes.get("recompute")
    if isinstance(mark, StringAttr):
        return mark.data
    if isinstance(mark, UnitAttr):
        return op.results[0].name_hint or "recompute" if op.results else "recompute"
    return None


def _sliceable(target: SSAValue, shape: tuple[int, ...]) -> bool:
    """Whether a piece shaped ``shape`` of a gradient target has a view of its own: any piece of a
    ``grads`` buffer, whole rows of a layer's slice of one."""
    return not isinstance(target.owner, LayerViewOp) or tuple(shape[1:]) == tuple(target.type.shape[1:])


def _collected_once(value: SSAValue) -> bool:
    """Whether ``value`` is a stack's collected result that only the function's return reads."""
    return isinstance(value.owner, StackOp) and value in value.owner.collected and len(list(value.uses)) == 1


def _is_outermost(concat: Operation) -> bool:
    """Whether a concat joins its pieces along dim 0 (one after another in memory)."""
    return op_attr(concat, "dim", -1) % len(concat.results[0].type.shape) == 0


def _is_output(buf: SSAValue, index: int) -> bool:
    attr = buf.owner.attributes.get("output") if isinstance(buf.owner, BufferOp) else None
    return isinstance(attr, IntegerAttr) and attr.value.data == index


def _keeps_leading_dims(op: Operation) -> bool:
    """A matmul whose A and C have leading dims (``x @ op(W)`` over every row of x), not a weight
    gradient that contracts them (``dY^T X`` into a matrix)."""
    return len(op.operands[0].type.shape) > 2 and len(op.results[0].type.shape) > 2


def _swaps_last_two(op: Operation) -> bool:
    rank = len(op.operands[0].type.shape)
    dims = {op.attributes["dim0"].value.data % rank, op.attributes["dim1"].value.data % rank}
    return dims == {rank - 2, rank - 1}
