"""The optimizer's CPU kernels against their numpy references: global_norm, clip_factor and adamw bitwise
(one launch and the fused multi-tensor step), the gradient memsets
folded in only where nothing reads the gradient before them, and a Trainer bitwise the reference path."""

from pathlib import Path

import numpy as np
import pytest
from cpu_kernel_harness import FEW_KB, allocation_peak, fast_and_reference, random

import modeldsl
import modeldsl.runtime.sched_executor as sched_executor
from modeldsl.dialects.dtypes import DType
from modeldsl.dialects.sched import BufferOp, BufferType, LaunchOp, MemsetOp
from modeldsl.kernels.cpu import optim
from modeldsl.kernels.cpu.optim import fuse_optimizer_steps
from modeldsl.kernels.cpu.pool import Pool
from modeldsl.kernels.reference import REFERENCES
from modeldsl.resolve.imports import STD_ROOT
from modeldsl.runtime.optim import AdamWConfig
from modeldsl.runtime.train import Trainer

EXAMPLE = Path(__file__).resolve().parents[4] / "examples" / "tiny_llama"
SIZES = [(7,), (3, 70, 700), (300, 257), (1000, 517)]  # one small piece; several, split over the threads


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_global_norm_is_bitwise_the_reference(dtype, threads):
    grads = [random(shape, dtype, seed) for seed, shape in enumerate(SIZES)]
    outputs, expected, step = fast_and_reference("global_norm", grads, threads=threads)
    assert outputs[0].dtype == expected[0].dtype
    np.testing.assert_array_equal(outputs[0], expected[0])
    first = outputs[0].copy()
    step()
    assert outputs[0] == first  # the same value every run


@pytest.mark.parametrize("threads", [1, 2])
def test_global_norm_of_shares_and_their_squares_is_bitwise_the_reference(threads):
    """Tensor parallelism's two launches: the sharded gradients' sum of squares (``squared``), and the
    others' norm with that (summed over the ranks) added in (``plus=1``)."""
    grads = [random(shape, np.float32, seed) for seed, shape in enumerate(SIZES)]
    squares, expected, _ = fast_and_reference("global_norm", grads[1:], {"squared": True}, threads=threads)
    np.testing.assert_array_equal(squares[0], expected[0])
    norm, expected, _ = fast_and_reference("global_norm", [grads[0], squares[0]], {"plus": 1}, threads=threads)
    np.testing.assert_array_equal(norm[0], expected[0])
    np.testing.assert_allclose(norm[0], fast_and_reference("global_norm", grads)[0][0], rtol=1e-6)


def test_global_norm_does_not_depend_on_the_threads():
    grads = [random(shape, np.float32, seed) for seed, shape in enumerate(SIZES)]
    norms = [fast_and_reference("global_norm", grads, threads=t)[0][0] for t in (1, 2)]
    assert norms[0] == norms[1]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("norm", [0.0, 0.5, 3.0, np.inf, np.nan])
def test_clip_factor_is_the_reference(norm, dtype):
    outputs, expected, _ = fast_and_reference("clip_factor", [np.array(norm, dtype)], {"max_norm": 1.0})
    np.testing.assert_array_equal(outputs[0], expected[0])


def adamw_state(shape, dtype, seed=0):
    """(param, grad, exp_avg, exp_avg_sq) as a few earlier steps would leave them."""
    return [random(shape, dtype, seed), random(shape, dtype, seed + 1, 1e-2),
            random(shape, dtype, seed + 2, 1e-3), np.abs(random(shape, dtype, seed + 3, 1e-5))]


def runtime(lr=1e-3, step=1, scale=None):
    arrays = [np.array([lr], np.float32), np.array([step], np.int64)]
    return arrays + ([np.array(scale, np.float32)] if scale is not None else [])


HYPER = [dict(beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01, lr_scale=1.0),
         dict(beta1=0.8, beta2=0.95, eps=1e-6, weight_decay=0.0, lr_scale=0.1),
         dict(beta1=0.9, beta2=0.99, eps=1e-8, weight_decay=0.1, lr_scale=2.0)]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("scale", [None, 0.25])
@pytest.mark.parametrize("hyper", HYPER)
def test_adamw_steps_are_bitwise_the_reference(hyper, scale, dtype, threads):
    shape = (300, 257)
    ours, theirs = adamw_state(shape, dtype), adamw_state(shape, dtype)
    pool = Pool(threads)
    step_arrays = runtime(scale=scale)
    step = optim.adamw(pool, [ours[0], ours[2], ours[3]], [*ours, *step_arrays], hyper)
    assert step is not None
    pool.workspace.prepare()
    for number in range(1, 5):
        step_arrays[0][0], step_arrays[1][0] = 1e-3 * number, number  # read at run time
        step()
        REFERENCES["adamw"](*theirs, *step_arrays, **hyper)
        for got, want in zip(ours, theirs):
            np.testing.assert_array_equal(got, want)


def test_adamw_falls_back_for_mixed_dtypes_and_copies():
    param, grad, m, v = adamw_state((4, 6), np.float32)
    assert optim.adamw(Pool(1), [param, m, v], [param, grad.astype(np.float64), m, v, *runtime()], {}) is None
    other = param.copy()
    assert optim.adamw(Pool(1), [other, m, v], [param, grad, m, v, *runtime()], {}) is None


def test_adamw_and_global_norm_allocate_nothing():
    pool = Pool(2)
    state = adamw_state((300, 257), np.float32)
    adamw = optim.adamw(pool, [state[0], state[2], state[3]], [*state, *runtime(scale=0.5)], HYPER[0])
    grads = [random(shape, np.float32, seed) for seed, shape in enumerate(SIZES)]
    norm = optim.global_norm(pool, [np.zeros((), np.float32)], grads, {})
    pool.workspace.prepare()
    assert allocation_peak(adamw) < FEW_KB
    assert allocation_peak(norm) < FEW_KB


# ---------------------------------------------------------------------------- the fused step
def program(sizes, reader: int | None = None):
    """Top-level ops of an optimizer-like program over parameters of ``sizes``: one adamw per
    parameter, then (when ``reader`` is given) a copy launch reading that gradient, then a zero
    memset per gradient; with views of fresh arrays for every buffer."""
    views, ops = {}, []

    def buffer(size, dtype=DType.FP32, value=None):
        op = BufferOp("workspace", BufferType([size], dtype))
        views[op.result] = value
        return op.result

    lr, step, scale = (buffer(1, v, a) for v, a in zip((DType.FP32, DType.INT64, DType.FP32), runtime(scale=[0.5])))
    grads = []
    for index, size in enumerate(sizes):
        param, grad, m, v = (buffer(size, value=a.reshape(-1)) for a in adamw_state((size,), np.float32, 4 * index))
        grads.append(grad)
        ops.append(LaunchOp("adamw", [param, grad, m, v, lr, step, scale], [param, m, v], inplace=True))
    if reader is not None:
        copy = buffer(sizes[reader], value=np.zeros(sizes[reader], np.float32))
        ops.append(LaunchOp("copy", [grads[reader]], [copy]))
    ops += [MemsetOp(g) for g in grads]
    return ops, views


def executor_steps(ops, views, fuse):
    """The ops' steps as the executor compiles them (``fuse``: with its optimizer hook)."""
    from modeldsl.runtime.sched_executor import ScheduleExecutor

    host = ScheduleExecutor.__new__(ScheduleExecutor)
    host.threads = Pool(2)
    host.views = views
    compiled = [(op, host.compile(op)) for op in ops]
    if not fuse:
        return [s for _, steps in compiled for s in steps], host.threads
    return fuse_optimizer_steps(host.threads, compiled, views), host.threads


@pytest.mark.parametrize("reader", [None, 1])
def test_fused_adamw_folds_only_the_memsets_nothing_reads_before(reader, monkeypatch):
    sizes = [70_001, 5, 130_000]
    results = []
    for fuse in (False, True):
        if not fuse:  # the reference kernels, one launch at a time
            monkeypatch.setattr(sched_executor, "cpu_kernel", lambda name: None)
        else:
            monkeypatch.undo()
        ops, views = program(sizes, reader)
        steps, pool = executor_steps(ops, views, fuse)
        pool.workspace.prepare()
        for step in steps:
            step()
        if fuse:
            # one adamw step, the reader's copy and its memset kept; the other memsets folded in
            assert len(steps) == 1 + (2 if reader is not None else 0)
        results.append([views[v] for v in views if views[v] is not None and views[v].size > 1])
    for got, want in zip(*results, strict=True):
        np.testing.assert_array_equal(got, want)


# ---------------------------------------------------------------------------- training
def trainer_run(dtype, clip_norm, reference: set[str], monkeypatch, steps=3):
    """Weights, moments and losses after ``steps`` Trainer steps, the optimizer kernels named in
    ``reference`` run by their references (with ``adamw``: one launch at a time, nothing fused)."""
    with monkeypatch.context() as patch:
        real = sched_executor.cpu_kernel
        patch.setattr(sched_executor, "cpu_kernel", lambda name: None if name in reference else real(name))
        if "adamw" in reference:
            patch.setattr(sched_executor, "fuse_optimizer_steps",
                          lambda pool, compiled, views: [s for _, group in compiled for s in group])
        model = modeldsl.load(STD_ROOT / "models" / "llama.module", hf=EXAMPLE)
        trainer = Trainer(model, AdamWConfig(lr=3e-3, warmup_steps=1, total_steps=steps, clip_norm=clip_norm,
                                             weight_decay=0.1), dtype=dtype)
    rows = np.random.default_rng(7).integers(0, 384, (steps, 2, 17))
    losses = [trainer.train_step([(r[:, :-1], r[:, 1:])]) for r in rows]
    optimizer = trainer.optimizer
    arrays = {**{f"param.{k}": np.array(v) for k, v in optimizer.params.items()},
              **{k: np.array(v) for k, v in optimizer.moments.items()},
              **{f"master.{k}": np.array(v) for k, v in optimizer.masters.items()}}
    assert all(not g.any() for g in optimizer.grads.values())
    return losses, trainer.grad_norm, arrays, optimizer


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("clip_norm", [1.0, 0.0])
@pytest.mark.parametrize("reference", [{"adamw"}, set(optim.KERNELS)])
def test_trainer_steps_are_bitwise_the_reference_path(dtype, clip_norm, reference, monkeypatch):
    losses, norm, arrays, optimizer = trainer_run(dtype, clip_norm, set(), monkeypatch)
    launches = 1 + (clip_norm > 0) + 1 + len(optimizer.masters)  # norm, factor, fused adamw, casts: no memsets
    assert len(optimizer.steps) == launches
    ref_losses, ref_norm, ref_arrays, _ = trainer_run(dtype, clip_norm, reference, monkeypatch)
    assert losses == ref_losses
    assert norm == ref_norm
    assert arrays.keys() == ref_arrays.keys()
    for name, value in arrays.items():
        np.testing.assert_array_equal(value, ref_arrays[name], err_msg=name)
