"""mdsl-specialize on lowered std models: concrete shapes that verify exactly."""


import pytest
from xdsl.context import Context

from modeldsl.diagnostics import DiagnosticError, PassOptionError
from modeldsl.dialects.graph import ModelOp
from modeldsl.frontend.text.parser import parse_source
from modeldsl.ir import verify_module
from modeldsl.lower import lower_program
from modeldsl.passes.specialize import SpecializePass
from modeldsl.resolve.imports import STD_ROOT

TINY = {"vocab_size": 64, "d_model": 32, "n_layers": 2, "num_heads": 4, "num_kv_heads": 2, "head_dim": 8, "d_ff": 48}


def lowered_llama(config=None):
    path = STD_ROOT / "models" / "llama.module"
    return lower_program(parse_source(path.read_text(), str(path)), "Llama", config)


def test_specialized_llama_has_only_concrete_shapes_and_verifies():
    module = lowered_llama(TINY)
    SpecializePass.of(B=2, T=16).apply(Context(), module)
    assert verify_module(module) == []
    text = str(module)
    assert "[B," not in text and "d_model" not in text.split("config")[2]
    assert "!mdsl.graph.tensor<[2, 16, 64], bf16>" in text  # the logits


def test_a_shape_only_config_value_can_be_overridden_and_is_checked_concretely():
    module = lowered_llama(TINY)
    SpecializePass.of(B=1, T=4, d_ff=40).apply(Context(), module)
    assert verify_module(module) == []
    model = next(op for op in module.walk() if isinstance(op, ModelOp))
    assert model.config_values["d_ff"].value.data == 40


def test_binding_two_dims_that_must_agree_to_different_values_fails_verification():
    text = ("module M(a: int = 4, b: int = 4):\n  params:\n    w: [b, b]\n  forward:\n    in: x: [N, a]\n"
            "    out: [N, b]\n    graph:\n      x -> matmul(w, transpose=NT) -> out\n")
    module = lower_program(parse_source(text, "m.module"))
    assert verify_module(module) == []
    SpecializePass.of(a=4, b=8).apply(Context(), module)
    (problem,) = verify_module(module)
    assert "inner dimensions" in str(problem)


@pytest.mark.parametrize("bindings, message", [
    ({"Q": 2}, "neither a config value nor a symbol"),
    ({"B": 0}, "not a positive integer"),
    ({"d_model": "x"}, "d_model=x is not an integer"),
    ({"d_model": -4}, "d_model=-4 is not a positive integer"),
    ({"T": 2**64}, "fits in 64 bits"),
])
def test_bad_bindings_are_e029(bindings, message):
    """Bindings that are no sizes are refused where the pass is made, unknown names where it runs."""
    try:
        SpecializePass.of(**bindings).apply(Context(), lowered_llama(TINY))
    except PassOptionError as err:
        assert err.option == next(iter(bindings))
        diag = err.diagnostic()
    except DiagnosticError as err:
        (diag,) = err.diagnostics
    else:
        pytest.fail("no E029")
    assert diag.code == "E029" and message in diag.message


def run_opt(*args: str, capsys) -> tuple[int, str]:
    from modeldsl.tools.opt import main

    code = main([str(STD_ROOT / "models" / "llama.module"), *args])
    return code, capsys.readouterr().err


def test_a_float_option_is_e029(capsys):
    code, err = run_opt("-p", "mdsl-specialize{eps=1e-6}", capsys=capsys)
    assert code == 1 and "error[E029]: mdsl-specialize: eps=1e-6 is not an integer or a boolean" in err


def test_bindings_that_break_the_shapes_are_e004_naming_the_ops(capsys):
    code, err = run_opt("-p", "mdsl-specialize{num_kv_heads=3}", capsys=capsys)
    assert code == 1 and "Traceback" not in err
    assert "error[E004]: after mdsl-specialize{num_kv_heads=3}: 'mdsl.graph.flash_attention' op query heads (32) " \
           "must be a multiple of kv heads (3)" in err


def test_a_null_config_field_through_hf_is_e030(tmp_path, capsys):
    import json
    import shutil

    shutil.copytree(STD_ROOT.parents[1] / "examples" / "tiny_llama", tmp_path / "ck")
    config = json.loads((tmp_path / "ck" / "config.json").read_text())
    config["num_key_value_heads"] = None
    (tmp_path / "ck" / "config.json").write_text(json.dumps(config))
    code, err = run_opt("-p", f"mdsl-specialize{{hf=\"{tmp_path / 'ck'}\"}}", capsys=capsys)
    assert code == 1 and "error[E030]: mdsl-specialize{hf}: config.json sets num_key_value_heads to null" in err


def test_hf_bindings_read_list_elements_and_a_changed_float_is_e029_not_ignored(tmp_path, capsys):
    """Falcon-H1 maps its multipliers from list fields (field(name, index=I)): lowered with the defaults,
    a checkpoint whose lists differ cannot be bound afterwards (the floats were fixed), nor can a list
    of another length; neutral lists bind."""
    pytest.importorskip("transformers")
    import json
    import shutil

    from hf_checkpoints import FALCON_H1, cached_checkpoint

    from modeldsl.tools.opt import main

    def specialize(directory):
        pipeline = f"mdsl-specialize{{hf=\"{directory}\" B=1 T=4}}"
        code = main([str(STD_ROOT / "models" / "falcon_h1.module"), "-p", pipeline])
        return code, capsys.readouterr().err

    neutral = cached_checkpoint("falcon_h1", **{**FALCON_H1, "mamba_rms_norm": False})
    code, err = specialize(neutral)
    assert code == 0, err
    changed = shutil.copytree(neutral, tmp_path / "changed")
    config = json.loads((changed / "config.json").read_text())
    config["ssm_multipliers"] = [1.0, 1.0, 2.0, 1.0, 1.0]
    (changed / "config.json").write_text(json.dumps(config))
    code, err = specialize(changed)
    assert code == 1 and "error[E029]: mdsl-specialize: ssm_b_multiplier was fixed" in err
    config["ssm_multipliers"] = [1.0, 1.0]
    (changed / "config.json").write_text(json.dumps(config))
    code, err = specialize(changed)
    assert code == 1 and "error[E030]" in err and "'ssm_multipliers' has 2 elements" in err
