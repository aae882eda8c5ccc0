"""hf_mapping rules beyond the std models: {expert} stacks, transforms, export through hf_export."""

import numpy as np
import pytest
from xdsl.context import Context

from modeldsl.dialects.graph import ModelOp
from modeldsl.frontend.text.parser import parse_source
from modeldsl.hf.checkpoint import ImportRecord, load_checkpoint, save_checkpoint
from modeldsl.hf.safetensors_io import CheckpointError, SafetensorsFile, write_safetensors
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


def checkpoint(path, **changes):
    rng = np.random.default_rng(0)
    tensors = {f"mlp.experts.{e}.w": rng.standard_normal((4, 8)).astype(np.float32) for e in range(3)}
    tensors |= {"A_log": rng.standard_normal(4).astype(np.float32),
                "wt": rng.standard_normal((8, 4)).astype(np.float32),
                "part.a": rng.standard_normal((4, 4)).astype(np.float32),
                "part.b": rng.standard_normal((8, 4)).astype(np.float32)}
    tensors.update(changes)
    path.mkdir(exist_ok=True)
    write_safetensors(path / "model.safetensors", tensors)
    return tensors


def test_expert_stacks_transforms_and_fuse_load_and_save_back(tmp_path):
    tensors = checkpoint(tmp_path / "in")
    weights, record = load_checkpoint(model(), tmp_path / "in", np.dtype(np.float32))
    np.testing.assert_array_equal(weights["experts"][2], tensors["mlp.experts.2.w"])
    np.testing.assert_allclose(weights["a_log"], -np.exp(tensors["A_log"]), rtol=1e-6)
    np.testing.assert_array_equal(weights["w_t"], tensors["wt"].T)
    save_checkpoint(model(), weights, record, tmp_path / "out")
    out = SafetensorsFile(tmp_path / "out" / "model.safetensors")
    assert sorted(out.keys()) == sorted(tensors)
    for name, value in tensors.items():
        if name == "A_log":  # log(-(-exp(x))) is x up to rounding
            np.testing.assert_allclose(out.array(name), value, rtol=1e-6)
        else:
            assert out.array(name).tobytes() == value.tobytes(), name


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
