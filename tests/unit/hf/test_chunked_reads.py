"""Rules that move a tensor's elements (a fuse or split along dim 1, transpose, permute_qkv,
negate_exp, an expert stack) read its rows a bounded chunk at a time and place each chunk,
never through the memory map nor a full-size temporary; what they load equals, bit for bit, the
tensor combined whole (chunks of one row or one head here, across dtypes)."""

import ml_dtypes
import numpy as np
import pytest
from xdsl.context import Context

from modeldsl.dialects.graph import ModelOp
from modeldsl.frontend.text.parser import parse_source
from modeldsl.hf import checkpoint as ckpt
from modeldsl.hf.checkpoint import ImportRecord, load_checkpoint, parse_rules
from modeldsl.hf.safetensors_io import SafetensorsFile, write_safetensors
from modeldsl.lower import lower_program
from modeldsl.passes.specialize import SpecializePass

BF16 = np.dtype(ml_dtypes.bfloat16)
SOURCE = """model Moved(d: int = 4, heads: int = 2, head_dim: int = 4, n_experts: int = 3):
  params:
    wide: [d, 3 * d]
    rows: [3, d]
    cols: [d, 4]
    w_t: [2 * d, d]
    q: [heads * head_dim, d]
    a_log: [d, 3, fp32]
    experts: [n_experts, d, 2 * d]
  forward:
    in: x: [B, d]
    out: [B, d]
    graph:
      x -> matmul(rows, transpose=TN) -> out
  hf_mapping:
    wide: fuse("left", "right", dim=1)
    rows: split("qkv": [1, 3], "left": [2, 3], dim=0)
    cols: split("grid": [1, 3], "left": [2, 4], dim=1)
    w_t: transform(transpose, "wt")
    q: transform("q_proj", fn: permute_qkv, head_dim=head_dim)
    a_log: transform("A_log", fn: negate_exp)
    experts: stack_experts("experts.{expert}.w", n=n_experts)
"""


def model() -> ModelOp:
    module = lower_program(parse_source(SOURCE, "moved.module"))
    SpecializePass().apply(Context(), module)
    return next(op for op in module.walk() if isinstance(op, ModelOp))


def tensors(dtype: np.dtype) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    shapes = {"left": (4, 4), "right": (4, 8), "qkv": (6, 4), "grid": (4, 5), "wt": (4, 8), "q_proj": (8, 4),
              "A_log": (4, 3)} | {f"experts.{e}.w": (4, 8) for e in range(3)}
    return {name: rng.standard_normal(shape).astype(np.float32).astype(dtype) for name, shape in shapes.items()}


def expected(t: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """What each rule gives, from the whole tensors (numpy, as the file stores them)."""
    q = t["q_proj"].reshape(2, 2, 2, 4).swapaxes(1, 2).reshape(8, 4)  # each head's [even; odd] rows in pairs again
    return {"wide": np.concatenate([t["left"], t["right"]], axis=1),
            "rows": np.concatenate([t["qkv"][1:3], t["left"][2:3]]),
            "cols": np.concatenate([t["grid"][:, 1:3], t["left"][:, 2:4]], axis=1),
            "w_t": t["wt"].T, "q": q, "a_log": -np.exp(t["A_log"].astype(np.float32)),
            "experts": np.stack([t[f"experts.{e}.w"] for e in range(3)])}


def bits(array: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(array).view(f"u{array.dtype.itemsize}")


@pytest.mark.parametrize("file_dtype, load_dtype", [(np.float32, np.float32), (BF16, np.float32),
                                                    (np.float32, BF16)], ids=["fp32", "bf16-to-fp32", "fp32-to-bf16"])
def test_rules_that_move_elements_load_the_whole_tensors_values_chunk_by_chunk(tmp_path, monkeypatch, file_dtype,
                                                                               load_dtype):
    monkeypatch.setattr(ckpt, "ROW_CHUNK", 1)  # one row (one head for permute_qkv) at a time
    written = tensors(np.dtype(file_dtype))
    write_safetensors(tmp_path / "model.safetensors", written)
    monkeypatch.setattr(SafetensorsFile, "array", memory_mapped_but_never_read(SafetensorsFile.array))
    weights, _ = load_checkpoint(model(), tmp_path, np.dtype(load_dtype))
    for name, value in expected(written).items():
        want = value.astype(load_dtype)
        assert weights[name].shape == want.shape and weights[name].dtype == want.dtype, name
        np.testing.assert_array_equal(bits(weights[name]), bits(want), err_msg=name)


class Unreadable:
    """A tensor's memory map as the loader may use it: its dtype and shape, never its values
    (reading them would bring its pages into the process beside the loaded copy)."""

    def __init__(self, view: np.ndarray):
        self.dtype, self.shape, self.ndim = view.dtype, view.shape, view.ndim

    def __array__(self, *args, **kwargs):
        raise AssertionError("the loader read a tensor through the memory map")


def memory_mapped_but_never_read(array):
    return lambda self, name: Unreadable(array(self, name))


def test_a_chunk_is_a_whole_number_of_heads_and_at_most_the_chunk_bytes(tmp_path, monkeypatch):
    write_safetensors(tmp_path / "model.safetensors", {"q": np.arange(64 * 8, dtype=np.float32).reshape(64, 8)})
    source = SafetensorsFile(tmp_path / "model.safetensors")
    chunks = [(first, rows.shape) for first, rows in source.row_chunks("q", 4, 64, block=4, chunk_bytes=8 * 4 * 10)]
    assert chunks == [(4, (8, 8)), (12, (8, 8)), (20, (8, 8)), (28, (8, 8)), (36, (8, 8)), (44, (8, 8)),
                      (52, (8, 8)), (60, (4, 8))]
    assert [first for first, _ in source.row_chunks("q", 0, 64, block=16, chunk_bytes=1)] == [0, 16, 32, 48]


def test_an_expert_stack_goes_straight_into_its_slots_or_chunk_by_chunk_into_any_array(tmp_path, monkeypatch):
    written = tensors(np.dtype(np.float32))
    write_safetensors(tmp_path / "model.safetensors", written)
    monkeypatch.setattr(ckpt, "ROW_CHUNK", 1)
    rule = next(r for r in parse_rules(model()) if r.op == "stack_experts")
    checkpoint = ckpt.Checkpoint(tmp_path)
    strided = np.zeros((8, 3, 4), np.float32).transpose(1, 2, 0)  # not C-contiguous: placed chunk by chunk
    for out in (np.zeros((3, 4, 8), np.float32), strided):
        ckpt._read(rule, None, checkpoint, ImportRecord(), (3, 4, 8), np.dtype(np.float32), {"n_experts": 3}, out=out)
        np.testing.assert_array_equal(out, expected(written)["experts"])


def test_nan_rows_read_chunk_by_chunk_are_w011_for_their_tensor(tmp_path, monkeypatch):
    monkeypatch.setattr(ckpt, "ROW_CHUNK", 1)
    written = tensors(np.dtype(np.float32))
    written["wt"][3, :2] = np.nan
    written["qkv"][0, 0] = np.inf  # a row the split does not read
    write_safetensors(tmp_path / "model.safetensors", written)
    found = []
    load_checkpoint(model(), tmp_path, np.dtype(np.float32), warn=found.append)
    assert [(w.code, w.tensor) for w in found] == [("W011", "wt")]
    assert "2 NaN values" in found[0].message and "transform(" not in found[0].message
