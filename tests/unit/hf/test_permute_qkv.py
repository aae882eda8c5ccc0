"""transform(permute_qkv): a model with Meta's interleaved RoPE loads a transformers Llama
checkpoint (whose q/k rows HF's convert_llama_weights_to_hf permuted to the half-split
layout) by undoing that permutation, and saves it back by applying it again."""

import numpy as np
import pytest
from hf_checkpoints import make_checkpoint, transformers_model

import modeldsl
from modeldsl.hf.safetensors_io import SafetensorsFile

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

META_LLAMA = """from std.modules.norm import RMSNorm
from std.modules.mlp import SwiGLU_MLP

block MetaAttention(d_model: int, num_heads: int, num_kv_heads: int, head_dim: int):
  \"\"\"Separate q/k/v projections and interleaved RoPE, as in Meta's Llama code.\"\"\"
  let:
    q_dim = num_heads * head_dim
    kv_dim = num_kv_heads * head_dim
  params:
    q_weight: [q_dim, d_model]
    k_weight: [kv_dim, d_model]
    v_weight: [kv_dim, d_model]
    out_weight: [d_model, q_dim]
  forward:
    inputs:
      x: [B, T, d_model]
      freqs: [T, head_dim // 2, 2, fp32]
    out: [B, T, d_model]
    graph:
      x -> matmul(q_weight, transpose=NT) -> view([B, T, num_heads, head_dim]) -> transpose(1, 2) -> q
      x -> matmul(k_weight, transpose=NT) -> view([B, T, num_kv_heads, head_dim]) -> transpose(1, 2) -> k
      x -> matmul(v_weight, transpose=NT) -> view([B, T, num_kv_heads, head_dim]) -> transpose(1, 2) -> v
      (q, k, freqs) -> rope(interleaved=true) -> (q_rot, k_rot)
      (q_rot, k_rot, v) -> flash_attention(causal=true) -> (att, lse)
      att -> transpose(1, 2) -> view([B, T, q_dim]) -> matmul(out_weight, transpose=NT) -> out

block MetaBlock(d_model: int, num_heads: int, num_kv_heads: int, head_dim: int, d_ff: int, eps: float):
  params:
    ln1: RMSNorm(d_model, eps)
    attention: MetaAttention(d_model, num_heads, num_kv_heads, head_dim)
    ln2: RMSNorm(d_model, eps)
    mlp: SwiGLU_MLP(d_model, d_ff)
  forward:
    inputs:
      x: [B, T, d_model]
      freqs: [T, head_dim // 2, 2, fp32]
    out: [B, T, d_model]
    graph:
      x -> ln1 -> h1
      (h1, freqs) -> attention -> a
      (x, a) -> add() -> mid
      mid -> ln2 -> h2
      h2 -> mlp -> m
      (mid, m) -> add() -> out

model MetaLlama(vocab_size: int, d_model: int, n_layers: int, num_heads: int, num_kv_heads: int,
                head_dim: int = d_model // num_heads, d_ff: int, eps: float = 1e-6, rope_theta: float = 10000.0):
  params:
    embedding: [vocab_size, d_model]
    blocks: [n_layers] x MetaBlock(d_model, num_heads, num_kv_heads, head_dim, d_ff, eps)
    final_norm: RMSNorm(d_model, eps)
    lm_head: [vocab_size, d_model]
  forward:
    inputs:
      tokens: [B, T, int32]
      freqs: [T, head_dim // 2, 2, fp32]
    out: logits: [B, T, vocab_size]
    graph:
      (tokens, embedding) -> embedding() -> x0
      (x0, freqs) -> blocks -> xN
      xN -> final_norm -> xF
      xF -> matmul(lm_head, transpose=NT) -> logits
  hf_config:
    param_mapping:
      vocab_size: vocab_size
      d_model: hidden_size
      n_layers: num_hidden_layers
      num_heads: num_attention_heads
      num_kv_heads: num_key_value_heads
      head_dim: head_dim
      d_ff: intermediate_size
      eps: rms_norm_eps
      rope_theta: rope_theta
  hf_mapping:
    embedding: "model.embed_tokens.weight"
    final_norm.weight: "model.norm.weight"
    lm_head: "lm_head.weight"
    blocks[{layer}].ln1.weight: "model.layers.{layer}.input_layernorm.weight"
    blocks[{layer}].attention.q_weight: transform("model.layers.{layer}.self_attn.q_proj.weight", \
fn: permute_qkv, head_dim=head_dim)
    blocks[{layer}].attention.k_weight: transform(permute_qkv, "model.layers.{layer}.self_attn.k_proj.weight", \
head_dim=d_model // num_heads)
    blocks[{layer}].attention.v_weight: "model.layers.{layer}.self_attn.v_proj.weight"
    blocks[{layer}].attention.out_weight: "model.layers.{layer}.self_attn.o_proj.weight"
    blocks[{layer}].ln2.weight: "model.layers.{layer}.post_attention_layernorm.weight"
    blocks[{layer}].mlp.up_weight: fuse("model.layers.{layer}.mlp.gate_proj.weight", \
"model.layers.{layer}.mlp.up_proj.weight", dim=0)
    blocks[{layer}].mlp.down_weight: "model.layers.{layer}.mlp.down_proj.weight"
"""
TOKENS = [3, 17, 42, 5, 9, 33, 2, 61, 7, 12]


@pytest.fixture(scope="module")
def meta(tmp_path_factory):
    """A transformers Llama checkpoint with head_dim 16 (head_dim 4 would make the
    permutation its own inverse) and the interleaved-RoPE DSL model loaded from it."""
    root = tmp_path_factory.mktemp("meta")
    path = make_checkpoint(root / "ckpt", "llama", hidden_size=32, num_attention_heads=2, num_key_value_heads=1)
    (root / "meta_llama.module").write_text(META_LLAMA)
    return path, modeldsl.load(root / "meta_llama.module", hf=path)


def hf_permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """convert_llama_weights_to_hf's permute: interleaved (Meta) rows -> half-split rows."""
    dim1, dim2 = w.shape
    t = torch.from_numpy(np.array(w))
    return t.view(n_heads, dim1 // n_heads // 2, 2, dim2).transpose(1, 2).reshape(dim1, dim2).numpy()


def test_import_undoes_hfs_permutation(meta):
    path, model = meta
    stored = SafetensorsFile(path / "model.safetensors")
    assert model.config("head_dim") == 16
    q = model.weights["blocks.attention.q_weight"][1]
    k = model.weights["blocks.attention.k_weight"][1]
    np.testing.assert_array_equal(hf_permute(q, 2), stored.array("model.layers.1.self_attn.q_proj.weight"))
    np.testing.assert_array_equal(hf_permute(k, 1), stored.array("model.layers.1.self_attn.k_proj.weight"))
    assert not np.array_equal(q, stored.array("model.layers.1.self_attn.q_proj.weight"))


def test_interleaved_model_matches_transformers_logits(meta):
    path, model = meta
    with torch.no_grad():
        expected = transformers_model(path)(torch.tensor([TOKENS])).logits[0].numpy()
    assert np.abs(model.forward(TOKENS) - expected).max() <= 1e-4


def test_export_reapplies_the_permutation_bitwise(meta, tmp_path):
    path, model = meta
    model.save_hf(tmp_path / "out")
    before, after = SafetensorsFile(path / "model.safetensors"), SafetensorsFile(tmp_path / "out" / "model.safetensors")
    assert sorted(before.keys()) == sorted(after.keys())
    for name in before.keys():
        assert before.array(name).tobytes() == after.array(name).tobytes(), name


def test_a_changed_weight_exports_through_the_permutation(meta, tmp_path):
    """Not the original bytes: the inverse of the import (HF's permute) of the new values."""
    path, model = meta
    weights = dict(model.weights)
    weights["blocks.attention.q_weight"] = model.weights["blocks.attention.q_weight"] * 2
    from modeldsl.hf.checkpoint import save_checkpoint

    save_checkpoint(model.model, weights, model.record, tmp_path / "out")
    after = SafetensorsFile(tmp_path / "out" / "model.safetensors")
    stored = SafetensorsFile(path / "model.safetensors")
    np.testing.assert_array_equal(after.array("model.layers.0.self_attn.q_proj.weight"),
                                  stored.array("model.layers.0.self_attn.q_proj.weight") * 2)
