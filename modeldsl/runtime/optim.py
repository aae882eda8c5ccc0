"""Optimizer settings and the learning-rate schedule of training.

The update itself is a schedule-level kernel (``adamw`` in the kernel
registry); this module holds what the training loop computes per step on the
host: the learning rate (linear warmup, then cosine decay to ``min_lr_ratio``
of the peak, as transformers' ``get_cosine_schedule_with_warmup``), each
parameter's scaled learning rate and weight decay (``@trainable(lr_scale,
wd_scale)``), and the global-norm clipping factor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from modeldsl.dialects.annotations import TrainableAttr, annotations_of
from modeldsl.dialects.graph import ModelOp, ParamOp


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

    def clip_factor(self, norm: float) -> float:
        """What to multiply the gradients by so their global norm is at most ``clip_norm``
        (torch.nn.utils.clip_grad_norm_'s rule)."""
        if self.clip_norm <= 0:
            return 1.0
        return min(1.0, self.clip_norm / (norm + 1e-6))


def parameter_scales(model: ModelOp) -> dict[str, tuple[float, float]]:
    """``(lr_scale, wd_scale)`` of each parameter declared ``@trainable(...)`` (spec 7.8.2)."""
    scales = {}
    for param in (op for op in model.body.block.ops if isinstance(op, ParamOp)):
        for annotation in annotations_of(param):
            if isinstance(annotation, TrainableAttr):
                values = annotation.values
                scales[param.sym_name.data] = (float(values["lr_scale"]), float(values["wd_scale"]))
    return scales
