"""CPU kernels of the SiLU family: silu, swiglu and the packed gate/up split-swiglu, both directions.

Each tile is a handful of in-cache passes, in the order of operations of the
numpy reference, so the results are bitwise the reference's:
``sigmoid(g) = 1 / (1 + exp(-g))`` and ``silu'(g) = s (1 + g (1 - s))``. Every tile reads all of its inputs before it
writes an output, so an output may take over an input's buffer (the registry's
in-place reuse).
"""

from __future__ import annotations

from functools import partial

import numpy as np

from modeldsl.kernels.cpu.compiled import over_rows
from modeldsl.kernels.cpu.pool import Pool
from modeldsl.kernels.cpu.tiles import Step, rowwise

EXP_COST = 2  # an element's work in cheap passes: measured, two threads paid off from ~150K elements


def _sigmoid_into(g: np.ndarray, s: np.ndarray) -> None:
    np.negative(g, out=s)
    np.exp(s, out=s)  # overflows to inf for g < -88 (the executor runs under np.errstate)
    s += 1
    np.reciprocal(s, out=s)


def _silu_tile(outs, ins, temps) -> None:
    (out,), (g,), (s,) = outs, ins, temps
    _sigmoid_into(g, s)
    np.multiply(g, s, out=out)


def _swiglu_tile(outs, ins, temps) -> None:
    (out,), (g, u), (s,) = outs, ins, temps
    _sigmoid_into(g, s)
    s *= g
    np.multiply(s, u, out=out)


def _silu_grad_into(g: np.ndarray, s: np.ndarray, grad: np.ndarray) -> None:
    """``s = sigmoid(g)`` and ``grad = silu'(g) = s (1 + g (1 - s))``, in the reference's order."""
    _sigmoid_into(g, s)
    np.subtract(1, s, out=grad)
    grad *= g
    grad += 1
    grad *= s


def _silu_backward_tile(outs, ins, temps) -> None:
    (d_x,), (d_out, g), (s, grad) = outs, ins, temps
    _silu_grad_into(g, s, grad)
    np.multiply(d_out, grad, out=d_x)


def _swiglu_backward_tile(outs, ins, temps) -> None:
    """``d_gate = (d_out up) silu'(g)``, ``d_up = d_out silu(g)``: every input read before a write."""
    (d_gate, d_up), (d_out, g, u), (s, grad, product) = outs, ins, temps
    _silu_grad_into(g, s, grad)
    np.multiply(d_out, u, out=product)
    product *= grad
    s *= g
    np.multiply(d_out, s, out=d_up)
    np.copyto(d_gate, product)


def _halves(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    width = a.shape[-1] // 2
    return a[..., :width], a[..., width:]


def silu(pool: Pool, outputs, inputs, params) -> Step | None:
    return rowwise(pool, _silu_tile, outputs, inputs, temps=1, cost=EXP_COST)


def silu_backward(pool: Pool, outputs, inputs, params) -> Step | None:
    return rowwise(pool, _silu_backward_tile, outputs, inputs, temps=2, cost=EXP_COST)


def swiglu(pool: Pool, outputs, inputs, params) -> Step | None:
    return rowwise(pool, _swiglu_tile, outputs, inputs, temps=1, cost=EXP_COST)


def swiglu_backward(pool: Pool, outputs, inputs, params) -> Step | None:
    return rowwise(pool, _swiglu_backward_tile, outputs, inputs, temps=3, cost=EXP_COST)


def fused_split_swiglu(pool: Pool, outputs, inputs, params) -> Step | None:
    return rowwise(pool, _swiglu_tile, outputs, _halves(inputs[0]), temps=1, cost=EXP_COST)


def fused_split_swiglu_backward(pool: Pool, outputs, inputs, params) -> Step | None:
    d_out, gate_up = inputs
    return rowwise(pool, _swiglu_backward_tile, _halves(outputs[0]), [d_out, *_halves(gate_up)], temps=3,
                   cost=EXP_COST)


KERNELS = {fn.__name__: fn for fn in (silu, silu_backward, swiglu, swiglu_backward, fused_split_swiglu,
                                      fused_split_swiglu_backward)}



# ---------------------------------------------------------------------------------------- the compiled path
def _compiled_rows(function: str, pool: Pool, outputs, inputs, params) -> Step | None:
    """Each row one loop of ``function`` in compiled.c, the sigmoid's exp vectorized."""
    return over_rows(pool, function, outputs, inputs, EXP_COST)


def _compiled_split_swiglu(pool: Pool, outputs, inputs, params) -> Step | None:
    return over_rows(pool, "swiglu_rows", outputs, _halves(inputs[0]), EXP_COST)


def _compiled_split_swiglu_backward(pool: Pool, outputs, inputs, params) -> Step | None:
    d_out, gate_up = inputs
    return over_rows(pool, "swiglu_backward_rows", _halves(outputs[0]), [d_out, *_halves(gate_up)], EXP_COST)


JIT_KERNELS = {
    **{name: partial(_compiled_rows, f"{name}_rows")
       for name in ("silu", "silu_backward", "swiglu", "swiglu_backward")},
    "fused_split_swiglu": _compiled_split_swiglu,
    "fused_split_swiglu_backward": _compiled_split_swiglu_backward,
}
