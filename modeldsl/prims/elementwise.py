"""Elementwise arithmetic (spec 6.6): add, mul, sub, div, bias_add, scale, add3, add_scalar, exp,
log, tanh, sigmoid, rsqrt, the backwards of add and mul. Each kernel reads an element before
writing it, so the output may take over the buffer of its first input when that input dies."""

from __future__ import annotations

from modeldsl.dialects.graph_primitives import (
    Add3Op,
    AddBackwardOp,
    AddOp,
    AddScalarOp,
    BiasAddOp,
    ClipNormOp,
    DivOp,
    DropoutOp,
    ExpOp,
    LogOp,
    MulBackwardOp,
    MulOp,
    RsqrtOp,
    ScaleOp,
    SigmoidOp,
    SubOp,
    TanhOp,
    bool_attr,
    broadcast_shape,
)
from modeldsl.prims.base import InferenceError, Primitive, op_attr, same
from modeldsl.prims.counts import per_output_element
from modeldsl.prims.grads import checked, unbroadcast

IN_PLACE = {0: 0}
ONE = per_output_element(1)


def infer_broadcast(ts, p):
    a, b = ts[0], ts[1]
    shape = broadcast_shape("operands", a, b)
    if shape is None:  # a variadic '*' hides the rank: the longer shape stands for the result
        return [a if len(a.shape) >= len(b.shape) else b]
    return [a.with_shape(shape)]


def infer_add_backward(ts, p):
    raise InferenceError("add_backward needs the shapes of a and b; give the result types explicitly")


def vjp_add(b, op, grads):
    """The sums add_backward computes, written as reduce_sum/view: the CUDA table covers those, not
    add_backward (nor mul_backward below), and every residual add of a model takes this rule."""
    return [unbroadcast(b, grads[0], x) for x in op.operands]


def vjp_add3(b, op, grads):
    return [grads[0]] * 3


def vjp_mul(b, op, grads):
    x, y = op.operands
    return [unbroadcast(b, b.one("mul", grads[0], y), x), unbroadcast(b, b.one("mul", grads[0], x), y)]


def vjp_scale(b, op, grads):
    return [b.one("scale", grads[0], factor=op_attr(op, "factor"))]


def vjp_add_scalar(b, op, grads):
    return [grads[0]]


def vjp_sub(b, op, grads):
    x, y = op.operands
    return [unbroadcast(b, grads[0], x), unbroadcast(b, b.one("scale", grads[0], factor=-1.0), y)]


def vjp_div(b, op, grads):
    """d_a = g / b; d_b = -g a / b^2 = -(g / b) * out."""
    x, y = op.operands
    g_over_y = b.one("div", grads[0], y)
    d_y = b.one("scale", b.one("mul", g_over_y, op.results[0]), factor=-1.0)
    return [unbroadcast(b, g_over_y, x), unbroadcast(b, d_y, y)]


def vjp_exp(b, op, grads):
    return [b.one("mul", grads[0], op.results[0])]


def vjp_log(b, op, grads):
    """g / x."""
    return [b.one("div", grads[0], op.operands[0])]


def vjp_tanh(b, op, grads):
    """g * (1 - out^2)."""
    out = op.results[0]
    return [b.one("mul", grads[0], one_minus(b, b.one("mul", out, out)))]


def vjp_sigmoid(b, op, grads):
    """g * out * (1 - out)."""
    out = op.results[0]
    return [b.one("mul", b.one("mul", grads[0], out), one_minus(b, out))]


def vjp_rsqrt(b, op, grads):
    """g * -0.5 * out^3."""
    out = op.results[0]
    cube = b.one("mul", b.one("mul", out, out), out)
    return [b.one("mul", grads[0], b.one("scale", cube, factor=-0.5))]


def one_minus(b, value):
    return b.one("add_scalar", b.one("scale", value, factor=-1.0), value=1.0)


def vjp_bias_add(b, op, grads):
    x, bias = op.operands
    return [grads[0], unbroadcast(b, grads[0], bias)]


def vjp_dropout(b, op, grads):
    """The same mask (the same seed, offset, p and step counter; the same layer where it runs in the
    same layer of a stack) on the upstream gradient, scaled alike: dropout of the gradient,
    regenerated from the counter rather than stored. The step operand has no gradient."""
    attrs = {name: op_attr(op, name) for name in ("p", "seed", "offset", "training")}
    return [b.one("dropout", grads[0], op.step, **attrs), *([None] if op.step is not None else [])]


def unary(op, vjp, flops=ONE, **kw) -> Primitive:
    """An elementwise op of one operand, computed in place."""
    return Primitive(op, same(0), flops, checked(vjp), reuse=IN_PLACE, **kw)


ENTRIES = (
    Primitive(AddOp, infer_broadcast, ONE, checked(vjp_add), reuse=IN_PLACE, fusion_kinds=("add",), cpu=True),
    Primitive(AddBackwardOp, infer_add_backward, ONE, cuda="none"),
    Primitive(MulOp, infer_broadcast, ONE, checked(vjp_mul), reuse=IN_PLACE, cpu=True),
    Primitive(MulBackwardOp, same(1, 2), ONE, cuda="none"),
    Primitive(SubOp, infer_broadcast, ONE, checked(vjp_sub), reuse=IN_PLACE),
    Primitive(DivOp, infer_broadcast, ONE, checked(vjp_div), reuse=IN_PLACE),
    Primitive(BiasAddOp, same(0), ONE, checked(vjp_bias_add), reuse=IN_PLACE, fusion_kinds=("add",)),
    Primitive(Add3Op, same(0), per_output_element(2), checked(vjp_add3), reuse=IN_PLACE, fusion_kinds=("add",)),
    unary(ScaleOp, vjp_scale, fusion_kinds=("scale",)),
    # a gradient transform (@gradient(clip=C)): autodiff never differentiates through it
    Primitive(ClipNormOp, same(0), per_output_element(3), no_vjp="a transform of the backward's gradients "
              "(@gradient(clip=C)), never differentiated", cuda="none"),
    unary(AddScalarOp, vjp_add_scalar),
    unary(ExpOp, vjp_exp),
    unary(LogOp, vjp_log),
    unary(TanhOp, vjp_tanh),
    unary(SigmoidOp, vjp_sigmoid, per_output_element(4)),  # negate, exp, add, divide
    unary(RsqrtOp, vjp_rsqrt),
    # one hash and a select per element; active only in a training step (mdsl-autodiff sets training),
    # else mdsl-lower-to-sched makes it an alias of x
    unary(DropoutOp, vjp_dropout, fusion_kinds=("dropout",), training={"training": bool_attr(True)}, cpu=True),
)
