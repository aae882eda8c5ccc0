"""VJP rules: the gradient of each primitive, written as ``mdsl.graph`` ops.

Each primitive's rule is on its entry in :mod:`modeldsl.prims` (one module per
family, written with the helpers of :mod:`modeldsl.prims.grads`). A rule takes
a :class:`GraphBuilder`, the forward op and the gradient of each of its results
(None where no gradient flows, e.g. to ``rstd``) and returns the gradient of
each operand (None for operands that get none: token ids, labels, RoPE tables
are not differentiated). A gradient that reaches a statistic result (``rstd``,
``mean``, ``lse``) is refused, not dropped. Rules reuse the primitives'
explicit ``*_backward`` ops where the spec has one (spec section 6), so the
kernels that run a derived backward are those a written backward calls.

:data:`RULES` maps each primitive's name to its rule, read off the registry
when this module loads; ``mdsl-autodiff`` looks rules up there (so a test may
replace one for a while).
"""

from __future__ import annotations

from modeldsl.prims import registry
from modeldsl.prims.base import VJPRule
from modeldsl.prims.grads import (
    Grad,
    forward_params,
    or_zeros,
    refuse_statistics_gradients,
    unbroadcast,
    zeros_like,
)

__all__ = ["RULES", "Grad", "VJPRule", "forward_params", "or_zeros", "refuse_statistics_gradients", "unbroadcast",
           "zeros_like"]

RULES: dict[str, VJPRule] = {entry.name: entry.vjp for entry in registry().values() if entry.vjp is not None}
