"""``mdsl.graph.custom``: one call of a user primitive.

A user primitive is a numpy function registered with :func:`modeldsl.register_primitive`
(:mod:`modeldsl.prims.user`), with its shape rule and, optionally, its VJP. Every call of one is
this generic op, named by the registered name::

    %y = mdsl.graph.custom "softplus"(%x) {beta = 2.0 : f64} : (!t) -> !t

Its operands are the primitive's tensor inputs in order, its results its outputs, and its
attributes its parameters (all of them: a call's defaults are written out), beside the usual
``annotations``. The op is pure. Its verifier checks the form (a callee, at least one result)
and, where the callee is registered in this process, everything the registration says: the
number of operands, the parameters, and the result types the shape rule gives for the operands
(:data:`CUSTOM_CHECKS`, filled by the registry: the dialect knows no registration). An op of a
callee that is not registered parses, prints and verifies as an opaque call; the passes that
need its rules (autodiff, lower-to-sched, the executors) report the missing registration.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from xdsl.dialects.builtin import StringAttr
from xdsl.ir import Attribute, SSAValue
from xdsl.irdl import IRDLOperation, irdl_op_definition, prop_def, traits_def, var_operand_def, var_result_def
from xdsl.traits import Pure
from xdsl.utils.exceptions import VerifyException

from modeldsl.dialects.annotations import check_annotations
from modeldsl.dialects.graph_types import TensorType

# callee -> the check of an op against its registration (raises VerifyException); see modeldsl.prims.user
CUSTOM_CHECKS: dict[str, Callable[["CustomOp"], None]] = {}
CALLEE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


@irdl_op_definition
class CustomOp(IRDLOperation):
    """A call of the user primitive ``callee`` (see the module docstring)."""

    name = "mdsl.graph.custom"

    callee = prop_def(StringAttr)
    inputs = var_operand_def(TensorType)
    outputs = var_result_def(TensorType)

    traits = traits_def(Pure())
    assembly_format = "$callee `(` $inputs `)` attr-dict `:` functional-type($inputs, $outputs)"

    @classmethod
    def make_custom(cls, callee: str, operands: Sequence[SSAValue], result_types: Sequence[Attribute],
                    attributes: dict[str, Attribute] | None = None) -> "CustomOp":
        return cls.build(operands=[list(operands)], result_types=[list(result_types)],
                         properties={"callee": StringAttr(callee)}, attributes=dict(attributes or {}))

    @property
    def primitive(self) -> str:
        """The registered name of the primitive it calls."""
        return self.callee.data

    def verify_(self) -> None:
        check_annotations(self)
        if not CALLEE.fullmatch(self.callee.data):
            raise VerifyException(f"callee '{self.callee.data}' is not a primitive name (a dotted identifier)")
        if not self.outputs:
            raise VerifyException(f"a call of {self.callee.data} has at least one result")
        check = CUSTOM_CHECKS.get(self.callee.data)
        if check is not None:
            check(self)
