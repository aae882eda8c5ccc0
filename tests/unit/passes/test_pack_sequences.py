"""mdsl-pack-sequences (``mdsl-train-step{packed=true}``): a training step on packed rows gives the loss and
the gradients of their examples run one by one (each alone in a row, at positions 0.., the loss weighted
by its target count), for the std Llama and Qwen3 (and Mistral's sliding window) on tiny transformers
checkpoints, on both CPU kernel paths; the step's inputs, its kernels, the pipeline's option and the
models the pass refuses (E029)."""

from __future__ import annotations

import numpy as np
import pytest
from training_steps import load_std
from xdsl.context import Context
from xdsl.dialects.builtin import IntegerAttr, ModuleOp

from modeldsl.diagnostics import DiagnosticError, PassOptionError
from modeldsl.dialects.dtypes import DType
from modeldsl.dialects.graph import ModelOp
from modeldsl.dialects.sched import AttentionBackwardOp, AttentionOp, BufferOp, LaunchOp
from modeldsl.ir import make_context, parse_module
from modeldsl.kernels.cpu import compiled
from modeldsl.passes.pack_sequences import PackSequencesPass
from modeldsl.passes.pipelines import TrainStep, expansion, pipeline_of
from modeldsl.runtime import sched_executor
from modeldsl.runtime.rope import packed_inputs

pytest.importorskip("transformers")

LLAMA = ("llama", "llama.module", {})
QWEN3 = ("qwen3", "qwen.module", {"head_dim": 16})
MISTRAL = ("mistral", "mistral.module", {"sliding_window": 5})
T = 16
ROWS = [[5, 7, 4], [6, 3]]  # the examples of each packed row (the second padded after them)
TOLERANCE = 1e-6  # relative, on the max: fp32 sums in another order


@pytest.fixture(params=["numpy", "compiled"])
def kernel_path(request, monkeypatch):
    if request.param == "compiled" and compiled.library() is None:
        pytest.skip("the compiled kernels do not build here")
    monkeypatch.setenv(compiled.ENV_VAR, "1" if request.param == "compiled" else "0")
    return request.param


def examples(model, rows=ROWS):
    """Random token ids and labels per example (each example's first label -100: a prompt token)."""
    rng = np.random.default_rng(0)
    vocab = model.config("vocab_size")
    out = []
    for row in rows:
        for n in row:
            labels = rng.integers(0, vocab, size=n)
            labels[0] = -100
            out.append((rng.integers(0, vocab, size=n), labels))
    return out


def packed_batch(pieces, rows=ROWS):
    """``[B, T]`` tokens, labels, segments and positions of the examples packed row by row (padding:
    token 0, labels -100, one more segment, positions 0.. again)."""
    tokens, labels = np.zeros((len(rows), T), np.int64), np.full((len(rows), T), -100, np.int64)
    segments, positions = np.zeros((len(rows), T), np.int64), np.zeros((len(rows), T), np.int64)
    it = iter(pieces)
    for b, row in enumerate(rows):
        start = 0
        for index, n in enumerate(row):
            ids, target = next(it)
            tokens[b, start:start + n], labels[b, start:start + n] = ids, target
            segments[b, start:start + n], positions[b, start:start + n] = index, np.arange(n)
            start += n
        segments[b, start:], positions[b, start:] = len(row), np.arange(T - start)
    return tokens, labels, segments, positions


def run_step(model, program, inputs):
    """(loss, the grads arena as fp32) of one step of ``program`` (d_loss 1)."""
    executor = model.schedule.executor(program)
    executor.arenas["grads"][:] = 0
    (loss, *_) = executor.execute(*inputs, np.array(1.0, np.float32))
    return float(loss), executor.arenas["grads"].copy().view(np.float32)


def packed_step(model, rows=ROWS, **options):
    return pipeline_of(TrainStep, B=len(rows), T=T, storage="fp32", packed=True, **options).program(model.model)


def one_by_one(model, pieces):
    """The loss and gradients of the examples each alone in a row of T (float64 sums), weighted by their
    target counts: what the packed step's mean over all targets is."""
    program = pipeline_of(TrainStep, B=1, T=T, storage="fp32").program(model.model)
    total = sum(int(np.count_nonzero(labels != -100)) for _, labels in pieces)
    loss, grads = 0.0, 0.0
    for ids, labels in pieces:
        tokens, targets = np.zeros((1, T), np.int32), np.full((1, T), -100, np.int64)
        tokens[0, :len(ids)], targets[0, :len(labels)] = ids, labels
        weight = np.count_nonzero(labels != -100) / total
        one_loss, one_grads = run_step(model, program, [*model.inputs(tokens, 0), targets])
        loss, grads = loss + weight * one_loss, grads + weight * one_grads.astype(np.float64)
    return loss, grads


@pytest.mark.parametrize("family", [LLAMA, QWEN3, MISTRAL], ids=["llama", "qwen3", "mistral-window"])
def test_a_packed_step_is_its_examples_one_by_one(family, kernel_path):
    model = load_std(*family)
    pieces = examples(model)
    tokens, labels, segments, positions = packed_batch(pieces)
    loss, grads = run_step(model, packed_step(model), [*packed_inputs(model, tokens, segments, positions), labels])
    want_loss, want_grads = one_by_one(model, pieces)
    assert abs(loss - want_loss) <= TOLERANCE * abs(want_loss)
    assert np.abs(grads - want_grads).max() <= TOLERANCE * np.abs(want_grads).max()
    assert np.abs(want_grads).max() > 0


def test_without_segments_the_examples_would_see_each_other():
    """The check has teeth: the same packed rows through the unpacked step (one causal sequence per row,
    one RoPE table) give another loss."""
    model = load_std(*LLAMA)
    pieces = examples(model)
    tokens, labels, _, _ = packed_batch(pieces)
    plain = pipeline_of(TrainStep, B=2, T=T, storage="fp32").program(model.model)
    loss, _ = run_step(model, plain, [*model.inputs(tokens.astype(np.int32), 0), labels])
    want, _ = one_by_one(model, pieces)
    assert abs(loss - want) > 1e-4 * abs(want)


def inputs_of(program):
    buffers = [op for op in program.walk() if isinstance(op, BufferOp) and isinstance(op.attributes.get("input"),
                                                                                        IntegerAttr)]
    ordered = sorted(buffers, key=lambda op: op.attributes["input"].value.data)
    return [(op.result.name_hint, tuple(op.result.type.shape), op.result.type.dtype) for op in ordered]


def test_the_packed_steps_inputs_and_kernels(monkeypatch):
    """Inputs: the token ids, a RoPE table per row, the segment ids, the labels, d_loss. Every attention is
    mdsl.sched.attention(_backward) with the ids, and it and the (fused) RoPE launches run on the fast CPU
    kernels, never the references."""
    model = load_std(*QWEN3)
    program = packed_step(model)
    inputs = inputs_of(program)
    assert inputs[:4] == [("tokens", (2, T), DType.INT32), ("freqs", (2, T, 8, 2), DType.FP32),
                          ("segments", (2, T), DType.INT32), ("labels", (2, T), DType.INT64)]
    assert inputs[4][1:] == ((), DType.FP32) and len(inputs) == 5  # d_loss
    attention = [op for op in program.walk() if isinstance(op, (AttentionOp, AttentionBackwardOp))]
    assert len(attention) == 2 * model.config("n_layers") or len(attention) == 2  # a layer loop: once each way
    assert all(op.segments is not None for op in attention)
    kernels = {op.kernel.data for op in program.walk() if isinstance(op, LaunchOp)}
    assert {"fused_qk_norm_rope", "fused_qk_norm_rope_backward"} <= kernels and "flash_attention" not in kernels
    declined = []
    fast = sched_executor.cpu_kernel

    def recording(name):
        kernel = fast(name)
        if kernel is None or "rope" not in name and "attention" not in name:
            return kernel
        return lambda *args: declined.append(name) if (step := kernel(*args)) is None else step

    monkeypatch.setattr(sched_executor, "cpu_kernel", recording)
    pieces = examples(model)
    tokens, labels, segments, positions = packed_batch(pieces)
    run_step(model, program, [*packed_inputs(model, tokens, segments, positions), labels])
    assert not declined


def test_the_pipeline_packs_only_when_asked():
    plain, packed = TrainStep(B=2, T=16), TrainStep(B=2, T=16, packed=True)
    assert "mdsl-pack-sequences" not in expansion(plain)
    stages = expansion(packed).split(",")
    assert stages.index("mdsl-pack-sequences") == stages.index('mdsl-autodiff{func="train_loss"}') - 1
    assert stages.index("mdsl-pack-sequences") > stages.index("mdsl-attach-loss")
    with pytest.raises(PassOptionError, match="packed"):
        TrainStep(B=2, T=16, packed="yes")


def test_an_unpacked_step_is_unchanged_by_the_option():
    model = load_std(*LLAMA)
    default = pipeline_of(TrainStep, B=2, T=T, storage="fp32").program(model.model)
    off = pipeline_of(TrainStep, B=2, T=T, storage="fp32", packed=False).program(model.model)
    assert default.is_structurally_equivalent(off)
    assert not any(getattr(op, "segments", None) is not None for op in default.walk())


def test_a_packed_model_is_left_as_it_is():
    model = load_std(*LLAMA)
    module = ModuleOp([model.model.clone()])
    PackSequencesPass().apply(Context(), module)
    once = str(module)
    PackSequencesPass().apply(Context(), module)
    assert str(module) == once and "segments %segments" in once


# ----------------------------------------------------------------------------- what it refuses
def ir_model(body: str, inputs: str = "%tokens: !mdsl.graph.tensor<[1, 4], int32>, %q: !q, %k: !k") -> ModelOp:
    text = f"""!q = !mdsl.graph.tensor<[1, 2, 4, 8], fp32>
!k = !mdsl.graph.tensor<[1, 1, 4, 8], fp32>
!s = !mdsl.graph.tensor<[1, 2, 4, 4], fp32>
!l = !mdsl.graph.tensor<[1, 2, 4], fp32>
!f = !mdsl.graph.tensor<[4, 4, 2], fp32>
mdsl.graph.model @m config {{}} {{
  mdsl.graph.func @forward({inputs}) -> !q attributes {{kind = "forward"}} {{
{body}
  }}
}}
"""
    module, _ = parse_module(make_context(), text)
    model = next(op for op in module.walk() if isinstance(op, ModelOp))
    model.detach()
    return model


REFUSED = {
    "non-causal": ("""    %o, %lse = mdsl.graph.flash_attention %q, %k, %k {causal = false} : (!q, !k, !k) -> (!q, !l)
    mdsl.graph.return %o : !q""", None, "mdsl.graph.flash_attention in @forward is not causal"),
    "written-out": ("""    %s = mdsl.graph.batched_matmul %q, %q {transpose = "NT"} : (!q, !q) -> !s
    %m = mdsl.graph.causal_mask %s : (!s) -> !s
    %p = mdsl.graph.softmax %m : (!s) -> !s
    %o = mdsl.graph.batched_matmul %p, %q : (!s, !q) -> !q
    mdsl.graph.return %o : !q""", None, "mdsl.graph.causal_mask in @forward mixes the tokens of a row"),
    "table-read-elsewhere": ("""    %x = mdsl.graph.scale %f {factor = 2.0 : f64} : (!f) -> !f
    %qr, %kr = mdsl.graph.rope %q, %k, %x : (!q, !k, !f) -> (!q, !k)
    mdsl.graph.return %qr : !q""", "%tokens: !mdsl.graph.tensor<[1, 4], int32>, %q: !q, %k: !k, %f: !f",
                             "the RoPE table %f of @forward is read by mdsl.graph.scale"),
    "no-token-ids": ("""    %o, %lse = mdsl.graph.flash_attention %q, %k, %k : (!q, !k, !k) -> (!q, !l)
    mdsl.graph.return %o : !q""", "%q: !q, %k: !k", "takes no token ids"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_what_the_pass_cannot_pack_is_e029_naming_the_op(case):
    body, inputs, words = REFUSED[case]
    model = ir_model(body, *(() if inputs is None else (inputs,)))
    with pytest.raises(DiagnosticError) as info:
        PackSequencesPass().apply(Context(), ModuleOp([model]))
    (diagnostic,) = info.value.diagnostics
    assert diagnostic.code == "E029" and words in diagnostic.message, diagnostic.message


def test_a_recurrent_model_is_refused():
    """Mamba's conv and scan carry their state from one example of a row into the next."""
    mamba = ("mamba", "mamba.module", {"state_size": 4, "expand": 2, "conv_kernel": 4, "time_step_rank": 2})
    model = load_std(*mamba)
    with pytest.raises(DiagnosticError) as info:
        packed_step(model)
    (diagnostic,) = info.value.diagnostics
    assert diagnostic.code == "E029" and "mdsl.graph.mamba_conv1d" in diagnostic.message


def test_the_packed_step_binds_to_the_cuda_kernels_of_packed_rows(monkeypatch):
    """On the CUDA executor (the emulated device): attention with segment ids is a launch of the
    flash_attention primitive planned on attention.cu's *_seg kernels (no fallback), the per-row RoPE
    tables' launches are planned too, and the step's loss and gradients are the CPU executor's."""
    from modeldsl.runtime.cuda_commands import KernelCommand
    from modeldsl.runtime.cuda_device import EmulatedDevice
    from modeldsl.runtime.cuda_executor import CudaExecutor
    from modeldsl.runtime.sched_executor import ScheduleExecutor

    monkeypatch.setenv(compiled.ENV_VAR, "0")  # the device runs the references: the CPU's numpy kernels
    model = load_std(*QWEN3)
    program = packed_step(model)
    pieces = examples(model)
    tokens, labels, segments, positions = packed_batch(pieces)
    inputs = [*packed_inputs(model, tokens, segments, positions), labels, np.array(1.0, np.float32)]
    cpu = ScheduleExecutor(program, model.weights)
    cpu.arenas["grads"][:] = 0
    (loss,) = cpu.execute(*inputs)
    gpu = CudaExecutor(program, model.weights, device=EmulatedDevice())
    assert gpu.fallbacks == []
    attention = [c for c in gpu.commands if isinstance(c, KernelCommand) and "flash_attention" in c.kernel]
    assert attention and all(c.plan is not None and all("_seg_" in launch.symbol for launch in c.plan.launches
                                                          if "attention_bwd_pre" not in launch.symbol)
                             for c in attention)
    grads = gpu.arenas["grads"]
    gpu.device.upload(grads.address, np.zeros(grads.nbytes, np.uint8))
    (device_loss,) = gpu.execute(*inputs)
    want = cpu.arenas["grads"].view(np.float32)
    got = gpu.device.download(grads.address, grads.nbytes).view(np.float32)
    assert abs(float(device_loss) - float(loss)) <= TOLERANCE * abs(float(loss))
    assert np.abs(got - want).max() <= TOLERANCE * np.abs(want).max()
