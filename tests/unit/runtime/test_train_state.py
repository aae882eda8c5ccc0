"""The trainer's state: saved to an .npz without pickles, restored to continue bit for bit."""

from pathlib import Path

import numpy as np
import pytest

import modeldsl
from modeldsl.resolve.imports import STD_ROOT
from modeldsl.runtime.optim import AdamWConfig
from modeldsl.runtime.train import Trainer, load_training_state, save_training_state

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "tiny_llama"
LLAMA = STD_ROOT / "models" / "llama.module"
CONFIG = AdamWConfig(lr=1e-2, beta2=0.95, weight_decay=0.1, warmup_steps=1, total_steps=4, clip_norm=1.0)


def batches(count: int) -> list[list[tuple[np.ndarray, np.ndarray]]]:
    rng = np.random.default_rng(0)
    rows = [rng.integers(0, 384, (2, 9)) for _ in range(count)]
    return [[(r[:, :-1], r[:, 1:])] for r in rows]


def test_a_restored_trainer_continues_bit_for_bit(tmp_path):
    data = batches(4)
    straight = Trainer(modeldsl.load(LLAMA, hf=EXAMPLE), CONFIG)
    expected = [straight.train_step(b) for b in data]

    first = Trainer(modeldsl.load(LLAMA, hf=EXAMPLE), CONFIG)
    losses = [first.train_step(b) for b in data[:2]]
    save_training_state(tmp_path / "state.npz", first, {"note": "hi"}, {"losses": np.array(losses)})
    first.model.save_hf(tmp_path / "ckpt", dtype="fp32")

    state = load_training_state(tmp_path / "state.npz")
    assert state.config == CONFIG and state.step == 2 and state.meta == {"note": "hi"}
    assert state.arrays["losses"].tolist() == losses
    second = Trainer(modeldsl.load(LLAMA, hf=tmp_path / "ckpt"), state.config)
    second.restore(state.step, state.moments)
    losses += [second.train_step(b) for b in data[2:]]
    assert losses == expected
    moments = straight.state_arrays()
    assert set(moments) == set(second.state_arrays()) and len(moments) == 2 * len(straight.optimizer.grads)
    for name, value in moments.items():
        assert np.array_equal(value, second.state_arrays()[name]), name


def test_the_state_file_holds_no_pickles(tmp_path):
    trainer = Trainer(modeldsl.load(LLAMA, hf=EXAMPLE), CONFIG)
    trainer.train_step(batches(1)[0])
    save_training_state(tmp_path / "s.npz", trainer)
    with np.load(tmp_path / "s.npz", allow_pickle=False) as data:
        assert all(data[name].dtype != object for name in data.files)
        assert any(n.startswith("exp_avg.") for n in data.files) and "state" in data.files


@pytest.mark.parametrize("content, words", [
    (b"not a zip", "not a readable .npz"),
    (None, "not a modeldsl-training-state"),
])
def test_files_that_are_no_training_state_are_value_errors(tmp_path, content, words):
    path = tmp_path / "s.npz"
    if content is None:
        np.savez(path, state=np.array('{"format": "other"}'))
    else:
        path.write_bytes(content)
    with pytest.raises(ValueError, match=words):
        load_training_state(path)


def test_moments_of_another_model_do_not_restore():
    trainer = Trainer(modeldsl.load(LLAMA, hf=EXAMPLE), CONFIG)
    with pytest.raises(ValueError, match="no trainable parameter"):
        trainer.restore(1, {"exp_avg.nope": np.zeros(2), "exp_avg_sq.nope": np.zeros(2)})
    moments = trainer.state_arrays()
    with pytest.raises(ValueError, match="no moments 'exp_avg.embedding'"):
        trainer.restore(1, {k: v for k, v in moments.items() if k != "exp_avg.embedding"})
    with pytest.raises(ValueError, match="have shape"):
        trainer.restore(1, {**moments, "exp_avg.embedding": np.zeros(3)})
