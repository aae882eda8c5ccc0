"""The std library's registry (modeldsl.registry): declarations by kind and name, the HuggingFace
architectures each model serves, and loading a checkpoint without a model file."""

import json
import shutil

import numpy as np
import pytest
from hf_checkpoints import cached_checkpoint, transformers_model

import modeldsl
from modeldsl import registry
from modeldsl.diagnostics import DiagnosticError
from modeldsl.resolve.imports import STD_ROOT
from modeldsl.tools.run import main

TOKENS = [3, 17, 42, 5, 9, 33, 2, 61]
# family -> (checkpoint, the std model file that serves it, its declaration)
SERVED = {
    "llama": (("llama", {}), "llama.module", "Llama"),
    "qwen3": (("qwen3", {"head_dim": 16}), "qwen.module", "Qwen3"),
    "mistral": (("mistral", {"sliding_window": 5}), "mistral.module", "Mistral"),
    "qwen2": (("qwen2", {}), "qwen2.module", "Qwen2"),
    "gemma3": (("gemma3", {"head_dim": 8, "num_hidden_layers": 7, "sliding_window": 5}), "gemma3.module", "Gemma3"),
}


def test_the_std_declarations_are_listed_by_kind():
    assert registry.list_models() == ["FalconH1", "Gemma2", "Gemma3", "Granite", "Llama", "Mamba", "Mistral", "Mixtral",
                                       "Olmo2", "Phi3", "Qwen3", "Qwen2", "Qwen3Moe"]
    assert "DenseTransformerBlock" in registry.list_blocks()
    assert {"Linear", "RMSNorm", "SwiGLU_MLP", "GQA", "MHA", "MQA"} <= set(registry.list_modules())
    assert registry.get_module("MQA").path == STD_ROOT / "modules" / "attention" / "mqa.module"
    assert registry.get_module("MQA", "python").path == STD_ROOT / "python" / "modules" / "attention" / "mqa.py"
    assert {"silu", "swiglu", "flash_attention", "rope"} <= set(registry.list_primitives())
    llama = registry.get_model("Llama")
    assert llama.path == STD_ROOT / "models" / "llama.module" and llama.line >= 1 and llama.doc
    assert (llama.architectures, llama.model_types) == (("LlamaForCausalLM",), ("llama",))
    assert registry.get_any("RMSNorm") == registry.get_module("RMSNorm")
    assert registry.architectures() == {"FalconH1ForCausalLM": "FalconH1", "Gemma2ForCausalLM": "Gemma2",
                                        "Gemma3ForCausalLM": "Gemma3", "Gemma3ForConditionalGeneration": "Gemma3",
                                        "GraniteForCausalLM": "Granite", "LlamaForCausalLM": "Llama",
                                        "MambaForCausalLM": "Mamba",
                                        "MistralForCausalLM": "Mistral",
                                        "MixtralForCausalLM": "Mixtral", "Olmo2ForCausalLM": "Olmo2",
                                        "Phi3ForCausalLM": "Phi3", "Qwen2ForCausalLM": "Qwen2",
                                        "Qwen3ForCausalLM": "Qwen3",
                                        "Qwen3MoeForCausalLM": "Qwen3Moe"}


def test_an_unknown_name_is_a_key_error_naming_the_known_ones():
    with pytest.raises(KeyError, match="there are: FalconH1, Gemma2, Gemma3, Granite, Llama, Mamba, Mistral, Mixtral, "
                                       "Olmo2, Phi3, Qwen3, Qwen2, Qwen3Moe"):
        registry.get_model("Gemma")
    with pytest.raises(KeyError):
        registry.get_any("NoSuchThing")
    with pytest.raises(ValueError):
        registry.entries("recipe")


def test_a_checkpoint_is_served_by_its_architectures_else_by_its_model_type():
    assert registry.model_for_checkpoint({"architectures": ["MistralForCausalLM"], "model_type": "llama"}).name \
        == "Mistral"  # the class names decide
    assert registry.model_for_checkpoint({"model_type": "qwen3"}).name == "Qwen3"
    with pytest.raises(DiagnosticError) as err:
        registry.model_for_checkpoint({"architectures": ["GPTNeoXForCausalLM"], "model_type": "gpt_neox"},
                                      "x/config.json")
    (diagnostic,) = err.value.diagnostics
    assert diagnostic.code == "E036" and "x/config.json: no std model serves the checkpoint, which is " \
        "GPTNeoXForCausalLM" in diagnostic.message
    assert "FalconH1ForCausalLM (FalconH1), Gemma2ForCausalLM (Gemma2), Gemma3ForCausalLM (Gemma3), " \
        "Gemma3ForConditionalGeneration (Gemma3), " \
        "GraniteForCausalLM (Granite), " \
        "LlamaForCausalLM (Llama), MambaForCausalLM (Mamba), MistralForCausalLM (Mistral), " \
        "MixtralForCausalLM (Mixtral), Olmo2ForCausalLM (Olmo2), Phi3ForCausalLM (Phi3), " \
        "Qwen3ForCausalLM (Qwen3), Qwen2ForCausalLM (Qwen2), Qwen3MoeForCausalLM (Qwen3Moe)" in diagnostic.hint


@pytest.mark.parametrize("family", SERVED)
def test_load_without_a_model_file_runs_the_std_model_of_the_architecture(family):
    (arch, config), file, name = SERVED[family]
    path = cached_checkpoint(arch, **config)
    model = modeldsl.load(hf=path)
    assert model.model.sym_name.data == name
    np.testing.assert_array_equal(model.forward(TOKENS),
                                  modeldsl.load(STD_ROOT / "models" / file, hf=path).forward(TOKENS))
    import torch

    with torch.no_grad():
        expected = transformers_model(path)(torch.tensor([TOKENS])).logits[0].numpy()
    assert np.abs(model.forward(TOKENS) - expected).max() <= 1e-4


def test_load_needs_a_model_file_or_a_checkpoint():
    with pytest.raises(DiagnosticError) as err:
        modeldsl.load()
    assert err.value.diagnostics[0].code == "E029"


def unserved_checkpoint(tmp_path):
    folder = shutil.copytree(cached_checkpoint("llama"), tmp_path / "gpt_neox")
    config = json.loads((folder / "config.json").read_text())
    config.update(architectures=["GPTNeoXForCausalLM"], model_type="gpt_neox")
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


def test_mdsl_run_without_a_model_file(tmp_path, capsys):
    assert main(["--hf", str(cached_checkpoint("llama")), "--tokens", "1,2,3", "--max-new-tokens", "2"]) == 0
    assert "new tokens:" in capsys.readouterr().out
    assert main(["--hf", str(unserved_checkpoint(tmp_path)), "--tokens", "1,2"]) == 1
    err = capsys.readouterr().err
    assert "config.json:2:3: error[E036]: no std model serves the checkpoint, which is GPTNeoXForCausalLM" in err
    assert "^" in err and "LlamaForCausalLM (Llama)" in err
