"""One tensor-parallel rank's model and weights (modeldsl.rank_config, the loader's slices): the sizes tp
divides, E048 where it does not or where a parameter's rank shape is not its strategy's, and a
checkpoint tensor read as a rank's share along dim 0 (a byte range) and dim 1 (columns)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from modeldsl.diagnostics import DiagnosticError, DiagnosticSink
from modeldsl.frontend.text.parser import parse_source
from modeldsl.hf.config import read_config
from modeldsl.hf.safetensors_io import CheckpointError, SafetensorsFile, write_safetensors
from modeldsl.kernels import reference
from modeldsl.lower import choose_top
from modeldsl.rank_config import lower_for_rank, model_of, rank_values
from modeldsl.runtime.model import hf_config_values

ROOT = Path(__file__).resolve().parents[2]
LLAMA = ROOT / "modeldsl" / "std" / "models" / "llama.module"


def tiny_llama():
    program = parse_source(LLAMA.read_text(), str(LLAMA))
    decl = choose_top(program, None)
    return program, decl, hf_config_values(program, decl, read_config(ROOT / "examples" / "tiny_llama"))


def test_a_rank_has_its_share_of_the_heads_and_of_the_mlp_and_every_other_parameter_whole():
    program, decl, values = tiny_llama()
    module, whole = lower_for_rank(program, decl.name, values, 2, DiagnosticSink())
    local = model_of(module)
    assert local.attributes["tp_shapes"].value.data == 2
    config = {k: v.value.data for k, v in local.config_values.items() if k in ("num_heads", "num_kv_heads", "d_ff",
                                                                               "head_dim")}
    assert config == {"num_heads": 2, "num_kv_heads": 1, "d_ff": 86, "head_dim": 16}
    assert model_of(whole).config_values["num_heads"].value.data == 4


def test_a_tp_that_does_not_divide_the_heads_is_e048_naming_them():
    program, decl, values = tiny_llama()
    with pytest.raises(DiagnosticError) as err:
        lower_for_rank(program, decl.name, values, 4, DiagnosticSink())  # 2 kv heads
    assert "E048" in str(err.value) and "tp=4 does not divide num_kv_heads=2" in str(err.value)


def test_a_parameter_sized_by_the_heads_without_a_strategy_is_e048():
    text = LLAMA.read_text()
    program = parse_source(text, str(LLAMA))
    decl = choose_top(program, None)
    whole = model_of(lower_for_rank(program, decl.name, tiny_llama()[2], 1, DiagnosticSink())[1])
    values = rank_values(whole, tiny_llama()[2], 2)
    assert values["num_heads"] == 2 and values["head_dim"] == 16
    olmo = ROOT / "modeldsl" / "std" / "models" / "olmo2.module"  # q_norm and k_norm over the whole projections
    program = parse_source(olmo.read_text(), str(olmo))
    decl = choose_top(program, None)
    with pytest.raises(DiagnosticError) as err:
        lower_for_rank(program, decl.name, {"num_heads": 4, "num_kv_heads": 2, "d_model": 64, "d_ff": 128,
                                            "vocab_size": 128, "n_layers": 1}, 2, DiagnosticSink())
    assert "E048" in str(err.value) and "q_norm" in str(err.value) and "no @shard strategy" in str(err.value)


@pytest.fixture
def tensors(tmp_path):
    rng = np.random.default_rng(0)
    values = {"rows": rng.standard_normal((6, 4)).astype(np.float32),
              "cols": rng.standard_normal((3, 8)).astype(np.float32)}
    write_safetensors(tmp_path / "t.safetensors", values)
    return tmp_path / "t.safetensors", values


@pytest.mark.parametrize("rank", [0, 1])
def test_a_rank_reads_its_rows_and_its_columns_of_a_tensor(tensors, rank):
    path, values = tensors
    source = SafetensorsFile(path)
    source.narrow("rows", 0, rank, 2)
    source.narrow("cols", 1, rank, 2)
    expected = {"rows": values["rows"][3 * rank:3 * rank + 3], "cols": values["cols"][:, 4 * rank:4 * rank + 4]}
    for name, want in expected.items():
        assert source.shape(name) == want.shape
        np.testing.assert_array_equal(source.array(name), want)
        out = np.empty(want.shape, np.float64)
        source.read_into(name, out, chunk_bytes=16)
        np.testing.assert_array_equal(out, want)
        chunks = [chunk.copy() for _, chunk in source.row_chunks(name, 0, want.shape[0], chunk_bytes=16)]
        assert len(chunks) > 1  # one buffer, refilled for each chunk
        np.testing.assert_array_equal(np.concatenate(chunks), want)


def test_a_tensor_that_does_not_split_into_the_ranks_is_e048(tensors):
    source = SafetensorsFile(tensors[0])
    with pytest.raises(CheckpointError) as err:
        source.narrow("cols", 0, 0, 2)  # 3 rows
    assert err.value.code == "E048"


def test_the_global_norm_of_shares_is_the_norm_of_the_whole():
    rng = np.random.default_rng(1)
    a, b, c = (rng.standard_normal(n).astype(np.float32) for n in (5, 7, 3))
    share = reference.global_norm(b, c, squared=True)
    np.testing.assert_allclose(share, np.sum(b.astype(np.float64) ** 2) + np.sum(c.astype(np.float64) ** 2), rtol=1e-6)
    whole = reference.global_norm(a, share, plus=1)
    np.testing.assert_allclose(whole, np.sqrt(np.sum(np.concatenate([a, b, c]).astype(np.float64) ** 2)), rtol=1e-6)
