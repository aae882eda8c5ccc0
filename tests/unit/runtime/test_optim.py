"""The learning-rate schedule and clipping rule against transformers and torch."""

import numpy as np
import pytest

from modeldsl.runtime.optim import AdamWConfig

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("warmup, total", [(0, 20), (5, 20), (3, 0)])
def test_the_schedule_is_transformers_cosine_with_warmup(warmup, total):
    config = AdamWConfig(lr=1e-3, warmup_steps=warmup, total_steps=total)
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
    if total:
        scheduler = transformers.get_cosine_schedule_with_warmup(optimizer, warmup, total)
    else:
        scheduler = transformers.get_constant_schedule_with_warmup(optimizer, warmup)
    for step in range(total + 1 if total else 25):  # past total_steps transformers turns back up; we stay at the minimum
        assert config.lr_at(step) == pytest.approx(scheduler.get_last_lr()[0], rel=1e-12, abs=1e-15), step
        optimizer.step()
        scheduler.step()


def test_clipping_scales_like_torch_clip_grad_norm():
    grads = [torch.tensor(np.random.default_rng(0).standard_normal((4, 4)))]
    norm = float(torch.linalg.vector_norm(grads[0]))
    param = torch.nn.Parameter(torch.zeros(4, 4, dtype=torch.float64))
    param.grad = grads[0].clone()
    torch.nn.utils.clip_grad_norm_([param], max_norm=1.0)
    factor = AdamWConfig(clip_norm=1.0).clip_factor(norm)
    np.testing.assert_allclose(grads[0].numpy() * factor, param.grad.numpy(), rtol=1e-12)
    assert AdamWConfig(clip_norm=100.0).clip_factor(norm) == 1.0 and AdamWConfig().clip_factor(norm) == 1.0


def test_trainable_annotations_give_per_parameter_scales(tmp_path):
    import modeldsl
    from modeldsl.runtime.optim import parameter_scales

    (tmp_path / "m.module").write_text("""model M(d: int = 4):
  params:
    w: [d, d] @trainable(lr_scale=0.5, wd_scale=0.0)
    v: [d, d]
  forward:
    in: x: [2, d, fp32]
    out: [2, d]
    graph:
      x -> matmul(w, transpose=NT) -> h
      h -> matmul(v, transpose=NT) -> out
""")
    assert parameter_scales(modeldsl.load(tmp_path / "m.module").model) == {"w": (0.5, 0.0)}
