"""The counter-based mask of ``dropout``: element ``e`` of a launch is kept or dropped by a hash of
(seed, offset, the layers, the step, e), so the forward, a recompute and the backward regenerate the
same mask without storing it, and every backend (the numpy reference, the CPU kernel, the CUDA
kernel) draws the same.

With 32-bit unsigned arithmetic (wrapping), ``mix32`` the low-bias 32-bit integer finalizer
(``x ^= x >> 16; x *= 0x7FEB352D; x ^= x >> 15; x *= 0x846CA68B; x ^= x >> 16``, a bijection) and
``fold(h, v) = mix32(h ^ mix32(v ^ 0x9E3779B9))``::

    key = mix32(seed ^ mix32(offset ^ 0x9E3779B9))       # the op's compile-time attributes
    key = fold(key, l)  for each enclosing layer l        # outermost first: the launch's layers
    key = fold(fold(key, step mod 2^32), step >> 32)      # the step counter, read at run time
    r   = mix32((e mod 2^32) ^ key)
    keep where (r >> 8) >= threshold,  threshold = ceil(p * 2^24)

so ``(r >> 8) / 2^24`` is a uniform draw in [0, 1) of 24 bits and an element is kept with
probability 1 - p (to 2^-24). Kept elements are scaled by ``1 / (1 - p)``; ``p = 0`` (and a
launch outside training) is the identity.

The *step* is the training program's counter input (``mdsl-lower-to-sched`` gives every active
dropout launch the program's ``rng_step`` buffer; the trainer feeds it one more per micro-batch),
so each training step draws a fresh mask while its forward, recomputes and backward, which read
the same counter, draw the same. The *layers* are the layer indices of the layer loops (stacks)
around the launch, so the layers of a stack draw masks of their own; the forward and backward
loops of a layer run at the same index. The launch key (seed, offset, layers) is known when a
launch is bound; only the step is folded in where the kernel runs (the CUDA kernel reads it from
device memory, so a replayed CUDA graph draws the step's mask). numpy only: the CUDA launch plan
imports it too.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

GOLDEN = 0x9E3779B9
M1, M2 = 0x7FEB352D, 0x846CA68B
MASK32 = 0xFFFFFFFF
MASK64 = (1 << 64) - 1
UNIFORM_BITS = 24


def mix32(x: int) -> int:
    """The finalizer on one Python integer (taken mod 2^32)."""
    x &= MASK32
    x ^= x >> 16
    x = (x * M1) & MASK32
    x ^= x >> 15
    x = (x * M2) & MASK32
    return x ^ (x >> 16)


def mix32_array(x: np.ndarray) -> np.ndarray:
    """The finalizer elementwise on a uint32 array (a new array)."""
    x = x.astype(np.uint32, copy=True)
    x ^= x >> np.uint32(16)
    x *= np.uint32(M1)
    x ^= x >> np.uint32(15)
    x *= np.uint32(M2)
    x ^= x >> np.uint32(16)
    return x


def fold(h: int, value: int) -> int:
    """``h`` with one more 32-bit value mixed in."""
    return mix32((h & MASK32) ^ mix32((value & MASK32) ^ GOLDEN))


def launch_key(seed: int, offset: int, layers: Sequence[int] = ()) -> int:
    """The 32-bit key of a launch before its step: its seed and offset, then each enclosing layer."""
    key = mix32((seed & MASK32) ^ mix32((offset & MASK32) ^ GOLDEN))
    for layer in layers:
        key = fold(key, int(layer))
    return key


def step_key(launch: int, step: int) -> int:
    """A launch key with the step counter (64 bits: its low half, then its high half) folded in."""
    step &= MASK64
    return fold(fold(launch, step & MASK32), step >> 32)


def key(seed: int, offset: int, layers: Sequence[int] = (), step: int = 0) -> int:
    """The 32-bit key every element of a launch is hashed with."""
    return step_key(launch_key(seed, offset, layers), step)


def step_of(step: np.ndarray | int | None) -> int:
    """The counter a launch reads: element 0 of its ``step`` operand (an int64 ``[1]``), 0 without one."""
    if step is None:
        return 0
    return int(np.asarray(step).reshape(-1)[0]) & MASK64


def threshold(p: float) -> int:
    """The 24-bit draws below which an element is dropped: ``ceil(p * 2^24)``."""
    return math.ceil(p * (1 << UNIFORM_BITS))


def active(p: float, training: bool) -> bool:
    """Whether a launch drops anything: in training, with p > 0."""
    return bool(training) and p > 0.0


def keep_mask(n: int, p: float, launch: int, start: int = 0) -> np.ndarray:
    """Which of elements ``start .. start + n - 1`` (flat, C order) are kept under the 32-bit key
    ``launch`` (:func:`key`)."""
    index = (np.arange(start, start + n, dtype=np.uint64) & np.uint64(MASK32)).astype(np.uint32)
    draws = mix32_array(index ^ np.uint32(launch & MASK32)) >> np.uint32(32 - UNIFORM_BITS)
    return draws >= np.uint32(threshold(p))
