"""The std Mamba (selective state space model) on a tiny transformers checkpoint: every gradient against
PyTorch autograd, the checkpoint written back bitwise, and the registry serving MambaForCausalLM.
(Logits, generation and the schedule executor run in test_model and test_sched_executor through
hf_checkpoints.CASES; training steps in test_train.)"""

import numpy as np
import pytest
from hf_checkpoints import cached_checkpoint, trainer_and_autograd_gradients

import modeldsl
from modeldsl.hf.safetensors_io import SafetensorsFile
from modeldsl.resolve.imports import STD_ROOT

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

MAMBA = STD_ROOT / "models" / "mamba.module"
CONFIG = {"state_size": 4, "expand": 2, "conv_kernel": 4, "time_step_rank": 2}
# our parameter (of blocks[layer]) -> the transformers parameter of layer {layer}
MIXER = {"norm.weight": "norm.weight", "in_proj": "mixer.in_proj.weight", "conv_weight": "mixer.conv1d.weight",
         "conv_bias": "mixer.conv1d.bias", "x_proj": "mixer.x_proj.weight", "dt_proj": "mixer.dt_proj.weight",
         "dt_bias": "mixer.dt_proj.bias", "A_log": "mixer.A_log", "D": "mixer.D", "out_proj": "mixer.out_proj.weight"}


def test_every_gradient_matches_pytorch_autograd():
    grads, named = trainer_and_autograd_gradients(MAMBA, cached_checkpoint("mamba", **CONFIG))
    for layer in range(grads["blocks.in_proj"].shape[0]):
        for ours, theirs in MIXER.items():
            want = named[f"backbone.layers.{layer}.{theirs}"].grad.numpy()
            np.testing.assert_allclose(grads[f"blocks.{ours}"][layer], want, rtol=1e-4,
                                       atol=1e-4 * np.abs(want).max(), err_msg=f"{layer} {ours}")
    for ours, theirs in (("embedding", "backbone.embeddings.weight"), ("final_norm.weight", "backbone.norm_f.weight")):
        want = named[theirs].grad.numpy()
        np.testing.assert_allclose(grads[ours], want, rtol=1e-4, atol=1e-4 * np.abs(want).max(), err_msg=ours)


def test_the_checkpoint_is_written_back_bitwise_and_the_registry_serves_it(tmp_path):
    path = cached_checkpoint("mamba", **CONFIG)
    model = modeldsl.load(MAMBA, hf=path)
    model.save_hf(tmp_path)
    original, written = SafetensorsFile(path / "model.safetensors"), SafetensorsFile(tmp_path / "model.safetensors")
    assert sorted(written.keys()) == sorted(original.keys())
    for name in original.keys():
        np.testing.assert_array_equal(written.array(name), original.array(name), err_msg=name)
    served = modeldsl.load(hf=path)
    assert served.model.sym_name.data == "Mamba"
    np.testing.assert_array_equal(served.forward([1, 2, 3]), model.forward([1, 2, 3]))


def test_decoding_carries_the_conv_and_scan_states_and_each_step_equals_a_full_forward():
    """The prompt's run leaves each layer's conv and scan states in the cache (its padding to the
    shape bucket does not reach them); each one-token step starts from them and equals a full forward
    of the whole sequence, on the schedule and on the graph interpreter."""
    from modeldsl.runtime.executor import KVCache

    model = modeldsl.load(MAMBA, hf=cached_checkpoint("mamba", **CONFIG))
    tokens = [3, 17, 42, 5, 9, 33, 2, 61, 7]  # 9 tokens: the prompt's profile pads to 16
    step = model.decoder(16, True, "schedule")
    cache = KVCache()
    np.testing.assert_allclose(step(tokens, 0), model.forward(tokens)[-1], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(model.forward(tokens, cache, engine="graph")[-1], model.forward(tokens)[-1],
                               rtol=1e-5, atol=1e-5)
    for token in (12, 40, 8):
        tokens.append(token)
        full = model.forward(tokens)[-1]
        np.testing.assert_allclose(step(tokens, len(tokens) - 1), full, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(model.forward([token], cache, engine="graph")[-1], full, rtol=1e-5, atol=1e-5)
    assert cache.length == len(tokens)
    executor = model.schedule.profiles[(1, 1, 16)]
    states = sorted(name for name in executor.state if not name.startswith("kv"))
    assert states == ["conv0", "ssm1"]  # one of each, stacked over the layers
    assert executor.state["ssm1"].shape == (2, 1, 48, 4)  # [layers, B, d_inner, d_state]
    step(tokens[:3], 0)  # a new sequence starts from zero states
    np.testing.assert_allclose(step(tokens[:4], 3), model.forward(tokens[:4])[-1], rtol=1e-5, atol=1e-5)
