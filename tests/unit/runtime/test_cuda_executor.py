"""The CUDA executor on the emulated device (CPU): the binding layer's addresses, aliases, layer
views, in-place launches, scratch and fallbacks, checked against the CPU schedule executor.

The emulated device runs each command through the numpy reference the CPU executor runs, on
views it decodes from the command's device pointers, so the results must be the CPU executor's;
what differs is only where every byte lives. tests/gpu/test_cuda_executor.py runs the same
comparisons on a GPU."""

import warnings
from pathlib import Path

import numpy as np
import pytest

import modeldsl
from modeldsl.dialects.sched import ProgramOp, RecomputeSegmentOp
from modeldsl.ir import make_context, parse_module
from modeldsl.kernels import cuda
from modeldsl.resolve.imports import STD_ROOT
from modeldsl.runtime import cuda_binding, cuda_commands, cuda_executor
from modeldsl.runtime.cuda_binding import coalesced
from modeldsl.runtime.cuda_commands import (
    AttentionBackwardCommand,
    AttentionCommand,
    CopyCommand,
    FallbackWarning,
    KernelCommand,
    StridedCopyCommand,
    TensorRef,
)
from modeldsl.runtime.cuda_device import DeviceError, EmulatedDevice, fill_pattern
from modeldsl.runtime.cuda_executor import CudaExecutor
from modeldsl.runtime.cuda_train import CudaTrainer
from modeldsl.runtime.executor import ExecutionError
from modeldsl.runtime.optim import AdamWConfig
from modeldsl.runtime.profiles import compile_profile
from modeldsl.runtime.sched_executor import ScheduleExecutor
from modeldsl.runtime.train import Trainer, compile_training_step

# the devices run the references: bitwise on its numpy kernels
pytestmark = pytest.mark.usefixtures("numpy_cpu_kernels")

LLAMA = STD_ROOT / "models" / "llama.module"
EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "tiny_llama"
TOKENS = np.array([[3, 17, 42, 5, 9, 33, 2, 61, 7, 12, 40, 8, 1, 2, 3, 4]])


@pytest.fixture(scope="module")
def model():
    return modeldsl.load(LLAMA, hf=EXAMPLE)


def parsed_program(text: str) -> ProgramOp:
    module, _ = parse_module(make_context(), text)
    return next(op for op in module.body.block.ops if isinstance(op, ProgramOp))


def shifted_labels(tokens: np.ndarray) -> np.ndarray:
    labels = np.full_like(tokens, -100)
    labels[:, :-1] = tokens[:, 1:]
    return labels


# ---------------------------------------------------------------------------- the tiny Llama
@pytest.mark.parametrize("storage", ["fp32", None], ids=["fp32", "bf16"])
def test_the_forward_profile_gives_exactly_the_cpu_executors_logits(model, storage):
    program = compile_profile(model.model, *TOKENS.shape, storage)
    (expected,) = ScheduleExecutor(program, model.weights).execute(*model.inputs(TOKENS, 0))
    device = EmulatedDevice()
    executor = CudaExecutor(program, model.weights, device=device)
    assert executor.fallbacks == []
    assert device.checked_launches > 0  # every plan's pointers were checked against device memory
    attention = [c for c in executor.commands if isinstance(c, AttentionCommand)]
    assert len(attention) == 2  # one per layer
    if "flash_attention" in cuda.PRIMITIVES:  # the plain CUDA kernel behind cuDNN is planned as well
        assert all(c.kernel.plan is not None and c.kernel.launches for c in attention)
    for run in range(3):  # eager, captured and replayed, replayed
        (logits,) = executor.execute(*model.inputs(TOKENS, 0))
        np.testing.assert_array_equal(logits, expected, err_msg=f"run {run}")
    assert (device.captures, device.replays) == (1, 2)


def test_the_layer_loop_is_unrolled_over_layer_slices_of_the_stacked_weights(model):
    program = compile_profile(model.model, *TOKENS.shape, "fp32")
    executor = CudaExecutor(program, model.weights, device=EmulatedDevice())
    stacked = next(ref for name, ref in executor.bound.tagged["param"].items() if name == "blocks.ln1.weight")
    norms = [c for c in executor.commands if isinstance(c, KernelCommand) and c.kernel == "rmsnorm"]
    layer_weights = [c.arguments[1].address for c in norms[0:2]]  # ln1 per layer (ln2 is fused), then the final norm
    assert layer_weights == [stacked.address, stacked.address + stacked.nbytes // 2]


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_training_on_the_device_follows_the_cpu_trainer(dtype):
    """4 steps of 2 micro-batches: the CPU trainer's losses, gradient norms and trained weights; no
    allocation after the first step; the programs replay CUDA graphs; nothing falls back."""
    config = AdamWConfig(lr=3e-3, warmup_steps=2, total_steps=4, clip_norm=1.0)
    rng = np.random.default_rng(5)
    steps = [[rng.integers(0, 384, (2, 8)) for _ in range(2)] for _ in range(4)]
    cpu = Trainer(modeldsl.load(LLAMA, hf=EXAMPLE), config, dtype=dtype)
    device = EmulatedDevice()
    gpu = CudaTrainer(modeldsl.load(LLAMA, hf=EXAMPLE), config, dtype=dtype, device=device)
    allocations = []
    for micro in steps:
        batches = [(tokens, shifted_labels(tokens)) for tokens in micro]
        expected = cpu.train_step(batches)
        assert gpu.train_step(batches) == pytest.approx(expected, rel=1e-5)
        assert gpu.grad_norm == pytest.approx(cpu.grad_norm, rel=1e-5)
        allocations.append(device.allocations)
    assert allocations[1:] == allocations[:1] * 3
    assert gpu.programs[(2, 8)].fallbacks == [] and gpu.optimizer.fallbacks == []
    assert device.captures == 2 and device.replays >= 6
    assert gpu.peak_bytes() == device.peak_bytes > 0
    cpu.sync_weights()
    gpu.sync_weights()
    for name, weight in cpu.model.weights.items():
        np.testing.assert_allclose(gpu.model.weights[name], weight, rtol=1e-5, atol=1e-7, err_msg=name)
    for name, moments in cpu.state_arrays().items():
        np.testing.assert_allclose(gpu.state_arrays()[name], moments, rtol=1e-5, atol=1e-9, err_msg=name)


def test_restore_puts_the_moments_back_on_the_device():
    trainer = CudaTrainer(modeldsl.load(LLAMA, hf=EXAMPLE), AdamWConfig(lr=1e-3), dtype="fp32",
                          device=EmulatedDevice())
    state = {name: np.full(array.shape, 0.5, np.float32) for name, array in trainer.optimizer.moments.items()}
    trainer.restore(7, state)
    assert trainer.step == 7
    assert all((trainer.state_arrays()[name] == 0.5).all() for name in state)
    with pytest.raises(ValueError, match="no moments"):
        trainer.restore(1, dict(list(state.items())[1:]))


# ---------------------------------------------------------------------------- addresses
VIEWS = """
mdsl.sched.program @views arenas(params = 512, activations = 256, workspace = 0, grads = 0, optimizer = 0,
    external = 1024) {
  %w = mdsl.sched.buffer params offset 0 bytes 384 {param = "w"} : !mdsl.sched.buffer<[2, 6, 8], fp32>
  %x = mdsl.sched.buffer external offset 0 bytes 192 {input = 0 : i64} : !mdsl.sched.buffer<[6, 8], fp32>
  %y = mdsl.sched.buffer external offset 256 bytes 384 {output = 0 : i64} : !mdsl.sched.buffer<[2, 6, 8], fp32>
  %acc = mdsl.sched.buffer activations offset 0 bytes 192 : !mdsl.sched.buffer<[2, 3, 8], fp32>
  %flat = mdsl.sched.buffer activations offset 0 bytes 192 alias_of %acc : !mdsl.sched.buffer<[6, 8], fp32>
      from !mdsl.sched.buffer<[2, 3, 8], fp32>
  %second = mdsl.sched.buffer activations offset 96 bytes 96 alias_of %acc : !mdsl.sched.buffer<[3, 8], fp32>
      from !mdsl.sched.buffer<[2, 3, 8], fp32>
  %half = mdsl.sched.buffer external offset 640 bytes 96 {output = 1 : i64} : !mdsl.sched.buffer<[3, 8], fp32>
  %z = mdsl.sched.buffer external offset 768 bytes 192 {output = 2 : i64} : !mdsl.sched.buffer<[8, 6], fp32>
  mdsl.sched.layer_loop %l = 0 to 2 {
    %wl = mdsl.sched.layer_view %w[%l] : !mdsl.sched.buffer<[2, 6, 8], fp32> -> !mdsl.sched.buffer<[6, 8], fp32>
    %rows = mdsl.sched.layer_view %w[%l] {rows = array<i64: 2, 3>} : !mdsl.sched.buffer<[2, 6, 8], fp32>
        -> !mdsl.sched.buffer<[3, 8], fp32>
    %yl = mdsl.sched.layer_view %y[%l] : !mdsl.sched.buffer<[2, 6, 8], fp32> -> !mdsl.sched.buffer<[6, 8], fp32>
    %al = mdsl.sched.layer_view %acc[%l] : !mdsl.sched.buffer<[2, 3, 8], fp32> -> !mdsl.sched.buffer<[3, 8], fp32>
    mdsl.sched.launch "add"(%x, %wl) -> (%yl) : (!mdsl.sched.buffer<[6, 8], fp32>, !mdsl.sched.buffer<[6, 8], fp32>)
        -> (!mdsl.sched.buffer<[6, 8], fp32>)
    mdsl.sched.launch "scale"(%rows) -> (%al) {factor = 2.0 : f64} : (!mdsl.sched.buffer<[3, 8], fp32>)
        -> (!mdsl.sched.buffer<[3, 8], fp32>)
  }
  mdsl.sched.launch "scale"(%second) -> (%half) {factor = 0.5 : f64} : (!mdsl.sched.buffer<[3, 8], fp32>)
      -> (!mdsl.sched.buffer<[3, 8], fp32>)
  mdsl.sched.launch "add"(%second, %x_rows) -> (%second) {inplace} : (!mdsl.sched.buffer<[3, 8], fp32>,
      !mdsl.sched.buffer<[3, 8], fp32>) -> (!mdsl.sched.buffer<[3, 8], fp32>)
  mdsl.sched.launch "transpose"(%flat) -> (%z) {dim0 = 0 : i64, dim1 = 1 : i64} : (!mdsl.sched.buffer<[6, 8], fp32>)
      -> (!mdsl.sched.buffer<[8, 6], fp32>)
}
"""
X_ROWS = ('  %x_rows = mdsl.sched.buffer external offset 96 bytes 96 alias_of %x : !mdsl.sched.buffer<[3, 8], fp32> '
          'from !mdsl.sched.buffer<[6, 8], fp32>\n')


@pytest.fixture
def views_program():
    text = VIEWS.replace("  mdsl.sched.layer_loop", X_ROWS + "  mdsl.sched.layer_loop", 1)
    return parsed_program(text)


def test_aliases_layer_views_and_row_ranges_resolve_to_device_addresses(views_program):
    device = EmulatedDevice()
    rng = np.random.default_rng(0)
    weights = {"w": rng.standard_normal((2, 6, 8)).astype(np.float32)}
    executor = CudaExecutor(views_program, weights, device=device)
    P, A, E = (executor.arenas[a].address for a in ("params", "activations", "external"))
    addresses = [[ref.address for ref in c.refs] for c in executor.commands if isinstance(c, KernelCommand)]
    assert addresses == [
        [E, P, E + 256], [P + 64, A],  # layer 0: all of w[0]; rows 2..4 of w[0] into acc[0]
        [E, P + 192, E + 448], [P + 192 + 64, A + 96],  # layer 1
        [A + 96, E + 640],  # the alias at byte 96 of acc
        [A + 96, E + 96, A + 96],  # in place, with an alias of the input
    ]
    inplace = executor.commands[5]
    assert inplace.primitive == "add_inplace" and inplace.launches[0].args[:2] == (A + 96, E + 96)
    transpose = executor.commands[6]
    assert isinstance(transpose, StridedCopyCommand)
    assert (transpose.dst, transpose.src, transpose.shape, transpose.src_strides) == (E + 768, A, (8, 6), (1, 8))
    x = rng.standard_normal((6, 8)).astype(np.float32)
    expected = ScheduleExecutor(views_program, weights).execute(x)
    for got, want in zip(executor.execute(x), expected, strict=True):
        np.testing.assert_array_equal(got, want)


def test_a_shared_arena_is_used_where_it_is_given_and_must_be_large_enough(views_program):
    device = EmulatedDevice()
    first = CudaExecutor(views_program, {"w": np.ones((2, 6, 8), np.float32)}, device=device)
    second = CudaExecutor(views_program, arenas={"params": first.arenas["params"]}, device=device)
    assert second.arenas["params"] == first.arenas["params"]
    assert second.allocations == first.allocations - 1  # all but the params arena
    np.testing.assert_array_equal(second.params["w"].read(), np.ones((2, 6, 8)))
    small = cuda_executor.DeviceArena(first.arenas["params"].address, 64)
    with pytest.raises(ExecutionError, match="shared params arena has 64 bytes"):
        CudaExecutor(views_program, arenas={"params": small}, device=device)


def test_tagged_buffers_are_read_and_written_through_the_device(views_program):
    executor = CudaExecutor(views_program, {"w": np.zeros((2, 6, 8))}, device=EmulatedDevice())
    executor.params["w"].write(np.arange(96).reshape(2, 6, 8))
    assert np.asarray(executor.params["w"])[1, 5, 7] == 95
    assert executor.params["w"].dtype == np.float32 and executor.params["w"].shape == (2, 6, 8)


# ---------------------------------------------------------------------------- fallbacks
FALLBACKS = """
mdsl.sched.program @fallbacks arenas(params = 256, activations = 256, workspace = 0, grads = 0, optimizer = 0,
    external = 512) {
  %g = mdsl.sched.buffer params offset 0 bytes 32 {param = "g"} : !mdsl.sched.buffer<[8], fp32>
  %b = mdsl.sched.buffer params offset 128 bytes 32 {param = "b"} : !mdsl.sched.buffer<[8], fp32>
  %x = mdsl.sched.buffer external offset 0 bytes 128 {input = 0 : i64} : !mdsl.sched.buffer<[4, 8], fp32>
  %y = mdsl.sched.buffer external offset 128 bytes 128 {output = 0 : i64} : !mdsl.sched.buffer<[4, 8], fp32>
  %s = mdsl.sched.buffer external offset 256 bytes 128 {output = 1 : i64} : !mdsl.sched.buffer<[4, 8], fp32>
  %mean = mdsl.sched.buffer activations offset 0 bytes 16 : !mdsl.sched.buffer<[4], fp32>
  %rstd = mdsl.sched.buffer activations offset 128 bytes 16 : !mdsl.sched.buffer<[4], fp32>
  mdsl.sched.launch "layernorm"(%x, %g, %b) -> (%y, %mean, %rstd) {eps = 1.0e-05 : f64}
      : (!mdsl.sched.buffer<[4, 8], fp32>, !mdsl.sched.buffer<[8], fp32>, !mdsl.sched.buffer<[8], fp32>)
      -> (!mdsl.sched.buffer<[4, 8], fp32>, !mdsl.sched.buffer<[4], fp32>, !mdsl.sched.buffer<[4], fp32>)
  mdsl.sched.launch "softmax"(%y) -> (%s) {dim = 0 : i64} : (!mdsl.sched.buffer<[4, 8], fp32>)
      -> (!mdsl.sched.buffer<[4, 8], fp32>)
  mdsl.sched.launch "scale"(%s) -> (%s) {factor = 3.0 : f64, inplace} : (!mdsl.sched.buffer<[4, 8], fp32>)
      -> (!mdsl.sched.buffer<[4, 8], fp32>)
}
"""


def test_launches_without_a_cuda_kernel_run_their_reference_on_host_copies(monkeypatch):
    """layernorm has no CUDA kernel, softmax over dim 0 is not covered: both run on host copies
    (reported, warned once per primitive), the program still gives the CPU executor's results,
    and it is not captured as a graph."""
    monkeypatch.setattr(cuda_commands, "_WARNED", set())
    program = parsed_program(FALLBACKS)
    rng = np.random.default_rng(1)
    weights = {"g": rng.standard_normal(8), "b": rng.standard_normal(8)}
    device = EmulatedDevice()
    with pytest.warns(FallbackWarning) as caught:
        executor = CudaExecutor(program, weights, device=device)
    assert [(f.kernel, "CUDA kernel" in f.reason or "dim 0" in f.reason) for f in executor.fallbacks] == [
        ("layernorm", True), ("softmax", True)]
    assert len(caught) == 2
    with warnings.catch_warnings(record=True) as again:
        warnings.simplefilter("always")
        CudaExecutor(program, weights, device=device)
    assert not [w for w in again if issubclass(w.category, FallbackWarning)]  # once per primitive
    x = rng.standard_normal((4, 8)).astype(np.float32)
    expected = ScheduleExecutor(program, weights).execute(x)
    for _ in range(3):
        for got, want in zip(executor.execute(x), expected, strict=True):
            np.testing.assert_array_equal(got, want)
    assert device.captures == 0 and not executor.capturable


# ---------------------------------------------------------------------------- pieces
def test_memset_patterns_repeat_the_stored_value():
    assert fill_pattern(0.0, np.dtype(np.float32)) == b"\0"
    assert fill_pattern(1.0, np.dtype(np.float32)) == np.float32(1).tobytes()
    assert fill_pattern(-1, np.dtype(np.int64)) == b"\xff"
    with pytest.raises(cuda.NotCovered):
        fill_pattern(3.0, np.dtype(np.float64))


def test_strided_copies_coalesce_contiguous_runs():
    assert coalesced((2, 3, 4), (12, 4, 1), (12, 4, 1)) == ((24,), (1,), (1,))
    assert coalesced((2, 1, 6, 4), (24, 24, 4, 1), (4, 4, 8, 1)) == ((2, 6, 4), (24, 4, 1), (4, 8, 1))
    assert isinstance(cuda_binding.copy_command((0, 64, (4, 8), (8, 1), (8, 1)), 4), CopyCommand)


def test_the_emulated_device_rejects_addresses_outside_its_allocations():
    device = EmulatedDevice()
    base = device.allocate(100)
    device.upload(base, np.arange(25, dtype=np.float32))
    with pytest.raises(DeviceError, match="no allocation"):
        device.download(base + 96, 8)
    with pytest.raises(DeviceError):
        device.prepare(KernelCommand(steps=(cuda_commands.BoundMemset(base + 64, 64),)))
    device.begin_capture()
    with pytest.raises(DeviceError, match="CUDA graph"):
        device.upload(base, np.zeros(1))
    device.end_capture()
    assert TensorRef(base, (5, 5), np.dtype(np.float32)).rows(1, 2).address == base + 20


# ---------------------------------------------------------------------------- the CUDA device's mappings
def column_major_matmul(problem, memories, op_a: bool, op_b: bool) -> np.ndarray:
    """What cuBLASLt computes for a GemmProblem: column-major matrices read from flat memory with
    the layouts' leading dims and batch strides; returns D's memory."""
    (_, ar, ac, ald, batch, astride), (_, br, bc, bld, _, bstride), (_, cr, cc, cld, _, cstride) = problem.layouts

    def matrix(memory, rows, cols, ld, offset):
        return np.array([[memory[offset + c * ld + r] for c in range(cols)] for r in range(rows)])

    out = np.zeros(batch * cstride if batch > 1 else cr * cc)
    for i in range(batch):
        a = matrix(memories[0], ar, ac, ald, i * astride)
        b = matrix(memories[1], br, bc, bld, i * bstride)
        d = (a.T if op_a else a) @ (b.T if op_b else b)
        for c in range(cc):
            out[i * cstride + c * cld:i * cstride + c * cld + cr] = d[:, c]
    return out


@pytest.mark.parametrize("a_shape, b_shape, transa, transb", [
    ((2, 3, 4), (5, 4), False, True),  # x @ W^T, the batch folded into M
    ((2, 3, 4), (4, 5), False, False),
    ((4, 3), (4, 5), True, False),  # a weight gradient: A^T @ B
    ((2, 4, 3), (2, 5, 4), True, True),  # batched, both transposed
    ((2, 4, 3), (4, 5), True, False),  # a batched A^T times one B (batch stride 0)
])
def test_the_cublaslt_problem_of_a_gemm_is_its_row_major_product(a_shape, b_shape, transa, transb):
    from modeldsl.runtime.cuda_device import gemm_problem

    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(a_shape), rng.standard_normal(b_shape)
    expected = np.swapaxes(a, -1, -2) if transa else a
    expected = expected @ (np.swapaxes(b, -1, -2) if transb else b)

    def ref(shape):
        return TensorRef(0, shape, np.dtype(np.float32))

    command = cuda_commands.GemmCommand(a=ref(a_shape), b=ref(b_shape), c=ref(expected.shape), transa=transa,
                                        transb=transb)
    problem = gemm_problem(command)
    got = column_major_matmul(problem, (b.reshape(-1), a.reshape(-1)), transb, transa)  # cuBLASLt's A is B
    np.testing.assert_allclose(got.reshape(expected.shape), expected, rtol=1e-12)


def test_cudnn_masks_follow_the_reference_masks():
    from types import SimpleNamespace

    from modeldsl.runtime.cuda_device import attention_dims, mask_arguments

    cudnn = SimpleNamespace(diagonal_alignment=SimpleNamespace(BOTTOM_RIGHT="bottom_right"))
    assert mask_arguments(cudnn, True, 0) == {"diagonal_alignment": "bottom_right", "diagonal_band_right_bound": 0}
    assert mask_arguments(cudnn, True, 4) == {"diagonal_alignment": "bottom_right", "diagonal_band_right_bound": 0,
                                              "diagonal_band_left_bound": 4}
    assert mask_arguments(cudnn, False, 4)["diagonal_band_right_bound"] == 3
    assert mask_arguments(cudnn, False, 0) == {}
    assert attention_dims((2, 16, 4, 32), "bthd") == ([2, 4, 16, 32], [2048, 32, 128, 1])


def test_a_fully_recomputed_training_step_gives_the_cpu_schedule_executors_gradients():
    """Recompute segments (with their layer views of row ranges) run on the device executor as on
    the CPU: the same loss and the same gradients, bit for bit, with every block replayed."""
    model = modeldsl.load(LLAMA, hf=EXAMPLE, dtype="fp32")
    program = compile_training_step(model.model, 2, 8, "fp32", recompute="full")
    assert any(isinstance(op, RecomputeSegmentOp) and op.layer is not None for op in program.walk())
    tokens = np.random.default_rng(2).integers(0, 384, (2, 8)).astype(np.int32)
    inputs = [*model.inputs(tokens, 0), shifted_labels(tokens).astype(np.int64), np.array(1.0, np.float32)]
    cpu = ScheduleExecutor(program, model.weights)
    cpu.arenas["grads"][:] = 0
    (loss,) = cpu.execute(*inputs)
    gpu = CudaExecutor(program, model.weights, device=EmulatedDevice())
    assert gpu.fallbacks == []
    grads = gpu.arenas["grads"]
    gpu.device.upload(grads.address, np.zeros(grads.nbytes, np.uint8))
    (device_loss,) = gpu.execute(*inputs)
    assert device_loss == loss
    np.testing.assert_array_equal(gpu.device.download(grads.address, grads.nbytes), cpu.arenas["grads"])
    assert np.abs(cpu.arenas["grads"].view(np.float32)).max() > 0


# ---------------------------------------------------------------------------- attention launches
BTHD_BACKWARD = """
mdsl.sched.program @attention_backward arenas(params = 0, activations = 0, workspace = 0, grads = 0, optimizer = 0,
    external = 4096) {
  %d_out = mdsl.sched.buffer external offset 0 bytes 384 {input = 0 : i64} : !mdsl.sched.buffer<[1, 6, 4, 4], fp32>
  %q = mdsl.sched.buffer external offset 384 bytes 384 {input = 1 : i64} : !mdsl.sched.buffer<[1, 6, 4, 4], fp32>
  %k = mdsl.sched.buffer external offset 768 bytes 192 {input = 2 : i64} : !mdsl.sched.buffer<[1, 6, 2, 4], fp32>
  %v = mdsl.sched.buffer external offset 960 bytes 192 {input = 3 : i64} : !mdsl.sched.buffer<[1, 6, 2, 4], fp32>
  %out = mdsl.sched.buffer external offset 1152 bytes 384 {input = 4 : i64} : !mdsl.sched.buffer<[1, 6, 4, 4], fp32>
  %lse = mdsl.sched.buffer external offset 1536 bytes 96 {input = 5 : i64} : !mdsl.sched.buffer<[1, 4, 6], fp32>
  %d_q = mdsl.sched.buffer external offset 1664 bytes 384 {output = 0 : i64} : !mdsl.sched.buffer<[1, 6, 4, 4], fp32>
  %d_k = mdsl.sched.buffer external offset 2048 bytes 192 {output = 1 : i64} : !mdsl.sched.buffer<[1, 6, 2, 4], fp32>
  %d_v = mdsl.sched.buffer external offset 2304 bytes 192 {output = 2 : i64} : !mdsl.sched.buffer<[1, 6, 2, 4], fp32>
  mdsl.sched.attention_backward %q, %k, %v, %out, %d_out, %lse -> %d_q, %d_k, %d_v
      {layout = "bthd", softcap = 2.0 : f64}
      : !mdsl.sched.buffer<[1, 6, 4, 4], fp32>, !mdsl.sched.buffer<[1, 6, 2, 4], fp32>,
        !mdsl.sched.buffer<[1, 6, 2, 4], fp32>, !mdsl.sched.buffer<[1, 6, 4, 4], fp32>,
        !mdsl.sched.buffer<[1, 6, 4, 4], fp32>, !mdsl.sched.buffer<[1, 4, 6], fp32>
      -> !mdsl.sched.buffer<[1, 6, 4, 4], fp32>, !mdsl.sched.buffer<[1, 6, 2, 4], fp32>,
         !mdsl.sched.buffer<[1, 6, 2, 4], fp32>
}
"""


def test_an_attention_backward_keeps_its_layout_and_softcap():
    """An ``attention_backward`` (the backward of a training step) is an attention command (cuDNN's SDPA
    backward or the plain kernel) with the op's layout and softcap: a bthd backward run as bhtd would read
    every tensor in the wrong order."""
    from modeldsl.kernels import reference as ref

    executor = CudaExecutor(parsed_program(BTHD_BACKWARD), {}, device=EmulatedDevice())
    (command,) = executor.commands
    assert isinstance(command, AttentionBackwardCommand) and (command.layout, command.softcap) == ("bthd", 2.0)
    assert command.kernel is not None and command.kernel.params["layout"] == "bthd"
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal(s).astype(np.float32) * 3 for s in ((1, 6, 4, 4), (1, 6, 2, 4), (1, 6, 2, 4)))
    out, lse = ref.flash_attention(q, k, v, layout="bthd", softcap=2.0)
    d_out = rng.standard_normal(out.shape).astype(np.float32)
    expected = ref.flash_attention_backward(d_out, q, k, v, out, lse, layout="bthd", softcap=2.0)
    for got, want in zip(executor.execute(d_out, q, k, v, out, lse), expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------- the std families
@pytest.mark.parametrize("name", ["gemma3-groups", "gemma2-softcap", "gemma2-odd-layers", "phi3-longrope",
                                  "qwen2-mixed-windows", "olmo2-tied-biases", "granite-multipliers"])
def test_the_families_forward_gives_the_cpu_executors_logits_on_the_device(name):
    """Each family's forward profile (two RoPE tables and groups of six for Gemma 3, softcapped attention,
    stack tails, partial rotary, several stacks, post-norms, multipliers) runs on the device with no launch
    left to the host, giving the CPU schedule executor's logits."""
    from hf_checkpoints import CASES, cached_checkpoint

    arch, module, config = CASES[name]
    loaded = modeldsl.load(STD_ROOT / "models" / module, hf=cached_checkpoint(arch, **config))
    program = compile_profile(loaded.model, *TOKENS.shape, "fp32")
    inputs = loaded.inputs(TOKENS % loaded.config("vocab_size"), 0)
    (expected,) = ScheduleExecutor(program, loaded.weights).execute(*inputs)
    executor = CudaExecutor(program, loaded.weights, device=EmulatedDevice())
    assert executor.fallbacks == []
    (logits,) = executor.execute(*inputs)
    np.testing.assert_array_equal(logits, expected)
