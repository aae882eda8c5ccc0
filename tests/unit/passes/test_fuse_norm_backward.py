"""residual_norm's backward half: ``fused_residual_rmsnorm_backward``'s reference is bitwise the
unfused ``rmsnorm_backward`` + ``add`` in fp32 (either operand order of the add), and the pattern
rewrites the pair in a graph only where the module docstring of passes/fuse/norm.py says."""

import numpy as np
import pytest

from modeldsl.dialects.graph_primitives import AddOp, FusedResidualRmsnormBackwardOp, RmsnormBackwardOp
from modeldsl.ir import make_context, parse_module
from modeldsl.kernels.reference import REFERENCES
from modeldsl.passes.fuse import FusePass


def inputs(seed: int = 0, shape=(3, 5, 16)):
    rng = np.random.default_rng(seed)
    d_y, d_next, r = (rng.standard_normal(shape).astype(np.float32) for _ in range(3))
    w = rng.standard_normal(shape[-1]).astype(np.float32)
    rstd = (1.0 / np.sqrt(np.mean(r * r, axis=-1) + 1e-6)).astype(np.float32)
    return d_y, d_next, r, w, rstd


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_fused_reference_is_bitwise_the_unfused_pair_in_fp32(seed):
    d_y, d_next, r, w, rstd = inputs(seed)
    d_x, d_w = REFERENCES["rmsnorm_backward"](d_y, r, w, rstd)
    d_res, d_in, d_w_fused = REFERENCES["fused_residual_rmsnorm_backward"](d_y, d_next, r, w, rstd)
    for unfused in (REFERENCES["add"](d_x, d_next), REFERENCES["add"](d_next, d_x)):
        assert unfused.dtype == d_res.dtype == np.float32
        assert np.array_equal(d_res, unfused) and np.array_equal(d_in, unfused)
    assert np.array_equal(d_w_fused, d_w)


T = "!mdsl.graph.tensor<[2, 4, 8], fp32>"
W = "!mdsl.graph.tensor<[8], fp32>"
R = "!mdsl.graph.tensor<[2, 4], fp32>"


def graph(body: str, results: str, types: str) -> str:
    return f"""builtin.module {{
  mdsl.graph.model @M config {{}} {{
    mdsl.graph.func @g(%dy: {T}, %dn: {T}, %r: {T}, %w: {W}, %rstd: {R}) -> ({types}) attributes {{kind = "helper"}} {{
{body}
      mdsl.graph.return {results} : {types}
    }}
  }}
}}"""


def fused(text: str, **options) -> list[str]:
    ctx = make_context()
    module, _ = parse_module(ctx, text)
    FusePass(**options).apply(ctx, module)
    return [type(op).__name__ for op in module.walk() if isinstance(op, (AddOp, RmsnormBackwardOp,
                                                                           FusedResidualRmsnormBackwardOp))]


BWD = f"      %dx, %dw = mdsl.graph.rmsnorm_backward %dy, %r, %w, %rstd : ({T}, {T}, {W}, {R}) -> ({T}, {W})"


@pytest.mark.parametrize("add", ["%dx, %dn", "%dn, %dx"])
def test_both_operand_orders_fuse(add):
    text = graph(f"{BWD}\n      %s = mdsl.graph.add {add} : ({T}, {T}) -> {T}", "%s, %dw", f"{T}, {W}")
    assert fused(text) == ["FusedResidualRmsnormBackwardOp"]
    assert fused(text, disable=("residual_norm",)) == ["RmsnormBackwardOp", "AddOp"]


def test_a_second_reader_of_the_norm_gradient_keeps_the_pair():
    body = (f"{BWD}\n      %s = mdsl.graph.add %dx, %dn : ({T}, {T}) -> {T}\n"
            f"      %t = mdsl.graph.add %s, %dx : ({T}, {T}) -> {T}")
    assert fused(graph(body, "%t, %dw", f"{T}, {W}")) == ["RmsnormBackwardOp", "AddOp", "AddOp"]


def test_a_weight_gradient_read_before_a_later_residual_gradient_does_not_fuse():
    """d_next is defined after d_w is read: no place in the block dominates both."""
    body = (f"{BWD}\n      %dw2 = mdsl.graph.add %dw, %w : ({W}, {W}) -> {W}\n"
            f"      %dn2 = mdsl.graph.scale %dn {{factor = 2.0 : f64}} : ({T}) -> {T}\n"
            f"      %s = mdsl.graph.add %dx, %dn2 : ({T}, {T}) -> {T}")
    assert fused(graph(body, "%s, %dw2", f"{T}, {W}")) == ["RmsnormBackwardOp", "AddOp", "AddOp"]


def test_a_weight_gradient_read_before_the_add_fuses_at_the_norm_backward():
    body = (f"{BWD}\n      %dw2 = mdsl.graph.add %dw, %w : ({W}, {W}) -> {W}\n"
            f"      %s = mdsl.graph.add %dx, %dn : ({T}, {T}) -> {T}")
    assert fused(graph(body, "%s, %dw2", f"{T}, {W}")) == ["FusedResidualRmsnormBackwardOp", "AddOp"]
