"""Training on the CPU schedule executor against a PyTorch AdamW loop on the transformers model."""

import numpy as np
import pytest

import modeldsl
from hf_checkpoints import make_checkpoint, transformers_model
from modeldsl.resolve.imports import STD_ROOT
from modeldsl.runtime.optim import AdamWConfig
from modeldsl.runtime.train import Trainer

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")


def shifted_labels(tokens: np.ndarray) -> np.ndarray:
    """Each position predicts the next token; the last one predicts nothing (-100), as HF shifts."""
    labels = np.full_like(tokens, -100)
    labels[:, :-1] = tokens[:, 1:]
    return labels


@pytest.mark.parametrize("arch, module, accumulate, steps", [
    ("llama", "llama.module", 1, 20),
    ("qwen3", "qwen.module", 2, 4),
])
def test_training_losses_equal_a_torch_adamw_loop(tmp_path, arch, module, accumulate, steps):
    path = make_checkpoint(tmp_path / "ckpt", arch)
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
