"""A launch whose primitive has an empty optional slot before a given one (``mamba_conv1d`` with a
state and no bias): the lowering records the empty slot (``absent``) and both schedule executors
hand each operand to the reference in its own slot."""

import numpy as np

from modeldsl.dialects.graph import ModelOp
from modeldsl.dialects.sched import LaunchOp
from modeldsl.ir import make_context, parse_module
from modeldsl.kernels import reference
from modeldsl.passes.lower_to_sched import lower_function
from modeldsl.runtime.cuda_binding import reference_call
from modeldsl.runtime.cuda_commands import TensorRef
from modeldsl.runtime.profiles import plan
from modeldsl.runtime.sched_executor import ScheduleExecutor

CONV = """
!x = !mdsl.graph.tensor<[1, 6, 5], fp32>
!s = !mdsl.graph.tensor<[1, 6, 3], fp32>
!w = !mdsl.graph.tensor<[6, 1, 4], fp32>
mdsl.graph.model @m config {{}} {{
  mdsl.graph.func @forward(%x: !x, %state: !s, %w: !w, %bias: !mdsl.graph.tensor<[6], fp32>) -> (!x, !s)
      attributes {{kind = "forward"}} {{
    %y, %out = mdsl.graph.mamba_conv1d %x, %w {operands} -> !x, !s
    mdsl.graph.return %y, %out : !x, !s
  }}
}}
"""
STATE_ONLY = "state %state : !x, !w state !s"
BIAS_AND_STATE = "bias %bias state %state : !x, !w bias !mdsl.graph.tensor<[6], fp32> state !s"


def conv_program(operands: str):
    module, _ = parse_module(make_context(), CONV.format(operands=operands))
    model = next(op for op in module.body.block.ops if isinstance(op, ModelOp))
    return plan(lower_function(model, storage="fp32"))


def launch(program) -> LaunchOp:
    return next(op for op in program.walk() if isinstance(op, LaunchOp))


def arguments():
    rng = np.random.default_rng(0)
    return [rng.standard_normal(shape).astype(np.float32) for shape in ((1, 6, 5), (1, 6, 3), (6, 1, 4), (6,))]


def test_an_empty_slot_before_a_given_one_is_recorded_and_only_then():
    assert launch(conv_program(STATE_ONLY)).absent_slots == (2,)
    assert launch(conv_program(BIAS_AND_STATE)).absent_slots == ()


def test_the_cpu_executor_passes_a_state_without_bias_as_the_state():
    x, state, w, bias = arguments()
    y, out = ScheduleExecutor(conv_program(STATE_ONLY), {}).execute(x, state, w, bias)
    want_y, want_out = reference.mamba_conv1d(x, w, None, state)
    np.testing.assert_array_equal(y, want_y)
    np.testing.assert_array_equal(out, want_out)


def test_the_cuda_executor_hands_the_reference_the_state_in_its_slot():
    refs = [TensorRef(64 * i, a.shape, a.dtype) for i, a in enumerate(arguments())]
    op = launch(conv_program(STATE_ONLY))
    positional, params = reference_call("mamba_conv1d", op, [refs[0], refs[2], refs[1]], refs[:2])
    assert positional == [refs[0], refs[2], None, refs[1]]
    assert params == {"kernel_size": 4, "activation": "silu"}
