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

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

from xdsl.dialects.builtin import (
    BoolAttr,
    DenseArrayBase,
    FloatAttr,
    IntegerAttr,
    IntegerType,
    StringAttr,
    f64,
    i64,
)
from xdsl.ir import Attribute, Operation, SSAValue
from xdsl.irdl import (
    AttrConstraint,
    AttrSizedOperandSegments,
    IRDLOperation,
    attr_def,
    irdl_op_definition,
    operand_def,
    opt_attr_def,
    opt_operand_def,
    opt_result_def,
    result_def,
    traits_def,
    var_operand_def,
    var_result_def,
)
from xdsl.traits import Pure
from xdsl.utils.exceptions import VerifyException

from modeldsl.dialects.annotations import check_annotations
from modeldsl.dialects.dtypes import DType
from modeldsl.dialects.graph_types import DimsAttr, SymbolicAttr, TensorType
from modeldsl.symbolic import STAR, Dim, Expr, definitely_different, numel

UNIFORM_FORMAT = "operands attr-dict `:` functional-type(operands, results)"

TRANSPOSE_MODES = ("NN", "NT", "TN", "TT")
FLOAT_DTYPES = tuple(d for d in DType if d.is_float)
INDEX_DTYPES = (DType.INT32, DType.INT64)


# ----------------------------------------------------------------------------
# Attribute helpers
# ----------------------------------------------------------------------------


@dataclass(frozen=True)
class OrSymbolic(AttrConstraint):
    """A ``FloatAttr`` (``IntegerAttr``), or until ``mdsl-specialize`` binds its symbols a
    ``#mdsl.graph.sym<... : f64>`` (``i64``): a parameter computed from module parameters and
    sizes that have no value yet (``scale(1.0 / sqrt(d_head))``). ``attr`` is the plain kind."""

    attr: type[Attribute]
    kind: str  # the SymbolicAttr kind: f64 or i64

    def verify(self, attr: Attribute, constraint_context) -> None:
        if isinstance(attr, SymbolicAttr):
            if attr.kind != self.kind:
                raise VerifyException(f"{attr} should be a #mdsl.graph.sym of kind {self.kind}")
        elif not isinstance(attr, self.attr):
            raise VerifyException(f"{attr} should be of base attribute {self.attr.name} or #mdsl.graph.sym")

    def get_bases(self) -> set[type[Attribute]] | None:
        return {self.attr, SymbolicAttr}

    def mapping_type_vars(self, type_var_mapping: Mapping) -> "OrSymbolic":
        return self


FLOAT_OR_SYMBOLIC = OrSymbolic(FloatAttr, "f64")
INT_OR_SYMBOLIC = OrSymbolic(IntegerAttr, "i64")


def enum_param(default: str):
    return attr_def(StringAttr, default_value=StringAttr(default))


def float_param(default: float | None = None):
    """A float parameter (with its default); it may be symbolic until mdsl-specialize."""
    if default is None:
        return attr_def(FLOAT_OR_SYMBOLIC)
    return attr_def(FLOAT_OR_SYMBOLIC, default_value=FloatAttr(default, f64))


def count_param():
    """A required integer parameter that counts (``num_experts``); it may be symbolic until mdsl-specialize."""
    return attr_def(INT_OR_SYMBOLIC)


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


class DTypeMismatch(VerifyException):
    """Operands that must share an element type do not (the frontend's E003)."""

    code = "E003"


class InvalidDType(VerifyException):
    """An element type the operation does not take (the frontend's E015)."""

    code = "E015"


def check_same_dtype(what: str, *types: TensorType) -> None:
    dtypes = {t.dtype for t in types}
    if len(dtypes) > 1:
        raise DTypeMismatch(f"{what}: element types differ ({', '.join(sorted(d.value for d in dtypes))})")


def check_dtype_in(what: str, t: TensorType, allowed: Sequence[DType]) -> None:
    if t.dtype not in allowed:
        raise InvalidDType(
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


def get_int(op: Operation, name: str) -> int:
    attr = op.attributes[name]
    assert isinstance(attr, IntegerAttr)
    return attr.value.data


def count_value(op: Operation, name: str) -> int | Expr | None:
    """An integer parameter that may be symbolic: its value, a dimension expression
    (``num_experts``), or None for a symbolic one that is none (``min(a, b)``)."""
    attr = op.attributes[name]
    if isinstance(attr, SymbolicAttr):
        value = attr.value()
        return value if isinstance(value, Expr) else None
    return get_int(op, name)


def is_symbolic(op: Operation) -> bool:
    """Whether a parameter of ``op`` is still a ``#mdsl.graph.sym`` (bound by mdsl-specialize)."""
    return any(isinstance(a, SymbolicAttr) for a in op.attributes.values())


# ----------------------------------------------------------------------------
# The base class
# ----------------------------------------------------------------------------


class PrimitiveOp(IRDLOperation):
    """Base of every primitive op: pure, uniform assembly format.

    Subclasses declare ``ENUMS`` (attribute name -> allowed values) and
    implement ``verify_shapes``. ``KEYWORD_OPERANDS`` names optional tensor
    operands that the spec declares under ``params:`` (``alibi_slopes: [H]? =
    None``): a DSL call passes them by keyword, not in the flow's tuple.
    """

    ENUMS: ClassVar[dict[str, tuple[str, ...]]] = {}
    KEYWORD_OPERANDS: ClassVar[tuple[str, ...]] = ()

    traits = traits_def(Pure())
    assembly_format = UNIFORM_FORMAT

    def verify_(self) -> None:
        check_annotations(self)
        for name, allowed in self.ENUMS.items():
            check_enum(self, name, allowed)
        self.verify_shapes()

    def verify_shapes(self) -> None:
        pass

    @classmethod
    def make(
        cls,
        operands: Sequence[SSAValue | Sequence[SSAValue] | None],
        result_types: Sequence[Attribute | Sequence[Attribute] | None],
        attributes: dict[str, Attribute] | None = None,
    ):
        """Create the op with one entry per operand and result definition: a value
        (a type), None for an absent optional, a list for a variadic."""
        return cls.build(
            operands=[_as_group(o) for o in operands],
            result_types=[_as_group(r) for r in result_types],
            attributes=attributes or {},
        )


def _as_group(entry):
    if entry is None:
        return []
    return list(entry) if isinstance(entry, (list, tuple)) else entry





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


def is_weight_gradient_form(transpose: str, a: TensorType, b: TensorType) -> bool:
    """``TN`` with A and B of the same rank above 2: ``A^T @ B`` contracts every
    leading dimension with the rows, as ``dW = dY^T X`` over all tokens."""
    return transpose == "TN" and (a.is_variadic or a.rank > 2) and (b.is_variadic or b.rank > 2)


def check_weight_gradient_matmul(a: TensorType, b: TensorType, c: TensorType) -> None:
    if a.is_variadic != b.is_variadic or (not a.is_variadic and a.rank != b.rank):
        raise VerifyException(f"TN over leading dimensions needs A and B of the same leading dims, got {a} and {b}")
    for i in range(-2, -min(len(a.shape), len(b.shape)) - 1, -1):
        check_dim(f"contracted dimension {i}", a.shape[i], b.shape[i])
    check_rank("result", c, 2)
    check_dim("result rows", c.shape[0], dim_at(a, -1))
    check_dim("result columns", c.shape[1], dim_at(b, -1))


def check_matmul(transpose: str, a: TensorType, b: TensorType, c: TensorType, batched: bool) -> None:
    check_min_rank("A", a, 2)
    check_min_rank("B", b, 2)
    check_min_rank("result", c, 2)
    if not batched and is_weight_gradient_form(transpose, a, b):
        check_weight_gradient_matmul(a, b, c)
        return
    m, ka, kb, n = matmul_dims(transpose, a, b)
    check_dim(f"inner dimensions ({transpose})", ka, kb)
    check_dim("result rows", dim_at(c, -2), m)
    check_dim("result columns", dim_at(c, -1), n)
    if not (a.is_variadic or c.is_variadic) and a.rank != c.rank:
        raise VerifyException(f"result rank {c.rank} differs from the rank of A ({a.rank})")
    if not batched:
        check_rank("B", b, 2)
        if transpose[0] == "T" and (a.is_variadic or a.rank > 2):
            raise VerifyException("A with leading dimensions cannot be transposed; use batched_matmul")
        return
    if b.is_variadic or a.is_variadic or b.rank == 2:
        return
    if b.rank != a.rank:
        raise VerifyException(f"B must be a matrix or have the rank of A ({a.rank}), got {b}")
    for i in range(a.rank - 2):
        check_dim(f"batch dimension {i}", a.shape[i], b.shape[i])


@irdl_op_definition
class MatmulOp(PrimitiveOp):
    """``C = alpha * op(A) @ op(B)``: ``NN`` A@B, ``NT`` A@B^T, ``TN`` A^T@B, ``TT`` A^T@B^T.

    A may carry leading dimensions (``[*, K]`` activations against a
    ``[N, K]`` weight); B is a matrix. In ``TN`` mode A and B may instead share
    their leading dimensions, which are contracted with the rows (the weight
    gradient ``dW = dY^T X`` over all tokens, a ``[K_A, N]`` result).
    ``accumulate`` (and ``beta``) ask the schedule to add into the existing
    gradient buffer.
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
        check_matmul(self.transpose.data, tensor(self.a), tensor(self.b), tensor(self.c), batched=False)


@irdl_op_definition
class BatchedMatmulOp(PrimitiveOp):
    """``C[b] = alpha * op(A[b]) @ op(B[b])`` over leading dims; a matrix B broadcasts. ``alpha``
    is the GEMM's (mdsl-fuse's attention_softmax puts the attention scale there)."""

    name = "mdsl.graph.batched_matmul"
    ENUMS: ClassVar[dict[str, tuple[str, ...]]] = {"transpose": TRANSPOSE_MODES}

    a = operand_def(TensorType)
    b = operand_def(TensorType)
    c = result_def(TensorType)
    transpose = enum_param("NN")
    accumulate = bool_param(False)
    alpha = float_param(1.0)

    def verify_shapes(self) -> None:
        check_matmul(self.transpose.data, tensor(self.a), tensor(self.b), tensor(self.c), batched=True)


@irdl_op_definition
class LinearBiasActOp(PrimitiveOp):
    """``pre = alpha * x @ op(weight) + bias; out = activation(pre)``: one GEMM with a cuBLASLt
    epilogue (bias, bias + ReLU, bias + tanh GELU). ``x: [*, K]``, ``weight`` ``[K, N]`` (NN) or
    ``[N, K]`` (NT), ``bias: [N]``; ``pre`` is the pre-activation the backward reads (the GEMM's
    ``aux`` output; ``out`` itself when ``activation = none``)."""

    name = "mdsl.graph.linear_bias_act"
    ENUMS: ClassVar[dict[str, tuple[str, ...]]] = {"transpose": ("NN", "NT"), "activation": ("none", "relu", "gelu")}

    x = operand_def(TensorType)
    weight = operand_def(TensorType)
    bias = operand_def(TensorType)
    out = result_def(TensorType)
    pre = result_def(TensorType)
    transpose = enum_param("NT")
    activation = enum_param("none")
    alpha = float_param(1.0)

    def verify_shapes(self) -> None:
        x, out = tensor(self.x), tensor(self.out)
        check_matmul(self.transpose.data, x, tensor(self.weight), out, batched=False)
        check_norm_weight("bias", out, tensor(self.bias))
        check_same_shape("pre", out, tensor(self.pre))
        check_same_dtype("operands and results", x, tensor(self.weight), tensor(self.bias), out, tensor(self.pre))


def grouped_gemm_layout(transpose: str) -> tuple[int, int, int]:
    """(token axis of ``input``, K axis of ``weights``, N axis of ``weights``) of a mode.

    The letters are those of the spec's grouped_gemm block (cuBLAS order, as
    the kernel ``moe_grouped_gemm`` takes them): the first says whether each
    ``weights[g]`` is stored ``[N, K]`` (``T``) or ``[K, N]`` (``N``), the
    second whether ``input`` is ``[tokens, K]`` (``N``) or ``[K, tokens]``
    (``T``). So the default ``TN`` is ``input_g @ weights[g]^T``.
    """
    weights_transposed, input_transposed = transpose[0] == "T", transpose[1] == "T"
    k_axis, n_axis = (2, 1) if weights_transposed else (1, 2)
    return (1 if input_transposed else 0), k_axis, n_axis


@irdl_op_definition
class GroupedGemmOp(PrimitiveOp):
    """MoE grouped GEMM: the tokens ``offsets[g]:offsets[g+1]`` of ``input`` times ``weights[g]``.

    ``output: [tokens, N]``; ``offsets: [G + 1]`` int32; tokens outside every
    group give zero rows. ``transpose`` (spec 6.1.3, default ``TN``) gives the
    layouts: ``TN`` ``input [tokens, K]``, ``weights [G, N, K]``
    (``input_g @ weights[g]^T``); ``NN`` ``weights [G, K, N]``; ``NT`` and
    ``TT`` take ``input`` as ``[K, tokens]`` (see :func:`grouped_gemm_layout`).
    The letters read the weights first, unlike ``matmul``'s, as the spec's
    grouped_gemm block writes them.
    """

    name = "mdsl.graph.grouped_gemm"
    ENUMS: ClassVar[dict[str, tuple[str, ...]]] = {"transpose": TRANSPOSE_MODES}

    input = operand_def(TensorType)
    weights = operand_def(TensorType)
    offsets = operand_def(TensorType)
    output = result_def(TensorType)
    transpose = enum_param("TN")

    def verify_shapes(self) -> None:
        x, w, off, out = tensor(self.input), tensor(self.weights), tensor(self.offsets), tensor(self.output)
        check_rank("input", x, 2)
        check_rank("weights", w, 3)
        check_rank("offsets", off, 1)
        check_rank("output", out, 2)
        check_dtype_in("offsets", off, INDEX_DTYPES)
        token_axis, k_axis, n_axis = grouped_gemm_layout(self.transpose.data)
        check_dim(f"inner dimension ({self.transpose.data})", dim_at(x, 1 - token_axis), w.shape[k_axis])
        check_dim("offsets length (groups + 1)", off.shape[0], w.shape[0] + 1)
        check_dim("output rows (tokens)", out.shape[0], dim_at(x, token_axis))
        check_dim("output columns", dim_at(out, 1), w.shape[n_axis])


@irdl_op_definition
class GroupedGemmWeightGradOp(PrimitiveOp):
    """Per-group weight gradient: ``d_weights[g] = d_output_g^T @ input_g`` (``[G, N, K]``, the
    gradient of ``weights`` of a ``TN`` grouped_gemm; ``input: [tokens, K]``)."""

    name = "mdsl.graph.grouped_gemm_weight_grad"

    input = operand_def(TensorType)
    d_output = operand_def(TensorType)
    offsets = operand_def(TensorType)
    d_weights = result_def(TensorType)

    def verify_shapes(self) -> None:
        x, dy, off, dw = tensor(self.input), tensor(self.d_output), tensor(self.offsets), tensor(self.d_weights)
        check_rank("input", x, 2)
        check_rank("d_output", dy, 2)
        check_rank("d_weights", dw, 3)
        check_dtype_in("offsets", off, INDEX_DTYPES)
        check_dim("token count", x.shape[0], dy.shape[0])
        check_dim("d_weights groups", dw.shape[0] + 1, dim_at(off, 0))
        check_dim("d_weights rows", dw.shape[1], dy.shape[1])
        check_dim("d_weights columns", dw.shape[2], x.shape[1])


# ----------------------------------------------------------------------------
# 6.2 Normalization
# ----------------------------------------------------------------------------


def check_row_stat(what: str, x: TensorType, stat: TensorType) -> None:
    """``stat`` (rstd, mean, lse) has the shape of ``x`` without its last dim, fp32."""
    check_dtype_in(what, stat, (DType.FP32,))
    if x.is_variadic or stat.is_variadic:
        return
    check_same_shape(f"{what} shape", stat, x.with_shape(list(x.shape[:-1])))


def check_norm_weight(what: str, x: TensorType, weight: TensorType) -> None:
    check_rank(what, weight, 1)
    check_dim(f"{what} length", weight.shape[0], dim_at(x, -1))


@irdl_op_definition
class RmsnormOp(PrimitiveOp):
    """``y = x / sqrt(mean(x^2) + eps) * weight``; also returns ``rstd`` (fp32) for backward."""

    name = "mdsl.graph.rmsnorm"

    x = operand_def(TensorType)
    weight = operand_def(TensorType)
    y = result_def(TensorType)
    rstd = result_def(TensorType)
    eps = float_param(1e-6)

    def verify_shapes(self) -> None:
        x, y = tensor(self.x), tensor(self.y)
        check_same_shape("y", x, y)
        check_norm_weight("weight", x, tensor(self.weight))
        check_row_stat("rstd", x, tensor(self.rstd))


@irdl_op_definition
class RmsnormBackwardOp(PrimitiveOp):
    """``(d_y, x, weight, rstd) -> (d_x, d_weight)``."""

    name = "mdsl.graph.rmsnorm_backward"

    d_y = operand_def(TensorType)
    x = operand_def(TensorType)
    weight = operand_def(TensorType)
    rstd = operand_def(TensorType)
    d_x = result_def(TensorType)
    d_weight = result_def(TensorType)

    def verify_shapes(self) -> None:
        x = tensor(self.x)
        check_same_shape("d_y", x, tensor(self.d_y))
        check_same_shape("d_x", x, tensor(self.d_x))
        check_norm_weight("weight", x, tensor(self.weight))
        check_same_shape("d_weight", tensor(self.weight), tensor(self.d_weight))
        check_row_stat("rstd", x, tensor(self.rstd))


@irdl_op_definition
class FusedResidualRmsnormOp(PrimitiveOp):
    """``residual_out = residual + input; y = rmsnorm(residual_out, weight)``."""

    name = "mdsl.graph.fused_residual_rmsnorm"

    residual = operand_def(TensorType)
    input = operand_def(TensorType)
    weight = operand_def(TensorType)
    residual_out = result_def(TensorType)
    y = result_def(TensorType)
    rstd = result_def(TensorType)
    eps = float_param(1e-6)

    def verify_shapes(self) -> None:
        r = tensor(self.residual)
        for what, t in (("input", self.input), ("residual_out", self.residual_out), ("y", self.y)):
            check_same_shape(what, r, tensor(t))
        check_norm_weight("weight", r, tensor(self.weight))
        check_row_stat("rstd", r, tensor(self.rstd))


@irdl_op_definition
class FusedResidualRmsnormBackwardOp(PrimitiveOp):
    """``(d_y, d_residual_next, residual_out, weight, rstd) -> (d_residual, d_input, d_weight)``."""

    name = "mdsl.graph.fused_residual_rmsnorm_backward"

    d_y = operand_def(TensorType)
    d_residual_next = operand_def(TensorType)
    residual_out = operand_def(TensorType)
    weight = operand_def(TensorType)
    rstd = operand_def(TensorType)
    d_residual = result_def(TensorType)
    d_input = result_def(TensorType)
    d_weight = result_def(TensorType)

    def verify_shapes(self) -> None:
        r = tensor(self.residual_out)
        for what, t in (("d_y", self.d_y), ("d_residual_next", self.d_residual_next),
                        ("d_residual", self.d_residual), ("d_input", self.d_input)):
            check_same_shape(what, r, tensor(t))
        check_norm_weight("weight", r, tensor(self.weight))
        check_same_shape("d_weight", tensor(self.weight), tensor(self.d_weight))
        check_row_stat("rstd", r, tensor(self.rstd))


@irdl_op_definition
class LayernormOp(PrimitiveOp):
    """``y = (x - mean) * rstd * weight (+ bias)``; returns ``mean`` and ``rstd`` (fp32)."""

    name = "mdsl.graph.layernorm"

    x = operand_def(TensorType)
    weight = operand_def(TensorType)
    bias = opt_operand_def(TensorType)
    y = result_def(TensorType)
    mean = result_def(TensorType)
    rstd = result_def(TensorType)
    eps = float_param(1e-5)

    def verify_shapes(self) -> None:
        x = tensor(self.x)
        check_same_shape("y", x, tensor(self.y))
        check_norm_weight("weight", x, tensor(self.weight))
        if self.bias is not None:
            check_norm_weight("bias", x, tensor(self.bias))
        check_row_stat("mean", x, tensor(self.mean))
        check_row_stat("rstd", x, tensor(self.rstd))


@irdl_op_definition
class LayernormBackwardOp(PrimitiveOp):
    """``(d_y, x, weight, mean, rstd) -> (d_x, d_weight, d_bias?)``."""

    name = "mdsl.graph.layernorm_backward"

    d_y = operand_def(TensorType)
    x = operand_def(TensorType)
    weight = operand_def(TensorType)
    mean = operand_def(TensorType)
    rstd = operand_def(TensorType)
    d_x = result_def(TensorType)
    d_weight = result_def(TensorType)
    d_bias = opt_result_def(TensorType)

    def verify_shapes(self) -> None:
        x = tensor(self.x)
        check_same_shape("d_y", x, tensor(self.d_y))
        check_same_shape("d_x", x, tensor(self.d_x))
        check_norm_weight("weight", x, tensor(self.weight))
        check_same_shape("d_weight", tensor(self.weight), tensor(self.d_weight))
        if self.d_bias is not None:
            check_same_shape("d_bias", tensor(self.weight), tensor(self.d_bias))
        check_row_stat("mean", x, tensor(self.mean))
        check_row_stat("rstd", x, tensor(self.rstd))


# ----------------------------------------------------------------------------
# 6.3 Activations, and the elementwise base classes
# ----------------------------------------------------------------------------


class UnaryElementwiseOp(PrimitiveOp):
    """``x -> out`` with the same shape and element type."""

    x = operand_def(TensorType)
    out = result_def(TensorType)

    def verify_shapes(self) -> None:
        x, out = tensor(self.x), tensor(self.out)
        check_same_shape("result", x, out)
        check_same_dtype("result", x, out)


class UnaryBackwardOp(PrimitiveOp):
    """``(d_out, x) -> d_x``: the backward of an elementwise activation."""

    d_out = operand_def(TensorType)
    x = operand_def(TensorType)
    d_x = result_def(TensorType)

    def verify_shapes(self) -> None:
        x = tensor(self.x)
        check_same_shape("d_out", x, tensor(self.d_out))
        check_same_shape("d_x", x, tensor(self.d_x))


class GatedOp(PrimitiveOp):
    """``(gate, up) -> act(gate) * up``; gate and up have one shape."""

    gate = operand_def(TensorType)
    up = operand_def(TensorType)
    out = result_def(TensorType)

    def verify_shapes(self) -> None:
        gate = tensor(self.gate)
        check_same_shape("gate and up", gate, tensor(self.up))
        check_same_shape("result", gate, tensor(self.out))


class GatedBackwardOp(PrimitiveOp):
    """``(d_out, gate, up) -> (d_gate, d_up)``."""

    d_out = operand_def(TensorType)
    gate = operand_def(TensorType)
    up = operand_def(TensorType)
    d_gate = result_def(TensorType)
    d_up = result_def(TensorType)

    def verify_shapes(self) -> None:
        gate = tensor(self.gate)
        for what, t in (("up", self.up), ("d_out", self.d_out), ("d_gate", self.d_gate), ("d_up", self.d_up)):
            check_same_shape(what, gate, tensor(t))


@irdl_op_definition
class SwigluOp(GatedOp):
    """``silu(gate) * up``."""

    name = "mdsl.graph.swiglu"


@irdl_op_definition
class SwigluBackwardOp(GatedBackwardOp):
    name = "mdsl.graph.swiglu_backward"


@irdl_op_definition
class GegluOp(GatedOp):
    """``gelu(gate) * up`` with the exact GELU, ``gate * Phi(gate) * up`` (spec 6.3.2 declares no
    parameters; the tanh approximation is ``gelu(approximate=true)`` then ``mul``)."""

    name = "mdsl.graph.geglu"


@irdl_op_definition
class GegluBackwardOp(GatedBackwardOp):
    """``d_gate = d_out * up * gelu'(gate)``, ``d_up = d_out * gelu(gate)`` (exact GELU)."""

    name = "mdsl.graph.geglu_backward"


def check_packed_halves(packed: TensorType, half: TensorType) -> None:
    """``packed`` is ``[*, 2 F]`` (gate then up along the last dim) where ``half`` is ``[*, F]``."""
    check_same_dtype("gate_up", packed, half)
    check_dim("last dim of gate_up (twice the gated width)", dim_at(packed, -1), 2 * dim_at(half, -1))
    n = resolve_axis("dim", -1, packed)
    if n is not None:
        check_all_but_axis("gate_up", packed, half, n)


class FusedSplitGatedOp(PrimitiveOp):
    """``gate_up [*, 2 F] -> out [*, F]``: the gated activation of the two halves of the packed
    gate/up projection, read in place (no split)."""

    gate_up = operand_def(TensorType)
    out = result_def(TensorType)

    def verify_shapes(self) -> None:
        check_packed_halves(tensor(self.gate_up), tensor(self.out))


class FusedSplitGatedBackwardOp(PrimitiveOp):
    """``(d_out [*, F], gate_up [*, 2 F]) -> d_gate_up [*, 2 F]``: both halves' gradients
    written packed (no concat)."""

    d_out = operand_def(TensorType)
    gate_up = operand_def(TensorType)
    d_gate_up = result_def(TensorType)

    def verify_shapes(self) -> None:
        packed = tensor(self.gate_up)
        check_packed_halves(packed, tensor(self.d_out))
        check_same_shape("d_gate_up", packed, tensor(self.d_gate_up))


@irdl_op_definition
class FusedSplitSwigluOp(FusedSplitGatedOp):
    """``split(gate_up, [F, F], dim=-1) -> (gate, up); swiglu(gate, up)`` in one op."""

    name = "mdsl.graph.fused_split_swiglu"


@irdl_op_definition
class FusedSplitSwigluBackwardOp(FusedSplitGatedBackwardOp):
    """``concat(swiglu_backward(d_out, gate, up), dim=-1)`` with gate, up the halves of gate_up."""

    name = "mdsl.graph.fused_split_swiglu_backward"


@irdl_op_definition
class FusedSplitGegluOp(FusedSplitGatedOp):
    """``split(gate_up, [F, F], dim=-1) -> (gate, up); geglu(gate, up)`` (exact GELU) in one op."""

    name = "mdsl.graph.fused_split_geglu"


@irdl_op_definition
class FusedSplitGegluBackwardOp(FusedSplitGatedBackwardOp):
    """``concat(geglu_backward(d_out, gate, up), dim=-1)`` with gate, up the halves of gate_up."""

    name = "mdsl.graph.fused_split_geglu_backward"


@irdl_op_definition
class SiluOp(UnaryElementwiseOp):
    """``x * sigmoid(x)``."""

    name = "mdsl.graph.silu"


@irdl_op_definition
class SiluBackwardOp(UnaryBackwardOp):
    name = "mdsl.graph.silu_backward"


@irdl_op_definition
class ReluOp(UnaryElementwiseOp):
    """``max(x, 0)``."""

    name = "mdsl.graph.relu"


@irdl_op_definition
class ReluBackwardOp(UnaryBackwardOp):
    name = "mdsl.graph.relu_backward"


@irdl_op_definition
class Relu2Op(UnaryElementwiseOp):
    """``max(x, 0)^2``."""

    name = "mdsl.graph.relu2"


@irdl_op_definition
class Relu2BackwardOp(UnaryBackwardOp):
    name = "mdsl.graph.relu2_backward"


@irdl_op_definition
class GeluOp(UnaryElementwiseOp):
    """GELU; the tanh approximation unless ``approximate = false`` (erf)."""

    name = "mdsl.graph.gelu"
    approximate = bool_param(True)


@irdl_op_definition
class GeluBackwardOp(UnaryBackwardOp):
    name = "mdsl.graph.gelu_backward"
    approximate = bool_param(True)


@irdl_op_definition
class SoftmaxOp(UnaryElementwiseOp):
    """Softmax along ``dim``."""

    name = "mdsl.graph.softmax"
    dim = int_param(-1)

    def verify_shapes(self) -> None:
        super().verify_shapes()
        x = tensor(self.x)
        if not x.is_variadic:
            normalize_axis("dim", get_int(self, "dim"), x.rank)


@irdl_op_definition
class SoftmaxBackwardOp(PrimitiveOp):
    """``(d_out, out) -> d_x`` (uses the forward output, not its input)."""

    name = "mdsl.graph.softmax_backward"

    d_out = operand_def(TensorType)
    out = operand_def(TensorType)
    d_x = result_def(TensorType)
    dim = int_param(-1)

    def verify_shapes(self) -> None:
        out = tensor(self.out)
        check_same_shape("d_out", out, tensor(self.d_out))
        check_same_shape("d_x", out, tensor(self.d_x))


CAUSAL_MASK_FILLS = ("neg_inf", "zero")


@irdl_op_definition
class CausalMaskOp(UnaryElementwiseOp):
    """Attention scores ``x [*, Tq, Tk]`` with the keys a query may not see set to ``fill``:
    key ``j`` of query ``i`` where ``j > i + offset`` (PyTorch's
    ``s.masked_fill(torch.ones(Tq, Tk).triu(offset + 1).bool(), -inf)``), and with a
    ``window_size`` w also where ``j <= i + offset - w`` (a sliding window). ``fill = "zero"``
    writes 0 instead of -inf: the op's own gradient."""

    name = "mdsl.graph.causal_mask"
    ENUMS: ClassVar[dict[str, tuple[str, ...]]] = {"fill": CAUSAL_MASK_FILLS}
    offset = int_param(0)
    window_size = opt_attr_def(IntegerAttr)
    fill = enum_param("neg_inf")

    def verify_shapes(self) -> None:
        super().verify_shapes()
        x = tensor(self.x)
        if not x.is_variadic and x.rank < 2:
            raise VerifyException(f"causal_mask needs scores of rank 2 or more, got {x}")
        window = self.attributes.get("window_size")
        if isinstance(window, IntegerAttr) and window.value.data <= 0:
            raise VerifyException(f"window_size must be positive, got {window.value.data}")


# ----------------------------------------------------------------------------
# 6.4 Attention
# ----------------------------------------------------------------------------


def check_heads(q: TensorType, k: TensorType, v: TensorType | None = None) -> None:
    """q ``[B, Hq, Tq, D]``, k/v ``[B, Hkv, Tk, D]`` with ``Hq % Hkv == 0``."""
    for what, t in (("q", q), ("k", k)) + ((("v", v),) if v is not None else ()):
        check_rank(what, t, 4)
    check_dim("batch of q and k", q.shape[0], k.shape[0])
    check_dim("head dim of q and k", q.shape[3], k.shape[3])
    hq, hkv = q.shape[1], k.shape[1]
    ratio = (hq % hkv).const_value() if hkv.const_value() != 0 else None
    if ratio is not None and ratio != 0:
        raise VerifyException(f"query heads ({hq}) must be a multiple of kv heads ({hkv}) (GQA)")
    if v is not None:
        check_same_shape("k and v", k, v)


ATTENTION_LAYOUTS = ("bhtd", "bthd")


def heads_first(t: TensorType, layout: StringAttr) -> TensorType:
    """``t`` as ``[B, H, T, D]``: a ``bthd`` tensor (``[B, T, H, D]``, mdsl-fuse's attention_layout)
    with its dims 1 and 2 swapped, so the checks of the ``bhtd`` form apply to both layouts."""
    if layout.data != "bthd" or t.is_variadic or len(t.shape) != 4:
        return t
    shape = list(t.shape)
    shape[1], shape[2] = shape[2], shape[1]
    return t.with_shape(shape)


# q, k, v (and d_out, out, lse), ALiBi's slopes after ``,`` and the segment ids after ``segments``: without
# segments the uniform form (``%q, %k, %v, %slopes {...} : (...) -> (...)``), with them
# ``%q, %k, %v segments %seg {...} : (!q, !k, !v segments !seg) -> (...)``
def _attention_format(*tensors: str, results: tuple[str, ...]) -> str:
    return (" `,` ".join(f"${t}" for t in tensors) + " (`,` $alibi_slopes^)? (`segments` $segments^)? attr-dict "
            "`:` `(` " + " `,` ".join(f"type(${t})" for t in tensors)
            + " (`,` type($alibi_slopes)^)? (`segments` type($segments)^)? `)` "
            "`->` `(` " + " `,` ".join(f"type(${r})" for r in results) + " `)`")


@irdl_op_definition
class FlashAttentionOp(PrimitiveOp):
    """Fused attention, GQA by head broadcast: ``(q, k, v, alibi_slopes?, segments?) -> (out, lse)``.

    ``q: [B, Hq, Tq, D]``, ``k, v: [B, Hkv, Tk, D]``; ``lse: [B, Hq, Tq]``
    fp32. ``softmax_scale`` defaults to ``1/sqrt(D)``; ``window_size`` is a
    sliding window (Mistral). Tq may be shorter than Tk (decoding with a KV
    cache: the queries are the last Tq positions). ``alibi_slopes: [Hq]`` is
    a parameter in spec 6.4.1 (``flash_attention(alibi_slopes=slopes)``).
    ``layout = "bthd"`` takes q, k, v and gives out as ``[B, T, H, D]`` (lse stays ``[B, Hq, Tq]``).
    ``softcap`` c > 0 caps the scaled scores to ``c * tanh(s / c)`` before the mask (Gemma 2's
    attention-logit softcapping); 0, the default, is none.
    ``segments: [B, Tk]`` (int32 or int64, passed by keyword; ``mdsl-pack-sequences`` adds it) are the
    example ids of the keys of packed rows (the queries', the last Tq): query i sees key j only where
    their ids are equal, besides ``causal`` and ``window_size`` (causal, a block-diagonal mask).
    """

    name = "mdsl.graph.flash_attention"
    KEYWORD_OPERANDS: ClassVar[tuple[str, ...]] = ("alibi_slopes", "segments")
    ENUMS: ClassVar[dict[str, tuple[str, ...]]] = {"layout": ATTENTION_LAYOUTS}

    q = operand_def(TensorType)
    k = operand_def(TensorType)
    v = operand_def(TensorType)
    alibi_slopes = opt_operand_def(TensorType)
    segments = opt_operand_def(TensorType)
    out = result_def(TensorType)
    lse = result_def(TensorType)
    causal = bool_param(True)
    softmax_scale = opt_attr_def(FLOAT_OR_SYMBOLIC)
    window_size = opt_attr_def(IntegerAttr)
    layout = enum_param("bhtd")
    softcap = float_param(0.0)

    irdl_options = (AttrSizedOperandSegments(as_property=True),)
    assembly_format = _attention_format("q", "k", "v", results=("out", "lse"))

    def verify_shapes(self) -> None:
        q, k, v = (heads_first(tensor(x), self.layout) for x in (self.q, self.k, self.v))
        check_heads(q, k, v)
        check_same_shape("out", q, heads_first(tensor(self.out), self.layout))
        check_row_stat("lse", q, tensor(self.lse))
        check_attention_attrs(self, q, k)
        check_alibi_slopes(self.alibi_slopes, q)
        check_segments(self.segments, k)


def check_alibi_slopes(slopes: SSAValue | None, q: TensorType) -> None:
    """One slope per query head."""
    if slopes is not None:
        check_rank("alibi_slopes", tensor(slopes), 1)
        check_dim("alibi_slopes length", tensor(slopes).shape[0], q.shape[1])


def check_segments(segments: SSAValue | None, k: TensorType) -> None:
    """The example id of every key of a packed row: ``[B, Tk]``, int32 or int64."""
    if segments is not None:
        seg = tensor(segments)
        check_rank("segments", seg, 2)
        check_dtype_in("segments", seg, INDEX_DTYPES)
        check_dim("segments batch", seg.shape[0], k.shape[0])
        check_dim("segments length (the keys)", seg.shape[1], k.shape[2])


def check_attention_attrs(op: Operation, q: TensorType, k: TensorType) -> None:
    window = op.attributes.get("window_size")
    if isinstance(window, IntegerAttr) and window.value.data <= 0:
        raise VerifyException(f"window_size must be positive, got {window.value.data}")
    scale = op.attributes.get("softmax_scale")
    if isinstance(scale, FloatAttr) and not scale.value.data > 0:
        raise VerifyException(f"softmax_scale must be positive, got {scale.value.data}")
    softcap = op.attributes.get("softcap")
    if isinstance(softcap, FloatAttr) and not softcap.value.data >= 0:
        raise VerifyException(f"softcap must be 0 (none) or positive, got {softcap.value.data}")
    tq, tk = q.shape[2], k.shape[2]
    if (tq - tk).const_value() is not None and (tq - tk).const_value() > 0:
        raise VerifyException(f"more queries ({tq}) than keys ({tk})")


@irdl_op_definition
class FlashAttentionBackwardOp(PrimitiveOp):
    """``(d_out, q, k, v, out, lse, alibi_slopes?, segments?) -> (d_q, d_k, d_v)``; the slopes and
    segment ids of the forward (parameters, as there) mask and shift the scores and get no gradient;
    ``layout`` as the forward's."""

    name = "mdsl.graph.flash_attention_backward"
    KEYWORD_OPERANDS: ClassVar[tuple[str, ...]] = ("alibi_slopes", "segments")
    ENUMS: ClassVar[dict[str, tuple[str, ...]]] = {"layout": ATTENTION_LAYOUTS}

    d_out = operand_def(TensorType)
    q = operand_def(TensorType)
    k = operand_def(TensorType)
    v = operand_def(TensorType)
    out = operand_def(TensorType)
    lse = operand_def(TensorType)
    alibi_slopes = opt_operand_def(TensorType)
    segments = opt_operand_def(TensorType)
    d_q = result_def(TensorType)
    d_k = result_def(TensorType)
    d_v = result_def(TensorType)
    causal = bool_param(True)
    softmax_scale = opt_attr_def(FLOAT_OR_SYMBOLIC)
    window_size = opt_attr_def(IntegerAttr)
    layout = enum_param("bhtd")
    softcap = float_param(0.0)

    irdl_options = (AttrSizedOperandSegments(as_property=True),)
    assembly_format = _attention_format("d_out", "q", "k", "v", "out", "lse", results=("d_q", "d_k", "d_v"))

    def verify_shapes(self) -> None:
        q, k, v = (heads_first(tensor(x), self.layout) for x in (self.q, self.k, self.v))
        check_heads(q, k, v)
        for what, t in (("d_out", self.d_out), ("out", self.out), ("d_q", self.d_q)):
            check_same_shape(what, q, heads_first(tensor(t), self.layout))
        check_same_shape("d_k", k, heads_first(tensor(self.d_k), self.layout))
        check_same_shape("d_v", v, heads_first(tensor(self.d_v), self.layout))
        check_row_stat("lse", q, tensor(self.lse))
        check_attention_attrs(self, q, k)
        check_alibi_slopes(self.alibi_slopes, q)
        check_segments(self.segments, k)


def check_rope_freqs(q: TensorType, freqs: TensorType) -> None:
    """``freqs: [T, D // 2, 2]`` (cos, sin) for the T positions of q, or ``[B, T, D // 2, 2]``: a
    table per row (packed rows, ``mdsl-pack-sequences``: each token at its own position)."""
    check_rank("freqs", freqs, 3, 4)
    shape = freqs.shape[1:] if not freqs.is_variadic and freqs.rank == 4 else freqs.shape
    if not freqs.is_variadic and freqs.rank == 4:
        check_dim("freqs rows (the batch)", freqs.shape[0], q.shape[0])
    check_dim("freqs positions", shape[0], q.shape[2])
    check_dim("freqs pairs (head_dim // 2)", shape[1], q.shape[3] // 2)
    check_dim("freqs last dimension (cos, sin)", shape[2], Expr.const(2))
    d = q.shape[3].const_value()
    if d is not None and d % 2:
        raise VerifyException(f"rotary head dim must be even, got {d}")


@irdl_op_definition
class RopeOp(PrimitiveOp):
    """Rotary embedding of q and k: ``(q, k, freqs) -> (q_rot, k_rot)``.

    ``interleaved`` pairs ``(x[2i], x[2i+1])``; otherwise ``(x[i], x[i+D/2])``
    (the HuggingFace layout). ``layout = "bthd"`` takes q and k as ``[B, T, H, D]``
    (the position is then dim 1). ``freqs`` is ``[T, D/2, 2]`` (one table for every row) or
    ``[B, T, D/2, 2]`` (each row's own: packed rows, whose tokens sit at their own positions).
    """

    name = "mdsl.graph.rope"
    ENUMS: ClassVar[dict[str, tuple[str, ...]]] = {"layout": ATTENTION_LAYOUTS}

    q = operand_def(TensorType)
    k = operand_def(TensorType)
    freqs = operand_def(TensorType)
    q_rot = result_def(TensorType)
    k_rot = result_def(TensorType)
    interleaved = bool_param(False)
    layout = enum_param("bhtd")

    def verify_shapes(self) -> None:
        q, k = heads_first(tensor(self.q), self.layout), heads_first(tensor(self.k), self.layout)
        check_heads(q, k)
        check_same_shape("q_rot", q, heads_first(tensor(self.q_rot), self.layout))
        check_same_shape("k_rot", k, heads_first(tensor(self.k_rot), self.layout))
        check_rope_freqs(q, tensor(self.freqs))


@irdl_op_definition
class RopeBackwardOp(PrimitiveOp):
    """``(d_q_rot, d_k_rot, freqs) -> (d_q, d_k)``: the inverse rotation; ``layout`` as rope's."""

    name = "mdsl.graph.rope_backward"
    ENUMS: ClassVar[dict[str, tuple[str, ...]]] = {"layout": ATTENTION_LAYOUTS}

    d_q_rot = operand_def(TensorType)
    d_k_rot = operand_def(TensorType)
    freqs = operand_def(TensorType)
    d_q = result_def(TensorType)
    d_k = result_def(TensorType)
    interleaved = bool_param(False)
    layout = enum_param("bhtd")

    def verify_shapes(self) -> None:
        q, k = heads_first(tensor(self.d_q_rot), self.layout), heads_first(tensor(self.d_k_rot), self.layout)
        check_heads(q, k)
        check_same_shape("d_q", q, heads_first(tensor(self.d_q), self.layout))
        check_same_shape("d_k", k, heads_first(tensor(self.d_k), self.layout))
        check_rope_freqs(q, tensor(self.freqs))


@irdl_op_definition
class QkNormOp(PrimitiveOp):
    """Per-head RMSNorm of q and k: ``(q, k, q_weight, k_weight) -> (q_norm, k_norm, q_rstd, k_rstd)``."""

    name = "mdsl.graph.qk_norm"

    q = operand_def(TensorType)
    k = operand_def(TensorType)
    q_weight = operand_def(TensorType)
    k_weight = operand_def(TensorType)
    q_norm = result_def(TensorType)
    k_norm = result_def(TensorType)
    q_rstd = result_def(TensorType)
    k_rstd = result_def(TensorType)
    eps = float_param(1e-6)

    def verify_shapes(self) -> None:
        q, k = tensor(self.q), tensor(self.k)
        check_heads(q, k)
        check_same_shape("q_norm", q, tensor(self.q_norm))
        check_same_shape("k_norm", k, tensor(self.k_norm))
        check_norm_weight("q_weight", q, tensor(self.q_weight))
        check_norm_weight("k_weight", k, tensor(self.k_weight))
        check_row_stat("q_rstd", q, tensor(self.q_rstd))
        check_row_stat("k_rstd", k, tensor(self.k_rstd))


@irdl_op_definition
class QkNormBackwardOp(PrimitiveOp):
    """``(d_q_norm, d_k_norm, q, k, q_weight, k_weight, q_rstd, k_rstd) -> (d_q, d_k, d_q_weight, d_k_weight)``."""

    name = "mdsl.graph.qk_norm_backward"

    d_q_norm = operand_def(TensorType)
    d_k_norm = operand_def(TensorType)
    q = operand_def(TensorType)
    k = operand_def(TensorType)
    q_weight = operand_def(TensorType)
    k_weight = operand_def(TensorType)
    q_rstd = operand_def(TensorType)
    k_rstd = operand_def(TensorType)
    d_q = result_def(TensorType)
    d_k = result_def(TensorType)
    d_q_weight = result_def(TensorType)
    d_k_weight = result_def(TensorType)

    def verify_shapes(self) -> None:
        q, k = tensor(self.q), tensor(self.k)
        check_heads(q, k)
        for what, t in (("d_q_norm", self.d_q_norm), ("d_q", self.d_q)):
            check_same_shape(what, q, tensor(t))
        for what, t in (("d_k_norm", self.d_k_norm), ("d_k", self.d_k)):
            check_same_shape(what, k, tensor(t))
        check_norm_weight("q_weight", q, tensor(self.q_weight))
        check_norm_weight("k_weight", k, tensor(self.k_weight))
        check_same_shape("d_q_weight", tensor(self.q_weight), tensor(self.d_q_weight))
        check_same_shape("d_k_weight", tensor(self.k_weight), tensor(self.d_k_weight))
        check_row_stat("q_rstd", q, tensor(self.q_rstd))
        check_row_stat("k_rstd", k, tensor(self.k_rstd))


def check_qk_norm_rope(op: Operation, q: TensorType, k: TensorType) -> None:
    """Operands of a fused qk_norm + rope: q and k as ``layout`` says, weights ``[D]``, the
    statistics ``[*q.shape[:3]]`` as qk_norm's (per row of D, in the operands' own order)."""
    check_heads(heads_first(q, op.layout), heads_first(k, op.layout))
    check_norm_weight("q_weight", q, tensor(op.q_weight))
    check_norm_weight("k_weight", k, tensor(op.k_weight))
    check_row_stat("q_rstd", q, tensor(op.q_rstd))
    check_row_stat("k_rstd", k, tensor(op.k_rstd))
    check_rope_freqs(heads_first(q, op.layout), tensor(op.freqs))


@irdl_op_definition
class FusedQkNormRopeOp(PrimitiveOp):
    """qk_norm then rope in one pass (``mdsl-fuse`` pattern ``qk_norm_rope``):
    ``(q, k, q_weight, k_weight, freqs) -> (q_rot, k_rot, q_rstd, k_rstd)``; ``eps`` as
    qk_norm's, ``interleaved`` and ``layout`` as rope's."""

    name = "mdsl.graph.fused_qk_norm_rope"
    ENUMS: ClassVar[dict[str, tuple[str, ...]]] = {"layout": ATTENTION_LAYOUTS}

    q = operand_def(TensorType)
    k = operand_def(TensorType)
    q_weight = operand_def(TensorType)
    k_weight = operand_def(TensorType)
    freqs = operand_def(TensorType)
    q_rot = result_def(TensorType)
    k_rot = result_def(TensorType)
    q_rstd = result_def(TensorType)
    k_rstd = result_def(TensorType)
    eps = float_param(1e-6)
    interleaved = bool_param(False)
    layout = enum_param("bhtd")

    def verify_shapes(self) -> None:
        q, k = tensor(self.q), tensor(self.k)
        check_qk_norm_rope(self, q, k)
        check_same_shape("q_rot", q, tensor(self.q_rot))
        check_same_shape("k_rot", k, tensor(self.k_rot))


@irdl_op_definition
class FusedQkNormRopeBackwardOp(PrimitiveOp):
    """``(d_q_rot, d_k_rot, q, k, q_weight, k_weight, q_rstd, k_rstd, freqs) -> (d_q, d_k,
    d_q_weight, d_k_weight)``: rope_backward then qk_norm_backward in one pass."""

    name = "mdsl.graph.fused_qk_norm_rope_backward"
    ENUMS: ClassVar[dict[str, tuple[str, ...]]] = {"layout": ATTENTION_LAYOUTS}

    d_q_rot = operand_def(TensorType)
    d_k_rot = operand_def(TensorType)
    q = operand_def(TensorType)
    k = operand_def(TensorType)
    q_weight = operand_def(TensorType)
    k_weight = operand_def(TensorType)
    q_rstd = operand_def(TensorType)
    k_rstd = operand_def(TensorType)
    freqs = operand_def(TensorType)
    d_q = result_def(TensorType)
    d_k = result_def(TensorType)
    d_q_weight = result_def(TensorType)
    d_k_weight = result_def(TensorType)
    interleaved = bool_param(False)
    layout = enum_param("bhtd")

    def verify_shapes(self) -> None:
        q, k = tensor(self.q), tensor(self.k)
        check_qk_norm_rope(self, q, k)
        for what, t in (("d_q_rot", self.d_q_rot), ("d_q", self.d_q)):
            check_same_shape(what, q, tensor(t))
        for what, t in (("d_k_rot", self.d_k_rot), ("d_k", self.d_k)):
            check_same_shape(what, k, tensor(t))
        check_same_shape("d_q_weight", tensor(self.q_weight), tensor(self.d_q_weight))
        check_same_shape("d_k_weight", tensor(self.k_weight), tensor(self.d_k_weight))


# ----------------------------------------------------------------------------
# 6.5 Tensor manipulation
# ----------------------------------------------------------------------------


def check_all_but_axis(what: str, a: TensorType, b: TensorType, axis: int) -> None:
    """Same rank and dims except along ``axis``."""
    if a.is_variadic or b.is_variadic:
        return
    if a.rank != b.rank:
        raise VerifyException(f"{what}: ranks differ ({_shape(a)} vs {_shape(b)})")
    for i, (da, db) in enumerate(zip(a.shape, b.shape)):
        if i != axis:
            check_dim(f"{what}: dimension {i}", da, db)


def resolve_axis(what: str, axis: int, t: TensorType) -> int | None:
    """The non-negative axis, or None when a variadic shape makes it unknowable."""
    return None if t.is_variadic else normalize_axis(what, axis, t.rank)


@irdl_op_definition
class SplitOp(PrimitiveOp):
    """Views of consecutive chunks of ``x`` along ``dim``: ``sizes`` sum to that dim."""

    name = "mdsl.graph.split"

    x = operand_def(TensorType)
    outs = var_result_def(TensorType)
    sizes = attr_def(DimsAttr)
    dim = int_param(-1)

    def verify_shapes(self) -> None:
        x = tensor(self.x)
        sizes = self.sizes.data
        if len(sizes) != len(self.outs):
            raise VerifyException(f"{len(sizes)} sizes but {len(self.outs)} results")
        if any(s is STAR for s in sizes):
            raise VerifyException("split sizes cannot be '*'")
        axis = get_int(self, "dim")
        total = Expr()
        for s in sizes:
            total = total + s
        check_dim("split sizes must sum to the split dimension", total, dim_at(x, axis))
        n = resolve_axis("dim", axis, x)
        for i, (size, out) in enumerate(zip(sizes, self.outs)):
            t = tensor(out)
            check_same_dtype(f"result #{i}", x, t)
            check_dim(f"result #{i} along dim", dim_at(t, axis), size)
            if n is not None:
                check_all_but_axis(f"result #{i}", x, t, n)


@irdl_op_definition
class ConcatOp(PrimitiveOp):
    """Concatenation along ``dim`` (copies)."""

    name = "mdsl.graph.concat"

    inputs = var_operand_def(TensorType)
    out = result_def(TensorType)
    dim = int_param(-1)

    def verify_shapes(self) -> None:
        if not self.inputs:
            raise VerifyException("needs at least one input")
        out = tensor(self.out)
        axis = get_int(self, "dim")
        total = Expr()
        for i, value in enumerate(self.inputs):
            t = tensor(value)
            check_same_dtype(f"input #{i}", out, t)
            d = dim_at(t, axis)
            if d is STAR:
                return
            total = total + d
            n = resolve_axis("dim", axis, t)
            if n is not None:
                check_all_but_axis(f"input #{i}", out, t, n)
        check_dim("concatenated dimension", dim_at(out, axis), total)


@irdl_op_definition
class ViewOp(PrimitiveOp):
    """Reshape of a contiguous tensor (a view): the result type holds the new shape."""

    name = "mdsl.graph.view"

    x = operand_def(TensorType)
    out = result_def(TensorType)

    def verify_shapes(self) -> None:
        x, out = tensor(self.x), tensor(self.out)
        check_same_dtype("result", x, out)
        check_numel_equal("a view keeps the element count", x, out)


@irdl_op_definition
class TransposeOp(PrimitiveOp):
    """Swaps dimensions ``dim0`` and ``dim1``."""

    name = "mdsl.graph.transpose"

    x = operand_def(TensorType)
    out = result_def(TensorType)
    dim0 = attr_def(IntegerAttr)
    dim1 = attr_def(IntegerAttr)

    def verify_shapes(self) -> None:
        x, out = tensor(self.x), tensor(self.out)
        check_same_dtype("result", x, out)
        if x.is_variadic or out.is_variadic:
            return
        if x.rank != out.rank:
            raise VerifyException("a transpose keeps the rank")
        d0 = normalize_axis("dim0", self.dim0.value.data, x.rank)
        d1 = normalize_axis("dim1", self.dim1.value.data, x.rank)
        expected = list(x.shape)
        expected[d0], expected[d1] = expected[d1], expected[d0]
        check_same_shape("result", x.with_shape(expected), out)


@irdl_op_definition
class PermuteOp(PrimitiveOp):
    """Reorders dimensions: result dim ``i`` is input dim ``dims[i]``."""

    name = "mdsl.graph.permute"

    x = operand_def(TensorType)
    out = result_def(TensorType)
    dims = attr_def(DenseArrayBase)

    def verify_shapes(self) -> None:
        x, out = tensor(self.x), tensor(self.out)
        check_same_dtype("result", x, out)
        perm = list(self.dims.get_values())
        if x.is_variadic:
            raise VerifyException("permute needs a shape without '*'")
        if sorted(perm) != list(range(x.rank)):
            raise VerifyException(f"dims {perm} is not a permutation of 0..{x.rank - 1}")
        check_same_shape("result", x.with_shape([x.shape[p] for p in perm]), out)


@irdl_op_definition
class ContiguousOp(UnaryElementwiseOp):
    """Materializes a contiguous copy when the input is a strided view; else a no-op."""

    name = "mdsl.graph.contiguous"


# ----------------------------------------------------------------------------
# 6.6 Elementwise, 6.7 reductions
# ----------------------------------------------------------------------------


def broadcast_shape(what: str, a: TensorType, b: TensorType) -> list[Dim] | None:
    """NumPy broadcasting of two shapes; None when a variadic shape hides the rank."""
    if a.is_variadic or b.is_variadic:
        return None
    result: list[Dim] = []
    sa, sb = list(a.shape), list(b.shape)
    for i in range(1, max(len(sa), len(sb)) + 1):
        da = sa[-i] if i <= len(sa) else Expr.const(1)
        db = sb[-i] if i <= len(sb) else Expr.const(1)
        if da == 1:
            result.append(db)
        elif db == 1 or da == db:
            result.append(da)
        elif definitely_different(da, db):
            raise VerifyException(f"{what}: shapes {_shape(a)} and {_shape(b)} do not broadcast")
        else:
            result.append(da)
    return result[::-1]


class BinaryElementwiseOp(PrimitiveOp):
    """``(a, b) -> out`` with NumPy broadcasting."""

    a = operand_def(TensorType)
    b = operand_def(TensorType)
    out = result_def(TensorType)

    def verify_shapes(self) -> None:
        a, b, out = tensor(self.a), tensor(self.b), tensor(self.out)
        check_same_dtype("operands and result", a, b, out)
        shape = broadcast_shape("operands", a, b)
        if shape is not None:
            check_same_shape("result of broadcasting", a.with_shape(shape), out)


@irdl_op_definition
class AddOp(BinaryElementwiseOp):
    name = "mdsl.graph.add"


@irdl_op_definition
class MulOp(BinaryElementwiseOp):
    name = "mdsl.graph.mul"


@irdl_op_definition
class SubOp(BinaryElementwiseOp):
    """``a - b`` with NumPy broadcasting."""

    name = "mdsl.graph.sub"


@irdl_op_definition
class DivOp(BinaryElementwiseOp):
    """``a / b`` with NumPy broadcasting."""

    name = "mdsl.graph.div"


def check_broadcasts_to(what: str, a: TensorType, b: TensorType, out: TensorType) -> None:
    """``a`` and ``b`` broadcast (NumPy rules) to the shape of ``out``."""
    shape = broadcast_shape(what, a, b)
    if shape is not None:
        check_same_shape(f"{what} broadcast", a.with_shape(shape), out)


@irdl_op_definition
class AddBackwardOp(PrimitiveOp):
    """``(d_a, d_b)``: ``d_out`` summed over the dims that broadcasting added or stretched in ``a``
    and in ``b`` (spec 6.6.1). The operand does not carry the shapes of ``a`` and ``b``: the
    result types give them (as ``reduce_max_backward``'s gives ``x``'s)."""

    name = "mdsl.graph.add_backward"

    d_out = operand_def(TensorType)
    d_a = result_def(TensorType)
    d_b = result_def(TensorType)

    def verify_shapes(self) -> None:
        d_out, d_a, d_b = tensor(self.d_out), tensor(self.d_a), tensor(self.d_b)
        check_same_dtype("d_out, d_a and d_b", d_out, d_a, d_b)
        check_broadcasts_to("d_a and d_b", d_a, d_b, d_out)


@irdl_op_definition
class MulBackwardOp(PrimitiveOp):
    """``d_a = d_out * b`` and ``d_b = d_out * a``, each summed back to its operand's shape over
    the dims broadcasting added or stretched (spec 6.6.2)."""

    name = "mdsl.graph.mul_backward"

    d_out = operand_def(TensorType)
    a = operand_def(TensorType)
    b = operand_def(TensorType)
    d_a = result_def(TensorType)
    d_b = result_def(TensorType)

    def verify_shapes(self) -> None:
        d_out, a, b = tensor(self.d_out), tensor(self.a), tensor(self.b)
        d_a, d_b = tensor(self.d_a), tensor(self.d_b)
        check_same_dtype("operands and results", d_out, a, b, d_a, d_b)
        check_broadcasts_to("a and b", a, b, d_out)
        check_same_shape("d_a", a, d_a)
        check_same_shape("d_b", b, d_b)


@irdl_op_definition
class BiasAddOp(PrimitiveOp):
    """``x + bias`` with ``bias: [N]`` along the last dim of ``x: [*, N]``."""

    name = "mdsl.graph.bias_add"

    x = operand_def(TensorType)
    bias = operand_def(TensorType)
    out = result_def(TensorType)

    def verify_shapes(self) -> None:
        x = tensor(self.x)
        check_norm_weight("bias", x, tensor(self.bias))
        check_same_shape("result", x, tensor(self.out))


@irdl_op_definition
class ScaleOp(UnaryElementwiseOp):
    """``x * factor``."""

    name = "mdsl.graph.scale"
    factor = float_param()


@irdl_op_definition
class ClipNormOp(UnaryElementwiseOp):
    """``x * min(1, max_norm / (||x||_2 + 1e-6))``: ``x`` rescaled so its L2 norm (over the whole
    tensor) is at most ``max_norm``, torch's ``clip_grad_norm_`` of one tensor. ``mdsl-autodiff``
    puts it on a gradient annotated ``@gradient(clip=C)`` (spec 7.8.3); ``mdsl-lower-to-sched``
    lowers it to the optimizer's ``global_norm`` and ``clip_factor`` kernels and a ``mul``."""

    name = "mdsl.graph.clip_norm"
    max_norm = attr_def(FloatAttr)

    def verify_shapes(self) -> None:
        super().verify_shapes()
        value = self.max_norm.value.data
        if not math.isfinite(value) or value <= 0:
            raise VerifyException(f"max_norm must be a finite number above 0, got {value}")


@irdl_op_definition
class DropoutOp(PrimitiveOp):
    """``x * mask / (1 - p)`` in a training step, ``x`` otherwise: element ``e`` is dropped with
    probability ``p`` by a counter-based hash of (``seed``, ``offset``, the enclosing layers, the
    step counter, ``e``), so a recompute and the backward draw the same mask without storing it
    (:mod:`modeldsl.kernels.dropout_mask`). ``training`` is set by ``mdsl-autodiff`` on the ops of
    the forward it differentiates. ``step`` (an int64 ``[1]``, passed by keyword) is the counter;
    without it ``mdsl-lower-to-sched`` gives an active launch the program's ``rng_step`` input, one
    more each training step, and the graph interpreter its ``rng_step``."""

    name = "mdsl.graph.dropout"
    KEYWORD_OPERANDS: ClassVar[tuple[str, ...]] = ("step",)

    x = operand_def(TensorType)
    step = opt_operand_def(TensorType)
    out = result_def(TensorType)
    p = float_param(0.5)
    seed = int_param(0)
    offset = int_param(0)
    training = bool_param(False)

    def verify_shapes(self) -> None:
        x, out = tensor(self.x), tensor(self.out)
        check_same_shape("result", x, out)
        check_same_dtype("result", x, out)
        if self.step is not None:
            step = tensor(self.step)
            check_rank("step", step, 1)
            check_dim("step length", step.shape[0], Expr.const(1))
            check_dtype_in("step", step, (DType.INT64,))
        p = self.p.value.data
        if not 0.0 <= p < 1.0:
            raise VerifyException(f"dropout p must be in [0, 1), got {p}")
        for name in ("seed", "offset"):
            if not 0 <= get_int(self, name) < 2**32:
                raise VerifyException(f"dropout {name} must be in [0, 2^32), got {get_int(self, name)}")


@irdl_op_definition
class AddScalarOp(UnaryElementwiseOp):
    """``x + value`` (the ``+ eps`` of a written-out norm, the ``1 +`` of a written-out GELU)."""

    name = "mdsl.graph.add_scalar"
    value = float_param()


@irdl_op_definition
class ExpOp(UnaryElementwiseOp):
    """``exp(x)``."""

    name = "mdsl.graph.exp"


@irdl_op_definition
class LogOp(UnaryElementwiseOp):
    """``log(x)``."""

    name = "mdsl.graph.log"


@irdl_op_definition
class TanhOp(UnaryElementwiseOp):
    """``tanh(x)``."""

    name = "mdsl.graph.tanh"


@irdl_op_definition
class SigmoidOp(UnaryElementwiseOp):
    """``1 / (1 + exp(-x))``."""

    name = "mdsl.graph.sigmoid"


@irdl_op_definition
class RsqrtOp(UnaryElementwiseOp):
    """``1 / sqrt(x)``."""

    name = "mdsl.graph.rsqrt"


@irdl_op_definition
class Add3Op(PrimitiveOp):
    """``a + b + c`` (parallel residual blocks)."""

    name = "mdsl.graph.add3"

    a = operand_def(TensorType)
    b = operand_def(TensorType)
    c = operand_def(TensorType)
    out = result_def(TensorType)

    def verify_shapes(self) -> None:
        a = tensor(self.a)
        check_same_dtype("operands and result", a, tensor(self.b), tensor(self.c), tensor(self.out))
        for what, t in (("b", self.b), ("c", self.c), ("result", self.out)):
            check_same_shape(what, a, tensor(t))


def reduced_shape(x: TensorType, axes: Sequence[int], keepdim: bool) -> list[Dim]:
    """The shape after reducing ``axes``, which index the written shape: on
    ``[*, N]`` dim 0 is the whole ``*`` group (``d_bias`` of a linear layer
    sums ``[*, N]`` over dim 0), which ``keepdim`` cannot keep."""
    rank = len(x.shape)
    norm = {normalize_axis("reduction dim", a, rank) for a in axes}
    if len(norm) != len(axes):
        raise VerifyException(f"reduction dims {list(axes)} repeat a dimension")
    if x.is_variadic and keepdim and 0 in norm:
        raise VerifyException("keepdim cannot keep the variadic '*' dimensions")
    return [Expr.const(1) if i in norm else d for i, d in enumerate(x.shape) if keepdim or i not in norm]


class ReductionOp(PrimitiveOp):
    x = operand_def(TensorType)
    out = result_def(TensorType)
    dims = attr_def(DenseArrayBase)
    keepdim = bool_param(False)

    def verify_shapes(self) -> None:
        x = tensor(self.x)
        axes = list(self.dims.get_values())
        if not axes:
            raise VerifyException("needs at least one reduction dim")
        shape = reduced_shape(x, axes, bool(get_int(self, "keepdim")))
        check_same_shape("result", x.with_shape(shape), tensor(self.out))


@irdl_op_definition
class ReduceSumOp(ReductionOp):
    name = "mdsl.graph.reduce_sum"


@irdl_op_definition
class ReduceMeanOp(ReductionOp):
    name = "mdsl.graph.reduce_mean"


@irdl_op_definition
class ReduceMaxOp(PrimitiveOp):
    """Max along ``dim``: ``(values, indices)`` (indices int32 or int64)."""

    name = "mdsl.graph.reduce_max"

    x = operand_def(TensorType)
    values = result_def(TensorType)
    indices = result_def(TensorType)
    dim = attr_def(IntegerAttr)
    keepdim = bool_param(False)

    def verify_shapes(self) -> None:
        x = tensor(self.x)
        check_dtype_in("indices", tensor(self.indices), INDEX_DTYPES)
        shape = reduced_shape(x, [self.dim.value.data], bool(get_int(self, "keepdim")))
        if shape is not None:
            check_same_shape("values", x.with_shape(shape), tensor(self.values))
            check_same_shape("indices", x.with_shape(shape), tensor(self.indices))


@irdl_op_definition
class ReduceMaxBackwardOp(PrimitiveOp):
    """``d_x``: ``d_values`` at the ``indices`` of the maxima along ``dim``, 0 elsewhere.

    The operands do not carry the size of ``dim``: the result type gives the
    shape of ``d_x`` (as ``embedding_backward``'s gives ``V``).
    """

    name = "mdsl.graph.reduce_max_backward"

    d_values = operand_def(TensorType)
    indices = operand_def(TensorType)
    d_x = result_def(TensorType)
    dim = attr_def(IntegerAttr)
    keepdim = bool_param(False)

    def verify_shapes(self) -> None:
        dv, idx, dx = tensor(self.d_values), tensor(self.indices), tensor(self.d_x)
        check_dtype_in("indices", idx, INDEX_DTYPES)
        check_same_dtype("d_values and d_x", dv, dx)
        check_same_shape("indices", dv, idx)
        shape = reduced_shape(dx, [self.dim.value.data], bool(get_int(self, "keepdim")))
        check_same_shape("d_values", dx.with_shape(shape), dv)


# ----------------------------------------------------------------------------
# 6.8 Embedding
# ----------------------------------------------------------------------------


@irdl_op_definition
class EmbeddingOp(PrimitiveOp):
    """``weight[indices]``: ``([*], [V, D]) -> [*, D]``."""

    name = "mdsl.graph.embedding"

    indices = operand_def(TensorType)
    weight = operand_def(TensorType)
    out = result_def(TensorType)

    def verify_shapes(self) -> None:
        idx, w, out = tensor(self.indices), tensor(self.weight), tensor(self.out)
        check_dtype_in("indices", idx, INDEX_DTYPES)
        check_rank("weight", w, 2)
        check_same_dtype("result", w, out)
        check_dim("embedding width", dim_at(out, -1), w.shape[1])
        check_same_shape("result without its last dim", idx, out.with_shape(list(out.shape[:-1])))


@irdl_op_definition
class EmbeddingBackwardOp(PrimitiveOp):
    """Scatter-add of ``d_out`` rows into ``d_weight: [V, D]``."""

    name = "mdsl.graph.embedding_backward"

    d_out = operand_def(TensorType)
    indices = operand_def(TensorType)
    d_weight = result_def(TensorType)

    def verify_shapes(self) -> None:
        dy, idx, dw = tensor(self.d_out), tensor(self.indices), tensor(self.d_weight)
        check_dtype_in("indices", idx, INDEX_DTYPES)
        check_rank("d_weight", dw, 2)
        check_dim("embedding width", dim_at(dy, -1), dw.shape[1])
        check_same_shape("d_out without its last dim", idx, dy.with_shape(list(dy.shape[:-1])))


# ----------------------------------------------------------------------------
# 6.9 MoE
# ----------------------------------------------------------------------------


@irdl_op_definition
class MoeRouterOp(PrimitiveOp):
    """Router: ``logits = x @ gate^T``, softmax (or sigmoid), top-k, optional renormalization.

    ``(x: [N, C], gate: [E, C]) -> (weights: [N, top_k], indices: [N, top_k] int32, aux_loss: [] fp32)``
    """

    name = "mdsl.graph.moe_router"

    x = operand_def(TensorType)
    gate = operand_def(TensorType)
    weights = result_def(TensorType)
    indices = result_def(TensorType)
    aux_loss = result_def(TensorType)
    top_k = count_param()
    normalize = bool_param(True)
    aux_loss_coef = float_param(0.01)
    use_sigmoid = bool_param(False)

    def verify_shapes(self) -> None:
        x, gate = tensor(self.x), tensor(self.gate)
        w, idx, aux = tensor(self.weights), tensor(self.indices), tensor(self.aux_loss)
        k = count_value(self, "top_k")
        check_rank("x", x, 2)
        check_rank("gate", gate, 2)
        check_dim("hidden size of x and gate", x.shape[1], gate.shape[1])
        if k is None:
            return  # symbolic: checked again when mdsl-specialize binds it
        if isinstance(k, int) and k <= 0:
            raise VerifyException(f"top_k must be positive, got {k}")
        experts = gate.shape[0].const_value()
        if experts is not None and isinstance(k, int) and k > experts:
            raise VerifyException(f"top_k ({k}) exceeds the number of experts ({experts})")
        expected = x.with_shape([x.shape[0], k])
        check_same_shape("weights", expected, w)
        check_same_shape("indices", expected, idx)
        check_dtype_in("indices", idx, INDEX_DTYPES)
        check_rank("aux_loss", aux, 0)
        check_dtype_in("aux_loss", aux, (DType.FP32,))


@irdl_op_definition
class MoeRouterBackwardOp(PrimitiveOp):
    """``(d_weights, x, gate, indices) -> (d_x, d_gate)``."""

    name = "mdsl.graph.moe_router_backward"

    d_weights = operand_def(TensorType)
    x = operand_def(TensorType)
    gate = operand_def(TensorType)
    indices = operand_def(TensorType)
    d_x = result_def(TensorType)
    d_gate = result_def(TensorType)
    normalize = bool_param(True)
    aux_loss_coef = float_param(0.01)
    use_sigmoid = bool_param(False)

    def verify_shapes(self) -> None:
        x, gate = tensor(self.x), tensor(self.gate)
        check_same_shape("d_x", x, tensor(self.d_x))
        check_same_shape("d_gate", gate, tensor(self.d_gate))
        check_same_shape("d_weights and indices", tensor(self.d_weights), tensor(self.indices))
        check_dtype_in("indices", tensor(self.indices), INDEX_DTYPES)


@irdl_op_definition
class MoeComputeOffsetsOp(PrimitiveOp):
    """Where each expert's rows start in the permuted order: ``indices [N, K] -> offsets [num_experts + 1]``,
    ``offsets[e]`` the number of assignments to experts before ``e`` (spec 6.9.2's example)."""

    name = "mdsl.graph.moe_compute_offsets"

    indices = operand_def(TensorType)
    offsets = result_def(TensorType)
    num_experts = count_param()

    def verify_shapes(self) -> None:
        idx, off = tensor(self.indices), tensor(self.offsets)
        check_rank("indices", idx, 2)
        check_dtype_in("indices", idx, INDEX_DTYPES)
        check_dtype_in("offsets", off, INDEX_DTYPES)
        experts = count_value(self, "num_experts")
        if experts is None:
            return  # symbolic: checked again when mdsl-specialize binds it
        if isinstance(experts, int) and experts < 1:
            raise VerifyException(f"num_experts must be at least 1, got {experts}")
        check_same_shape("offsets", off.with_shape([experts + 1]), off)


@irdl_op_definition
class MoePermuteOp(PrimitiveOp):
    """Groups token copies by expert: ``(x [N, C], indices [N, K], expert_offsets [E + 1])
    -> (permuted [N*K, C], scatter_indices [N*K])``."""

    name = "mdsl.graph.moe_permute"

    x = operand_def(TensorType)
    indices = operand_def(TensorType)
    expert_offsets = operand_def(TensorType)
    permuted = result_def(TensorType)
    scatter_indices = result_def(TensorType)

    def verify_shapes(self) -> None:
        x, idx, off = tensor(self.x), tensor(self.indices), tensor(self.expert_offsets)
        perm, scatter = tensor(self.permuted), tensor(self.scatter_indices)
        check_rank("x", x, 2)
        check_rank("indices", idx, 2)
        check_rank("expert_offsets", off, 1)
        for what, t in (("indices", idx), ("expert_offsets", off), ("scatter_indices", scatter)):
            check_dtype_in(what, t, INDEX_DTYPES)
        check_dim("tokens of x and indices", x.shape[0], idx.shape[0])
        total = idx.shape[0] * idx.shape[1]
        check_same_shape("permuted", x.with_shape([total, x.shape[1]]), perm)
        check_same_shape("scatter_indices", x.with_shape([total]), scatter)


@irdl_op_definition
class MoeUnpermuteOp(PrimitiveOp):
    """Scatters expert outputs back and combines them with the routing weights: ``-> [N, C]``."""

    name = "mdsl.graph.moe_unpermute"

    expert_outputs = operand_def(TensorType)
    weights = operand_def(TensorType)
    scatter_indices = operand_def(TensorType)
    combined = result_def(TensorType)

    def verify_shapes(self) -> None:
        eo, w, scatter, out = (tensor(v) for v in
                               (self.expert_outputs, self.weights, self.scatter_indices, self.combined))
        check_rank("expert_outputs", eo, 2)
        check_rank("weights", w, 2)
        check_dtype_in("scatter_indices", scatter, INDEX_DTYPES)
        check_dim("expert_outputs rows (tokens * top_k)", eo.shape[0], w.shape[0] * w.shape[1])
        check_same_shape("scatter_indices", eo.with_shape([eo.shape[0]]), scatter)
        check_same_shape("combined", eo.with_shape([w.shape[0], eo.shape[1]]), out)


@irdl_op_definition
class MoeUnpermuteBackwardOp(PrimitiveOp):
    """``(d_combined, expert_outputs, weights, scatter_indices) -> (d_expert_outputs, d_weights)``.

    The spec lists ``(d_combined, weights, scatter_indices)``; ``d_weights``
    needs the expert outputs too, so they are an operand here.
    """

    name = "mdsl.graph.moe_unpermute_backward"

    d_combined = operand_def(TensorType)
    expert_outputs = operand_def(TensorType)
    weights = operand_def(TensorType)
    scatter_indices = operand_def(TensorType)
    d_expert_outputs = result_def(TensorType)
    d_weights = result_def(TensorType)

    def verify_shapes(self) -> None:
        check_same_shape("d_expert_outputs", tensor(self.expert_outputs), tensor(self.d_expert_outputs))
        check_same_shape("d_weights", tensor(self.weights), tensor(self.d_weights))
        check_dtype_in("scatter_indices", tensor(self.scatter_indices), INDEX_DTYPES)
        w, dc = tensor(self.weights), tensor(self.d_combined)
        check_dim("tokens of d_combined and weights", dc.shape[0], w.shape[0])


# ----------------------------------------------------------------------------
# 6.10 Mamba
# ----------------------------------------------------------------------------


@irdl_op_definition
class MambaConv1dOp(PrimitiveOp):
    """Causal depthwise conv over time: ``x: [B, D, T]``, ``weight: [D, 1, kernel_size]``.

    Optional ``bias: [D]`` and incremental ``state: [B, D, kernel_size - 1]``
    (which adds the ``conv_state_out`` result).
    """

    name = "mdsl.graph.mamba_conv1d"
    ENUMS: ClassVar[dict[str, tuple[str, ...]]] = {"activation": ("silu", "none")}

    x = operand_def(TensorType)
    weight = operand_def(TensorType)
    bias = opt_operand_def(TensorType)
    conv_state = opt_operand_def(TensorType)
    y = result_def(TensorType)
    conv_state_out = opt_result_def(TensorType)
    kernel_size = int_param(4)
    activation = enum_param("silu")

    irdl_options = (AttrSizedOperandSegments(as_property=True),)
    assembly_format = (
        "$x `,` $weight (`bias` $bias^)? (`state` $conv_state^)? attr-dict "
        "`:` type($x) `,` type($weight) (`bias` type($bias)^)? (`state` type($conv_state)^)? "
        "`->` type($y) (`,` type($conv_state_out)^)?"
    )

    def verify_shapes(self) -> None:
        x, w, y = tensor(self.x), tensor(self.weight), tensor(self.y)
        ks = get_int(self, "kernel_size")
        check_rank("x", x, 3)
        check_same_shape("y", x, y)
        check_same_shape("weight", x.with_shape([x.shape[1], 1, ks]), w)
        if self.bias is not None:
            check_norm_weight("bias", x.with_shape([x.shape[1]]), tensor(self.bias))
        state_shape = [x.shape[0], x.shape[1], ks - 1]
        if self.conv_state is not None:
            check_same_shape("conv_state", x.with_shape(state_shape), tensor(self.conv_state))
        if (self.conv_state is None) != (self.conv_state_out is None):
            raise VerifyException("conv_state_out is returned exactly when a conv_state is given")
        if self.conv_state_out is not None:
            check_same_shape("conv_state_out", x.with_shape(state_shape), tensor(self.conv_state_out))


@irdl_op_definition
class MambaConv1dBackwardOp(PrimitiveOp):
    """``(d_y, x, weight) -> (d_x, d_weight, d_bias?)``."""

    name = "mdsl.graph.mamba_conv1d_backward"
    ENUMS: ClassVar[dict[str, tuple[str, ...]]] = {"activation": ("silu", "none")}

    d_y = operand_def(TensorType)
    x = operand_def(TensorType)
    weight = operand_def(TensorType)
    bias = opt_operand_def(TensorType)
    d_x = result_def(TensorType)
    d_weight = result_def(TensorType)
    d_bias = opt_result_def(TensorType)
    kernel_size = int_param(4)
    activation = enum_param("silu")

    def verify_shapes(self) -> None:
        x = tensor(self.x)
        check_same_shape("d_y", x, tensor(self.d_y))
        check_same_shape("d_x", x, tensor(self.d_x))
        check_same_shape("d_weight", tensor(self.weight), tensor(self.d_weight))
        if (self.bias is None) != (self.d_bias is None):
            raise VerifyException("d_bias is returned exactly when a bias is given")


@irdl_op_definition
class MambaSelectiveScanOp(PrimitiveOp):
    """Selective SSM scan ``h[t] = exp(delta A) h[t-1] + delta B[t] x[t]; y[t] = C[t] h[t] + D x[t]``.

    ``u, delta: [B, D, T]``, ``a_log: [D, N]``, ``b_proj, c_proj: [B, G, N, T]``,
    ``d_skip, dt_bias: [D]``, optional ``ssm_state: [B, D, N]`` ->
    ``(y: [B, D, T], ssm_state_out: [B, D, N])``. (The spec's A, B, C, D.)
    """

    name = "mdsl.graph.mamba_selective_scan"

    u = operand_def(TensorType)
    delta = operand_def(TensorType)
    a_log = operand_def(TensorType)
    b_proj = operand_def(TensorType)
    c_proj = operand_def(TensorType)
    d_skip = operand_def(TensorType)
    dt_bias = operand_def(TensorType)
    ssm_state = opt_operand_def(TensorType)
    y = result_def(TensorType)
    ssm_state_out = result_def(TensorType)
    chunk_size = int_param(256)

    def verify_shapes(self) -> None:
        verify_scan_operands(self)
        u = tensor(self.u)
        check_same_shape("y", u, tensor(self.y))
        check_same_shape("ssm_state_out", u.with_shape([u.shape[0], u.shape[1], dim_at(tensor(self.a_log), 1)]),
                         tensor(self.ssm_state_out))


def verify_scan_operands(op: Operation) -> None:
    u, delta, a = tensor(op.u), tensor(op.delta), tensor(op.a_log)
    check_rank("u", u, 3)
    check_same_shape("delta", u, delta)
    check_rank("a_log", a, 2)
    batch, channels, steps = u.shape
    n = a.shape[1]
    check_dim("a_log channels", a.shape[0], channels)
    for what in ("b_proj", "c_proj"):
        t = tensor(getattr(op, what))
        check_rank(what, t, 4)
        check_dim(f"{what} batch", t.shape[0], batch)
        check_dim(f"{what} state size", t.shape[2], n)
        check_dim(f"{what} steps", t.shape[3], steps)
        groups = t.shape[1].const_value()
        chans = channels.const_value()
        if groups and chans is not None and chans % groups:
            raise VerifyException(f"channels ({chans}) must be a multiple of the groups of {what} ({groups})")
    for what in ("d_skip", "dt_bias"):
        check_same_shape(what, u.with_shape([channels]), tensor(getattr(op, what)))
    if op.ssm_state is not None:
        check_same_shape("ssm_state", u.with_shape([batch, channels, n]), tensor(op.ssm_state))
    if getattr(op, "chunk_size", None) is not None and get_int(op, "chunk_size") <= 0:
        raise VerifyException("chunk_size must be positive")


@irdl_op_definition
class MambaSelectiveScanBackwardOp(PrimitiveOp):
    """``(d_y, u, delta, a_log, b_proj, c_proj, d_skip, dt_bias, ssm_state?, y) -> (d_u, d_delta, d_a_log,
    d_b_proj, d_c_proj, d_d_skip, d_dt_bias)``: spec 6.10.2's order, the optional initial state before y."""

    name = "mdsl.graph.mamba_selective_scan_backward"

    d_y = operand_def(TensorType)
    u = operand_def(TensorType)
    delta = operand_def(TensorType)
    a_log = operand_def(TensorType)
    b_proj = operand_def(TensorType)
    c_proj = operand_def(TensorType)
    d_skip = operand_def(TensorType)
    dt_bias = operand_def(TensorType)
    ssm_state = opt_operand_def(TensorType)
    y = operand_def(TensorType)
    d_u = result_def(TensorType)
    d_delta = result_def(TensorType)
    d_a_log = result_def(TensorType)
    d_b_proj = result_def(TensorType)
    d_c_proj = result_def(TensorType)
    d_d_skip = result_def(TensorType)
    d_dt_bias = result_def(TensorType)
    chunk_size = int_param(256)

    def verify_shapes(self) -> None:
        verify_scan_operands(self)
        u = tensor(self.u)
        check_same_shape("d_y", u, tensor(self.d_y))
        check_same_shape("y", u, tensor(self.y))
        for name in ("u", "delta", "a_log", "b_proj", "c_proj", "d_skip", "dt_bias"):
            check_same_shape(f"d_{name}", tensor(getattr(self, name)), tensor(getattr(self, f"d_{name}")))


# ----------------------------------------------------------------------------
# 6.11 Utility
# ----------------------------------------------------------------------------


class ConstantFillOp(PrimitiveOp):
    """A new tensor of the result type filled with one value."""

    out = result_def(TensorType)

    assembly_format = "attr-dict `:` type($out)"

    def verify_shapes(self) -> None:
        if tensor(self.out).is_variadic:
            raise VerifyException("a constant tensor needs a shape without '*'")


@irdl_op_definition
class ZerosOp(ConstantFillOp):
    name = "mdsl.graph.zeros"


@irdl_op_definition
class OnesOp(ConstantFillOp):
    name = "mdsl.graph.ones"


@irdl_op_definition
class FillOp(ConstantFillOp):
    name = "mdsl.graph.fill"
    value = float_param()


@irdl_op_definition
class CopyOp(UnaryElementwiseOp):
    """A copy into a new buffer."""

    name = "mdsl.graph.copy"


@irdl_op_definition
class CastOp(PrimitiveOp):
    """Element type conversion (explicit casts of spec 7.4.4); same shape."""

    name = "mdsl.graph.cast"

    x = operand_def(TensorType)
    out = result_def(TensorType)

    def verify_shapes(self) -> None:
        check_same_shape("result", tensor(self.x), tensor(self.out))


# ----------------------------------------------------------------------------
# Quantization
# ----------------------------------------------------------------------------

QUANTIZED_DTYPES = (DType.FP8_E4M3, DType.FP8_E5M2)


@irdl_op_definition
class DequantizeOp(PrimitiveOp):
    """``q * scale`` row by row: ``(q [*, N] fp8, scale [*] fp32) -> [*, N]`` in a wider float.

    ``q`` holds values scaled into the fp8 range, one fp32 ``scale`` per row (an output
    channel of a weight ``[out, in]``); the result's dtype is the compute dtype (a ``dtype``
    of shape inference, as ``cast``'s). The weights ``mdsl-quantize-frozen`` stores in fp8 are
    read through it."""

    name = "mdsl.graph.dequantize"

    q = operand_def(TensorType)
    scale = operand_def(TensorType)
    out = result_def(TensorType)

    def verify_shapes(self) -> None:
        q, scale, out = tensor(self.q), tensor(self.scale), tensor(self.out)
        check_dtype_in("q", q, QUANTIZED_DTYPES)
        check_dtype_in("scale", scale, (DType.FP32,))
        check_dtype_in("result", out, (DType.FP32, DType.BF16, DType.FP16))
        check_min_rank("q", q, 1)
        check_same_shape("scale (one per row of q)", q.with_shape(list(q.shape[:-1])), scale)
        check_same_shape("result", q, out)


# ----------------------------------------------------------------------------
# Losses
# ----------------------------------------------------------------------------

REDUCTIONS = ("mean", "sum", "none")


def check_loss_outputs(op: Operation, rows: Dim, loss: TensorType, lse: TensorType) -> None:
    check_dtype_in("loss", loss, (DType.FP32,))
    check_dtype_in("lse", lse, (DType.FP32,))
    check_rank("lse", lse, 1)
    check_dim("lse rows", lse.shape[0], rows)
    reduction = op.attributes.get("reduction")
    if isinstance(reduction, StringAttr) and reduction.data == "none":
        check_rank("per-token loss", loss, 1)
        check_dim("loss rows", loss.shape[0], rows)
    else:
        check_rank("loss", loss, 0)


@irdl_op_definition
class CrossEntropyOp(PrimitiveOp):
    """Softmax cross-entropy over the vocabulary: ``(logits [N, V], labels [N]) -> (loss, lse [N])``.

    Labels equal to ``ignore_index`` do not count; ``mean`` divides by the
    number of counted labels. ``loss`` is a scalar (``[]``) unless
    ``reduction = "none"`` (``[N]``); both results are fp32.
    """

    name = "mdsl.graph.cross_entropy"
    ENUMS: ClassVar[dict[str, tuple[str, ...]]] = {"reduction": REDUCTIONS}

    logits = operand_def(TensorType)
    labels = operand_def(TensorType)
    loss = result_def(TensorType)
    lse = result_def(TensorType)
    ignore_index = int_param(-100)
    reduction = enum_param("mean")

    def verify_shapes(self) -> None:
        logits, labels = tensor(self.logits), tensor(self.labels)
        check_rank("logits", logits, 2)
        check_rank("labels", labels, 1)
        check_dtype_in("labels", labels, INDEX_DTYPES)
        check_dim("rows of logits and labels", logits.shape[0], labels.shape[0])
        check_loss_outputs(self, logits.shape[0], tensor(self.loss), tensor(self.lse))


@irdl_op_definition
class CrossEntropyBackwardOp(PrimitiveOp):
    """``(d_loss, logits, labels, lse) -> d_logits`` = ``(softmax - onehot) * d_loss`` per counted row."""

    name = "mdsl.graph.cross_entropy_backward"
    ENUMS: ClassVar[dict[str, tuple[str, ...]]] = {"reduction": REDUCTIONS}

    d_loss = operand_def(TensorType)
    logits = operand_def(TensorType)
    labels = operand_def(TensorType)
    lse = operand_def(TensorType)
    d_logits = result_def(TensorType)
    ignore_index = int_param(-100)
    reduction = enum_param("mean")

    def verify_shapes(self) -> None:
        logits = tensor(self.logits)
        check_rank("logits", logits, 2)
        check_same_shape("d_logits", logits, tensor(self.d_logits))
        check_dtype_in("labels", tensor(self.labels), INDEX_DTYPES)
        check_loss_outputs(self, logits.shape[0], tensor(self.d_loss), tensor(self.lse))


def check_chunk(op: Operation) -> None:
    if op.chunk.value.data < 0:
        raise VerifyException(f"chunk must be 0 (all rows) or a positive row count, got {op.chunk.value.data}")


@irdl_op_definition
class FusedLmHeadLossOp(PrimitiveOp):
    """LM head and cross-entropy without materializing all logits: ``(x [N, C], weight [V, C], labels [N])
    -> (loss, lse [N])``."""

    name = "mdsl.graph.fused_lm_head_loss"
    ENUMS: ClassVar[dict[str, tuple[str, ...]]] = {"reduction": REDUCTIONS}

    x = operand_def(TensorType)
    weight = operand_def(TensorType)
    labels = operand_def(TensorType)
    loss = result_def(TensorType)
    lse = result_def(TensorType)
    ignore_index = int_param(-100)
    reduction = enum_param("mean")
    compute_accuracy = bool_param(False)
    chunk = int_param(0)  # rows of x per chunk of logits (0: all rows at once)

    def verify_shapes(self) -> None:
        check_chunk(self)
        x, w, labels = tensor(self.x), tensor(self.weight), tensor(self.labels)
        check_rank("x", x, 2)
        check_rank("weight", w, 2)
        check_rank("labels", labels, 1)
        check_dtype_in("labels", labels, INDEX_DTYPES)
        check_dim("hidden size of x and weight", x.shape[1], w.shape[1])
        check_dim("rows of x and labels", x.shape[0], labels.shape[0])
        check_loss_outputs(self, x.shape[0], tensor(self.loss), tensor(self.lse))


@irdl_op_definition
class FusedLmHeadLossBackwardOp(PrimitiveOp):
    """``(d_loss, x, weight, labels, lse) -> (d_x, d_weight)``, recomputing logits chunk by chunk."""

    name = "mdsl.graph.fused_lm_head_loss_backward"
    ENUMS: ClassVar[dict[str, tuple[str, ...]]] = {"reduction": REDUCTIONS}

    d_loss = operand_def(TensorType)
    x = operand_def(TensorType)
    weight = operand_def(TensorType)
    labels = operand_def(TensorType)
    lse = operand_def(TensorType)
    d_x = result_def(TensorType)
    d_weight = result_def(TensorType)
    ignore_index = int_param(-100)
    reduction = enum_param("mean")
    chunk = int_param(0)  # rows of x per chunk of logits (0: all rows at once)

    def verify_shapes(self) -> None:
        check_chunk(self)
        x, w = tensor(self.x), tensor(self.weight)
        check_rank("x", x, 2)
        check_rank("weight", w, 2)
        check_dim("hidden size of x and weight", x.shape[1], w.shape[1])
        check_same_shape("d_x", x, tensor(self.d_x))
        check_same_shape("d_weight", w, tensor(self.d_weight))
        check_dtype_in("labels", tensor(self.labels), INDEX_DTYPES)
        check_loss_outputs(self, x.shape[0], tensor(self.d_loss), tensor(self.lse))


def check_loss_value(op: Operation, rows: Dim, loss: TensorType) -> None:
    """An fp32 loss: a scalar, or one per row for reduction none."""
    check_dtype_in("loss", loss, (DType.FP32,))
    if op.reduction.data == "none":
        check_rank("per-token loss", loss, 1)
        check_dim("loss rows", loss.shape[0], rows)
    else:
        check_rank("loss", loss, 0)


@irdl_op_definition
class FusedLmHeadLossGradOp(PrimitiveOp):
    """The fused LM-head loss and its gradient in one chunked pass (``d_loss`` known beforehand):
    ``(d_loss, x [N, C], weight [V, C], labels [N]) -> (loss, d_x, d_weight)``."""

    name = "mdsl.graph.fused_lm_head_loss_grad"
    ENUMS: ClassVar[dict[str, tuple[str, ...]]] = {"reduction": REDUCTIONS}

    d_loss = operand_def(TensorType)
    x = operand_def(TensorType)
    weight = operand_def(TensorType)
    labels = operand_def(TensorType)
    loss = result_def(TensorType)
    d_x = result_def(TensorType)
    d_weight = result_def(TensorType)
    ignore_index = int_param(-100)
    reduction = enum_param("mean")
    chunk = int_param(0)  # rows of x per chunk of logits (0: all rows at once)

    def verify_shapes(self) -> None:
        check_chunk(self)
        x, w, labels = tensor(self.x), tensor(self.weight), tensor(self.labels)
        check_rank("x", x, 2)
        check_rank("weight", w, 2)
        check_rank("labels", labels, 1)
        check_dtype_in("labels", labels, INDEX_DTYPES)
        check_dim("hidden size of x and weight", x.shape[1], w.shape[1])
        check_dim("rows of x and labels", x.shape[0], labels.shape[0])
        check_same_shape("d_x", x, tensor(self.d_x))
        check_same_shape("d_weight", w, tensor(self.d_weight))
        check_same_shape("loss", tensor(self.d_loss), tensor(self.loss))
        check_dtype_in("d_loss", tensor(self.d_loss), (DType.FP32,))
        check_loss_value(self, x.shape[0], tensor(self.loss))


# ----------------------------------------------------------------------------
# Collectives (spec 7.6): over a named process group of ``size`` ranks
# ----------------------------------------------------------------------------

REDUCTIONS = ("sum", "avg", "max", "min")
GROUPS = ("world", "tp", "dp", "pp", "ep")  # the process groups of a parallel layout


class CollectiveBase(PrimitiveOp):
    """A collective over the process group ``group`` (``tp``, ``dp``, ``pp``, ``ep``, ``world``) of
    ``size`` ranks; every rank of the group runs it on its own value."""

    def check_group(self) -> None:
        if get_int(self, "size") < 1:
            raise VerifyException(f"a group has at least one rank, got size {get_int(self, 'size')}")


@irdl_op_definition
class AllReduceOp(CollectiveBase):
    """Every rank gets the reduction (``op``: sum, avg, max, min) of the group's values: same shape."""

    name = "mdsl.graph.all_reduce"
    ENUMS: ClassVar[dict[str, tuple[str, ...]]] = {"group": GROUPS, "op": REDUCTIONS}

    x = operand_def(TensorType)
    out = result_def(TensorType)
    group = enum_param("world")
    size = int_param(1)
    op = enum_param("sum")

    def verify_shapes(self) -> None:
        self.check_group()
        check_same_shape("result", tensor(self.x), tensor(self.out))


def check_gathered(what: str, part: TensorType, whole: TensorType, dim: int, size: int) -> None:
    """``whole`` is ``size`` parts along ``dim``: the other dims equal, ``dim`` ``size`` times as long."""
    axis = resolve_axis("dim", dim, part)
    check_same_dtype(what, part, whole)
    check_rank(what, whole, len(part.shape))
    for i, (a, b) in enumerate(zip(part.shape, whole.shape)):
        check_dim(f"{what} dim {i}", a * size if i == axis else a, b)


@irdl_op_definition
class AllGatherOp(CollectiveBase):
    """Every rank gets the group's values concatenated along ``dim``, in rank order."""

    name = "mdsl.graph.all_gather"
    ENUMS: ClassVar[dict[str, tuple[str, ...]]] = {"group": GROUPS}

    x = operand_def(TensorType)
    out = result_def(TensorType)
    group = enum_param("world")
    size = int_param(1)
    dim = int_param(0)

    def verify_shapes(self) -> None:
        self.check_group()
        check_gathered("result", tensor(self.x), tensor(self.out), get_int(self, "dim"), get_int(self, "size"))


@irdl_op_definition
class ReduceScatterOp(CollectiveBase):
    """The group's values summed (``op``), then cut along ``dim`` into ``size`` parts: rank r gets part r."""

    name = "mdsl.graph.reduce_scatter"
    ENUMS: ClassVar[dict[str, tuple[str, ...]]] = {"group": GROUPS, "op": REDUCTIONS}

    x = operand_def(TensorType)
    out = result_def(TensorType)
    group = enum_param("world")
    size = int_param(1)
    dim = int_param(0)
    op = enum_param("sum")

    def verify_shapes(self) -> None:
        self.check_group()
        check_gathered("input", tensor(self.out), tensor(self.x), get_int(self, "dim"), get_int(self, "size"))


COLLECTIVE_OPS: tuple[type[Operation], ...] = (AllReduceOp, AllGatherOp, ReduceScatterOp)


PRIMITIVE_OPS: tuple[type[Operation], ...] = (
    MatmulOp, BatchedMatmulOp, LinearBiasActOp, GroupedGemmOp, GroupedGemmWeightGradOp,
    RmsnormOp, RmsnormBackwardOp, FusedResidualRmsnormOp, FusedResidualRmsnormBackwardOp,
    LayernormOp, LayernormBackwardOp,
    SwigluOp, SwigluBackwardOp, GegluOp, GegluBackwardOp, SiluOp, SiluBackwardOp,
    FusedSplitSwigluOp, FusedSplitSwigluBackwardOp, FusedSplitGegluOp, FusedSplitGegluBackwardOp,
    ReluOp, ReluBackwardOp, Relu2Op, Relu2BackwardOp, GeluOp, GeluBackwardOp,
    SoftmaxOp, SoftmaxBackwardOp, CausalMaskOp,
    FlashAttentionOp, FlashAttentionBackwardOp, RopeOp, RopeBackwardOp, QkNormOp, QkNormBackwardOp,
    FusedQkNormRopeOp, FusedQkNormRopeBackwardOp,
    SplitOp, ConcatOp, ViewOp, TransposeOp, PermuteOp, ContiguousOp,
    AddOp, AddBackwardOp, MulOp, MulBackwardOp, BiasAddOp, ScaleOp, ClipNormOp, Add3Op,
    SubOp, DivOp, AddScalarOp, DropoutOp, ExpOp, LogOp, TanhOp, SigmoidOp, RsqrtOp,
    ReduceSumOp, ReduceMeanOp, ReduceMaxOp, ReduceMaxBackwardOp,
    EmbeddingOp, EmbeddingBackwardOp,
    MoeRouterOp, MoeRouterBackwardOp, MoeComputeOffsetsOp, MoePermuteOp, MoeUnpermuteOp, MoeUnpermuteBackwardOp,
    MambaConv1dOp, MambaConv1dBackwardOp, MambaSelectiveScanOp, MambaSelectiveScanBackwardOp,
    ZerosOp, OnesOp, FillOp, CopyOp, CastOp, DequantizeOp,
    CrossEntropyOp, CrossEntropyBackwardOp, FusedLmHeadLossOp, FusedLmHeadLossBackwardOp,
    FusedLmHeadLossGradOp, *COLLECTIVE_OPS,
)
