"""Loading holds the weights once: the checkpoint is read straight into the schedule's params arena
(or its file's pages are mapped there), the model's weights are views of it from the start, and the
first forward copies nothing."""

import shutil
import sys
import tracemalloc

import ml_dtypes
import numpy as np
import pytest
from hf_checkpoints import cached_checkpoint, transformers_model

import modeldsl
from modeldsl.hf.safetensors_io import SafetensorsFile, write_safetensors
from modeldsl.resolve.imports import STD_ROOT
from modeldsl.runtime import pages

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

LLAMA = STD_ROOT / "models" / "llama.module"
TOKENS = [3, 17, 42, 5, 9, 33, 2, 61]
# about 13 MB of fp32 weights: large against the IR and the activations of a short forward
RANDOM = dict(vocab_size=64, d_model=32, n_layers=2, num_heads=4, num_kv_heads=2, d_ff=48, max_seq=128)
SIZED = dict(vocab_size=4096, hidden_size=256, intermediate_size=512, num_hidden_layers=2)
# every tensor a whole number of 4 KiB pages (rows of 1024 fp32), so the whole file lines up
PAGED = dict(vocab_size=1024, hidden_size=1024, intermediate_size=1024, num_hidden_layers=1)
linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="file pages are mapped on Linux only")


def weight_bytes(model) -> int:
    return sum(w.nbytes for w in model.weights.values())


def assert_views_of_the_arena(model):
    arena = model.schedule.params
    assert arena is not None
    for name, weight in model.weights.items():
        assert np.shares_memory(weight, arena), name


@pytest.mark.parametrize("hf", [True, False], ids=["checkpoint", "random"])
def test_the_weights_are_views_of_the_params_arena_before_and_after_the_first_forward(hf):
    model = modeldsl.load(LLAMA, hf=cached_checkpoint("llama")) if hf else modeldsl.load(LLAMA, config=RANDOM)
    assert_views_of_the_arena(model)
    arena = model.schedule.params
    model.forward(TOKENS)
    (executor,) = model.schedule.profiles.values()
    assert executor.arenas["params"] is arena
    for name, view in executor.params.items():
        assert view.ctypes.data == model.weights[name].ctypes.data, name


def test_load_and_first_forward_allocate_about_one_copy_of_the_weights():
    path = cached_checkpoint("llama", **SIZED)
    modeldsl.load(LLAMA, hf=path).forward(TOKENS)  # imports and parser tables, outside the measurement
    tracemalloc.start()
    try:
        model = modeldsl.load(LLAMA, hf=path)
        model.forward(TOKENS)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak <= 1.3 * weight_bytes(model), f"peak {peak} for {weight_bytes(model)} bytes of weights"


def test_fp32_logits_are_unchanged_by_reading_into_the_arena():
    path = cached_checkpoint("llama")
    with torch.no_grad():
        expected = transformers_model(path)(torch.tensor([TOKENS])).logits[0].numpy()
    assert np.abs(modeldsl.load(LLAMA, hf=path).forward(TOKENS) - expected).max() <= 1e-4


def test_a_bf16_checkpoint_runs_in_bf16_held_once_and_matches_transformers(tmp_path):
    reference = transformers_model(cached_checkpoint("llama")).to(torch.bfloat16)
    reference.save_pretrained(tmp_path)
    assert SafetensorsFile(tmp_path / "model.safetensors").dtype("lm_head.weight") == ml_dtypes.bfloat16
    model = modeldsl.load(LLAMA, hf=tmp_path, dtype="bf16")
    assert {w.dtype for w in model.weights.values()} == {np.dtype(ml_dtypes.bfloat16)}
    assert_views_of_the_arena(model)
    assert model.schedule.params.nbytes < 0.55 * modeldsl.load(LLAMA, hf=tmp_path).schedule.params.nbytes
    logits = model.forward(TOKENS)
    with torch.no_grad():
        expected = reference(torch.tensor([TOKENS])).logits[0].float().numpy()
    assert np.abs(logits - expected).max() <= 0.05 * np.abs(expected).max()


def test_read_into_converts_in_chunks_and_shows_the_file_values(tmp_path):
    values = np.linspace(-3, 3, 35, dtype=np.float32).reshape(5, 7).astype(ml_dtypes.bfloat16)
    write_safetensors(tmp_path / "t.safetensors", {"x": values})
    source = SafetensorsFile(tmp_path / "t.safetensors")
    out, seen = np.zeros((5, 7), np.float32), []
    source.read_into("x", out, seen.append, chunk_bytes=8)
    np.testing.assert_array_equal(out, values.astype(np.float32))
    assert [c.size for c in seen] == [4] * 8 + [3] and {c.dtype for c in seen} == {values.dtype}
    same = np.zeros((5, 7), ml_dtypes.bfloat16)
    source.read_into("x", same)
    np.testing.assert_array_equal(same.view(np.uint16), values.view(np.uint16))


@linux
def test_an_fp32_checkpoint_of_whole_pages_is_mapped_not_read_and_runs_the_same(monkeypatch):
    path = cached_checkpoint("llama", **PAGED)
    model = modeldsl.load(LLAMA, hf=path)
    assert model.params.pages.mapped >= 0.95 * weight_bytes(model)
    assert_views_of_the_arena(model)
    monkeypatch.setattr(pages, "_MMAP", None)
    read = modeldsl.load(LLAMA, hf=path)
    assert read.params.pages.mapped == 0
    logits = model.forward(TOKENS)
    np.testing.assert_array_equal(logits, read.forward(TOKENS))
    with torch.no_grad():
        expected = transformers_model(path)(torch.tensor([TOKENS])).logits[0].numpy()
    assert np.abs(logits - expected).max() <= 1e-4


@linux
def test_writes_to_mapped_weights_stay_in_memory_and_a_save_over_the_checkpoint_keeps_them(tmp_path):
    folder = shutil.copytree(cached_checkpoint("llama", **PAGED), tmp_path / "checkpoint")
    model = modeldsl.load(LLAMA, hf=folder)
    assert model.params.pages.mapped
    file_bytes = (folder / "model.safetensors").read_bytes()
    model.weights["lm_head"][:3] += 1.0
    assert (folder / "model.safetensors").read_bytes() == file_bytes
    kept = {name: weight.copy() for name, weight in model.weights.items()}
    model.save_hf(folder, overwrite=True)  # replaces the files the weights are mapped from (E044 without)
    again = modeldsl.load(LLAMA, hf=folder)
    for name, weight in model.weights.items():
        np.testing.assert_array_equal(weight, kept[name], err_msg=name)
        np.testing.assert_array_equal(again.weights[name], kept[name], err_msg=name)


# a Mixtral of wide experts (8 x 2 layers x 3 tensors of 1536 x 512): 164 MB of fp32 weights, 92% of them
# expert stacks, every tensor a whole number of 4 KiB pages; a second copy of any part shows above the bound
WIDE_EXPERTS = ("MixtralConfig", dict(vocab_size=2048, hidden_size=512, intermediate_size=1536, num_hidden_layers=2,
                                      num_attention_heads=8, num_key_value_heads=2, num_local_experts=8,
                                      num_experts_per_tok=2, max_position_embeddings=256))
LOAD_ALLOWANCE = 48 << 20  # bytes a load holds besides the weights whatever their size (its IR, its imports)


def peak_of_a_fresh_load(tmp_path, monkeypatch, file_dtype):
    """bench_load's figures of loading the wide-experts checkpoint in ``file_dtype`` in a fresh process, and
    the weights' fp32 bytes (skipped where the process cannot reset its peak, or memory is short)."""
    from modeldsl.tools import bench_load

    monkeypatch.setitem(bench_load.SHAPES, "wide-experts", WIDE_EXPERTS)
    directory = bench_load.write_checkpoint("wide-experts", tmp_path / file_dtype, file_dtype)
    weights = bench_load.weight_bytes(bench_load.checkpoint_tensors("wide-experts")[1])
    if bench_load.memory_problem(weights, 3.0):
        pytest.skip(bench_load.memory_problem(weights, 3.0))
    result = bench_load.run_child({"runner": "modeldsl", "hf": str(directory), "vocab": 2048, "threads": 1})
    assert "load_peak" in result, result
    if not result["peak_reset"]:
        pytest.skip("this system cannot reset a process's peak resident set (/proc/self/clear_refs)")
    assert result["finite"]
    return result, weights


@linux
def test_a_bf16_checkpoint_of_expert_stacks_loads_in_fp32_holding_each_weight_once(tmp_path, monkeypatch):
    result, weights = peak_of_a_fresh_load(tmp_path, monkeypatch, "bf16")
    for peak in ("load_peak", "forward_peak"):
        held = result[peak] - result["baseline"]
        assert held <= 1.1 * weights + LOAD_ALLOWANCE, f"{peak}: {held} bytes held for {weights} of weights"


@linux
@pytest.mark.skipif(not pages._MAPPABLE, reason="this system cannot map file pages")
def test_an_fp32_checkpoint_of_expert_stacks_is_mapped_untouched_until_the_forward_reads_it(tmp_path, monkeypatch):
    result, weights = peak_of_a_fresh_load(tmp_path, monkeypatch, "fp32")
    assert result["load_peak"] - result["baseline"] <= 0.25 * weights + LOAD_ALLOWANCE  # checked, not read in
    assert result["forward_peak"] - result["baseline"] <= 1.1 * weights + LOAD_ALLOWANCE
