"""The learning-rate schedule and clipping rule against transformers and torch."""

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
    # past total_steps transformers turns back up; we stay at the minimum
    for step in range(total + 1 if total else 25):
        assert config.lr_at(step) == pytest.approx(scheduler.get_last_lr()[0], rel=1e-12, abs=1e-15), step
        optimizer.step()
        scheduler.step()


def test_trainable_annotations_give_per_parameter_scales(tmp_path):
    import modeldsl
    from modeldsl.passes.optimizer_step import parameter_scales

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
