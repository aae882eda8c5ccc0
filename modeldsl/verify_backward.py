"""The finite-difference oracle of a model's gradient (spec 9.8.1, ``--verify-backward``).

In float64, with small random parameters and inputs, the derived gradient
function (``mdsl-autodiff``) is compared with central differences of the
forward: for each parameter and differentiable input ``p``, a random
direction ``v`` gives ``(L(p + eps v) - L(p - eps v)) / 2 eps`` against
``<dL/dp, v>``, where ``L`` is the sum of the outputs weighted by a random
cotangent. One directional derivative per tensor checks every rule the
tensor's gradient passes through.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from modeldsl.dialects.graph import FuncOp, ModelOp
from modeldsl.passes.autodiff import gradient_function
from modeldsl.runtime.executor import GraphExecutor


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
    worst = max((c.relative_error for c in checks), default=0.0)
    ok = worst <= tolerance
    lines.append(f"max relative error {worst:.2e} ({'within' if ok else 'above'} the tolerance {tolerance:g})")
    return "\n".join(lines) + "\n", ok
