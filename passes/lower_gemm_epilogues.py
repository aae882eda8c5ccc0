"""GEMM epilogues in ``mdsl-lower-to-sched``: what ``mdsl.sched.gemm``'s ``epilogue`` runs.

* ``linear_bias_act`` (``mdsl-fuse``'s pattern of the name) is one GEMM with the ``bias``,
  ``relu_bias`` or ``gelu_bias`` epilogue; GELU's pre-activation, where the backward reads it,
  is the GEMM's ``aux`` output (``gelu_aux_bias``). cuBLASLt saves no ReLU input, so a ReLU whose
  ``pre`` has readers runs as the bias epilogue into ``pre`` and a relu launch.
* In a backward, ``gelu_backward`` (tanh) of a GEMM's result that nothing else reads is that
  GEMM's ``dgelu`` epilogue through the saved pre-activation, and a ``reduce_sum`` of it over the
  leading dims (bias_add's backward: the bias gradient) makes it ``dgelu_bgrad``.
* Otherwise a bias gradient summed from the operand a weight-gradient GEMM contracts over its
  rows (``dW = G^T X``: A transposed, or ``X^T G``: B as it is) is that GEMM's ``bgrada`` or
  ``bgradb`` epilogue instead of a reduce_sum launch, when nothing reads the sum in between.

The functions take the :class:`~modeldsl.passes.lower_to_sched.ScheduleBuilder` that lowers the op.
"""

from __future__ import annotations

from xdsl.ir import Operation, SSAValue

from modeldsl.dialects.sched import BufferOp, GemmOp, LaunchOp
from modeldsl.graph_builder import op_attr


def lower_linear_bias_act(builder, op: Operation) -> bool:
    """One GEMM with the bias (+ activation) epilogue; False where the operands do not fit one."""
    x, weight, bias = op.operands
    out, pre = op.results
    a, transa = builder.gemm_operand(x, False)
    b, transb = builder.gemm_operand(weight, op_attr(op, "transpose", "NT") == "NT")
    if transa or len(builder.shape(b)) != 2:
        return False
    activation = op_attr(op, "activation", "none")
    params = {"transb": transb, "alpha": op_attr(op, "alpha", 1.0)}
    bias_buffer = builder.buffer(bias)
    needs_pre = activation != "none" and bool(list(pre.uses))
    if activation == "relu" and needs_pre:
        pre_buffer = builder.result_buffer(pre)
        builder.block.add_op(GemmOp(a, b, pre_buffer, bias_buffer, epilogue="bias", **params))
        builder.block.add_op(LaunchOp("relu", [pre_buffer], [builder.result_buffer(out)]))
        return True
    c = builder.result_buffer(out)
    aux = builder.result_buffer(pre) if needs_pre else None
    if activation == "none":
        builder.values[pre] = c
    epilogue = "bias" if activation == "none" else f"{activation}{'_aux' if aux is not None else ''}_bias"
    builder.block.add_op(GemmOp(a, b, c, bias_buffer, aux=aux, epilogue=epilogue, **params))
    return True


def lower_gelu_backward(builder, op: Operation) -> bool:
    """``gelu_backward(G, pre)`` (tanh) of a GEMM's plain result G nothing else reads: ``dgelu``."""
    d_out, pre = op.operands
    if not op_attr(op, "approximate", True) or len(list(d_out.uses)) != 1 or d_out in builder.deferred:
        return False
    source = builder.values.get(d_out)
    gemm = builder.writer(source, GemmOp) if source is not None else None
    if gemm is None or gemm.epilogue.data != "none" or gemm.beta.value.data != 0.0:
        return False
    aux = builder.buffer(pre)
    if aux.type.shape != source.type.shape:
        return False
    c = builder.result_buffer(op.results[0])
    replace_gemm(gemm, c=c, aux=aux, epilogue="dgelu")
    builder.discard(source.owner)
    return True


def lower_reduce_sum(builder, op: Operation) -> bool:
    """The bias gradient of a ``dgelu`` GEMM's result: the GEMM's ``dgelu_bgrad`` epilogue."""
    x = op.operands[0]
    source = builder.values.get(x) if x not in builder.deferred else None
    gemm = gemm_writing(builder, source) if source is not None else None
    if gemm is None or gemm.epilogue.data != "dgelu" or not sums_leading_dims(x.type.rank, op_attr(op, "dims"),
                                                                              op_attr(op, "keepdim", False)):
        return False
    replace_gemm(gemm, bias=builder.result_buffer(op.results[0]), epilogue="dgelu_bgrad")
    return True


def bias_gradient_epilogue(builder, op: Operation, transa: bool, transb: bool) -> tuple[SSAValue | None, str]:
    """(bias buffer, ``bgrada``/``bgradb``) where a matmul's operand that it contracts over its rows
    has a bias-gradient reduce_sum launch to absorb (the launch is dropped), else (None, ``none``)."""
    for index, epilogue, fits in ((0, "bgrada", transa), (1, "bgradb", not transb)):
        launch = bias_sum_launch(builder, op.operands[index]) if fits else None
        if launch is not None:
            bias = launch.outputs[0]
            launch.detach()
            launch.erase()
            return bias, epilogue
    return None, "none"


def bias_sum_launch(builder, value: SSAValue) -> LaunchOp | None:
    """The reduce_sum launch of the block being built that sums ``value`` over its leading dims
    into a buffer nothing else has touched."""
    source = builder.values.get(value) if value not in builder.deferred else None
    if source is None or value.type.rank < 2:
        return None
    for use in source.uses:
        launch = use.operation
        if not isinstance(launch, LaunchOp) or launch.kernel.data != "reduce_sum" or launch.accumulate is not None \
                or launch.parent_block() is not builder.block or list(launch.inputs) != [source]:
            continue
        dims = launch.attributes.get("dims")
        keepdim = launch.attributes.get("keepdim")
        if dims is None or not sums_leading_dims(value.type.rank, dims.get_values(),
                                                 bool(keepdim.value.data) if keepdim is not None else False):
            continue
        (out,) = launch.outputs
        if all(u.operation is launch or isinstance(u.operation, BufferOp) for u in out.uses):
            return launch
    return None


def sums_leading_dims(rank: int, dims, keepdim: bool) -> bool:
    """Whether a reduction over ``dims`` of a rank-``rank`` tensor leaves its last dim alone."""
    return not keepdim and rank >= 2 and sorted(d % rank for d in dims) == list(range(rank - 1))


def gemm_writing(builder, buffer: SSAValue) -> GemmOp | None:
    """The GEMM of the block being built whose C is ``buffer``."""
    for use in buffer.uses:
        gemm = use.operation
        if isinstance(gemm, GemmOp) and gemm.c == buffer and gemm.parent_block() is builder.block:
            return gemm
    return None


def replace_gemm(gemm: GemmOp, *, c: SSAValue | None = None, bias: SSAValue | None = None,
                 aux: SSAValue | None = None, epilogue: str) -> GemmOp:
    """``gemm`` again, in its place, with another C, bias, aux or epilogue (its other attributes kept)."""
    attributes = {k: v for k, v in gemm.attributes.items() if k != "epilogue"}
    new = GemmOp(gemm.a, gemm.b, c or gemm.c, bias or gemm.bias, attributes, aux=aux or gemm.aux, epilogue=epilogue)
    new.location = gemm.location
    gemm.parent_block().insert_op_after(new, gemm)
    gemm.detach()
    gemm.erase()
    return new
