"""The primitive ops of ``mdsl.graph``: one op per primitive of spec 000 section 6.

Every primitive op is pure and prints in one uniform form::

    %y = mdsl.graph.matmul %x, %w {transpose = "NT"} : (!t0, !t1) -> !t2

Parameters of a primitive are attributes; a parameter equal to its default is
not printed. Enumerated parameters are strings checked against their allowed
values. Each op's verifier enforces the spec's shape and dtype rules wherever
the dimensions involved are known: two symbolic dimensions that merely look
different may be bound equal later, so only provably different dimensions
(:func:`modeldsl.symbolic.definitely_different`) are rejected.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from xdsl.dialects.builtin import (
    BoolAttr,
    FloatAttr,
    IntegerAttr,
    IntegerType,
    StringAttr,
    f64,
    i64,
)
from xdsl.ir import Attribute, Operation, SSAValue
from xdsl.irdl import (
    IRDLOperation,
    attr_def,
    irdl_op_definition,
    operand_def,
    opt_attr_def,
    result_def,
    traits_def,
    var_operand_def,
    var_result_def,
)
from xdsl.traits import Pure
from xdsl.utils.exceptions import VerifyException

from modeldsl.dialects.dtypes import DType
from modeldsl.dialects.graph_types import DimsAttr, TensorType
from modeldsl.symbolic import STAR, Dim, Expr, definitely_different, numel

UNIFORM_FORMAT = "operands attr-dict `:` functional-type(operands, results)"

TRANSPOSE_MODES = ("NN", "NT", "TN", "TT")
FLOAT_DTYPES = tuple(d for d in DType if d.is_float)
INDEX_DTYPES = (DType.INT32, DType.INT64)


# ----------------------------------------------------------------------------
# Attribute helpers
# ----------------------------------------------------------------------------


def enum_param(default: str):
    return attr_def(StringAttr, default_value=StringAttr(default))


def float_param(default: float):
    return attr_def(FloatAttr, default_value=FloatAttr(default, f64))


def int_param(default: int):
    return attr_def(IntegerAttr, default_value=IntegerAttr(default, i64))


def bool_param(default: bool):
    return attr_def(IntegerAttr[IntegerType], default_value=BoolAttr.from_bool(default))


def float_attr(value: float) -> FloatAttr:
    return FloatAttr(float(value), f64)


def int_attr(value: int) -> IntegerAttr:
    return IntegerAttr(int(value), i64)


def bool_attr(value: bool) -> IntegerAttr:
    return BoolAttr.from_bool(bool(value))


# ----------------------------------------------------------------------------
# Shape-rule helpers used by the verifiers
# ----------------------------------------------------------------------------


def tensor(value: SSAValue) -> TensorType:
    t = value.type
    if not isinstance(t, TensorType):
        raise VerifyException(f"expected a !mdsl.graph.tensor, got {t}")
    return t


def dim_at(t: TensorType, index: int) -> Dim:
    """Dimension ``index`` (negative counts from the end); STAR if it falls in ``*``."""
    shape = t.shape
    if index < 0:
        index += len(shape)
        if t.is_variadic and index <= 0:
            return STAR
    elif t.is_variadic:
        return STAR
    if not 0 <= index < len(shape):
        raise VerifyException(f"dimension {index} is out of range for {t}")
    return shape[index]


def check_dim(what: str, a: Dim, b: Dim) -> None:
    if definitely_different(a, b):
        raise VerifyException(f"{what}: {a} != {b}")


def check_rank(what: str, t: TensorType, *ranks: int) -> None:
    """The rank must be one of ``ranks``; a variadic shape only needs enough dims."""
    if t.is_variadic:
        if len(t.shape) - 1 > max(ranks):
            raise VerifyException(f"{what} must have rank {' or '.join(map(str, ranks))}, got {t}")
        return
    if t.rank not in ranks:
        raise VerifyException(f"{what} must have rank {' or '.join(map(str, ranks))}, got {t}")


def check_min_rank(what: str, t: TensorType, rank: int) -> None:
    if not t.is_variadic and t.rank < rank:
        raise VerifyException(f"{what} must have rank >= {rank}, got {t}")


def check_same_shape(what: str, a: TensorType, b: TensorType) -> None:
    """Equal shapes, comparing from the right when a variadic ``*`` is involved."""
    sa, sb = a.shape, b.shape
    if a.is_variadic or b.is_variadic:
        ta = sa[1:] if a.is_variadic else sa
        tb = sb[1:] if b.is_variadic else sb
        n = min(len(ta), len(tb))
        pairs = zip(ta[len(ta) - n :], tb[len(tb) - n :])
    else:
        if len(sa) != len(sb):
            raise VerifyException(f"{what}: shapes {_shape(a)} and {_shape(b)} differ in rank")
        pairs = zip(sa, sb)
    for da, db in pairs:
        if definitely_different(da, db):
            raise VerifyException(f"{what}: shapes {_shape(a)} and {_shape(b)} differ")


def check_same_dtype(what: str, *types: TensorType) -> None:
    dtypes = {t.dtype for t in types}
    if len(dtypes) > 1:
        raise VerifyException(f"{what}: element types differ ({', '.join(sorted(d.value for d in dtypes))})")


def check_dtype_in(what: str, t: TensorType, allowed: Sequence[DType]) -> None:
    if t.dtype not in allowed:
        raise VerifyException(
            f"{what} must have element type {' or '.join(d.value for d in allowed)}, got {t.dtype.value}"
        )


def check_enum(op: Operation, name: str, allowed: Sequence[str]) -> None:
    attr = op.attributes.get(name)
    if isinstance(attr, StringAttr) and attr.data not in allowed:
        raise VerifyException(f"{name} must be one of {', '.join(allowed)}, got '{attr.data}'")


def check_numel_equal(what: str, a: TensorType, b: TensorType) -> None:
    na, nb = numel(a.shape), numel(b.shape)
    if na is not None and nb is not None and definitely_different(na, nb):
        raise VerifyException(f"{what}: {_shape(a)} has {na} elements, {_shape(b)} has {nb}")


def normalize_axis(what: str, axis: int, rank: int) -> int:
    if not -rank <= axis < rank:
        raise VerifyException(f"{what} {axis} is out of range for rank {rank}")
    return axis % rank


def _shape(t: TensorType) -> str:
    return "[" + ", ".join(str(d) for d in t.shape) + "]"


def get_float(op: Operation, name: str) -> float:
    attr = op.attributes[name]
    assert isinstance(attr, FloatAttr)
    return attr.value.data


def get_int(op: Operation, name: str) -> int:
    attr = op.attributes[name]
    assert isinstance(attr, IntegerAttr)
    return attr.value.data


# ----------------------------------------------------------------------------
# The base class
# ----------------------------------------------------------------------------


class PrimitiveOp(IRDLOperation):
    """Base of every primitive op: pure, uniform assembly format.

    Subclasses declare ``ENUMS`` (attribute name -> allowed values) and
    implement ``verify_shapes``.
    """

    ENUMS: ClassVar[dict[str, tuple[str, ...]]] = {}

    traits = traits_def(Pure())
    assembly_format = UNIFORM_FORMAT

    def verify_(self) -> None:
        for name, allowed in self.ENUMS.items():
            check_enum(self, name, allowed)
        self.verify_shapes()

    def verify_shapes(self) -> None:
        pass

    @classmethod
    def make(
        cls,
        operands: Sequence[SSAValue | Sequence[SSAValue]],
        result_types: Sequence[Attribute | Sequence[Attribute]],
        attributes: dict[str, Attribute] | None = None,
    ):
        """Create the op from operands, result types and attributes."""
        return cls.create(
            operands=[v for group in operands for v in (group if isinstance(group, (list, tuple)) else [group])],
            result_types=[t for group in result_types for t in (group if isinstance(group, (list, tuple)) else [group])],
            attributes=attributes or {},
        )



__all__ = [
    "PrimitiveOp",
    "PRIMITIVE_OPS",
    "DimsAttr",
    "Expr",
    "operand_def",
    "result_def",
    "var_operand_def",
    "var_result_def",
    "opt_attr_def",
    "irdl_op_definition",
    "get_float",
    "get_int",
]


# ----------------------------------------------------------------------------
# 6.1 Linear algebra
# ----------------------------------------------------------------------------


def matmul_dims(transpose: str, a: TensorType, b: TensorType) -> tuple[Dim, Dim, Dim, Dim]:
    """(M, K_of_A, K_of_B, N) of ``op(A) @ op(B)`` for the last two dims."""
    ta, tb = transpose[0] == "T", transpose[1] == "T"
    a_rows, a_cols = dim_at(a, -2), dim_at(a, -1)
    b_rows, b_cols = dim_at(b, -2), dim_at(b, -1)
    m, ka = (a_cols, a_rows) if ta else (a_rows, a_cols)
    kb, n = (b_cols, b_rows) if tb else (b_rows, b_cols)
    return m, ka, kb, n


@irdl_op_definition
class MatmulOp(PrimitiveOp):
    """``C = alpha * op(A) @ op(B) (+ beta * C)``; ``NT`` is ``A @ B^T``.

    A may have leading dims (``[*, K]`` activations against a ``[N, K]``
    weight); B is a matrix.
    """

    name = "mdsl.graph.matmul"
    ENUMS: ClassVar[dict[str, tuple[str, ...]]] = {"transpose": TRANSPOSE_MODES}

    a = operand_def(TensorType)
    b = operand_def(TensorType)
    c = result_def(TensorType)
    transpose = enum_param("NN")
    accumulate = bool_param(False)
    alpha = float_param(1.0)
    beta = float_param(0.0)

    def verify_shapes(self) -> None:
        a, b, c = tensor(self.a), tensor(self.b), tensor(self.c)
        check_min_rank("A", a, 2 if self.transpose.data[0] == "T" else 1)
        check_rank("B", b, 2)
        if a.is_variadic or a.rank > 2:
            if self.transpose.data[0] == "T":
                raise VerifyException("A with leading batch dims cannot be transposed")
        m, ka, kb, n = matmul_dims(self.transpose.data, a, b)
        check_dim(f"inner dimensions of matmul ({self.transpose.data})", ka, kb)
        check_dim("result rows", dim_at(c, -2) if c.rank >= 2 or c.is_variadic else m, m)
        check_dim("result columns", dim_at(c, -1), n)
        if not (a.is_variadic or c.is_variadic) and a.rank != c.rank:
            raise VerifyException(f"result rank {c.rank} differs from A's rank {a.rank}")


PRIMITIVE_OPS: tuple[type[Operation], ...] = (MatmulOp,)
