"""The mdsl.graph dialect: the tensor type's parser and printer, builders, verifiers."""

import re

import pytest
from xdsl.dialects.builtin import IntegerAttr, ModuleOp, StringAttr, i64
from xdsl.parser import Parser
from xdsl.utils.exceptions import ParseError

from modeldsl.dialects.dtypes import DType
from modeldsl.dialects.graph import (
    CallOp,
    DimsAttr,
    ExprAttr,
    FuncOp,
    ModelOp,
    ParamOp,
    ParamRefOp,
    ReturnOp,
    StackOp,
    TensorType,
)
from modeldsl.dialects.graph_primitives import (
    PRIMITIVE_OPS,
    CausalMaskOp,
    FusedLmHeadLossGradOp,
    MatmulOp,
    RmsnormOp,
    SplitOp,
    SwigluOp,
    float_attr,
)
from modeldsl.ir import make_context, print_ir, verify_module
from modeldsl.symbolic import STAR, Expr


def parse_type(text):
    return Parser(make_context(), text).parse_type()


@pytest.mark.parametrize(
    "text, printed",
    [
        ("!mdsl.graph.tensor<[B, T, 4096], bf16>", "!mdsl.graph.tensor<[B, T, 4096], bf16>"),
        ("!mdsl.graph.tensor<[(Hq + 2*Hkv)*D, C], fp32>", "!mdsl.graph.tensor<[2*D*Hkv + D*Hq, C], fp32>"),
        ("!mdsl.graph.tensor<[D floordiv 2], fp8_e4m3>", "!mdsl.graph.tensor<[D floordiv 2], fp8_e4m3>"),
        ("!mdsl.graph.tensor<[*, T, C], int32>", "!mdsl.graph.tensor<[*, T, C], int32>"),
        ("!mdsl.graph.tensor<[], fp32>", "!mdsl.graph.tensor<[], fp32>"),
        ("!mdsl.graph.tensor<[T - 1, x mod 4], bool>", "!mdsl.graph.tensor<[T - 1, x mod 4], bool>"),
    ],
)
def test_tensor_type_round_trips_in_canonical_form(text, printed):
    t = parse_type(text)
    assert isinstance(t, TensorType)
    assert str(t) == printed
    assert parse_type(str(t)) == t


def test_equal_shapes_compare_equal():
    assert parse_type("!mdsl.graph.tensor<[(Hq+2*Hkv)*D], bf16>") == parse_type(
        "!mdsl.graph.tensor<[D*Hq + Hkv*D*2], bf16>"
    )
    assert TensorType(["B", "T"], DType.BF16) == TensorType([Expr.sym("B"), "T"], "bf16")


def test_tensor_type_accessors():
    t = TensorType(["*", "T", 64], DType.FP16)
    assert t.shape[0] is STAR and t.is_variadic and t.rank == 3
    assert t.dtype is DType.FP16 and t.numel() is None
    assert TensorType(["B", 4], "fp32").numel() == Expr.parse("4*B")
    assert t.with_dtype("fp32").dtype is DType.FP32


@pytest.mark.parametrize(
    "text, message",
    [
        ("!mdsl.graph.tensor<[B, T], float>", "unknown element type 'float'"),
        ("!mdsl.graph.tensor<[B, *], bf16>", "variadic '*' must be the leading dimension"),
        ("!mdsl.graph.tensor<[B +], bf16>", "invalid dimension expression"),
        ("!mdsl.graph.tensor<[D floordiv 0], bf16>", "division by zero"),
        ("!mdsl.graph.tensor<[], >", "element type"),
    ],
)
def test_bad_tensor_types_are_parse_errors(text, message):
    with pytest.raises(ParseError, match=re.escape(message)):
        parse_type(text)


def test_dims_and_expr_attributes():
    ctx = make_context()
    dims = Parser(ctx, "#mdsl.graph.dims<[d_ff, 2*d_ff]>").parse_attribute()
    assert isinstance(dims, DimsAttr)
    assert dims.data == (Expr.sym("d_ff"), Expr.parse("2*d_ff"))
    assert str(dims) == "#mdsl.graph.dims<[d_ff, 2*d_ff]>"
    count = Parser(ctx, "#mdsl.graph.expr<n_layers>").parse_attribute()
    assert count == ExprAttr.of("n_layers")


X = TensorType(["B", "T", 64], "bf16")
W = TensorType([64, 64], "bf16")
STACKED = TensorType(["n_layers", 64, 64], "bf16")


def build_model() -> ModuleOp:
    """A model built with the Python builders: a block body, a stack and a call."""
    model = ModelOp("tiny", {"n_layers": ExprAttr.of(2)})
    block = FuncOp("block", [X, W], [X], kind="block")
    h, w = block.body.block.args
    mm = MatmulOp.make([h, w], [X], {"transpose": StringAttr("NT")})
    block.body.block.add_ops([mm, ReturnOp(mm.results[0])])

    fwd = FuncOp("forward", [X], [X], kind="forward")
    (x,) = fwd.body.block.args
    ref = ParamRefOp("blocks.w", STACKED)
    stack = StackOp("block", ExprAttr.of("n_layers"), [x], [ref.result])
    wref = ParamRefOp("w", W)
    call = CallOp("block", [stack.res[0], wref.result], [X])
    fwd.body.block.add_ops([ref, stack, wref, call, ReturnOp(call.res[0])])

    model.body.block.add_ops(
        [ParamOp("w", W), ParamOp("blocks.w", STACKED), block, fwd]
    )
    return ModuleOp([model])


def test_builders_make_verifying_ir_that_round_trips():
    module = build_model()
    module.verify()
    text = print_ir(module)
    assert "mdsl.graph.stack @block count #mdsl.graph.expr<n_layers>" in text
    reparsed = Parser(make_context(), text).parse_module()
    assert print_ir(reparsed) == text


def test_model_queries():
    model = build_model().body.block.first_op
    assert isinstance(model, ModelOp)
    assert [p.sym_name.data for p in model.params()] == ["w", "blocks.w"]
    assert [f.sym_name.data for f in model.funcs()] == ["block", "forward"]
    assert isinstance(model.lookup("forward"), FuncOp)


def test_every_primitive_op_is_registered_once_with_a_docstring_or_base():
    names = [op.name for op in PRIMITIVE_OPS]
    assert len(names) == len(set(names))
    assert all(name.startswith("mdsl.graph.") for name in names)
    required = {
        "matmul", "batched_matmul", "grouped_gemm", "rmsnorm", "fused_residual_rmsnorm", "layernorm",
        "swiglu", "geglu", "silu", "relu", "relu2", "gelu", "softmax", "flash_attention", "rope",
        "qk_norm", "split", "concat", "view", "transpose", "permute", "contiguous", "add", "mul",
        "scale", "add3", "bias_add", "reduce_sum", "reduce_mean", "reduce_max", "embedding",
        "moe_router", "moe_permute", "moe_unpermute", "mamba_conv1d", "mamba_selective_scan",
        "zeros", "ones", "fill", "copy", "cross_entropy", "fused_lm_head_loss", "fused_lm_head_loss_grad",
        "rmsnorm_backward", "fused_residual_rmsnorm_backward", "layernorm_backward",
        "swiglu_backward", "geglu_backward", "flash_attention_backward", "rope_backward",
        "qk_norm_backward", "embedding_backward",
        "fused_split_swiglu", "fused_split_swiglu_backward", "fused_split_geglu", "fused_split_geglu_backward",
        "linear_bias_act", "causal_mask", "fused_qk_norm_rope", "fused_qk_norm_rope_backward",
    }
    assert required <= {n.removeprefix("mdsl.graph.") for n in names}


def _func_with(op_factory, arg_types, result_types):
    func = FuncOp("f", arg_types, result_types)
    op = op_factory(func.body.block.args)
    func.body.block.add_ops([op, ReturnOp(*op.results)])
    model = ModelOp("m")
    model.body.block.add_op(func)
    return ModuleOp([model]), op


@pytest.mark.parametrize(
    "transpose, a, b, c, ok",
    [
        ("NN", [4, 8], [8, 3], [4, 3], True),
        ("NT", [4, 8], [3, 8], [4, 3], True),
        ("TN", [8, 4], [8, 3], [4, 3], True),
        ("TT", [8, 4], [3, 8], [4, 3], True),
        ("NN", [4, 8], [3, 8], [4, 3], False),
        ("NT", ["B", "T", 64], [32, 64], ["B", "T", 32], True),
        ("NT", ["*", 64], [32, 64], ["*", 32], True),
        ("NT", ["B", "T", 64], [32, 64], ["B", "T", 64], False),
        ("TN", ["B", "T", 64], [32, 64], ["B", 64, 32], False),
        ("NN", ["M", "K"], ["K2", "N"], ["M", "N"], True),
    ],
)
def test_matmul_inner_dimensions_per_transpose_mode(transpose, a, b, c, ok):
    ta, tb, tc = (TensorType(s, "fp32") for s in (a, b, c))
    module, op = _func_with(
        lambda args: MatmulOp.make(list(args), [tc], {"transpose": StringAttr(transpose)}), [ta, tb], [tc]
    )
    diagnostics = verify_module(module)
    assert (not diagnostics) == ok, [d.message for d in diagnostics]


def test_verifier_failure_names_the_op():
    bad = TensorType(["B", "T", 32], "bf16")
    module, op = _func_with(lambda args: SwigluOp.make(list(args), [X]), [X, bad], [X])
    with pytest.raises(Exception, match="gate and up"):
        module.verify()
    (diag,) = verify_module(module)
    assert diag.op_name == "mdsl.graph.swiglu"


def test_rmsnorm_builder_and_attributes():
    rows = TensorType(["B", "T"], "fp32")
    vec = TensorType([64], "bf16")
    module, op = _func_with(
        lambda args: RmsnormOp.make(list(args), [X, rows], {"eps": float_attr(1e-5)}), [X, vec], [X, rows]
    )
    module.verify()
    assert op.eps.value.data == pytest.approx(1e-5)
    assert "{eps = 1.000000e-05 : f64}" in print_ir(module)


def test_split_sizes_must_sum_to_the_dimension():
    half = TensorType(["B", "T", 32], "bf16")
    sizes = DimsAttr.from_list([32, 16])
    module, _ = _func_with(lambda args: SplitOp.make([args[0]], [[half, half]], {"sizes": sizes}), [X], [half, half])
    (diag,) = verify_module(module)
    assert "sum to the split dimension: 48 != 64" in diag.message


def test_symbolic_dims_that_may_be_equal_are_accepted():
    a = TensorType(["B", "T", "C"], "bf16")
    b = TensorType(["B", "T", "D"], "bf16")
    module, _ = _func_with(lambda args: SwigluOp.make(list(args), [a]), [a, b], [a])
    assert verify_module(module) == []


@pytest.mark.parametrize("shape, attrs, message", [
    ([8], {}, "rank 2 or more"),
    (["B", "T", "T"], {"window_size": IntegerAttr(0, i64)}, "window_size must be positive, got 0"),
    (["B", "T", "T"], {"fill": StringAttr("one")}, "fill"),
    (["B", "T", "T"], {"offset": IntegerAttr(-3, i64), "window_size": IntegerAttr(2, i64)}, None),
])
def test_causal_mask_verifier(shape, attrs, message):
    t = TensorType(shape, "fp32")
    module, _ = _func_with(lambda args: CausalMaskOp.make([args[0]], [t], attrs), [t], [t])
    diagnostics = verify_module(module)
    assert [d.message for d in diagnostics if message in d.message] if message else not diagnostics, diagnostics


@pytest.mark.parametrize("reduction, loss, d_x, labels, message", [
    ("mean", [], ["N", 64], "int64", None),
    ("none", ["N"], ["N", 64], "int32", None),
    ("none", [], ["N", 64], "int64", "per-token loss"),
    ("mean", [], ["N", 32], "int64", "d_x"),
    ("mean", [], ["N", 64], "fp32", "labels"),
])
def test_fused_lm_head_loss_grad_verifier(reduction, loss, d_x, labels, message):
    scalar, x, w = TensorType(loss, "fp32"), TensorType(["N", 64], "bf16"), TensorType(["V", 64], "bf16")
    operands = [scalar, x, w, TensorType(["N"], labels)]
    results = [scalar, TensorType(d_x, "bf16"), w]
    attrs = {"reduction": StringAttr(reduction), "chunk": IntegerAttr(4, i64)}
    module, _ = _func_with(lambda args: FusedLmHeadLossGradOp.make(list(args), results, attrs), operands, results)
    diagnostics = verify_module(module)
    assert [d.message for d in diagnostics if message in d.message] if message else not diagnostics, diagnostics
