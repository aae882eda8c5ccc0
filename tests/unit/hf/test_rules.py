"""hf_mapping rules beyond the std models: {expert} stacks, transforms, export through hf_export."""

import numpy as np
import pytest
from xdsl.context import Context

from modeldsl.diagnostics import DiagnosticError
from modeldsl.dialects.graph import ModelOp
from modeldsl.frontend.text.parser import parse_source
from modeldsl.hf.checkpoint import ImportRecord, load_checkpoint, save_checkpoint
from modeldsl.hf.safetensors_io import CheckpointError, SafetensorsFile, write_safetensors
from modeldsl.ir import make_context, parse_module, print_ir
from modeldsl.lower import lower_program
from modeldsl.passes.specialize import SpecializePass

SOURCE = """model Experts(n_experts: int = 3, d: int = 4, n_layers: int = 2):
  params:
    experts: [n_experts, d, 2 * d]
    a_log: [d, fp32]
    w_t: [d, 2 * d]
    fused: [3 * d, d]
  forward:
    in: x: [B, d]
    out: [B, d]
    graph:
      x -> matmul(fused, transpose=TN) -> out
  hf_mapping:
    experts: stack_experts("mlp.experts.{expert}.w", n=n_experts)
    a_log: transform("A_log", fn: negate_exp)
    w_t: transform(transpose, "wt")
    fused: fuse("part.a", "part.b", dim=0)
  hf_export:
    fused -> split("part.a": [0, d], "part.b": [d, 3 * d], dim=0)
"""


def model() -> ModelOp:
    module = lower_program(parse_source(SOURCE, "experts.module"))
    SpecializePass().apply(Context(), module)
    return next(op for op in module.walk() if isinstance(op, ModelOp))


def write_checkpoint(path, tensors):
    """``tensors`` as the folder's model.safetensors; returns them."""
    path.mkdir(exist_ok=True)
    write_safetensors(path / "model.safetensors", tensors)
    return tensors


def checkpoint(path, **changes):
    rng = np.random.default_rng(0)
    tensors = {f"mlp.experts.{e}.w": rng.standard_normal((4, 8)).astype(np.float32) for e in range(3)}
    tensors |= {"A_log": rng.standard_normal(4).astype(np.float32),
                "wt": rng.standard_normal((8, 4)).astype(np.float32),
                "part.a": rng.standard_normal((4, 4)).astype(np.float32),
                "part.b": rng.standard_normal((8, 4)).astype(np.float32)}
    return write_checkpoint(path, tensors | changes)


def test_expert_stacks_transforms_and_fuse_load_and_save_back(tmp_path):
    tensors = checkpoint(tmp_path / "in")
    weights, record = load_checkpoint(model(), tmp_path / "in", np.dtype(np.float32))
    np.testing.assert_array_equal(weights["experts"][2], tensors["mlp.experts.2.w"])
    np.testing.assert_allclose(weights["a_log"], -np.exp(tensors["A_log"]), rtol=1e-6)
    np.testing.assert_array_equal(weights["w_t"], tensors["wt"].T)
    save_checkpoint(model(), weights, record, tmp_path / "out")
    out = SafetensorsFile(tmp_path / "out" / "model.safetensors")
    assert sorted(out.keys()) == sorted(tensors)
    for name, value in tensors.items():  # A_log too: the original bytes, not log(-(-exp(x)))
        assert out.dtype(name) == value.dtype, name
        np.testing.assert_array_equal(raw(out.array(name)), raw(value), err_msg=name)


def raw(array):
    """The bytes of an array, to compare bit for bit (NaN payloads and -0.0 included)."""
    return np.frombuffer(np.ascontiguousarray(array).tobytes(), np.uint8)


def test_negate_exp_is_not_its_own_inverse_in_floating_point():
    """Why the export keeps the loaded bytes: log(-(-exp(x))) differs from x in most fp32 values."""
    x = np.random.default_rng(0).standard_normal(10_000).astype(np.float32)
    loaded = -np.exp(x)  # negate_exp, the import
    again = np.log(-loaded)  # its inverse, the export
    assert (again != x).mean() > 0.3


def test_a_changed_transformed_parameter_exports_through_the_inverse(tmp_path):
    tensors = checkpoint(tmp_path / "in")
    weights, record = load_checkpoint(model(), tmp_path / "in", np.dtype(np.float32))
    weights["a_log"] = weights["a_log"] * 2  # A = 2 * -exp(A_log): A_log + log(2)
    weights["w_t"] = weights["w_t"] + 1
    save_checkpoint(model(), weights, record, tmp_path / "out")
    out = SafetensorsFile(tmp_path / "out" / "model.safetensors")
    np.testing.assert_allclose(out.array("A_log"), tensors["A_log"] + np.log(2), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(out.array("wt"), (weights["w_t"]).T)
    np.testing.assert_array_equal(raw(out.array("part.a")), raw(tensors["part.a"]))


def test_a_narrower_load_dtype_still_exports_the_original_bytes(tmp_path):
    """Loaded as bf16, saved unchanged: the fp32 checkpoint comes back bit for bit;
    a changed parameter is written from its bf16 values."""
    import ml_dtypes

    tensors = checkpoint(tmp_path / "in")
    weights, record = load_checkpoint(model(), tmp_path / "in", np.dtype(ml_dtypes.bfloat16))
    weights["fused"] = weights["fused"] * 2
    save_checkpoint(model(), weights, record, tmp_path / "out")
    out = SafetensorsFile(tmp_path / "out" / "model.safetensors")
    for name in ("mlp.experts.2.w", "A_log", "wt"):
        np.testing.assert_array_equal(raw(out.array(name)), raw(tensors[name]), err_msg=name)
    assert out.dtype("part.b") == np.float32
    np.testing.assert_array_equal(out.array("part.b"), weights["fused"][4:].astype(np.float32))


def test_a_model_that_was_not_imported_exports_through_hf_export(tmp_path):
    rng = np.random.default_rng(1)
    shapes = {"experts": (3, 4, 8), "a_log": (4,), "w_t": (4, 8), "fused": (12, 4)}
    weights = {k: -np.abs(rng.standard_normal(s)).astype(np.float32) - 0.1 for k, s in shapes.items()}
    save_checkpoint(model(), weights, ImportRecord(), tmp_path / "out")
    out = SafetensorsFile(tmp_path / "out" / "model.safetensors")
    assert out.shape("part.a") == (4, 4) and out.shape("part.b") == (8, 4)
    np.testing.assert_array_equal(out.array("part.b"), weights["fused"][4:])
    assert out.shape("mlp.experts.1.w") == (4, 8)


def test_a_missing_expert_names_the_tensor(tmp_path):
    tensors = checkpoint(tmp_path / "in")
    tensors.pop("mlp.experts.1.w")
    write_safetensors(tmp_path / "in" / "model.safetensors", tensors)
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(model(), tmp_path / "in", np.dtype(np.float32))
    assert info.value.code == "E031" and info.value.tensor == "mlp.experts.1.w"


SLICED = """block SlicedBlock(d: int, n_experts: int):
  params:
    q: [d, d]
    kv: [2 * d, d]
    experts: [n_experts, d, 2 * d]
  forward:
    in: [B, d]
    out: [B, d]
    graph:
      in -> matmul(q, transpose=NT) -> out

model Sliced(d: int = 4, n_layers: int = 2, n_experts: int = 3):
  params:
    blocks: [n_layers] x SlicedBlock(d, n_experts)
    head: [d, d]
    tail: [d + 2, d]
  forward:
    in: x: [B, d]
    out: [B, d]
    graph:
      x -> blocks -> h
      h -> matmul(head, transpose=NT) -> out
  hf_mapping:
    blocks[{layer}].q: split("layers.{layer}.qkv": [0, d], dim=0)
    blocks[{layer}].kv: split("layers.{layer}.qkv": [d, 3 * d], dim=0)
    blocks[{layer}].experts: stack_experts("layers.{layer}.experts.{expert}.w", n=n_experts)
    head: split("wide": [d // 2, d // 2 + d], dim=-1)
    tail: split("a": [0, 2], "b": [1, d + 1], dim=0)
"""


def sliced() -> ModelOp:
    module = lower_program(parse_source(SLICED, "sliced.module"))
    SpecializePass().apply(Context(), module)
    return next(op for op in module.walk() if isinstance(op, ModelOp))


def sliced_checkpoint(path, **changes):
    rng = np.random.default_rng(2)
    tensors = {f"layers.{layer}.qkv": rng.standard_normal((12, 4)).astype(np.float32) for layer in range(2)}
    tensors |= {f"layers.{layer}.experts.{e}.w": rng.standard_normal((4, 8)).astype(np.float32)
                for layer in range(2) for e in range(3)}
    tensors |= {"wide": rng.standard_normal((4, 8)).astype(np.float32),
                "a": rng.standard_normal((3, 4)).astype(np.float32),
                "b": rng.standard_normal((6, 4)).astype(np.float32)}
    return write_checkpoint(path, tensors | changes)


def test_split_loads_slices_of_one_tensor_into_several_parameters(tmp_path):
    tensors = sliced_checkpoint(tmp_path / "in")
    warnings = []
    weights, _ = load_checkpoint(sliced(), tmp_path / "in", np.dtype(np.float32), warn=warnings.append)
    assert warnings == []
    for layer in range(2):
        np.testing.assert_array_equal(weights["blocks.q"][layer], tensors[f"layers.{layer}.qkv"][:4])
        np.testing.assert_array_equal(weights["blocks.kv"][layer], tensors[f"layers.{layer}.qkv"][4:])
    np.testing.assert_array_equal(weights["head"], tensors["wide"][:, 2:6])
    np.testing.assert_array_equal(weights["tail"], np.concatenate([tensors["a"][:2], tensors["b"][1:5]]))


def test_layer_and_expert_placeholders_in_one_rule(tmp_path):
    tensors = sliced_checkpoint(tmp_path / "in")
    weights, _ = load_checkpoint(sliced(), tmp_path / "in", np.dtype(np.float32))
    assert weights["blocks.experts"].shape == (2, 3, 4, 8)
    for layer in range(2):
        for e in range(3):
            np.testing.assert_array_equal(weights["blocks.experts"][layer, e], tensors[f"layers.{layer}.experts.{e}.w"])
    tensors.pop("layers.1.experts.2.w")
    write_safetensors(tmp_path / "in" / "model.safetensors", tensors)
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(sliced(), tmp_path / "in", np.dtype(np.float32))
    assert info.value.code == "E031" and info.value.tensor == "layers.1.experts.2.w"
    assert "blocks[{layer}].experts" in info.value.message


def test_split_and_expert_rules_save_back_bitwise(tmp_path):
    tensors = sliced_checkpoint(tmp_path / "in")
    weights, record = load_checkpoint(sliced(), tmp_path / "in", np.dtype(np.float32))
    save_checkpoint(sliced(), weights, record, tmp_path / "out")
    out = SafetensorsFile(tmp_path / "out" / "model.safetensors")
    assert sorted(out.keys()) == sorted(tensors)
    for name, value in tensors.items():  # "wide" too, whose columns outside the slice no parameter holds
        np.testing.assert_array_equal(raw(out.array(name)), raw(value), err_msg=name)


def test_a_changed_split_parameter_is_written_into_its_slice(tmp_path):
    tensors = sliced_checkpoint(tmp_path / "in")
    weights, record = load_checkpoint(sliced(), tmp_path / "in", np.dtype(np.float32))
    weights["head"] = np.full((4, 4), 7, np.float32)
    weights["blocks.kv"] = weights["blocks.kv"] + 1
    save_checkpoint(sliced(), weights, record, tmp_path / "out")
    out = SafetensorsFile(tmp_path / "out" / "model.safetensors")
    expected = tensors["wide"].copy()
    expected[:, 2:6] = 7
    np.testing.assert_array_equal(out.array("wide"), expected)
    np.testing.assert_array_equal(out.array("layers.1.qkv"), np.concatenate([tensors["layers.1.qkv"][:4],
                                                                             tensors["layers.1.qkv"][4:] + 1]))


def test_split_parameters_of_a_model_that_was_not_imported(tmp_path):
    rng = np.random.default_rng(3)
    shapes = {"blocks.q": (2, 4, 4), "blocks.kv": (2, 8, 4), "blocks.experts": (2, 3, 4, 8)}
    weights = {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
    save_checkpoint(sliced(), weights, ImportRecord(), tmp_path / "out")
    out = SafetensorsFile(tmp_path / "out" / "model.safetensors")
    np.testing.assert_array_equal(out.array("layers.1.qkv"), np.concatenate([weights["blocks.q"][1],
                                                                             weights["blocks.kv"][1]]))
    assert out.shape("layers.0.experts.2.w") == (4, 8)
    # head holds columns 2..6 of "wide": without the checkpoint, columns 0 and 1 are unknown
    with pytest.raises(CheckpointError) as info:
        save_checkpoint(sliced(), {**weights, "head": np.zeros((4, 4), np.float32)}, ImportRecord(), tmp_path / "x")
    assert info.value.code == "E010" and info.value.tensor == "wide"


def test_a_split_range_outside_the_tensor_is_e032(tmp_path):
    sliced_checkpoint(tmp_path / "in", **{"layers.1.qkv": np.zeros((10, 4), np.float32)})
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(sliced(), tmp_path / "in", np.dtype(np.float32))
    assert info.value.code == "E032" and info.value.tensor == "layers.1.qkv"
    assert "[4, 12)" in info.value.message and "blocks[{layer}].kv" in info.value.message


LAYER = """
module Layer(d: int):
  params:
    w: [d, d]
  forward:
    in: x: [B, d]
    out: [B, d]
    graph:
      x -> matmul(w, transpose=NT) -> out
"""
INTERLEAVED = LAYER + """
model Interleaved(d: int = 4, pairs: int = 2, first: int = 1):
  params:
    lead: [first] x Layer(d)
    even: [pairs] x Layer(d)
    odd: [pairs] x Layer(d)
  forward:
    in: x: [B, d]
    out: [B, d]
    graph:
      x -> lead -> a
      a -> even -> b
      b -> odd -> out
  hf_mapping:
    lead[{layer}].w: "layers.{layer}.w"
    even[{layer}].w: "layers.{2 * layer + first}.w"
    odd[{i}].w: "layers.{2 * i + first + 1}.w"
"""


def test_a_layer_placeholder_may_be_an_expression_of_the_layer_and_the_config(tmp_path):
    """Layers that alternate, or follow another stack, map onto the checkpoint's layer numbers."""
    module = lower_program(parse_source(INTERLEAVED, "interleaved.module"))
    SpecializePass().apply(Context(), module)
    interleaved = next(op for op in module.walk() if isinstance(op, ModelOp))
    rng = np.random.default_rng(1)
    tensors = write_checkpoint(tmp_path / "in", {f"layers.{i}.w": rng.standard_normal((4, 4)).astype(np.float32)
                                                 for i in range(5)})
    weights, record = load_checkpoint(interleaved, tmp_path / "in", np.dtype(np.float32))
    for stack, layers in (("lead", [0]), ("even", [1, 3]), ("odd", [2, 4])):
        for row, layer in enumerate(layers):
            np.testing.assert_array_equal(weights[f"{stack}.w"][row], tensors[f"layers.{layer}.w"])
    weights["odd.w"] = weights["odd.w"] * 2  # changed: written through the rule, not copied
    save_checkpoint(interleaved, weights, record, tmp_path / "out")
    written = SafetensorsFile(tmp_path / "out" / "model.safetensors")
    assert sorted(written.keys()) == sorted(tensors)
    np.testing.assert_array_equal(written.array("layers.3.w"), tensors["layers.3.w"])
    np.testing.assert_array_equal(written.array("layers.4.w"), 2 * tensors["layers.4.w"])


def test_a_placeholder_that_does_not_evaluate_is_e010(tmp_path):
    """At the tensor name when the model lowers (the name is no index and no config value), and at
    load for IR that holds it (here printed and parsed back)."""
    bad = INTERLEAVED.replace("{2 * layer + first}", "{2 * layer + nope}")
    with pytest.raises(DiagnosticError) as lowered:
        lower_program(parse_source(bad, "interleaved.module"))
    (diagnostic,) = lowered.value.diagnostics
    assert diagnostic.code == "E010" and "'{2 * layer + nope}'" in diagnostic.message
    assert diagnostic.span.text.startswith('"layers.{2 * layer + nope}')
    good = print_ir(lower_program(parse_source(INTERLEAVED, "interleaved.module")))
    module, _ = parse_module(make_context(), good.replace("{2 * layer + first}", "{2 * layer + nope}"))
    SpecializePass().apply(Context(), module)
    interleaved = next(op for op in module.walk() if isinstance(op, ModelOp))
    rng = np.random.default_rng(1)
    write_checkpoint(tmp_path / "in", {f"layers.{i}.w": rng.standard_normal((4, 4)).astype(np.float32)
                                       for i in range(5)})
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(interleaved, tmp_path / "in", np.dtype(np.float32))
    assert info.value.code == "E010" and "'{2 * layer + nope}'" in info.value.message


NUMBERED = LAYER + """
block Triple(d: int):
  params:
    sub_0: Layer(d)
    sub_1: Layer(d)
    last: Layer(d)
  forward:
    in: x: [B, d]
    out: [B, d]
    graph:
      x -> sub_0 -> a
      a -> sub_1 -> b
      b -> last -> out

model Numbered(d: int = 4, groups: int = 2):
  params:
    head_0: [d, d]
    head_1: [d, d]
    triples: [groups] x Triple(d)
  forward:
    in: x: [B, d]
    out: [B, d]
    graph:
      x -> triples -> out
  hf_mapping:
    "head_{h}": "heads.{h}.w"
    "triples[{layer}].sub_{k}.w": "layers.{3 * layer + k}.w"
    triples[{layer}].last.w: "layers.{3 * layer + 2}.w"
"""


def numbered(source: str = NUMBERED) -> ModelOp:
    module = lower_program(parse_source(source, "numbered.module"))
    SpecializePass().apply(Context(), module)
    return next(op for op in module.walk() if isinstance(op, ModelOp))


def test_a_quoted_key_with_a_name_placeholder_maps_every_numbered_parameter(tmp_path):
    """``"triples[{layer}].sub_{k}.w"`` is a pattern: one rule per parameter sub_0, sub_1, with k bound to its
    number in the tensor names; outside a stack too (``"head_{h}"``); it loads and saves back bitwise."""
    model = numbered()
    assert set(model.hf_mapping.data) == {"head_{h}", "triples[{layer}].sub_{k}.w", "triples[{layer}].last.w"}
    rng = np.random.default_rng(2)
    tensors = write_checkpoint(tmp_path / "in", {
        **{f"layers.{i}.w": rng.standard_normal((4, 4)).astype(np.float32) for i in range(6)},
        **{f"heads.{h}.w": rng.standard_normal((4, 4)).astype(np.float32) for h in range(2)}})
    weights, record = load_checkpoint(model, tmp_path / "in", np.dtype(np.float32))
    for layer in range(2):
        for k in range(2):
            np.testing.assert_array_equal(weights[f"triples.sub_{k}.w"][layer], tensors[f"layers.{3 * layer + k}.w"])
        np.testing.assert_array_equal(weights["triples.last.w"][layer], tensors[f"layers.{3 * layer + 2}.w"])
    np.testing.assert_array_equal(weights["head_1"], tensors["heads.1.w"])
    save_checkpoint(model, weights, record, tmp_path / "out")
    written = SafetensorsFile(tmp_path / "out" / "model.safetensors")
    assert sorted(written.keys()) == sorted(tensors)
    for name, value in tensors.items():
        np.testing.assert_array_equal(written.array(name), value)


def test_a_key_pattern_that_matches_no_parameter_is_e010(tmp_path):
    """At the key when the model lowers, with the closest parameter, and at load for IR that holds it."""
    bad = NUMBERED.replace('"head_{h}"', '"tail_{h}"')
    with pytest.raises(DiagnosticError) as lowered:
        lower_program(parse_source(bad, "numbered.module"))
    (diagnostic,) = lowered.value.diagnostics
    assert diagnostic.code == "E010" and "has no parameter 'tail_{h}'" in diagnostic.message
    assert diagnostic.span.text == '"tail_{h}"'
    good = print_ir(lower_program(parse_source(NUMBERED, "numbered.module")))
    module, _ = parse_module(make_context(), good.replace('"head_{h}"', '"tail_{h}"'))
    SpecializePass().apply(Context(), module)
    model = next(op for op in module.walk() if isinstance(op, ModelOp))
    write_checkpoint(tmp_path / "in", {"heads.0.w": np.zeros((4, 4), np.float32)})
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(model, tmp_path / "in", np.dtype(np.float32))
    assert info.value.code == "E010" and "tail_{h}" in info.value.message and "matches no parameter" in \
        info.value.message
