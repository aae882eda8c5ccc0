"""mdsl-optimizer-step's program against torch.optim.AdamW with clipping and per-parameter groups."""

import numpy as np
import pytest
from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp

from modeldsl.dialects.sched import ProgramOp
from modeldsl.ir import make_context, parse_module
from modeldsl.passes.optimizer_step import OptimizerStepPass
from modeldsl.runtime.profiles import plan
from modeldsl.runtime.sched_executor import ScheduleExecutor

torch = pytest.importorskip("torch")

MODEL = """
mdsl.graph.model @m config {} {
  mdsl.graph.param @f : !mdsl.graph.tensor<[3, 4], fp32> {annotations = [#mdsl.graph.frozen]}
  mdsl.graph.param @w : !mdsl.graph.tensor<[3, 4], fp32>
  mdsl.graph.param @t : !mdsl.graph.tensor<[5], fp32>
      {annotations = [#mdsl.graph.trainable<lr_scale = 0.5, wd_scale = 0.0>]}
}
"""


def model_module() -> ModuleOp:
    return parse_module(make_context(), MODEL)[0]


def optimizer_step(**options) -> ProgramOp:
    module = model_module()
    OptimizerStepPass(**options).apply(Context(), module)
    program = next(op for op in module.body.block.ops if isinstance(op, ProgramOp))
    program.detach()
    return plan(program)


@pytest.mark.parametrize("clip_norm", [0.0, 0.5])
def test_three_steps_equal_torch_adamw_with_param_groups(clip_norm):
    rng = np.random.default_rng(7)
    start = {"f": rng.standard_normal((3, 4)), "w": rng.standard_normal((3, 4)), "t": rng.standard_normal(5)}
    start = {k: v.astype(np.float32) for k, v in start.items()}
    executor = ScheduleExecutor(optimizer_step(weight_decay=0.1, beta2=0.95, clip_norm=clip_norm), start)
    theirs = {k: torch.nn.Parameter(torch.tensor(v)) for k, v in start.items() if k != "f"}
    optimizer = torch.optim.AdamW([{"params": [theirs["w"]], "lr": 1e-2, "weight_decay": 0.1},
                                   {"params": [theirs["t"]], "lr": 0.5e-2, "weight_decay": 0.0}],
                                  betas=(0.9, 0.95), foreach=False)
    for step in range(1, 4):
        grads = {k: (rng.standard_normal(v.shape) * 3).astype(np.float32) for k, v in theirs.items()}
        for name, grad in grads.items():
            executor.grads[name][...] = grad
            theirs[name].grad = torch.tensor(grad)
        expected_norm = float(torch.nn.utils.clip_grad_norm_(list(theirs.values()), clip_norm or float("inf")))
        optimizer.step()
        (norm,) = executor.execute(np.array([1e-2], np.float32), np.array([step]))
        assert float(norm) == pytest.approx(expected_norm, rel=1e-6)
        assert all(not g.any() for g in executor.grads.values())  # zeroed for the next step
        for name, param in theirs.items():
            np.testing.assert_allclose(executor.params[name], param.detach().numpy(), rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(executor.params["f"], start["f"])  # @frozen: never updated
    assert set(executor.grads) == {"w", "t"}
    assert set(executor.moments) == {"exp_avg.w", "exp_avg_sq.w", "exp_avg.t", "exp_avg_sq.t"}
    state = optimizer.state[theirs["w"]]
    np.testing.assert_allclose(executor.moments["exp_avg_sq.w"], state["exp_avg_sq"].numpy(), rtol=1e-6)


def test_a_storage_other_than_fp32_is_refused_where_the_pass_is_made():
    from modeldsl.diagnostics import PassOptionError

    with pytest.raises(PassOptionError, match="storage=fp16 is not fp32") as info:
        OptimizerStepPass(storage="fp16")
    assert info.value.option == "storage" and info.value.diagnostic().code == "E029"
