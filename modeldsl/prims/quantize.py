"""Quantization (precision recipes): ``dequantize``, the widening of values stored in fp8 with a
scale per row.

``dequantize(q, scale, dtype=bf16)`` is ``q * scale[..., None]`` in ``dtype`` (its result type,
a parameter of shape inference as ``cast``'s). It reads the frozen weights that
``mdsl-quantize-frozen`` stores in fp8 (:mod:`modeldsl.passes.quantize_frozen`); their values are
made once, when a checkpoint is loaded (:func:`modeldsl.kernels.reference.quantize`), so no
``quantize`` op runs in a program yet. The base of a LoRA model is frozen: no gradient flows into
a stored weight or its scale, so ``dequantize`` has no VJP rule (``mdsl-autodiff`` gives a value
computed from frozen parameters alone no gradient).
"""

from __future__ import annotations

from modeldsl.dialects.graph_primitives import DequantizeOp
from modeldsl.prims.base import InferenceError, Primitive
from modeldsl.prims.counts import per_output_element


def infer_dequantize(ts, p):
    q = ts[0]
    if len(ts) != 2:
        raise InferenceError("dequantize takes the quantized values and their scales: dequantize(q, scale)")
    return [q.with_dtype(p.get("dtype", "bf16"))]


ENTRIES = (
    # one multiply per element (the fp8 -> fp32 conversion is a table lookup)
    Primitive(DequantizeOp, infer_dequantize, per_output_element(1),
              no_vjp="it reads a frozen (quantized) weight and its scales: no gradient flows into them",
              inference_params=("dtype",), cpu=True),
)
