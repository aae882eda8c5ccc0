"""Tensor types written in the source (``[B, T, d_model, fp32]``): dimensions are ConstExprs
over symbolic sizes, a last entry spelled like a dtype names the element type (E003 for a
typo such as ``fp31``).
"""

from __future__ import annotations

import difflib
import re
from typing import Any

from modeldsl.dialects.dtypes import DTYPE_SPELLINGS
from modeldsl.dialects.graph_types import TensorType
from modeldsl.frontend.text import ast
from modeldsl.instances import (
    LoweringFailed,
)
from modeldsl.resolve.consts import ConstEnv
from modeldsl.symbolic import STAR, Expr, SymbolicError


class TensorTypesMixin:
    """Tensor types: shapes and dtypes of signatures, parameters and type assertions."""

    def tensor_type(self, expr: ast.Expr, env: ConstEnv) -> TensorType:
        if not isinstance(expr, ast.ListExpr):
            self.sink.error("E003", "expected a tensor type like [B, T, d_model]", expr.span)
            raise LoweringFailed()
        items = list(expr.items)
        dtype = DEFAULT_DTYPE
        if items and isinstance(items[-1], ast.Name) and items[-1].id in DTYPE_SPELLINGS:
            dtype = items.pop().id
        elif items and dtype_typo(items[-1], env):
            self.unknown_dtype(items[-1])
        dims: list[Any] = []
        for item in items:
            if isinstance(item, ast.Star):
                dims.append(STAR)
            else:
                dims.append(self.dim(item, env))
        try:
            return TensorType(dims, dtype)
        except SymbolicError as err:
            self.sink.error("E004", str(err), expr.span)
            raise LoweringFailed() from None

    def unknown_dtype(self, node: ast.Name) -> None:
        """E003 at a last shape entry spelled like a dtype (``fp31``) that is none."""
        close = difflib.get_close_matches(node.id, DTYPE_SPELLINGS, n=1, cutoff=0.5)
        hint = f"did you mean '{close[0]}'? " if close else ""
        self.sink.error("E003", f"unknown dtype '{node.id}'", node.span,
                        f"{hint}the dtypes are {', '.join(DTYPE_SPELLINGS)}")
        raise LoweringFailed()

    def dim(self, node: ast.Expr, env: ConstEnv) -> Expr:
        shape_env = env.child()
        for name in _free_names(node):
            if not env.lookup(name)[0]:
                shape_env.values[name] = Expr.sym(name)  # a symbolic dimension such as B or T
        value = self.const(node, shape_env, "shape dimension")
        if isinstance(value, bool) or not isinstance(value, (int, Expr)):
            self.sink.error("E004", f"a dimension must be an integer, got {value!r}", node.span)
            raise LoweringFailed()
        return Expr.of(value)


DEFAULT_DTYPE = "bf16"


# A last shape entry spelled like an element type (fp31, bf61, int4, float32) is a dtype typo, not a size.
DTYPE_LIKE = re.compile(r"^((fp|bf|float|bfloat|int|uint)\d+|[iuf]\d{2,})(_\w*)?$")


SCALAR = TensorType([], DEFAULT_DTYPE)  # ``out: scalar``: compared by identity, any dtype


SCALAR_TYPES = ("int", "float", "bool", "string", "scalar")


def dtype_typo(node: ast.Expr, env: ConstEnv) -> bool:
    """A name spelled like a dtype (fp31) that is neither a dtype nor a known value."""
    return isinstance(node, ast.Name) and node.id not in DTYPE_SPELLINGS and bool(DTYPE_LIKE.match(node.id)) \
        and not env.lookup(node.id)[0]


def has_dtype(expr: ast.Expr) -> bool:
    """Whether a tensor type names its dtype (``[B, T, int32]``)."""
    return isinstance(expr, ast.ListExpr) and bool(expr.items) and isinstance(expr.items[-1], ast.Name) \
        and expr.items[-1].id in DTYPE_SPELLINGS


def scalar_name(expr: ast.Expr) -> str | None:
    return expr.id if isinstance(expr, ast.Name) and expr.id in SCALAR_TYPES else None


def _free_names(node: ast.Expr) -> list[str]:
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Binary):
        return _free_names(node.lhs) + _free_names(node.rhs)
    if isinstance(node, ast.Unary):
        return _free_names(node.operand)
    return []
