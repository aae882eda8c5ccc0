"""``@assert(condition, message)`` (spec 7.7.1) at run time: ``mdsl-lower-to-sched`` emits one
``mdsl.sched.assert`` per runtime check after the op that wrote the tensor; the CPU executor and the
CUDA executor (on the emulated device) stop a run whose check fails with E046 naming the message,
the tensor, the check, the layer inside a layer loop, the training step and micro-batch, and where
the annotation stands; a run whose checks hold is unchanged, and a program without ``@assert`` has
no such op."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from xdsl.context import Context

import modeldsl
from modeldsl.dialects.sched import AssertOp
from modeldsl.passes.lower_to_sched import lower_function
from modeldsl.passes.plan_memory import PlanMemoryPass
from modeldsl.resolve.imports import STD_ROOT
from modeldsl.runtime.assertions import AssertionFailed
from modeldsl.runtime.cuda_device import EmulatedDevice
from modeldsl.runtime.cuda_executor import CudaExecutor
from modeldsl.runtime.sched_executor import ScheduleExecutor

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "tiny_llama"

FLAT = """module A(d: int = 4):
  params:
    w: [d, d, fp32]
  forward:
    in: x: [2, d, fp32]
    out: [2, d, fp32]
    graph:
      x -> matmul(w, transpose=NT) -> h @assert(!has_nan(h), "NaN in the projection")
      h -> sigmoid() -> s @assert(all(s >= 0) && all(s <= {high}), message="sigmoid out of range")
      s -> tanh() -> out
"""

STACKED = """block Blk(d: int = 4):
  params:
    w: [d, d, fp32]
  forward:
    in: x: [2, d, fp32]
    out: [2, d, fp32]
    graph:
      x -> matmul(w, transpose=NT) -> h @assert(all(h <= 10.0), "the layer blew up")
      (x, h) -> add() -> out

model M(d: int = 4, n: int = 3):
  params:
    blocks: [n] x Blk(d)
  forward:
    in: x: [2, d, fp32]
    out: [2, d, fp32]
    graph:
      x -> blocks -> out
"""


def program_of(tmp_path, source: str):
    (tmp_path / "m.module").write_text(source)
    model = modeldsl.load(tmp_path / "m.module").model
    program = lower_function(model, "forward", "fp32")
    model.parent_op().body.block.add_op(program)
    PlanMemoryPass().apply(Context(), model.parent_op())
    return program


def executor_of(program, weights, device):
    if device == "cpu":
        return ScheduleExecutor(program, weights)
    executor = CudaExecutor(program, weights, device=EmulatedDevice())
    assert executor.fallbacks == [] and not executor.capturable  # its checks read on the host
    return executor


@pytest.mark.parametrize("device", ["cpu", "emulated"])
def test_a_nan_stops_the_run_naming_the_tensor_and_the_message(tmp_path, device):
    program = program_of(tmp_path, FLAT.format(high=1))
    checks = [(op.check.data, op.tensor.data) for op in program.walk() if isinstance(op, AssertOp)]
    assert checks == [("no_nan", "h"), ("ge", "s"), ("le", "s")]
    executor = executor_of(program, {"w": np.ones((4, 4), np.float32)}, device)
    x = np.arange(8, dtype=np.float32).reshape(2, 4) / 8
    for _ in range(3):  # the checks hold: the run is the same as without them (and runs again)
        (out,) = executor.execute(x)
        np.testing.assert_allclose(np.asarray(out), np.tanh(1 / (1 + np.exp(-x @ np.ones((4, 4))))), rtol=1e-6)
    x[1, 2] = np.nan
    with pytest.raises(AssertionFailed) as failed:
        executor.execute(x)
    (diagnostic,) = failed.value.diagnostics
    assert diagnostic.code == "E046"
    assert diagnostic.message.startswith("@assert failed: NaN in the projection (tensor 'h': !has_nan(h) does not "
                                         "hold; asserted at ")
    assert diagnostic.message.endswith("m.module:8:12)") and diagnostic.hint == "the condition: !has_nan(h)"


@pytest.mark.parametrize("device", ["cpu", "emulated"])
def test_a_range_check_that_fails(tmp_path, device):
    program = program_of(tmp_path, FLAT.format(high=0.5))
    executor = executor_of(program, {"w": np.ones((4, 4), np.float32)}, device)
    with pytest.raises(AssertionFailed, match=r"sigmoid out of range \(tensor 's': all\(s <= 0.5\) does not hold"):
        executor.execute(np.ones((2, 4), np.float32))
    (out,) = executor.execute(-np.ones((2, 4), np.float32))  # every s below 0.5: it holds
    assert np.all(np.asarray(out) < 0.5)


@pytest.mark.parametrize("device", ["cpu", "emulated"])
def test_inside_a_layer_loop_the_error_names_the_layer(tmp_path, device):
    program = program_of(tmp_path, STACKED)
    loops = [op for op in program.walk() if op.name == "mdsl.sched.layer_loop"]
    assert len(loops) == 1 and any(isinstance(op, AssertOp) for op in loops[0].walk())  # once, in the body
    weights = np.zeros((3, 4, 4), np.float32)
    weights[2] = 100.0  # the last layer's projection is far above 10
    executor = executor_of(program, {"blocks.w": weights}, device)
    with pytest.raises(AssertionFailed, match=r"the layer blew up \(tensor 'h': all\(h <= 10\) does not hold; "
                                              r"in layer 2; asserted at .*m\.module:8:12\)"):
        executor.execute(np.ones((2, 4), np.float32))
    weights[2] = 0.0
    executor = executor_of(program, {"blocks.w": weights}, device)
    (out,) = executor.execute(np.ones((2, 4), np.float32))
    np.testing.assert_array_equal(np.asarray(out), np.ones((2, 4), np.float32))


def test_without_assert_no_op_and_disabled_or_decided_ones_cost_nothing(tmp_path):
    plain = FLAT.format(high=1).replace(' @assert(!has_nan(h), "NaN in the projection")', "").replace(
        ' @assert(all(s >= 0) && all(s <= 1), message="sigmoid out of range")', "")
    assert not any(isinstance(op, AssertOp) for op in program_of(tmp_path, plain).walk())
    disabled = FLAT.format(high=1).replace('"NaN in the projection")', '"NaN", enabled=false)')
    assert [op.tensor.data for op in program_of(tmp_path, disabled).walk() if isinstance(op, AssertOp)] == ["s", "s"]
    shape = plain.replace("-> tanh() -> out", "-> tanh() -> out @assert(out.shape[-1] == d, \"width\")")
    assert not any(isinstance(op, AssertOp) for op in program_of(tmp_path, shape).walk())  # decided: it holds


@pytest.mark.parametrize("condition, code, message", [
    ("!has_nan(q)", "E002", "@assert checks 'q', which this flow does not compute"),
    ("has_nan(h)", "E008", "'has_nan(...)' asserts the tensor holds a nan"),
    ("!has_nan(h) || all(h > 0)", "E008", "'||' in the condition"),
    ("all(h == 1)", "E008", "all(...) compares with >=, >, <= or <, not '=='"),
    ("h.shape[0] == 5", "E027", "@assert(h.shape[0] == 5) never holds"),
    ("h.shape[3] == 4", "E004", "'h' has 2 dimensions, no dimension 3"),
])
def test_bad_conditions_are_coded_at_the_annotation(tmp_path, condition, code, message):
    source = FLAT.format(high=1).replace('!has_nan(h), "NaN in the projection"', f'{condition}, "why"')
    (tmp_path / "m.module").write_text(source)
    with pytest.raises(modeldsl.diagnostics.DiagnosticError) as failed:
        modeldsl.load(tmp_path / "m.module")
    (diagnostic,) = [d for d in failed.value.diagnostics if d.severity == "error"]
    assert diagnostic.code == code and message in diagnostic.message, diagnostic.render()
    assert diagnostic.span.location.endswith("m.module:8:41")


def test_a_shape_check_left_to_the_bound_sizes_is_decided_when_lowered(tmp_path):
    source = FLAT.format(high=1).replace("x: [2, d, fp32]", "x: [B, d, fp32]").replace(
        "out: [2, d, fp32]", "out: [B, d, fp32]").replace('!has_nan(h), "NaN in the projection"',
                                                          'h.shape[0] == 2, "two rows"')
    (tmp_path / "m.module").write_text(source)
    from modeldsl.tools.opt import main

    path = str(tmp_path / "m.module")
    assert main([path, "-p", "mdsl-specialize{B=2},mdsl-lower-to-sched"]) == 0
    assert main([path, "-p", "mdsl-specialize{B=3},mdsl-lower-to-sched"]) == 1


def test_a_failed_check_in_training_names_the_step_and_micro_batch(tmp_path):
    """The std Llama with an assertion on its blocks' output, trained on the bundled checkpoint: a
    check that holds trains as without it; one that fails stops the step naming step and micro-batch."""
    from modeldsl.runtime.optim import AdamWConfig
    from modeldsl.runtime.train import Trainer

    source = (STD_ROOT / "models" / "llama.module").read_text()
    flow = "      (x0, freqs) -> blocks -> xN\n"
    assert flow in source
    rng = np.random.default_rng(0)
    batches = [(t, np.roll(t, -1, axis=1)) for t in (rng.integers(0, 384, (2, 8)) for _ in range(2))]
    losses = {}
    for name, condition in (("plain", None), ("holds", "!has_nan_or_inf(xN)"), ("fails", "all(xN < 100.0)")):
        annotated = source if condition is None else source.replace(
            flow, f'      (x0, freqs) -> blocks -> xN @assert({condition}, "hidden states")\n')
        (tmp_path / f"{name}.module").write_text(annotated)
        trainer = Trainer(modeldsl.load(tmp_path / f"{name}.module", hf=EXAMPLE), AdamWConfig(lr=1e-3))
        if name == "fails":
            trainer.train_step(batches)  # step 1: within range
            trainer.model.weights["embedding"][...] *= 1e4  # then the hidden states are far above 100
            with pytest.raises(AssertionFailed, match=r"hidden states \(tensor 'xN': all\(xN < 100\) does not "
                                                      r"hold; at training step 2, micro-batch 0; asserted at "):
                trainer.train_step(batches)
        else:
            losses[name] = [trainer.train_step(batches) for _ in range(2)]
    assert losses["holds"] == losses["plain"]
