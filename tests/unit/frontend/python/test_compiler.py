"""The Python DSL's compiler API (its sections 11.3, 11.4 and 12.1): ``compile_model`` returns the
JSON IR with ``success``, ``errors`` and ``warnings`` and raises only when asked; ``compile_model_for_hf``
picks the model of an architecture; the spec look-ups and the registered lists include the classes
of every imported Python DSL file."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

import modeldsl
from modeldsl import dsl
from modeldsl.frontend.python import classes
from modeldsl.ir import make_context
from modeldsl.json_ir import read_json
from tests.unit.frontend.python.test_examples import imported

ROOT = Path(__file__).resolve().parents[4]
TINY_LLAMA = json.loads((ROOT / "examples" / "tiny_llama" / "config.json").read_text())

USER = '''
from modeldsl.dsl import Param, Tensor, block, forward, graph, hf_config, model, module


@module
class Scale:
    def __init__(self, d: int = 4):
        pass

    w = Param(Tensor["d"])

    @forward
    def forward(self, x: Tensor["B", "d"]) -> Tensor["B", "d"]:
        with graph() as g:
            out = g.mul(x, "w")


@block
class Step:
    def __init__(self, d: int = 4):
        pass

    scale = Param(Scale("d"))

    @forward
    def forward(self, x: Tensor["B", "d"]) -> Tensor["B", "d"]:
        with graph() as g:
            out = self.scale(x)


@model
@hf_config(architecture="TinyScaleForCausalLM", param_mapping={"d": "hidden_size"})
class TinyScale:
    def __init__(self, d: int = 4):
        pass

    step = Param(Step("d"))

    @forward
    def forward(self, x: Tensor["B", "d"]) -> Tensor["B", "d"]:
        with graph() as g:
            y = self.step(x)
            return {ending}
'''


@pytest.fixture
def user(tmp_path, monkeypatch):
    """A Python DSL file of a module, a block and a model, imported (its classes registered)."""
    monkeypatch.setattr(classes, "REGISTERED", {kind: dict(names) for kind, names in classes.REGISTERED.items()})
    path = tmp_path / "tiny_scale.py"
    path.write_text(textwrap.dedent(USER.replace("{ending}", "y")))
    return imported(path)


def config_of(result: dict) -> str:
    return json.dumps(result["module"])


def test_compile_model_returns_the_json_ir_with_success_and_the_diagnostics(user):
    result = dsl.compile_model(user.TinyScale, {"d": 8})
    assert result["success"] is True and result["model"] == "TinyScale"
    assert result["errors"] == [] and result["warnings"] == []
    assert (result["format"], result["version"]) == ("modeldsl-ir", 1) and "d = 8" in config_of(result)
    read_json(make_context(), json.dumps(result))  # the result is a JSON IR document
    by_name = dsl.compile_model("TinyScale")  # a registered class by its name
    assert by_name["success"] and "d = 4" in config_of(by_name)


def test_a_failed_compilation_returns_its_errors_unless_asked_to_raise(tmp_path):
    path = tmp_path / "broken.py"
    path.write_text(textwrap.dedent(USER.replace("{ending}", "yy")))
    result = dsl.compile_model(str(path))
    assert result["success"] is False and "module" not in result
    (error,) = result["errors"]
    assert set(error) == {"code", "message", "hint", "location"} and error["code"] == "E002"
    assert error["location"]["file"] == str(path) and "did you mean 'y'?" in error["hint"]
    with pytest.raises(dsl.DSLError) as err:
        dsl.compile_model(str(path), raise_on_error=True)
    assert err.value.diagnostics[0].code == "E002"


@pytest.mark.parametrize("model, code, message", [
    ("Lama", "E002", "did you mean 'Llama'?"),
    (dsl.Param, "E008", "not a DSL @model"),
    (3, "E008", "takes a model"),
])
def test_what_is_no_model_is_a_coded_error(model, code, message):
    result = modeldsl.compile_model(model)
    (error,) = result["errors"]
    assert result["success"] is False and error["code"] == code and message in error["message"] + error["hint"]


def test_a_module_class_is_not_a_model(user):
    (error,) = dsl.compile_model(user.Scale)["errors"]
    assert error["code"] == "E008" and "is a @module, not a DSL @model" in error["message"]


def test_a_huggingface_config_is_mapped_by_the_models_hf_config():
    result = modeldsl.compile_model("Llama", json.dumps(TINY_LLAMA))
    assert result["success"], result["errors"]
    assert f"d_model = {TINY_LLAMA['hidden_size']}" in config_of(result)
    (error,) = modeldsl.compile_model("Llama", "{not json")["errors"]
    assert error["code"] == "E030"


def test_compile_model_for_hf_picks_the_model_of_the_architecture(user):
    std = dsl.compile_model_for_hf("LlamaForCausalLM", TINY_LLAMA)
    assert std["success"] and std["model"] == "Llama"
    own = dsl.compile_model_for_hf("TinyScaleForCausalLM", {"architectures": ["TinyScaleForCausalLM"],
                                                             "hidden_size": 6})
    assert own["success"] and own["model"] == "TinyScale" and "d = 6" in config_of(own)
    (error,) = dsl.compile_model_for_hf("LlamaForCausalLN")["errors"]
    assert error["code"] == "E002" and "did you mean 'LlamaForCausalLM'?" in error["hint"]


def test_specs_and_lists_hold_the_std_declarations_and_the_imported_classes(user):
    assert {"Llama", "TinyScale"} <= set(dsl.list_registered_models())
    assert {"DenseTransformerBlock", "Step"} <= set(dsl.list_registered_blocks())
    assert {"RMSNorm", "Scale"} <= set(dsl.list_registered_modules())
    spec = dsl.get_model_spec("TinyScale")
    assert (spec.kind, spec.frontend, spec.params, spec.architectures) == \
        ("model", "python", ("step",), ("TinyScaleForCausalLM",))
    assert spec.parameters[0] == dsl.compile_model.__globals__["ParameterSpec"]("d", "int", "4")
    llama = dsl.get_model_spec("Llama")
    assert "LlamaForCausalLM" in llama.architectures and llama.path.suffix == ".py"
    assert dsl.get_block_spec("Step").kind == "block" and dsl.get_module_spec("RMSNorm").name == "RMSNorm"
    with pytest.raises(dsl.DSLError) as err:
        dsl.get_block_spec("Stpe")
    assert err.value.diagnostics[0].code == "E002" and "did you mean 'Step'?" in err.value.diagnostics[0].hint


def test_the_compiler_api_is_public_in_modeldsl_and_modeldsl_dsl():
    for name in ("compile_model", "compile_model_for_hf", "get_model_spec", "get_block_spec", "get_module_spec",
                 "list_registered_models", "list_registered_blocks", "list_registered_modules", "DSLError"):
        assert getattr(modeldsl, name) is getattr(dsl, name), name
        assert name in dsl.__all__
