"""Indexing (spec 5.11.4): ``x[i]``, ``x[:, a:b]``, ``x[..., -1]`` as views of ``x``: a
``split`` per sliced axis, then a ``view`` that drops the indexed axes.
"""

from __future__ import annotations

from xdsl.ir import SSAValue

from modeldsl.diagnostics import Span
from modeldsl.frontend.text import ast
from modeldsl.instances import (
    Instance,
    LoweringFailed,
)
from modeldsl.primitives import lookup_primitive
from modeldsl.resolve.consts import ConstEnv
from modeldsl.resolve.scope import Scope
from modeldsl.symbolic import STAR, Expr


class IndexingMixin:
    """Indexing: subscripts as split and view primitives."""

    def indexed(self, instance: Instance, node: ast.Index, scope: Scope) -> SSAValue:
        """``x[i]``, ``x[:, a:b]``, ``x[..., -1]``: views of ``x`` (a ``split`` per sliced
        axis, then a ``view`` that drops the indexed axes). Bounds are ConstExprs."""
        value = self.indexed(instance, node.base, scope) if isinstance(node.base, ast.Index) \
            else self.tensor(instance, node.base, scope)
        shape = list(value.type.shape)
        if any(d is STAR for d in shape):
            self.sink.error("E004", "a tensor with '*' dimensions cannot be indexed", node.span)
            raise LoweringFailed()
        subscripts = self.expand_ellipsis(node, len(shape))
        dropped: list[int] = []
        for axis, sub in enumerate(subscripts):
            if sub is None or isinstance(sub, ast.Slice) and sub.lower is None and sub.upper is None:
                continue
            start, stop = self.index_bounds(sub, shape[axis], instance.env)
            if not isinstance(sub, ast.Slice):
                dropped.append(axis)
            value = self.split_out(value, axis, start, stop, sub.span)
        if dropped:
            kept = [d for axis, d in enumerate(value.type.shape) if axis not in dropped]
            value = self.emit_primitive(lookup_primitive("view"), [value], {"shape": kept}, node.span).results[0]
        return value

    def expand_ellipsis(self, node: ast.Index, rank: int) -> list[ast.Expr | None]:
        """One subscript per axis (None where ``...`` or the end leaves it whole)."""
        subs = list(node.subscripts)
        ellipses = [i for i, s in enumerate(subs) if isinstance(s, ast.EllipsisLit)]
        if len(ellipses) > 1:
            self.sink.error("E001", "an index holds at most one '...'", subs[ellipses[1]].span)
            raise LoweringFailed()
        if ellipses:
            at = ellipses[0]
            subs = [*subs[:at], *[None] * (rank - len(subs) + 1), *subs[at + 1:]]
        if len(subs) > rank:
            self.sink.error("E004", f"{len(subs)} subscripts for a tensor of rank {rank}", node.span)
            raise LoweringFailed()
        return subs + [None] * (rank - len(subs))

    def index_bounds(self, sub: ast.Expr, size: Expr, env: ConstEnv) -> tuple[Expr, Expr]:
        """[start, stop) of an index or slice on an axis of ``size``; negative counts from the end."""
        def bound(node: ast.Expr | None, default: Expr) -> Expr:
            if node is None:
                return default
            value = self.const(node, env, "index")
            if isinstance(value, bool) or not isinstance(value, (int, Expr)):
                self.sink.error("E004", f"an index is an integer, got {value!r}", node.span)
                raise LoweringFailed()
            return Expr.of(size) + value if isinstance(value, int) and value < 0 else Expr.of(value)

        if isinstance(sub, ast.Slice):
            start, stop = bound(sub.lower, Expr.of(0)), bound(sub.upper, Expr.of(size))
        else:
            start = bound(sub, Expr.of(0))
            stop = start + 1
        known = [b.const_value() for b in (start, stop, Expr.of(size))]
        if None not in known and not 0 <= known[0] < known[1] <= known[2]:
            self.sink.error("E004", f"index {sub.span.text} is out of range for a dimension of size {known[2]}",
                            sub.span)
            raise LoweringFailed()
        return start, stop

    def split_out(self, value: SSAValue, axis: int, start: Expr, stop: Expr, span: Span) -> SSAValue:
        """The part [start, stop) of ``value`` along ``axis`` (a ``split`` into up to three views)."""
        size = Expr.of(value.type.shape[axis])
        pieces = [(start, False), (stop - start, True), (size - stop, False)]
        pieces = [(p, mine) for p, mine in pieces if mine or p.const_value() != 0]
        if len(pieces) == 1:
            return value
        op = self.emit_primitive(lookup_primitive("split"), [value],
                                 {"sizes": [p for p, _ in pieces], "dim": axis}, span)
        return op.results[[mine for _, mine in pieces].index(True)]
