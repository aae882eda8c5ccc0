"""The CUDA executor of a planned ``mdsl.sched`` program.

Two layers:

- **Binding** (:func:`bind_program`): the program becomes, once, a flat list of commands
  (layer loops unrolled as the CPU executor unrolls them: the same walk,
  :mod:`modeldsl.dialects.sched_walk`). Every buffer is a
  :class:`TensorRef`: a device address (its arena's base plus its planned offset; aliases and
  layer views, row ranges included, by offset arithmetic), a shape and a dtype. A ``launch``
  becomes a :class:`KernelCommand` holding its ``kernels/cuda.py`` plan, whose pointer
  arguments are resolved to addresses (its scratch in the executor's one workspace
  allocation, sized by the largest plan, its device tables packed and uploaded once; an output
  the kernel writes in fp32 but the program stores in 16 bits goes through fp32 scratch and a
  cast launch), or, where
  the primitive has no CUDA kernel or the plan raises ``NotCovered``, a reference fallback
  (counted in :attr:`CudaExecutor.fallbacks`, warned once per primitive). Launches of layout
  primitives (transpose, permute, concat, split, contiguous, copy, view) become device copies
  (:class:`StridedCopyCommand`, :class:`CopyCommand`) and ``zeros``/``ones``/``fill`` memsets (a
  ``flash_attention`` launch, with its ALiBi slopes, is a kernel launch: mdsl-lower-to-sched makes
  attention without them the ``attention``/``attention_backward`` ops); a fused primitive
  with a composite lowering (:mod:`modeldsl.runtime.cuda_composites`: the chunked LM-head loss)
  becomes a :class:`CompositeCommand` of GEMMs and kernel launches working in the launch's
  planned scratch. A ``gemm``
  is a :class:`GemmCommand`, ``attention``/``attention_backward`` attention commands (which
  also carry the plan of the plain CUDA attention kernel, for where cuDNN cannot run them),
  ``memset``/``copy`` memory commands. A kernel choice mdsl-lower-to-sched recorded from ``@kernel``
  (``implementation``, ``fallback = false``, ``workspace_bytes``) rides on the command
  (:attr:`Command.choice`): the device runs attention with the chosen implementation, and a
  binding choice that cannot run (no plan, cuDNN refusing it) is :class:`KernelUnavailable` (E043)
  instead of a fallback.
- **Device** (:mod:`modeldsl.runtime.cuda_device`): runs the commands. :class:`CudaExecutor`
  allocates its arenas once (or shares the ones it is given), binds, lets the device prepare
  every command (GEMM plans, attention graphs, kernel modules), and then ``execute`` copies the
  inputs in, runs the commands (the first call eagerly, the second captured as a CUDA graph and
  replayed, later calls replayed) and copies the outputs out.

Semantics are the CPU :class:`modeldsl.runtime.sched_executor.ScheduleExecutor`'s: the same
inputs, outputs, state buffers, tagged parameters, gradients, moments and master weights
(here :class:`DeviceArray` accessors that copy to and from the device), the same shared arenas
between programs, the same reference kernels and launch parameters.
"""

from __future__ import annotations

import math
import warnings
from collections import ChainMap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from xdsl.dialects.builtin import IntegerAttr, StringAttr
from xdsl.ir import Operation, SSAValue

from modeldsl.dialects.sched import (
    EPILOGUES,
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
from modeldsl.kernels.reference import flash_attention, flash_attention_backward, gemm
from modeldsl.kernels.registry import entry
from modeldsl.primitives import lookup_primitive
from modeldsl.runtime.cuda_device import Device, KernelUnavailable, aligned, fill_pattern
from modeldsl.runtime.executor import DTYPE_KEYWORDS, SHAPE_KEYWORDS, SHAPES_KEYWORDS, ExecutionError, attribute_value
from modeldsl.runtime.sched_executor import LAUNCH_ATTRIBUTES, numpy_dtype, root_offset, write_results

# dtype (numpy) -> the name kernels/cuda.py gives it
CUDA_DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "int32": "int32", "int64": "int64"}
SCALARS = {"i32": np.int32, "i64": np.int64, "f32": np.float32, "f64": np.float64}
TAGS = ("param", "grad", "moment", "master")
_WARNED: set[str] = set()  # primitives whose fallback was warned about


class FallbackWarning(RuntimeWarning):
    """A launch runs through its numpy reference on host copies (no CUDA kernel covers it)."""


# ----------------------------------------------------------------------------
# Device memory references
# ----------------------------------------------------------------------------


@dataclass(frozen=True)
class TensorRef:
    """A contiguous tensor in device memory."""

    address: int
    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def itemsize(self) -> int:
        return np.dtype(self.dtype).itemsize

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize

    @property
    def strides(self) -> tuple[int, ...]:
        """Row-major strides in elements."""
        return contiguous_strides(self.shape)

    def layer(self, index: int) -> TensorRef:
        """Slice ``index`` of the leading dim (a layer of a stacked buffer)."""
        inner = self.shape[1:]
        return TensorRef(self.address + index * math.prod(inner) * self.itemsize, inner, self.dtype)

    def rows(self, start: int, count: int) -> TensorRef:
        """Rows ``start .. start + count`` of the leading dim."""
        row = math.prod(self.shape[1:]) * self.itemsize
        return TensorRef(self.address + start * row, (count, *self.shape[1:]), self.dtype)

    def overlaps(self, other: TensorRef) -> bool:
        return self.address < other.address + other.nbytes and other.address < self.address + self.nbytes


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return tuple(reversed(strides))


def same_tensor(a: TensorRef | None, b: TensorRef | None) -> bool:
    return a is not None and b is not None and (a.address, a.shape, a.dtype) == (b.address, b.shape, b.dtype)


# ----------------------------------------------------------------------------
# Commands
# ----------------------------------------------------------------------------


@dataclass(eq=False)
class Command:
    """One unit of device work. ``refs`` are every buffer it touches, ``written`` those it writes;
    ``compute`` is its numpy semantics on views of ``refs`` (the emulated device and the host
    fallback run it); ``fallback`` says why it runs on host copies (None: on the device)."""

    fallback: str | None = field(default=None, init=False)
    choice: KernelChoice | None = field(default=None, kw_only=True)  # the op's @kernel, recorded by lowering
    kind = "command"  # what fallbacks call it

    @property
    def binding(self) -> bool:
        """Whether only the chosen kernel may run it (``@kernel(..., fallback=false)``)."""
        return self.choice is not None and not self.choice.fallback

    @property
    def label(self) -> str:
        return self.kind

    @property
    def refs(self) -> tuple[TensorRef | None, ...]:
        return ()

    @property
    def written(self) -> tuple[TensorRef | None, ...]:
        return ()

    def compute(self, arrays: list[np.ndarray | None]) -> None:
        raise ExecutionError(f"{self.label} has no host semantics")

    def plan_steps(self) -> tuple[BoundLaunch | BoundMemset, ...]:
        """The resolved kernel launches and memsets it may run (checked by the emulated device)."""
        return ()

    def run(self, device: Device) -> None:
        if self.fallback is not None:
            device.fallback(self)
        else:
            self.dispatch(device)

    def dispatch(self, device: Device) -> None:
        raise NotImplementedError


@dataclass(frozen=True)
class BoundLaunch:
    """One kernel launch of a plan with its arguments resolved: pointers as 8-byte integers,
    scalars as numpy scalars of the parameter's type. ``extents``: (address, bytes) each pointer covers."""

    launch: cuda.Launch
    args: tuple[Any, ...]
    extents: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class BoundMemset:
    """Zero ``nbytes`` at ``address`` before the next launch of a plan."""

    address: int
    nbytes: int

    @property
    def extents(self) -> tuple[tuple[int, int], ...]:
        return ((self.address, self.nbytes),)


@dataclass(eq=False)
class KernelCommand(Command):
    """A launch of a registry kernel: its CUDA plan (``plan``, resolved into ``steps``), and the
    CPU executor's reference call (``reference(*arguments, **params)``, results into ``outputs``)."""

    kernel: str = ""
    arguments: tuple[TensorRef | None, ...] = ()
    outputs: tuple[TensorRef, ...] = ()
    params: dict[str, Any] = field(default_factory=dict)
    reference: Callable[..., Any] | None = None
    primitive: str = ""  # the kernels/cuda.py primitive (add in place: add_inplace)
    variant: str = ""
    index_dtype: str = "int32"
    plan: cuda.Plan | None = None
    names: dict[str, TensorRef] = field(default_factory=dict)  # "in:x" / "out:y" -> buffer
    tables: dict[str, bytes] = field(default_factory=dict)  # table -> its packed bytes
    steps: tuple[BoundLaunch | BoundMemset, ...] = ()
    accumulate: bool = False  # add the results into the outputs (a launch marked accumulate)

    @property
    def kind(self) -> str:  # type: ignore[override]
        return self.kernel

    @property
    def label(self) -> str:
        return f"launch '{self.kernel}'"

    @property
    def refs(self) -> tuple[TensorRef | None, ...]:
        return (*self.arguments, *self.outputs)

    @property
    def written(self) -> tuple[TensorRef | None, ...]:
        return self.outputs

    @property
    def launches(self) -> list[BoundLaunch]:
        return [s for s in self.steps if isinstance(s, BoundLaunch)]

    def plan_steps(self) -> tuple[BoundLaunch | BoundMemset, ...]:
        return self.steps

    def compute(self, arrays: list[np.ndarray | None]) -> None:
        """The CPU executor's launch step: the reference, its results copied into the outputs
        (a kernel that updated an output in place returns it)."""
        arguments, outputs = arrays[:len(self.arguments)], arrays[len(self.arguments):]
        write_results(outputs, self.reference(*arguments, **self.params), self.accumulate)

    def dispatch(self, device: Device) -> None:
        device.run_kernel(self)

    def resolve(self, scratch: int, tables: dict[str, int]) -> None:
        """Resolve the plan's arguments: buffers by name, scratch segments from ``scratch``,
        tables at their uploaded addresses."""
        offsets = self.plan.scratch_offsets()
        extents = {**{name: (ref.address, ref.nbytes) for name, ref in self.names.items()},
                   **{f"scratch:{name}": (scratch + offsets[name], size) for name, size in self.plan.scratch.items()},
                   **{f"table:{name}": (tables[name], len(blob)) for name, blob in self.tables.items()}}
        steps: list[BoundLaunch | BoundMemset] = []
        for step in self.plan.steps:
            if isinstance(step, cuda.Memset):
                steps.append(BoundMemset(*pointer_extent(extents, step.buffer)))
            else:
                steps.append(bind_step(step, extents))
        self.steps = tuple(steps)


def pointer_extent(extents: dict[str, tuple[int, int]], name: str | None) -> tuple[int, int]:
    if name is None:
        return 0, 0
    try:
        return extents[name]
    except KeyError:
        raise cuda.NotCovered(f"the plan passes '{name}', which the launch does not have") from None


def bind_step(step: cuda.Launch, extents: dict[str, tuple[int, int]]) -> BoundLaunch:
    args, covered = [], []
    for arg in step.args:
        if arg.kind == "ptr":
            address, nbytes = pointer_extent(extents, arg.value)
            args.append(np.uint64(address))
            covered.append((address, nbytes))
        else:
            args.append(SCALARS[arg.kind](arg.value))
    return BoundLaunch(step, tuple(args), tuple(covered))


@dataclass(eq=False)
class GemmCommand(Command):
    """``C = alpha op(A) op(B) + beta C`` (+ epilogue) over row-major buffers with a batch."""

    a: TensorRef | None = None
    b: TensorRef | None = None
    c: TensorRef | None = None
    bias: TensorRef | None = None
    aux: TensorRef | None = None
    transa: bool = False
    transb: bool = False
    alpha: float = 1.0
    beta: float = 0.0
    epilogue: str = "none"
    kind = "gemm"

    @property
    def label(self) -> str:
        return f"gemm {list(self.a.shape)} x {list(self.b.shape)} -> {list(self.c.shape)}"

    @property
    def refs(self) -> tuple[TensorRef | None, ...]:
        return self.a, self.b, self.c, self.bias, self.aux

    @property
    def written(self) -> tuple[TensorRef | None, ...]:
        rule = EPILOGUES[self.epilogue]
        return (self.c, self.bias if rule.bias in ("write_m", "write_n") else None,
                self.aux if rule.aux == "write" else None)

    @property
    def mode(self) -> str:
        return ("T" if self.transa else "N") + ("T" if self.transb else "N")

    def compute(self, arrays: list[np.ndarray | None]) -> None:
        """The CPU's run of this GEMM and its epilogue (the kernels' reference)."""
        a, b, c, bias, aux = arrays
        gemm(a, b, c, bias, aux, transpose=self.mode, alpha=self.alpha, beta=self.beta, epilogue=self.epilogue)

    def dispatch(self, device: Device) -> None:
        device.gemm(self)


@dataclass(eq=False)
class AttentionCommand(Command):
    """Fused attention (q, k, v) -> (out, lse): causal, GQA, sliding window, softcap; bhtd or bthd."""

    q: TensorRef | None = None
    k: TensorRef | None = None
    v: TensorRef | None = None
    out: TensorRef | None = None
    lse: TensorRef | None = None
    causal: bool = True
    window: int = 0
    softmax_scale: float | None = None  # None: 1/sqrt(D)
    layout: str = "bhtd"
    # attention-logit softcapping (0: none): cuDNN's SDPA graph declines it (NotCovered), so the device runs
    # the plain attention.cu kernel (``kernel``), which takes it
    softcap: float = 0.0
    kernel: KernelCommand | None = None  # the plain CUDA attention kernel's launch, where cuDNN cannot
    kind = "attention"

    @property
    def label(self) -> str:
        return f"attention {list(self.q.shape)} {np.dtype(self.q.dtype).name}"

    @property
    def scale(self) -> float:
        return self.softmax_scale if self.softmax_scale is not None else 1.0 / math.sqrt(self.q.shape[-1])

    @property
    def refs(self) -> tuple[TensorRef | None, ...]:
        return self.q, self.k, self.v, self.out, self.lse

    @property
    def written(self) -> tuple[TensorRef | None, ...]:
        return self.out, self.lse

    def plan_steps(self) -> tuple[BoundLaunch | BoundMemset, ...]:
        return self.kernel.steps if self.kernel is not None and self.kernel.plan is not None else ()

    def kernel_launch(self) -> KernelCommand:
        """The same attention as a launch of the ``flash_attention`` primitive (kernels/cuda.py)."""
        return KernelCommand(kernel="flash_attention", arguments=(self.q, self.k, self.v, None),
                             outputs=(self.out, self.lse), params=self.kernel_params(), reference=flash_attention)

    def kernel_params(self) -> dict[str, Any]:
        return {"causal": self.causal, "softmax_scale": self.softmax_scale, "window_size": self.window or None,
                "layout": self.layout, "softcap": self.softcap}

    def heads_first(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        return [x.swapaxes(1, 2) for x in arrays] if self.layout == "bthd" else list(arrays)

    def compute(self, arrays: list[np.ndarray | None]) -> None:
        q, k, v, out = self.heads_first(arrays[:4])
        o, lse = flash_attention(q, k, v, causal=self.causal, softmax_scale=self.softmax_scale,
                                 window_size=self.window or None, softcap=self.softcap)
        np.copyto(out, o, casting="unsafe")
        np.copyto(arrays[4], lse, casting="unsafe")

    def dispatch(self, device: Device) -> None:
        device.attention(self)


@dataclass(eq=False)
class AttentionBackwardCommand(AttentionCommand):
    """Attention backward (q, k, v, out, d_out, lse) -> (d_q, d_k, d_v)."""

    d_out: TensorRef | None = None
    d_q: TensorRef | None = None
    d_k: TensorRef | None = None
    d_v: TensorRef | None = None
    kind = "attention_backward"

    @property
    def label(self) -> str:
        return f"attention backward {list(self.q.shape)} {np.dtype(self.q.dtype).name}"

    @property
    def refs(self) -> tuple[TensorRef | None, ...]:
        return self.q, self.k, self.v, self.out, self.d_out, self.lse, self.d_q, self.d_k, self.d_v

    @property
    def written(self) -> tuple[TensorRef | None, ...]:
        return self.d_q, self.d_k, self.d_v

    def kernel_launch(self) -> KernelCommand:
        return KernelCommand(kernel="flash_attention_backward",
                             arguments=(self.d_out, self.q, self.k, self.v, self.out, self.lse),
                             outputs=(self.d_q, self.d_k, self.d_v), params=self.kernel_params(),
                             reference=flash_attention_backward)

    def compute(self, arrays: list[np.ndarray | None]) -> None:
        q, k, v, out, d_out = self.heads_first(arrays[:5])
        d_q, d_k, d_v = self.heads_first(arrays[6:])
        grads = flash_attention_backward(d_out, q, k, v, out, arrays[5], causal=self.causal,
                                         softmax_scale=self.softmax_scale, window_size=self.window or None,
                                         softcap=self.softcap)
        for view, value in zip((d_q, d_k, d_v), grads):
            np.copyto(view, value, casting="unsafe")

    def dispatch(self, device: Device) -> None:
        device.attention_backward(self)


@dataclass(eq=False)
class MemsetCommand(Command):
    """Fill a buffer with one value (a repeated 1-, 2- or 4-byte pattern on the device)."""

    target: TensorRef | None = None
    value: float = 0.0
    kind = "memset"

    def __post_init__(self) -> None:
        try:
            self.pattern = fill_pattern(self.value, self.target.dtype)
        except cuda.NotCovered as err:
            self.pattern, self.fallback = b"", str(err)

    @property
    def label(self) -> str:
        return f"memset {list(self.target.shape)} {np.dtype(self.target.dtype).name} = {self.value}"

    @property
    def refs(self) -> tuple[TensorRef | None, ...]:
        return (self.target,)

    @property
    def written(self) -> tuple[TensorRef | None, ...]:
        return (self.target,)

    def compute(self, arrays: list[np.ndarray | None]) -> None:
        arrays[0].fill(self.value)

    def dispatch(self, device: Device) -> None:
        device.memset(self.target.address, self.target.nbytes, self.pattern)


@dataclass(eq=False)
class CopyCommand(Command):
    """Copy ``nbytes`` bytes from ``src`` to ``dst``."""

    dst: int = 0
    src: int = 0
    nbytes: int = 0
    kind = "copy"

    @property
    def label(self) -> str:
        return f"copy of {self.nbytes} bytes"

    def dispatch(self, device: Device) -> None:
        device.copy(self.dst, self.src, self.nbytes)


@dataclass(eq=False)
class StridedCopyCommand(Command):
    """Copy the elements of a strided index space (strides in elements) from ``src`` to ``dst``."""

    dst: int = 0
    src: int = 0
    shape: tuple[int, ...] = ()
    dst_strides: tuple[int, ...] = ()
    src_strides: tuple[int, ...] = ()
    itemsize: int = 1
    kind = "strided_copy"

    @property
    def label(self) -> str:
        return f"strided copy {list(self.shape)}"

    def dispatch(self, device: Device) -> None:
        device.strided_copy(self)


@dataclass(eq=False)
class CompositeCommand(Command):
    """One launch of a fused primitive run as several device commands (GEMMs and kernel launches,
    ``parts``, in order; e.g. the chunked LM-head loss). It runs on the device only when every part
    does; ``compute`` runs the parts' host semantics in order, on the same buffers."""

    kernel: str = ""  # the primitive it runs
    parts: tuple[Command, ...] = ()

    @property
    def kind(self) -> str:  # type: ignore[override]
        return self.kernel

    @property
    def label(self) -> str:
        return f"launch '{self.kernel}' ({len(self.parts)} device commands)"

    @property
    def refs(self) -> tuple[TensorRef | None, ...]:
        return tuple(ref for part in self.parts for ref in part.refs)

    @property
    def written(self) -> tuple[TensorRef | None, ...]:
        return tuple(ref for part in self.parts for ref in part.written)

    @property
    def kernels(self) -> list[KernelCommand]:
        return [part for part in self.parts if isinstance(part, KernelCommand)]

    def plan_steps(self) -> tuple[BoundLaunch | BoundMemset, ...]:
        """Every part's steps; NotCovered when a part cannot run on the device (the whole launch
        then falls back)."""
        blocked = next((part for part in self.parts if part.fallback is not None), None)
        if blocked is not None:
            raise cuda.NotCovered(f"{blocked.label}: {blocked.fallback}")
        return tuple(step for part in self.parts for step in part.plan_steps())

    def compute(self, arrays: list[np.ndarray | None]) -> None:
        at = 0
        for part in self.parts:
            part.compute(arrays[at:at + len(part.refs)])
            at += len(part.refs)

    def dispatch(self, device: Device) -> None:
        for part in self.parts:
            part.dispatch(device)


@dataclass(frozen=True)
class Fallback:
    """A command that runs through its numpy reference on host copies, and why."""

    kernel: str
    reason: str


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


def cuda_buffers(command: KernelCommand) -> tuple[str, list[tuple[str, TensorRef | None]], list[tuple[str, TensorRef]]]:
    """The kernels/cuda.py primitive of a launch and its buffers by the table's names: ``add``
    into one of its operands is ``add_inplace``; a variadic group is ``NAME0``, ``NAME1``, ..."""
    arguments, outputs = command.arguments, command.outputs
    if command.kernel == "add" and len(outputs) == 1 and len(arguments) == 2:
        for acc, x in (arguments, arguments[::-1]):
            if same_tensor(outputs[0], acc) and x.shape == acc.shape:
                return "add_inplace", [("acc", acc), ("x", x)], [("acc", acc)]
    prim = cuda.primitive(command.kernel)
    if prim.variadic:
        ins = [(f"{prim.inputs[0]}{i}", ref) for i, ref in enumerate(arguments)]
    else:
        if len(arguments) > len(prim.inputs) or len(outputs) > len(prim.outputs):
            raise cuda.NotCovered(f"{command.kernel} has more buffers than its CUDA kernel")
        ins = list(zip(prim.inputs, (*arguments, *(None,) * (len(prim.inputs) - len(arguments)))))
    return command.kernel, ins, list(zip(prim.outputs, outputs))


def cuda_dtype(ref: TensorRef) -> str:
    name = np.dtype(ref.dtype).name
    return CUDA_DTYPES.get(name, name)


def choose_variant(prim: cuda.CudaPrimitive, buffers: list[tuple[str, TensorRef | None]],
                   widen: frozenset[str] = frozenset()) -> tuple[str, str, dict[str, str]]:
    """(variant, index dtype, widened outputs) whose buffer dtypes are the launch's. A buffer named
    in ``widen`` may be 16-bit where the kernel writes fp32 (it is then written to fp32 scratch
    and cast: widened maps it to its 16-bit dtype). NotCovered when no variant fits."""
    base = (lambda name: prim.inputs[0]) if prim.variadic else (lambda name: name)
    present = [(name, base(name), cuda_dtype(ref)) for name, ref in buffers if ref is not None]
    index = next((dtype for _, key, dtype in present if prim.dtypes.get(key) == "index"), "int32")
    for variant in prim.variants:
        widened = {}
        for name, key, dtype in present:
            wanted = prim.dtype(key, variant, index)
            if wanted != dtype and not (name in widen and wanted == "fp32" and dtype in ("bf16", "fp16")):
                break
            if wanted != dtype:
                widened[name] = dtype
        else:
            return variant, index, widened
    raise cuda.NotCovered(f"no {prim.name} kernel for the dtypes {{n: d for n, _, d in present}}")


def renamed(step: cuda.Launch | cuda.Memset, names: dict[str, str]) -> cuda.Launch | cuda.Memset:
    if isinstance(step, cuda.Memset):
        return cuda.Memset(names.get(step.buffer, step.buffer))
    args = tuple(cuda.Arg(a.kind, names.get(a.value, a.value)) if a.kind == "ptr" else a for a in step.args)
    return replace(step, args=args)


def with_casts(plan: cuda.Plan, widened: dict[str, str], shapes: dict[str, tuple[int, ...]]) -> cuda.Plan:
    """``plan`` writing each widened output to an fp32 scratch segment, then casting it into the
    16-bit output (the reference's arithmetic: fp32 results stored in the output's dtype)."""
    steps = [renamed(step, {f"out:{name}": f"scratch:wide_{name}" for name in widened}) for step in plan.steps]
    scratch = dict(plan.scratch)
    for name, dtype in widened.items():
        cast = cuda.plan("cast", [shapes[name]], [shapes[name]], {}, f"f32_to_{cuda.SUFFIX[dtype]}")
        steps += [renamed(step, {"in:x": f"scratch:wide_{name}", "out:out": f"out:{name}"}) for step in cast.steps]
        scratch[f"wide_{name}"] = 4 * math.prod(shapes[name])
    return cuda.Plan(tuple(steps), scratch, plan.tables)


def plan_kernel(command: KernelCommand) -> None:
    """Give a launch its CUDA plan, or the reason it falls back to the reference."""
    try:
        name, ins, outs = cuda_buffers(command)
        prim = cuda.primitive(name)
        widen = frozenset(n for n, _ in outs if n not in prim.inputs)
        command.variant, command.index_dtype, widened = choose_variant(prim, ins + outs, widen)
        shapes = {n: r.shape for n, r in (*ins, *outs) if r is not None}
        attrs = {**command.params, "accumulate": True} if command.accumulate else command.params
        plan = cuda.plan(name, [r.shape if r is not None else None for _, r in ins],
                         [r.shape for _, r in outs], attrs, command.variant, command.index_dtype)
        command.plan = with_casts(plan, widened, shapes) if widened else plan
        command.primitive = name
        command.names = {**{f"in:{n}": r for n, r in ins if r is not None}, **{f"out:{n}": r for n, r in outs}}
        command.tables = {table: pack_table(kind, [r for _, r in ins if r is not None])
                          for table, kind in command.plan.tables.items()}
    except (KeyError, ValueError, IndexError, TypeError) as err:  # NotCovered is a ValueError
        command.plan, command.fallback = None, str(err.args[0] if err.args else err)


def pack_table(kind: str, inputs: list[TensorRef]) -> bytes:
    if kind != "tensors":
        raise cuda.NotCovered(f"a '{kind}' device table (the schedule launches one kernel per tensor)")
    return cuda.tensor_table([(ref.address, ref.numel) for ref in inputs]).tobytes()


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
    from modeldsl.runtime.cuda_composites import COMPOSITES  # they are built of this module's commands

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

    def buffer(self, op: BufferOp, at: At) -> None:
        self.other(op, at)  # buffers are placed at the top level

    def work(self, op: Operation, at: At) -> None:
        self.other(op, at)

    def other(self, op: Operation, at: At) -> None:
        raise ExecutionError(f"the CUDA executor cannot run {op.name}")


def bind_gemm(op: GemmOp, refs: Mapping[SSAValue, TensorRef]) -> GemmCommand:
    bias, aux = (refs[value] if value is not None else None for value in (op.bias, op.aux))
    return GemmCommand(a=refs[op.a], b=refs[op.b], c=refs[op.c], bias=bias, aux=aux,
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


def bind_attention(op: AttentionOp | AttentionBackwardOp, refs: Mapping[SSAValue, TensorRef]) -> AttentionCommand:
    options = {"causal": bool(op.causal.value.data), "window": op.window.value.data,
               "softmax_scale": op.scale.value.data if op.scale is not None else None, "layout": op.layout.data,
               "choice": recorded_choice(op), "softcap": op.softcap.value.data if op.softcap is not None else 0.0}
    if isinstance(op, AttentionOp):
        return with_kernel(AttentionCommand(q=refs[op.q], k=refs[op.k], v=refs[op.v], out=refs[op.out],
                                            lse=refs[op.lse], **options))
    return with_kernel(AttentionBackwardCommand(q=refs[op.q], k=refs[op.k], v=refs[op.v], out=refs[op.out],
                                                d_out=refs[op.d_out], lse=refs[op.lse], d_q=refs[op.d_q],
                                                d_k=refs[op.d_k], d_v=refs[op.d_v], **options))


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


# ----------------------------------------------------------------------------
# The executor
# ----------------------------------------------------------------------------


@dataclass(frozen=True)
class DeviceArena:
    """An arena's device memory."""

    address: int
    nbytes: int


class DeviceArray:
    """A tagged buffer of an executor: ``read()`` copies it to the host, ``write(value)`` copies a
    host value in (cast and broadcast as ``numpy.copyto`` does); ``numpy.asarray`` reads it."""

    def __init__(self, device: Device, ref: TensorRef):
        self.device, self.ref = device, ref

    @property
    def shape(self) -> tuple[int, ...]:
        return self.ref.shape

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.ref.dtype)

    def read(self) -> np.ndarray:
        return self.device.download(self.ref.address, self.ref.nbytes).view(self.ref.dtype).reshape(self.ref.shape)

    def write(self, value: Any) -> None:
        host = np.empty(self.ref.shape, dtype=self.ref.dtype)
        np.copyto(host, np.asarray(value), casting="unsafe")
        self.device.upload(self.ref.address, host)

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        value = self.read()
        return value if dtype is None else value.astype(dtype)

    def __repr__(self) -> str:
        return f"DeviceArray({list(self.shape)}, {self.dtype.name}, at {self.ref.address:#x})"


class CudaExecutor:
    """Runs one planned program on a device; the CPU :class:`ScheduleExecutor`'s API, with host
    copies in and out."""

    def __init__(self, program: ProgramOp, params: dict[str, np.ndarray] | None = None,
                 arenas: dict[str, DeviceArena] | None = None, state: dict[str, TensorRef] | None = None,
                 device: Device | None = None, graphs: bool = True):
        """``arenas`` may give arenas shared with other programs (the params arena of every program
        of a model, the grads arena of the training and optimizer programs); the others are
        allocated here, once, and zeroed. ``state`` gives the buffers of state names (KV caches)
        another program placed. ``graphs``: capture the commands as a CUDA graph on the second
        ``execute`` and replay it after (when no command falls back to the host)."""
        if device is None:
            from modeldsl.runtime.cuda_device import CudaDevice

            device = CudaDevice()
        self.program, self.device, self.graphs = program, device, graphs
        self.own: list[int] = []  # device allocations of this executor
        self.arenas = self._arenas(program, arenas or {})
        self.bound = bind_program(program, {name: arena.address for name, arena in self.arenas.items()}, state)
        self.workspace = self._bind_plans()
        self.fallbacks = self._prepare()
        self.inputs, self.outputs, self.state = self.bound.inputs, self.bound.outputs, self.bound.state
        self.params, self.grads, self.moments, self.masters = (
            {name: DeviceArray(device, ref) for name, ref in self.bound.tagged[tag].items()} for tag in TAGS)
        self.runs = 0
        self.graph: Any = None
        if params is not None:
            self.bind_params(params)

    @property
    def commands(self) -> list[Command]:
        return self.bound.commands

    @property
    def allocations(self) -> int:
        """Device allocations this executor made (arenas, workspace and tables)."""
        return len(self.own)

    # ------------------------------------------------------------------ memory
    def _allocate(self, nbytes: int) -> int:
        address = self.device.allocate(nbytes)
        self.own.append(address)
        return address

    def _arenas(self, program: ProgramOp, shared: dict[str, DeviceArena]) -> dict[str, DeviceArena]:
        arenas = {}
        for name, size in program.arenas.items():
            if name in shared:
                if shared[name].nbytes < size:
                    raise ExecutionError(f"the shared {name} arena has {shared[name].nbytes} bytes, the program "
                                         f"needs {size}")
                arenas[name] = shared[name]
            elif size:
                arenas[name] = DeviceArena(self._allocate(size), size)
                self.device.memset(arenas[name].address, size, b"\0")  # as the CPU executor's np.zeros
            else:
                arenas[name] = DeviceArena(0, 0)
        return arenas

    def _bind_plans(self) -> DeviceArena:
        """One allocation for the scratch of every plan (the largest plan's) and the device tables
        after it; resolve the plans' arguments, upload the tables."""
        scratch = aligned(self.bound.scratch_bytes)
        blobs = [(command, name, blob) for command in self.bound.kernels for name, blob in command.tables.items()]
        offsets, size = [], scratch
        for _, _, blob in blobs:
            offsets.append(size)
            size += aligned(len(blob))
        base = self._allocate(size) if size else 0
        tables: dict[int, dict[str, int]] = {}
        for (command, name, blob), offset in zip(blobs, offsets):
            tables.setdefault(id(command), {})[name] = base + offset
            self.device.upload(base + offset, np.frombuffer(blob, dtype=np.uint8))
        for command in self.bound.kernels:
            try:
                command.resolve(base, tables.get(id(command), {}))
            except cuda.NotCovered as err:
                command.plan, command.fallback = None, str(err)
        return DeviceArena(base, size)

    def _prepare(self) -> list[Fallback]:
        """Let the device prepare every command; collect (and warn once per primitive about) those
        that run on host copies. A command whose ``@kernel`` choice is binding (``fallback = false``)
        and cannot run as chosen is KernelUnavailable (E043) instead."""
        fallbacks = []
        for command in self.commands:
            if command.fallback is None:
                try:
                    self.device.prepare(command)
                except cuda.NotCovered as err:
                    command.fallback = str(err)
            if command.fallback is not None and command.binding:
                raise KernelUnavailable(f"@kernel(\"{command.choice.name}\", fallback=false): {command.label} cannot "
                                        f"run as chosen: {command.fallback}")
            if command.fallback is not None:
                fallbacks.append(Fallback(command.kind, command.fallback))
                warn_fallback(command.kind, command.fallback)
        return fallbacks

    def bind_params(self, weights: dict[str, np.ndarray]) -> None:
        """Copy each parameter into its place in the params arena."""
        missing = sorted(set(self.params) - set(weights))
        if missing:
            raise ExecutionError(f"no weights for the parameters {', '.join(missing)}")
        for name, array in self.params.items():
            array.write(np.asarray(weights[name]).reshape(array.shape))

    def close(self) -> None:
        """Free the device memory this executor allocated (not the shared arenas it was given)."""
        for address in self.own:
            self.device.free(address)
        self.own.clear()

    # ------------------------------------------------------------------ running
    @property
    def capturable(self) -> bool:
        return self.graphs and self.device.supports_graphs and not self.fallbacks

    def execute(self, *inputs: np.ndarray) -> list[np.ndarray]:
        """Copy the inputs in, run every command, copy the outputs out."""
        if len(inputs) != len(self.inputs):
            raise ExecutionError(f"the program takes {len(self.inputs)} inputs, got {len(inputs)}")
        for index, (ref, value) in enumerate(zip(self.inputs, inputs)):
            if np.shape(value) != ref.shape:
                raise ExecutionError(f"input {index}: expected shape {ref.shape}, got {np.shape(value)}")
            host = np.empty(ref.shape, dtype=ref.dtype)
            np.copyto(host, value, casting="unsafe")
            self.device.upload(ref.address, host)
        self.run()
        return [DeviceArray(self.device, ref).read() for ref in self.outputs]

    def run(self) -> None:
        """Run the commands: eagerly the first time, captured as a graph the second, replayed after."""
        self.runs += 1
        if self.graph is None and self.runs >= 2 and self.capturable:
            self.device.begin_capture()
            try:
                self.run_commands()
            finally:
                self.graph = self.device.end_capture()
        if self.graph is not None:
            self.device.replay(self.graph)
        else:
            self.run_commands()

    def run_commands(self) -> None:
        for command in self.commands:
            command.run(self.device)


def warn_fallback(kernel: str, reason: str) -> None:
    if kernel not in _WARNED:
        _WARNED.add(kernel)
        warnings.warn(f"'{kernel}' runs through its numpy reference on host copies: {reason}", FallbackWarning,
                      stacklevel=3)

