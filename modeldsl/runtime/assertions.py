"""The runtime checks of ``@assert`` (spec 7.7.1): what the executors do with an ``mdsl.sched.assert``.

The CPU executor checks the buffer's numpy view where the op stands; the CUDA executor copies
the buffer to the host there (so a program with an assertion is not captured as a CUDA graph).
A failed check raises :class:`AssertionFailed` (E046): the annotation's message, the tensor, the
check that does not hold, the layer of each enclosing layer loop, and where the training step
ran it, the step and the micro-batch (:meth:`AssertionFailed.in_training_step`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from modeldsl.diagnostics import Diagnostic, DiagnosticError
from modeldsl.dialects.sched import AssertOp
from modeldsl.runtime.executor import ExecutionError

CODE = "E046"


class AssertionFailed(DiagnosticError, ExecutionError):
    """An ``@assert`` whose check does not hold at run time (E046)."""

    def __init__(self, op: AssertOp, layers: Sequence[int] = (), step: int | None = None,
                 micro_batch: int | None = None):
        self.op, self.layers, self.step, self.micro_batch = op, tuple(layers), step, micro_batch
        self.tensor = op.tensor.data
        self.message = op.message.data or "assertion failed"
        self.condition = op.attributes["condition"].data if "condition" in op.attributes else op.checks().text
        super().__init__([Diagnostic(CODE, self.text(), None, f"the condition: {self.condition}")])

    def text(self) -> str:
        where = [f"tensor '{self.tensor}': {self.op.checks().text} does not hold"]
        if self.layers:
            where.append(f"in layer {self.layers[0]}" if len(self.layers) == 1 else
                         f"in layers {', '.join(map(str, self.layers))} (outermost first)")
        if self.step is not None:
            where.append(f"at training step {self.step}" +
                         (f", micro-batch {self.micro_batch}" if self.micro_batch is not None else ""))
        if "at" in self.op.attributes:
            where.append(f"asserted at {self.op.attributes['at'].data}")
        return f"@assert failed: {self.message} ({'; '.join(where)})"

    def in_training_step(self, step: int, micro_batch: int | None = None) -> AssertionFailed:
        """The same failure, naming the training step (1-based) and micro-batch (0-based) it ran in."""
        return AssertionFailed(self.op, self.layers, step, micro_batch)


def check(op: AssertOp, values: np.ndarray, layers: Sequence[int] = ()) -> None:
    """Raise :class:`AssertionFailed` unless the check of ``op`` holds for ``values``."""
    if not op.checks().holds(values):
        raise AssertionFailed(op, layers)
