"""LoRA adapters (``mdsl-adapters``) against PEFT on transformers: logits, gradients, training."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hf_checkpoints import cached_checkpoint, transformers_model

import modeldsl
from modeldsl.resolve.imports import STD_ROOT
from modeldsl.runtime.optim import AdamWConfig
from modeldsl.runtime.train import Trainer

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")

MODULES = {"llama": "llama.module", "qwen3": "qwen.module"}
TARGETS = {"q,v": ["q_proj", "v_proj"], "all-linear": "all-linear"}


def peft_name(module: str, layer: int, role: str) -> str:
    """PEFT's parameter name of an adapter of ``module`` (``model.layers.{layer}.self_attn.q_proj``)."""
    return f"base_model.model.{module.format(layer=layer)}.lora_{role}.default.weight"


def adapters(model) -> dict[str, tuple[str, str, int | None]]:
    """Our adapter parameters: name -> (HF module template, role, layers or None)."""
    found = {}
    for param in model.model.params():
        info = param.attributes.get("adapter")
        if info is not None:
            module, role = info.data["module"].data, info.data["role"].data
            found[param.sym_name.data] = (module, role, "{layer}" in module)
    return found


def copy_into_peft(model, reference) -> None:
    """PEFT's adapters set to ours."""
    state = dict(reference.named_parameters())
    with torch.no_grad():
        for name, (module, role, stacked) in adapters(model).items():
            value = model.weights[name]
            for layer in range(value.shape[0]) if stacked else [None]:
                state[peft_name(module, layer, role)].copy_(torch.tensor(value[layer] if stacked else value))


def peft_model(path, rank: int, alpha: float, targets, rslora: bool = False):
    config = peft.LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets, lora_dropout=0.0,
                             use_rslora=rslora)
    return peft.get_peft_model(transformers_model(path), config)


def randomize_b(model, seed: int = 1) -> None:
    """Nonzero lora_B (they start at zero), so that the adapters change the logits."""
    rng = np.random.default_rng(seed)
    for name, (_, role, _) in adapters(model).items():
        if role == "B":
            np.copyto(model.weights[name], rng.standard_normal(model.weights[name].shape) * 0.1, casting="unsafe")


def shifted(tokens: np.ndarray) -> np.ndarray:
    labels = np.full_like(tokens, -100)
    labels[:, :-1] = tokens[:, 1:]
    return labels


@pytest.mark.parametrize("arch", MODULES)
@pytest.mark.parametrize("targets", TARGETS)
def test_adapted_logits_equal_peft(arch, targets):
    path = cached_checkpoint(arch, head_dim=16) if arch == "qwen3" else cached_checkpoint(arch)
    model = modeldsl.load(STD_ROOT / "models" / MODULES[arch], hf=path,
                          lora=dict(r=4, lora_alpha=8, target_modules=TARGETS[targets]))
    randomize_b(model)
    reference = peft_model(path, 4, 8, TARGETS[targets]).eval()
    copy_into_peft(model, reference)
    tokens = np.random.default_rng(0).integers(0, 64, (2, 9))
    with torch.no_grad():
        expected = reference(torch.tensor(tokens)).logits.numpy()
    ours = np.stack([model.forward(row) for row in tokens])
    np.testing.assert_allclose(ours.reshape(expected.shape), expected, rtol=1e-5, atol=1e-5)


def test_a_fresh_adapter_changes_nothing():
    """B = 0: the adapted graph computes the base's values exactly. Bitwise on the graph interpreter,
    whose GEMMs have the same shapes either way; the schedule splits the base's q/k/v GEMM into three
    (the adapted one stays one GEMM, its output split after the adds), and other GEMM shapes round
    differently on other BLAS kernels (OPENBLAS_CORETYPE=Haswell): fp32 rounding there."""
    path = cached_checkpoint("llama")
    base = modeldsl.load(STD_ROOT / "models" / "llama.module", hf=path)
    adapted = modeldsl.load(STD_ROOT / "models" / "llama.module", hf=path, lora=8)
    tokens = [3, 1, 4, 1, 5, 9, 2, 6]
    np.testing.assert_array_equal(adapted.forward(tokens, engine="graph"), base.forward(tokens, engine="graph"))
    expected = base.forward(tokens)
    np.testing.assert_allclose(adapted.forward(tokens), expected, rtol=0, atol=1e-6 * np.abs(expected).max())


@pytest.mark.parametrize("arch", MODULES)
@pytest.mark.parametrize("targets", TARGETS)
def test_training_with_adapters_equals_peft(arch, targets):
    """The A/B gradients of the first step and the losses of AdamW steps, with only the adapters trained."""
    steps = 20 if (arch, targets) == ("llama", "q,v") else 4
    path = cached_checkpoint(arch, head_dim=16) if arch == "qwen3" else cached_checkpoint(arch)
    model = modeldsl.load(STD_ROOT / "models" / MODULES[arch], hf=path,
                          lora=dict(r=4, lora_alpha=8, target_modules=TARGETS[targets]))
    reference = peft_model(path, 4, 8, TARGETS[targets]).train()
    copy_into_peft(model, reference)
    config = AdamWConfig(lr=1e-2, beta1=0.9, beta2=0.95, weight_decay=0.1, warmup_steps=0, total_steps=steps,
                         clip_norm=1.0)
    trainer = Trainer(model, config)
    assert set(trainer.optimizer.grads) == set(adapters(model))  # only the adapters get gradients and moments
    trainable = [p for p in reference.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1, foreach=False)
    import transformers

    schedule = transformers.get_cosine_schedule_with_warmup(optimizer, 0, steps)
    rng = np.random.default_rng(0)
    for step in range(steps):
        tokens = rng.integers(0, 64, (2, 8))
        ours = trainer.train_step([(tokens, shifted(tokens))])
        optimizer.zero_grad()
        loss = reference(torch.tensor(tokens), labels=torch.tensor(tokens)).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        optimizer.step()
        schedule.step()
        assert ours == pytest.approx(loss.item(), rel=1e-5), step
    trainer.sync_weights()
    state = dict(reference.named_parameters())
    for name, (module, role, stacked) in adapters(model).items():
        value = model.weights[name]
        for layer in range(value.shape[0]) if stacked else [None]:
            # per tensor, not per element: AdamW divides by sqrt(v), so an element whose gradient is
            # near zero turns fp32 rounding of the gradient (other BLAS kernels) into a step of size lr
            ours_layer = np.asarray(value[layer] if stacked else value, np.float64)
            theirs = state[peft_name(module, layer, role)].detach().numpy().astype(np.float64)
            assert np.linalg.norm(ours_layer - theirs) <= 1e-4 * np.linalg.norm(theirs), (name, layer)


def adapted_llama(targets="q,v", rank=4, alpha=8):
    path = cached_checkpoint("llama")
    model = modeldsl.load(STD_ROOT / "models" / "llama.module", hf=path,
                          lora=dict(r=rank, lora_alpha=alpha, target_modules=TARGETS[targets]))
    randomize_b(model)
    return path, model


TOKENS = np.array([[3, 1, 4, 1, 5, 9, 2, 6, 5]])


def our_logits(model) -> np.ndarray:
    return np.stack([model.forward(row) for row in TOKENS]).reshape(1, TOKENS.shape[1], -1)


@pytest.mark.parametrize("targets", TARGETS)
def test_a_saved_adapter_loads_in_peft_with_our_logits(tmp_path, targets):
    path, model = adapted_llama(targets)
    model.save_adapter(tmp_path / "adapter")
    assert sorted(p.name for p in (tmp_path / "adapter").iterdir() if not p.name.startswith(".")) == [
        "adapter_config.json", "adapter_model.safetensors"]
    reference = peft.PeftModel.from_pretrained(transformers_model(path), tmp_path / "adapter").eval()
    with torch.no_grad():
        expected = reference(torch.tensor(TOKENS)).logits.numpy()
    np.testing.assert_allclose(our_logits(model), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("targets", TARGETS)
def test_an_adapter_peft_wrote_loads_with_peft_logits(tmp_path, targets):
    path = cached_checkpoint("llama")
    torch.manual_seed(3)
    reference = peft_model(path, 4, 8, TARGETS[targets])
    with torch.no_grad():
        for name, value in reference.named_parameters():
            if "lora_B" in name:
                value.normal_(0, 0.1)
    reference.save_pretrained(tmp_path / "peft")
    model = modeldsl.load(STD_ROOT / "models" / "llama.module", hf=path, adapter=tmp_path / "peft")
    with torch.no_grad():
        expected = reference.eval()(torch.tensor(TOKENS)).logits.numpy()
    np.testing.assert_allclose(our_logits(model), expected, rtol=1e-5, atol=1e-5)


def test_a_merged_save_equals_peft_merge_and_unload(tmp_path):
    path, model = adapted_llama("all-linear")
    model.save_adapter(tmp_path / "adapter")
    model.save_hf(tmp_path / "merged")
    merged = peft.PeftModel.from_pretrained(transformers_model(path), tmp_path / "adapter").merge_and_unload()
    ours = transformers_model(tmp_path / "merged")
    theirs = dict(merged.named_parameters())
    for name, value in ours.named_parameters():
        np.testing.assert_allclose(value.detach().numpy(), theirs[name].detach().numpy(), rtol=1e-6, atol=1e-6,
                                   err_msg=name)
    plain = modeldsl.load(STD_ROOT / "models" / "llama.module", hf=tmp_path / "merged")
    np.testing.assert_allclose(our_logits(plain), our_logits(model), rtol=1e-5, atol=1e-5)


def test_an_adapter_for_another_base_is_a_coded_error_naming_the_tensor(tmp_path):
    _, model = adapted_llama()
    model.save_adapter(tmp_path / "adapter")
    other = cached_checkpoint("llama", hidden_size=48)
    with pytest.raises(modeldsl.diagnostics.DiagnosticError) as info:
        modeldsl.load(STD_ROOT / "models" / "llama.module", hf=other, adapter=tmp_path / "adapter")
    (diagnostic,) = info.value.diagnostics
    assert diagnostic.code == "E032" and "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" in \
        diagnostic.message and str(tmp_path / "adapter") in diagnostic.message


@pytest.mark.parametrize("change, code, words", [
    ({"use_dora": True}, "E030", "'use_dora' is True"),
    ({"peft_type": "IA3"}, "E030", "not a LoRA adapter"),
    ({"target_modules": ["q_proj", "w_proj"]}, "E047", "'w_proj' names no linear module"),
    ({"r": 0}, "E030", "r=0"),
])
def test_a_bad_adapter_config_is_a_coded_error(tmp_path, change, code, words):
    _, model = adapted_llama()
    model.save_adapter(tmp_path / "adapter")
    config = tmp_path / "adapter" / "adapter_config.json"
    import json

    config.write_text(json.dumps({**json.loads(config.read_text()), **change}))
    with pytest.raises(modeldsl.diagnostics.DiagnosticError) as info:
        modeldsl.load(STD_ROOT / "models" / "llama.module", hf=cached_checkpoint("llama"), adapter=tmp_path / "adapter")
    (diagnostic,) = info.value.diagnostics
    assert diagnostic.code == code and words in diagnostic.message


def test_first_step_gradients_of_the_adapters_equal_peft():
    path, model = adapted_llama("all-linear")
    reference = peft_model(path, 4, 8, TARGETS["all-linear"]).train()
    copy_into_peft(model, reference)
    trainer = Trainer(model, AdamWConfig(lr=1e-3))
    tokens = np.random.default_rng(5).integers(0, 64, (2, 8))
    trainer.accumulate(tokens, shifted(tokens))
    reference(torch.tensor(tokens), labels=torch.tensor(tokens)).loss.backward()
    state = dict(reference.named_parameters())
    from modeldsl.runtime.train import read

    for name, (module, role, stacked) in adapters(model).items():
        grad = read(trainer.optimizer.grads[name])
        for layer in range(grad.shape[0]) if stacked else [None]:
            expected = state[peft_name(module, layer, role)].grad.numpy()
            np.testing.assert_allclose(grad[layer] if stacked else grad, expected, rtol=1e-5,
                                       atol=1e-5 * np.abs(expected).max())


def fused_kernels(model) -> set[str]:
    from modeldsl.dialects.sched import LaunchOp
    from modeldsl.runtime.train import compile_training_step

    program = compile_training_step(model.model, 2, 8)
    return {op.kernel.data for op in program.walk() if isinstance(op, LaunchOp) and "fused" in op.kernel.data}


@pytest.mark.parametrize("arch", MODULES)
def test_every_fused_kernel_of_the_training_step_stays_with_adapters(arch):
    """The adapters' path is its own two GEMMs and an add: the norms, SwiGLU, RoPE and the fused
    LM-head loss fuse as they do without them."""
    path = cached_checkpoint(arch, head_dim=16) if arch == "qwen3" else cached_checkpoint(arch)
    plain = fused_kernels(modeldsl.load(STD_ROOT / "models" / MODULES[arch], hf=path))
    adapted = fused_kernels(modeldsl.load(STD_ROOT / "models" / MODULES[arch], hf=path,
                                          lora=dict(r=4, target_modules="all-linear")))
    assert {"fused_residual_rmsnorm", "fused_split_swiglu", "fused_lm_head_loss_grad"} <= plain
    assert adapted == plain


def annotated_llama(folder) -> object:
    """The std Llama with ``@adapter`` annotations: on the attention's qkv flow (q and v, rank 4,
    alpha 8) and on the MLP instance (every linear of it, rank 2, alpha 2)."""
    gqa = (STD_ROOT / "modules" / "attention" / "gqa.module").read_text()
    flow = "      x -> matmul(qkv_weight, transpose=NT) -> qkv_proj\n"
    assert gqa.count(flow) == 1
    gqa = gqa.replace(flow, flow.rstrip("\n") + " @adapter(lora, rank=4, alpha=8.0, targets=[q, v])\n")
    block = (STD_ROOT / "blocks" / "dense.module").read_text()
    block = block.replace("from std.modules.attention import GQA", "from gqa_annotated import GQA")
    instance = "    mlp: SwiGLU_MLP(d_model, d_ff, mlp_bias)\n"
    assert block.count(instance) == 1
    block = block.replace(instance, instance.rstrip("\n") + " @adapter(lora, rank=2, alpha=2.0)\n")
    llama = (STD_ROOT / "models" / "llama.module").read_text()
    llama = llama.replace("from std.blocks.dense import", "from dense_annotated import")
    for name, text in (("gqa_annotated", gqa), ("dense_annotated", block), ("llama", llama)):
        (folder / f"{name}.module").write_text(text)
    return folder / "llama.module"


def test_adapter_annotations_add_adapters_that_equal_peft_with_rank_patterns(tmp_path):
    """The annotations give each module its own rank and alpha; the saved config expresses them as
    PEFT's rank_pattern / alpha_pattern, which PEFT loads to our logits, and which loads back."""
    path = cached_checkpoint("llama")
    model = modeldsl.load(annotated_llama(tmp_path), hf=path)
    assert {m.split(".")[-1]: (role, stacked) for m, role, stacked in adapters(model).values()} == {
        "q_proj": ("B", True), "v_proj": ("B", True), "gate_proj": ("B", True), "up_proj": ("B", True),
        "down_proj": ("B", True)}
    ranks = {name: model.weights[name].shape[-2] for name, (_, role, _) in adapters(model).items() if role == "A"}
    assert sorted(ranks.values()) == [2, 2, 2, 4, 4]
    randomize_b(model)
    model.save_adapter(tmp_path / "adapter")
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"]) == (2, 2.0)
    assert config["rank_pattern"] == {"q_proj": 4, "v_proj": 4}
    assert config["alpha_pattern"] == {"q_proj": 8.0, "v_proj": 8.0}
    tokens = np.random.default_rng(0).integers(0, 64, (2, 9))
    ours = np.stack([model.forward(row) for row in tokens])
    reference = peft.PeftModel.from_pretrained(transformers_model(path), tmp_path / "adapter").eval()
    with torch.no_grad():
        expected = reference(torch.tensor(tokens)).logits.numpy()
    np.testing.assert_allclose(ours.reshape(expected.shape), expected, rtol=1e-5, atol=1e-5)
    again = modeldsl.load(STD_ROOT / "models" / "llama.module", hf=path, adapter=tmp_path / "adapter")
    np.testing.assert_array_equal(np.stack([again.forward(row) for row in tokens]), ours)


def test_a_fresh_annotated_model_trains_its_adapters_alone(tmp_path):
    model = modeldsl.load(annotated_llama(tmp_path), hf=cached_checkpoint("llama"))
    trainer = Trainer(model, AdamWConfig(lr=1e-2))
    assert sorted(trainer.optimizer.grads) == sorted(adapters(model))


def weight_gradient_gemms(model) -> int:
    """The GEMMs of the MLP's weight gradients (they read the flattened hidden and d_gate_up)."""
    from modeldsl.dialects.sched import GemmOp
    from modeldsl.runtime.train import compile_training_step

    program = compile_training_step(model.model, 2, 8)
    return sum(isinstance(op, GemmOp) and any(o.name_hint in ("hidden_2d", "d_gate_up_2d") for o in op.operands)
               for op in program.walk())


def test_a_training_step_computes_no_gradient_of_a_frozen_weight():
    """With adapters on q and v alone, the MLP's written backward would compute its weights'
    gradients: nothing reads them, so they leave it, GEMMs and all."""
    path = cached_checkpoint("llama")
    assert weight_gradient_gemms(modeldsl.load(STD_ROOT / "models" / "llama.module", hf=path)) == 2
    assert weight_gradient_gemms(modeldsl.load(STD_ROOT / "models" / "llama.module", hf=path, lora=4)) == 0
