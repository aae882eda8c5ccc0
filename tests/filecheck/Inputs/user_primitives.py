"""User primitives for the FileCheck tests (``MDSL_PRIMITIVES=%S/../Inputs/user_primitives.py``):
``softplus`` with its VJP, ``swish_beta`` without one, and ``pair_sum``, whose shape rule gives two
outputs of their own types."""

from typing import Literal

import numpy as np

import modeldsl


def softplus(x, *, beta: float = 1.0):
    return np.logaddexp(0.0, beta * x) / beta


def softplus_vjp(d_out, x, out, *, beta: float = 1.0):
    return d_out / (1.0 + np.exp(-beta * x))


def swish_beta(x, *, beta: float = 1.0):
    return x / (1.0 + np.exp(-beta * x))


def pair_sum(a, b, *, mode: Literal["rows", "all"] = "rows"):
    total = a + b
    return total, total.sum(axis=-1) if mode == "rows" else np.full(a.shape[:-1], total.sum())


def pair_sum_shape(a, b, *, mode):
    return a, modeldsl.TensorSpec(a.shape[:-1], "fp32")


modeldsl.register_primitive("softplus", softplus, vjp=softplus_vjp, flops=4)
modeldsl.register_primitive("swish_beta", swish_beta)
modeldsl.register_primitive("pair_sum", pair_sum, shape=pair_sum_shape, outputs=("total", "rows"))
