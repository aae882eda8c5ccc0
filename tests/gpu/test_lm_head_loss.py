"""The chunked LM-head loss on the CUDA executor: ``fused_lm_head_loss`` and its backward lowered to a
composite of cuBLASLt GEMMs and cross-entropy kernel launches (modeldsl/runtime/cuda_composites.py),
against the numpy reference (kernels/reference.py), which processes the same chunks of rows.

Three devices run the composite: the emulated device (every part through its numpy semantics), the
kernel emulator (the cross-entropy and cast kernels compiled with g++ and launched on the composite's
device pointers, the GEMMs in numpy; needs g++), and a GPU (cuBLASLt and the cubins; skipped without
one). Chunks that divide the rows, that do not, and 0 (all rows); ignored rows; every reduction;
fp32 and bf16. fp32: the forward is the reference's bit for bit on the emulated device, the backward
within 1e-5 (the reference scales d_logits in float64); bf16: the logits and d_logits are bf16, as the
unfused GEMM writes them, and a bf16 d_weight is rounded once per chunk (tolerance 2e-2).

``fused_lm_head_loss_grad`` (the two merged: one logits GEMM per chunk) gives on the emulated device
the loss, d_x and d_weight of the two launches bit for bit, fp32 and bf16, every reduction.
"""

from __future__ import annotations

import math
import shutil
import warnings

import ml_dtypes
import numpy as np
import pytest

from modeldsl.dialects.sched import ProgramOp
from modeldsl.ir import make_context, parse_module
from modeldsl.kernels.reference import fused_lm_head_loss, fused_lm_head_loss_backward, fused_lm_head_loss_grad
from modeldsl.kernels.registry import entry
from modeldsl.runtime.cuda_commands import (
    BoundLaunch,
    CompositeCommand,
    FallbackWarning,
    GemmCommand,
    KernelCommand,
    TensorRef,
)
from modeldsl.runtime.cuda_composites import chunked_scratch
from modeldsl.runtime.cuda_device import CudaDevice, EmulatedDevice
from modeldsl.runtime.cuda_executor import CudaExecutor

ROWS, WIDTH, VOCAB = 12, 16, 40
STORAGE = {"fp32": np.float32, "bf16": ml_dtypes.bfloat16}
BACKWARD_TOL = {"fp32": 1e-5, "bf16": 2e-2}
IGNORED = (2, 7, 11)  # rows whose label is ignore_index


def buffer_type(shape, dtype: str) -> str:
    return f"!mdsl.sched.buffer<[{', '.join(map(str, shape))}], {dtype}>"


def lm_head_program(dtype: str, chunk: int, reduction: str, scratch: int | None = None,
                    labels: str = "int64") -> ProgramOp:
    """x, weight, labels, d_loss -> loss, lse, d_x, d_weight: the fused forward and backward launches,
    each with the scratch the kernel registry gives it (or ``scratch`` bytes)."""
    loss_shape = [ROWS] if reduction == "none" else []
    shapes = {"x": ([ROWS, WIDTH], dtype), "w": ([VOCAB, WIDTH], dtype), "labels": ([ROWS], labels),
              "d_loss": (loss_shape, "fp32"), "loss": (loss_shape, "fp32"), "lse": ([ROWS], "fp32"),
              "d_x": ([ROWS, WIDTH], dtype), "d_w": ([VOCAB, WIDTH], dtype)}
    roles = {"x": "input = 0", "w": "input = 1", "labels": "input = 2", "d_loss": "input = 3", "loss": "output = 0",
             "lse": "output = 1", "d_x": "output = 2", "d_w": "output = 3"}
    params = {"chunk": chunk}
    forward = scratch or entry("fused_lm_head_loss").scratch_bytes([(ROWS, WIDTH), (VOCAB, WIDTH), (ROWS,)], [],
                                                                  params)
    backward = scratch or entry("fused_lm_head_loss_backward").scratch_bytes(
        [tuple(loss_shape), (ROWS, WIDTH), (VOCAB, WIDTH), (ROWS,), (ROWS,)], [], params)
    shapes |= {"s_fwd": ([forward], "int8"), "s_bwd": ([backward], "int8")}
    t = {name: buffer_type(*shape) for name, shape in shapes.items()}
    attrs = f'ignore_index = -100 : i64, reduction = "{reduction}", chunk = {chunk} : i64'
    return sched_program(shapes, roles, [
        f'  mdsl.sched.launch "fused_lm_head_loss"(%x, %w, %labels) -> (%loss, %lse, %s_fwd) '
        f'{{{attrs}, compute_accuracy = false, scratch}} : ({t["x"]}, {t["w"]}, {t["labels"]}) -> '
        f'({t["loss"]}, {t["lse"]}, {t["s_fwd"]})',
        f'  mdsl.sched.launch "fused_lm_head_loss_backward"(%d_loss, %x, %w, %labels, %lse) -> '
        f'(%d_x, %d_w, %s_bwd) {{{attrs}, scratch}} : ({t["d_loss"]}, {t["x"]}, {t["w"]}, {t["labels"]}, '
        f'{t["lse"]}) -> ({t["d_x"]}, {t["d_w"]}, {t["s_bwd"]})'])


def merged_program(dtype: str, chunk: int, reduction: str, scratch: int | None = None) -> ProgramOp:
    """x, weight, labels, d_loss -> loss, d_x, d_weight: one ``fused_lm_head_loss_grad`` launch with
    the scratch the kernel registry gives it (or ``scratch`` bytes)."""
    loss_shape = [ROWS] if reduction == "none" else []
    shapes = {"x": ([ROWS, WIDTH], dtype), "w": ([VOCAB, WIDTH], dtype), "labels": ([ROWS], "int64"),
              "d_loss": (loss_shape, "fp32"), "loss": (loss_shape, "fp32"), "d_x": ([ROWS, WIDTH], dtype),
              "d_w": ([VOCAB, WIDTH], dtype)}
    roles = {"x": "input = 0", "w": "input = 1", "labels": "input = 2", "d_loss": "input = 3", "loss": "output = 0",
             "d_x": "output = 1", "d_w": "output = 2"}
    size = scratch or entry("fused_lm_head_loss_grad").scratch_bytes(
        [tuple(loss_shape), (ROWS, WIDTH), (VOCAB, WIDTH), (ROWS,)], [], {"chunk": chunk})
    shapes["s"] = ([size], "int8")
    t = {name: buffer_type(*shape) for name, shape in shapes.items()}
    attrs = f'ignore_index = -100 : i64, reduction = "{reduction}", chunk = {chunk} : i64'
    return sched_program(shapes, roles, [
        f'  mdsl.sched.launch "fused_lm_head_loss_grad"(%d_loss, %x, %w, %labels) -> (%loss, %d_x, %d_w, %s) '
        f'{{{attrs}, scratch}} : ({t["d_loss"]}, {t["x"]}, {t["w"]}, {t["labels"]}) -> '
        f'({t["loss"]}, {t["d_x"]}, {t["d_w"]}, {t["s"]})'])


def sched_program(shapes: dict, roles: dict[str, str], launches: list[str]) -> ProgramOp:
    """A program of external buffers (``name: (shape, dtype)``, 256-byte aligned) and ``launches``."""
    lines, offset = [], 0
    itemsize = {"fp32": 4, "bf16": 2, "int64": 8, "int32": 4, "int8": 1}
    for name, (shape, kind) in shapes.items():
        size = math.prod(shape) * itemsize[kind]
        role = f" {{{roles[name]} : i64}}" if name in roles else ""
        lines.append(f"  %{name} = mdsl.sched.buffer external offset {offset} bytes {size}{role} : "
                     f"{buffer_type(shape, kind)}")
        offset += -(-size // 256) * 256
    lines += launches
    arenas = f"params = 0, activations = 0, workspace = 0, grads = 0, optimizer = 0, external = {offset}"
    module, _ = parse_module(make_context(), f"mdsl.sched.program @lm_head arenas({arenas}) {{\n"
                                             + "\n".join(lines) + "\n}\n")
    return next(op for op in module.body.block.ops if isinstance(op, ProgramOp))


def problem(dtype: str, reduction: str, seed: int = 0) -> list[np.ndarray]:
    """x, weight, labels (some ignored), d_loss, in the program's dtypes."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((ROWS, WIDTH)) * 0.5).astype(STORAGE[dtype])
    w = (rng.standard_normal((VOCAB, WIDTH)) * 0.5).astype(STORAGE[dtype])
    labels = rng.integers(0, VOCAB, ROWS)
    labels[list(IGNORED)] = -100
    d_loss = rng.uniform(0.5, 2.0, ROWS if reduction == "none" else ()).astype(np.float32)
    return [x, w, labels, d_loss]


def reference(inputs: list[np.ndarray], chunk: int, reduction: str) -> list[np.ndarray]:
    x, w, labels, d_loss = inputs
    loss, lse = fused_lm_head_loss(x, w, labels, reduction=reduction, chunk=chunk)
    d_x, d_w = fused_lm_head_loss_backward(d_loss, x, w, labels, lse, reduction=reduction, chunk=chunk)
    return [loss, lse, d_x, d_w]


def close(got, want, tol: float, what: str) -> None:
    """Within ``tol`` relative to each element and to the tensor's largest value."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    scale = float(np.abs(want).max()) if want.size else 1.0
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * max(scale, 1e-30), err_msg=what)


def check(outputs: list[np.ndarray], expected: list[np.ndarray], dtype: str, forward_tol: float = 0.0) -> None:
    for got, want, name in zip(outputs[:2], expected[:2], ("loss", "lse")):
        if forward_tol:
            close(got, want, forward_tol, name)
        else:
            np.testing.assert_array_equal(got, want, err_msg=name)
    for got, want, name in zip(outputs[2:], expected[2:], ("d_x", "d_weight")):
        close(got, want, BACKWARD_TOL[dtype], name)


def composites(executor: CudaExecutor) -> list[CompositeCommand]:
    return [c for c in executor.commands if isinstance(c, CompositeCommand)]


def gemm_count(command: CompositeCommand) -> int:
    return sum(isinstance(part, GemmCommand) for part in command.parts)


# ---------------------------------------------------------------------------- the emulated device
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("chunk", [4, 5, 0], ids=["divides", "ragged", "all"])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_the_composite_gives_the_chunked_reference(dtype, chunk, reduction):
    program = lm_head_program(dtype, chunk, reduction)
    device = EmulatedDevice()
    executor = CudaExecutor(program, device=device, graphs=False)
    assert executor.fallbacks == []
    assert [c.kernel for c in composites(executor)] == ["fused_lm_head_loss", "fused_lm_head_loss_backward"]
    assert device.checked_launches > 0  # every kernel pointer lies in device memory
    inputs = problem(dtype, reduction)
    check(executor.execute(*inputs), reference(inputs, chunk, reduction), dtype)


def test_a_scratch_of_the_whole_layout_runs_the_launchs_chunks():
    """With room for the logits and the scale, the backward runs ``chunk`` rows at a time: 3 chunks
    of 5, 5 and 2 rows, 3 GEMMs each; a scratch of 304 bytes holds 3 rows of bf16 logits (240 bytes,
    then the scale, or the forward's 12 row losses, at 256): 4 chunks of 3 rows."""
    roomy = CudaExecutor(lm_head_program("bf16", 5, "mean", scratch=4096 * 8), device=EmulatedDevice())
    forward, backward = composites(roomy)
    assert (gemm_count(forward), gemm_count(backward)) == (3, 9)
    tight = CudaExecutor(lm_head_program("bf16", 5, "mean", scratch=256 + 48), device=EmulatedDevice())
    assert gemm_count(composites(tight)[1]) == 12
    inputs = problem("bf16", "mean", seed=1)
    expected = reference(inputs, 5, "mean")
    check(roomy.execute(*inputs), expected, "bf16")
    check(tight.execute(*inputs), expected, "bf16")


def test_the_segments_lie_inside_the_scratch_apart_and_aligned():
    """12 rows of 10 fp32 logits (480 bytes), their bf16 copy at 512 (240 bytes) and the scale at 768
    need 772 bytes; one byte less, and the most rows that fit with the 256-byte alignment are 6."""
    def segments(m):
        return [("logits", (m, 10), np.dtype(np.float32)), ("operand", (m, 10), np.dtype(ml_dtypes.bfloat16)),
                ("d_scale", (), np.dtype(np.float32))]

    for size, fitting in ((772, 12), (771, 6)):
        scratch = TensorRef(1 << 20, (size,), np.dtype(np.int8))
        rows, work = chunked_scratch(scratch, 12, 0, segments)
        spans = sorted((ref.address, ref.address + ref.nbytes) for ref in work.values())
        assert rows == fitting
        assert spans[0][0] == scratch.address and spans[-1][1] <= scratch.address + scratch.nbytes
        assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:]))
        assert all(ref.address % 256 == 0 for ref in work.values())


def test_a_scratch_without_room_for_a_row_falls_back_to_the_reference():
    program = lm_head_program("fp32", 4, "mean", scratch=64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FallbackWarning)
        executor = CudaExecutor(program, device=EmulatedDevice())
    assert {f.kernel for f in executor.fallbacks} == {"fused_lm_head_loss", "fused_lm_head_loss_backward"}
    assert all("holds no row" in f.reason for f in executor.fallbacks)
    inputs = problem("fp32", "mean")
    expected = reference(inputs, 4, "mean")
    for got, want in zip(executor.execute(*inputs), expected):
        np.testing.assert_array_equal(got, want)


def test_int32_labels_and_a_replayed_graph_give_the_same_results():
    program = lm_head_program("fp32", 5, "mean", labels="int32")
    device = EmulatedDevice()
    executor = CudaExecutor(program, device=device)
    inputs = problem("fp32", "mean")
    inputs[2] = inputs[2].astype(np.int32)
    runs = [executor.execute(*inputs) for _ in range(3)]  # eager, captured, replayed
    assert (device.captures, device.replays) == (1, 2)
    check(runs[0], reference(inputs, 5, "mean"), "fp32")
    for run in runs[1:]:
        for got, want in zip(run, runs[0]):
            np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("chunk", [4, 5, 0], ids=["divides", "ragged", "all"])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_the_merged_composite_is_the_forward_and_backward_bit_for_bit(dtype, chunk, reduction):
    """fused_lm_head_loss_grad runs the forward's and the backward's parts on one GEMM of logits per
    chunk: its loss, d_x and d_weight are the two launches' bit for bit, and the merged reference's."""
    merged = CudaExecutor(merged_program(dtype, chunk, reduction), device=EmulatedDevice(), graphs=False)
    split = CudaExecutor(lm_head_program(dtype, chunk, reduction), device=EmulatedDevice(), graphs=False)
    assert merged.fallbacks == []
    (composite,) = composites(merged)
    chunks = len(range(0, ROWS, chunk or ROWS))
    assert composite.kernel == "fused_lm_head_loss_grad" and gemm_count(composite) == 3 * chunks
    assert sum(gemm_count(c) for c in composites(split)) == 4 * chunks
    inputs = problem(dtype, reduction, seed=3)
    got = merged.execute(*inputs)
    loss, _, d_x, d_w = split.execute(*inputs)
    for value, want, name in zip(got, (loss, d_x, d_w), ("loss", "d_x", "d_weight")):
        np.testing.assert_array_equal(value, want, err_msg=name)
    x, w, labels, d_loss = inputs
    expected = fused_lm_head_loss_grad(d_loss, x, w, labels, reduction=reduction, chunk=chunk)
    np.testing.assert_array_equal(got[0], expected[0])
    check([got[0], got[0], *got[1:]], [expected[0], expected[0], *expected[1:]], dtype)


def test_the_merged_scratch_holds_the_chunks_lse_and_every_rows_loss():
    """A scratch smaller than the registry's runs fewer rows per chunk, with the same results
    within rounding; one too small for a row falls back to the reference."""
    roomy = CudaExecutor(merged_program("bf16", 5, "mean"), device=EmulatedDevice())
    # 3 rows: bf16 logits (240 bytes), lse at 256, every row's loss at 512, the scale at 768
    tight = CudaExecutor(merged_program("bf16", 5, "mean", scratch=3 * 256 + 4), device=EmulatedDevice())
    assert (gemm_count(composites(roomy)[0]), gemm_count(composites(tight)[0])) == (9, 12)
    inputs = problem("bf16", "mean", seed=4)
    expected = fused_lm_head_loss_grad(inputs[3], *inputs[:3], reduction="mean", chunk=5)
    for executor in (roomy, tight):
        got = executor.execute(*inputs)
        check([got[0], got[0], *got[1:]], [expected[0], expected[0], *expected[1:]], "bf16", forward_tol=1e-6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FallbackWarning)
        starved = CudaExecutor(merged_program("fp32", 4, "mean", scratch=64), device=EmulatedDevice())
    assert [f.kernel for f in starved.fallbacks] == ["fused_lm_head_loss_grad"]


# ---------------------------------------------------------------------------- the kernel emulator
class KernelEmulatorDevice(EmulatedDevice):
    """The emulated device whose kernel launches run the CUDA kernels themselves on the CPU (the g++
    kernel emulator of tests/gpu/emulator), on the bytes behind the launch's device pointers."""

    name = "kernel-emulated"

    def __init__(self) -> None:
        from emulator import EmulatorRunner

        super().__init__()
        self.runner = EmulatorRunner()
        self.kernel_launches = 0

    def host_pointer(self, address: int) -> int:
        if not address:
            return 0
        base, _ = self.allocation_of(address)
        return self._memory[base].ctypes.data + address - base

    def run_kernel(self, command: KernelCommand) -> None:
        for step in command.steps:
            if not isinstance(step, BoundLaunch):
                self.raw(step.address, step.nbytes)[:] = 0
                continue
            kinds = [kind for _, kind in step.launch.kernel.params]
            args = [self.host_pointer(int(a)) if kind == "ptr" else a for a, kind in zip(step.args, kinds)]
            self.runner.launch(step.launch, args)
            self.kernel_launches += 1


needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="the kernel emulator needs g++")


@needs_gxx
@pytest.mark.parametrize("dtype, chunk, reduction", [("fp32", 4, "mean"), ("fp32", 5, "sum"), ("fp32", 0, "none"),
                                                     ("bf16", 5, "mean"), ("bf16", 0, "sum")])
def test_the_cross_entropy_kernels_run_the_composites_launches(dtype, chunk, reduction):
    program = lm_head_program(dtype, chunk, reduction)
    device = KernelEmulatorDevice()
    executor = CudaExecutor(program, device=device, graphs=False)
    assert executor.fallbacks == []
    inputs = problem(dtype, reduction, seed=2)
    outputs = executor.execute(*inputs)
    launches = sum(len(part.launches) for c in composites(executor) for part in c.kernels)
    assert device.kernel_launches == launches > 0
    check(outputs, reference(inputs, chunk, reduction), dtype, forward_tol=1e-5)


@needs_gxx
@pytest.mark.parametrize("dtype, chunk, reduction", [("fp32", 5, "mean"), ("bf16", 4, "none"), ("bf16", 0, "sum")])
def test_the_cross_entropy_kernels_run_the_merged_composites_launches(dtype, chunk, reduction):
    program = merged_program(dtype, chunk, reduction)
    device = KernelEmulatorDevice()
    executor = CudaExecutor(program, device=device, graphs=False)
    assert executor.fallbacks == []
    inputs = problem(dtype, reduction, seed=5)
    got = executor.execute(*inputs)
    assert device.kernel_launches == sum(len(part.launches) for part in composites(executor)[0].kernels) > 0
    expected = fused_lm_head_loss_grad(inputs[3], *inputs[:3], reduction=reduction, chunk=chunk)
    check([got[0], got[0], *got[1:]], [expected[0], expected[0], *expected[1:]], dtype, forward_tol=1e-5)


# ---------------------------------------------------------------------------- a GPU
@pytest.mark.gpu
@pytest.mark.skipif(CudaDevice.unavailable() is not None, reason=str(CudaDevice.unavailable()))
@pytest.mark.parametrize("dtype, chunk, reduction", [("fp32", 5, "mean"), ("bf16", 4, "mean"), ("bf16", 0, "none"),
                                                     ("bf16", 5, "sum")])
def test_the_composite_on_a_gpu_gives_the_reference(dtype, chunk, reduction):
    program = lm_head_program(dtype, chunk, reduction)
    executor = CudaExecutor(program, device=CudaDevice())
    assert executor.fallbacks == []
    inputs = problem(dtype, reduction, seed=3)
    runs = [executor.execute(*inputs) for _ in range(2)]  # eager, then captured as a CUDA graph
    for outputs in runs:
        check(outputs, reference(inputs, chunk, reduction), dtype, forward_tol=1e-4 if dtype == "fp32" else 2e-2)


@pytest.mark.gpu
@pytest.mark.skipif(CudaDevice.unavailable() is not None, reason=str(CudaDevice.unavailable()))
@pytest.mark.parametrize("dtype, chunk, reduction", [("fp32", 5, "mean"), ("bf16", 4, "mean"), ("bf16", 0, "none")])
def test_the_merged_composite_on_a_gpu_gives_the_reference(dtype, chunk, reduction):
    executor = CudaExecutor(merged_program(dtype, chunk, reduction), device=CudaDevice())
    assert executor.fallbacks == []
    inputs = problem(dtype, reduction, seed=3)
    expected = fused_lm_head_loss_grad(inputs[3], *inputs[:3], reduction=reduction, chunk=chunk)
    for got in [executor.execute(*inputs) for _ in range(2)]:  # eager, then captured as a CUDA graph
        check([got[0], got[0], *got[1:]], [expected[0], expected[0], *expected[1:]], dtype,
              forward_tol=1e-4 if dtype == "fp32" else 2e-2)
