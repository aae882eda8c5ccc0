"""BLAS threads of the CPU executor: small products on one thread, large ones on the pool."""

import numpy as np
import pytest

import modeldsl
from modeldsl.diagnostics import DiagnosticError
from modeldsl.resolve.imports import STD_ROOT
from modeldsl.runtime import sched_executor, threads
from modeldsl.runtime.profiles import compile_profile
from modeldsl.runtime.sched_executor import ScheduleExecutor, gemm_call_macs

EXAMPLE = STD_ROOT.parents[1] / "examples" / "tiny_llama"
TOKENS = np.array([[5, 6, 7, 8]])
needs_blas = pytest.mark.skipif(not threads.blas_thread_counts(), reason="numpy's BLAS is not one threadpoolctl controls")


@pytest.fixture(scope="module")
def tiny():
    return modeldsl.load(STD_ROOT / "models" / "llama.module", hf=EXAMPLE)


@pytest.fixture
def pool(monkeypatch):
    """A pool of 3 threads for the executors built in the test (more than 1 wherever it runs)."""
    monkeypatch.delenv(threads.ENV_VAR, raising=False)
    threads.set_pool_size(3)
    yield 3
    threads.set_pool_size(None)


def gemm_thread_counts(monkeypatch, model) -> list[int]:
    """The BLAS thread count seen by every GEMM of one forward of ``model``'s T=4 profile."""
    seen = []
    product = sched_executor.gemm

    def recording_gemm(*args, **kwargs):
        seen.extend(threads.blas_thread_counts())
        return product(*args, **kwargs)

    monkeypatch.setattr(sched_executor, "gemm", recording_gemm)
    executor = ScheduleExecutor(compile_profile(model.model, *TOKENS.shape, "fp32"), model.weights)
    executor.execute(*model.inputs(TOKENS, 0))
    return seen


@needs_blas
def test_small_gemms_run_on_one_thread_and_the_setting_is_restored(tiny, pool, monkeypatch):
    before = threads.blas_thread_counts()
    counts = gemm_thread_counts(monkeypatch, tiny)
    assert counts and set(counts) == {1}
    assert threads.blas_thread_counts() == before


@needs_blas
def test_gemms_from_the_threshold_on_run_on_the_pool(tiny, pool, monkeypatch):
    monkeypatch.setattr(threads, "PARALLEL_MACS", 1)
    assert set(gemm_thread_counts(monkeypatch, tiny)) == {pool}


@needs_blas
def test_the_pool_does_not_change_the_logits(tiny, pool, monkeypatch):
    program = compile_profile(tiny.model, *TOKENS.shape, "fp32")
    (single,) = ScheduleExecutor(program, tiny.weights).execute(*tiny.inputs(TOKENS, 0))
    single = np.array(single)
    monkeypatch.setattr(threads, "PARALLEL_MACS", 1)
    (pooled,) = ScheduleExecutor(program, tiny.weights).execute(*tiny.inputs(TOKENS, 0))
    np.testing.assert_allclose(pooled, single, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("a, c, mode, macs", [
    ((2, 16, 64), (2, 16, 128), "NT", 16 * 128 * 64),      # x @ W^T: one call per batch row
    ((64, 32), (64, 48), "NN", 64 * 48 * 32),
    ((2, 16, 128), (128, 64), "TN", 128 * 64 * 32),        # dW = dY^T X over all 32 tokens: one call
    ((16, 128), (128, 64), "TN", 128 * 64 * 16),
])
def test_the_work_of_one_blas_call(a, c, mode, macs):
    assert gemm_call_macs(a, c, mode) == macs


def test_the_pool_is_the_flag_then_the_variable_then_the_usable_cores(monkeypatch):
    monkeypatch.delenv(threads.ENV_VAR, raising=False)
    assert threads.pool_size() == threads.usable_cores() >= 1
    monkeypatch.setenv(threads.ENV_VAR, "5")
    assert threads.pool_size() == 5
    threads.set_pool_size(2)
    try:
        assert threads.pool_size() == 2
    finally:
        threads.set_pool_size(None)
    assert threads.threads_for(threads.PARALLEL_MACS - 1, 8) == 1 and threads.threads_for(threads.PARALLEL_MACS, 8) == 8


@pytest.mark.parametrize("value", ["0", "-1", "two", "1.5", ""])
def test_a_bad_thread_count_is_e029(value):
    with pytest.raises(DiagnosticError) as info:
        threads.parse_thread_count(value, "--threads")
    (diagnostic,) = info.value.diagnostics
    assert diagnostic.code == "E029" and f"got '{value}'" in diagnostic.message and diagnostic.hint


@needs_blas
def test_the_graph_interpreter_runs_on_one_thread(tiny, pool, monkeypatch):
    from modeldsl.runtime import executor

    seen = []
    call = executor.GraphExecutor.call

    def recording_call(self, *args, **kwargs):
        seen.extend(threads.blas_thread_counts())
        return call(self, *args, **kwargs)

    monkeypatch.setattr(executor.GraphExecutor, "call", recording_call)
    with threads.blas_threads(3):
        tiny.forward([5, 6, 7], engine="graph")
        assert threads.blas_thread_counts() and set(threads.blas_thread_counts()) == {3}
    assert seen and set(seen) == {1}
