"""The finite-difference oracle of a model's gradient (spec 9.8.1, ``--verify-backward``).

In float64, with small random parameters and inputs, the derived gradient
function (``mdsl-autodiff``) is compared with central differences of the
forward: for each parameter and differentiable input ``p``, a random
direction ``v`` gives ``(L(p + eps v) - L(p - eps v)) / 2 eps`` against
``<dL/dp, v>``, where ``L`` is the sum of the outputs weighted by a random
cotangent. One directional derivative per tensor checks every rule the
tensor's gradient passes through.

``mdsl-opt --verify-backward`` runs it on a specialized model with the
random weights and inputs of :func:`random_weights` and :func:`random_inputs`.
The module is callable: ``modeldsl.verify_backward(model, weights, inputs)``
is :func:`verify_backward`.
"""

from __future__ import annotations

import math
import sys
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from modeldsl.dialects.graph import FuncOp, ModelOp, ParamOp
from modeldsl.dialects.graph_types import TensorType
from modeldsl.passes.autodiff import AutodiffError, gradient_function
from modeldsl.runtime.executor import GraphExecutor
from modeldsl.symbolic import STAR


@dataclass(frozen=True)
class GradientCheck:
    """One tensor's directional derivative: derived and numerical, and their relative error."""

    name: str
    derived: float
    numerical: float

    @property
    def relative_error(self) -> float:
        scale = max(abs(self.derived), abs(self.numerical), 1e-30)
        return abs(self.derived - self.numerical) / scale


def verify_backward(model: ModelOp, weights: dict[str, np.ndarray], inputs: Sequence[np.ndarray],
                    func: str = "forward", epsilon: float = 1e-6, seed: int = 0) -> list[GradientCheck]:
    """Check every parameter's and differentiable input's gradient of ``@func`` (float64)."""
    grad_func = _gradient_of(model, func)
    rng = np.random.default_rng(seed)
    weights = {k: np.asarray(v, dtype=np.float64) for k, v in weights.items()}
    inputs = [np.asarray(x, dtype=np.float64) if np.asarray(x).dtype.kind == "f" else np.asarray(x) for x in inputs]
    executor = GraphExecutor(model, weights, float_dtype=np.float64)
    outputs = executor.run(func, *inputs)
    seeds = [rng.standard_normal(o.shape) for o in outputs if np.asarray(o).dtype.kind == "f"]

    def loss(ws: dict[str, np.ndarray], xs: Sequence[np.ndarray]) -> float:
        executor.weights = ws
        outs = [o for o in executor.run(func, *xs) if np.asarray(o).dtype.kind == "f"]
        return float(sum(np.sum(o * s) for o, s in zip(outs, seeds)))

    executor.weights = weights
    results = executor.run(grad_func.sym_name.data, *inputs, *seeds)
    params = [a.data for a in grad_func.attributes["grads"].data]
    input_names = [a.data for a in grad_func.attributes["input_grads"].data]
    grads = results[len(outputs):]
    float_inputs = [i for i, x in enumerate(inputs) if x.dtype.kind == "f"]
    differentiable = _differentiable_inputs(grad_func, float_inputs)
    checks = []
    for name, grad in zip(params, grads[:len(params)]):
        direction = rng.standard_normal(weights[name].shape)
        plus = {**weights, name: weights[name] + epsilon * direction}
        minus = {**weights, name: weights[name] - epsilon * direction}
        numerical = (loss(plus, inputs) - loss(minus, inputs)) / (2 * epsilon)
        checks.append(GradientCheck(name, float(np.sum(grad * direction)), numerical))
    for name, index, grad in zip(input_names, differentiable, grads[len(params):]):
        direction = rng.standard_normal(inputs[index].shape)
        plus, minus = list(inputs), list(inputs)
        plus[index], minus[index] = inputs[index] + epsilon * direction, inputs[index] - epsilon * direction
        numerical = (loss(weights, plus) - loss(weights, minus)) / (2 * epsilon)
        checks.append(GradientCheck(f"input {name}", float(np.sum(grad * direction)), numerical))
    executor.weights = weights
    return checks


def _gradient_of(model: ModelOp, func: str) -> FuncOp:
    for op in model.body.block.ops:
        if isinstance(op, FuncOp) and op.sym_name.data == f"{func}_grad":
            return op
    return gradient_function(model, func)


def _differentiable_inputs(grad_func: FuncOp, float_inputs: list[int]) -> list[int]:
    """Positions (among the function's inputs) of the inputs the gradient function differentiates."""
    names = [a.data for a in grad_func.attributes["input_grads"].data]
    args = list(grad_func.body.block.args)
    return [i for i in float_inputs if args[i].name_hint in names]


def report(checks: Sequence[GradientCheck], tolerance: float) -> tuple[str, bool]:
    """The table ``--verify-backward`` prints, and whether every error is within the tolerance."""
    width = max([len(c.name) for c in checks] + [6])
    lines = [f"{'tensor':<{width}}  {'derived':>14}  {'numerical':>14}  {'rel. error':>10}"]
    for c in checks:
        mark = "" if c.relative_error <= tolerance else "  FAIL"
        lines.append(f"{c.name:<{width}}  {c.derived:>14.6e}  {c.numerical:>14.6e}  {c.relative_error:>10.2e}{mark}")
    errors = [c.relative_error for c in checks]
    worst = math.nan if any(math.isnan(e) for e in errors) else max(errors, default=0.0)
    ok = all(e <= tolerance for e in errors)  # a NaN error fails too
    lines.append(f"max relative error {worst:.2e} ({'within' if ok else 'above'} the tolerance {tolerance:g})")
    return "\n".join(lines) + "\n", ok


# ---------------------------------------------------------------------------- random weights and inputs


def forward_of(model: ModelOp, func: str = "forward") -> FuncOp | None:
    return next((op for op in model.body.block.ops if isinstance(op, FuncOp) and op.sym_name.data == func), None)


def unbound_symbols(model: ModelOp, func: str = "forward") -> list[str]:
    """Symbols still in the shapes of the parameters and of ``@func``'s inputs (``*`` aside)."""
    types_ = [p.param_type for p in model.body.block.ops if isinstance(p, ParamOp)]
    forward = forward_of(model, func)
    if forward is not None:
        types_ += [a.type for a in forward.body.block.args if isinstance(a.type, TensorType)]
    found: set[str] = set()
    for ttype in types_:
        for dim in ttype.shape:
            if dim is not STAR and not dim.is_const():
                found |= dim.symbols()
    return sorted(found)


def _shape(ttype: TensorType, sizes: Mapping[str, int]) -> tuple[int, ...]:
    """A concrete shape, symbols from ``sizes``; ``*`` (any leading dims) stands for ``B, T``."""
    shape: list[int] = []
    for dim in ttype.shape:
        if dim is STAR:
            shape += [sizes.get("B", 2), sizes.get("T", 8)]
        else:
            shape.append(dim.evaluate(dict(sizes)))
    return tuple(shape)


def random_weights(model: ModelOp, seed: int = 0) -> dict[str, np.ndarray]:
    """float64 parameters, normal with standard deviation ``1/sqrt(last dim)`` (so that every
    layer's activations stay near unit scale and the nonlinearities are exercised)."""
    rng = np.random.default_rng(seed)
    weights = {}
    for param in (p for p in model.body.block.ops if isinstance(p, ParamOp)):
        shape = _shape(param.param_type, {})
        scale = 1.0 / math.sqrt(shape[-1]) if shape else 1.0
        weights[param.sym_name.data] = rng.standard_normal(shape) * scale
    return weights


def random_inputs(model: ModelOp, func: str = "forward", sizes: Mapping[str, int] | None = None,
                  seed: int = 0, rope: Any = None) -> list[np.ndarray]:
    """Inputs of ``@func``: token ids (integer inputs) random in ``[0, 2)`` (inside any
    vocabulary), a float input named ``freqs`` the RoPE table of positions ``0..T-1`` from
    ``rope`` (a :class:`modeldsl.runtime.rope.RopeFrequencies`, where it is ``[T, D/2, 2]``),
    any other float input standard normal (float64). ``sizes`` binds the symbols of
    the input shapes (default ``B=2, T=8``; ``*`` dims are ``B, T``)."""
    forward = forward_of(model, func)
    if forward is None:
        raise AutodiffError(f"@{model.sym_name.data} has no function @{func}")
    rng = np.random.default_rng(seed)
    sizes = {"B": 2, "T": 8, **(sizes or {})}
    values = []
    for arg in forward.body.block.args:
        shape = _shape(arg.type, sizes)
        if not arg.type.dtype.is_float:
            values.append(rng.integers(0, 2, size=shape).astype(np.int64))
        elif arg.name_hint == "freqs" and rope is not None and len(shape) == 3 and shape[2] == 2 \
                and len(rope.inv_freq) == shape[1]:
            values.append(rope.table(range(shape[0])).astype(np.float64))
        else:
            values.append(rng.standard_normal(shape))
    return values


class _CallableModule(types.ModuleType):
    """``modeldsl.verify_backward(...)`` calls :func:`verify_backward` (the package attribute
    is this module once it is imported)."""

    def __call__(self, *args: Any, **kwargs: Any) -> list[GradientCheck]:
        return verify_backward(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
