"""Building ``mdsl.graph`` primitive ops from Python: operands in, typed results out.

Passes that create graph ops (autodiff's VJP rules, fusion, the loss) call
``GraphBuilder.op("rmsnorm_backward", d_y, x, w, rstd)``: the result types
come from the primitive's shape rule (:mod:`modeldsl.infer`), parameters are
plain Python values converted to the op's attributes, and the op is verified
before it is inserted. Ops go in at an xDSL insertion point through a
``Builder``: inside a pattern, give its ``PatternRewriter``
(``GraphBuilder.at(InsertPoint.before(op), rewriter)``), so the walker's
worklist sees every op a rewrite inserts.
"""

from __future__ import annotations

from typing import Any

from xdsl.builder import Builder
from xdsl.dialects.builtin import FloatAttr, IntegerAttr, StringAttr
from xdsl.ir import Block, Operation, SSAValue
from xdsl.rewriter import InsertPoint

from modeldsl.dialects.graph_types import DimsAttr, SymbolicAttr
from modeldsl.infer import infer_result_types
from modeldsl.primitives import lookup_primitive


class GraphBuildError(Exception):
    """A primitive that does not exist, or operands and parameters it does not take."""


class GraphBuilder:
    """Inserts primitive ops at an insertion point through a ``Builder`` (a pattern's rewriter, or a
    plain builder there). ``GraphBuilder(block)`` appends to a block, ``GraphBuilder(block, before=op)``
    inserts before ``op``; :meth:`at` takes the insertion point and the rewriter."""

    def __init__(self, block: Block | None = None, before: Operation | None = None, *,
                 point: InsertPoint | None = None, builder: Builder | None = None):
        if point is None:
            point = InsertPoint.before(before) if before is not None else InsertPoint.at_end(block)
        self.point = point
        self.builder = builder if builder is not None else Builder(point)

    @classmethod
    def at(cls, point: InsertPoint, rewriter: Builder | None = None) -> GraphBuilder:
        """Ops inserted at ``point``, through ``rewriter`` (a ``PatternRewriter``) when given."""
        return cls(point=point, builder=rewriter)

    @property
    def block(self) -> Block:
        return self.point.block

    def op(self, name: str, *operands: SSAValue | None, result_types: list | None = None,
           **params: Any) -> list[SSAValue]:
        """The results of primitive ``name`` on ``operands`` (None for an absent optional one);
        ``result_types`` where the shape rule cannot tell them (``embedding_backward``)."""
        sig = lookup_primitive(name)
        if sig is None:
            raise GraphBuildError(f"no primitive '{name}'")
        present = [v for v in operands if v is not None]
        # an absent optional before a present one (ALiBi's slopes before segment ids): its slot stays empty
        absent = () if len(present) == len(operands) or any(s.variadic for s in sig.inputs) else \
            tuple(i for i, v in enumerate(operands) if v is None and i < len(sig.inputs) and sig.inputs[i].optional
                  and any(w is not None for w in operands[i + 1:]))
        try:
            types = result_types or infer_result_types(name, [v.type for v in present], params)
            attrs = {k: sig.param(k).to_attribute(sig.param(k).python_value(v))
                     for k, v in params.items() if v is not None and sig.param(k) is not None}
            op = sig.make(sig.group_operands(present, absent), sig.group_results(types), attrs)
            op.verify_()
        except Exception as err:  # noqa: BLE001 - a rule that builds a wrong op is a bug; say which
            raise GraphBuildError(f"{name}: {err}") from err
        self.builder.insert(op, self.point)
        return list(op.results)

    def one(self, name: str, *operands: SSAValue | None, **params: Any) -> SSAValue:
        """The single (first) result of a primitive."""
        return self.op(name, *operands, **params)[0]


def op_attr(op: Operation, name: str, default: Any = None) -> Any:
    """A graph op's attribute as a Python value (sizes stay symbolic ``Expr``, a ``#mdsl.graph.sym`` is its
    expression); ``default`` when absent."""
    value = op.attributes.get(name)
    if value is None:
        return default
    if isinstance(value, StringAttr):
        return value.data
    if isinstance(value, FloatAttr):
        return value.value.data
    if isinstance(value, IntegerAttr):
        return bool(value.value.data) if value.type.width.data == 1 else value.value.data
    if isinstance(value, DimsAttr):
        return list(value.data)
    if isinstance(value, SymbolicAttr):  # a size expression (num_experts) or a tree (1.0 / sqrt(d_head))
        return value.value()
    return list(value.get_values())
