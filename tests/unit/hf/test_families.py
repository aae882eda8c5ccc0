"""Checkpoints of other families are never silently loaded into the std Llama: E036 for the
architecture (W010 with force_architecture), E037 naming a config field that changes the
math, E040 for tensors no rule reads; the hf_config ``require:`` / ``ignore:`` declarations."""

import json
import shutil
import warnings

import numpy as np
import pytest
from hf_checkpoints import OTHER_FAMILIES, cached_checkpoint, transformers_model

import modeldsl
from modeldsl.diagnostics import DiagnosticError, DiagnosticSink
from modeldsl.hf.compat import DiagnosticWarning
from modeldsl.resolve.imports import STD_ROOT

pytest.importorskip("torch")
pytest.importorskip("transformers")

LLAMA = STD_ROOT / "models" / "llama.module"
# what the std Llama says about each family: (code without --force-architecture, code and names with it)
EXPECTED = {
    "qwen2": ("E036", "E040", ["self_attn.q_proj.bias"]),
    "granite": ("E036", "E037", ["embedding_multiplier", "residual_multiplier", "attention_multiplier",
                                 "logits_scaling"]),
    "gemma2": ("E036", "E037", ["hidden_activation", "final_logit_softcapping", "attn_logit_softcapping",
                                "query_pre_attn_scalar", "layer_types"]),
}


def family(name):
    arch, config = OTHER_FAMILIES[name]
    return cached_checkpoint(arch, **config)


def diagnostics_of(directory, model=LLAMA, **options):
    with pytest.raises(DiagnosticError) as info:
        modeldsl.load(model, hf=directory, sink=DiagnosticSink(), **options)
    return info.value.diagnostics


def edited(directory, tmp_path, **fields):
    copy = shutil.copytree(directory, tmp_path / "ckpt")
    config = json.loads((copy / "config.json").read_text())
    config.update(fields)
    (copy / "config.json").write_text(json.dumps(config, indent=2))
    return copy


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_std_llama_refuses_another_family(name):
    code, _, names = EXPECTED[name]
    (error,) = diagnostics_of(family(name))
    assert error.code == code
    arch = json.loads((family(name) / "config.json").read_text())["architectures"][0]
    if code == "E036":
        assert arch in error.message and "LlamaForCausalLM" in error.message
        assert "--force-architecture" in error.hint
    else:
        assert f"'{names[0]}'" in error.message and error.span.text == f'"{names[0]}"'


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_with_force_architecture_the_field_or_tensor_that_changes_the_math_is_named(name):
    _, code, names = EXPECTED[name]
    found = diagnostics_of(family(name), force_architecture=True)
    errors = [d for d in found if d.severity == "error"]
    assert {d.code for d in errors} == {code}
    text = " ".join(d.message for d in errors)
    assert all(n in text for n in names), text
    if EXPECTED[name][0] == "E036":
        assert [d.code for d in found if d.severity == "warning"] == ["W010"]


def test_e036_names_the_std_model_that_serves_the_checkpoint():
    (error,) = diagnostics_of(cached_checkpoint("qwen3"))
    assert error.code == "E036" and "std/models/qwen.module (Qwen3)" in error.hint
    assert error.span.text == '"architectures"'


def test_forced_and_unused_allowed_loads_with_every_warning_through_python_warnings():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        modeldsl.load(LLAMA, hf=family("qwen2"), force_architecture=True, allow_unused_tensors=True)
    codes = [w.message.code for w in caught if issubclass(w.category, DiagnosticWarning)]
    assert codes.count("W010") == 1 and codes.count("W006") == 6


def test_with_a_sink_the_warnings_are_collected_there_and_not_raised():
    sink = DiagnosticSink()
    with warnings.catch_warnings():
        warnings.simplefilter("error", DiagnosticWarning)
        modeldsl.load(LLAMA, hf=family("qwen2"), force_architecture=True, allow_unused_tensors=True, sink=sink)
    assert sorted({d.code for d in sink.diagnostics}) == ["W006", "W010"]


def test_neutral_values_of_math_changing_fields_load(tmp_path):
    head_dim = 32 // 4
    ckpt = edited(cached_checkpoint("llama"), tmp_path, attention_bias=False, mlp_bias=False, hidden_act="silu",
                  embedding_multiplier=1.0, residual_multiplier=1, logits_scaling=1.0, final_logit_softcapping=None,
                  attention_multiplier=head_dim ** -0.5, layer_types=["full_attention"] * 2,
                  use_sliding_window=False, sliding_window=4096, partial_rotary_factor=1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DiagnosticWarning)
        modeldsl.load(LLAMA, hf=ckpt)


@pytest.mark.parametrize("fields,named", [
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"use_sliding_window": True, "sliding_window": 16}, "use_sliding_window"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}},
     "rope_parameters.partial_rotary_factor"),
    ({"use_qk_norm": True}, "use_qk_norm"),
    ({"attn_logit_softcapping": 50.0}, "attn_logit_softcapping"),
    ({"rope_parameters": {"full_attention": {"rope_theta": 1e4}, "sliding_attention": {"rope_theta": 1e4}}},
     "rope_parameters"),
])
def test_a_math_changing_field_is_e037_naming_it(fields, named, tmp_path):
    errors = [d for d in diagnostics_of(edited(cached_checkpoint("llama"), tmp_path, **fields)) if d.code == "E037"]
    assert errors and f"'{named}'" in errors[0].message


def _variant(tmp_path, declarations):
    """The std Llama with extra hf_config declarations."""
    source = LLAMA.read_text().replace('    require:\n      hidden_act: "silu"\n', declarations)
    assert source != LLAMA.read_text()
    path = tmp_path / "variant.module"
    path.write_text(source)
    return path


def test_require_overrides_the_neutral_value(tmp_path):
    model = _variant(tmp_path, '    require:\n      hidden_act: "gelu"\n')
    (error,) = diagnostics_of(cached_checkpoint("llama"), model)
    assert error.code == "E037" and "'hidden_act'" in error.message and '"gelu"' in error.message


def test_ignore_accepts_a_field_the_model_declares_it_handles(tmp_path):
    ckpt = edited(cached_checkpoint("llama"), tmp_path, embedding_multiplier=12.0)
    assert diagnostics_of(ckpt)[0].code == "E037"
    modeldsl.load(_variant(tmp_path, '    ignore: ["embedding_multiplier"]\n'), hf=ckpt)


def test_ignore_tensors_declares_tensors_the_model_does_not_need(tmp_path):
    ckpt = family("qwen2")
    model = _variant(tmp_path, '    ignore_tensors: ["model.layers.*.self_attn.*_proj.bias"]\n')
    with pytest.warns(DiagnosticWarning, match="W010"):
        modeldsl.load(model, hf=ckpt, force_architecture=True)


# ---------------------------------------------------------------------------- the command lines
def test_mdsl_run_refuses_then_loads_with_force_architecture_and_allow_unused_tensors(capsys):
    from modeldsl.tools.run import main

    args = [str(LLAMA), "--hf", str(family("qwen2")), "--tokens", "1,2,3", "--max-new-tokens", "1"]
    assert main(args) == 1
    assert "error[E036]" in capsys.readouterr().err
    assert main([*args, "--force-architecture"]) == 1
    err = capsys.readouterr().err
    assert "warning[W010]" in err and "error[E040]" in err
    assert main([*args, "--force-architecture", "--allow-unused-tensors"]) == 0
    err = capsys.readouterr().err
    assert "warning[W010]" in err and err.count("warning[W006]") == 6 and "error" not in err


def test_mdsl_opt_checks_the_checkpoint_config_and_takes_force_architecture(capsys):
    from modeldsl.tools.opt import main

    args = [str(LLAMA), "--hf", str(family("granite"))]
    assert main(args) == 1
    assert "error[E036]" in capsys.readouterr().err
    assert main([*args, "--force-architecture"]) == 1
    err = capsys.readouterr().err
    assert "warning[W010]" in err and "error[E037]" in err and "config.json:" in err and "'logits_scaling'" in err


def test_without_architectures_the_model_type_decides(tmp_path):
    ckpt = edited(cached_checkpoint("llama"), tmp_path, architectures=None, model_type="qwen2")
    (error,) = diagnostics_of(ckpt)
    assert error.code == "E036" and "model_type 'qwen2'" in error.message and error.span.text == '"model_type"'


def test_layer_types_of_the_window_a_model_maps_load(tmp_path):
    ckpt = edited(cached_checkpoint("mistral", sliding_window=5), tmp_path, layer_types=["sliding_attention"] * 2)
    modeldsl.load(STD_ROOT / "models" / "mistral.module", hf=ckpt)
    mixed = edited(ckpt, tmp_path / "mixed", layer_types=["sliding_attention", "full_attention"])
    (error,) = diagnostics_of(mixed, STD_ROOT / "models" / "mistral.module")
    assert error.code == "E037" and "'layer_types'" in error.message


@pytest.mark.parametrize("arch,module", [("llama", "llama.module"), ("qwen3", "qwen.module"),
                                         ("mistral", "mistral.module")])
def test_the_std_models_read_every_tensor_transformers_writes(arch, module):
    sink = DiagnosticSink()
    modeldsl.load(STD_ROOT / "models" / module, hf=cached_checkpoint(arch), allow_unused_tensors=True, sink=sink)
    assert not sink.diagnostics, [d.message for d in sink.diagnostics]


def test_qwen2_layer_types_other_than_its_window_layers_are_refused(tmp_path):
    """max_window_layers = 1 of 3 gives [full, sliding, sliding], which the std Qwen2 serves (two stacks);
    another pattern in config.json is E037."""
    ckpt = cached_checkpoint("qwen2", use_sliding_window=True, max_window_layers=1, sliding_window=5,
                             num_hidden_layers=3)
    qwen2 = STD_ROOT / "models" / "qwen2.module"
    assert modeldsl.load(qwen2, hf=ckpt).config("first_window_layer") == 1
    other = edited(ckpt, tmp_path, layer_types=["sliding_attention", "full_attention", "sliding_attention"])
    (error,) = diagnostics_of(other, qwen2)
    assert error.code == "E037" and "'layer_types'" in error.message


GEMMA3 = STD_ROOT / "models" / "gemma3.module"
GEMMA3_CONFIG = {"head_dim": 8, "num_hidden_layers": 7, "sliding_window": 5}
LOCAL, GLOBAL = "sliding_attention", "full_attention"


@pytest.mark.parametrize("module, arch, config, layer_types", [
    ("gemma2.module", "gemma2", {"head_dim": 8, "num_hidden_layers": 3}, [GLOBAL, LOCAL, GLOBAL]),
    ("gemma2.module", "gemma2", {"head_dim": 8, "num_hidden_layers": 3}, [LOCAL, LOCAL, GLOBAL]),
    ("gemma3.module", "gemma3", GEMMA3_CONFIG, [LOCAL] * 6 + [GLOBAL]),
    ("gemma3.module", "gemma3", GEMMA3_CONFIG, [LOCAL, GLOBAL] * 3 + [LOCAL]),
])
def test_gemma_layer_types_other_than_the_repeated_pattern_are_refused(module, arch, config, layer_types, tmp_path):
    """Gemma 2 alternates local and global layers, Gemma 3 repeats five local ones and a global one; the
    pattern may end cut short (a tail of local layers), any other layer_types is E037 at the field."""
    ckpt = cached_checkpoint(arch, **config)
    modeldsl.load(STD_ROOT / "models" / module, hf=ckpt)
    (error,) = diagnostics_of(edited(ckpt, tmp_path, layer_types=layer_types), STD_ROOT / "models" / module)
    assert error.code == "E037" and "'layer_types'" in error.message and error.span.text == '"layer_types"'


def test_gemma3_reads_the_older_config_fields_and_refuses_another_window_pattern(tmp_path):
    """Hub configs of Gemma 3 give rope_local_base_freq and sliding_window_pattern at the top level (no
    layer_types, no rope_parameters); a pattern other than 6 is E037."""
    ckpt = cached_checkpoint("gemma3", **GEMMA3_CONFIG)
    older = edited(ckpt, tmp_path, rope_theta=10000.0, rope_local_base_freq=10.0, sliding_window_pattern=6)
    text = json.loads((older / "config.json").read_text())
    for field in ("layer_types", "rope_parameters", "_sliding_window_pattern"):
        text.pop(field, None)
    (older / "config.json").write_text(json.dumps(text))
    model = modeldsl.load(GEMMA3, hf=older)
    assert (model.config("rope_theta"), model.config("rope_local_theta")) == (10000.0, 10.0)
    assert not np.array_equal(model.ropes["freqs"].inv_freq, model.ropes["local_freqs"].inv_freq)
    import torch

    tokens = [3, 17, 42, 5, 9, 33, 2, 61]
    with torch.no_grad():
        expected = transformers_model(older)(torch.tensor([tokens])).logits[0].numpy()
    assert np.abs(model.forward(tokens) - expected).max() <= 1e-4
    (older / "config.json").write_text(json.dumps({**text, "sliding_window_pattern": 4}))
    (error,) = diagnostics_of(older, GEMMA3)
    assert error.code == "E037" and "'sliding_window_pattern'" in error.message


def test_rope_parameters_per_kind_of_layer(tmp_path):
    """Gemma 3 reads the global layers' RoPE (theta, scaling) and the local layers' theta from rope_parameters
    per kind of layer; a scaled local RoPE is E037, and so is any RoPE per kind of layer for a model without
    local layers."""
    ckpt = cached_checkpoint("gemma3", **GEMMA3_CONFIG)
    rope = {GLOBAL: {"rope_type": "linear", "factor": 4.0, "rope_theta": 500.0},
            LOCAL: {"rope_type": "default", "rope_theta": 20.0}}
    model = modeldsl.load(GEMMA3, hf=edited(ckpt, tmp_path / "scaled", rope_parameters=rope))
    assert (model.config("rope_theta"), model.config("rope_local_theta")) == (500.0, 20.0)
    np.testing.assert_allclose(model.ropes["freqs"].inv_freq, 500.0 ** -(np.arange(0, 8, 2) / 8) / 4.0)
    np.testing.assert_allclose(model.ropes["local_freqs"].inv_freq, 20.0 ** -(np.arange(0, 8, 2) / 8))
    scaled_local = {**rope, LOCAL: {"rope_type": "linear", "factor": 2.0, "rope_theta": 20.0}}
    (error,) = diagnostics_of(edited(ckpt, tmp_path / "local", rope_parameters=scaled_local), GEMMA3)
    assert error.code == "E037" and "rope_type \"linear\"" in error.message
    llama = edited(cached_checkpoint("llama"), tmp_path / "llama", rope_parameters=rope)
    (error,) = diagnostics_of(llama)
    assert error.code == "E037" and "per kind of layer" in error.message
