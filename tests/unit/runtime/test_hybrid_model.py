"""The std Falcon-H1 (attention and a Mamba-2 mixer side by side in every layer: blocks/parallel.module,
modules/mamba2.module) on tiny random transformers checkpoints of three variants: fp32 logits and greedy
generation against transformers, every parameter's gradient against PyTorch autograd, the checkpoint
written back bitwise, the registry serving FalconH1ForCausalLM, the list multipliers (mlp_multipliers,
ssm_multipliers) read element by element and written back whole, and the config values the model refuses.
(hf_checkpoints.CASES has one more variant, which test_model, test_sched_executor and test_autodiff_hf run.)"""

import json
import shutil

import numpy as np
import pytest
from hf_checkpoints import TINY, trainer_and_autograd_gradients, transformers_model
from xdsl.dialects.builtin import IntegerType

import modeldsl
from modeldsl.diagnostics import DiagnosticError, DiagnosticSink
from modeldsl.hf.config import read_config
from modeldsl.hf.safetensors_io import SafetensorsFile
from modeldsl.resolve.imports import STD_ROOT

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

FALCON_H1 = STD_ROOT / "models" / "falcon_h1.module"
TOKENS = [3, 17, 42, 5, 9, 33, 2, 61, 7, 12, 40, 8]
# the mixer: 4 heads of 8 channels (d_ssm 32), 8 states, conv width 4; larger weights than the default
# 0.02 so that the logits spread and the multipliers matter
SSM = {"mamba_d_ssm": 32, "mamba_n_heads": 4, "mamba_d_state": 8, "mamba_d_conv": 4, "initializer_range": 0.1}
# muP multipliers of the size of a published Falcon-H1 config's
MULTIPLIERS = {"embedding_multiplier": 5.66, "lm_head_multiplier": 0.39, "attention_in_multiplier": 1.3,
               "attention_out_multiplier": 0.94, "key_multiplier": 0.39, "ssm_in_multiplier": 1.25,
               "ssm_out_multiplier": 0.24}
VARIANTS = {
    # GQA (4 heads over 2), B and C in 2 groups, the gated RMSNorm over each group before the gate
    "gqa-groups-gated-norm": {**SSM, "mamba_n_groups": 2, "mamba_rms_norm": True, **MULTIPLIERS},
    # tied LM head, plain multi-head attention, one group, no gated norm (y * silu(z))
    "tied-one-group": {**SSM, "mamba_n_groups": 1, "tie_word_embeddings": True, "num_key_value_heads": 4},
    # the norm after the gate, every bias (attention, MLP, in_proj, out_proj) but no conv bias, and a
    # head_dim other than hidden_size // num_attention_heads
    "biases-norm-after-gate": {**SSM, "mamba_n_groups": 2, "mamba_rms_norm": True, "mamba_norm_before_gate": False,
                               "attention_bias": True, "mlp_bias": True, "mamba_proj_bias": True,
                               "projectors_bias": True, "mamba_conv_bias": False, "head_dim": 16},
}


def build(path, seed=0, **config):
    """A tiny FalconH1ForCausalLM saved to ``path``: random weights (fixed seed) with the norm weights,
    biases and per-head D, dt_bias and A_log perturbed (their init is constant per tensor, which would
    hide a wrong head or group order)."""
    torch.manual_seed(seed)
    model = transformers.FalconH1ForCausalLM(transformers.FalconH1Config(**{**TINY, **config}))
    with torch.no_grad():
        for name, tensor in model.named_parameters():
            if "norm" in name or name.endswith(("bias", ".D", ".A_log")):
                tensor.add_(torch.randn_like(tensor) * 0.3)
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("falcon_h1")
    return {name: build(root / name, **config) for name, config in VARIANTS.items()}


@pytest.fixture(params=sorted(VARIANTS))
def variant(request, checkpoints):
    return request.param, checkpoints[request.param]


def hf_logits(path, tokens):
    with torch.no_grad():
        return transformers_model(path)(torch.tensor([tokens])).logits[0].numpy()


def test_fp32_logits_match_transformers(variant):
    name, path = variant
    expected = hf_logits(path, TOKENS)
    logits = modeldsl.load(FALCON_H1, hf=path).forward(TOKENS)
    assert np.abs(expected).max() > 0.5, name  # logits that spread, so that 1e-4 says something
    assert np.abs(logits - expected).max() <= 1e-4, name


def test_greedy_generation_of_16_tokens_equals_transformers(variant):
    name, path = variant
    prompt = TOKENS[:6]
    ours = modeldsl.load(FALCON_H1, hf=path).generate(prompt, 16)
    with torch.no_grad():
        theirs = transformers_model(path).generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False)
    assert ours == theirs[0, len(prompt):].tolist(), name


# our parameter of blocks[layer] -> its transformers parameters in layer {layer} (several: concatenated on dim 0)
LAYER_PARAMS = {
    "ln1.weight": ["input_layernorm.weight"],
    "ln2.weight": ["pre_ff_layernorm.weight"],
    "attention.qkv_weight": ["self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"],
    "attention.qkv_bias": ["self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"],
    "attention.out_weight": ["self_attn.o_proj.weight"],
    "attention.out_bias": ["self_attn.o_proj.bias"],
    "mamba.in_proj": ["mamba.in_proj.weight"],
    "mamba.in_proj_bias": ["mamba.in_proj.bias"],
    "mamba.conv_weight": ["mamba.conv1d.weight"],
    "mamba.conv_bias": ["mamba.conv1d.bias"],
    "mamba.dt_bias": ["mamba.dt_bias"],
    "mamba.A_log": ["mamba.A_log"],
    "mamba.D": ["mamba.D"],
    "mamba.norm_weight": ["mamba.norm.weight"],
    "mamba.out_proj": ["mamba.out_proj.weight"],
    "mamba.out_proj_bias": ["mamba.out_proj.bias"],
    "feed_forward.up_weight": ["feed_forward.gate_proj.weight", "feed_forward.up_proj.weight"],
    "feed_forward.up_bias": ["feed_forward.gate_proj.bias", "feed_forward.up_proj.bias"],
    "feed_forward.down_weight": ["feed_forward.down_proj.weight"],
    "feed_forward.down_bias": ["feed_forward.down_proj.bias"],
}
TOP_PARAMS = {"embedding": "model.embed_tokens.weight", "final_norm.weight": "model.final_layernorm.weight",
              "lm_head": "lm_head.weight"}


def relative_error(got, want):
    return float(np.abs(got - want).max() / np.abs(want).max())


def test_every_gradient_matches_pytorch_autograd(variant):
    name, path = variant
    grads, named = trainer_and_autograd_gradients(FALCON_H1, path)
    errors, compared = {}, set()
    for layer in range(len(grads["blocks.ln1.weight"])):
        for ours, theirs in LAYER_PARAMS.items():
            if f"blocks.{ours}" not in grads:
                continue
            parts = [named[f"model.layers.{layer}.{t}"] for t in theirs]
            want = torch.cat([p.grad for p in parts]).numpy()
            errors[f"{layer}.{ours}"] = relative_error(grads[f"blocks.{ours}"][layer], want)
            compared |= {f"model.layers.{layer}.{t}" for t in theirs}
    for ours, theirs in TOP_PARAMS.items():
        if ours in grads:
            errors[ours] = relative_error(grads[ours], named[theirs].grad.numpy())
            compared.add(theirs)
    assert compared == set(named), name  # every parameter of the transformers model
    assert max(errors.values()) <= 1e-4, (name, {k: v for k, v in errors.items() if v > 1e-4})


def test_the_checkpoint_is_written_back_bitwise(variant, tmp_path):
    _, path = variant
    modeldsl.load(FALCON_H1, hf=path).save_hf(tmp_path)
    original, written = SafetensorsFile(path / "model.safetensors"), SafetensorsFile(tmp_path / "model.safetensors")
    assert sorted(written.keys()) == sorted(original.keys())
    for name in original.keys():
        np.testing.assert_array_equal(written.array(name), original.array(name), err_msg=name)


def test_the_registry_serves_falcon_h1(checkpoints):
    path = checkpoints["tied-one-group"]
    served = modeldsl.load(hf=path)
    assert served.model.sym_name.data == "FalconH1"
    np.testing.assert_array_equal(served.forward(TOKENS), modeldsl.load(FALCON_H1, hf=path).forward(TOKENS))


def edited(path, tmp_path, **fields):
    copy = shutil.copytree(path, tmp_path / "edited")
    config = json.loads((copy / "config.json").read_text())
    config.update(fields)
    (copy / "config.json").write_text(json.dumps(config, indent=2))
    return copy


def refusals(directory, **options):
    with pytest.raises(DiagnosticError) as info:
        modeldsl.load(FALCON_H1, hf=directory, sink=DiagnosticSink(), **options)
    return info.value.diagnostics


def test_a_config_value_the_model_does_not_read_is_refused(checkpoints, tmp_path):
    (error,) = refusals(edited(checkpoints["tied-one-group"], tmp_path, hidden_act="gelu"))
    assert error.code == "E037" and "'hidden_act'" in error.message


# non-neutral list multipliers of the size of a published Falcon-H1 config's, each element different
LISTS = {"mlp_multipliers": [0.88, 0.59], "ssm_multipliers": [0.35, 0.25, 0.7, 0.5, 1.7]}
# the parameter each element is read into, in order
ELEMENTS = {"mlp_multipliers": ["mlp_gate_multiplier", "mlp_down_multiplier"],
            "ssm_multipliers": [f"ssm_{s}_multiplier" for s in ("z", "x", "b", "c", "dt")]}


@pytest.fixture(scope="module")
def with_lists(tmp_path_factory):
    return build(tmp_path_factory.mktemp("falcon_h1_lists") / "lists", **VARIANTS["gqa-groups-gated-norm"], **LISTS)


def test_the_list_multipliers_are_read_element_by_element_and_match_transformers(with_lists, tmp_path):
    config = json.loads((with_lists / "config.json").read_text())
    assert {field: config[field] for field in LISTS} == LISTS
    model = modeldsl.load(FALCON_H1, hf=with_lists)
    for field, params in ELEMENTS.items():
        assert [model.config(param) for param in params] == LISTS[field]
    expected = hf_logits(with_lists, TOKENS)
    assert np.abs(model.forward(TOKENS) - expected).max() <= 1e-4
    neutral = edited(with_lists, tmp_path, mlp_multipliers=[1.0, 1.0], ssm_multipliers=[1.0] * 5)
    assert np.abs(modeldsl.load(FALCON_H1, hf=neutral).forward(TOKENS) - expected).max() > 1e-2  # they matter


def test_a_checkpoint_with_list_multipliers_is_written_back_bitwise(with_lists, tmp_path):
    model = modeldsl.load(FALCON_H1, hf=with_lists)
    model.save_hf(tmp_path / "out")
    original, written = SafetensorsFile(with_lists / "model.safetensors"), SafetensorsFile(tmp_path / "out" /
                                                                                            "model.safetensors")
    assert sorted(written.keys()) == sorted(original.keys())
    for name in original.keys():
        np.testing.assert_array_equal(written.array(name), original.array(name), err_msg=name)
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert {field: config[field] for field in LISTS} == LISTS
    np.testing.assert_array_equal(modeldsl.load(FALCON_H1, hf=tmp_path / "out").forward(TOKENS),
                                  model.forward(TOKENS))


def config_values(model):
    """A loaded model's configuration, as ``modeldsl.load(config=...)`` takes it."""
    return {name: bool(attr.value.data) if attr.type == IntegerType(1) else attr.value.data
            for name, attr in model.model.config_values.items() if hasattr(attr, "value")}


def test_a_model_that_was_not_imported_exports_the_list_multipliers_whole(with_lists, tmp_path):
    """The same model built from its configuration (not imported) writes config.json itself: each list
    from the parameters of its elements, which transformers and a load read back."""
    imported = modeldsl.load(FALCON_H1, hf=with_lists)
    built = modeldsl.load(FALCON_H1, config=config_values(imported))
    for name, array in imported.weights.items():
        np.copyto(built.weights[name], array)
    built.save_hf(tmp_path / "out")
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert {field: config[field] for field in LISTS} == LISTS
    theirs = transformers.AutoConfig.from_pretrained(tmp_path / "out")
    assert theirs.mlp_multipliers == LISTS["mlp_multipliers"] and theirs.ssm_multipliers == LISTS["ssm_multipliers"]
    original, written = SafetensorsFile(with_lists / "model.safetensors"), SafetensorsFile(tmp_path / "out" /
                                                                                            "model.safetensors")
    for name in original.keys():
        np.testing.assert_array_equal(written.array(name), original.array(name), err_msg=name)
    assert np.abs(hf_logits(tmp_path / "out", TOKENS) - hf_logits(with_lists, TOKENS)).max() <= 1e-4
    reloaded = modeldsl.load(FALCON_H1, hf=tmp_path / "out")
    assert {name: reloaded.config(name) for names in ELEMENTS.values() for name in names} == \
        {name: imported.config(name) for names in ELEMENTS.values() for name in names}


def test_null_list_multipliers_are_neutral_as_in_transformers(checkpoints, tmp_path):
    path = edited(checkpoints["tied-one-group"], tmp_path, mlp_multipliers=None, ssm_multipliers=None)
    model = modeldsl.load(FALCON_H1, hf=path)
    assert [model.config(name) for names in ELEMENTS.values() for name in names] == [1.0] * 7
    assert transformers.AutoConfig.from_pretrained(path).ssm_multipliers == [1.0] * 5
    np.testing.assert_array_equal(model.forward(TOKENS),
                                  modeldsl.load(FALCON_H1, hf=checkpoints["tied-one-group"]).forward(TOKENS))


@pytest.mark.parametrize("field, value, says", [
    ("ssm_multipliers", 0.5, "'ssm_multipliers' is 0.5, not a list"),
    ("ssm_multipliers", [1.0] * 4, "'ssm_multipliers' has 4 elements, but hf_config reads it as a list of 5"),
    ("mlp_multipliers", [1.0, 1.0, 1.0], "'mlp_multipliers' has 3 elements, but hf_config reads it as a list of 2"),
    ("ssm_multipliers", [1.0, 1.0, "big", 1.0, 1.0], "'ssm_multipliers[2]' is 'big', but 'ssm_b_multiplier' is float"),
    ("mlp_multipliers", [1.0, None], "'mlp_multipliers[1]' to null"),
])
def test_a_malformed_list_multiplier_is_e030_at_the_field(checkpoints, tmp_path, field, value, says):
    (error,) = refusals(edited(checkpoints["tied-one-group"], tmp_path, **{field: value}))
    assert error.code == "E030" and says in error.message, error.message
    assert error.span is not None and f'"{field}"' in error.span.source.text.splitlines()[error.span.line - 1]


def test_the_default_time_step_limit_as_transformers_5_writes_it_is_read_as_zero_to_infinity(checkpoints):
    path = checkpoints["tied-one-group"]
    assert json.loads((path / "config.json").read_text())["time_step_limit"] == [0.0, {"__float__": "Infinity"}]
    assert read_config(path)["time_step_limit"] == [0.0, float("inf")]


def test_a_time_step_limit_other_than_zero_to_infinity_is_refused(checkpoints, tmp_path):
    (error,) = refusals(edited(checkpoints["tied-one-group"], tmp_path, time_step_limit=[0.001, 0.1]))
    assert error.code == "E037" and "time_step_limit" in error.message


def test_a_null_mamba_d_ssm_is_mamba_expand_times_hidden_size(tmp_path):
    path = build(tmp_path / "expand", **{**VARIANTS["tied-one-group"], "mamba_d_ssm": None, "mamba_expand": 1})
    assert json.loads((path / "config.json").read_text())["mamba_d_ssm"] is None
    model = modeldsl.load(FALCON_H1, hf=path)
    assert model.config("d_ssm") == TINY["hidden_size"]
    assert np.abs(model.forward(TOKENS) - hf_logits(path, TOKENS)).max() <= 1e-4
