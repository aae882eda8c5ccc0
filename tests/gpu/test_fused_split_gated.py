"""The packed gated-activation kernels (fused_split_swiglu, fused_split_geglu and their backwards,
kernels/activation.cu) against their numpy references, on a GPU or the CPU emulator.

As tests/gpu/test_kernels.py: inputs rounded to the variant's storage, every output poisoned
with NaN, rtol 1e-5 (fp32) / 1e-2 (bf16). Gated widths that are and are not a multiple of the
vector width (the scalar path), and buffers shifted off their 16-byte alignment; the backward
also in place (d_gate_up over gate_up, as the planner's reuse allows).
"""

from __future__ import annotations

import numpy as np
import pytest
from harness import GPU, close, ids, make_runner, rounded, run_plan, skip_without_runner

from modeldsl.kernels import cuda
from modeldsl.kernels.reference import REFERENCES

pytestmark = pytest.mark.gpu

skip_without_runner()
TOL = {"fp32": 1e-5, "bf16": 1e-2}
MISALIGN = {"fp32": 4, "bf16": 2}
PACKED = [(1, 2), (3, 14), (4, 16), (2, 5, 66), (7, 2 * 64), (33, 2 * 24)]
if GPU:
    PACKED += [(4096, 2 * 2816)]
NAMES = ["fused_split_swiglu", "fused_split_geglu"]


@pytest.fixture(scope="module")
def runner():
    return make_runner()


def check(runner, name, inputs, variant, offset=0):
    """Run ``name``'s CUDA plan and compare its one output with the reference."""
    prim = cuda.primitive(name)
    want = REFERENCES[name](*[rounded(a, prim.dtype(b, variant, "int32")) for b, a in zip(prim.inputs, inputs)])
    result = run_plan(runner, name, inputs, [want.shape], {}, variant, offset=offset)
    got = result.outputs[prim.outputs[0]]
    close(got, want, TOL[variant], f"{name} {variant} (inputs {[a.shape for a in inputs]}, offset {offset})")


def packed_inputs(shape, seed=11):
    rng = np.random.default_rng(seed)
    gate_up = 2 * rng.standard_normal(shape)
    d_out = rng.standard_normal((*shape[:-1], shape[-1] // 2))
    return gate_up, d_out


@pytest.mark.parametrize("variant", ["fp32", "bf16"])
@pytest.mark.parametrize("shape", PACKED, ids=ids(PACKED))
@pytest.mark.parametrize("name", NAMES)
def test_packed_gated_kernels(runner, name, shape, variant):
    gate_up, d_out = packed_inputs(shape)
    check(runner, name, [gate_up], variant)
    check(runner, f"{name}_backward", [d_out, gate_up], variant)


@pytest.mark.parametrize("variant", ["fp32", "bf16"])
@pytest.mark.parametrize("name", NAMES)
def test_packed_gated_kernels_on_misaligned_buffers(runner, name, variant):
    gate_up, d_out = packed_inputs((3, 2 * 64))
    check(runner, name, [gate_up], variant, offset=MISALIGN[variant])
    check(runner, f"{name}_backward", [d_out, gate_up], variant, offset=MISALIGN[variant])


def test_the_vector_path_needs_a_gated_width_of_whole_vectors():
    """The launch covers rows x F elements in vectors where F allows, one at a time otherwise."""
    vectors = cuda.plan("fused_split_swiglu", [(8, 2 * 64)], [(8, 64)], {}, "bf16").steps[0]
    scalars = cuda.plan("fused_split_swiglu", [(8, 2 * 63)], [(8, 63)], {}, "bf16").steps[0]
    assert [a.value for a in vectors.args[2:]] == [8, 64] and vectors.grid == (1, 1, 1)
    assert [a.value for a in scalars.args[2:]] == [8, 63] and scalars.grid == (2, 1, 1)
    with pytest.raises(cuda.NotCovered):
        cuda.plan("fused_split_swiglu", [(8, 7)], [(8, 3)], {}, "bf16")
