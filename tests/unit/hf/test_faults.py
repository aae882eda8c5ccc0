"""Checkpoint faults: each is a coded, located diagnostic through ``modeldsl.load`` (or a
warning naming the tensor or field), never a traceback, a hang, MemoryError or an OOM kill,
and numpy's RuntimeWarnings never leak."""

import json
import os
import shutil
import struct
import time
import warnings

import numpy as np
import pytest
from hf_checkpoints import cached_checkpoint

import modeldsl
from modeldsl.diagnostics import DiagnosticError
from modeldsl.hf.compat import DiagnosticWarning
from modeldsl.hf.safetensors_io import SafetensorsFile, write_safetensors
from modeldsl.resolve.imports import STD_ROOT

pytest.importorskip("torch")
pytest.importorskip("transformers")

LLAMA = STD_ROOT / "models" / "llama.module"
TOKENS = [3, 17, 42, 5]


@pytest.fixture
def ckpt(tmp_path):
    """A private copy of the tiny Llama checkpoint."""
    return shutil.copytree(cached_checkpoint("llama"), tmp_path / "ckpt")


def set_config(directory, **fields):
    config = json.loads((directory / "config.json").read_text())
    config.update(fields)
    (directory / "config.json").write_text(json.dumps(config, indent=2))


def refused(directory, **options):
    """The error diagnostics of loading ``directory`` into the std Llama."""
    with pytest.raises(DiagnosticError) as info:
        modeldsl.load(LLAMA, hf=directory, **options)
    return info.value.errors


def located(diagnostic, file="config.json"):
    assert diagnostic.span is not None and diagnostic.span.source.name.endswith(file), diagnostic.render()
    return diagnostic.span


def quiet_load(directory):
    """Load, and run one forward, with every warning caught: numpy's RuntimeWarnings must not appear."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = modeldsl.load(LLAMA, hf=directory)
        logits = model.forward(TOKENS)
    leaked = [w for w in caught if issubclass(w.category, RuntimeWarning)]
    assert not leaked, [str(w.message) for w in leaked]
    return [w.message for w in caught if issubclass(w.category, DiagnosticWarning)], logits


# ---------------------------------------------------------------------------- sizes past the machine
@pytest.mark.parametrize("field,value", [("num_hidden_layers", 10**9), ("intermediate_size", 10**12),
                                         ("vocab_size", 10**11)])
def test_a_model_too_big_for_memory_is_e038_with_the_sizes_in_gib_and_refused_fast(ckpt, field, value):
    set_config(ckpt, **{field: value})
    start = time.perf_counter()
    (error,) = refused(ckpt)
    assert time.perf_counter() - start < 5
    assert error.code == "E038" and "GiB" in error.message and "available" in error.message


def test_a_head_dim_past_int64_is_e030_at_the_field(ckpt):
    set_config(ckpt, head_dim=2**63)
    (error,) = refused(ckpt)
    assert error.code == "E030" and "64-bit" in error.message
    assert located(error).text == '"head_dim"'


def test_a_config_integer_past_4300_digits_is_e030_at_the_number(ckpt):
    text = (ckpt / "config.json").read_text().replace('"vocab_size": 64', '"vocab_size": ' + "9" * 5000)
    (ckpt / "config.json").write_text(text)
    (error,) = refused(ckpt)
    assert error.code == "E030" and "5000 digits" in error.message
    assert located(error).text.startswith("999")


def test_deeply_nested_config_json_is_e030_not_a_recursion_error(ckpt):
    config = (ckpt / "config.json").read_text().rstrip().rstrip("}")
    (ckpt / "config.json").write_text(config + ', "nested": ' + "[" * 100_000 + "]" * 100_000 + "}")
    (error,) = refused(ckpt)
    assert error.code == "E030" and "levels deep" in error.message
    assert located(error).text == "["


def test_rope_parameters_of_the_wrong_type_is_e030_at_the_field(ckpt):
    set_config(ckpt, rope_parameters=[10000.0])
    (error,) = refused(ckpt)
    assert error.code == "E030" and "'rope_parameters'" in error.message
    assert located(error).text == '"rope_parameters"'


@pytest.mark.parametrize("field,value", [("architectures", 5), ("architectures", [None]), ("model_type", ["llama"])])
def test_an_architecture_or_model_type_of_the_wrong_type_is_e030(ckpt, field, value):
    set_config(ckpt, **{field: value})
    (error,) = refused(ckpt)
    assert error.code == "E030" and f"'{field}'" in error.message and located(error).text == f'"{field}"'


# ---------------------------------------------------------------------------- files that are not files
def test_config_json_that_is_a_folder_is_e028(ckpt):
    (ckpt / "config.json").unlink()
    (ckpt / "config.json").mkdir()
    (error,) = refused(ckpt)
    assert error.code == "E028" and "is a folder" in error.message


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
@pytest.mark.parametrize("name", ["config.json", "model.safetensors"])
def test_a_fifo_in_place_of_a_checkpoint_file_is_e028_and_never_blocks(ckpt, name):
    (ckpt / name).unlink()
    os.mkfifo(ckpt / name)
    start = time.perf_counter()
    (error,) = refused(ckpt)
    assert error.code == "E028" and "FIFO" in error.message and time.perf_counter() - start < 5


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="no /dev/zero here")
def test_a_device_in_place_of_the_weights_is_e028(ckpt):
    (ckpt / "model.safetensors").unlink()
    (ckpt / "model.safetensors").symlink_to("/dev/zero")
    (error,) = refused(ckpt)
    assert error.code == "E028" and "character device" in error.message


def test_a_tokenizer_json_that_is_a_folder_is_e028(ckpt, capsys):
    from modeldsl.tools.run import main

    (ckpt / "tokenizer.json").mkdir()
    assert main([str(LLAMA), "--hf", str(ckpt), "--prompt", "hi"]) != 0
    err = capsys.readouterr().err
    assert "error[E028]" in err and "tokenizer.json" in err and "Traceback" not in err


# ---------------------------------------------------------------------------- safetensors headers
def _with_entry(directory, entry):
    """Add a tensor whose header entry is ``entry`` in a second shard."""
    header = json.dumps({"model.extra.weight": entry}).encode()
    (directory / "model-00002-of-00002.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + bytes(64))


@pytest.mark.parametrize("what,entry", [
    ("byte count past int64", {"dtype": "F32", "shape": [2**62, 2**62], "data_offsets": [0, 0]}),
    ("negative shape", {"dtype": "F32", "shape": [-4, -4], "data_offsets": [0, 64]}),
    ("fractional shape", {"dtype": "F32", "shape": [2.5, 6.4], "data_offsets": [0, 64]}),
    ("fractional offsets", {"dtype": "F32", "shape": [16], "data_offsets": [0, 64.0]}),
    ("boolean shape", {"dtype": "F32", "shape": [True], "data_offsets": [0, 4]}),
])
def test_a_bad_safetensors_shape_is_e034_naming_the_tensor(ckpt, what, entry):
    _with_entry(ckpt, entry)
    (error,) = refused(ckpt)
    assert error.code == "E034" and "'model.extra.weight'" in error.message


def test_a_safetensors_header_nested_too_deeply_is_e034(ckpt):
    header = b'{"x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    (ckpt / "model-00002-of-00002.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
    (error,) = refused(ckpt)
    assert error.code == "E034" and "nested too deeply" in error.message


def test_a_safetensors_header_with_a_huge_integer_is_e034(ckpt):
    header = b'{"x": {"dtype": "F32", "shape": [' + b"9" * 5000 + b'], "data_offsets": [0, 4]}}'
    (ckpt / "model-00002-of-00002.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
    (error,) = refused(ckpt)
    assert error.code == "E034"


# ---------------------------------------------------------------------------- suspicious values: warnings
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_weights_are_w011_naming_the_tensor_and_leak_no_numpy_warning(ckpt, value):
    f = SafetensorsFile(ckpt / "model.safetensors")
    tensors = {k: np.array(f.array(k)) for k in f.keys()}
    tensors["model.layers.1.mlp.down_proj.weight"][0, :3] = value
    del f
    write_safetensors(ckpt / "model.safetensors", tensors)
    found, _ = quiet_load(ckpt)
    (warning,) = [w for w in found if w.code == "W011"]
    kind = "NaN" if value != value else "Inf"
    assert "'model.layers.1.mlp.down_proj.weight'" in str(warning) and f"3 {kind} values" in str(warning)


@pytest.mark.parametrize("field,value", [("rms_norm_eps", 0.0), ("rms_norm_eps", -1e-6), ("rms_norm_eps", float("nan")),
                                         ("rms_norm_eps", 1e30), ("rope_theta", 0.0), ("rope_theta", -10000.0),
                                         ("rope_theta", float("nan"))])
def test_nonsensical_eps_and_rope_theta_are_w011_at_the_field_and_leak_no_numpy_warning(ckpt, field, value):
    config = json.loads((ckpt / "config.json").read_text())
    if field == "rope_theta":
        config["rope_parameters"]["rope_theta"] = value
    else:
        config[field] = value
    (ckpt / "config.json").write_text(json.dumps(config, indent=2))  # NaN is written as NaN, as Python's json reads it
    found, _ = quiet_load(ckpt)
    (warning,) = [w for w in found if w.code == "W011"]
    assert f"'{field}'" in warning.diagnostic.message
    assert warning.diagnostic.span is not None and warning.diagnostic.span.text == f'"{field}"'


def test_planned_arenas_that_do_not_fit_are_e038_before_they_are_allocated(monkeypatch):
    import modeldsl.runtime.fits as fits

    model = modeldsl.load(LLAMA, hf=cached_checkpoint("llama"))
    monkeypatch.setattr(fits, "available_bytes", lambda: 4096)
    with pytest.raises(DiagnosticError) as info:
        model.forward(TOKENS)
    (error,) = info.value.errors
    assert error.code == "E038" and "activations arena of @forward" in error.message and "GiB" in error.message
    assert not model.schedule.profiles


def test_available_memory_is_positive_and_at_most_the_machine():
    from modeldsl.runtime.fits import available_bytes

    total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert 0 < available_bytes() <= total


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float8_e5m2"])
def test_non_finite_counts_nan_and_inf_in_every_float_dtype(dtype):
    import ml_dtypes

    from modeldsl.hf.checkpoint import non_finite

    kind = np.dtype(getattr(ml_dtypes, dtype, None) or dtype)
    values = np.array([1.0, np.nan, -np.nan, np.inf, -np.inf, 0.0, -2.0], np.float32).astype(kind)
    assert non_finite(values, chunk=3) == "2 NaN and 2 Inf values"
    assert non_finite(np.ones(10, kind)) == ""


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_training_arenas_that_do_not_fit_are_e038(monkeypatch, dtype):
    import modeldsl.runtime.fits as fits
    from modeldsl.runtime.optim import AdamWConfig
    from modeldsl.runtime.train import Trainer

    model = modeldsl.load(LLAMA, hf=cached_checkpoint("llama"), dtype="fp32")
    monkeypatch.setattr(fits, "available_bytes", lambda: 4096)
    with pytest.raises(DiagnosticError) as info:
        Trainer(model, AdamWConfig(lr=1e-3), dtype=dtype)
    (error,) = info.value.errors
    assert error.code == "E038" and "arena" in error.message


@pytest.mark.parametrize("free, arena", [(4096, "parameters"), (1 << 30, "activations arena of @forward")])
def test_what_does_not_fit_in_device_memory_is_e038_before_it_is_allocated(monkeypatch, free, arena):
    from modeldsl.runtime.cuda_device import EmulatedDevice

    monkeypatch.setattr(EmulatedDevice, "free_bytes", lambda self: free)
    if arena == "parameters":
        with pytest.raises(DiagnosticError) as info:
            modeldsl.load(LLAMA, hf=cached_checkpoint("llama"), device="emulated")
    else:
        model = modeldsl.load(LLAMA, hf=cached_checkpoint("llama"), device="emulated")
        monkeypatch.setattr(EmulatedDevice, "free_bytes", lambda self: 4096)
        allocated = model.schedule.device.allocated_bytes
        with pytest.raises(DiagnosticError) as info:
            model.forward(TOKENS)
        assert model.schedule.device.allocated_bytes == allocated
    (error,) = info.value.errors
    assert error.code == "E038" and arena in error.message and "of emulated device memory" in error.message
