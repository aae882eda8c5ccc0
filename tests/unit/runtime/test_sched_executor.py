"""The CPU schedule executor: bitwise the graph interpreter's logits, no allocation in execute, profiles."""

import gc
import tracemalloc

import numpy as np
import pytest
from hf_checkpoints import CASES, make_checkpoint

import modeldsl
from modeldsl.resolve.imports import STD_ROOT
from modeldsl.runtime.profiles import ProfiledForward, compile_profile
from modeldsl.runtime.sched_executor import ScheduleExecutor

pytest.importorskip("torch")
pytest.importorskip("transformers")

MODELS = STD_ROOT / "models"
TOKENS = np.array([[3, 17, 42, 5, 9, 33, 2, 61, 7, 12, 40, 8]])


@pytest.fixture(scope="module", params=sorted(CASES))
def loaded(request, tmp_path_factory):
    arch, module, config = CASES[request.param]
    path = make_checkpoint(tmp_path_factory.mktemp(request.param), arch, **config)
    return modeldsl.load(MODELS / module, hf=path)


def schedule(model, tokens, storage="fp32", split_gemms=True):
    program = compile_profile(model.model, *tokens.shape, storage, split_gemms=split_gemms)
    return ScheduleExecutor(program, model.weights)


def test_the_schedule_gives_bitwise_the_graph_interpreters_logits(loaded, numpy_cpu_kernels):
    """Bitwise where the schedule does the graph's arithmetic (the numpy kernels); splitting the fused
    projections into narrower GEMMs (the default) only moves BLAS rounding."""
    expected = loaded.forward(TOKENS, engine="graph")
    logits = schedule(loaded, TOKENS, split_gemms=False).execute(*loaded.inputs(TOKENS, 0))[0]
    np.testing.assert_array_equal(logits, expected)
    logits = schedule(loaded, TOKENS).execute(*loaded.inputs(TOKENS, 0))[0]
    np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-5)


def test_the_compiled_kernels_give_the_graph_interpreters_logits_within_1e_6(loaded):
    """The default CPU kernels (compiled where they build) against the interpreter: within 1e-6 of the
    logits' scale, and the same bits run to run."""
    from modeldsl.kernels.cpu import compiled

    if not compiled.enabled():
        pytest.skip("the compiled kernels do not build here")
    expected = loaded.forward(TOKENS, engine="graph")
    executor = schedule(loaded, TOKENS, split_gemms=False)
    logits = executor.execute(*loaded.inputs(TOKENS, 0))[0]
    first = logits.copy()
    np.testing.assert_allclose(logits, expected, rtol=0, atol=1e-6 * np.abs(expected).max())
    again = executor.execute(*loaded.inputs(TOKENS, 0))[0]
    np.testing.assert_array_equal(again, first)


NOT_EXECUTE = [tracemalloc.Filter(False, "*/threadpoolctl.py"), tracemalloc.Filter(False, tracemalloc.__file__),
               tracemalloc.Filter(False, __file__)]


def traced_bytes() -> int:
    """Bytes traced now, less those of NOT_EXECUTE (after a collection)."""
    gc.collect()
    snapshot = tracemalloc.take_snapshot().filter_traces(NOT_EXECUTE)
    return sum(stat.size for stat in snapshot.statistics("filename"))


def test_execute_allocates_nothing_after_warm_up(loaded):
    """Traced memory (what execute keeps, not the kernels' temporaries) does not grow over 5 steps.
    Other threads of the test process (tqdm's monitor) may allocate meanwhile, so a round that
    grew is measured again: a leak grows in every round. Not counted: threadpoolctl's symbol
    lookups when execute sets the BLAS threads (a CPython cache that fills over the first
    thousands of calls, then stays) and the measuring itself."""
    if any(op.name.startswith(("mdsl.graph.moe_", "mdsl.graph.mamba_")) for op in loaded.model.walk()):
        pytest.skip("the MoE and Mamba ops run their numpy references, whose small temporaries tracemalloc keeps "
                    "seeing in numpy's caches (no leak: a million calls grow no RSS); the fast CPU kernels are "
                    "the dense models'")
    executor = schedule(loaded, TOKENS)
    inputs = loaded.inputs(TOKENS, 0)
    growth = np.zeros(3, dtype=np.int64)
    tracemalloc.start()
    try:
        for _ in range(5):  # warm-up, traced: the interpreter's free lists and numpy's caches fill here
            executor.execute(*inputs)
        for round in range(3):
            before = traced_bytes()
            for _ in range(5):
                executor.execute(*inputs)
            growth[round] = traced_bytes() - before
            if growth[round] <= 0:
                break
    finally:
        tracemalloc.stop()
    assert growth.min() <= 0, f"execute kept {growth.tolist()} bytes in rounds of 5 steps"


def test_a_profile_is_planned_once_per_bucket_and_padding_keeps_the_logits(loaded):
    profiled = ProfiledForward(loaded.model, loaded.weights, buckets=(8, 16), storage="fp32")
    short, longer = TOKENS[:, :5], TOKENS[:, :11]
    np.testing.assert_allclose(profiled.run(short, lambda t: loaded.inputs(t, 0)),
                               loaded.forward(short, engine="graph"), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(profiled.run(longer, lambda t: loaded.inputs(t, 0)),
                               loaded.forward(longer, engine="graph"), rtol=1e-5, atol=1e-5)
    first = dict(profiled.profiles)
    profiled.run(TOKENS[:, :7], lambda t: loaded.inputs(t, 0))
    assert sorted(profiled.profiles) == [(1, 8, 0), (1, 16, 0)] and profiled.profiles[(1, 8, 0)] is first[(1, 8, 0)]
    params = {id(executor.arenas["params"]) for executor in profiled.profiles.values()}
    assert len(params) == 1  # the weights are held once


def test_decoding_through_the_kv_cache_schedule_gives_the_graph_interpreters_logits(loaded):
    """A prompt profile then one-token profiles sharing one cache: each step's logits equal the
    interpreter's KV-cache decoding, and the tokens equal full recomputation. Where longrope switches
    to its long factors (Phi-3), both run the whole sequence again, as transformers' generation does."""
    from modeldsl.runtime.executor import KVCache

    prompt, steps = [3, 17, 42, 5, 9, 33, 2], [61, 7, 12, 40, 8]
    cache = KVCache()
    decode = loaded.decoder(len(prompt) + len(steps), use_cache=True, engine="schedule")
    tokens = list(prompt)
    np.testing.assert_allclose(decode(tokens, 0), loaded.forward(prompt, cache, engine="graph")[-1],
                               rtol=1e-5, atol=1e-5)
    for token in steps:
        tokens.append(token)
        if loaded.rope is not None and loaded.rope.recomputes(cache.length, len(tokens)):
            cache = KVCache()
            expected = loaded.forward(tokens, cache, engine="graph")[-1]
        else:
            expected = loaded.forward([token], cache, engine="graph")[-1]
        np.testing.assert_allclose(decode(tokens, len(tokens) - 1), expected, rtol=1e-5, atol=1e-5)
    capacities = {key[2] for key in loaded.schedule.profiles}
    assert capacities - {0} == {16}  # one cache capacity, planned once
