"""The CUDA executor on a GPU (CudaDevice) against the CPU schedule executor and the emulated device.

The tiny Llama's forward logits and a full training run (4 AdamW steps of 2 micro-batches) on
the GPU give the CPU executor's (fp32: relative error at most 1e-5 of the largest value; bf16:
1e-2); the trained weights agree after ``sync_weights``; nothing is allocated after the first
step; the second ``execute`` is captured as a CUDA graph and its replays give the eager results.
Hand-written programs check the attention commands (cuDNN's SDPA and the plain CUDA attention
kernel of kernels/cuda.py: causal, GQA, sliding window, both layouts, forward and backward) and
the GEMM epilogues (cuBLASLt) against the emulated device, which runs the numpy references.

Skipped without cuda-python or a CUDA device: ``python -m pytest -m gpu tests/gpu`` on a GPU
machine (tools/gpu_check.sh).
"""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import modeldsl
from modeldsl.dialects.sched import ProgramOp
from modeldsl.ir import make_context, parse_module
from modeldsl.resolve.imports import STD_ROOT
from modeldsl.runtime.cuda_device import CudaDevice, EmulatedDevice
from modeldsl.runtime.cuda_executor import CudaExecutor
from modeldsl.runtime.cuda_train import CudaTrainer
from modeldsl.runtime.optim import AdamWConfig
from modeldsl.runtime.profiles import compile_profile
from modeldsl.runtime.sched_executor import ScheduleExecutor
from modeldsl.runtime.train import Trainer

pytestmark = pytest.mark.gpu

_REASON = CudaDevice.unavailable()
if _REASON is not None:
    pytest.skip(_REASON, allow_module_level=True)

LLAMA = STD_ROOT / "models" / "llama.module"
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tiny_llama"
TOKENS = np.array([[3, 17, 42, 5, 9, 33, 2, 61, 7, 12, 40, 8, 1, 2, 3, 4]])
TOL = {"fp32": 1e-5, "bf16": 1e-2}
# fp32 attention: cuDNN has none; the plain CUDA kernel runs it, or the host where kernels/cuda.py has none
ATTENTION = {"attention", "attention_backward"}


@pytest.fixture(scope="module")
def device():
    return CudaDevice()


@pytest.fixture(scope="module")
def model():
    return modeldsl.load(LLAMA, hf=EXAMPLE)


def close(got, want, tol: float, what: str = "") -> None:
    """Within ``tol`` relative to each element and to the tensor's largest value."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    scale = float(np.abs(want).max()) if want.size else 1.0
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * max(scale, 1e-30), err_msg=what)


def shifted_labels(tokens: np.ndarray) -> np.ndarray:
    labels = np.full_like(tokens, -100)
    labels[:, :-1] = tokens[:, 1:]
    return labels


def parsed_program(text: str) -> ProgramOp:
    module, _ = parse_module(make_context(), text)
    return next(op for op in module.body.block.ops if isinstance(op, ProgramOp))


# ---------------------------------------------------------------------------- the tiny Llama
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_forward_logits_match_the_cpu_executor_and_replay_from_a_graph(device, model, dtype):
    program = compile_profile(model.model, *TOKENS.shape, "fp32" if dtype == "fp32" else None)
    (expected,) = ScheduleExecutor(program, model.weights).execute(*model.inputs(TOKENS, 0))
    executor = CudaExecutor(program, model.weights, device=device)
    assert {f.kernel for f in executor.fallbacks} <= (ATTENTION if dtype == "fp32" else set())
    captures = device.captures
    runs = [executor.execute(*model.inputs(TOKENS, 0))[0] for _ in range(3)]  # eager, captured, replayed
    close(runs[0], expected, TOL[dtype], "logits")
    if executor.capturable:
        assert device.captures == captures + 1
        np.testing.assert_array_equal(runs[1], runs[0])
        np.testing.assert_array_equal(runs[2], runs[0])


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_training_on_the_gpu_follows_the_cpu_trainer(device, dtype):
    config = AdamWConfig(lr=3e-3, warmup_steps=2, total_steps=4, clip_norm=1.0)
    rng = np.random.default_rng(5)
    steps = [[rng.integers(0, 384, (2, 8)) for _ in range(2)] for _ in range(4)]
    cpu = Trainer(modeldsl.load(LLAMA, hf=EXAMPLE), config, dtype=dtype)
    gpu = CudaTrainer(modeldsl.load(LLAMA, hf=EXAMPLE), config, dtype=dtype, device=device)
    allocations = []
    for step, micro in enumerate(steps):
        batches = [(tokens, shifted_labels(tokens)) for tokens in micro]
        expected = cpu.train_step(batches)
        assert gpu.train_step(batches) == pytest.approx(expected, rel=TOL[dtype]), step
        allocations.append(device.allocations)
    assert allocations[1:] == allocations[:1] * 3, "allocations after the first step"
    assert {f.kernel for f in gpu.programs[(2, 8)].fallbacks} <= (ATTENTION if dtype == "fp32" else set())
    assert gpu.optimizer.fallbacks == []
    cpu.sync_weights()
    gpu.sync_weights()
    for name, weight in cpu.model.weights.items():
        close(gpu.model.weights[name], weight, 1e-4 if dtype == "fp32" else 1e-2, name)
    assert gpu.peak_bytes() > 0


def test_a_replayed_training_step_equals_the_eager_one(device, model):
    """The bf16 training program runs eagerly once, is captured on the second call and replayed;
    with the same inputs and the grads zeroed in between, every call gives the same loss and the
    same gradients (up to the order of atomic additions: the embedding gradient, cuDNN's backward)."""
    trainer = CudaTrainer(modeldsl.load(LLAMA, hf=EXAMPLE), AdamWConfig(lr=1e-3), dtype="bf16", device=device)
    tokens = np.random.default_rng(2).integers(0, 384, (2, 8))
    executor = trainer.executor(*tokens.shape)
    assert executor.capturable
    results = []
    for _ in range(3):
        loss = trainer.accumulate(tokens, shifted_labels(tokens))
        grads = {name: array.read() for name, array in trainer.optimizer.grads.items()}
        for array in trainer.optimizer.grads.values():
            array.write(0)
        results.append((loss, grads))
    assert executor.graph is not None and executor.runs == 3
    for loss, grads in results[1:]:
        assert loss == results[0][0]
        for name, grad in grads.items():
            close(grad, results[0][1][name], 1e-2, name)


# ---------------------------------------------------------------------------- attention
def attention_program(layout: str, attrs: str, dtype: str) -> str:
    """q, k, v, d_out in; out, lse, d_q, d_k, d_v out: attention then its backward (2 kv heads for 4
    query heads), with ``attrs`` (an attribute dict's entries) in ``layout``."""
    entries = ", ".join(e for e in (attrs, 'layout = "bthd"' if layout == "bthd" else "") if e)
    attrs = f"{{{entries}}}" if entries else ""
    q, kv = ("[2, 4, 16, 32]", "[2, 2, 16, 32]") if layout == "bhtd" else ("[2, 16, 4, 32]", "[2, 16, 2, 32]")
    Q, KV = f"!mdsl.sched.buffer<{q}, {dtype}>", f"!mdsl.sched.buffer<{kv}, {dtype}>"
    L = "!mdsl.sched.buffer<[2, 4, 16], fp32>"
    item = 4 if dtype == "fp32" else 2
    buffers = [("q", Q, 4096, "input = 0"), ("k", KV, 2048, "input = 1"), ("v", KV, 2048, "input = 2"),
               ("do", Q, 4096, "input = 3"), ("o", Q, 4096, "output = 0"), ("lse", L, 128, "output = 1"),
               ("dq", Q, 4096, "output = 2"), ("dk", KV, 2048, "output = 3"), ("dv", KV, 2048, "output = 4")]
    lines, offset = [], 0
    for name, type_, elements, role in buffers:
        size = elements * (4 if name == "lse" else item)
        lines.append(f"  %{name} = mdsl.sched.buffer external offset {offset} bytes {size} {{{role} : i64}} : {type_}")
        offset += -(-size // 256) * 256
    lines.append(f"  mdsl.sched.attention %q, %k, %v -> %o, %lse {attrs} : {Q}, {KV}, {KV} -> {Q}, {L}")
    lines.append(f"  mdsl.sched.attention_backward %q, %k, %v, %o, %do, %lse -> %dq, %dk, %dv {attrs} : "
                 f"{Q}, {KV}, {KV}, {Q}, {Q}, {L} -> {Q}, {KV}, {KV}")
    arenas = f"params = 0, activations = 0, workspace = 0, grads = 0, optimizer = 0, external = {offset}"
    return f"mdsl.sched.program @attention arenas({arenas}) {{\n" + "\n".join(lines) + "\n}\n"


@pytest.mark.parametrize("backend, dtype", [("cudnn", "bf16"), ("kernel", "bf16"), ("kernel", "fp32")])
@pytest.mark.parametrize("layout", ["bhtd", "bthd"])
@pytest.mark.parametrize("attrs", ["", "window = 5 : i64", "causal = false",
                                   "causal = false, window = 3 : i64, scale = 0.25 : f64"])
def test_attention_matches_the_reference(backend, dtype, layout, attrs):
    """cuDNN's SDPA and the plain CUDA attention kernel (kernels/cuda.py), forward and backward."""
    program = parsed_program(attention_program(layout, attrs, dtype))
    rng = np.random.default_rng(3)
    gpu = CudaExecutor(program, device=CudaDevice(attention=backend))
    reference = CudaExecutor(program, device=EmulatedDevice())
    storage = ml_dtypes.bfloat16 if dtype == "bf16" else np.float32
    inputs = [rng.standard_normal(ref.shape).astype(storage) for ref in gpu.inputs]
    assert gpu.fallbacks == []
    tol = 2e-2 if dtype == "bf16" else 1e-4
    for got, want, name in zip(gpu.execute(*inputs), reference.execute(*inputs), ("o", "lse", "dq", "dk", "dv")):
        close(got, want, tol, name)


# ---------------------------------------------------------------------------- GEMM epilogues (cuBLASLt)
X, W, B, Y = ("!mdsl.sched.buffer<[2, 16, 64], bf16>", "!mdsl.sched.buffer<[48, 64], bf16>",
              "!mdsl.sched.buffer<[48], bf16>", "!mdsl.sched.buffer<[2, 16, 48], bf16>")
G2, X2, DW = ("!mdsl.sched.buffer<[32, 48], bf16>", "!mdsl.sched.buffer<[32, 64], bf16>",
              "!mdsl.sched.buffer<[48, 64], fp32>")
GEMMS = f"""
mdsl.sched.program @gemms arenas(params = 0, activations = 0, workspace = 0, grads = 0, optimizer = 0, \
external = 65536) {{
  %x = mdsl.sched.buffer external offset 0 bytes 4096 {{input = 0 : i64}} : {X}
  %w = mdsl.sched.buffer external offset 4096 bytes 6144 {{input = 1 : i64}} : {W}
  %b = mdsl.sched.buffer external offset 12288 bytes 96 {{input = 2 : i64}} : {B}
  %g = mdsl.sched.buffer external offset 12544 bytes 3072 {{input = 3 : i64}} : {Y}
  %y = mdsl.sched.buffer external offset 16384 bytes 3072 {{output = 0 : i64}} : {Y}
  %yt = mdsl.sched.buffer external offset 20480 bytes 3072 {{output = 1 : i64}} : {Y}
  %aux = mdsl.sched.buffer external offset 24576 bytes 3072 {{output = 2 : i64}} : {Y}
  %dg = mdsl.sched.buffer external offset 28672 bytes 3072 {{output = 3 : i64}} : {Y}
  %db = mdsl.sched.buffer external offset 32768 bytes 96 {{output = 4 : i64}} : {B}
  %dw = mdsl.sched.buffer external offset 36864 bytes 12288 {{output = 5 : i64}} : {DW}
  %g2d = mdsl.sched.buffer external offset 0 bytes 3072 alias_of %g : {G2} from {Y}
  %x2d = mdsl.sched.buffer external offset 0 bytes 4096 alias_of %x : {X2} from {X}
  mdsl.sched.gemm %x, %w bias %b -> %y {{transb = true, epilogue = "bias"}} : {X}, {W} bias {B} -> {Y}
  mdsl.sched.gemm %x, %w bias %b aux %aux -> %yt {{transb = true, epilogue = "gelu_aux_bias"}} \
: {X}, {W} bias {B} aux {Y} -> {Y}
  mdsl.sched.gemm %x, %w aux %aux -> %dg {{transb = true, epilogue = "dgelu"}} : {X}, {W} aux {Y} -> {Y}
  mdsl.sched.gemm %g2d, %x2d bias %db -> %dw {{transa = true, beta = 1.0 : f64, epilogue = "bgrada"}} \
: {G2}, {X2} bias {B} -> {DW}
}}
"""


def test_cublaslt_gemm_epilogues_match_the_reference(device):
    """Bias, GELU saving its input, the GELU gradient from it, a bias gradient with an fp32
    accumulating weight gradient (bf16 operands)."""
    program = parsed_program(GEMMS)
    rng = np.random.default_rng(4)
    gpu = CudaExecutor(program, device=device)
    reference = CudaExecutor(program, device=EmulatedDevice())
    inputs = [rng.standard_normal(ref.shape).astype(ref.dtype) for ref in gpu.inputs]
    assert gpu.fallbacks == []
    for index, (got, want) in enumerate(zip(gpu.execute(*inputs), reference.execute(*inputs))):
        close(got, want, 2e-2, f"output {index}")
