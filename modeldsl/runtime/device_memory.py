"""The free memory of the device a training step runs on: what ``mdsl-recompute{budget=auto}`` is given.

A pass imports no runtime, so the callers (the trainer, ``mdsl-opt``) measure it here and hand it
to the pass as ``free_memory=BYTES``: the GPU's free memory where CUDA is usable, else what the
host can still allocate (:func:`modeldsl.runtime.fits.available_bytes`).
"""

from __future__ import annotations

from modeldsl.runtime.fits import available_bytes


def free_memory_bytes() -> int:
    """Free memory of the GPU where one is usable, else what the host can still allocate."""
    try:
        from modeldsl.runtime.cuda_device import make_device

        return make_device("cuda").free_bytes()
    except (RuntimeError, ImportError):
        return available_bytes()
