"""Training on instruction data: the loss is on the target tokens alone, so a padded batch of
examples gives the loss and gradients of the examples run one by one, weighted by their targets."""

import numpy as np
from hf_checkpoints import cached_checkpoint

import modeldsl
from modeldsl.resolve.imports import STD_ROOT
from modeldsl.runtime.instructions import Example, InstructionBatches, label_count
from modeldsl.runtime.train import compile_training_step

SEQ = 12


def step(model, tokens: np.ndarray, labels: np.ndarray) -> tuple[float, np.ndarray]:
    """(loss, gradients) of one fp32 training step on ``tokens`` and ``labels``."""
    executor = model.schedule.executor(compile_training_step(model.model, *tokens.shape))
    executor.arenas["grads"][:] = 0
    (loss, *_) = executor.execute(*model.inputs(tokens.astype(np.int32), 0), labels.astype(np.int64),
                                  np.array(1.0, dtype=np.float32))
    return float(loss), executor.arenas["grads"].copy().view(np.float32).astype(np.float64)


def examples() -> list[Example]:
    rng = np.random.default_rng(3)
    made = []
    for length, prompt in ((7, 4), (10, 5), (15, 6)):
        mask = np.zeros(length, bool)
        mask[prompt:] = True
        made.append(Example(rng.integers(0, 64, length), mask))
    return made


def test_a_padded_batch_gives_the_target_weighted_loss_and_gradients_of_its_examples():
    model = modeldsl.load(STD_ROOT / "models" / "llama.module", hf=cached_checkpoint("llama"), dtype="fp32",
                          lora=dict(r=4, target_modules="all-linear"))
    for name in [p.sym_name.data for p in model.model.params() if p.is_adapter]:
        weight = model.weights[name]
        np.copyto(weight, np.random.default_rng(len(name)).standard_normal(weight.shape) * 0.1, casting="unsafe")
    batch = InstructionBatches(examples(), SEQ, "padded", pad=0).next_batch(3)
    assert (batch.labels[0, 7:] == -100).all() and (batch.labels[0, :3] == -100).all()  # pads and prompt ignored
    loss, grads = step(model, batch.inputs, batch.labels)
    counts = [label_count(batch.labels[i]) for i in range(3)]
    assert counts == [3, 5, 7]  # the targets after the first token; the third example cut at SEQ + 1 tokens
    alone = [step(model, batch.inputs[i:i + 1], batch.labels[i:i + 1]) for i in range(3)]
    expected_loss = sum(n * loss_i for n, (loss_i, _) in zip(counts, alone)) / sum(counts)
    expected_grads = sum(n * g for n, (_, g) in zip(counts, alone)) / sum(counts)
    assert abs(loss - expected_loss) <= 1e-6 * abs(expected_loss)
    assert np.abs(grads).max() > 0
    np.testing.assert_allclose(grads, expected_grads, rtol=1e-6, atol=1e-6 * np.abs(expected_grads).max())


def test_a_packed_row_gives_the_target_weighted_loss_and_gradients_of_its_examples():
    """Packed: the examples share a row, each attending to itself alone at positions from 0; the
    row's loss and gradients are those of the examples run one by one, weighted by their targets."""
    from modeldsl.runtime.rope import packed_inputs

    model = modeldsl.load(STD_ROOT / "models" / "llama.module", hf=cached_checkpoint("llama"), dtype="fp32")
    short = examples()[:2]  # 7 + 10 tokens in one row of SEQ + 1 = 21
    batch = InstructionBatches(short, 20, "packed", pad=0).next_batch(1)
    assert batch.segments[0].tolist() == [0] * 7 + [1] * 10 + [2] * 3
    assert batch.positions[0].tolist() == [*range(7), *range(10), *range(3)]
    executor = model.schedule.executor(compile_training_step(model.model, 1, 20, packed=True))
    executor.arenas["grads"][:] = 0
    (loss, *_) = executor.execute(*packed_inputs(model, batch.inputs, batch.segments, batch.positions),
                                  batch.labels.astype(np.int64), np.array(1.0, dtype=np.float32))
    grads = executor.arenas["grads"].copy().view(np.float32).astype(np.float64)
    alone = [InstructionBatches([e], 20, "padded", pad=0).next_batch(1) for e in short]
    results = [step(model, b.inputs, b.labels) for b in alone]
    counts = [label_count(b) for b in alone]
    assert sum(counts) == label_count(batch)
    expected_loss = sum(n * loss_i for n, (loss_i, _) in zip(counts, results)) / sum(counts)
    expected_grads = sum(n * g for n, (_, g) in zip(counts, results)) / sum(counts)
    assert abs(float(loss) - expected_loss) <= 1e-6 * abs(expected_loss)
    np.testing.assert_allclose(grads, expected_grads, rtol=0, atol=1e-6 * np.abs(expected_grads).max())
