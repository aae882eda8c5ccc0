"""The binding layer of the CUDA executor: a planned ``mdsl.sched`` program as device commands.

:func:`bind_program` turns the program, once, into a flat list of commands
(:mod:`modeldsl.runtime.cuda_commands`; layer loops unrolled as the CPU executor unrolls them:
the same walk, :mod:`modeldsl.dialects.sched_walk`). Every buffer becomes a :class:`TensorRef`
at its arena's base plus its planned offset. A ``launch`` becomes a :class:`KernelCommand`
holding its ``kernels/cuda.py`` plan (its scratch in the executor's one workspace allocation,
sized by the largest plan, its device tables packed and uploaded once), or, where the primitive
has no CUDA kernel or the plan raises ``NotCovered``, a reference fallback (counted in
:attr:`CudaExecutor.fallbacks`, warned once per primitive). Launches of layout
primitives (transpose, permute, concat, split, contiguous, copy, view) become device copies
(:class:`StridedCopyCommand`, :class:`CopyCommand`) and ``zeros``/``ones``/``fill`` memsets (a
``flash_attention`` launch, with its ALiBi slopes, is a kernel launch: mdsl-lower-to-sched makes
attention without them the ``attention``/``attention_backward`` ops, and those ops with the segment
ids of packed rows launches of ``flash_attention``/``flash_attention_backward`` on attention.cu's
``_seg`` kernels, as cuDNN's SDPA takes no ids); a fused primitive
with a composite lowering (:mod:`modeldsl.runtime.cuda_composites`: the chunked LM-head loss)
becomes a :class:`CompositeCommand` of GEMMs and kernel launches working in the launch's
planned scratch. A ``gemm``
is a :class:`GemmCommand`, ``attention``/``attention_backward`` attention commands,
``memset``/``copy`` memory commands. A kernel choice mdsl-lower-to-sched recorded from ``@kernel``
(``implementation``, ``fallback = false``, ``workspace_bytes``) rides on the command
(:attr:`Command.choice`): the device runs attention with the chosen implementation, and a
binding choice that cannot run (no plan, cuDNN refusing it) is :class:`KernelUnavailable` (E043)
instead of a fallback.
"""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from xdsl.dialects.builtin import IntegerAttr, StringAttr
from xdsl.ir import Operation, SSAValue

from modeldsl.dialects.sched import (
    LAUNCH_ATTRIBUTES,
    AssertOp,
    AttentionBackwardOp,
    AttentionOp,
    BufferOp,
    BufferType,
    CopyOp,
    GemmOp,
    LaunchOp,
    LayerViewOp,
    MemsetOp,
    ProgramOp,
)
from modeldsl.dialects.sched_walk import TOP, At, ScheduleVisitor, layer_params, visit
from modeldsl.kernel_choice import KernelChoice
from modeldsl.kernels import cuda
from modeldsl.kernels.registry import entry
from modeldsl.primitives import lookup_primitive
from modeldsl.runtime.cuda_commands import (
    AssertCommand,
    AttentionBackwardCommand,
    AttentionCommand,
    Command,
    CompositeCommand,
    CopyCommand,
    GemmCommand,
    KernelCommand,
    MemsetCommand,
    StridedCopyCommand,
    TensorRef,
    plan_kernel,
)
from modeldsl.runtime.cuda_composites import COMPOSITES
from modeldsl.runtime.executor import DTYPE_KEYWORDS, SHAPE_KEYWORDS, SHAPES_KEYWORDS, ExecutionError, attribute_value
from modeldsl.runtime.sched_executor import numpy_dtype, root_offset

TAGS = ("param", "grad", "moment", "master")


# ----------------------------------------------------------------------------
# Binding a launch
# ----------------------------------------------------------------------------


def reference_call(name: str, op: LaunchOp, inputs: list[TensorRef], outputs: list[TensorRef]
                   ) -> tuple[list[TensorRef | None], dict[str, Any]]:
    """The reference's positional buffers (None for an absent optional) and keyword parameters,
    exactly as the CPU executor passes them."""
    sig = lookup_primitive(name)
    if sig is None:  # a schedule-level kernel: operands and attributes as they stand
        return list(inputs), {k: attribute_value(v, "") for k, v in op.attributes.items()
                              if k not in LAUNCH_ATTRIBUTES}
    arguments: list[TensorRef | None] = []
    for group in sig.group_operands(inputs, op.absent_slots):
        arguments.extend(group if isinstance(group, list) else [group])
    params = {p.name: attribute_value(op.attributes[p.name], p.kind) for p in sig.params if p.name in op.attributes}
    if sig.name in SHAPE_KEYWORDS:
        params["shape"] = outputs[0].shape
    if sig.name in DTYPE_KEYWORDS:
        params["dtype"] = outputs[0].dtype
    if sig.name in SHAPES_KEYWORDS:
        params["shapes"] = tuple(o.shape for o in outputs)
    return arguments, params


def with_kernel(command: AttentionCommand) -> AttentionCommand:
    """Give an attention command its plain CUDA kernel's plan (used where cuDNN cannot run it)."""
    command.kernel = command.kernel_launch()
    plan_kernel(command.kernel)
    return command


def fill_launch(name: str, outputs: list[TensorRef], params: dict[str, Any]) -> Command | None:
    """``zeros``, ``ones`` and ``fill`` as memsets."""
    values = {"zeros": 0.0, "ones": 1.0, "fill": params.get("value")}
    if name not in values or len(outputs) != 1 or values[name] is None:
        return None
    return MemsetCommand(target=outputs[0], value=float(values[name]))


# ----------------------------------------------------------------------------
# Layout launches as device copies
# ----------------------------------------------------------------------------

Piece = tuple[int, int, tuple[int, ...], tuple[int, ...], tuple[int, ...]]  # dst, src, shape, dst/src strides


def _dim(dim: int, rank: int) -> int:
    if not -rank <= dim < rank:
        raise ValueError(f"dim {dim} of a rank-{rank} tensor")
    return dim % rank


def permuted_piece(x: TensorRef, out: TensorRef, order: Sequence[int]) -> list[Piece]:
    """``out[i] = x[order applied to i]``: result dim k is input dim order[k]."""
    if sorted(order) != list(range(len(x.shape))) or tuple(x.shape[d] for d in order) != out.shape:
        raise ValueError(f"permutation {list(order)} of {x.shape} is not {out.shape}")
    return [(out.address, x.address, out.shape, out.strides, tuple(x.strides[d] for d in order))]


def transpose_pieces(x: TensorRef, out: TensorRef, params: dict[str, Any]) -> list[Piece]:
    order = list(range(len(x.shape)))
    d0, d1 = _dim(params["dim0"], len(order)), _dim(params["dim1"], len(order))
    order[d0], order[d1] = order[d1], order[d0]
    return permuted_piece(x, out, order)


def concat_pieces(inputs: list[TensorRef], out: TensorRef, dim: int) -> list[Piece]:
    dim, at, pieces = _dim(dim, len(out.shape)), 0, []
    for x in inputs:
        if x.shape[:dim] + x.shape[dim + 1:] != out.shape[:dim] + out.shape[dim + 1:]:
            raise ValueError(f"cannot concatenate {x.shape} into {out.shape}")
        pieces.append((out.address + at * out.strides[dim] * out.itemsize, x.address, x.shape, out.strides, x.strides))
        at += x.shape[dim]
    if at != out.shape[dim]:
        raise ValueError(f"the pieces fill {at} of {out.shape[dim]}")
    return pieces


def split_pieces(x: TensorRef, outputs: list[TensorRef], dim: int) -> list[Piece]:
    dim, at, pieces = _dim(dim, len(x.shape)), 0, []
    for out in outputs:
        if out.shape[:dim] + out.shape[dim + 1:] != x.shape[:dim] + x.shape[dim + 1:]:
            raise ValueError(f"cannot split {out.shape} out of {x.shape}")
        pieces.append((out.address, x.address + at * x.strides[dim] * x.itemsize, out.shape, out.strides, x.strides))
        at += out.shape[dim]
    return pieces


def flat_piece(x: TensorRef, out: TensorRef) -> list[Piece]:
    if x.numel != out.numel:
        raise ValueError(f"{x.shape} and {out.shape} differ in size")
    return [(out.address, x.address, (x.numel,), (1,), (1,))]


def layout_pieces(name: str, inputs: list[TensorRef], outputs: list[TensorRef], params: dict[str, Any]
                  ) -> list[Piece] | None:
    if name == "transpose":
        return transpose_pieces(inputs[0], outputs[0], params)
    if name == "permute":
        return permuted_piece(inputs[0], outputs[0], [_dim(d, len(inputs[0].shape)) for d in params["dims"]])
    if name == "concat":
        return concat_pieces(inputs, outputs[0], params.get("dim", -1))
    if name == "split":
        return split_pieces(inputs[0], outputs, params.get("dim", -1))
    if name in ("contiguous", "copy", "view"):
        return flat_piece(inputs[0], outputs[0])
    return None


def coalesced(shape: Sequence[int], dst: Sequence[int], src: Sequence[int]
              ) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """The same copy over fewer dims: size-1 dims dropped, neighbours that both layouts walk
    contiguously merged."""
    dims = [(n, d, s) for n, d, s in zip(shape, dst, src) if n != 1]
    merged: list[list[int]] = []
    for n, d, s in dims:
        if merged and merged[-1][1] == n * d and merged[-1][2] == n * s:
            merged[-1] = [merged[-1][0] * n, d, s]
        else:
            merged.append([n, d, s])
    merged = merged or [[1, 1, 1]]
    return tuple(m[0] for m in merged), tuple(m[1] for m in merged), tuple(m[2] for m in merged)


def copy_command(piece: Piece, itemsize: int) -> Command:
    dst, src, shape, dst_strides, src_strides = piece
    shape, dst_strides, src_strides = coalesced(shape, dst_strides, src_strides)
    if len(shape) == 1 and dst_strides == src_strides == (1,):
        return CopyCommand(dst=dst, src=src, nbytes=shape[0] * itemsize)
    return StridedCopyCommand(dst=dst, src=src, shape=shape, dst_strides=dst_strides, src_strides=src_strides,
                              itemsize=itemsize)


def layout_launch(name: str, arguments: list[TensorRef | None], outputs: list[TensorRef],
                  params: dict[str, Any]) -> list[Command] | None:
    """Transpose, permute, concat, split, contiguous, copy and view as device copies (same dtype in
    and out, no output overlapping an input); None when the launch is not one of those."""
    inputs = [a for a in arguments if a is not None]
    if not inputs or len({np.dtype(r.dtype) for r in (*inputs, *outputs)}) != 1:
        return None
    if any(out.overlaps(x) for out in outputs for x in inputs):
        return None
    try:
        pieces = layout_pieces(name, inputs, outputs, params)
    except (ValueError, KeyError, IndexError, TypeError):
        return None
    if pieces is None:
        return None
    return [copy_command(piece, inputs[0].itemsize) for piece in pieces]


def bind_launch(op: LaunchOp, refs: Mapping[SSAValue, TensorRef], at: At = TOP) -> list[Command]:
    """The commands of a launch where ``at`` says it runs (a launch marked ``keyed_by_layer``,
    dropout's, gets the layers of its unrolled loops as its ``layers``)."""
    name = op.kernel.data
    try:
        reference = entry(name).reference
    except KeyError as err:
        raise ExecutionError(str(err)) from None
    inputs, outputs = [refs[v] for v in op.inputs], [refs[v] for v in op.outputs]
    # the executor's workspace holds the plans' scratch; a composite works in the planned one
    scratch = outputs.pop() if "scratch" in op.attributes else None
    arguments, params = reference_call(name, op, inputs, outputs)
    params.update(layer_params(op, at))
    choice = recorded_choice(op)
    fill = fill_launch(name, outputs, params)
    if fill is not None:
        return [fill]
    copies = layout_launch(name, arguments, outputs, params)
    if copies is not None:
        return copies
    command = KernelCommand(kernel=name, arguments=tuple(arguments), outputs=tuple(outputs), params=params,
                            reference=reference, accumulate=op.accumulate is not None, choice=choice)
    composite = composite_launch(command, scratch)
    if composite is not None:
        return [composite]
    plan_kernel(command)
    return [command]


def composite_launch(command: KernelCommand, scratch: TensorRef | None) -> Command | None:
    """A launch of a fused primitive that runs as several device commands (:data:`COMPOSITES`), None
    for the others; where its parts cannot be built, the launch itself with the reason it falls back."""
    lower = COMPOSITES.get(command.kernel)
    if lower is None:
        return None
    try:
        return lower(command, scratch)
    except cuda.NotCovered as err:
        command.fallback = str(err)
        return command


# ----------------------------------------------------------------------------
# Binding a program
# ----------------------------------------------------------------------------


@dataclass
class BoundProgram:
    """A program as device work: its commands in order and where its buffers are."""

    commands: list[Command] = field(default_factory=list)
    inputs: list[TensorRef] = field(default_factory=list)
    outputs: list[TensorRef] = field(default_factory=list)
    tagged: dict[str, dict[str, TensorRef]] = field(default_factory=lambda: {tag: {} for tag in TAGS})
    state: dict[str, TensorRef] = field(default_factory=dict)
    buffers: dict[str, TensorRef] = field(default_factory=dict)  # top-level buffers by their SSA name

    @property
    def kernels(self) -> list[KernelCommand]:
        """Every launch with a CUDA plan: the kernel commands, the attention kernels and the composites' launches."""
        launches = [c.kernel if isinstance(c, AttentionCommand) else c for c in self.commands]
        launches = [k for c in launches for k in (c.kernels if isinstance(c, CompositeCommand) else [c])]
        return [c for c in launches if isinstance(c, KernelCommand) and c.plan is not None]

    @property
    def scratch_bytes(self) -> int:
        return max((c.plan.scratch_bytes for c in self.kernels), default=0)


class Binder:
    """Turns a planned program into a :class:`BoundProgram` over arenas at known device addresses."""

    def __init__(self, program: ProgramOp, bases: dict[str, int], state: dict[str, TensorRef] | None = None):
        self.program, self.bases = program, bases
        self.bound = BoundProgram(state=dict(state or {}))
        self.refs: dict[SSAValue, TensorRef] = {}

    def bind(self) -> BoundProgram:
        for op in self.program.body.block.ops:
            if isinstance(op, BufferOp):
                self.place(op)
            else:
                self.bound.commands += self.compile(op)
        return self.bound

    def place(self, op: BufferOp) -> None:
        btype: BufferType = op.result.type
        root, start = root_offset(op)
        if root.offset is None:
            raise ExecutionError(f"buffer %{root.result.name_hint or '?'} has no offset: run mdsl-plan-memory first")
        ref = TensorRef(self.bases[root.arena.data] + start, tuple(btype.shape), numpy_dtype(btype.dtype))
        state = op.attributes.get("state")
        if isinstance(state, StringAttr):
            given = self.bound.state.setdefault(state.data, ref)
            if (given.shape, np.dtype(given.dtype)) != (ref.shape, np.dtype(ref.dtype)):
                raise ExecutionError(f"state '{state.data}' is {given.shape} {np.dtype(given.dtype).name}, the "
                                     f"program needs {ref.shape} {np.dtype(ref.dtype).name}")
            ref = given
        self.refs[op.result] = ref
        if op.result.name_hint:
            self.bound.buffers[op.result.name_hint] = ref
        for role, where in (("input", self.bound.inputs), ("output", self.bound.outputs)):
            index = op.attributes.get(role)
            if isinstance(index, IntegerAttr):
                where.extend([None] * (index.value.data + 1 - len(where)))
                where[index.value.data] = ref
        for tag in TAGS:
            name = op.attributes.get(tag)
            if isinstance(name, StringAttr):
                self.bound.tagged[tag][name.data] = ref

    def compile(self, op: Operation) -> list[Command]:
        """The commands of one top-level op (a layer loop unrolled: its body's commands for each layer)."""
        compiler = CommandCompiler(self.refs)
        visit(op, compiler)
        return compiler.commands


class CommandCompiler(ScheduleVisitor):
    """Binds the ops of one top-level op to device commands, in order (the walk unrolls layer
    loops). The references of layer slices live in ``refs`` over the binder's buffer references."""

    unroll = True

    def __init__(self, refs: dict[SSAValue, TensorRef]):
        self.refs: ChainMap[SSAValue, TensorRef] = ChainMap({}, refs)
        self.commands: list[Command] = []

    def layer_view(self, op: LayerViewOp, at: At) -> None:
        view, rows = self.refs[op.stacked].layer(at.layer(op.layer)), op.row_range
        self.refs[op.result] = view if rows is None else view.rows(*rows)

    def launch(self, op: LaunchOp, at: At) -> None:
        self.commands += bind_launch(op, self.refs, at)

    def gemm(self, op: GemmOp, at: At) -> None:
        self.commands.append(bind_gemm(op, self.refs))

    def attention(self, op: AttentionOp, at: At) -> None:
        self.commands.append(bind_attention(op, self.refs))

    def attention_backward(self, op: AttentionBackwardOp, at: At) -> None:
        self.commands.append(bind_attention(op, self.refs))

    def copy(self, op: CopyOp, at: At) -> None:
        self.commands.append(bind_copy(op, self.refs))

    def memset(self, op: MemsetOp, at: At) -> None:
        value = op.attributes.get("value")
        self.commands.append(MemsetCommand(target=self.refs[op.target],
                                           value=value.value.data if value is not None else 0.0))

    def check(self, op: AssertOp, at: At) -> None:
        """An ``@assert``'s check, on a host copy of the buffer where it stands."""
        self.commands.append(AssertCommand(target=self.refs[op.value], op=op, layers=tuple(at.layers)))

    def buffer(self, op: BufferOp, at: At) -> None:
        self.other(op, at)  # buffers are placed at the top level

    def work(self, op: Operation, at: At) -> None:
        self.other(op, at)

    def other(self, op: Operation, at: At) -> None:
        raise ExecutionError(f"the CUDA executor cannot run {op.name}")


def bind_gemm(op: GemmOp, refs: Mapping[SSAValue, TensorRef]) -> GemmCommand:
    bias, aux, scale = (refs[value] if value is not None else None for value in (op.bias, op.aux, op.scale_b))
    return GemmCommand(a=refs[op.a], b=refs[op.b], c=refs[op.c], bias=bias, aux=aux, scale_b=scale,
                       transa=bool(op.transa.value.data), transb=bool(op.transb.value.data),
                       alpha=op.alpha.value.data, beta=op.beta.value.data, epilogue=op.epilogue.data,
                       choice=recorded_choice(op))


def recorded_choice(op: Operation) -> KernelChoice | None:
    """The ``@kernel`` choice mdsl-lower-to-sched recorded on a work op (``implementation``, ...)."""
    implementation = op.attributes.get("implementation")
    if not isinstance(implementation, StringAttr):
        return None
    fallback, workspace = op.attributes.get("fallback"), op.attributes.get("workspace_bytes")
    return KernelChoice(implementation.data, fallback is None or bool(fallback.value.data),
                        workspace.value.data if isinstance(workspace, IntegerAttr) else None)


def bind_attention(op: AttentionOp | AttentionBackwardOp, refs: Mapping[SSAValue, TensorRef]
                   ) -> AttentionCommand | KernelCommand:
    options = {"causal": bool(op.causal.value.data), "window": op.window.value.data,
               "softmax_scale": op.scale.value.data if op.scale is not None else None, "layout": op.layout.data,
               "choice": recorded_choice(op), "softcap": op.softcap.value.data if op.softcap is not None else 0.0}
    if op.segments is not None:
        return bind_packed_attention(op, refs, options)
    if isinstance(op, AttentionOp):
        return with_kernel(AttentionCommand(q=refs[op.q], k=refs[op.k], v=refs[op.v], out=refs[op.out],
                                            lse=refs[op.lse], **options))
    return with_kernel(AttentionBackwardCommand(q=refs[op.q], k=refs[op.k], v=refs[op.v], out=refs[op.out],
                                                d_out=refs[op.d_out], lse=refs[op.lse], d_q=refs[op.d_q],
                                                d_k=refs[op.d_k], d_v=refs[op.d_v], **options))


def bind_packed_attention(op: AttentionOp | AttentionBackwardOp, refs: Mapping[SSAValue, TensorRef],
                          options: dict[str, Any]) -> KernelCommand:
    """Attention of packed rows (segment ids): a launch of the ``flash_attention`` primitive (or its backward)
    with the ids, planned on attention.cu's ``_seg`` kernels (cuDNN's SDPA takes no ids), or where the plan
    declines it (ALiBi, D > 256), the reference fallback, counted and warned."""
    params = {"causal": options["causal"], "softmax_scale": options["softmax_scale"],
              "window_size": options["window"] or None, "layout": options["layout"], "softcap": options["softcap"]}
    segments = refs[op.segments]
    if isinstance(op, AttentionOp):
        command = KernelCommand(kernel="flash_attention",
                                arguments=(refs[op.q], refs[op.k], refs[op.v], None, segments),
                                outputs=(refs[op.out], refs[op.lse]), params=params,
                                reference=entry("flash_attention").reference, choice=options["choice"])
    else:
        command = KernelCommand(kernel="flash_attention_backward",
                                arguments=(refs[op.d_out], refs[op.q], refs[op.k], refs[op.v], refs[op.out],
                                           refs[op.lse], None, segments),
                                outputs=(refs[op.d_q], refs[op.d_k], refs[op.d_v]), params=params,
                                reference=entry("flash_attention_backward").reference, choice=options["choice"])
    plan_kernel(command)
    return command


def bind_copy(op: CopyOp, refs: Mapping[SSAValue, TensorRef]) -> Command:
    """A copy of bytes (all of them, or the leading ``bytes``); between dtypes, a cast."""
    src, dst = refs[op.src], refs[op.dst]
    if op.nbytes is not None:
        return CopyCommand(dst=dst.address, src=src.address, nbytes=op.nbytes.value.data)
    if np.dtype(src.dtype) == np.dtype(dst.dtype):
        return CopyCommand(dst=dst.address, src=src.address, nbytes=src.nbytes)
    return cast_command(src, dst)


def cast_command(src: TensorRef, dst: TensorRef) -> KernelCommand:
    """``dst`` = ``src`` in ``dst``'s dtype (a launch of the cast kernel)."""
    command = KernelCommand(kernel="cast", arguments=(src,), outputs=(dst,), params={"dtype": dst.dtype},
                            reference=entry("cast").reference)
    plan_kernel(command)
    return command


def bind_program(program: ProgramOp, bases: dict[str, int], state: dict[str, TensorRef] | None = None
                 ) -> BoundProgram:
    """The binding layer: ``program`` as device commands over arenas at ``bases`` (arena -> address)."""
    return Binder(program, bases, state).bind()
