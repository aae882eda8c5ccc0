"""Gemma 3's larger checkpoints are Gemma3ForConditionalGeneration: the text model under
``language_model.`` with its config in ``text_config``, beside a vision tower. The std Gemma3 serves the
text model of one (token ids only, as transformers' forward without pixel values), and an export writes
the vision tower back unchanged."""

import json
import shutil

import numpy as np
import pytest

import modeldsl
from modeldsl.hf.safetensors_io import SafetensorsFile

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TOKENS = [1, 5, 9, 3, 7, 2, 11, 4, 6, 8, 10, 12]
TEXT = dict(vocab_size=300, hidden_size=32, intermediate_size=48, num_hidden_layers=7, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, sliding_window=5, max_position_embeddings=128,
            query_pre_attn_scalar=12, final_logit_softcapping=3.0,
            rope_parameters={"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 10000.0},
                             "sliding_attention": {"rope_type": "default", "rope_theta": 100.0}})
VISION = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=28,
              patch_size=14)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("gemma3-multimodal")
    config = transformers.Gemma3Config(text_config=TEXT, vision_config=VISION, mm_tokens_per_image=4,
                                       image_token_index=299, boi_token_index=297, eoi_token_index=298)
    torch.manual_seed(0)
    model = transformers.Gemma3ForConditionalGeneration(config).eval()
    with torch.no_grad():  # norms start at 0 (1 + w): perturb them so the mapping shows
        for name, tensor in model.named_parameters():
            if "norm" in name:
                tensor.add_(torch.randn_like(tensor) * 0.1)
    model.save_pretrained(path)
    return path


def reference_logits(path):
    model = transformers.Gemma3ForConditionalGeneration.from_pretrained(path).eval()
    with torch.no_grad():
        return model(input_ids=torch.tensor([TOKENS])).logits[0].numpy(), model


def test_the_text_model_of_a_multimodal_checkpoint_matches_transformers(checkpoint):
    model = modeldsl.load(hf=checkpoint)
    assert model.model.sym_name.data == "Gemma3"
    assert (model.config("rope_theta"), model.config("rope_local_theta")) == (10000.0, 100.0)
    expected, reference = reference_logits(checkpoint)
    assert np.abs(model.forward(TOKENS) - expected).max() <= 1e-4
    with torch.no_grad():
        greedy = reference.generate(torch.tensor([TOKENS[:6]]), max_new_tokens=16, do_sample=False,
                                    pad_token_id=0)[0, 6:].tolist()
    assert model.generate(TOKENS[:6], 16)[:len(greedy)] == greedy


def test_an_export_writes_the_vision_tower_and_the_processor_back_and_transformers_reloads_it_whole(checkpoint,
                                                                                                   tmp_path):
    source, out = shutil.copytree(checkpoint, tmp_path / "source"), tmp_path / "out"
    (source / "preprocessor_config.json").write_text('{"image_processor_type": "Gemma3ImageProcessor"}')
    modeldsl.load(hf=source).save_hf(out)
    assert (out / "preprocessor_config.json").read_text() == (source / "preprocessor_config.json").read_text()
    original, written = (SafetensorsFile(p / "model.safetensors") for p in (source, out))
    assert sorted(written.keys()) == sorted(original.keys())
    assert any(name.startswith("vision_tower.") for name in written.keys())
    for name in original.keys():
        np.testing.assert_array_equal(written.array(name), original.array(name), err_msg=name)
    _, info = transformers.Gemma3ForConditionalGeneration.from_pretrained(out, output_loading_info=True)
    assert not any(info.values()), info


def test_a_hub_config_with_a_partial_text_config_takes_the_config_class_defaults(checkpoint, tmp_path):
    """The Hub's gemma-3-4b config.json lists only some text fields (the others are Gemma3TextConfig's
    defaults: rope_theta 1e6, rope_local_base_freq 1e4, query_pre_attn_scalar 256, ...) in transformers 4's
    spelling (rope_scaling, no layer_types)."""
    path = shutil.copytree(checkpoint, tmp_path / "hub")
    config = json.loads((path / "config.json").read_text())
    config["text_config"] = {"hidden_size": 32, "intermediate_size": 48, "model_type": "gemma3_text",
                             "num_hidden_layers": 7, "num_attention_heads": 4, "num_key_value_heads": 2,
                             "head_dim": 8, "vocab_size": 300, "sliding_window": 5,
                             "rope_scaling": {"factor": 8.0, "rope_type": "linear"}}
    (path / "config.json").write_text(json.dumps(config))
    model = modeldsl.load(hf=path)
    assert (model.config("rope_theta"), model.config("rope_local_theta"), model.config("max_seq")) == \
        (1000000.0, 10000.0, 131072)
    expected, _ = reference_logits(path)
    assert np.abs(model.forward(TOKENS) - expected).max() <= 1e-4


def test_the_wrappers_tensors_are_named_as_its_files_write_them(checkpoint, tmp_path):
    """A missing or unexpected text tensor of a wrapper is named with its prefix (E031, E040)."""
    from modeldsl.diagnostics import DiagnosticError
    from modeldsl.hf.safetensors_io import write_safetensors

    source = SafetensorsFile(checkpoint / "model.safetensors")
    tensors = {name: source.array(name) for name in source.keys()}
    path = shutil.copytree(checkpoint, tmp_path / "extra", ignore=shutil.ignore_patterns("*.safetensors"))
    write_safetensors(path / "model.safetensors", {**tensors, "language_model.model.layers.0.self_attn.q_proj.bias":
                                                   np.zeros(32, np.float32)})
    with pytest.raises(DiagnosticError) as info:
        modeldsl.load(hf=path)
    assert info.value.diagnostics[0].code == "E040"
    assert "'language_model.model.layers.0.self_attn.q_proj.bias'" in info.value.diagnostics[0].message
    tensors.pop("language_model.model.norm.weight")
    write_safetensors(path / "model.safetensors", tensors)
    with pytest.raises(DiagnosticError) as info:
        modeldsl.load(hf=path)
    assert info.value.diagnostics[0].code == "E031"
    assert "'language_model.model.norm.weight' is missing" in info.value.diagnostics[0].message
