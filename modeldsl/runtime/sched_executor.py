"""The CPU executor of a planned ``mdsl.sched`` program.

Each arena is allocated once, as one numpy byte array of its planned size;
every buffer is a numpy view at its planned offset (an alias views its root
at its byte offset, a ``layer_view`` a slice of a stacked buffer). The
constructor turns the program into a flat list of steps, layer loops
unrolled (the schedule walker's order, :mod:`modeldsl.dialects.sched_walk`),
with every view made in advance. A step is the primitive's fast
CPU kernel (:mod:`modeldsl.kernels.cpu`) where it has one for these
operands: it writes into the planned output views, takes its temporaries from
the pool's workspace and splits its rows over the pool's threads, so a
warmed-up :meth:`ScheduleExecutor.execute` allocates nothing. Otherwise (a
bf16 operand, a layout the kernel does not take) the step runs the numpy
reference of the kernel registry and copies its results in. BLAS runs on one
thread while the steps run (:mod:`modeldsl.runtime.threads`): the parallelism
is the pool's, sized ``--threads`` / ``MDSL_NUM_THREADS`` / the usable cores.
A kernel choice recorded from ``@kernel`` (``implementation``, ``fallback``,
``workspace_bytes``: cuDNN's SDPA or the own attention kernel, ...) changes
nothing here, only which kernel the CUDA executor runs.
"""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from xdsl.dialects.builtin import IntegerAttr, StringAttr
from xdsl.ir import Attribute, Operation, SSAValue

from modeldsl.dialects.dtypes import DType
from modeldsl.dialects.sched import (
    LAUNCH_ATTRIBUTES,
    AssertOp,
    AttentionBackwardOp,
    AttentionOp,
    BufferOp,
    BufferType,
    CollectiveOp,
    CopyOp,
    GemmOp,
    LaunchOp,
    LayerViewOp,
    MemsetOp,
    ProgramOp,
)
from modeldsl.dialects.sched_walk import TOP, At, ScheduleVisitor, layer_params, visit
from modeldsl.kernels.cpu import cpu_kernel
from modeldsl.kernels.cpu.compiled import enabled as compiled_kernels_enabled
from modeldsl.kernels.cpu.gemm import gemm as cpu_gemm
from modeldsl.kernels.cpu.optim import fuse_optimizer_steps
from modeldsl.kernels.cpu.pool import BUFSIZE, pool_of
from modeldsl.kernels.reference import flash_attention, flash_attention_backward, gemm
from modeldsl.kernels.registry import entry
from modeldsl.primitives import lookup_primitive
from modeldsl.runtime import assertions, distributed
from modeldsl.runtime.executor import (
    DTYPE_KEYWORDS,
    NUMPY_DTYPES,
    SHAPE_KEYWORDS,
    SHAPES_KEYWORDS,
    ExecutionError,
    attribute_value,
)
from modeldsl.runtime.threads import blas_threads, pool_size

Step = Callable[[], None]


class ScheduleExecutor:
    """Runs one planned program; ``execute`` binds the inputs and returns views of the outputs."""

    def __init__(self, program: ProgramOp, params: dict[str, np.ndarray] | None = None,
                 arenas: dict[str, np.ndarray] | None = None, state: dict[str, np.ndarray] | None = None):
        """``arenas`` may give arenas shared with other programs (the params of every
        profile of a model); the others are allocated here, once. ``state`` gives arrays
        for state buffers (``state = "name"``: KV caches) that outlive one program."""
        self.program = program
        self.arenas = {name: np.zeros(size, dtype=np.uint8) for name, size in program.arenas.items()
                       if name not in (arenas or {})}
        self.threads = pool_of(pool_size())  # the CPU kernels' threads and scratch
        for name, arena in (arenas or {}).items():
            if arena.nbytes < program.arenas[name]:
                raise ExecutionError(f"the shared {name} arena has {arena.nbytes} bytes, the program needs "
                                     f"{program.arenas[name]}")
            self.arenas[name] = arena
        self.views: dict[SSAValue, np.ndarray] = {}
        self.inputs: list[np.ndarray] = []
        self.outputs: list[np.ndarray] = []
        self.params: dict[str, np.ndarray] = {}  # tagged param = "name"
        self.grads: dict[str, np.ndarray] = {}  # tagged grad = "name"
        self.moments: dict[str, np.ndarray] = {}  # tagged moment = "exp_avg.name"
        self.masters: dict[str, np.ndarray] = {}  # tagged master = "name": fp32 copies of 16-bit weights
        self.state: dict[str, np.ndarray] = dict(state or {})
        compiled: list[tuple[Operation, list[Step]]] = []
        for op in program.body.block.ops:
            if isinstance(op, BufferOp):
                self.place(op)
            else:
                compiled.append((op, self.compile(op)))
        self.steps: list[Step] = fuse_optimizer_steps(self.threads, compiled, self.views)
        if params is not None:
            self.bind_params(params)

    # ------------------------------------------------------------------ memory
    def place(self, op: BufferOp) -> None:
        btype: BufferType = op.result.type
        root, start = root_offset(op)
        if root.offset is None:
            raise ExecutionError(f"buffer %{root.result.name_hint or '?'} has no offset: run mdsl-plan-memory first")
        arena = self.arenas[root.arena.data]
        view = arena[start:start + btype.nbytes].view(numpy_dtype(btype.dtype)).reshape(btype.shape)
        state = op.attributes.get("state")
        if isinstance(state, StringAttr):
            given = self.state.setdefault(state.data, view)
            if given.shape != view.shape or given.dtype != view.dtype:
                raise ExecutionError(f"state '{state.data}' is {given.shape} {given.dtype}, the program needs "
                                     f"{view.shape} {view.dtype}")
            view = given
        self.views[op.result] = view
        for role, where in (("input", self.inputs), ("output", self.outputs)):
            index = op.attributes.get(role)
            if isinstance(index, IntegerAttr):
                where.extend([None] * (index.value.data + 1 - len(where)))
                where[index.value.data] = view
        for tag, views in (("param", self.params), ("grad", self.grads), ("moment", self.moments),
                           ("master", self.masters)):
            name = op.attributes.get(tag)
            if isinstance(name, StringAttr):
                views[name.data] = view

    def bind_params(self, weights: dict[str, np.ndarray]) -> None:
        """Copy each parameter into its place in the params arena."""
        missing = sorted(set(self.params) - set(weights))
        if missing:
            raise ExecutionError(f"no weights for the parameters {', '.join(missing)}")
        for name, view in self.params.items():
            np.copyto(view, np.asarray(weights[name]).reshape(view.shape), casting="unsafe")

    # ------------------------------------------------------------------ running
    def execute(self, *inputs: np.ndarray) -> list[np.ndarray]:
        """Copy the inputs in, run every step; the outputs are views into the arenas."""
        if len(inputs) != len(self.inputs):
            raise ExecutionError(f"the program takes {len(self.inputs)} inputs, got {len(inputs)}")
        for index, (view, value) in enumerate(zip(self.inputs, inputs)):
            if np.shape(value) != view.shape:
                raise ExecutionError(f"input {index}: expected shape {view.shape}, got {np.shape(value)}")
            np.copyto(view, value, casting="unsafe")
        self.threads.workspace.prepare()
        buffer = np.setbufsize(BUFSIZE)
        try:
            with blas_threads(1), np.errstate(all="ignore"):
                for step in self.steps:
                    step()
        finally:
            np.setbufsize(buffer)
        return list(self.outputs)

    # ------------------------------------------------------------------ compiling steps
    def compile(self, op: Operation) -> list[Step]:
        """The steps of one top-level op (a layer loop unrolled: its body's steps for each layer)."""
        compiler = StepCompiler(self)
        visit(op, compiler)
        return compiler.steps

    def launch(self, op: LaunchOp, views: Mapping[SSAValue, np.ndarray], at: At = TOP) -> Step:
        try:
            kernels = entry(op.kernel.data)
        except KeyError as err:
            raise ExecutionError(str(err)) from None
        kernel = kernels.reference
        outputs = [views[v] for v in op.outputs]
        if "scratch" in op.attributes:
            outputs = outputs[:-1]  # the reference kernels need no scratch
        sig = lookup_primitive(op.kernel.data)
        if sig is None:  # a schedule-level kernel: operands and attributes as they stand
            arguments = [views[v] for v in op.inputs]
            params = {k: attribute_value(v, "") for k, v in op.attributes.items() if k not in LAUNCH_ATTRIBUTES}
        else:
            arguments = []
            for group in sig.group_operands([views[v] for v in op.inputs], op.absent_slots):
                arguments.extend(group if isinstance(group, list) else [group])
            params = {p.name: attribute_value(op.attributes[p.name], p.kind) for p in sig.params
                      if p.name in op.attributes}
            if sig.name in SHAPE_KEYWORDS:
                params["shape"] = outputs[0].shape
            if sig.name in DTYPE_KEYWORDS:
                params["dtype"] = outputs[0].dtype
            if sig.name in SHAPES_KEYWORDS:
                params["shapes"] = tuple(o.shape for o in outputs)
        params.update(layer_params(op, at))  # dropout in a layer loop: its layers key its mask

        accumulate = op.accumulate is not None
        fast = cpu_kernel(op.kernel.data)
        if fast is not None and (not accumulate or kernels.accumulates):
            step = fast(self.threads, outputs, arguments, {**params, **({"accumulate": True} if accumulate else {})})
            if step is not None:
                return step

        def step() -> None:
            result = kernel(*arguments, **params)
            write_results(outputs, result, accumulate)

        return step

    def gemm(self, op: GemmOp, views: Mapping[SSAValue, np.ndarray]) -> Step:
        """``C = epilogue(alpha op(A) op(B) + beta C)`` with the reference's cuBLASLt epilogues."""
        a, b, c = views[op.a], views[op.b], views[op.c]
        bias, aux, scale = (views[v] if v is not None else None for v in (op.bias, op.aux, op.scale_b))
        mode = ("T" if op.transa.value.data else "N") + ("T" if op.transb.value.data else "N")
        params = {"transpose": mode, "alpha": op.alpha.value.data, "beta": op.beta.value.data,
                  "epilogue": op.epilogue.data, "scale_b": scale}

        fast = cpu_gemm(self.threads, a, b, c, bias, aux, **params, jit=compiled_kernels_enabled())
        if fast is not None:
            return fast

        def step() -> None:
            gemm(a, b, c, bias, aux, **params)

        return step

    def attention(self, op: AttentionOp, views: Mapping[SSAValue, np.ndarray]) -> Step:
        q, k, v, out, lse = (views[x] for x in (op.q, op.k, op.v, op.out, op.lse))
        segments = None if op.segments is None else views[op.segments]  # packed rows' example ids
        params = attention_params(op)
        inputs = [q, k, v, None] if segments is None else [q, k, v, None, segments]
        fast = cpu_kernel("flash_attention")(self.threads, [out, lse], inputs, params)
        if fast is not None:
            return fast
        if op.layout.data == "bthd":
            q, k, v, out = (x.swapaxes(1, 2) for x in (q, k, v, out))
        window, scale, causal, softcap = params["window_size"], params["softmax_scale"], params["causal"], \
            params["softcap"]

        def step() -> None:
            result, logsumexp = flash_attention(q, k, v, None, segments, causal=causal, softmax_scale=scale,
                                                window_size=window, softcap=softcap)
            np.copyto(out, result, casting="unsafe")
            np.copyto(lse, logsumexp, casting="unsafe")

        return step

    def attention_backward(self, op: AttentionBackwardOp, views: Mapping[SSAValue, np.ndarray]) -> Step:
        """``d_q, d_k, d_v`` of attention from its saved ``out`` and ``lse``: the CPU kernel of
        ``flash_attention_backward``, or its reference."""
        q, k, v, out, d_out, lse = (views[x] for x in (op.q, op.k, op.v, op.out, op.d_out, op.lse))
        grads = [views[x] for x in (op.d_q, op.d_k, op.d_v)]
        arguments, params = [d_out, q, k, v, out, lse, None], attention_params(op)
        if op.segments is not None:  # packed rows' example ids
            arguments.append(views[op.segments])
        fast = cpu_kernel("flash_attention_backward")(self.threads, grads, arguments, params)
        if fast is not None:
            return fast

        def step() -> None:
            write_results(grads, flash_attention_backward(*arguments, **params))

        return step


def attention_params(op: AttentionOp | AttentionBackwardOp) -> dict[str, Any]:
    """The ``flash_attention`` kernels' parameters of an attention op (forward or backward)."""
    return {"causal": bool(op.causal.value.data), "window_size": op.window.value.data or None,
            "softmax_scale": op.scale.value.data if op.scale is not None else None, "layout": op.layout.data,
            "softcap": op.softcap.value.data if op.softcap is not None else 0.0}


class StepCompiler(ScheduleVisitor):
    """Turns the ops of one top-level op into the executor's steps, in order (the walk unrolls
    layer loops). The views of layer slices live in ``views`` over the executor's buffer views."""

    unroll = True

    def __init__(self, executor: ScheduleExecutor):
        self.executor = executor
        self.views: ChainMap[SSAValue, np.ndarray] = ChainMap({}, executor.views)
        self.steps: list[Step] = []

    def layer_view(self, op: LayerViewOp, at: At) -> None:
        rows, layer = op.row_range, at.layer(op.layer)
        self.views[op.result] = self.views[op.stacked][layer] if rows is None else \
            self.views[op.stacked][layer][rows[0]:rows[0] + rows[1]]

    def launch(self, op: LaunchOp, at: At) -> None:
        self.steps.append(self.executor.launch(op, self.views, at))

    def gemm(self, op: GemmOp, at: At) -> None:
        self.steps.append(self.executor.gemm(op, self.views))

    def attention(self, op: AttentionOp, at: At) -> None:
        self.steps.append(self.executor.attention(op, self.views))

    def attention_backward(self, op: AttentionBackwardOp, at: At) -> None:
        self.steps.append(self.executor.attention_backward(op, self.views))

    def copy(self, op: CopyOp, at: At) -> None:
        views = self.views
        self.steps.append(copy_step(views[op.operands[0]], views[op.operands[1]], op.attributes.get("bytes")))

    def memset(self, op: MemsetOp, at: At) -> None:
        value = op.attributes.get("value")
        target, fill = self.views[op.operands[0]], value.value.data if value is not None else 0.0
        self.steps.append(lambda: target.fill(fill))

    def collective(self, op: CollectiveOp, at: At) -> None:
        """A collective through the process's communicator (:mod:`modeldsl.runtime.distributed`)."""
        source, target = self.views[op.input], self.views[op.output]
        kind, group = op.kind.data, op.group.data
        reduction = op.op.data if op.op is not None else None
        root = op.root.value.data if op.root is not None else None

        def step() -> None:
            distributed.communicator().run(kind, group, source, target, reduction, root)

        self.steps.append(step)

    def check(self, op: AssertOp, at: At) -> None:
        """An ``@assert``'s check of the buffer's view where it stands (E046 when it fails)."""
        view, layers = self.views[op.value], at.layers
        self.steps.append(lambda: assertions.check(op, view, layers))

    def buffer(self, op: BufferOp, at: At) -> None:
        self.other(op, at)  # buffers are placed at the top level

    def work(self, op: Operation, at: At) -> None:
        self.other(op, at)

    def other(self, op: Operation, at: At) -> None:
        raise ExecutionError(f"the CPU executor cannot run {op.name}")


def write_results(outputs: Sequence[np.ndarray], result, accumulate: bool = False) -> None:
    """A kernel's results into its output views: copied, or added with ``accumulate`` (a kernel
    that updated an output in place returns it)."""
    for view, value in zip(outputs, result if isinstance(result, tuple) else (result,), strict=True):
        if value is view:
            continue
        if accumulate:
            np.add(view, value, out=view, casting="unsafe")
        else:
            np.copyto(view, value, casting="unsafe")


def root_offset(op: BufferOp) -> tuple[BufferOp, int]:
    """The buffer that owns the memory of ``op`` and the byte offset of ``op`` in its arena."""
    start = 0
    while op.alias_of is not None:
        start += op.offset.value.data
        op = op.alias_of.owner
    return op, start + (op.offset.value.data if op.offset is not None else 0)


def tagged_layout(program: ProgramOp, tag: str) -> dict[str, tuple[int, tuple[int, ...], str]]:
    """Where each buffer tagged ``tag = "name"`` (``param``, ``grad``, ``moment``) of a planned
    program lies: name -> (byte offset in its arena, shape, dtype). Programs that share an
    arena must agree on it."""
    layout = {}
    for op in program.body.block.ops:
        name = op.attributes.get(tag) if isinstance(op, BufferOp) else None
        if isinstance(name, StringAttr):
            btype: BufferType = op.result.type
            layout[name.data] = (root_offset(op)[1], btype.shape, btype.dtype.value)
    return layout


def copy_step(source: np.ndarray, target: np.ndarray, nbytes: Attribute | None) -> Step:
    if isinstance(nbytes, IntegerAttr):
        count = nbytes.value.data
        src, dst = source.reshape(-1).view(np.uint8)[:count], target.reshape(-1).view(np.uint8)[:count]
        return lambda: np.copyto(dst, src)
    return lambda: np.copyto(target, source, casting="unsafe")


def numpy_dtype(dtype: DType) -> np.dtype:
    return NUMPY_DTYPES[dtype]


def run_program(program: ProgramOp, params: dict[str, np.ndarray], inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """One-shot helper: build an executor, run it once, return copies of the outputs."""
    return [np.array(out) for out in ScheduleExecutor(program, params).execute(*inputs)]
