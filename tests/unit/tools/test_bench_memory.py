"""The memory benchmark's measurements on the tiny Llama: self-consistent numbers."""

import pytest

from modeldsl.tools.bench_memory import (
    Result,
    format_breakdown,
    format_table,
    schedule_memory,
    tiny_llama,
    torch_memory,
)

TOKENS = 64


@pytest.fixture(scope="module")
def spec():
    return tiny_llama(TOKENS)


@pytest.fixture(scope="module")
def schedule(spec):
    return schedule_memory(spec, 1, TOKENS)


@pytest.fixture(scope="module")
def torch_peak(spec):
    pytest.importorskip("transformers")
    return torch_memory(spec, 1, TOKENS)


def test_the_planned_arena_is_at_most_the_sum_of_intermediates(schedule):
    assert 0 < schedule.peak_live <= schedule.arena <= schedule.sum_intermediates
    assert schedule.arena == schedule.activations + schedule.workspace
    assert schedule.logits == TOKENS * 384 * 4  # the output is in the external arena, not in the arena


def test_per_layer_buffers_count_once_per_layer(spec, schedule):
    copies = {i.name: i.copies for i in schedule.intermediates}
    layers = spec.dsl["n_layers"]
    assert copies["x0"] == 1  # the residual stream is carried across layers: one buffer
    assert copies["gate"] == copies["ln1_out"] == layers
    assert copies["q_rot"] == layers  # an in-place alias only after planning: its own buffer before
    assert copies["xF"] == 1  # after the loop
    assert "logits" not in copies and "tokens" not in copies  # the output and an input (external)
    assert "att_flat" not in copies  # a reshape: an alias of the transposed attention output
    per_layer = sum(i.nbytes for i in schedule.intermediates if i.copies == layers)
    once = sum(i.nbytes for i in schedule.intermediates if i.copies == 1)
    assert schedule.sum_intermediates == layers * per_layer + once


def test_pytorch_peak_is_positive_and_consistent(torch_peak):
    assert torch_peak.peak > 0
    assert torch_peak.allocator_agrees
    assert torch_peak.residual == 0  # nothing but the logits outlives the forward
    assert torch_peak.logits == TOKENS * 384 * 4
    assert torch_peak.peak >= torch_peak.logits
    assert torch_peak.peak_without_output <= torch_peak.peak
    assert 0 < torch_peak.tensor_peak <= torch_peak.peak


def test_the_table_prints_every_ratio(spec, schedule, torch_peak):
    result = Result(spec, schedule, torch_peak)
    table = format_table([result], TOKENS)
    assert "tiny_llama" in table and f"T={TOKENS}" in table
    assert f"{result.vs_intermediates:.3f}" in table and f"{result.vs_torch:.3f}" in table
    assert "%gate " in format_breakdown(result)
