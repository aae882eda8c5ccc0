"""``@trainable(grad_clip=C)`` (spec 7.8.2) in ``mdsl-optimizer-step``: each such parameter's gradient
is clipped on its own, as ``torch.nn.utils.clip_grad_norm_([p], C)`` (a stacked block's parameter
layer by layer: each layer's tensor is a parameter), before the global norm and its clipping; three
AdamW steps equal a torch loop doing the same, on the CPU executor and on the emulated CUDA device."""

from __future__ import annotations

import numpy as np
import pytest
from xdsl.context import Context

import modeldsl
from modeldsl.dialects.sched import ProgramOp
from modeldsl.passes.optimizer_step import OptimizerStepPass
from modeldsl.runtime.profiles import plan
from modeldsl.runtime.sched_executor import ScheduleExecutor

torch = pytest.importorskip("torch")

SOURCE = """block Blk(d: int = 4):
  params:
    w: [d, d, fp32] @trainable(grad_clip=0.5)
  forward:
    in: x: [2, d, fp32]
    out: [2, d, fp32]
    graph:
      x -> matmul(w, transpose=NT) -> h
      (x, h) -> add() -> out

model M(d: int = 4, n: int = 3):
  params:
    blocks: [n] x Blk(d)
    e: [d, d, fp32] @trainable(grad_clip=1.0, lr_scale=0.5)
    u: [d, fp32]
  forward:
    in: x: [2, d, fp32]
    out: [2, d, fp32]
    graph:
      x -> matmul(e, transpose=NT) -> y
      y -> blocks -> z
      (z, u) -> bias_add() -> out
"""


def optimizer_program(tmp_path, clip_norm: float) -> ProgramOp:
    (tmp_path / "m.module").write_text(SOURCE)
    model = modeldsl.load(tmp_path / "m.module").model
    module = model.parent_op()
    OptimizerStepPass(weight_decay=0.1, clip_norm=clip_norm).apply(Context(), module)
    program = next(op for op in module.body.block.ops if isinstance(op, ProgramOp))
    program.detach()
    return plan(program)


@pytest.mark.parametrize("device", ["cpu", "emulated"])
@pytest.mark.parametrize("clip_norm", [0.0, 2.0])
def test_three_steps_equal_a_torch_loop_clipping_each_parameter(tmp_path, clip_norm, device):
    program = optimizer_program(tmp_path, clip_norm)
    kernels = [op.kernel.data for op in program.walk() if op.name == "mdsl.sched.launch"]
    assert kernels.count("global_norm") == 3 + 1 + 1  # each layer of blocks.w, e, then all
    rng = np.random.default_rng(11)
    start = {"blocks.w": rng.standard_normal((3, 4, 4)), "e": rng.standard_normal((4, 4)), "u": rng.standard_normal(4)}
    start = {k: v.astype(np.float32) for k, v in start.items()}
    if device == "cpu":
        executor = ScheduleExecutor(program, start)
    else:
        from modeldsl.runtime.cuda_device import EmulatedDevice
        from modeldsl.runtime.cuda_executor import CudaExecutor

        executor = CudaExecutor(program, start, device=EmulatedDevice())
        assert executor.fallbacks == []
    layers = [torch.nn.Parameter(torch.tensor(w)) for w in start["blocks.w"]]
    e, u = torch.nn.Parameter(torch.tensor(start["e"])), torch.nn.Parameter(torch.tensor(start["u"]))
    optimizer = torch.optim.AdamW([{"params": [*layers, u], "lr": 1e-2}, {"params": [e], "lr": 0.5e-2}],
                                  weight_decay=0.1, foreach=False)
    for step in range(1, 4):
        grads = {k: (rng.standard_normal(v.shape) * 3).astype(np.float32) for k, v in start.items()}
        for name, grad in grads.items():
            if device == "cpu":
                executor.grads[name][...] = grad
            else:
                executor.grads[name].write(grad)
        for layer, grad in zip(layers, grads["blocks.w"]):
            layer.grad = torch.tensor(grad)
            torch.nn.utils.clip_grad_norm_([layer], 0.5)
        e.grad, u.grad = torch.tensor(grads["e"]), torch.tensor(grads["u"])
        torch.nn.utils.clip_grad_norm_([e], 1.0)
        expected_norm = float(torch.nn.utils.clip_grad_norm_([*layers, e, u], clip_norm or float("inf")))
        optimizer.step()
        (norm,) = executor.execute(np.array([1e-2], np.float32), np.array([step]))
        assert float(norm) == pytest.approx(expected_norm, rel=1e-6)
        params = executor.params if device == "cpu" else {k: v.read() for k, v in executor.params.items()}
        np.testing.assert_allclose(params["blocks.w"], np.stack([p.detach().numpy() for p in layers]),
                                   rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(params["e"], e.detach().numpy(), rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(params["u"], u.detach().numpy(), rtol=1e-6, atol=1e-7)
