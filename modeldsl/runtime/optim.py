"""Optimizer settings and the learning-rate schedule of training.

The update itself is a schedule-level program (``mdsl-optimizer-step``:
``global_norm``, ``clip_factor`` and ``adamw`` launches); this module holds
its settings and what the training loop computes per step on the host: the
learning rate (linear warmup, then cosine decay to ``min_lr_ratio`` of the
peak, as transformers' ``get_cosine_schedule_with_warmup``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class AdamWConfig:
    lr: float = 3e-4
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.01
    warmup_steps: int = 0
    total_steps: int = 0  # 0: constant after warmup
    min_lr_ratio: float = 0.0
    clip_norm: float = 0.0  # 0: no clipping

    def lr_at(self, step: int) -> float:
        """The learning rate of step ``step`` (0-based), warmup then cosine."""
        if step < self.warmup_steps:
            return self.lr * step / max(1, self.warmup_steps)
        if self.total_steps <= 0:
            return self.lr
        progress = (step - self.warmup_steps) / max(1, self.total_steps - self.warmup_steps)
        cosine = 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
        return self.lr * (self.min_lr_ratio + (1.0 - self.min_lr_ratio) * cosine)
