"""``@kernel(name, fallback=..., workspace=...)`` (spec 7.5.3) in the executors, without a GPU.

The lowering records the choice on the sched op; the CUDA executor carries it on the command.
The attention path of :class:`CudaDevice` (which implementation it asks for, what a binding
choice does when cuDNN refuses) is checked on a device object whose cuDNN graph builder and
kernel preparation are stand-ins; the executor's E043 on an emulated device that cannot run
attention as chosen. The CPU executor runs the reference for every implementation.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from xdsl.context import Context

from modeldsl.diagnostics import CODES
from modeldsl.dialects.graph import ModelOp
from modeldsl.frontend.text.parser import parse_source
from modeldsl.kernel_choice import KernelChoice
from modeldsl.kernels.cuda import NotCovered
from modeldsl.kernels.registry import implementations, unavailable_kernel
from modeldsl.lower import lower_program
from modeldsl.passes.lower_to_sched import lower_function
from modeldsl.passes.specialize import SpecializePass
from modeldsl.runtime.cuda_commands import AttentionBackwardCommand, AttentionCommand, TensorRef
from modeldsl.runtime.cuda_device import CudaDevice, EmulatedDevice, KernelUnavailable, sdpa_workspace
from modeldsl.runtime.cuda_executor import CudaExecutor
from modeldsl.runtime.profiles import plan
from modeldsl.runtime.sched_executor import ScheduleExecutor

# the devices run the references: bitwise on its numpy kernels
pytestmark = pytest.mark.usefixtures("numpy_cpu_kernels")

SOURCE = """
module Attn(h: int = 2, d: int = 4):
  forward:
    in: q: [B, h, T, d]
    in: k: [B, h, T, d]
    in: v: [B, h, T, d]
    out: [B, h, T, d]
    graph:
      (q, k, v) -> flash_attention() -> (out, lse){annotation}
"""


def attention_program(annotation: str = ""):
    """The planned fp32 schedule of one attention, its op annotated with ``annotation``."""
    module = lower_program(parse_source(SOURCE.format(annotation=annotation), "attn.module"), top=None)
    SpecializePass(bindings=(("B", 1), ("T", 4))).apply(Context(), module)
    model = next(op for op in module.body.block.ops if isinstance(op, ModelOp))
    return plan(lower_function(model, storage="fp32"))


def inputs(seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((1, 2, 4, 4)).astype(np.float32) for _ in range(3)]


# ---------------------------------------------------------------------------- the registry
def test_attention_has_cudnn_first_and_its_own_kernel_gemms_cublaslt_others_themselves():
    assert implementations("flash_attention") == ("cudnn_sdpa", "flash_attention")
    assert implementations("flash_attention_backward") == ("cudnn_sdpa", "flash_attention")
    assert implementations("matmul") == implementations("batched_matmul") == ("cublaslt",)
    assert implementations("rmsnorm") == ("rmsnorm",)
    assert unavailable_kernel("matmul", "cublaslt") is None
    assert "its kernels: cublaslt" in unavailable_kernel("matmul", "cutlass_gemm_sm90_fp8")
    assert {"E043", "W012"} <= set(CODES)


# ---------------------------------------------------------------------------- CudaDevice's attention path
class StandInDevice(CudaDevice):
    """CudaDevice's attention preparation with cuDNN and the kernel loading stood in for."""

    def __init__(self, backend: str = "cudnn", cudnn_runs: bool = True):  # no GPU: skip CudaDevice's own
        self.attention_backend, self.cudnn_runs = backend, cudnn_runs
        self._sdpa, self._attention_kernels, self.built = {}, {}, 0

    def _build_sdpa(self, command):
        self.built += 1
        if not self.cudnn_runs:
            raise NotCovered("cuDNN cannot run it")
        return ("graph", {}, 0)

    def prepare(self, command):  # the plain kernel's launch: nothing to load
        pass


def command(choice: KernelChoice | None) -> AttentionCommand:
    ref = TensorRef(1 << 24, (1, 2, 4, 4), np.dtype(np.float16))
    planned = AttentionCommand(q=ref, k=ref, v=ref, out=ref, lse=ref, choice=choice)
    planned.kernel = planned.kernel_launch()
    planned.kernel.plan = object()  # a plan of the plain kernel (its contents do not matter here)
    return planned


@pytest.mark.parametrize("backend", ["cudnn", "kernel"])
def test_the_own_kernel_chosen_never_tries_cudnn(backend):
    device = StandInDevice(backend)
    chosen = command(KernelChoice("flash_attention", fallback=False))
    device._prepare_attention(chosen)
    assert device.built == 0 and id(chosen) in device._attention_kernels and not device._sdpa


@pytest.mark.parametrize("backend", ["cudnn", "kernel"])
def test_cudnn_chosen_is_asked_for_even_where_the_device_defaults_to_the_kernel(backend):
    device = StandInDevice(backend)
    chosen = command(KernelChoice("cudnn_sdpa"))
    device._prepare_attention(chosen)
    assert device.built == 1 and id(chosen) in device._sdpa and not device._attention_kernels


def test_a_binding_cudnn_choice_that_cudnn_refuses_does_not_fall_back_to_the_kernel():
    device = StandInDevice(cudnn_runs=False)
    with pytest.raises(NotCovered, match="cuDNN cannot run it"):
        device._prepare_attention(command(KernelChoice("cudnn_sdpa", fallback=False)))
    assert not device._attention_kernels


@pytest.mark.parametrize("choice", [None, KernelChoice("cudnn_sdpa")], ids=["default", "fallback"])
def test_without_a_binding_choice_a_cudnn_refusal_falls_back_to_the_kernel_as_before(choice):
    device = StandInDevice(cudnn_runs=False)
    chosen = command(choice)
    device._prepare_attention(chosen)
    assert device.built == 1 and id(chosen) in device._attention_kernels


def test_a_workspace_override_is_used_when_it_is_large_enough_else_e043():
    assert sdpa_workspace(command(None), 4096) == 4096
    assert sdpa_workspace(command(KernelChoice("cudnn_sdpa", workspace=1 << 20)), 4096) == 1 << 20
    with pytest.raises(KernelUnavailable, match="workspace=1024.*4096 bytes") as caught:
        sdpa_workspace(command(KernelChoice("cudnn_sdpa", workspace=1024)), 4096)
    assert caught.value.diagnostic().code == "E043"


# ---------------------------------------------------------------------------- the executors
class NoAttentionDevice(EmulatedDevice):
    """An emulated device that can run no attention command on the device (cuDNN and the plain
    kernel both unavailable): the executor must fall back, or refuse a binding choice."""

    def prepare(self, command):
        if isinstance(command, (AttentionCommand, AttentionBackwardCommand)):
            raise NotCovered("no attention here")
        super().prepare(command)


def test_the_choice_rides_from_the_sched_op_onto_the_attention_command():
    program = attention_program(' @kernel("cudnn_sdpa", fallback=false, workspace=65536)')
    executor = CudaExecutor(program, {}, device=EmulatedDevice())
    (attention,) = [c for c in executor.commands if isinstance(c, AttentionCommand)]
    assert attention.choice == KernelChoice("cudnn_sdpa", fallback=False, workspace=65536)
    assert attention.binding


def test_a_binding_choice_the_device_cannot_run_is_e043_instead_of_a_fallback():
    program = attention_program(' @kernel("flash_attention", fallback=false)')
    with pytest.raises(KernelUnavailable, match="fallback=false.*no attention here") as caught:
        CudaExecutor(program, {}, device=NoAttentionDevice())
    assert caught.value.diagnostic().code == "E043"


@pytest.mark.parametrize("annotation", ["", ' @kernel("flash_attention")'], ids=["default", "fallback"])
def test_without_a_binding_choice_the_executor_falls_back_and_matches_the_cpu(annotation):
    program = attention_program(annotation)
    with warnings.catch_warnings():  # warned once per primitive and process
        warnings.simplefilter("ignore")
        executor = CudaExecutor(program, {}, device=NoAttentionDevice())
    assert [f.kernel for f in executor.fallbacks] == ["attention"]
    expected = ScheduleExecutor(program, {}).execute(*inputs())
    np.testing.assert_array_equal(executor.execute(*inputs())[0], expected[0])


@pytest.mark.parametrize("name", ["cudnn_sdpa", "flash_attention"])
def test_the_cpu_executor_runs_the_reference_whatever_the_implementation(name):
    expected = ScheduleExecutor(attention_program(), {}).execute(*inputs(1))
    chosen = ScheduleExecutor(attention_program(f' @kernel("{name}", fallback=false)'), {}).execute(*inputs(1))
    np.testing.assert_array_equal(chosen[0], expected[0])
