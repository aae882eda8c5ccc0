"""The config.json files of published checkpoints, as the Hub serves them (hub_configs/), are accepted
by the std model that serves their architecture: no field the model already computes is refused. A
field that really changes the math stays E037."""

import json
from pathlib import Path

import pytest

from modeldsl.diagnostics import DiagnosticError
from modeldsl.dialects.graph import ModelOp
from modeldsl.frontend.text.parser import parse_source
from modeldsl.hf.config import dsl_config, read_config
from modeldsl.lower import lower_program
from modeldsl.registry import model_for_checkpoint

HUB = Path(__file__).parent / "hub_configs"
PUBLISHED = sorted(HUB.glob("*.json"))


def configuration(config: dict, tmp_path: Path) -> dict:
    """What the std model serving ``config``'s architecture reads from it (raises its diagnostics)."""
    (tmp_path / "config.json").write_text(json.dumps(config, indent=2))
    hf = read_config(tmp_path)
    entry = model_for_checkpoint(hf)
    program = parse_source(entry.path.read_text(), str(entry.path))
    decl = next(d for d in program.declarations if d.name == entry.name)
    default = next(op for op in lower_program(program, entry.name).walk() if isinstance(op, ModelOp))
    return dsl_config(decl, default, hf, warn=lambda _: None)


@pytest.mark.parametrize("path", PUBLISHED, ids=[p.stem for p in PUBLISHED])
def test_a_published_config_is_accepted_by_the_std_model_of_its_family(path, tmp_path):
    config = json.loads(path.read_text())
    values = configuration(config, tmp_path)
    assert values, f"{path.name}: no configuration values"


def test_every_std_family_has_a_published_config():
    families = {json.loads(p.read_text())["architectures"][0] for p in PUBLISHED}
    assert families >= {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
                        "Gemma2ForCausalLM", "Gemma3ForCausalLM", "Phi3ForCausalLM", "GraniteForCausalLM",
                        "Olmo2ForCausalLM", "MixtralForCausalLM", "Qwen3MoeForCausalLM", "MambaForCausalLM"}


def gemma2(**changes) -> dict:
    config = json.loads((HUB / "gemma-2-2b.json").read_text())
    config.update(changes)
    return config


def test_gemma2s_hidden_act_beside_hidden_activation_with_the_same_value_is_accepted(tmp_path):
    assert configuration(gemma2(), tmp_path)
    del_act = gemma2()
    del del_act["hidden_act"]
    assert configuration(del_act, tmp_path)


@pytest.mark.parametrize("changes, field", [
    ({"hidden_act": "gelu"}, "hidden_act"),  # the other name, set to another activation
    ({"hidden_act": "silu", "hidden_activation": "silu"}, "hidden_activation"),
    ({"attention_bias": True}, "attention_bias"),
])
def test_a_field_that_changes_the_math_stays_e037(changes, field, tmp_path):
    with pytest.raises(DiagnosticError) as info:
        configuration(gemma2(**changes), tmp_path)
    found = [d for d in info.value.diagnostics if d.code == "E037" and f"'{field}'" in d.message]
    assert found, "\n".join(d.render() for d in info.value.diagnostics)
