"""config.json through hf_config: types, sizes, required fields, what null and absent
fields mean (checked against transformers' own reading of the same file), list
fields read element by element (index=) and exported whole, transformers 5's
special floats, and invalid JSON."""

import json
import shutil

import numpy as np
import pytest
from hf_checkpoints import cached_checkpoint, make_checkpoint, transformers_model

import modeldsl
from modeldsl.diagnostics import DiagnosticError
from modeldsl.dialects.graph import ModelOp
from modeldsl.frontend.text.parser import parse_source
from modeldsl.hf.config import dsl_config, export_config, read_config
from modeldsl.hf.safetensors_io import CheckpointError
from modeldsl.lower import lower_program
from modeldsl.resolve.imports import STD_ROOT

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

MODELS = {"llama": ("llama.module", "Llama"), "mistral": ("mistral.module", "Mistral"),
          "qwen3": ("qwen.module", "Qwen3")}
TOKENS = [3, 17, 42, 5, 9, 33, 2, 61, 7, 12, 40, 8]


@pytest.fixture(scope="module")
def checkpoints():
    return {arch: cached_checkpoint(arch) for arch in MODELS}


def edited(src, tmp_path, change):
    """A copy of a checkpoint folder whose config.json dict went through change()."""
    dst = tmp_path / "ckpt"
    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    change(config)
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    return dst


def config_of(source: str, name: str, directory, filename="model.module"):
    """The DSL configuration a checkpoint gives the model ``name`` of ``source``."""
    program = parse_source(source, filename)
    decl = next(d for d in program.declarations if d.name == name)
    default = next(op for op in lower_program(program, name).walk() if isinstance(op, ModelOp))
    return dsl_config(decl, default, read_config(directory))


def std_config(arch, directory):
    module, name = MODELS[arch]
    path = STD_ROOT / "models" / module
    return config_of(path.read_text(), name, directory, str(path))


# ---------------------------------------------------------------- null and absent fields, as transformers reads them
def _hf_values(directory, arch):
    """What transformers makes of the config.json, under the DSL's parameter names."""
    config = transformers.AutoConfig.from_pretrained(directory)
    values = dict(vocab_size=config.vocab_size, d_model=config.hidden_size, n_layers=config.num_hidden_layers,
                  num_heads=config.num_attention_heads, num_kv_heads=config.num_key_value_heads,
                  head_dim=config.head_dim, d_ff=config.intermediate_size, eps=config.rms_norm_eps,
                  rope_theta=config.rope_parameters["rope_theta"], tie_embeddings=config.tie_word_embeddings)
    if arch == "mistral":
        values["sliding_window"] = config.sliding_window or 0  # None: full attention, the DSL's 0
    return values


def _drop(*fields):
    return lambda c: [c.pop(f, None) for f in fields]


def _null(*fields):
    return lambda c: c.update({f: None for f in fields})


AGREEMENT = [
    ("llama", "head_dim null", _null("head_dim")),
    ("llama", "kv heads null", _null("num_key_value_heads")),
    ("llama", "kv heads and eps absent", _drop("num_key_value_heads", "rms_norm_eps", "head_dim")),
    ("mistral", "sliding window null", _null("sliding_window")),
    ("mistral", "sliding window, rope and eps absent", _drop("sliding_window", "rope_parameters", "rms_norm_eps")),
    ("mistral", "head_dim null", _null("head_dim")),
    ("qwen3", "kv heads null", _null("num_key_value_heads")),
    ("qwen3", "tie, rope absent", _drop("tie_word_embeddings", "rope_parameters")),
]


@pytest.mark.parametrize("arch,what,change", AGREEMENT, ids=[f"{a}: {w}" for a, w, _ in AGREEMENT])
def test_null_and_absent_fields_mean_what_they_mean_to_transformers(arch, what, change, checkpoints, tmp_path):
    ckpt = edited(checkpoints[arch], tmp_path, change)
    ours = std_config(arch, ckpt)
    theirs = _hf_values(ckpt, arch)
    assert {k: ours[k] for k in theirs} == theirs


@pytest.mark.parametrize("field", ["rms_norm_eps", "hidden_size", "tie_word_embeddings"])
def test_null_where_transformers_has_no_meaning_for_it_is_e030(field, checkpoints, tmp_path):
    ckpt = edited(checkpoints["llama"], tmp_path, _null(field))
    with pytest.raises(Exception, match=field):
        transformers.AutoConfig.from_pretrained(ckpt)
    with pytest.raises(CheckpointError) as info:
        std_config("llama", ckpt)
    assert info.value.code == "E030" and f"'{field}' to null" in info.value.message
    assert "null=" in info.value.hint


@pytest.mark.parametrize("arch,field", [("qwen3", "head_dim"), ("mistral", "num_key_value_heads")])
def test_null_that_transformers_refuses_is_e030_not_the_dsl_default(arch, field, checkpoints, tmp_path):
    """Qwen3Config refuses head_dim None and MistralConfig num_key_value_heads None (their
    DSL defaults, 128 and 8, must not stand in for them)."""
    ckpt = edited(checkpoints[arch], tmp_path, _null(field))
    with pytest.raises(Exception, match=field):
        transformers.AutoConfig.from_pretrained(ckpt)
    with pytest.raises(CheckpointError) as info:
        std_config(arch, ckpt)
    assert info.value.code == "E030" and f"'{field}' to null" in info.value.message


def test_mistral_sliding_window_null_is_full_attention_against_transformers(tmp_path):
    """Mistral v0.2/v0.3 write "sliding_window": null. A copy of the std model whose
    default window (4) is shorter than the prompt shows the null is not the default."""
    path = make_checkpoint(tmp_path / "ckpt", "mistral", sliding_window=None)
    assert json.loads((path / "config.json").read_text())["sliding_window"] is None
    source = (STD_ROOT / "models" / "mistral.module").read_text()
    assert "  sliding_window: int = 4096\n" in source
    short = source.replace("sliding_window: int = 4096", "sliding_window: int = 4")
    (tmp_path / "short_window.module").write_text(short)
    model = modeldsl.load(tmp_path / "short_window.module", hf=path)
    assert model.config("sliding_window") == 0
    assert not [op for op in model.model.walk() if op.name == "mdsl.graph.flash_attention"
                and "window_size" in op.attributes]
    with torch.no_grad():
        expected = transformers_model(path)(torch.tensor([TOKENS])).logits[0].numpy()
    assert len(TOKENS) > 2 * 4
    assert np.abs(model.forward(TOKENS) - expected).max() <= 1e-4
    assert std_config("mistral", path)["sliding_window"] == 0


def test_a_mistral_without_window_exports_null(tmp_path):
    config = dict(vocab_size=64, d_model=32, n_layers=2, num_heads=4, num_kv_heads=2, head_dim=8, d_ff=48,
                  eps=1e-6, sliding_window=0)
    modeldsl.load(STD_ROOT / "models" / "mistral.module", config=config).save_hf(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["sliding_window"] is None
    assert std_config("mistral", tmp_path)["sliding_window"] == 0


# ---------------------------------------------------------------- required fields, types, sizes
REQUIRED = """model Tiny(width: int, depth: int = 2):
  params:
    w: [depth, width]
  forward:
    in: x: [B, width]
    out: [B, width]
    graph:
      x -> out
  hf_config:
    param_mapping:
      width: hidden_size
      depth: num_hidden_layers
"""


def test_a_required_field_missing_from_config_json_is_e030(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"num_hidden_layers": 3}))
    with pytest.raises(CheckpointError) as info:
        config_of(REQUIRED, "Tiny", tmp_path)
    assert info.value.code == "E030"
    assert "'hidden_size'" in info.value.message and "'width'" in info.value.message
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 8}))
    assert config_of(REQUIRED, "Tiny", tmp_path) == {"width": 8, "depth": 2}


def test_a_required_field_set_to_null_is_e030(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": None}))
    with pytest.raises(CheckpointError) as info:
        config_of(REQUIRED, "Tiny", tmp_path)
    assert info.value.code == "E030" and "'hidden_size' to null" in info.value.message


WRONG_TYPES = [
    ("hidden_size", "wide"),
    ("hidden_size", 32.0),
    ("num_hidden_layers", True),
    ("rms_norm_eps", "small"),
    ("tie_word_embeddings", 1),
    ("vocab_size", [64]),
]


@pytest.mark.parametrize("field,value", WRONG_TYPES)
def test_config_fields_of_the_wrong_type_are_e030(field, value, checkpoints, tmp_path):
    ckpt = edited(checkpoints["llama"], tmp_path, lambda c: c.update({field: value}))
    with pytest.raises(CheckpointError) as info:
        std_config("llama", ckpt)
    assert info.value.code == "E030" and f"'{field}'" in info.value.message and repr(value) in info.value.message


@pytest.mark.parametrize("field,value", [("num_hidden_layers", -1), ("num_hidden_layers", 0), ("hidden_size", -32),
                                         ("num_attention_heads", 0), ("head_dim", -8)])
def test_sizes_below_one_are_e030_naming_the_field(field, value, checkpoints, tmp_path):
    ckpt = edited(checkpoints["llama"], tmp_path, lambda c: c.update({field: value}))
    with pytest.raises(CheckpointError) as info:
        std_config("llama", ckpt)
    assert info.value.code == "E030" and f"'{field}' is {value}" in info.value.message
    with pytest.raises(DiagnosticError) as loaded:  # the same through the API, before anything is lowered
        modeldsl.load(STD_ROOT / "models" / "llama.module", hf=ckpt)
    assert [d.code for d in loaded.value.diagnostics] == ["E030"]


def test_a_zero_sliding_window_is_not_a_size(checkpoints, tmp_path):
    ckpt = edited(checkpoints["mistral"], tmp_path, lambda c: c.update(sliding_window=0))
    assert std_config("mistral", ckpt)["sliding_window"] == 0


# ---------------------------------------------------------------- invalid JSON
def test_config_json_that_is_not_json_is_a_located_e030(checkpoints, tmp_path):
    ckpt = edited(checkpoints["llama"], tmp_path, lambda c: None)
    lines = (ckpt / "config.json").read_text().splitlines()
    number = next(i for i, line in enumerate(lines) if '"hidden_size"' in line)
    lines[number] = lines[number].rstrip(",")  # a missing comma: the error is at the next key
    (ckpt / "config.json").write_text("\n".join(lines) + "\n")
    with pytest.raises(DiagnosticError) as info:
        read_config(ckpt)
    (diagnostic,) = info.value.diagnostics
    column = len(lines[number + 1]) - len(lines[number + 1].lstrip()) + 1
    assert diagnostic.code == "E030" and "not valid JSON" in diagnostic.message and "delimiter" in diagnostic.message
    assert diagnostic.span.location == f"{ckpt / 'config.json'}:{number + 2}:{column}"
    text = diagnostic.render()
    assert text.startswith(f"{ckpt / 'config.json'}:{number + 2}:{column}: error[E030]")
    assert lines[number + 1] in text and "\n" + " " * 6 + "| " + " " * (column - 1) + "^\n" in text
    assert "hint: " in text
    with pytest.raises(DiagnosticError) as loaded:  # modeldsl.load keeps the location
        modeldsl.load(STD_ROOT / "models" / "llama.module", hf=ckpt)
    assert loaded.value.diagnostics[0].span.location == diagnostic.span.location


def test_a_truncated_config_json_points_at_its_end(checkpoints, tmp_path):
    ckpt = edited(checkpoints["llama"], tmp_path, lambda c: None)
    text = (ckpt / "config.json").read_text()
    (ckpt / "config.json").write_text(text[: len(text) // 2])
    with pytest.raises(DiagnosticError) as info:
        read_config(ckpt)
    span = info.value.diagnostics[0].span
    assert info.value.diagnostics[0].code == "E030" and span.line == text[: len(text) // 2].count("\n") + 1


def test_a_default_size_below_one_is_e030(checkpoints, tmp_path):
    """head_dim absent: its default d_model // num_heads is 0 when there are more heads than
    hidden units."""
    ckpt = edited(checkpoints["llama"], tmp_path, lambda c: (c.pop("head_dim"), c.update(num_attention_heads=64,
                                                                                          num_key_value_heads=64)))
    with pytest.raises(CheckpointError) as info:
        std_config("llama", ckpt)
    assert info.value.code == "E030" and "'head_dim'" in info.value.message
    assert "d_model // num_heads" in info.value.message


def test_a_malformed_field_mapping_is_a_located_e010(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 8}))
    source = REQUIRED.replace("depth: num_hidden_layers", "depth: field(num_hidden_layers, nul=1)")
    with pytest.raises(DiagnosticError) as info:
        config_of(source, "Tiny", tmp_path, "tiny.module")
    (diagnostic,) = info.value.diagnostics
    assert diagnostic.code == "E010" and diagnostic.span.location == "tiny.module:12:39"
    assert "field(config_name, null=VALUE, absent=VALUE)" in diagnostic.hint


# ---------------------------------------------------------------- list fields, element by element (index=)
LISTS = """model Scaled(width: int, a: float = 1.0, b: float = 1.0, c: int = 3):
  params:
    w: [width]
  forward:
    in: x: [B, width]
    out: [B, width]
    graph:
      x -> out
  hf_config:
    config_class: "ScaledConfig"
    param_mapping:
      width: hidden_size
      a: field(scales, index=0, null=1.0)
      b: field(scales, index=1, null=1.0)
      c: field(scales, index=2, null=3)
"""


def lists_config(tmp_path, source=LISTS, **fields):
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 8, **fields}, indent=2))
    return config_of(source, "Scaled", tmp_path, "scaled.module")


def test_index_reads_each_element_of_a_list_field(tmp_path):
    assert lists_config(tmp_path, scales=[0.5, 2, 7]) == {"width": 8, "a": 0.5, "b": 2.0, "c": 7}
    assert lists_config(tmp_path) == {"width": 8, "a": 1.0, "b": 1.0, "c": 3}  # absent: the DSL defaults
    assert lists_config(tmp_path, scales=None) == {"width": 8, "a": 1.0, "b": 1.0, "c": 3}  # null: null=
    no_null = LISTS.replace("field(scales, index=1, null=1.0)", "field(scales, index=1)")
    with pytest.raises(CheckpointError) as info:
        lists_config(tmp_path, no_null, scales=None)
    assert info.value.code == "E030" and "'scales' to null" in info.value.message and "'b'" in info.value.message


@pytest.mark.parametrize("scales, says", [
    (0.5, "config.json field 'scales' is 0.5, not a list: hf_config reads its elements for 'a', 'b', 'c'"),
    ({"a": 1.0}, "config.json field 'scales' is {'a': 1.0}, not a list"),
    ([1.0, 1.0], "config.json field 'scales' has 2 elements, but hf_config reads it as a list of 3 ('a', 'b', 'c')"),
    ([1.0, 1.0, 3, 4], "config.json field 'scales' has 4 elements, but hf_config reads it as a list of 3"),
    ([], "config.json field 'scales' has 0 elements"),
    ([1.0, "x", 3], "config.json field 'scales[1]' is 'x', but 'b' is float"),
    ([1.0, True, 3], "config.json field 'scales[1]' is True, but 'b' is float"),
    ([1.0, 1.0, 3.5], "config.json field 'scales[2]' is 3.5, but 'c' is int"),
    ([1.0, None, 3], "config.json sets 'scales[1]' to null"),
])
def test_a_list_field_that_is_not_the_mapped_list_is_e030_at_the_field(tmp_path, scales, says):
    with pytest.raises(CheckpointError) as info:
        lists_config(tmp_path, scales=scales)
    assert info.value.code == "E030" and says in info.value.message, info.value.message
    line = (tmp_path / "config.json").read_text().splitlines()[info.value.span.line - 1]
    assert info.value.span.location.startswith(str(tmp_path / "config.json")) and '"scales"' in line


@pytest.mark.parametrize("mapping, says, at", [
    ("c: field(scales, index=-1)", "index=-1 is not a non-negative integer", "index=-1"),
    ("c: field(scales, index=two)", "index=two is not a non-negative integer", "index=two"),
    ("c: field(scales, index=2.0)", "index=2.0 is not a non-negative integer", "index=2.0"),
    ("c: field(scales, index=true)", "index=true is not a non-negative integer", "index=true"),
    ("c: field(scales, index=3)", "maps elements 0, 1, 3 of 'scales' but not element 2", "field(scales, index=3)"),
    ("c: field(scales, index=1)", "maps element 1 of 'scales' twice ('b' and 'c')", "field(scales, index=1)"),
    ("c: scales", "maps 'scales' whole to 'c' and by element to 'a', 'b'", "scales"),
])
def test_a_list_mapping_that_skips_repeats_or_mixes_elements_is_a_located_e010(tmp_path, mapping, says, at):
    source = LISTS.replace("c: field(scales, index=2, null=3)", mapping)
    with pytest.raises(DiagnosticError) as info:
        lists_config(tmp_path, source, scales=[1.0, 1.0, 3])
    (diagnostic,) = info.value.diagnostics
    assert diagnostic.code == "E010" and says in diagnostic.message, diagnostic.message
    line = source.splitlines()[diagnostic.span.line - 1]
    assert diagnostic.span.location.startswith("scaled.module:")
    assert line[diagnostic.span.column - 1:].startswith(at), (line, diagnostic.span.column)


def lowered(source, name, config=None):
    return next(op for op in lower_program(parse_source(source, "m.module"), name, config).walk()
                if isinstance(op, ModelOp))


def test_an_exported_config_writes_a_list_field_whole_and_reads_back(tmp_path):
    exported = export_config(lowered(LISTS, "Scaled", {"width": 8, "a": 0.25, "b": 1.0, "c": 5}))
    assert exported == {"hidden_size": 8, "scales": [0.25, 1.0, 5], "model_type": "scaled",  # 1.0 is not null
                        "bos_token_id": None, "eos_token_id": None, "pad_token_id": None}
    assert lists_config(tmp_path, scales=exported["scales"]) == {"width": 8, "a": 0.25, "b": 1.0, "c": 5}
    gap = LISTS.replace("c: field(scales, index=2, null=3)", "c: field(scales, index=3)")
    with pytest.raises(DiagnosticError) as info:  # what no element maps cannot be written
        export_config(lowered(gap, "Scaled", {"width": 8}))
    assert info.value.diagnostics[0].code == "E010"


def test_transformers_5_special_floats_read_as_floats(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({
        "time_step_limit": [0.0, {"__float__": "Infinity"}], "low": {"__float__": "-Infinity"},
        "nested": {"x": [{"__float__": "NaN"}]}, "other": {"__float__": "Big"}, "two": {"__float__": "NaN", "y": 1}}))
    config = read_config(tmp_path)
    assert config["time_step_limit"] == [0.0, float("inf")] and config["low"] == float("-inf")
    assert np.isnan(config["nested"]["x"][0])
    assert config["other"] == {"__float__": "Big"} and config["two"] == {"__float__": "NaN", "y": 1}  # as transformers
    (tmp_path / "config.json").write_text('{"time_step_limit": [0.0, Infinity]}')  # transformers 4.x
    assert read_config(tmp_path)["time_step_limit"] == [0.0, float("inf")]
