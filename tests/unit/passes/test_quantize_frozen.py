"""``mdsl-quantize-frozen`` on the std models: what it stores, where it widens, what the programs made of it do.

(What it rewrites and leaves alone in the IR, pattern by pattern: tests/filecheck/passes/quantize-frozen.module.)
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hf_checkpoints import cached_checkpoint

import modeldsl
from modeldsl.dialects.graph import CallOp, FuncOp
from modeldsl.dialects.sched import BufferOp, LaunchOp
from modeldsl.ir import make_context, parse_module
from modeldsl.kernels.reference import quantize
from modeldsl.passes.autodiff import AutodiffError, gradient_function
from modeldsl.passes.quantize_frozen import QuantizeFrozenPass, quantize_frozen, storable_weights
from modeldsl.resolve.imports import STD_ROOT
from modeldsl.runtime.profiles import compile_profile
from modeldsl.runtime.train import compile_training_step

LLAMA = STD_ROOT / "models" / "llama.module"
LINEAR = ["blocks.attention.qkv_weight", "blocks.attention.out_weight", "blocks.mlp.up_weight",
          "blocks.mlp.down_weight", "lm_head"]


def adapted(lora=4, **config):
    return modeldsl.load(LLAMA, hf=cached_checkpoint("llama", **config), lora=lora).model.clone()


def test_it_stores_every_frozen_linear_weight_once():
    model = adapted(dict(r=4, target_modules="all-linear"))
    assert storable_weights(model) == LINEAR
    assert quantize_frozen(model, "fp8_e4m3") == LINEAR
    model.verify()
    assert quantize_frozen(model, "fp8_e4m3") == []  # a second run finds nothing more
    params = {p.sym_name.data: p for p in model.params()}
    assert {n for n, p in params.items() if p.quantized is not None} == {*LINEAR, *(f"{n}.scale" for n in LINEAR)}
    assert all(params[f"{n}.scale"].quantized == {"role": "scale", "data": n, "dtype": "fp8_e4m3",
                                                  "granularity": "per_channel"} for n in LINEAR)


def test_a_tied_head_is_the_embedding_and_stays():
    """With tied embeddings the head is the embedding, which ``embedding`` reads: nothing stores it."""
    model = adapted(tie_word_embeddings=True)
    assert storable_weights(model) == LINEAR[:-1]


def test_without_frozen_weights_nothing_is_stored():
    model = modeldsl.load(LLAMA, hf=cached_checkpoint("llama")).model.clone()
    assert storable_weights(model) == [] and quantize_frozen(model, "bf16") == []


def test_a_helper_with_a_written_backward_gets_the_widened_weights():
    """With adapters on q and v alone the MLP keeps its written backward, which reads the MLP's weights:
    they are widened before the call (the backward gets them too, replayed: @memory(recompute)); with
    adapters on every linear module the helper lost its written backward and the weights go into it."""
    for lora, inside in ((4, False), (dict(r=4, target_modules="all-linear"), True)):
        model = adapted(lora)
        quantize_frozen(model, "fp8_e4m3")
        helper = next(f for f in model.funcs() if f.sym_name.data == "blocks_mlp_forward")
        names = [op.name for op in helper.walk()]
        assert ("mdsl.graph.dequantize" in names) == inside
        (call,) = [op for op in model.walk() if isinstance(op, CallOp) and op.callee.root_reference.data ==
                   "blocks_mlp_forward"]
        assert [str(v.type.dtype.value) for v in call.arguments[1:3]] == (["fp8_e4m3"] * 2 if inside else ["bf16"] * 2)
        step = compile_training_step(model, 2, 8)
        saved = {op.result.name_hint for op in step.walk() if isinstance(op, BufferOp) and "saved" in op.attributes}
        assert not any(n and n.endswith("weight") for n in saved), saved


def test_the_training_step_has_the_gradients_of_the_adapters_alone():
    model, plain = adapted(), adapted()
    quantize_frozen(model, "fp8_e4m3")
    step, reference = compile_training_step(model, 2, 8), compile_training_step(plain, 2, 8)
    grads = {op.attributes["grad"].data for op in step.walk() if isinstance(op, BufferOp) and "grad" in op.attributes}
    assert grads == {op.attributes["grad"].data for op in reference.walk()
                     if isinstance(op, BufferOp) and "grad" in op.attributes}
    assert step.arenas["grads"] == reference.arenas["grads"]


@pytest.mark.parametrize("storage, casts", [("", 0), ("fp32", 5)])
def test_a_bf16_base_read_in_bf16_is_its_own_buffer(storage, casts):
    """In a bf16 program the cast of a weight stored in bf16 is the weight's buffer (no copy, no
    launch); in an fp32 one each widens a bf16 weight into an fp32 transient."""
    model = adapted(dict(r=4, target_modules="all-linear"))
    quantize_frozen(model, "bf16")
    program = compile_profile(model, 1, 16, storage or None)
    launches = [op for op in program.walk() if isinstance(op, LaunchOp) and op.kernel.data == "cast"]
    assert len(launches) == casts
    params = {op.attributes["param"].data: op for op in program.walk() if isinstance(op, BufferOp)
              and "param" in op.attributes}
    assert {params[n].result.type.dtype.value for n in LINEAR} == {"bf16"}
    assert all(launch.inputs[0].type.dtype.value == "bf16" and launch.outputs[0].type.dtype.value == "fp32"
               for launch in launches)


def test_a_gradient_reaching_a_dequantize_of_a_trainable_weight_is_still_refused():
    """``mdsl-autodiff`` skips an op without a VJP rule only where all it reads is frozen."""
    text = """
!q = !mdsl.graph.tensor<[4, 3], fp8_e4m3>
!s = !mdsl.graph.tensor<[4], fp32>
!w = !mdsl.graph.tensor<[4, 3], fp32>
!x = !mdsl.graph.tensor<[2, 3], fp32>
!y = !mdsl.graph.tensor<[2, 4], fp32>
mdsl.graph.model @m config {} {
  mdsl.graph.param @q : !q QUANTIZED
  mdsl.graph.param @s : !s {annotations = [#mdsl.graph.frozen]}
  mdsl.graph.func @forward(%x: !x) -> !y attributes {kind = "forward"} {
    %q = mdsl.graph.param_ref @q : !q
    %s = mdsl.graph.param_ref @s : !s
    %w = mdsl.graph.dequantize %q, %s : (!q, !s) -> !w
    %y = mdsl.graph.matmul %x, %w {transpose = "NT"} : (!x, !w) -> !y
    mdsl.graph.return %y : !y
  }
}
"""
    module, _ = parse_module(make_context(), text.replace("QUANTIZED", ""))
    model = next(op for op in module.walk() if op.name == "mdsl.graph.model")
    with pytest.raises(AutodiffError, match="no VJP rule for dequantize"):
        gradient_function(model.clone())
    frozen, _ = parse_module(make_context(), text.replace("QUANTIZED", "{annotations = [#mdsl.graph.frozen]}"))
    grad = gradient_function(next(op for op in frozen.walk() if op.name == "mdsl.graph.model"))
    assert isinstance(grad, FuncOp) and [a.data for a in grad.attributes["input_grads"].data] == ["x"]


def test_the_pass_refuses_a_dtype_it_does_not_store():
    from modeldsl.diagnostics import PassOptionError

    with pytest.raises(PassOptionError, match="dtype=int8 is not one of fp8_e4m3, fp8_e5m2, bf16"):
        QuantizeFrozenPass(dtype="int8")
    assert QuantizeFrozenPass().dtype == "fp8_e4m3"


def test_e5m2_stores_with_its_own_range():
    """fp8_e5m2 (2 mantissa bits, a wider range) scales each output channel into +-57344."""
    model = adapted()
    quantize_frozen(model, "fp8_e5m2")
    assert model.lookup("lm_head").param_type.dtype.value == "fp8_e5m2"
    q, scale = quantize(np.array([[1.0, -0.5, 0.0], [0.0, 0.0, 0.0]], np.float32), dtype=ml_dtypes.float8_e5m2)
    np.testing.assert_array_equal(scale, [np.float32(1) / np.float32(57344), 1.0])
    np.testing.assert_array_equal(q.astype(np.float32), [[57344.0, -28672.0, 0.0], [0.0, 0.0, 0.0]])
