"""The loss CPU kernels (cross-entropy, the chunked LM-head loss) give their numpy references' results
(the numpy path bitwise, the compiled one within a few ulps), on one thread and on two, allocating
nothing."""

import numpy as np
import pytest
from blas_bounds import assert_within_dot_bound
from cpu_kernel_harness import FEW_KB, allocation_peak, assert_the_reference, fast_and_reference, random

from modeldsl.kernels.cpu import cpu_kernel
from modeldsl.kernels.cpu.pool import Pool
from modeldsl.kernels.reference import REFERENCES

ROWS, WIDTH, VOCAB = 301, 40, 1000  # rows * vocab * width / 64 splits over two threads
NAMES = ["cross_entropy", "cross_entropy_backward", "fused_lm_head_loss", "fused_lm_head_loss_backward",
         "fused_lm_head_loss_grad"]
REDUCTIONS = ["mean", "sum", "none"]
ULPS = 16  # the compiled path: its exp and its sums' order, through a product over the rows


@pytest.fixture(autouse=True)
def path(kernel_path):
    """Every test on the numpy and the compiled path."""
    return kernel_path


def labels_of(rows: int, vocab: int, ignored: bool) -> np.ndarray:
    labels = np.random.default_rng(7).integers(0, vocab, rows).astype(np.int32)
    if ignored:
        labels[::3] = -100
    return labels


def operands(name, dtype, reduction="mean", rows=ROWS, vocab=VOCAB, chunk=0, ignored=True):
    """The reference's inputs of ``name`` (the lse as the forward gives it, in fp32 as a schedule holds it)."""
    labels = labels_of(rows, vocab, ignored)
    d_loss = random((rows,), np.float32, 5) if reduction == "none" else np.asarray(0.7, np.float32)
    if name.startswith("cross_entropy"):
        logits = random((rows, vocab), dtype, 4, 3.0)
        if name == "cross_entropy":
            return [logits, labels]
        lse = REFERENCES["cross_entropy"](logits, labels, reduction="none")[1].astype(np.float32)
        return [d_loss, logits, labels, lse]
    x, weight = random((rows, WIDTH), dtype, 2), random((vocab, WIDTH), dtype, 3, 0.3)
    if name == "fused_lm_head_loss":
        return [x, weight, labels]
    if name == "fused_lm_head_loss_grad":
        return [d_loss, x, weight, labels]
    lse = REFERENCES["fused_lm_head_loss"](x, weight, labels, reduction="none", chunk=chunk)[1]
    return [d_loss, x, weight, labels, lse.astype(np.float32)]


def params_of(name, reduction, chunk):
    params = {"reduction": reduction, "ignore_index": -100}
    return {**params, "chunk": chunk} if name.startswith("fused") else params


def assert_reference(outputs, expected, path):
    for got, want in zip(outputs, expected):
        assert_the_reference(np.asarray(got), np.asarray(want), path, ULPS)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("name", NAMES)
def test_the_reference(name, reduction, dtype, threads, path):
    chunk = 77  # does not divide the rows
    outputs, expected, _ = fast_and_reference(name, operands(name, dtype, reduction, chunk=chunk),
                                              params_of(name, reduction, chunk), threads=threads)
    assert_reference(outputs, expected, path)


@pytest.mark.parametrize("chunk", [0, 1, 64, 300, 1000])
@pytest.mark.parametrize("name", ["fused_lm_head_loss", "fused_lm_head_loss_grad"])
def test_every_chunking_on_one_thread_is_the_reference(name, chunk, path):
    outputs, expected, _ = fast_and_reference(name, operands(name, np.float32, chunk=chunk),
                                              params_of(name, "mean", chunk))
    assert_reference(outputs, expected, path)


def test_no_counted_row_gives_a_nan_mean_as_the_reference(path):
    inputs = operands("fused_lm_head_loss_grad", np.float32, rows=20, vocab=50)
    inputs[3][:] = -100
    with np.errstate(invalid="ignore"):
        outputs, expected, _ = fast_and_reference("fused_lm_head_loss_grad", inputs, {})
    assert np.isnan(outputs[0]) and np.isnan(expected[0])
    assert_the_reference(outputs[1], expected[1], path)


def test_two_threads_are_bitwise_the_same_run_to_run():
    inputs = operands("fused_lm_head_loss_grad", np.float32, chunk=64)
    first, _, step = fast_and_reference("fused_lm_head_loss_grad", inputs, {"chunk": 64}, threads=2)
    again = [a.copy() for a in first]
    step()
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)


def test_the_backward_may_write_over_its_logits(path):
    d_loss, logits, labels, lse = operands("cross_entropy_backward", np.float32)
    expected = REFERENCES["cross_entropy_backward"](d_loss, logits, labels, lse)
    pool = Pool(2)
    step = cpu_kernel("cross_entropy_backward")(pool, [logits], [d_loss, logits, labels, lse], {})
    pool.workspace.prepare()
    step()
    assert_the_reference(logits, expected, path, ULPS)


@pytest.mark.parametrize("name", NAMES)
def test_a_warm_call_allocates_nothing(name):
    _, _, step = fast_and_reference(name, operands(name, np.float32, chunk=64), params_of(name, "mean", 64),
                                    threads=2)
    assert allocation_peak(step) < FEW_KB


def test_bf16_operands_and_unknown_reductions_get_no_fast_step():
    import ml_dtypes
    x, weight, labels = operands("fused_lm_head_loss", np.float32)
    outputs = [np.zeros((), np.float32), np.zeros(ROWS, np.float32)]
    kernel = cpu_kernel("fused_lm_head_loss")
    bf16 = [x.astype(ml_dtypes.bfloat16), weight.astype(ml_dtypes.bfloat16), labels]
    assert kernel(Pool(1), outputs, bf16, {}) is None
    assert kernel(Pool(1), outputs, [x, weight, labels], {"reduction": "max"}) is None


def d_weight_magnitude(d_loss, x, weight, labels) -> np.ndarray:
    """``|d_logits|^T |x|`` in float64 (the mean's scale): the sums of the absolute values of the
    terms of d_weight's dots over the rows."""
    x, weight = x.astype(np.float64), weight.astype(np.float64)
    logits = x @ weight.T
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    valid = labels != -100
    probs[np.flatnonzero(valid), labels[valid]] -= 1
    d_logits = probs * (valid * float(d_loss) / valid.sum())[:, None]
    return np.abs(d_logits).T @ np.abs(x)


def test_d_weight_in_small_tiles_is_the_whole_slices(monkeypatch, path):
    """Two threads, several chunks: tiling the vocabulary slices changes only d_weight's BLAS
    shapes (so, on some CPUs' kernels, its sums' order); the loss and d_x keep their bits."""
    from modeldsl.kernels.cpu import loss

    inputs = operands("fused_lm_head_loss_grad", np.float32, chunk=64)
    whole, expected, _ = fast_and_reference("fused_lm_head_loss_grad", inputs, {"chunk": 64}, threads=2)
    monkeypatch.setattr(loss, "WEIGHT_TILE", 7 * WIDTH)
    tiled, _, _ = fast_and_reference("fused_lm_head_loss_grad", inputs, {"chunk": 64}, threads=2)
    (loss_whole, d_x_whole, d_weight_whole), (loss_tiled, d_x_tiled, d_weight_tiled) = whole, tiled
    np.testing.assert_array_equal(loss_whole, loss_tiled)
    np.testing.assert_array_equal(d_x_whole, d_x_tiled)
    assert_within_dot_bound(d_weight_tiled, d_weight_whole, d_weight_magnitude(*inputs), length=ROWS)
    assert_reference(whole, expected, path)
