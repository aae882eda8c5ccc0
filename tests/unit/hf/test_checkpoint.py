"""HF checkpoint import through hf_mapping, export through the import record, and bad checkpoints."""

import json
import shutil

import numpy as np
import pytest
from xdsl.context import Context

from modeldsl.dialects.graph import ModelOp
from modeldsl.frontend.text.parser import parse_source
from modeldsl.hf.checkpoint import load_checkpoint, save_checkpoint
from modeldsl.hf.config import dsl_config, read_config
from modeldsl.hf.safetensors_io import CheckpointError, SafetensorsFile, write_safetensors
from modeldsl.lower import lower_program
from modeldsl.passes.specialize import SpecializePass
from modeldsl.resolve.imports import STD_ROOT


def llama_model(directory):
    path = STD_ROOT / "models" / "llama.module"
    program = parse_source(path.read_text(), str(path))
    decl = next(d for d in program.declarations if d.name == "Llama")
    default = next(op for op in lower_program(program, "Llama").walk() if isinstance(op, ModelOp))
    module = lower_program(program, "Llama", dsl_config(decl, default, read_config(directory)))
    SpecializePass().apply(Context(), module)
    return next(op for op in module.walk() if isinstance(op, ModelOp))


def load(directory, warnings=None, allow_unused=False):
    return load_checkpoint(llama_model(directory), directory, np.dtype(np.float32),
                           warn=(warnings.append if warnings is not None else None), allow_unused=allow_unused)


def copy(src, tmp_path):
    dst = tmp_path / "ckpt"
    shutil.copytree(src, dst)
    return dst


def rewrite(directory, change):
    """Rewrite model.safetensors with change(dict of arrays)."""
    f = SafetensorsFile(directory / "model.safetensors")
    tensors = {k: np.array(f.array(k)) for k in f.keys()}
    change(tensors)
    write_safetensors(directory / "model.safetensors", tensors)


def failure(directory) -> CheckpointError:
    with pytest.raises(CheckpointError) as info:
        load(directory)
    return info.value


def test_config_maps_through_hf_config(tiny_llama):
    model = llama_model(tiny_llama)
    config = {k: v.value.data for k, v in model.config_values.items() if hasattr(v, "value")}
    assert config["d_model"] == 32 and config["num_kv_heads"] == 2 and config["head_dim"] == 8


def test_import_fuses_and_stacks_and_export_is_bitwise_identical(tiny_llama, tmp_path):
    import torch
    from transformers import LlamaForCausalLM

    weights, record = load(tiny_llama)
    hf = LlamaForCausalLM.from_pretrained(tiny_llama).state_dict()
    q, k, v = (hf[f"model.layers.1.self_attn.{n}_proj.weight"].numpy() for n in "qkv")
    np.testing.assert_array_equal(weights["blocks.attention.qkv_weight"][1], np.concatenate([q, k, v]))
    model = llama_model(tiny_llama)
    save_checkpoint(model, weights, record, tmp_path / "out")
    before, after = (SafetensorsFile(tiny_llama / "model.safetensors"),
                     SafetensorsFile(tmp_path / "out" / "model.safetensors"))
    assert sorted(before.keys()) == sorted(after.keys())
    for name in before.keys():
        assert before.dtype(name) == after.dtype(name)
        assert before.array(name).tobytes() == after.array(name).tobytes(), name
    reloaded = LlamaForCausalLM.from_pretrained(tmp_path / "out")
    ids = torch.tensor([[1, 5, 9, 3]])
    with torch.no_grad():
        expected = LlamaForCausalLM.from_pretrained(tiny_llama)(ids).logits
        assert torch.equal(reloaded(ids).logits, expected)


def test_missing_tensor_is_e031_naming_tensor_and_rule(tiny_llama, tmp_path):
    ckpt = copy(tiny_llama, tmp_path)
    rewrite(ckpt, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    err = failure(ckpt)
    assert err.code == "E031" and "model.layers.1.mlp.up_proj.weight" in err.message
    assert "blocks[{layer}].mlp.up_weight" in err.message


def test_an_unexpected_tensor_is_e040_naming_it(tiny_llama, tmp_path):
    ckpt = copy(tiny_llama, tmp_path)
    rewrite(ckpt, lambda t: t.update({"model.extra.weight": np.zeros(3, np.float32)}))
    err = failure(ckpt)
    assert err.code == "E040" and err.tensor == "model.extra.weight" and "'model.extra.weight'" in err.message
    assert "--allow-unused-tensors" in err.hint


def test_allow_unused_downgrades_an_unexpected_tensor_to_w006(tiny_llama, tmp_path):
    ckpt = copy(tiny_llama, tmp_path)
    rewrite(ckpt, lambda t: t.update({"model.extra.weight": np.zeros(3, np.float32)}))
    warnings = []
    load(ckpt, warnings, allow_unused=True)
    (warning,) = warnings
    assert warning.code == "W006" and warning.tensor == "model.extra.weight"


def test_wrong_shape_is_e032(tiny_llama, tmp_path):
    ckpt = copy(tiny_llama, tmp_path)
    rewrite(ckpt, lambda t: t.update({"model.norm.weight": np.zeros(31, np.float32)}))
    err = failure(ckpt)
    assert err.code == "E032" and "model.norm.weight" in err.message and "final_norm.weight" in err.message


def test_wrong_dtype_is_e033(tiny_llama, tmp_path):
    ckpt = copy(tiny_llama, tmp_path)
    rewrite(ckpt, lambda t: t.update({"model.norm.weight": np.zeros(32, np.int32)}))
    err = failure(ckpt)
    assert err.code == "E033" and err.tensor == "model.norm.weight"


def test_truncated_file_is_e034(tiny_llama, tmp_path):
    ckpt = copy(tiny_llama, tmp_path)
    data = (ckpt / "model.safetensors").read_bytes()
    (ckpt / "model.safetensors").write_bytes(data[: len(data) - 100])
    err = failure(ckpt)
    assert err.code == "E034" and err.tensor is not None


def test_directory_without_config_is_e030(tiny_llama, tmp_path):
    ckpt = copy(tiny_llama, tmp_path)
    (ckpt / "config.json").unlink()
    with pytest.raises(CheckpointError) as info:
        read_config(ckpt)
    assert info.value.code == "E030" and "no config.json" in info.value.message


def test_config_field_of_the_wrong_type_is_e030(tiny_llama, tmp_path):
    ckpt = copy(tiny_llama, tmp_path)
    config = json.loads((ckpt / "config.json").read_text())
    config["hidden_size"] = "wide"
    (ckpt / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError) as info:
        llama_model(ckpt)
    assert info.value.code == "E030" and "hidden_size" in info.value.message


def test_no_pickles_are_loaded(tiny_llama, tmp_path):
    ckpt = copy(tiny_llama, tmp_path)
    (ckpt / "model.safetensors").rename(ckpt / "pytorch_model.bin")
    err = failure(ckpt)
    assert err.code == "E031" and "pickled" in err.hint


def test_config_contradicting_a_constraint_is_e027(tiny_llama, tmp_path):
    from modeldsl.diagnostics import DiagnosticError

    ckpt = copy(tiny_llama, tmp_path)
    config = json.loads((ckpt / "config.json").read_text())
    config["num_key_value_heads"] = 3
    (ckpt / "config.json").write_text(json.dumps(config))
    with pytest.raises(DiagnosticError) as info:
        llama_model(ckpt)
    assert "E027" in [d.code for d in info.value.diagnostics]
    assert any("multiple of num_key_value_heads" in d.message for d in info.value.diagnostics)


def test_loading_holds_about_one_copy_of_the_weights(tmp_path):
    import tracemalloc

    from hf_checkpoints import make_checkpoint

    path = make_checkpoint(tmp_path / "wide", hidden_size=256, intermediate_size=512, vocab_size=1024,
                           num_hidden_layers=4)
    model = llama_model(path)
    tracemalloc.start()
    weights, _ = load_checkpoint(model, path, np.dtype(np.float32))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    total = sum(w.nbytes for w in weights.values())
    assert total > 8_000_000 and peak < 1.25 * total, (peak, total)


def test_a_missing_optional_lm_head_names_the_tensor_and_the_rule(tiny_llama, tmp_path):
    ckpt = copy(tiny_llama, tmp_path)
    rewrite(ckpt, lambda t: t.pop("lm_head.weight"))
    err = failure(ckpt)
    assert err.code == "E031" and err.tensor == "lm_head.weight"
    assert "'lm_head.weight'" in err.message and "lm_head?" in err.message and "'lm_head'" in err.message
    assert "tie_word_embeddings" in err.hint


def test_a_tensor_in_two_shards_is_e034_naming_both_files(tiny_llama, tmp_path):
    ckpt = copy(tiny_llama, tmp_path)
    write_safetensors(ckpt / "model-00002-of-00002.safetensors", {"model.norm.weight": np.ones(32, np.float32)})
    err = failure(ckpt)
    assert err.code == "E034" and err.tensor == "model.norm.weight"
    assert "model.safetensors" in err.message and "model-00002-of-00002.safetensors" in err.message


def _header(text: bytes) -> bytes:
    import struct

    return struct.pack("<Q", len(text)) + text


CORRUPT_HEADERS = {
    "not JSON": _header(b'{"model.norm.weight": {"dtype": "F32", ') + bytes(128),
    "not an object": _header(b"[1, 2, 3]") + bytes(128),
    "bad entry": _header(b'{"model.norm.weight": {"dtype": "Q7", "shape": [32], "data_offsets": [0, 128]}}')
    + bytes(128),
    "length past the end": (10**6).to_bytes(8, "little") + b"{}",
    "shorter than 8 bytes": b"\x01\x02",
}


@pytest.mark.parametrize("name", sorted(CORRUPT_HEADERS))
def test_a_corrupt_header_is_e034_naming_the_file(name, tiny_llama, tmp_path):
    ckpt = copy(tiny_llama, tmp_path)
    (ckpt / "model-00002-of-00002.safetensors").write_bytes(CORRUPT_HEADERS[name])
    err = failure(ckpt)
    assert err.code == "E034" and err.message.startswith("model-00002-of-00002.safetensors: ")


def _renamed(old, new):
    return lambda t: t.update({new: t.pop(old)})


@pytest.mark.parametrize("present", [
    "model.layers.0.mlp.gate.weight",        # a MoE router, not the gate projection
    "model.layers.0.mlp.v_proj.weight",      # another projection
    "model.layers.1.mlp.gate_proj.weight",   # another layer (the checkpoint has it anyway)
    "model.layers.0.mlp.gate_proj.bias",     # another kind of tensor
])
def test_e031_never_hints_at_an_unrelated_tensor(present, tiny_llama, tmp_path):
    ckpt = copy(tiny_llama, tmp_path)
    missing = "model.layers.0.mlp.gate_proj.weight"
    rewrite(ckpt, lambda t: t.update({present: t.pop(missing)}) if present not in t else t.pop(missing))
    err = failure(ckpt)
    assert err.code == "E031" and missing in err.message and "did you mean" not in err.hint


@pytest.mark.parametrize("present", ["model.layers.0.mlp.gate_prj.weight",
                                     "language_model.model.layers.0.mlp.gate_proj.weight"])
def test_e031_hints_at_a_misspelled_or_prefixed_tensor(present, tiny_llama, tmp_path):
    ckpt = copy(tiny_llama, tmp_path)
    rewrite(ckpt, _renamed("model.layers.0.mlp.gate_proj.weight", present))
    assert failure(ckpt).hint == f"did you mean '{present}'?"
