"""Result-type inference: for every primitive, the inferred op passes the op's own verifier."""

import pytest
from xdsl.dialects.builtin import ModuleOp

from modeldsl.dialects.graph import FuncOp, ModelOp, ReturnOp
from modeldsl.dialects.graph_types import TensorType
from modeldsl.infer import InferenceError, infer_result_types
from modeldsl.ir import verify_module
from modeldsl.primitives import lookup_primitive, primitives
from modeldsl.symbolic import Expr


def T(shape: str, dtype: str = "bf16") -> TensorType:
    return TensorType([d.strip() for d in shape.split(",")] if shape else [], dtype)


X, VEC, ROWS = T("B, T, 64"), T("64"), T("B, T", "fp32")
Q, KV, HV = T("B, 8, T, 16"), T("B, 2, T, 16"), T("16")
FLAT, IDS, LOGITS = T("N, 64"), T("N", "int32"), T("N, V", "fp32")
U, ALOG, BPROJ, DVEC = T("B, C, T"), T("C, S", "fp32"), T("B, 1, S, T"), T("C", "fp32")

CASES = {
    "matmul": ([X, T("32, 64")], {"transpose": "NT"}),
    "batched_matmul": ([Q, Q], {"transpose": "NT"}),
    "linear_bias_act": ([X, T("32, 64"), T("32")], {"transpose": "NT", "activation": "gelu"}),
    "grouped_gemm": ([FLAT, T("E, 32, 64"), T("E + 1", "int32")], {}),
    "grouped_gemm_weight_grad": ([FLAT, T("N, 32"), T("E + 1", "int32")], {}),
    "rmsnorm": ([X, VEC], {"eps": 1e-5}),
    "rmsnorm_backward": ([X, X, VEC, ROWS], {}),
    "fused_residual_rmsnorm": ([X, X, VEC], {}),
    "fused_residual_rmsnorm_backward": ([X, X, X, VEC, ROWS], {}),
    "layernorm": ([X, VEC, VEC], {}),
    "layernorm_backward": ([X, X, VEC, ROWS, ROWS], {}),
    "swiglu": ([X, X], {}),
    "swiglu_backward": ([X, X, X], {}),
    "geglu": ([X, X], {}),
    "geglu_backward": ([X, X, X], {}),
    "fused_split_swiglu": ([T("B, T, 128")], {}),
    "fused_split_swiglu_backward": ([X, T("B, T, 128")], {}),
    "fused_split_geglu": ([T("B, T, 2*F")], {}),
    "fused_split_geglu_backward": ([T("B, T, F"), T("B, T, 2*F")], {}),
    "silu": ([X], {}),
    "silu_backward": ([X, X], {}),
    "relu": ([X], {}),
    "relu_backward": ([X, X], {}),
    "relu2": ([X], {}),
    "relu2_backward": ([X, X], {}),
    "gelu": ([X], {"approximate": False}),
    "gelu_backward": ([X, X], {}),
    "softmax": ([X], {"dim": -1}),
    "causal_mask": ([T("B, 8, T, T")], {"offset": 0, "window_size": 4}),
    "dropout": ([X], {"p": 0.1, "seed": 3}),
    "softmax_backward": ([X, X], {}),
    "flash_attention": ([Q, KV, KV], {"window_size": 128}),
    "flash_attention_backward": ([Q, Q, KV, KV, Q, T("B, 8, T", "fp32")], {}),
    "rope": ([Q, KV, T("T, 8, 2", "fp32")], {}),
    "rope_backward": ([Q, KV, T("T, 8, 2", "fp32")], {}),
    "qk_norm": ([Q, KV, HV, HV], {}),
    "qk_norm_backward": ([Q, KV, Q, KV, HV, HV, T("B, 8, T", "fp32"), T("B, 2, T", "fp32")], {}),
    "fused_qk_norm_rope": ([Q, KV, HV, HV, T("T, 8, 2", "fp32")], {}),
    "fused_qk_norm_rope_backward": ([Q, KV, Q, KV, HV, HV, T("B, 8, T", "fp32"), T("B, 2, T", "fp32"),
                                     T("T, 8, 2", "fp32")], {}),
    "split": ([T("B, T, 96")], {"sizes": [64, 32]}),
    "concat": ([T("B, T, 64"), T("B, T, 32")], {"dim": -1}),
    "view": ([X], {"shape": ["B*T", -1]}),
    "transpose": ([T("B, T, 8, 16")], {"dim0": 1, "dim1": 2}),
    "permute": ([T("B, T, 8, 16")], {"dims": [0, 2, 1, 3]}),
    "contiguous": ([X], {}),
    "add": ([X, VEC], {}),
    "mul_backward": ([X, X, VEC], {}),
    "mul": ([T("B, 1, 64"), T("T, 64")], {}),
    "bias_add": ([X, VEC], {}),
    "scale": ([X], {"factor": 0.5}),
    "clip_norm": ([X], {"max_norm": 1.0}),
    "add_scalar": ([X], {"value": 1e-6}),
    "sub": ([T("B, T, 64"), T("B, T, 1")], {}),
    "div": ([T("B, 1, 64"), T("T, 64")], {}),
    "exp": ([X], {}),
    "tanh": ([X], {}),
    "sigmoid": ([X], {}),
    "rsqrt": ([X], {}),
    "log": ([X], {}),
    "add3": ([X, X, X], {}),
    "reduce_sum": ([X], {"dims": [0, 1]}),
    "reduce_mean": ([X], {"dims": [-1], "keepdim": True}),
    "reduce_max": ([X], {"dim": -1}),
    "embedding": ([T("B, T", "int32"), T("V, 64")], {}),
    "moe_router": ([FLAT, T("E, 64")], {"top_k": 2}),
    "moe_router_backward": ([T("N, 2"), FLAT, T("E, 64"), T("N, 2", "int32")], {}),
    "moe_compute_offsets": ([T("N, 2", "int32")], {"num_experts": 8}),
    "moe_permute": ([FLAT, T("N, 2", "int32"), T("E + 1", "int32")], {}),
    "moe_unpermute": ([T("2*N, 64"), T("N, 2"), T("2*N", "int32")], {}),
    "moe_unpermute_backward": ([FLAT, T("2*N, 64"), T("N, 2"), T("2*N", "int32")], {}),
    "mamba_conv1d": ([U, T("C, 1, 4")], {}),
    "mamba_conv1d_backward": ([U, U, T("C, 1, 4")], {}),
    "mamba_selective_scan": ([U, U, ALOG, BPROJ, BPROJ, DVEC, DVEC], {}),
    "mamba_selective_scan_backward": ([U, U, U, ALOG, BPROJ, BPROJ, DVEC, DVEC, U], {}),
    "zeros": ([], {"shape": ["B", "T", 64]}),
    "ones": ([], {"shape": [64], "dtype": "fp32"}),
    "fill": ([], {"shape": ["B", 4], "value": 0.5}),
    "copy": ([X], {}),
    "cast": ([X], {"dtype": "fp32"}),
    "dequantize": ([T("N, 64", "fp8_e4m3"), T("N", "fp32")], {"dtype": "fp32"}),
    "all_reduce": ([X], {"group": "dp", "size": 2}),
    "all_gather": ([T("B, T, 32")], {"group": "tp", "size": 2, "dim": -1}),
    "reduce_scatter": ([X], {"group": "tp", "size": 2, "dim": -1}),
    "cross_entropy": ([LOGITS, IDS], {}),
    "cross_entropy_backward": ([T("", "fp32"), LOGITS, IDS, T("N", "fp32")], {}),
    "fused_lm_head_loss": ([FLAT, T("V, 64"), IDS], {"reduction": "none"}),
    "fused_lm_head_loss_backward": ([T("", "fp32"), FLAT, T("V, 64"), IDS, T("N", "fp32")], {}),
    "fused_lm_head_loss_grad": ([T("N", "fp32"), FLAT, T("V, 64"), IDS], {"reduction": "none"}),
}


def test_every_primitive_has_a_case():
    assert set(CASES) | {"embedding_backward", "reduce_max_backward", "add_backward"} == set(primitives())


def build_and_verify(name, operand_types, params):
    sig = lookup_primitive(name)
    results = infer_result_types(name, operand_types, params)
    func = FuncOp("f", operand_types, results)
    attrs = {k: sig.param(k).to_attribute(v) for k, v in params.items() if sig.param(k) is not None}
    op = sig.op.make(sig.group_operands(list(func.body.block.args)), sig.group_results(results), attrs)
    func.body.block.add_ops([op, ReturnOp(*op.results)])
    model = ModelOp("m")
    model.body.block.add_op(func)
    return results, verify_module(ModuleOp([model]))


@pytest.mark.parametrize("name", sorted(CASES))
def test_inferred_result_types_verify(name):
    operand_types, params = CASES[name]
    results, diagnostics = build_and_verify(name, operand_types, params)
    assert diagnostics == [], [d.message for d in diagnostics]
    assert results


@pytest.mark.parametrize(
    "name, operands, params, expected",
    [
        ("matmul", [X, T("32, 64")], {"transpose": "NT"}, [T("B, T, 32")]),
        ("matmul", [T("K, M"), T("K, N")], {"transpose": "TN"}, [T("M, N")]),
        ("view", [X], {"shape": ["B*T", -1]}, [T("B*T, 64")]),
        ("split", [T("B, T, 2*F")], {"sizes": ["F", "F"]}, [T("B, T, F"), T("B, T, F")]),
        ("concat", [T("B, T, F"), T("B, T, F")], {}, [T("B, T, 2*F")]),
        ("fused_split_swiglu", [T("B, T, 2*F")], {}, [T("B, T, F")]),
        ("fused_split_geglu_backward", [T("B, T, F"), T("B, T, 2*F")], {}, [T("B, T, 2*F")]),
        ("transpose", [T("B, T, H, D")], {"dim0": 1, "dim1": 2}, [T("B, H, T, D")]),
        ("rmsnorm", [X, VEC], {}, [X, ROWS]),
        ("flash_attention", [Q, KV, KV], {}, [Q, T("B, 8, T", "fp32")]),
        ("embedding", [T("B, T", "int32"), T("V, d")], {}, [T("B, T, d")]),
        ("add", [X, VEC], {}, [X]),
        ("reduce_mean", [X], {"dims": [-1], "keepdim": True}, [T("B, T, 1")]),
        ("moe_permute", [FLAT, T("N, 2", "int32"), T("E + 1", "int32")], {}, [T("2*N, 64"), T("2*N", "int32")]),
        ("moe_compute_offsets", [T("N, 2", "int32")], {"num_experts": 8}, [T("9", "int32")]),
        ("cross_entropy", [LOGITS, IDS], {}, [T("", "fp32"), T("N", "fp32")]),
        ("dequantize", [T("L, O, I", "fp8_e4m3"), T("L, O", "fp32")], {}, [T("L, O, I")]),
        ("dequantize", [T("O, I", "fp8_e5m2"), T("O", "fp32")], {"dtype": "fp32"}, [T("O, I", "fp32")]),
    ],
)
def test_inferred_shapes(name, operands, params, expected):
    assert infer_result_types(name, operands, params) == expected


@pytest.mark.parametrize(
    "name, operands, params, message",
    [
        ("view", [X], {}, "view needs its target shape"),
        ("view", [X], {"shape": [-1, -1]}, "at most one dimension"),
        ("zeros", [], {}, "a constant needs its shape"),
        ("split", [X], {}, "split needs its sizes"),
        ("cast", [X], {}, "cast needs the target dtype"),
        ("reduce_max_backward", [ROWS, T("B, T", "int32")], {"dim": -1}, "needs the shape of x"),
        ("add_backward", [X], {}, "needs the shapes of a and b"),
        ("matmul", [X], {}, "missing operand"),
        ("no_such", [X], {}, "no shape rule"),
        ("transpose", [T("*, 64")], {"dim0": 0, "dim1": 1}, "leading '*'"),
    ],
)
def test_inference_errors(name, operands, params, message):
    with pytest.raises(InferenceError, match=message):
        infer_result_types(name, operands, params)


def test_view_infers_the_missing_dimension_symbolically():
    (result,) = infer_result_types("view", [T("B, T, 8, 16")], {"shape": ["B", "T", -1]})
    assert result.shape[2] == Expr.const(128)
