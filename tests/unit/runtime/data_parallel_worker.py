"""One rank of the data-parallel tests (tests/unit/runtime/test_data_parallel.py), started by mpiexec
or alone: ``python data_parallel_worker.py OUT DP [--tp TP] [--zero] [--accum K] [--die-at STEP]``.

Trains the bundled tiny Llama on the bundled corpus (batch 4, seq 16, 10 AdamW steps; with ``DP``
ranks each takes 4 / DP rows of every batch) after recording the first step's gradient of every
parameter (one accumulate of the first batch, before any update), and writes from rank 0 the
gradients' file (``OUT.npz``) and the losses, gradient norms and final weights' sums (``OUT.json``).
``--accum K``: K micro-batches of 4 / K rows per step (their gradients summed over the ranks at the
last). ``--tp TP``: TP tensor-parallel ranks too (DP * TP processes, each holding its share of the
heads and of the MLP), the gradients and weights gathered whole before they are written.
``--zero``: ZeRO-1 (the AdamW moments shared out over the ranks). Every run is saved into
``OUT.save`` (under ZeRO-1 every rank gathers the moments, on tensor-parallel ranks every share;
rank 0 writes), and the logits of a first sequence go to ``OUT.logits.npy`` (before training) and
``OUT.final_logits.npy`` (after). ``--die-at STEP``: rank 1 ends itself hard (no MPI finalize)
before that step, as a killed rank.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np

import modeldsl
from modeldsl.runtime.tensor_parallel import whole_arrays

ROOT = Path(__file__).resolve().parents[3]
STEPS, BATCH, SEQ = 10, 4, 16


def main(out: str, dp: int, tp: int, zero: bool, accum: int, die_at: int | None) -> None:
    run = modeldsl.train(ROOT / "examples" / "tiny_llama", ROOT / "examples" / "tiny_corpus.txt", steps=STEPS,
                         batch=BATCH // accum, seq=SEQ, lr=1e-3, dp=dp, zero=zero, grad_accum=accum, tp=tp)
    logits = run.model.forward(np.arange(SEQ, dtype=np.int32)[None, :] % 300)
    gradients = whole(run, first_gradients(run))
    losses, norms = [], []
    for step in range(STEPS):
        if die_at is not None and step + 1 == die_at and run.rank == 1:
            os._exit(3)
        info = run.step()
        losses.append(info.loss)
        norms.append(info.grad_norm)
    run.save(out + ".save")
    final = run.model.forward(np.arange(SEQ, dtype=np.int32)[None, :] % 300)
    trained = whole(run, run.model.weights)
    if run.rank == 0:
        weights = {name: float(np.asarray(value, dtype=np.float64).sum()) for name, value in trained.items()}
        np.savez(out + ".npz", **gradients)
        np.save(out + ".logits.npy", logits)
        np.save(out + ".final_logits.npy", final)
        Path(out + ".json").write_text(json.dumps({"losses": losses, "norms": norms, "weights": weights}))


def whole(run, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The whole model's arrays from this tensor-parallel rank's shares (every rank's the same)."""
    return whole_arrays(run.model.model, run.model.record, arrays, run.tp)


def first_gradients(run) -> dict[str, np.ndarray]:
    """Every parameter's gradient of the run's first batch (summed over the ranks), the grads arena
    zeroed again after: the run then starts from where it was."""
    trainer = run.trainer
    batch = next(iter(run.data.batches(run.seq).micro_batches(run.batch, 1)))
    tokens, labels = run.rows(batch)
    trainer.accumulate(tokens, labels, 1.0 / run.dp)
    found = {name: np.array(view) for name, view in trainer.optimizer.grads.items()}
    trainer.optimizer.arenas["grads"][:] = 0
    return found


if __name__ == "__main__":
    arguments = sys.argv[1:]
    die = int(arguments[arguments.index("--die-at") + 1]) if "--die-at" in arguments else None
    accum = int(arguments[arguments.index("--accum") + 1]) if "--accum" in arguments else 1
    tensor = int(arguments[arguments.index("--tp") + 1]) if "--tp" in arguments else 1
    main(arguments[0], int(arguments[1]), tensor, "--zero" in arguments, accum, die)
