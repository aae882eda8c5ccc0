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
    ({"rope_type": "longrope", "factor": 2.0}, "rope_type", "'longrope', which is not supported"),
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
        rope_frequencies(HEAD_DIM, THETA, {"rope_type": "su"})
    assert all(kind in str(info.value) for kind in SUPPORTED)
