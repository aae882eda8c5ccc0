"""Every VJP rule of ``modeldsl.vjp.RULES`` against float64 central differences (``--verify-backward``).

Each case is a tiny ``mdsl.graph`` model around one primitive (in each of its
modes), with concrete shapes, random float64 parameters and inputs (integer
token ids and labels), checked with :func:`verify_backward` at a tolerance of
1e-6. :func:`test_every_rule_has_a_case` fails for a rule without a case.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest

from modeldsl import vjp
from modeldsl.dialects.graph import FuncOp, ModelOp, ParamOp
from modeldsl.ir import make_context, parse_module
from modeldsl.passes.autodiff import AutodiffError, gradient_function
from modeldsl.verify_backward import report, verify_backward

TOLERANCE = 1e-6


def t(*shape: int, dtype: str = "fp32") -> str:
    """The tensor type of a concrete shape."""
    return f"!mdsl.graph.tensor<[{', '.join(str(d) for d in shape)}], {dtype}>"


@dataclass
class Case:
    """``body`` (IR lines) of ``@forward(inputs) -> outputs``; ``params`` are read by ``param_ref``."""

    id: str
    body: str
    inputs: dict[str, tuple]  # name -> shape, or (shape, "int", low, high) for integer ids
    outputs: list[tuple[str, tuple]]  # (value, shape) returned, fp32
    params: dict[str, tuple] = field(default_factory=dict)
    dtypes: dict[str, str] = field(default_factory=dict)  # value or input name -> element type (fp32 default)
    init: dict[str, object] = field(default_factory=dict)  # input or parameter name -> fixed array

    def type_of(self, name: str, shape: tuple) -> str:
        return t(*shape, dtype=self.dtypes.get(name, "fp32"))

    def ir(self) -> str:
        params = "\n".join(f"  mdsl.graph.param @{n} : {t(*s)}" for n, s in self.params.items())
        args = ", ".join(f"%{n}: {self.input_type(n)}" for n in self.inputs)
        refs = "\n".join(f"    %{n} = mdsl.graph.param_ref @{n} : {t(*s)}" for n, s in self.params.items())
        results = ", ".join(self.type_of(n, s) for n, s in self.outputs)
        values = ", ".join(f"%{n}" for n, _ in self.outputs)
        return f"""mdsl.graph.model @m config {{}} {{
{params}
  mdsl.graph.func @forward({args}) -> ({results}) attributes {{kind = "forward"}} {{
{refs}
{self.body}
    mdsl.graph.return {values} : {results}
  }}
}}
"""

    def input_type(self, name: str) -> str:
        spec = self.inputs[name]
        if len(spec) == 4 and spec[1] == "int":
            return t(*spec[0], dtype="int32")
        return self.type_of(name, spec)

    def model(self) -> ModelOp:
        module, _ = parse_module(make_context(), self.ir())
        module.verify()
        return next(op for op in module.walk() if isinstance(op, ModelOp))

    def data(self, seed: int = 0) -> tuple[dict[str, np.ndarray], list[np.ndarray]]:
        rng = np.random.default_rng(seed)
        weights = {n: np.asarray(self.init[n]) if n in self.init else rng.standard_normal(s)
                   for n, s in self.params.items()}
        inputs = []
        for n, spec in self.inputs.items():
            if n in self.init:
                value = np.asarray(self.init[n])
                inputs.append(value.astype(np.int32) if len(spec) == 4 and spec[1] == "int" else value)
            elif len(spec) == 4 and spec[1] == "int":
                inputs.append(rng.integers(spec[2], spec[3], size=spec[0]).astype(np.int32))
            else:
                inputs.append(rng.standard_normal(spec))
        return weights, inputs


def op(text: str) -> str:
    return "    " + text


CASES: list[Case] = []


def case(*args, **kwargs) -> None:
    CASES.append(Case(*args, **kwargs))


# ----------------------------------------------------------------------------
# linear algebra
# ----------------------------------------------------------------------------

# matmul: C = alpha * op(A) @ op(B); A with leading dims only untransposed, B a matrix
for mode, a_shape, b_shape, c_shape in [
    ("NN", (3, 4), (4, 5), (3, 5)),
    ("NT", (3, 4), (5, 4), (3, 5)),
    ("TN", (4, 3), (4, 5), (3, 5)),
    ("TT", (4, 3), (5, 4), (3, 5)),
    ("NN", (2, 3, 4), (4, 5), (2, 3, 5)),
    ("NT", (2, 3, 4), (5, 4), (2, 3, 5)),
    ("TN", (2, 3, 4), (2, 3, 5), (4, 5)),  # the weight-gradient form: leading dims contracted with the rows
]:
    for alpha in (None, 0.5):
        extra = "" if alpha is None else f", alpha = {alpha} : f64"
        lead = "lead" if len(a_shape) > 2 else "2d"
        case(f"matmul-{mode}-{lead}" + ("" if alpha is None else "-alpha"),
             op(f'%c = mdsl.graph.matmul %a, %b {{transpose = "{mode}"{extra}}} : ({t(*a_shape)}, {t(*b_shape)}) '
                f"-> {t(*c_shape)}"),
             {"a": a_shape}, [("c", c_shape)], params={"b": b_shape})

# batched_matmul: C[b] = op(A[b]) @ op(B[b]); B of the rank of A, or a matrix that broadcasts
for mode, a_shape, b_shape, c_shape in [
    ("NN", (2, 3, 4), (2, 4, 5), (2, 3, 5)),
    ("NT", (2, 3, 4), (2, 5, 4), (2, 3, 5)),
    ("TN", (2, 4, 3), (2, 4, 5), (2, 3, 5)),
    ("TT", (2, 4, 3), (2, 5, 4), (2, 3, 5)),
    ("NN", (2, 2, 3, 4), (2, 2, 4, 5), (2, 2, 3, 5)),
    ("NN", (2, 3, 4), (4, 5), (2, 3, 5)),
    ("NT", (2, 3, 4), (5, 4), (2, 3, 5)),
    ("TN", (2, 4, 3), (4, 5), (2, 3, 5)),
    ("TT", (2, 4, 3), (5, 4), (2, 3, 5)),
]:
    kind = "matrixB" if len(b_shape) == 2 else f"rank{len(a_shape)}"
    for alpha in (None, 0.5):
        extra = "" if alpha is None else f", alpha = {alpha} : f64"
        case(f"batched_matmul-{mode}-{kind}" + ("" if alpha is None else "-alpha"),
             op(f'%c = mdsl.graph.batched_matmul %a, %b {{transpose = "{mode}"{extra}}} : ({t(*a_shape)}, '
                f"{t(*b_shape)}) -> {t(*c_shape)}"),
             {"a": a_shape, "b": b_shape}, [("c", c_shape)])

# linear_bias_act: pre = alpha * x @ op(w) + bias, out = act(pre); pre returned too in some cases
for activation in ("none", "relu", "gelu"):
    for mode, w_shape, alpha, with_pre in [("NT", (5, 4), None, False), ("NN", (4, 5), 0.5, True)]:
        extra = f'{{transpose = "{mode}", activation = "{activation}"' + ("" if alpha is None else
                                                                          f", alpha = {alpha} : f64") + "}"
        case(f"linear_bias_act-{activation}-{mode}" + ("-pre" if with_pre else ""),
             op(f"%out, %pre = mdsl.graph.linear_bias_act %x, %w, %bias {extra} : ({t(2, 3, 4)}, {t(*w_shape)}, "
                f"{t(5)}) -> ({t(2, 3, 5)}, {t(2, 3, 5)})"),
             {"x": (2, 3, 4)}, [("out", (2, 3, 5))] + ([("pre", (2, 3, 5))] if with_pre else []),
             params={"w": w_shape, "bias": (5,)})

# grouped_gemm: tokens 0:2 and 2:6 of 7 in two groups (token 6 in none), in each layout
for mode in ("TN", "NN", "NT", "TT"):
    x_shape = (4, 7) if mode[1] == "T" else (7, 4)
    w_shape = (2, 3, 4) if mode[0] == "T" else (2, 4, 3)
    case(f"grouped_gemm-{mode}",
         op(f'%y = mdsl.graph.grouped_gemm %x, %w, %off {{transpose = "{mode}"}} : '
            f"({t(*x_shape)}, {t(*w_shape)}, {t(3, dtype='int32')}) -> {t(7, 3)}"),
         {"x": x_shape, "off": ((3,), "int", 0, 7)}, [("y", (7, 3))], params={"w": w_shape},
         init={"off": [0, 2, 6]})

# ----------------------------------------------------------------------------
# elementwise
# ----------------------------------------------------------------------------

for name in ("add", "mul"):
    for a_shape, b_shape, c_shape in [
        ((2, 3, 4), (2, 3, 4), (2, 3, 4)),
        ((2, 3, 4), (4,), (2, 3, 4)),
        ((4,), (2, 3, 4), (2, 3, 4)),
        ((2, 1, 4), (3, 1), (2, 3, 4)),  # both operands broadcast
        ((2, 3, 1), (1, 3, 4), (2, 3, 4)),
    ]:
        case(f"{name}-{'x'.join(map(str, a_shape))}-{'x'.join(map(str, b_shape))}",
             op(f"%c = mdsl.graph.{name} %a, %b : ({t(*a_shape)}, {t(*b_shape)}) -> {t(*c_shape)}"),
             {"a": a_shape, "b": b_shape}, [("c", c_shape)])

case("add-same-value-twice",
     op(f"%c = mdsl.graph.add %a, %a : ({t(2, 3)}, {t(2, 3)}) -> {t(2, 3)}"),
     {"a": (2, 3)}, [("c", (2, 3))])
case("mul-square",
     op(f"%c = mdsl.graph.mul %a, %a : ({t(2, 3)}, {t(2, 3)}) -> {t(2, 3)}"),
     {"a": (2, 3)}, [("c", (2, 3))])
case("bias_add",
     op(f"%c = mdsl.graph.bias_add %x, %bias : ({t(2, 3, 4)}, {t(4)}) -> {t(2, 3, 4)}"),
     {"x": (2, 3, 4)}, [("c", (2, 3, 4))], params={"bias": (4,)})
case("scale",
     op(f"%c = mdsl.graph.scale %x {{factor = -0.75 : f64}} : ({t(2, 3)}) -> {t(2, 3)}"),
     {"x": (2, 3)}, [("c", (2, 3))])
# dropout as a training step runs it (the differences are taken of that forward): the same
# counter-based mask on the gradient
for p_value in ("0.3", "0.0"):
    case(f"dropout-p{p_value}",
         op(f"%c = mdsl.graph.dropout %x {{p = {p_value} : f64, seed = 5 : i64, offset = 2 : i64, training = true}} "
            f": ({t(4, 16)}) -> {t(4, 16)}"),
         {"x": (4, 16)}, [("c", (4, 16))])
# with a step counter operand (int64 [1], no gradient): the same step's mask on the gradient
case("dropout-step",
     op(f"%c = mdsl.graph.dropout %x, %step {{p = 0.5 : f64, seed = 5 : i64, training = true}} "
        f": ({t(4, 16)}, {t(1, dtype='int64')}) -> {t(4, 16)}"),
     {"x": (4, 16), "step": (1,)}, [("c", (4, 16))], dtypes={"step": "int64"}, init={"step": np.array([2**33 + 3])})
for name in ("sub", "div"):
    for a_shape, b_shape, c_shape in [
        ((2, 3, 4), (2, 3, 4), (2, 3, 4)),
        ((2, 3, 4), (2, 3, 1), (2, 3, 4)),  # a row statistic, as a written-out softmax divides by
        ((4,), (2, 3, 4), (2, 3, 4)),
    ]:
        away = {"b": 1.5 + np.abs(np.random.default_rng(1).standard_normal(b_shape))} if name == "div" else {}
        case(f"{name}-{'x'.join(map(str, a_shape))}-{'x'.join(map(str, b_shape))}",
             op(f"%c = mdsl.graph.{name} %a, %b : ({t(*a_shape)}, {t(*b_shape)}) -> {t(*c_shape)}"),
             {"a": a_shape, "b": b_shape}, [("c", c_shape)], init=away)
case("add_scalar",
     op(f"%c = mdsl.graph.add_scalar %x {{value = 1.0e-05 : f64}} : ({t(2, 3)}) -> {t(2, 3)}"),
     {"x": (2, 3)}, [("c", (2, 3))])
for name in ("exp", "log", "tanh", "sigmoid", "rsqrt"):
    positive = {"x": 0.5 + np.abs(np.random.default_rng(2).standard_normal((3, 4)))} if name in ("log", "rsqrt") else {}
    case(name, op(f"%y = mdsl.graph.{name} %x : ({t(3, 4)}) -> {t(3, 4)}"),
         {"x": (3, 4)}, [("y", (3, 4))], init=positive)
case("add3",
     op(f"%c = mdsl.graph.add3 %x, %y, %z : ({t(2, 3)}, {t(2, 3)}, {t(2, 3)}) -> {t(2, 3)}"),
     {"x": (2, 3), "y": (2, 3), "z": (2, 3)}, [("c", (2, 3))])

# ----------------------------------------------------------------------------
# tensor manipulation
# ----------------------------------------------------------------------------

case("split-last",
     op(f"%p, %q, %r = mdsl.graph.split %x {{sizes = #mdsl.graph.dims<[2, 3, 1]>}} : ({t(2, 3, 6)}) "
        f"-> ({t(2, 3, 2)}, {t(2, 3, 3)}, {t(2, 3, 1)})"),
     {"x": (2, 3, 6)}, [("p", (2, 3, 2)), ("q", (2, 3, 3)), ("r", (2, 3, 1))])
case("split-dim1-piece-unused",
     op(f"%p, %q = mdsl.graph.split %x {{sizes = #mdsl.graph.dims<[1, 2]>, dim = 1 : i64}} : ({t(2, 3, 4)}) "
        f"-> ({t(2, 1, 4)}, {t(2, 2, 4)})"),
     {"x": (2, 3, 4)}, [("q", (2, 2, 4))])
case("concat-last",
     op(f"%c = mdsl.graph.concat %a, %b, %d : ({t(2, 3)}, {t(2, 1)}, {t(2, 2)}) -> {t(2, 6)}"),
     {"a": (2, 3), "b": (2, 1), "d": (2, 2)}, [("c", (2, 6))])
case("concat-dim0",
     op(f"%c = mdsl.graph.concat %a, %b {{dim = 0 : i64}} : ({t(1, 3)}, {t(2, 3)}) -> {t(3, 3)}"),
     {"a": (1, 3), "b": (2, 3)}, [("c", (3, 3))])
case("view",
     op(f"%v = mdsl.graph.view %x : ({t(2, 3, 4)}) -> {t(6, 4)}"),
     {"x": (2, 3, 4)}, [("v", (6, 4))])
case("view-split-dims",
     op(f"%v = mdsl.graph.view %x : ({t(6, 4)}) -> {t(3, 2, 2, 2)}"),
     {"x": (6, 4)}, [("v", (3, 2, 2, 2))])
case("transpose",
     op(f"%y = mdsl.graph.transpose %x {{dim0 = 0 : i64, dim1 = 2 : i64}} : ({t(2, 3, 4)}) -> {t(4, 3, 2)}"),
     {"x": (2, 3, 4)}, [("y", (4, 3, 2))])
case("transpose-negative",
     op(f"%y = mdsl.graph.transpose %x {{dim0 = -1 : i64, dim1 = -2 : i64}} : ({t(2, 3, 4)}) -> {t(2, 4, 3)}"),
     {"x": (2, 3, 4)}, [("y", (2, 4, 3))])
case("permute",
     op(f"%y = mdsl.graph.permute %x {{dims = array<i64: 2, 0, 3, 1>}} : ({t(2, 3, 4, 5)}) -> {t(4, 2, 5, 3)}"),
     {"x": (2, 3, 4, 5)}, [("y", (4, 2, 5, 3))])
case("contiguous",
     op(f"%y = mdsl.graph.contiguous %x : ({t(2, 3)}) -> {t(2, 3)}"),
     {"x": (2, 3)}, [("y", (2, 3))])
case("copy",
     op(f"%y = mdsl.graph.copy %x : ({t(2, 3)}) -> {t(2, 3)}"),
     {"x": (2, 3)}, [("y", (2, 3))])
case("cast-fp32",
     op(f"%y = mdsl.graph.cast %x : ({t(2, 3)}) -> {t(2, 3)}"),
     {"x": (2, 3)}, [("y", (2, 3))])
case("cast-fp32-bf16",
     op(f"%y = mdsl.graph.cast %x : ({t(2, 3)}) -> {t(2, 3, dtype='bf16')}"),
     {"x": (2, 3)}, [("y", (2, 3))], dtypes={"y": "bf16"})
case("cast-bf16-fp32",
     op(f"%y = mdsl.graph.cast %x : ({t(2, 3, dtype='bf16')}) -> {t(2, 3)}"),
     {"x": (2, 3)}, [("y", (2, 3))], dtypes={"x": "bf16"})
# collectives over a group of one rank (the runs on several ranks: test_data_parallel.py): the
# identity, whose rules (Megatron's pairs) are the identity, a reduce_scatter and an all_gather
for kind in ("all_reduce", "all_gather", "reduce_scatter"):
    case(f"collective-{kind}",
         op(f'%y = mdsl.graph.{kind} %x {{group = "tp", size = 1 : i64}} : ({t(2, 3)}) -> {t(2, 3)}'),
         {"x": (2, 3)}, [("y", (2, 3))])
# constants take no operands: the gradient that reaches them goes nowhere (x's is still checked)
case("constants",
     op(f"%z = mdsl.graph.zeros : {t(2, 3)}") + "\n" + op(f"%o = mdsl.graph.ones : {t(2, 3)}") + "\n"
     + op(f"%f = mdsl.graph.fill {{value = 5.000000e-01 : f64}} : {t(2, 3)}") + "\n"
     + op(f"%a = mdsl.graph.add %x, %z : ({t(2, 3)}, {t(2, 3)}) -> {t(2, 3)}") + "\n"
     + op(f"%b = mdsl.graph.mul %a, %o : ({t(2, 3)}, {t(2, 3)}) -> {t(2, 3)}") + "\n"
     + op(f"%y = mdsl.graph.mul %b, %f : ({t(2, 3)}, {t(2, 3)}) -> {t(2, 3)}"),
     {"x": (2, 3)}, [("y", (2, 3))])

# ----------------------------------------------------------------------------
# normalization
# ----------------------------------------------------------------------------

case("rmsnorm",
     op(f"%y, %rstd = mdsl.graph.rmsnorm %x, %w {{eps = 1.0e-05 : f64}} : ({t(2, 3, 4)}, {t(4)}) "
        f"-> ({t(2, 3, 4)}, {t(2, 3)})"),
     {"x": (2, 3, 4)}, [("y", (2, 3, 4))], params={"w": (4,)})
FRR = (f"%ro, %y, %rstd = mdsl.graph.fused_residual_rmsnorm %r, %x, %w : ({t(2, 3, 4)}, {t(2, 3, 4)}, {t(4)}) "
       f"-> ({t(2, 3, 4)}, {t(2, 3, 4)}, {t(2, 3)})")
case("fused_residual_rmsnorm-both-used", op(FRR),
     {"r": (2, 3, 4), "x": (2, 3, 4)}, [("ro", (2, 3, 4)), ("y", (2, 3, 4))], params={"w": (4,)})
case("fused_residual_rmsnorm-residual_out-unused", op(FRR),
     {"r": (2, 3, 4), "x": (2, 3, 4)}, [("y", (2, 3, 4))], params={"w": (4,)})
case("fused_residual_rmsnorm-y-unused", op(FRR),
     {"r": (2, 3, 4), "x": (2, 3, 4)}, [("ro", (2, 3, 4))], params={"w": (4,)})
case("fused_residual_rmsnorm-residual_out-read-downstream",
     op(FRR) + "\n" + op(f"%z = mdsl.graph.mul %ro, %y : ({t(2, 3, 4)}, {t(2, 3, 4)}) -> {t(2, 3, 4)}"),
     {"r": (2, 3, 4), "x": (2, 3, 4)}, [("z", (2, 3, 4))], params={"w": (4,)})
case("layernorm-bias",
     op(f"%y, %mean, %rstd = mdsl.graph.layernorm %x, %w, %b : ({t(2, 3, 4)}, {t(4)}, {t(4)}) "
        f"-> ({t(2, 3, 4)}, {t(2, 3)}, {t(2, 3)})"),
     {"x": (2, 3, 4)}, [("y", (2, 3, 4))], params={"w": (4,), "b": (4,)})
case("layernorm-no-bias",
     op(f"%y, %mean, %rstd = mdsl.graph.layernorm %x, %w {{eps = 1.0e-06 : f64}} : ({t(2, 3, 4)}, {t(4)}) "
        f"-> ({t(2, 3, 4)}, {t(2, 3)}, {t(2, 3)})"),
     {"x": (2, 3, 4)}, [("y", (2, 3, 4))], params={"w": (4,)})

# ----------------------------------------------------------------------------
# activations
# ----------------------------------------------------------------------------

# relu and relu2 have a kink at 0: inputs at least 0.1 away from it
AWAY_FROM_ZERO = np.array([[-1.3, 0.4, -0.2, 2.1], [0.7, -0.6, 1.1, -2.4], [0.15, -0.9, 0.3, -0.1]])
for name in ("silu", "relu", "relu2"):
    case(name, op(f"%y = mdsl.graph.{name} %x : ({t(3, 4)}) -> {t(3, 4)}"),
         {"x": (3, 4)}, [("y", (3, 4))], init={"x": AWAY_FROM_ZERO} if name != "silu" else {})
for approximate in ("true", "false"):
    case(f"gelu-approximate-{approximate}",
         op(f"%y = mdsl.graph.gelu %x {{approximate = {approximate}}} : ({t(3, 4)}) -> {t(3, 4)}"),
         {"x": (3, 4)}, [("y", (3, 4))])
for name in ("swiglu", "geglu"):
    case(name, op(f"%y = mdsl.graph.{name} %g, %u : ({t(3, 4)}, {t(3, 4)}) -> {t(3, 4)}"),
         {"g": (3, 4), "u": (3, 4)}, [("y", (3, 4))])
    case(f"fused_split_{name}", op(f"%y = mdsl.graph.fused_split_{name} %gu : ({t(2, 3, 8)}) -> {t(2, 3, 4)}"),
         {"gu": (2, 3, 8)}, [("y", (2, 3, 4))])
for dim in (-1, 0, 1, 2):
    case(f"softmax-dim{dim}",
         op(f"%y = mdsl.graph.softmax %x {{dim = {dim} : i64}} : ({t(2, 3, 4)}) -> {t(2, 3, 4)}"),
         {"x": (2, 3, 4)}, [("y", (2, 3, 4))])
for label, attrs in [
    ("causal_mask", ""),  # the masked scores are -inf: softmax after it keeps the loss finite
    ("causal_mask-offset", " {offset = 2 : i64}"),
    ("causal_mask-window", " {offset = 1 : i64, window_size = 2 : i64}"),
]:
    case(label, op(f"%m = mdsl.graph.causal_mask %x{attrs} : ({t(2, 3, 5)}) -> {t(2, 3, 5)}\n"
                   f"    %y = mdsl.graph.softmax %m : ({t(2, 3, 5)}) -> {t(2, 3, 5)}"),
         {"x": (2, 3, 5)}, [("y", (2, 3, 5))])
case("causal_mask-zero",
     op(f'%y = mdsl.graph.causal_mask %x {{offset = -1 : i64, fill = "zero"}} : ({t(4, 3)}) -> {t(4, 3)}'),
     {"x": (4, 3)}, [("y", (4, 3))])

# ----------------------------------------------------------------------------
# attention
# ----------------------------------------------------------------------------

for label, hkv, attrs in [
    ("causal", 2, ""),
    ("non-causal", 2, " {causal = false}"),
    ("gqa-causal", 1, ""),
    ("gqa-non-causal-scale", 1, " {causal = false, softmax_scale = 0.3 : f64}"),
    ("window-causal", 2, " {window_size = 2 : i64}"),
    ("window-non-causal-gqa", 1, " {causal = false, window_size = 2 : i64}"),
    ("softmax_scale", 2, " {softmax_scale = 0.7 : f64}"),
    ("softcap-gqa-causal", 1, " {softcap = 0.8 : f64}"),
    ("softcap-window-scale", 2, " {window_size = 2 : i64, softmax_scale = 1.3 : f64, softcap = 1.1 : f64}"),
    ("softcap-non-causal", 2, " {causal = false, softcap = 0.6 : f64}"),
]:
    q, kv = (1, 2, 4, 4), (1, hkv, 4, 4)
    case(f"flash_attention-{label}",
         op(f"%o, %lse = mdsl.graph.flash_attention %q, %k, %v{attrs} : ({t(*q)}, {t(*kv)}, {t(*kv)}) "
            f"-> ({t(*q)}, {t(1, 2, 4)})"),
         {"q": q, "k": kv, "v": kv}, [("o", q)])
# ALiBi slopes (a parameter of the primitive, not differentiated): causal and sliding-window
for label, attrs in [("alibi-causal", ""), ("alibi-window", " {window_size = 2 : i64, softmax_scale = 0.7 : f64}")]:
    q, kv = (1, 2, 4, 4), (1, 1, 4, 4)
    case(f"flash_attention-{label}",
         op(f"%o, %lse = mdsl.graph.flash_attention %q, %k, %v, %slopes{attrs} : ({t(*q)}, {t(*kv)}, {t(*kv)}, "
            f"{t(2)}) -> ({t(*q)}, {t(1, 2, 4)})"),
         {"q": q, "k": kv, "v": kv, "slopes": (2,)}, [("o", q)], init={"slopes": [0.5, 0.25]})

# segment ids (packed rows: each query sees its own example's keys only; not differentiated): two and three
# examples per row, with GQA, a sliding window, a softcap, the bthd layout and the backward's own mask
SEGMENTS = [[0, 0, 0, 1, 1], [0, 1, 1, 2, 2]]
for label, hkv, attrs, layout in [
    ("segments-causal", 2, "", "bhtd"),
    ("segments-gqa-window", 1, " {window_size = 2 : i64}", "bhtd"),
    ("segments-softcap-scale", 2, " {softcap = 0.9 : f64, softmax_scale = 0.6 : f64}", "bhtd"),
    ("segments-bthd-gqa", 1, ' {layout = "bthd"}', "bthd"),
]:
    q, kv = ((2, 2, 5, 4), (2, hkv, 5, 4)) if layout == "bhtd" else ((2, 5, 2, 4), (2, 5, hkv, 4))
    case(f"flash_attention-{label}",
         op(f"%o, %lse = mdsl.graph.flash_attention %q, %k, %v segments %seg{attrs} : ({t(*q)}, {t(*kv)}, {t(*kv)} "
            f"segments {t(2, 5, dtype='int32')}) -> ({t(*q)}, {t(2, 2, 5)})"),
         {"q": q, "k": kv, "v": kv, "seg": ((2, 5), "int", 0, 3)}, [("o", q)], init={"seg": SEGMENTS})

ANGLES = np.outer(np.arange(3), 1.0 / 10000 ** (np.arange(2) / 2))
FREQS = np.stack([np.cos(ANGLES), np.sin(ANGLES)], axis=-1)  # [T, D/2, 2]
ROW_ANGLES = np.array([[0, 1, 2], [0, 0, 1]])[..., None] * (1.0 / 10000 ** (np.arange(2) / 2))
ROW_FREQS = np.stack([np.cos(ROW_ANGLES), np.sin(ROW_ANGLES)], axis=-1)  # [B, T, D/2, 2]: packed rows' positions
ROPE = "%qr, %kr = mdsl.graph.rope %q, %k, %freqs{attrs} : ({q}, {k}, {f}) -> ({q}, {k})"
for interleaved in ("false", "true"):
    for used in (("qr", "kr"), ("qr",), ("kr",)):
        q, k = (1, 2, 3, 4), (1, 1, 3, 4)
        shapes = {"qr": q, "kr": k}
        case(f"rope-interleaved-{interleaved}-{'+'.join(used)}",
             op(ROPE.format(attrs=f" {{interleaved = {interleaved}}}", q=t(*q), k=t(*k), f=t(3, 2, 2))),
             {"q": q, "k": k, "freqs": (3, 2, 2)}, [(u, shapes[u]) for u in used], init={"freqs": FREQS})
# layout = "bthd" (mdsl-fuse attention_layout): q, k, v as [B, T, H, D]; the position of rope is dim 1
case("rope-bthd", op(ROPE.format(attrs=' {layout = "bthd"}', q=t(1, 3, 2, 4), k=t(1, 3, 1, 4), f=t(3, 2, 2))),
     {"q": (1, 3, 2, 4), "k": (1, 3, 1, 4), "freqs": (3, 2, 2)}, [("qr", (1, 3, 2, 4)), ("kr", (1, 3, 1, 4))],
     init={"freqs": FREQS})
# a table per row (packed rows, each token at its own position): [B, T, D/2, 2], both layouts
for layout, q, k in (("bhtd", (2, 2, 3, 4), (2, 1, 3, 4)), ("bthd", (2, 3, 2, 4), (2, 3, 1, 4))):
    for interleaved in ("false", "true"):
        case(f"rope-rows-{layout}-interleaved-{interleaved}",
             op(ROPE.format(attrs=f' {{interleaved = {interleaved}, layout = "{layout}"}}', q=t(*q), k=t(*k),
                            f=t(2, 3, 2, 2))),
             {"q": q, "k": k, "freqs": (2, 3, 2, 2)}, [("qr", q), ("kr", k)], init={"freqs": ROW_FREQS})
case("flash_attention-bthd-gqa-window",
     op(f'%o, %lse = mdsl.graph.flash_attention %q, %k, %v {{window_size = 2 : i64, layout = "bthd"}} : '
        f"({t(1, 4, 2, 4)}, {t(1, 4, 1, 4)}, {t(1, 4, 1, 4)}) -> ({t(1, 4, 2, 4)}, {t(1, 2, 4)})"),
     {"q": (1, 4, 2, 4), "k": (1, 4, 1, 4), "v": (1, 4, 1, 4)}, [("o", (1, 4, 2, 4))])

QK_NORM = (f"%qn, %kn, %qs, %ks = mdsl.graph.qk_norm %q, %k, %qw, %kw : "
           f"({t(1, 2, 3, 4)}, {t(1, 1, 3, 4)}, {t(4)}, {t(4)}) -> ({t(1, 2, 3, 4)}, {t(1, 1, 3, 4)}, {t(1, 2, 3)}, "
           f"{t(1, 1, 3)})")
for used in (("qn", "kn"), ("qn",), ("kn",)):
    shapes = {"qn": (1, 2, 3, 4), "kn": (1, 1, 3, 4)}
    case(f"qk_norm-{'+'.join(used)}", op(QK_NORM), {"q": (1, 2, 3, 4), "k": (1, 1, 3, 4)},
         [(u, shapes[u]) for u in used], params={"qw": (4,), "kw": (4,)})

QK_NORM_ROPE = ("%qr, %kr, %qs, %ks = mdsl.graph.fused_qk_norm_rope %q, %k, %qw, %kw, %freqs{attrs} : "
                "({q}, {k}, {w}, {w}, {f}) -> ({q}, {k}, {qs}, {ks})")
for layout, q, k in (("bhtd", (1, 2, 3, 4), (1, 1, 3, 4)), ("bthd", (1, 3, 2, 4), (1, 3, 1, 4))):
    for interleaved in ("false", "true"):
        for used in (("qr", "kr"), ("qr",), ("kr",)):
            text = QK_NORM_ROPE.format(attrs=f' {{interleaved = {interleaved}, layout = "{layout}"}}', q=t(*q),
                                       k=t(*k), w=t(4), f=t(3, 2, 2), qs=t(*q[:3]), ks=t(*k[:3]))
            case(f"fused_qk_norm_rope-{layout}-interleaved-{interleaved}-{'+'.join(used)}", op(text),
                 {"q": q, "k": k, "freqs": (3, 2, 2)}, [(u, {"qr": q, "kr": k}[u]) for u in used],
                 params={"qw": (4,), "kw": (4,)}, init={"freqs": FREQS})
    rows_q, rows_k = (2, *q[1:]), (2, *k[1:])  # a table per row (packed rows)
    text = QK_NORM_ROPE.format(attrs=f' {{layout = "{layout}"}}', q=t(*rows_q), k=t(*rows_k), w=t(4),
                               f=t(2, 3, 2, 2), qs=t(*rows_q[:3]), ks=t(*rows_k[:3]))
    case(f"fused_qk_norm_rope-rows-{layout}", op(text), {"q": rows_q, "k": rows_k, "freqs": (2, 3, 2, 2)},
         [("qr", rows_q), ("kr", rows_k)], params={"qw": (4,), "kw": (4,)}, init={"freqs": ROW_FREQS})

# ----------------------------------------------------------------------------
# reductions, embedding, losses
# ----------------------------------------------------------------------------

for name in ("reduce_sum", "reduce_mean"):
    for dims, keepdim, out in [
        ([-1], False, (2, 3)),
        ([-1], True, (2, 3, 1)),
        ([0, 1], False, (4,)),
        ([0, 2], True, (1, 3, 1)),
        ([1], False, (2, 4)),
        ([0, 1, 2], False, ()),
    ]:
        dims_text = ", ".join(map(str, dims))
        case(f"{name}-dims{'_'.join(map(str, dims))}-keepdim-{str(keepdim).lower()}",
             op(f"%y = mdsl.graph.{name} %x {{dims = array<i64: {dims_text}>, keepdim = {str(keepdim).lower()}}} : "
                f"({t(2, 3, 4)}) -> {t(*out)}"),
             {"x": (2, 3, 4)}, [("y", out)])

# reduce_max: distinct values (a random permutation) so each maximum is unique
for dim, keepdim, out in [(-1, False, (2, 3)), (-1, True, (2, 3, 1)), (1, False, (2, 4)), (0, True, (1, 3, 4))]:
    keep = ", keepdim = true" if keepdim else ""
    case(f"reduce_max-dim{dim}-keepdim-{str(keepdim).lower()}",
         op(f"%v, %i = mdsl.graph.reduce_max %x {{dim = {dim} : i64{keep}}} : ({t(2, 3, 4)}) "
            f"-> ({t(*out)}, {t(*out, dtype='int32')})"),
         {"x": (2, 3, 4)}, [("v", out)],
         init={"x": np.random.default_rng(1).permutation(24).reshape(2, 3, 4) / 4.0})

case("embedding",
     op(f"%e = mdsl.graph.embedding %ids, %table : ({t(2, 3, dtype='int32')}, {t(5, 4)}) -> {t(2, 3, 4)}"),
     {"ids": ((2, 3), "int", 0, 5)}, [("e", (2, 3, 4))], params={"table": (5, 4)},
     init={"ids": np.array([[0, 3, 3], [4, 1, 3]])})

LABELS = np.array([2, -100, 0, 4, -100, 1])  # two rows ignored (-100)
for reduction in ("mean", "sum"):
    case(f"cross_entropy-{reduction}",
         op(f'%loss, %lse = mdsl.graph.cross_entropy %logits, %labels {{reduction = "{reduction}"}} : '
            f"({t(6, 5)}, {t(6, dtype='int32')}) -> ({t()}, {t(6)})"),
         {"logits": (6, 5), "labels": ((6,), "int", 0, 5)}, [("loss", ())], init={"labels": LABELS})
    case(f"fused_lm_head_loss-{reduction}",
         op(f'%loss, %lse = mdsl.graph.fused_lm_head_loss %x, %head, %labels {{reduction = "{reduction}"}} : '
            f"({t(6, 4)}, {t(5, 4)}, {t(6, dtype='int32')}) -> ({t()}, {t(6)})"),
         {"x": (6, 4), "labels": ((6,), "int", 0, 5)}, [("loss", ())], params={"head": (5, 4)},
         init={"labels": LABELS})

case("cross_entropy-none-ignore_index",
     op(f'%loss, %lse = mdsl.graph.cross_entropy %logits, %labels {{ignore_index = -1 : i64, reduction = "none"}} : '
        f"({t(6, 5)}, {t(6, dtype='int32')}) -> ({t(6)}, {t(6)})"),
     {"logits": (6, 5), "labels": ((6,), "int", 0, 5)}, [("loss", (6,))], init={"labels": [2, -1, 0, 4, -1, 1]})
case("fused_lm_head_loss-none",
     op(f'%loss, %lse = mdsl.graph.fused_lm_head_loss %x, %head, %labels {{reduction = "none"}} : '
        f"({t(6, 4)}, {t(5, 4)}, {t(6, dtype='int32')}) -> ({t(6)}, {t(6)})"),
     {"x": (6, 4), "labels": ((6,), "int", 0, 5)}, [("loss", (6,))], params={"head": (5, 4)},
     init={"labels": LABELS})

# a chain: the gradients of a value read by several ops add up
case("chain-rmsnorm-matmul-swiglu",
     "\n".join(op(line) for line in [
         f"%n, %rstd = mdsl.graph.rmsnorm %x, %g : ({t(2, 3, 4)}, {t(4)}) -> ({t(2, 3, 4)}, {t(2, 3)})",
         f'%gu = mdsl.graph.matmul %n, %w {{transpose = "NT"}} : ({t(2, 3, 4)}, {t(6, 4)}) -> {t(2, 3, 6)}',
         f"%gate, %up = mdsl.graph.split %gu {{sizes = #mdsl.graph.dims<[3, 3]>}} : ({t(2, 3, 6)}) "
         f"-> ({t(2, 3, 3)}, {t(2, 3, 3)})",
         f"%h = mdsl.graph.swiglu %gate, %up : ({t(2, 3, 3)}, {t(2, 3, 3)}) -> {t(2, 3, 3)}",
         f'%down = mdsl.graph.matmul %h, %w2 {{transpose = "NT"}} : ({t(2, 3, 3)}, {t(4, 3)}) -> {t(2, 3, 4)}',
         f"%y = mdsl.graph.add %x, %down : ({t(2, 3, 4)}, {t(2, 3, 4)}) -> {t(2, 3, 4)}",
     ]),
     {"x": (2, 3, 4)}, [("y", (2, 3, 4))], params={"g": (4,), "w": (6, 4), "w2": (4, 3)})


# ----------------------------------------------------------------------------
# mixture of experts and Mamba
# ----------------------------------------------------------------------------

# moe_router: 5 tokens over 3 experts, top 2 (softmax or sigmoid scores, renormalized or not); the
# weights and the auxiliary loss are both outputs, so both gradients reach x and the gate
for sigmoid in (False, True):
    for normalize in (True, False):
        attrs = f"top_k = 2 : i64, use_sigmoid = {str(sigmoid).lower()}, normalize = {str(normalize).lower()}"
        case(f"moe_router-{'sigmoid' if sigmoid else 'softmax'}-{'normalized' if normalize else 'raw'}",
             op(f"%w, %i, %aux = mdsl.graph.moe_router %x, %gate {{{attrs}, aux_loss_coef = 0.5 : f64}} : "
                f"({t(5, 4)}, {t(3, 4)}) -> ({t(5, 2)}, {t(5, 2, dtype='int32')}, {t()})"),
             {"x": (5, 4)}, [("w", (5, 2)), ("aux", ())], params={"gate": (3, 4)})

# moe_permute / moe_unpermute: 4 tokens, top 2 of 3 experts (3, 2 and 3 assignments)
ROUTING = [[0, 1], [2, 0], [1, 2], [0, 2]]
case("moe_permute",
     op(f"%p, %s = mdsl.graph.moe_permute %x, %idx, %off : ({t(4, 3)}, {t(4, 2, dtype='int32')}, "
        f"{t(4, dtype='int32')}) -> ({t(8, 3)}, {t(8, dtype='int32')})"),
     {"x": (4, 3), "idx": ((4, 2), "int", 0, 3), "off": ((4,), "int", 0, 8)}, [("p", (8, 3))],
     init={"idx": ROUTING, "off": [0, 3, 5, 8]})
case("moe_unpermute",
     op(f"%c = mdsl.graph.moe_unpermute %eo, %w, %s : ({t(8, 3)}, {t(4, 2)}, {t(8, dtype='int32')}) -> {t(4, 3)}"),
     {"w": (4, 2), "s": ((8,), "int", 0, 8)}, [("c", (4, 3))], params={"eo": (8, 3)},
     init={"s": [3, 0, 6, 1, 5, 7, 2, 4]})

# mamba_conv1d: x [B, D, T] through a causal depthwise conv of width 4, with and without a bias
for bias in (True, False):
    for activation in ("silu", "none"):
        bias_operand, bias_type = (" bias %bias", f" bias {t(3)}") if bias else ("", "")
        case(f"mamba_conv1d-{'bias' if bias else 'nobias'}-{activation}",
             op(f'%y = mdsl.graph.mamba_conv1d %x, %w{bias_operand} {{activation = "{activation}"}} : '
                f"{t(2, 3, 5)}, {t(3, 1, 4)}{bias_type} -> {t(2, 3, 5)}"),
             {"x": (2, 3, 5)}, [("y", (2, 3, 5))], params={"w": (3, 1, 4), **({"bias": (3,)} if bias else {})})

# mamba_selective_scan: D 2 channels, N 3 states, one group, T 4 steps, in chunks of 2
case("mamba_selective_scan",
     op(f"%y, %h = mdsl.graph.mamba_selective_scan %u, %dt, %a, %bp, %cp, %ds, %db {{chunk_size = 2 : i64}} : "
        f"({t(1, 2, 4)}, {t(1, 2, 4)}, {t(2, 3)}, {t(1, 1, 3, 4)}, {t(1, 1, 3, 4)}, {t(2)}, {t(2)}) -> "
        f"({t(1, 2, 4)}, {t(1, 2, 3)})"),
     {"u": (1, 2, 4), "dt": (1, 2, 4), "bp": (1, 1, 3, 4), "cp": (1, 1, 3, 4)}, [("y", (1, 2, 4))],
     params={"a": (2, 3), "ds": (2,), "db": (2,)})

# ----------------------------------------------------------------------------
# the tests
# ----------------------------------------------------------------------------


NOT_DIFFERENTIATED = {"freqs", "slopes", "step"}  # RoPE tables, ALiBi slopes and dropout's counter get no gradient


@pytest.mark.parametrize("c", CASES, ids=[c.id for c in CASES])
def test_the_rule_matches_finite_differences(c: Case):
    model = c.model()
    grad = gradient_function(model)
    check_gradient_types(model, grad)
    weights, inputs = c.data()
    checks = verify_backward(model, weights, inputs)  # reuses @forward_grad
    text, ok = report(checks, TOLERANCE)
    assert ok, f"{c.id}\n{text}"
    expected = set(c.params) | {f"input {n}" for n, s in c.inputs.items()
                                if not (len(s) == 4 and s[1] == "int") and n not in NOT_DIFFERENTIATED}
    assert {ch.name for ch in checks} == expected, text


def check_gradient_types(model: ModelOp, grad) -> None:
    """Each gradient has the type of its parameter or input (a sum over broadcast dims not left out)."""
    params = {op.sym_name.data: op.param_type for op in model.body.block.ops if isinstance(op, ParamOp)}
    forward = next(op for op in model.body.block.ops if isinstance(op, FuncOp) and op.sym_name.data == "forward")
    inputs = {a.name_hint: a.type for a in forward.body.block.args}
    names = [a.data for a in grad.attributes["grads"].data]
    input_names = [a.data for a in grad.attributes["input_grads"].data]
    outputs = list(grad.function_type.outputs.data)
    gradients = outputs[len(outputs) - len(names) - len(input_names):]
    expected = [params[n] for n in names] + [inputs[n] for n in input_names]
    assert gradients == expected, f"gradient types {gradients}, expected {expected}"


def rules_exercised(c: Case) -> set[str]:
    """The primitives whose VJP rule builds part of the case's gradient."""
    called: set[str] = set()
    saved = dict(vjp.RULES)

    def recording(name, rule):
        def wrapped(b, forward_op, grads):
            called.add(name)
            return rule(b, forward_op, grads)
        return wrapped

    try:
        for name, rule in saved.items():
            vjp.RULES[name] = recording(name, rule)
        gradient_function(c.model())
    finally:
        vjp.RULES.clear()
        vjp.RULES.update(saved)
    return called


def test_every_rule_has_a_case():
    covered = set().union(*(rules_exercised(c) for c in CASES))
    assert covered == set(vjp.RULES), f"rules without a case: {sorted(set(vjp.RULES) - covered)}"


def test_a_wrong_rule_is_caught():
    """The oracle has teeth: a scale rule off by a factor fails the tolerance."""
    c = next(c for c in CASES if c.id == "scale")
    saved = vjp.RULES["scale"]
    vjp.RULES["scale"] = lambda b, forward_op, grads: [b.one("scale", grads[0], factor=-0.75 * (1 + 1e-4))]
    try:
        weights, inputs = c.data()
        _, ok = report(verify_backward(c.model(), weights, inputs), TOLERANCE)
    finally:
        vjp.RULES["scale"] = saved
    assert not ok


SCHEDULE_CASES = {"reduce_max": "reduce_max_backward", "grouped_gemm": "grouped_gemm_weight_grad",
                  "flash_attention": "attention_backward", "moe_router": "moe_router_backward",
                  "moe_permute": "moe_unpermute", "moe_unpermute": "moe_unpermute_backward",
                  "mamba_conv1d": "mamba_conv1d_backward", "mamba_selective_scan": "mamba_selective_scan_backward"}


@pytest.mark.parametrize("c", [c for c in CASES if c.id.split("-")[0] in SCHEDULE_CASES], ids=lambda c: c.id)
def test_the_gradient_runs_on_the_schedule_executor(c: Case, numpy_cpu_kernels):
    """mdsl-lower-to-sched of the gradient launches the backward kernel (attention's backward
    without ALiBi is its own op, mdsl.sched.attention_backward); its results are the interpreter's."""
    from modeldsl.dialects.sched import AttentionBackwardOp, LaunchOp
    from modeldsl.passes.lower_to_sched import lower_function
    from modeldsl.runtime.executor import GraphExecutor
    from modeldsl.runtime.profiles import plan
    from modeldsl.runtime.sched_executor import run_program

    model = c.model()
    grad = gradient_function(model)
    weights, inputs = c.data()
    rng = np.random.default_rng(1)
    seeds = [rng.standard_normal([d.const_value() for d in seed_type.shape]).astype(np.float32)
             for seed_type in grad.function_type.inputs.data[len(inputs):]]  # one per output
    inputs = [x.astype(np.float32) if x.dtype.kind == "f" else x for x in inputs] + seeds
    weights = {n: w.astype(np.float32) for n, w in weights.items()}
    expected = GraphExecutor(model, weights).run("forward_grad", *inputs)
    program = plan(lower_function(model, "forward_grad", None))
    kernels = {op.kernel.data for op in program.walk() if isinstance(op, LaunchOp)}
    kernels |= {"attention_backward" for op in program.walk() if isinstance(op, AttentionBackwardOp)}
    expected_kernel = "flash_attention_backward" if "alibi" in c.id else SCHEDULE_CASES[c.id.split("-")[0]]
    assert expected_kernel in kernels
    for got, want in zip(run_program(program, weights, inputs), expected, strict=True):
        np.testing.assert_array_equal(got, want)


SYMBOLIC_MEAN = """mdsl.graph.model @m config {{}} {{
  mdsl.graph.func @forward(%x: !mdsl.graph.tensor<[B, 4], fp32>) -> {out} attributes {{kind = "forward"}} {{
    %y = mdsl.graph.reduce_mean %x {{dims = array<i64: {dim}>}} : (!mdsl.graph.tensor<[B, 4], fp32>) -> {out}
    mdsl.graph.return %y : {out}
  }}
}}
"""


def symbolic_mean_model(dim: int, out: str) -> ModelOp:
    module, _ = parse_module(make_context(), SYMBOLIC_MEAN.format(dim=dim, out=out))
    return next(o for o in module.walk() if isinstance(o, ModelOp))


def test_a_mean_over_a_symbolic_dim_is_refused():
    with pytest.raises(AutodiffError, match="gradient of reduce_mean.*symbolic dimension B"):
        gradient_function(symbolic_mean_model(0, "!mdsl.graph.tensor<[4], fp32>"))


def test_a_mean_over_a_concrete_dim_of_a_symbolic_shape():
    model = symbolic_mean_model(1, "!mdsl.graph.tensor<[B], fp32>")
    checks = verify_backward(model, {}, [np.random.default_rng(0).standard_normal((3, 4))])
    text, ok = report(checks, TOLERANCE)
    assert ok and [c.name for c in checks] == ["input x"], text


@pytest.mark.parametrize("forward, outputs", [
    (f"%y, %s = mdsl.graph.rmsnorm %x, %w : ({t(2, 4)}, {t(4)}) -> ({t(2, 4)}, {t(2)})", "rstd"),
    (f"%y, %s, %r = mdsl.graph.layernorm %x, %w : ({t(2, 4)}, {t(4)}) -> ({t(2, 4)}, {t(2)}, {t(2)})", "mean"),
    (f"%r, %y, %s = mdsl.graph.fused_residual_rmsnorm %x, %x, %w : ({t(2, 4)}, {t(2, 4)}, {t(4)}) "
     f"-> ({t(2, 4)}, {t(2, 4)}, {t(2)})", "rstd"),
    (f"%y, %s = mdsl.graph.cross_entropy %x, %ids : ({t(2, 4)}, {t(2, dtype='int32')}) -> ({t()}, {t(2)})", "lse"),
])
def test_a_gradient_reaching_a_statistic_is_refused(forward, outputs):
    """A function that returns (or reads) rstd, mean or lse: the rules differentiate the primary
    results only, so autodiff refuses it instead of dropping that gradient."""
    y_type = t() if "cross_entropy" in forward else t(2, 4)
    text = f"""mdsl.graph.model @m config {{}} {{
  mdsl.graph.param @w : {t(4)}
  mdsl.graph.func @forward(%x: {t(2, 4)}, %ids: {t(2, dtype='int32')}) -> ({y_type}, {t(2)})
      attributes {{kind = "forward"}} {{
    %w = mdsl.graph.param_ref @w : {t(4)}
    {forward}
    mdsl.graph.return %y, %s : {y_type}, {t(2)}
  }}
}}
"""
    module, _ = parse_module(make_context(), text)
    with pytest.raises(AutodiffError, match=f"statistic result '{outputs}'"):
        gradient_function(next(o for o in module.walk() if isinstance(o, ModelOp)))
