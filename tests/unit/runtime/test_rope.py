"""RoPE tables against transformers' rope init functions, and coded problems for a bad ``rope_scaling``."""

import numpy as np
import pytest

from modeldsl.runtime.rope import SUPPORTED, RopeScalingError, rope_frequencies

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

HEAD_DIM, THETA, MAX_POSITIONS = 16, 5000.0, 128
SCALINGS = {
    "default": {"rope_type": "default"},
    "linear": {"rope_type": "linear", "factor": 4.0},
    "legacy-type-key": {"type": "linear", "factor": 2.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16},
    "llama3-original-from-max-positions": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                           "high_freq_factor": 4.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0},
    "yarn-betas": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32, "beta_fast": 16,
                   "beta_slow": 2},
    "yarn-mscale-untruncated": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32,
                                "mscale": 0.707, "mscale_all_dim": 1.0, "truncate": False},
    "yarn-attention-factor": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32,
                              "attention_factor": 0.5},
}


def transformers_cos_sin(scaling, positions):
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    config = transformers.LlamaConfig(hidden_size=64, num_attention_heads=4, head_dim=HEAD_DIM,
                                      max_position_embeddings=MAX_POSITIONS,
                                      rope_parameters={"rope_theta": THETA, **scaling})
    rotary = LlamaRotaryEmbedding(config)
    cos, sin = rotary(torch.zeros(1, 1, HEAD_DIM), torch.tensor([list(positions)]))
    half = HEAD_DIM // 2  # transformers repeats the half for rotate_half
    return cos[0, :, :half].numpy(), sin[0, :, :half].numpy(), rotary


@pytest.mark.parametrize("name", sorted(SCALINGS))
def test_tables_match_transformers(name):
    scaling = SCALINGS[name]
    positions = range(MAX_POSITIONS)
    cos, sin, rotary = transformers_cos_sin(dict(scaling), positions)
    ours = rope_frequencies(HEAD_DIM, THETA, dict(scaling), MAX_POSITIONS)
    np.testing.assert_allclose(ours.inv_freq, rotary.inv_freq.numpy(), rtol=1e-6)
    assert ours.attention_factor == pytest.approx(rotary.attention_scaling)
    table = ours.table(positions)
    assert table.shape == (MAX_POSITIONS, HEAD_DIM // 2, 2) and table.dtype == np.float32
    np.testing.assert_allclose(table[..., 0], cos, atol=2e-5)
    np.testing.assert_allclose(table[..., 1], sin, atol=2e-5)


def test_yarn_scales_cos_and_sin_by_its_attention_factor():
    ours = rope_frequencies(HEAD_DIM, THETA, {"rope_type": "yarn", "factor": 4.0}, MAX_POSITIONS)
    assert ours.attention_factor == pytest.approx(0.1 * np.log(4.0) + 1.0)
    table = ours.table(range(3))
    np.testing.assert_allclose(np.hypot(table[..., 0], table[..., 1]), ours.attention_factor, rtol=1e-6)


@pytest.mark.parametrize("scaling, key, words", [
    ("bad", None, "must be a JSON object"),
    ({"rope_type": "mrope", "factor": 2.0}, "rope_type", "'mrope', which is not supported"),
    ({"rope_type": "longrope", "factor": 2.0}, "short_factor", "has no 'short_factor'"),
    ({"rope_type": "longrope", "short_factor": [1.0] * 8, "long_factor": [1.0] * 7}, "long_factor",
     "must be a list of 8 positive numbers"),
    ({"rope_type": "su", "short_factor": [1.0] * 8, "long_factor": [1.0] * 7 + [0.0]}, "long_factor",
     "must be a list of 8 positive numbers"),
    ({"rope_type": "yarn", "factor": 2.0, "short_factor": [1.0] * 8, "long_factor": [2.0] * 8}, "rope_type",
     "transformers' Phi-3 reads that as longrope"),
    ({"type": 3}, "type", "3, which is not supported"),
    ({"rope_type": "linear"}, "factor", "has no 'factor', which rope_type 'linear' needs"),
    ({"rope_type": "llama3"}, "factor", "has no 'factor'"),
    ({"rope_type": "llama3", "factor": 8.0}, "low_freq_factor", "has no 'low_freq_factor'"),
    ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 4.0}, "high_freq_factor",
     "must be greater than 'low_freq_factor'"),
    ({"rope_type": "linear", "factor": 0}, "factor", "must be a positive number"),
    ({"rope_type": "linear", "factor": "2"}, "factor", "must be a positive number"),
    ({"rope_type": "dynamic", "factor": float("nan")}, "factor", "must be a positive number"),
    ({"rope_type": "yarn", "factor": 2.0, "truncate": "yes"}, "truncate", "must be true or false"),
    ({"rope_type": "linear", "factor": 2.0, "partial_rotary_factor": 0.5}, "partial_rotary_factor",
     "not supported"),
])
def test_bad_scalings_name_the_key(scaling, key, words):
    with pytest.raises(RopeScalingError, match=words) as info:
        rope_frequencies(HEAD_DIM, THETA, scaling, MAX_POSITIONS)
    assert info.value.key == key


def test_llama3_without_max_positions_needs_its_original_context():
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
    with pytest.raises(RopeScalingError, match="original_max_position_embeddings"):
        rope_frequencies(HEAD_DIM, THETA, scaling)


def test_supported_types_are_listed_in_the_error():
    with pytest.raises(RopeScalingError) as info:
        rope_frequencies(HEAD_DIM, THETA, {"rope_type": "mrope"})
    assert all(kind in str(info.value) for kind in SUPPORTED)


# ---------------------------------------------------------------------------- longrope (Phi-3)
LONG = {"short_factor": [1.0, 1.2, 1.9, 3.0, 7.5, 11.0], "long_factor": [1.1, 2.0, 4.5, 9.0, 30.0, 61.0]}


def phi3_rotary(partial: float, rope: dict, original: int | None):
    """transformers' Phi-3 rotary embedding (head_dim 16) for a longrope ``rope`` of 6 factor pairs."""
    from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding

    extra = {} if original is None else {"original_max_position_embeddings": original}
    config = transformers.Phi3Config(hidden_size=64, num_attention_heads=4, max_position_embeddings=MAX_POSITIONS,
                                     partial_rotary_factor=partial, pad_token_id=None, eos_token_id=None,
                                     rope_parameters={"rope_theta": THETA, **rope}, **extra)
    return Phi3RotaryEmbedding(config)


@pytest.mark.parametrize("extra, original", [
    ({}, 16),                                       # factor max_positions / original, its attention factor
    ({"factor": 3.0}, 16),                          # a given factor
    ({"attention_factor": 0.9}, 32),                # a given attention factor
    ({"original_max_position_embeddings": 100}, 16),  # the config's top-level one goes first
    ({}, None),                                     # Phi3Config's default 4096: factor < 1, attention 1
])
@pytest.mark.parametrize("length", [5, 16, 17, 40])
def test_longrope_tables_match_transformers_short_and_long(extra, original, length):
    """Both sets and the attention factor from transformers' own _compute_longrope_parameters, and the
    table of a sequence of ``length`` positions from Phi3RotaryEmbedding, whose dynamic_rope_update takes
    the long factors past original_max_position_embeddings (partial_rotary_factor 0.75: 12 of 16 dims)."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rope = {"rope_type": "longrope", **LONG, **extra}
    rotary = phi3_rotary(0.75, dict(rope), original)
    top = original if original is not None else 4096  # Phi3Config's default, as the std Phi3's original_max_seq
    ours = rope_frequencies(12, THETA, {**rope, "partial_rotary_factor": 0.75}, MAX_POSITIONS, head_dim=16,
                            original_max_positions=top)
    short, attention = ROPE_INIT_FUNCTIONS["longrope"](rotary.config)
    long, _ = ROPE_INIT_FUNCTIONS["longrope"](rotary.config, seq_len=top + 1)
    np.testing.assert_allclose(ours.inv_freq, short.numpy(), rtol=1e-6)
    np.testing.assert_allclose(ours.long_inv_freq, long.numpy(), rtol=1e-6)
    assert ours.attention_factor == pytest.approx(attention) == pytest.approx(rotary.attention_scaling)
    assert ours.original_max_positions == top and ours.uses_long(length) == (length > top)
    cos, sin = rotary(torch.zeros(1, 1, 16), torch.arange(length)[None])
    table = ours.table(range(length))
    assert table.shape == (length, 6, 2)
    np.testing.assert_allclose(table[..., 0], cos[0, :, :6].numpy(), atol=2e-5)
    np.testing.assert_allclose(table[..., 1], sin[0, :, :6].numpy(), atol=2e-5)
    # a step of generation: its position's row in a sequence of that length
    np.testing.assert_array_equal(ours.table([length - 1]), table[-1:])


def test_longrope_picks_its_factors_by_the_sequence_length_given():
    ours = rope_frequencies(12, THETA, {"rope_type": "longrope", **LONG}, MAX_POSITIONS, original_max_positions=16,
                            generation_recomputes=True)
    assert not np.array_equal(ours.table(range(4), seq_len=16), ours.table(range(4), seq_len=17))
    np.testing.assert_array_equal(ours.table(range(4), seq_len=16), ours.table(range(4)))
    assert ours.recomputes(16, 17) and ours.recomputes(3, 20) and not ours.recomputes(17, 18)
    assert not ours.recomputes(0, 20) and not ours.recomputes(5, 16)  # a prefill; still short
    plain = rope_frequencies(12, THETA, None)
    assert not plain.recomputes(16, 17) and not plain.uses_long(10**6)
    # other families' transformers generation keeps the keys rotated with the short factors
    kept = rope_frequencies(12, THETA, {"rope_type": "longrope", **LONG}, MAX_POSITIONS, original_max_positions=16)
    assert kept.uses_long(17) and not kept.recomputes(16, 17)


def test_the_old_su_name_is_longrope():
    rope = {"short_factor": LONG["short_factor"], "long_factor": LONG["long_factor"]}
    su = rope_frequencies(12, THETA, {"type": "su", **rope}, MAX_POSITIONS, original_max_positions=16)
    longrope = rope_frequencies(12, THETA, {"rope_type": "longrope", **rope}, MAX_POSITIONS, original_max_positions=16)
    np.testing.assert_array_equal(su.table(range(40)), longrope.table(range(40)))


def test_a_partial_rotary_factor_must_give_the_rotated_width():
    scaling = {"rope_type": "longrope", **LONG, "partial_rotary_factor": 0.5}
    with pytest.raises(RopeScalingError, match="rotates 12 of its 16 head dims") as info:
        rope_frequencies(12, THETA, scaling, MAX_POSITIONS, head_dim=16)
    assert info.value.key == "partial_rotary_factor"
    assert rope_frequencies(12, THETA, {**scaling, "partial_rotary_factor": 0.75}, MAX_POSITIONS, head_dim=16)


# ---------------------------------------------------------------------------- packed rows: a table per row
def test_tables_at_gives_each_token_the_row_of_its_position_bitwise():
    """tables_at [B, T, D/2, 2]: each token's row is the table's row at its position (what an example run
    alone at positions 0.. gets), bit for bit; the dict form takes every RoPE input (model.ropes)."""
    from modeldsl.runtime.rope import tables_at

    for scaling in (None, SCALINGS["llama3"], SCALINGS["yarn"]):
        rope = rope_frequencies(HEAD_DIM, THETA, scaling, MAX_POSITIONS)
        positions = np.array([[0, 1, 2, 0, 1, 0, 1, 2, 3], [0, 1, 2, 3, 4, 5, 0, 1, 2]])
        rows = rope.tables_at(positions)
        assert rows.shape == (2, 9, HEAD_DIM // 2, 2) and rows.dtype == np.float32
        table = rope.table(range(6))
        np.testing.assert_array_equal(rows, table[positions])
        both = tables_at({"freqs": rope, "local_freqs": rope_frequencies(HEAD_DIM, 10.0)}, positions)
        assert set(both) == {"freqs", "local_freqs"} and np.array_equal(both["freqs"], rows)


def test_longrope_tables_at_take_each_examples_own_factors():
    """Longrope picks its factors by the sequence's length: in a packed row, each example's own (its
    segment's last position + 1), as the example run alone."""
    rope = rope_frequencies(12, THETA, {"rope_type": "longrope", **LONG}, MAX_POSITIONS, original_max_positions=16)
    lengths = [5, 20, 3]  # the second one past 16: the long factors
    positions = np.concatenate([np.arange(n) for n in lengths])[None]
    segments = np.repeat(np.arange(3), lengths)[None]
    rows = rope.tables_at(positions, segments)
    start = 0
    for n in lengths:
        np.testing.assert_array_equal(rows[0, start:start + n], rope.table(range(n)))
        start += n
    assert not np.array_equal(rope.tables_at(positions)[0, :5], rows[0, :5])  # without segments: the row's longest (20)


def test_packed_inputs_are_the_forwards_in_order_then_the_segment_ids():
    from types import SimpleNamespace

    from modeldsl.dialects.dtypes import DType
    from modeldsl.dialects.graph_types import TensorType
    from modeldsl.runtime.rope import packed_inputs

    def arg(name, dtype):
        return SimpleNamespace(name_hint=name, type=TensorType([2, 4], dtype))

    rope = rope_frequencies(HEAD_DIM, THETA)
    model = SimpleNamespace(ropes={"freqs": rope}, forward_func=SimpleNamespace(body=SimpleNamespace(
        block=SimpleNamespace(args=[arg("tokens", DType.INT32), arg("freqs", DType.FP32)]))))
    tokens = np.arange(8).reshape(2, 4)
    segments, positions = np.array([[0, 0, 1, 1], [0, 0, 0, 1]]), np.array([[0, 1, 0, 1], [0, 1, 2, 0]])
    ids, tables, seg = packed_inputs(model, tokens, segments, positions)
    assert ids.dtype == np.int32 and np.array_equal(ids, tokens)
    np.testing.assert_array_equal(tables, rope.table(range(3))[positions])
    assert seg.dtype == np.int32 and np.array_equal(seg, segments)
    with pytest.raises(ValueError, match="must be"):
        packed_inputs(model, tokens, segments[:, :3], positions)
