"""The threads of the CPU executor: its pool sized by the flag, the variable or the cores; BLAS on one thread."""

import numpy as np
import pytest

import modeldsl
from modeldsl.diagnostics import DiagnosticError
from modeldsl.resolve.imports import STD_ROOT
from modeldsl.runtime import sched_executor, threads
from modeldsl.runtime.profiles import compile_profile
from modeldsl.runtime.sched_executor import ScheduleExecutor

EXAMPLE = STD_ROOT.parents[1] / "examples" / "tiny_llama"
TOKENS = np.array([[5, 6, 7, 8]])
needs_blas = pytest.mark.skipif(not threads.blas_thread_counts(),
                                reason="numpy's BLAS is not one threadpoolctl controls")


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


def kernel_blas_counts(monkeypatch, model) -> tuple[list[int], ScheduleExecutor]:
    """The BLAS thread counts seen inside every GEMM step of one forward of ``model``'s T=4 profile."""
    seen = []
    make = sched_executor.cpu_gemm

    def recording_gemm(*args, **kwargs):
        step = make(*args, **kwargs)

        def recorded() -> None:
            seen.extend(threads.blas_thread_counts())
            step()

        return recorded

    monkeypatch.setattr(sched_executor, "cpu_gemm", recording_gemm)
    executor = ScheduleExecutor(compile_profile(model.model, *TOKENS.shape, "fp32"), model.weights)
    executor.execute(*model.inputs(TOKENS, 0))
    return seen, executor


@needs_blas
def test_blas_runs_on_one_thread_inside_the_pool_and_the_setting_is_restored(tiny, pool, monkeypatch):
    before = threads.blas_thread_counts()
    counts, executor = kernel_blas_counts(monkeypatch, tiny)
    assert counts and set(counts) == {1}
    assert executor.threads.threads == pool
    assert threads.blas_thread_counts() == before


def test_the_pool_changes_the_logits_by_rounding_at_most(tiny, monkeypatch):
    program = compile_profile(tiny.model, *TOKENS.shape, "fp32")
    logits = []
    for size in (1, 3, 3):
        threads.set_pool_size(size)
        try:
            (out,) = ScheduleExecutor(program, tiny.weights).execute(*tiny.inputs(TOKENS, 0))
        finally:
            threads.set_pool_size(None)
        logits.append(np.array(out))
    np.testing.assert_allclose(logits[1], logits[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(logits[2], logits[1])  # the same split: the same bits


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
