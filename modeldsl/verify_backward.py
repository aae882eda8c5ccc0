"""The finite-difference oracle of a model's gradient (spec 9.8.1, ``--verify-backward``).

In float64, with small random parameters and inputs, a backward is compared
with central differences of the forward: for each parameter and
differentiable input ``p``, a random direction ``v`` gives
``(L(p + eps v) - L(p - eps v)) / 2 eps`` against ``<dL/dp, v>``, where ``L``
is the sum of the outputs weighted by a random cotangent. One directional
derivative per tensor checks every rule the tensor's gradient passes through.

The forward is run as a training step runs it (``training=True``: dropout active, as in the
forward ``mdsl-autodiff`` differentiates), every run of it, the finite differences' and the
backward's, with one step counter (``rng_step``), so they draw the same dropout masks and a
gradient through a mask is compared with differences through that mask.

The backward checked is, with ``which="auto"`` (the default), the model's
*written* backward when it has one (``@backward``, lowered from a module's
``backward:`` section, :mod:`modeldsl.lower.backward`), else the gradient
*derived* by ``mdsl-autodiff`` (``@forward_grad``); ``which="written"`` or
``"derived"`` chooses. The written one is called with the cotangents as its
``d_<output>`` arguments and the forward's values named in its ``saved``
attribute (a forward input, a value of the forward function, or an output by
the name its ``d_<output>`` argument gives it); its results, named by its
``grads`` attribute, are ``d_<input>`` (reported as ``input NAME``) and
``d_<param>`` (``ln1.weight`` is ``d_ln1_weight``; reported by the parameter's
name). A written backward the check cannot run (a saved name no forward value
has, a gradient of nothing, a gradient of the wrong shape, a kernel that
fails) raises :class:`BackwardCheckError` with a diagnostic code.

``mdsl-opt --verify-backward`` runs it on a specialized model with the
random weights and inputs of :func:`random_weights` and :func:`random_inputs`
(``--verify-derived`` forces the derived gradient). The module is callable:
``modeldsl.verify_backward(model, weights, inputs)`` is :func:`verify_backward`.
"""

from __future__ import annotations

import math
import sys
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from xdsl.ir import Operation

from modeldsl.dialects.graph import FuncOp, ModelOp, ParamOp
from modeldsl.dialects.graph_types import TensorType
from modeldsl.passes.autodiff import AutodiffError, gradient_function
from modeldsl.runtime.executor import ExecutionError, GraphExecutor
from modeldsl.symbolic import STAR

WHICH = ("auto", "written", "derived")


class BackwardCheckError(Exception):
    """A backward the check cannot run: a diagnostic code (spec Appendix C), a message and a hint."""

    def __init__(self, code: str, message: str, hint: str = ""):
        super().__init__(message)
        self.code, self.message, self.hint = code, message, hint


NOISE_ULPS = 1024  # units in the last place of the loss a finite difference may be off by (16 seen)


@dataclass(frozen=True)
class GradientCheck:
    """One tensor's directional derivative: the backward's (``derived``, from the backward named
    by ``backward``: ``"derived"`` or ``"written"``) and the numerical one, and their relative error."""

    name: str
    derived: float
    numerical: float
    backward: str = "derived"
    noise: float = 0.0  # the rounding error the numerical derivative may carry (an absolute floor)

    @property
    def relative_error(self) -> float:
        scale = max(abs(self.derived), abs(self.numerical), 1e-30)
        return abs(self.derived - self.numerical) / scale

    def within(self, tolerance: float) -> bool:
        """Whether the two agree to ``tolerance`` relative to their size, or are both zero up to
        the rounding noise of the finite difference (a zero gradient is not held to a relative
        error between two noises); a NaN never agrees."""
        return self.relative_error <= tolerance or self.at_noise_level(tolerance)

    def at_noise_level(self, tolerance: float) -> bool:
        return max(abs(self.derived), abs(self.numerical)) <= self.noise and self.relative_error > tolerance


def verify_backward(model: ModelOp, weights: dict[str, np.ndarray], inputs: Sequence[np.ndarray],
                    func: str = "forward", epsilon: float = 1e-6, seed: int = 0,
                    which: str = "auto", training: bool = True, rng_step: int = 0) -> list[GradientCheck]:
    """Check every parameter's and differentiable input's gradient of ``@func`` (float64), as the
    written ``@backward`` or the derived gradient computes it (``which``, see :func:`checked_backward`);
    the forward runs as in a training step (``training``: dropout active) with the step counter
    ``rng_step`` for the differences and the backward alike."""
    kind = checked_backward(model, func, which)
    grad_func = written_backward(model, func) if kind == "written" else _gradient_of(model, func)
    rng = np.random.default_rng(seed)
    weights = {k: np.asarray(v, dtype=np.float64) for k, v in weights.items()}
    inputs = [np.asarray(x, dtype=np.float64) if np.asarray(x).dtype.kind == "f" else np.asarray(x) for x in inputs]
    executor = GraphExecutor(model, weights, float_dtype=np.float64, training=training, rng_step=rng_step)
    forward = executor.funcs.get(func)
    values: dict[str, np.ndarray] = {}
    if kind == "written" and forward is not None:
        executor.observers.append(_value_recorder(forward, values))
    outputs = executor.run(func, *inputs)
    executor.observers.clear()
    seeds = [rng.standard_normal(o.shape) for o in outputs if np.asarray(o).dtype.kind == "f"]
    floats = [o for o in outputs if np.asarray(o).dtype.kind == "f"]
    base = float(sum(np.sum(o * s) for o, s in zip(floats, seeds)))
    noise = NOISE_ULPS * float(np.spacing(abs(base))) / (2 * epsilon)  # loss(+) - loss(-) is a count of its ulps
    if kind == "written":
        param_grads, input_grads = _run_written(executor, grad_func, forward, inputs, outputs, seeds, values)
    else:
        param_grads, input_grads = _run_derived(executor, grad_func, inputs, outputs, seeds)

    def loss(ws: dict[str, np.ndarray], xs: Sequence[np.ndarray]) -> float:
        executor.weights = ws
        outs = [o for o in executor.run(func, *xs) if np.asarray(o).dtype.kind == "f"]
        return float(sum(np.sum(o * s) for o, s in zip(outs, seeds)))

    checks = []
    for name, grad in param_grads:
        direction = rng.standard_normal(_checked_shape(grad, weights[name], name, kind))
        plus = {**weights, name: weights[name] + epsilon * direction}
        minus = {**weights, name: weights[name] - epsilon * direction}
        numerical = (loss(plus, inputs) - loss(minus, inputs)) / (2 * epsilon)
        checks.append(GradientCheck(name, float(np.sum(grad * direction)), numerical, kind, noise))
    for name, index, grad in input_grads:
        direction = rng.standard_normal(_checked_shape(grad, inputs[index], f"input {name}", kind))
        plus, minus = list(inputs), list(inputs)
        plus[index], minus[index] = inputs[index] + epsilon * direction, inputs[index] - epsilon * direction
        numerical = (loss(weights, plus) - loss(weights, minus)) / (2 * epsilon)
        checks.append(GradientCheck(f"input {name}", float(np.sum(grad * direction)), numerical, kind, noise))
    executor.weights = weights
    return checks


def written_backward(model: ModelOp, func: str = "forward") -> FuncOp | None:
    """The model's written backward of ``@func`` (``@backward``, the backward of ``@forward``), if any."""
    if func != "forward":
        return None
    return next((op for op in model.body.block.ops if isinstance(op, FuncOp) and op.sym_name.data == "backward"),
                None)


def checked_backward(model: ModelOp, func: str = "forward", which: str = "auto") -> str:
    """``"written"`` or ``"derived"``: the backward :func:`verify_backward` checks for ``which``
    (``"auto"``: the written one where the model has it)."""
    if which not in WHICH:
        raise BackwardCheckError("E029", f"which={which!r} is not one of {', '.join(WHICH)}",
                                 "'written' checks @backward, 'derived' the mdsl-autodiff gradient, "
                                 "'auto' the written one where there is one")
    if written_backward(model, func) is not None:
        return "derived" if which == "derived" else "written"
    if which == "written":
        raise BackwardCheckError("E029", f"@{model.sym_name.data} has no written backward of @{func}"
                                 + (" (@backward is the backward of @forward)" if func != "forward" else ""),
                                 "write a backward: section in the module, or check the derived gradient")
    return "derived"


def _gradient_of(model: ModelOp, func: str) -> FuncOp:
    for op in model.body.block.ops:
        if isinstance(op, FuncOp) and op.sym_name.data == f"{func}_grad":
            return op
    return gradient_function(model, func)


def _run_derived(executor: GraphExecutor, grad_func: FuncOp, inputs: Sequence[np.ndarray],
                 outputs: Sequence[np.ndarray], seeds: Sequence[np.ndarray]):
    """(parameter gradients, input gradients) of the derived ``@<func>_grad``."""
    results = executor.run(grad_func.sym_name.data, *inputs, *seeds)
    params = [a.data for a in grad_func.attributes["grads"].data]
    input_names = [a.data for a in grad_func.attributes["input_grads"].data]
    grads = results[len(outputs):]
    float_inputs = [i for i, x in enumerate(inputs) if x.dtype.kind == "f"]
    differentiable = _differentiable_inputs(grad_func, float_inputs)
    return (list(zip(params, grads[:len(params)])),
            list(zip(input_names, differentiable, grads[len(params):])))


def _differentiable_inputs(grad_func: FuncOp, float_inputs: list[int]) -> list[int]:
    """Positions (among the function's inputs) of the inputs the gradient function differentiates."""
    names = [a.data for a in grad_func.attributes["input_grads"].data]
    args = list(grad_func.body.block.args)
    return [i for i in float_inputs if args[i].name_hint in names]


def _value_recorder(forward: FuncOp, values: dict[str, np.ndarray]) -> Callable[[Operation, list], None]:
    """An executor observer that records the named values of ``forward``'s own ops (not of the
    functions it calls) in ``values``."""
    def record(op: Operation, results: list[np.ndarray]) -> None:
        if op.parent_op() is forward:
            values.update({r.name_hint: v for r, v in zip(op.results, results) if r.name_hint})
    return record


def _run_written(executor: GraphExecutor, backward: FuncOp, forward: FuncOp, inputs: Sequence[np.ndarray],
                 outputs: Sequence[np.ndarray], seeds: Sequence[np.ndarray], values: dict[str, np.ndarray]):
    """(parameter gradients, input gradients) of the written ``@backward``, called with the
    cotangents ``seeds`` and the forward's saved values (``values``: the forward's named values)."""
    model = executor.model.sym_name.data
    saved = [a.data for a in backward.attributes["saved"].data] if "saved" in backward.attributes else []
    grad_names = [a.data for a in backward.attributes["grads"].data] if "grads" in backward.attributes else []
    args = list(backward.body.block.args)
    cotangents = args[:len(args) - len(saved)]
    if len(cotangents) != len(seeds):
        raise BackwardCheckError("E018", f"@backward of @{model} takes {len(cotangents)} output gradient(s) "
                                 f"before its {len(saved)} saved tensor(s), but @{forward.sym_name.data} has "
                                 f"{len(seeds)} float output(s)",
                                 "the backward takes d_<output> for each float output, then the saved tensors")
    named = {a.name_hint: x for a, x in zip(forward.body.block.args, inputs) if a.name_hint}
    float_outputs = [o for o in outputs if np.asarray(o).dtype.kind == "f"]
    for arg, value in zip(cotangents, float_outputs):  # an output saved by its name (`y -> out`)
        if arg.name_hint and arg.name_hint.startswith("d_"):
            named.setdefault(arg.name_hint[2:], value)
    named.update(values)
    for name in saved:
        if name not in named:
            raise BackwardCheckError("E006", f"@backward of @{model} reads saved.{name}, but no input or value of "
                                     f"@{forward.sym_name.data} is named '{name}'",
                                     "the saved tensors are found by name: name the value in the forward")
    try:
        results = executor.run(backward.sym_name.data, *seeds, *(named[n] for n in saved))
    except (ExecutionError, ValueError, TypeError, IndexError) as err:
        raise BackwardCheckError("E014", f"the written backward of @{model} cannot run: {err}",
                                 "the check runs @backward with the numpy reference kernels") from None
    if len(results) != len(grad_names):
        raise BackwardCheckError("E005", f"@backward of @{model} returns {len(results)} gradient(s) but its grads "
                                 f"attribute names {len(grad_names)}", "grads names each result of @backward")
    input_index = {f"d_{a.name_hint}": i for i, a in enumerate(forward.body.block.args)
                   if a.name_hint and inputs[i].dtype.kind == "f"}
    params = {"d_" + p.sym_name.data.replace(".", "_"): p.sym_name.data
              for p in executor.model.body.block.ops if isinstance(p, ParamOp)}
    param_grads, input_grads = [], []
    for name, grad in zip(grad_names, results):
        if name in input_index:
            input_grads.append((name[2:], input_index[name], grad))
        elif name in params:
            param_grads.append((params[name], grad))
        else:
            raise BackwardCheckError("E005", f"@backward of @{model} returns '{name}', the gradient of no float "
                                     f"input of @{forward.sym_name.data} nor parameter",
                                     "gradients are named d_<input> and d_<parameter> (dots as underscores)")
    return param_grads, input_grads


def _checked_shape(grad: np.ndarray, value: np.ndarray, name: str, kind: str) -> tuple[int, ...]:
    """The shape of ``value``; E018 when the gradient's differs."""
    if np.shape(grad) != np.shape(value):
        raise BackwardCheckError("E018", f"the {kind} gradient of {name} has shape {np.shape(grad)}, the tensor "
                                 f"{np.shape(value)}", "a gradient has the shape of the tensor it is the gradient of")
    return np.shape(value)


def report(checks: Sequence[GradientCheck], tolerance: float) -> tuple[str, bool]:
    """The table ``--verify-backward`` prints, and whether every error is within the tolerance
    (the second column is named after the backward checked: ``derived`` or ``written``)."""
    width = max([len(c.name) for c in checks] + [6])
    column = checks[0].backward if checks else "derived"
    lines = [f"{'tensor':<{width}}  {column:>14}  {'numerical':>14}  {'rel. error':>10}"]
    for c in checks:
        mark = "" if c.relative_error <= tolerance else "  (zero: rounding noise)" if c.within(tolerance) else "  FAIL"
        lines.append(f"{c.name:<{width}}  {c.derived:>14.6e}  {c.numerical:>14.6e}  {c.relative_error:>10.2e}{mark}")
    errors = [c.relative_error for c in checks if not c.at_noise_level(tolerance)]
    worst = math.nan if any(math.isnan(e) for e in errors) else max(errors, default=0.0)
    ok = all(c.within(tolerance) for c in checks)  # a NaN error fails too
    lines.append(f"max relative error {worst:.2e} ({'within' if ok else 'above'} the tolerance {tolerance:g})")
    zeros = [c for c in checks if c.at_noise_level(tolerance)]
    if zeros:
        lines.append(f"{len(zeros)} gradient(s) zero up to the finite differences' rounding noise "
                     f"(±{zeros[0].noise:.1e})")
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
