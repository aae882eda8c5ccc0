"""Training on the CPU schedule executor against a PyTorch AdamW loop on the transformers model."""

from pathlib import Path

import numpy as np
import pytest
from hf_checkpoints import make_checkpoint, transformers_model

import modeldsl
from modeldsl.resolve.imports import STD_ROOT
from modeldsl.runtime.optim import AdamWConfig
from modeldsl.runtime.train import Trainer

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "tiny_llama"

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")


def shifted_labels(tokens: np.ndarray) -> np.ndarray:
    """Each position predicts the next token; the last one predicts nothing (-100), as HF shifts."""
    labels = np.full_like(tokens, -100)
    labels[:, :-1] = tokens[:, 1:]
    return labels


@pytest.mark.parametrize("arch, module, accumulate, steps, config", [
    ("llama", "llama.module", 1, 20, {}),
    ("qwen3", "qwen.module", 2, 4, {}),
    ("llama", "llama.module", 2, 4, {"tie_word_embeddings": True}),  # one gradient from two uses
    ("mixtral", "mixtral.module", 1, 4, {"num_local_experts": 4, "num_experts_per_tok": 2}),  # sparse experts
    ("qwen3_moe", "qwen3_moe.module", 1, 3, {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 24,
                                             "head_dim": 16, "norm_topk_prob": True}),
    ("mamba", "mamba.module", 1, 3, {"state_size": 4, "expand": 2, "conv_kernel": 4, "time_step_rank": 2}),
    # Gemma 2 with softcaps, Gemma 3 with a group of six and a tail; no pad id (nn.Embedding(padding_idx) would
    # give that row no gradient)
    ("gemma2", "gemma2.module", 1, 3, {"num_hidden_layers": 3, "head_dim": 8, "sliding_window": 5,
                                       "attn_logit_softcapping": 2.0, "final_logit_softcapping": 3.0,
                                       "pad_token_id": None}),
    ("gemma3", "gemma3.module", 1, 3, {"num_hidden_layers": 7, "head_dim": 8, "sliding_window": 5,
                                       "pad_token_id": None}),
])
def test_training_losses_equal_a_torch_adamw_loop(tmp_path, arch, module, accumulate, steps, config):
    path = make_checkpoint(tmp_path / "ckpt", arch, **config)
    model = modeldsl.load(STD_ROOT / "models" / module, hf=path)
    reference = transformers_model(path).train()
    config = AdamWConfig(lr=1e-3, beta1=0.9, beta2=0.95, weight_decay=0.1, warmup_steps=2, total_steps=steps,
                         clip_norm=1.0)
    trainer = Trainer(model, config)
    optimizer = torch.optim.AdamW(reference.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1,
                                  foreach=False)
    import transformers

    schedule = transformers.get_cosine_schedule_with_warmup(optimizer, 2, steps)
    rng = np.random.default_rng(0)
    for step in range(steps):
        micro = [rng.integers(0, 64, (2, 8)) for _ in range(accumulate)]
        ours = trainer.train_step([(tokens, shifted_labels(tokens)) for tokens in micro])
        optimizer.zero_grad()
        losses = []
        for tokens in micro:
            loss = reference(torch.tensor(tokens), labels=torch.tensor(tokens)).loss
            (loss / accumulate).backward()
            losses.append(loss.item())
        torch.nn.utils.clip_grad_norm_(reference.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        assert ours == pytest.approx(np.mean(losses), rel=1e-4), step


def test_trainable_scales_the_learning_rate_and_weight_decay_of_a_parameter(tmp_path):
    """@trainable(lr_scale=0) freezes a parameter's update; the other one moves."""
    (tmp_path / "m.module").write_text("""model M(vocab: int = 16, d: int = 8):
  params:
    embedding: [vocab, d] @trainable(lr_scale=0.0, wd_scale=0.0)
    head: [vocab, d]
  forward:
    in: tokens: [B, T, int32]
    out: [B, T, vocab]
    graph:
      (tokens, embedding) -> embedding() -> x
      x -> matmul(head, transpose=NT) -> out
""")
    model = modeldsl.load(tmp_path / "m.module")
    before = {k: np.array(v) for k, v in model.weights.items()}
    trainer = Trainer(model, AdamWConfig(lr=1e-2, weight_decay=0.1))
    tokens = np.random.default_rng(0).integers(0, 16, (2, 6))
    trainer.train_step([(tokens, shifted_labels(tokens))])
    np.testing.assert_array_equal(model.weights["embedding"], before["embedding"])
    assert np.abs(model.weights["head"] - before["head"]).max() > 1e-4


def test_micro_batch_gradients_accumulate_in_the_grads_arena():
    """Two micro-batches weighted 1/2 leave the mean of their gradients (from the graph interpreter
    running @train_loss_grad) in the grads arena; the optimizer step reads and zeroes them."""
    from xdsl.context import Context
    from xdsl.dialects.builtin import ModuleOp

    from modeldsl.passes.attach_loss import add_loss_function
    from modeldsl.passes.autodiff import gradient_function
    from modeldsl.passes.specialize import SpecializePass
    from modeldsl.runtime.executor import GraphExecutor

    model = modeldsl.load(STD_ROOT / "models" / "llama.module", hf=EXAMPLE)
    trainer = Trainer(model, AdamWConfig(lr=1e-3))
    module = ModuleOp([model.model.clone()])
    SpecializePass.of(B=2, T=8).apply(Context(), module)
    graph = next(iter(module.body.block.ops))
    add_loss_function(graph)
    names = [a.data for a in gradient_function(graph, "train_loss").attributes["grads"].data]
    oracle = GraphExecutor(graph, dict(model.weights), np.float32)
    rng = np.random.default_rng(3)
    expected: dict[str, np.ndarray] = {}
    for _ in range(2):
        tokens = rng.integers(0, 384, (2, 8))
        labels = shifted_labels(tokens)
        trainer.accumulate(tokens, labels, 0.5)
        results = oracle.run("train_loss_grad", *model.inputs(tokens, 0), labels, np.float32(0.5))
        for name, grad in zip(names, results[1:]):
            expected[name] = expected.get(name, 0) + grad
    grads = trainer.optimizer.grads
    assert set(grads) == set(names)
    for name in names:
        np.testing.assert_allclose(grads[name], expected[name], rtol=1e-5, atol=1e-6 * np.abs(expected[name]).max(),
                                   err_msg=name)
    (norm,) = trainer.optimizer.execute(np.array([1e-3], np.float32), np.array([1]))
    assert float(norm) == pytest.approx(np.sqrt(sum(np.sum(np.square(g)) for g in expected.values())), rel=1e-5)
    assert all(not g.any() for g in grads.values())


def test_bf16_mixed_precision_follows_fp32_training_through_fp32_masters():
    """bf16 weights and activations, fp32 masters and moments: 8 steps within 1e-3 of the fp32
    losses; the bf16 weights are the rounded masters, and sync_weights hands the masters over."""
    config = AdamWConfig(lr=3e-3, warmup_steps=2, total_steps=8, clip_norm=1.0)
    rows = np.random.default_rng(5).integers(0, 384, (8, 2, 17))
    losses = {}
    for dtype in ("fp32", "bf16"):
        model = modeldsl.load(STD_ROOT / "models" / "llama.module", hf=EXAMPLE)
        trainer = Trainer(model, config, dtype=dtype)
        losses[dtype] = np.array([trainer.train_step([(r[:, :-1], r[:, 1:])]) for r in rows])
    np.testing.assert_allclose(losses["bf16"], losses["fp32"], rtol=1e-3)
    assert not np.array_equal(losses["bf16"], losses["fp32"])  # it did run in bf16
    masters, params = trainer.optimizer.masters, trainer.optimizer.params
    assert set(masters) == set(trainer.optimizer.grads) and all(m.dtype == np.float32 for m in masters.values())
    for name, master in masters.items():
        assert params[name].dtype.name == "bfloat16"
        np.testing.assert_array_equal(params[name], master.astype(params[name].dtype), err_msg=name)
    before = np.array(model.weights["lm_head"])
    trainer.sync_weights()
    np.testing.assert_array_equal(model.weights["lm_head"], masters["lm_head"])
    assert not np.array_equal(before, masters["lm_head"])


def test_a_model_loaded_in_bf16_is_refused_for_training():
    from modeldsl.runtime.executor import ExecutionError

    model = modeldsl.load(STD_ROOT / "models" / "llama.module", hf=EXAMPLE, dtype="bf16")
    with pytest.raises(ExecutionError, match="load it in fp32"):
        Trainer(model)


def test_training_warns_of_the_config_fields_it_does_not_apply(tmp_path):
    """Dropout and the router's jitter noise change only transformers' training mode: a run trains without
    them, and says so (W007 at the field); fields at 0 say nothing."""
    from modeldsl.hf.compat import DiagnosticWarning

    path = make_checkpoint(tmp_path / "ckpt", "llama", attention_dropout=0.1)
    model = modeldsl.load(STD_ROOT / "models" / "llama.module", hf=path)
    seen = []
    Trainer(model, warn=seen.append)
    assert [(d.code, d.span.text) for d in seen] == [("W007", '"attention_dropout"')]
    assert "dropout of the attention probabilities" in seen[0].message
    with pytest.warns(DiagnosticWarning, match="attention_dropout"):
        Trainer(model)
    quiet = []
    Trainer(modeldsl.load(STD_ROOT / "models" / "llama.module", hf=EXAMPLE), warn=quiet.append)
    assert quiet == []
