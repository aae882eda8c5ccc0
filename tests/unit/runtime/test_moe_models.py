"""The std Mixtral and Qwen3-MoE (sparse mixtures of experts) on tiny transformers checkpoints: gradients
against PyTorch autograd, the checkpoint written back bitwise, and the registry serving each.
(Logits, greedy generation with the KV cache and the schedule executor run in test_model and
test_sched_executor through hf_checkpoints.CASES; training steps in test_train.)"""

import numpy as np
import pytest
from hf_checkpoints import cached_checkpoint, trainer_and_autograd_gradients

import modeldsl
from modeldsl.hf.safetensors_io import SafetensorsFile
from modeldsl.resolve.imports import STD_ROOT

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

# name -> (architecture, module file, tiny config); the experts' intermediate size is d_ff in both
MODELS = {
    "Mixtral": ("mixtral", "mixtral.module", {"num_local_experts": 4, "num_experts_per_tok": 2}),
    "Qwen3Moe": ("qwen3_moe", "qwen3_moe.module", {"num_experts": 4, "num_experts_per_tok": 2,
                                                  "moe_intermediate_size": 24, "head_dim": 16}),
}


# output_router_logits: transformers adds router_aux_loss_coef times the load-balancing loss to its loss
AUX_LOSS = {"output_router_logits": True, "router_aux_loss_coef": 0.5}
# router_z_loss_coef (not a Mixtral or Qwen3-MoE field; our models read it): ST-MoE's router z-loss too
Z_LOSS = {**AUX_LOSS, "router_z_loss_coef": 0.25}
LOSSES = {"plain": {}, "aux-loss": AUX_LOSS, "z-loss": Z_LOSS}


@pytest.fixture(params=sorted(MODELS))
def moe(request):
    arch, module, config = MODELS[request.param]
    return request.param, STD_ROOT / "models" / module, cached_checkpoint(arch, **config)


@pytest.mark.parametrize("losses", sorted(LOSSES))
def test_every_expert_gradient_matches_pytorch_autograd(moe, losses):
    name, module, path = moe
    if LOSSES[losses]:
        arch, _, config = MODELS[name]
        path = cached_checkpoint(arch, **config, **LOSSES[losses])
    grads, named = trainer_and_autograd_gradients(module, path)
    d_ff = named["model.layers.0.mlp.experts.down_proj"].shape[-1]
    for layer in range(grads["blocks.mlp.router"].shape[0]):
        mlp = f"model.layers.{layer}.mlp"
        gate_up = named[f"{mlp}.experts.gate_up_proj"].grad.numpy()
        expected = {"router": named[f"{mlp}.gate.weight"].grad.numpy(), "experts_gate": gate_up[:, :d_ff],
                    "experts_up": gate_up[:, d_ff:], "experts_down": named[f"{mlp}.experts.down_proj"].grad.numpy()}
        for name, want in expected.items():
            got = grads[f"blocks.mlp.{name}"][layer]
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max(), err_msg=name)
    np.testing.assert_allclose(grads["embedding"], named["model.embed_tokens.weight"].grad.numpy(), rtol=1e-4,
                               atol=1e-6)


def test_the_checkpoint_is_written_back_bitwise(moe, tmp_path):
    _, module, path = moe
    modeldsl.load(module, hf=path).save_hf(tmp_path)
    original, written = SafetensorsFile(path / "model.safetensors"), SafetensorsFile(tmp_path / "model.safetensors")
    assert sorted(written.keys()) == sorted(original.keys())
    assert any(".experts.3." in k for k in written.keys())
    for name in original.keys():
        np.testing.assert_array_equal(written.array(name), original.array(name), err_msg=name)


def test_the_registry_serves_each_checkpoint(moe):
    name, module, path = moe
    model = modeldsl.load(hf=path)
    assert model.model.sym_name.data == name
    np.testing.assert_array_equal(model.forward([1, 2, 3]), modeldsl.load(module, hf=path).forward([1, 2, 3]))
