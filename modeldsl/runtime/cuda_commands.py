"""The device commands of the CUDA executor and the planning of a kernel launch.

Every buffer is a :class:`TensorRef`: a device address (its arena's base plus its planned
offset; aliases and layer views, row ranges included, by offset arithmetic), a shape and a
dtype. A :class:`Command` is one unit of device work over such references: a
:class:`KernelCommand` (a launch holding its ``kernels/cuda.py`` plan, :func:`plan_kernel`, whose
pointer arguments are resolved to addresses, :class:`BoundLaunch`/:class:`BoundMemset`; an output
the kernel writes in fp32 but the program stores in 16 bits goes through fp32 scratch and a cast
launch; or, where the primitive has no CUDA kernel or the plan raises ``NotCovered``, a reference
fallback, :class:`Fallback`, warned once per primitive), a :class:`GemmCommand`, attention
commands (which also carry the plan of the plain CUDA attention kernel, for where cuDNN cannot run
them), memory commands (:class:`MemsetCommand`, :class:`CopyCommand`,
:class:`StridedCopyCommand`) and a :class:`CompositeCommand` of several of them. A kernel choice
recorded from ``@kernel`` rides on the command (:attr:`Command.choice`).

:mod:`modeldsl.runtime.cuda_binding` turns a planned program into these commands;
:mod:`modeldsl.runtime.cuda_executor` runs them on a :mod:`modeldsl.runtime.cuda_device`.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from modeldsl.dialects.sched import EPILOGUES
from modeldsl.kernel_choice import KernelChoice
from modeldsl.kernels import cuda
from modeldsl.kernels.reference import flash_attention, flash_attention_backward, gemm
from modeldsl.runtime import assertions
from modeldsl.runtime.cuda_device import Device, fill_pattern
from modeldsl.runtime.executor import ExecutionError
from modeldsl.runtime.sched_executor import write_results

# dtype (numpy) -> the name kernels/cuda.py gives it
CUDA_DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "int32": "int32", "int64": "int64",
               "float8_e4m3fn": "fp8_e4m3", "float8_e5m2": "fp8_e5m2"}
SCALARS = {"i32": np.int32, "i64": np.int64, "f32": np.float32, "f64": np.float64}
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
    scale_b: TensorRef | None = None  # B holds fp8 values, one fp32 scale per row (mdsl.sched.gemm's scale)
    kind = "gemm"

    @property
    def label(self) -> str:
        return f"gemm {list(self.a.shape)} x {list(self.b.shape)} -> {list(self.c.shape)}"

    @property
    def refs(self) -> tuple[TensorRef | None, ...]:
        return self.a, self.b, self.c, self.bias, self.aux, self.scale_b

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
        a, b, c, bias, aux, scale = arrays
        gemm(a, b, c, bias, aux, transpose=self.mode, alpha=self.alpha, beta=self.beta, epilogue=self.epilogue,
             scale_b=scale)

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
class AssertCommand(Command):
    """An ``@assert``'s check (spec 7.7.1): the buffer copied to the host where the op stands and
    checked there (E046 when it fails). It runs on the host, so a program holding one is not captured
    as a CUDA graph."""

    target: TensorRef | None = None
    op: Any = None  # the mdsl.sched.assert op
    layers: tuple[int, ...] = ()
    kind = "assert"
    host = True  # reads device memory on the host (no graph capture)

    @property
    def label(self) -> str:
        return f"assert {self.op.checks().text}"

    @property
    def refs(self) -> tuple[TensorRef | None, ...]:
        return (self.target,)

    def compute(self, arrays: list[np.ndarray | None]) -> None:
        assertions.check(self.op, arrays[0], self.layers)

    def dispatch(self, device: Device) -> None:
        values = device.download(self.target.address, self.target.nbytes).view(self.target.dtype)
        assertions.check(self.op, values.reshape(self.target.shape), self.layers)


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
# Planning a launch
# ----------------------------------------------------------------------------


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


def warn_fallback(kernel: str, reason: str) -> None:
    if kernel not in _WARNED:
        _WARNED.add(kernel)
        warnings.warn(f"'{kernel}' runs through its numpy reference on host copies: {reason}", FallbackWarning,
                      stacklevel=3)

