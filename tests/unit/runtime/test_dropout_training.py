"""dropout in training: a fresh mask every step (the program's step counter), a mask of its own in
every layer of a stack, and within one step and layer the same mask in the forward, a recompute and
the backward, on the graph interpreter, the CPU schedule executor and the emulated CUDA device; the
trainer advances the counter every micro-batch and a resumed run continues its stream."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from xdsl.context import Context

import modeldsl
from modeldsl.dialects.graph import ModelOp
from modeldsl.dialects.sched import LaunchOp, ProgramOp
from modeldsl.frontend.text.parser import parse_source
from modeldsl.lower import lower_program
from modeldsl.passes.autodiff import AutodiffPass
from modeldsl.passes.lower_to_sched import LowerToSchedPass, rng_step_input
from modeldsl.passes.plan_memory import PlanMemoryPass
from modeldsl.passes.recompute import RecomputePass
from modeldsl.passes.specialize import SpecializePass
from modeldsl.resolve.imports import STD_ROOT
from modeldsl.runtime.executor import GraphExecutor
from modeldsl.runtime.optim import AdamWConfig
from modeldsl.runtime.sched_executor import ScheduleExecutor
from modeldsl.runtime.train import Trainer, load_training_state, save_training_state
from modeldsl.verify_backward import random_weights, report, verify_backward

P, LAYERS, BATCH, WIDTH = 0.5, 3, 8, 16
STACK = f"""
block Blk(d: int = {WIDTH}):
  params:
    w1: [d, d]
  forward:
    in: x: [B, d]
    out: [B, d]
    graph:
      x -> matmul(w1, transpose=NT) -> h
      h -> dropout(p={P}, seed=3) -> a
      a -> silu() -> s
      (x, s) -> add() -> out

model M(d: int = {WIDTH}, n: int = {LAYERS}):
  params:
    blocks: [n] x Blk(d)
  forward:
    in: x: [B, d]
    out: [B, d]
    graph:
      x -> blocks -> out
"""


def stack_module(recompute: str = ""):
    """The stack model specialized (B = 8) with its @forward_grad (after mdsl-recompute's ``recompute`` mode)."""
    module = lower_program(parse_source(STACK, "stack.module"))
    SpecializePass.of(B=BATCH).apply(Context(), module)
    AutodiffPass().apply(Context(), module)
    if recompute:
        RecomputePass(mode=recompute).apply(Context(), module)
    return module


def model_of(module) -> ModelOp:
    return next(op for op in module.walk() if isinstance(op, ModelOp))


def training_program(recompute: str = "") -> ProgramOp:
    module = stack_module(recompute)
    LowerToSchedPass(func="forward_grad", storage="fp32", grads_arena=True).apply(Context(), module)
    PlanMemoryPass().apply(Context(), module)
    return next(op for op in module.walk() if isinstance(op, ProgramOp))


@pytest.fixture(scope="module")
def data():
    module = stack_module()
    weights = {k: v.astype(np.float32) for k, v in random_weights(model_of(module)).items()}
    rng = np.random.default_rng(1)
    x, d_out = (rng.standard_normal((BATCH, WIDTH)).astype(np.float32) + 2 for _ in range(2))
    return module, weights, x, d_out


def run_schedule(program: ProgramOp, weights, x, d_out, step: int, executor=None):
    """(out, d_x, d_blocks.w1) of one run of the training program at step counter ``step``."""
    executor = executor or ScheduleExecutor(program, weights)
    grads = executor.grads["blocks.w1"]
    if hasattr(grads, "write"):  # a device array
        grads.write(np.zeros(grads.shape, grads.dtype))
    else:
        grads[...] = 0
    args = [x, d_out]
    args.insert(rng_step_input(program), np.array([step], dtype=np.int64))
    out, d_x = (np.array(o) for o in executor.execute(*args))
    return out, d_x, np.array(grads)


def masks(module, weights, x, d_out, step: int) -> dict[str, list[np.ndarray]]:
    """The dropped elements of each dropout run of @forward_grad on the graph interpreter, by the
    function it runs in (@blocks_fwd: the forward of each layer, @blocks_bwd: the backward, in reverse)."""
    executor = GraphExecutor(model_of(module), weights, float_dtype=np.float64, rng_step=step)  # no underflow
    seen: dict[str, list[np.ndarray]] = {}

    def record(op, results):
        if op.name == "mdsl.graph.dropout":
            seen.setdefault(op.parent_op().sym_name.data, []).append(np.asarray(results[0]) == 0)

    executor.observers.append(record)
    executor.run("forward_grad", x, d_out)
    return seen


def test_the_training_program_takes_the_step_counter_and_its_dropouts_read_it(data):
    program = training_program()
    index = rng_step_input(program)
    assert index == 2  # after x and d_out
    launches = [op for op in program.walk() if isinstance(op, LaunchOp) and op.kernel.data == "dropout"]
    assert len(launches) == 2
    for launch in launches:
        assert launch.inputs[1].owner.attributes["input"].value.data == index
        assert "keyed_by_layer" in launch.attributes


def test_every_layer_draws_its_own_mask_and_its_backward_the_same(data):
    """One mask per layer, independent draws (any two agree on about half of the elements at p = 0.5);
    the backward of layer l (run in reverse) drops exactly what the forward of layer l dropped."""
    seen = masks(*data, step=0)
    forward, backward = seen["blocks_fwd"], seen["blocks_bwd"][::-1]
    assert len(forward) == len(backward) == LAYERS
    for layer in range(LAYERS):
        np.testing.assert_array_equal(backward[layer], forward[layer])
        assert 0.3 < forward[layer].mean() < 0.7
    for a in range(LAYERS):
        for b in range(a + 1, LAYERS):
            assert 0.3 < (forward[a] == forward[b]).mean() < 0.7, (a, b)


def test_every_step_draws_fresh_masks_and_a_step_again_the_same(data):
    first, again, second = (masks(*data, step=s)["blocks_fwd"] for s in (5, 5, 6))
    for layer in range(LAYERS):
        np.testing.assert_array_equal(first[layer], again[layer])
        assert 0.3 < (first[layer] == second[layer]).mean() < 0.7


@pytest.mark.parametrize("recompute", ["", "full"])
def test_the_schedule_draws_the_interpreters_masks_at_each_step(data, recompute, numpy_cpu_kernels):
    """The CPU schedule executor (layer loops unrolled, the counter an input) gives the graph
    interpreter's results at the same step, also where the backward recomputes the dropout: the
    same masks in every layer; another step gives other results."""
    module, weights, x, d_out = data
    program = training_program(recompute)
    executor = ScheduleExecutor(program, weights)
    for step in (0, 1, 2**32 + 7):
        got = run_schedule(program, weights, x, d_out, step, executor)
        want = GraphExecutor(model_of(module), weights, float_dtype=np.float32, rng_step=step).run(
            "forward_grad", x, d_out)
        out, d_w1, d_x = want
        for g, w in zip(got, (out, d_x, d_w1), strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    zero, one = (run_schedule(program, weights, x, d_out, s, executor) for s in (0, 1))
    assert not np.allclose(zero[0], one[0]) and not np.allclose(zero[2], one[2])


def test_the_gradient_through_a_steps_masks_is_the_finite_differences_of_that_step(data):
    """float64 central differences of the training forward at step s against the derived gradient
    at step s (the masks of s in every layer), for several s."""
    module = data[0]
    model = model_of(module)
    weights = random_weights(model)
    x = np.random.default_rng(2).standard_normal((BATCH, WIDTH)) + 2
    for step in (0, 3, 2**33):
        text, ok = report(verify_backward(model, weights, [x], rng_step=step), 1e-6)
        assert ok, text


def test_the_emulated_device_draws_the_cpu_executors_masks(data, numpy_cpu_kernels):
    """The CUDA executor (its launches bound with their plans and run on the emulated device, the
    counter read from device memory at each run, the layers given to each unrolled launch) gives the
    CPU executor's results, bit for bit, at every step."""
    from modeldsl.runtime.cuda_device import EmulatedDevice
    from modeldsl.runtime.cuda_executor import CudaExecutor

    module, weights, x, d_out = data
    program = training_program()
    cpu = ScheduleExecutor(program, weights)
    gpu = CudaExecutor(program, weights, device=EmulatedDevice())
    assert not gpu.fallbacks
    for step in (0, 1, 0, 9):  # graphs are captured from the second run on: the counter still reaches them
        for g, w in zip(run_schedule(program, weights, x, d_out, step, gpu),
                        run_schedule(program, weights, x, d_out, step, cpu), strict=True):
            np.testing.assert_array_equal(g, w)


# ---------------------------------------------------------------------------- the trainer

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "tiny_llama"
CONFIG = AdamWConfig(lr=1e-2, beta2=0.95, weight_decay=0.1, warmup_steps=1, total_steps=4, clip_norm=1.0)


@pytest.fixture(scope="module")
def llama_with_dropout(tmp_path_factory) -> Path:
    """The std Llama with dropout (p = 0.3) on the embeddings, as transformers' embd_pdrop."""
    text = (STD_ROOT / "models" / "llama.module").read_text()
    old = "      (x0, freqs) -> blocks -> xN\n"
    assert old in text
    path = tmp_path_factory.mktemp("models") / "llama_dropout.module"
    new = "      x0 -> dropout(p=0.3, seed=11) -> x0d\n      (x0d, freqs) -> blocks -> xN\n"
    path.write_text(text.replace(old, new))
    return path


def batches(count: int) -> list[list[tuple[np.ndarray, np.ndarray]]]:
    rng = np.random.default_rng(0)
    rows = [rng.integers(0, 384, (2, 9)) for _ in range(count)]
    return [[(r[:, :-1], r[:, 1:])] for r in rows]


def test_outside_training_the_dropout_is_no_launch_and_changes_nothing(llama_with_dropout):
    """Inference and decoding: the dropout is an alias of the embeddings (no launch, no counter input),
    and the logits and the generated tokens are the plain Llama's, bit for bit."""
    model = modeldsl.load(llama_with_dropout, hf=EXAMPLE)
    plain = modeldsl.load(STD_ROOT / "models" / "llama.module", hf=EXAMPLE)
    ids = np.arange(12) % 300
    np.testing.assert_array_equal(model.forward(ids), plain.forward(ids))
    assert model.generate(list(ids[:5]), 4) == plain.generate(list(ids[:5]), 4)
    programs = [executor.program for executor in model.schedule.profiles.values()]
    assert programs  # the forward buckets and the decoding steps run
    for program in programs:
        assert rng_step_input(program) is None
        assert not [op for op in program.walk() if isinstance(op, LaunchOp) and op.kernel.data == "dropout"]


def test_the_trainer_advances_the_counter_every_micro_batch(llama_with_dropout):
    trainer = Trainer(modeldsl.load(llama_with_dropout, hf=EXAMPLE), CONFIG)
    assert rng_step_input(trainer.executor(2, 8).program) is not None
    (tokens, labels), = batches(1)[0]
    losses = [trainer.accumulate(tokens, labels) for _ in range(3)]  # the weights stay as they are
    assert trainer.rng_step == 3 and len(set(losses)) == 3  # three masks
    trainer.rng_step = 1
    assert trainer.accumulate(tokens, labels) == losses[1]  # the counter alone picks the mask
    trainer.train_step(batches(1)[0] * 2)
    assert trainer.rng_step == 4  # 1, one more micro-batch, then a step of two


def test_a_restored_trainer_continues_the_counter_bit_for_bit(llama_with_dropout, tmp_path):
    data = batches(4)
    straight = Trainer(modeldsl.load(llama_with_dropout, hf=EXAMPLE), CONFIG)
    expected = [straight.train_step(b) for b in data]

    first = Trainer(modeldsl.load(llama_with_dropout, hf=EXAMPLE), CONFIG)
    losses = [first.train_step(b) for b in data[:2]]
    save_training_state(tmp_path / "state.npz", first)
    first.model.save_hf(tmp_path / "ckpt", dtype="fp32")
    state = load_training_state(tmp_path / "state.npz")
    assert state.step == 2 and state.rng_step == 2

    second = Trainer(modeldsl.load(llama_with_dropout, hf=tmp_path / "ckpt"), state.config)
    second.restore(state.step, state.moments, state.rng_step)
    assert losses + [second.train_step(b) for b in data[2:]] == expected

    forgetful = Trainer(modeldsl.load(llama_with_dropout, hf=tmp_path / "ckpt"), state.config)
    forgetful.restore(state.step, state.moments)  # the counter from 0: step 1's masks again
    assert [forgetful.train_step(b) for b in data[2:]] != expected[2:]


def test_resuming_a_run_with_dropout_gives_the_uninterrupted_losses(llama_with_dropout, tmp_path, capsys,
                                                                      monkeypatch):
    """mdsl-run --train ... --stop-after 2, then --resume: the losses of four straight steps, bit for bit."""
    from modeldsl.tools.run import main

    monkeypatch.chdir(tmp_path)
    data = Path(__file__).resolve().parents[3] / "examples" / "tiny_corpus.txt"
    run = [str(llama_with_dropout), "--hf", str(EXAMPLE), "--train", str(data), "--steps", "4", "--batch", "2",
           "--seq", "16", "--lr", "1e-2", "--warmup", "1", "--grad-accum", "2"]

    def losses(*flags) -> list[str]:
        assert main([*run, *flags]) == 0, capsys.readouterr().err
        return [line.split()[3] for line in capsys.readouterr().out.splitlines() if line.startswith("step ")]

    expected = losses("--save", str(tmp_path / "straight"))
    first = losses("--stop-after", "2", "--save", str(tmp_path / "out"))
    second = losses("--resume", str(tmp_path / "out"), "--save", str(tmp_path / "out"))
    assert len(expected) == 4 and first + second == expected
    assert load_training_state(tmp_path / "out" / "training_state.npz").rng_step == 8  # 4 steps x 2 micro-batches


def test_the_state_file_holds_the_counter_and_a_bad_one_is_refused(llama_with_dropout, tmp_path):
    """``rng_step`` in the state's JSON header: a file without it (saved before it was kept) reads as 0;
    one that is no non-negative 64-bit integer is a ValueError naming it."""
    import json

    trainer = Trainer(modeldsl.load(llama_with_dropout, hf=EXAMPLE), CONFIG)
    trainer.rng_step = 2**40 + 1
    save_training_state(tmp_path / "s.npz", trainer)
    assert load_training_state(tmp_path / "s.npz").rng_step == 2**40 + 1
    with np.load(tmp_path / "s.npz") as f:
        content = {n: f[n] for n in f.files}
    header = json.loads(str(content["state"]))
    for value, expected in ((None, 0), (-1, None), (True, None), ("3", None), (2**63, None)):
        changed = {k: v for k, v in header.items() if k != "rng_step" or value is not None}
        if value is not None:
            changed["rng_step"] = value
        np.savez(tmp_path / "t.npz", **{**content, "state": np.array(json.dumps(changed))})
        if expected is None:
            with pytest.raises(ValueError, match="rng_step"):
                load_training_state(tmp_path / "t.npz")
        else:
            assert load_training_state(tmp_path / "t.npz").rng_step == expected
