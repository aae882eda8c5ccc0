"""A warmed-up ``execute`` of the CPU executor allocates no arrays: every kernel writes into its
planned buffer and computes its temporaries in the workspace (tracemalloc sees numpy's allocations)."""

import numpy as np
import pytest
from cpu_kernel_harness import FEW_KB, traced_peak
from hf_checkpoints import cached_checkpoint

import modeldsl
from modeldsl.resolve.imports import STD_ROOT
from modeldsl.runtime.optim import AdamWConfig
from modeldsl.runtime.train import Trainer

CONFIG = dict(vocab_size=1024, hidden_size=64, intermediate_size=160, num_attention_heads=4, num_key_value_heads=2,
              num_hidden_layers=2, max_position_embeddings=256)


@pytest.fixture(scope="module")
def model():
    return modeldsl.load(STD_ROOT / "models" / "llama.module", hf=cached_checkpoint("llama", **CONFIG), dtype="fp32")


def test_a_training_step_allocates_nothing(model):
    trainer = Trainer(model, AdamWConfig(lr=1e-3, weight_decay=0.01, clip_norm=1.0))
    tokens = np.random.default_rng(0).integers(0, CONFIG["vocab_size"], (2, 65))
    for _ in range(2):
        trainer.train_step([(tokens[:, :-1], tokens[:, 1:])])
    step = trainer.executor(2, 64)
    inputs = (*model.inputs(tokens[:, :-1], 0), tokens[:, 1:].astype(np.int64), np.array(1.0, np.float32))
    assert traced_peak(lambda: step.execute(*inputs)) < FEW_KB
    update = (np.array([1e-3], np.float32), np.array([3], np.int64))
    assert traced_peak(lambda: trainer.optimizer.execute(*update)) < FEW_KB


def test_a_decode_step_allocates_nothing(model):
    prompt = list(range(1, 17))
    model.generate(prompt, 4)
    capacity = model.schedule.bucket(len(prompt) + 4)
    executor = model.schedule.profile(1, 1, capacity)
    position = len(prompt) + 3
    inputs = [*model.inputs(np.array([[7] * model.schedule.bucket(1)]), position),
              np.array([position], np.int32)]
    executor.execute(*inputs)
    assert traced_peak(lambda: executor.execute(*inputs)) < FEW_KB
