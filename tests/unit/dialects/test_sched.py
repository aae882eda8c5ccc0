"""The mdsl.sched dialect: the buffer type, Python builders, verifiers."""

import re

import pytest
from xdsl.dialects.builtin import IntegerAttr, ModuleOp, StringAttr, UnitAttr
from xdsl.parser import Parser
from xdsl.utils.exceptions import ParseError, VerifyException

from modeldsl.dialects.sched import (
    ARENAS,
    AttentionBackwardOp,
    AttentionOp,
    BufferOp,
    BufferType,
    CollectiveOp,
    CopyOp,
    GemmOp,
    LaunchOp,
    LayerLoopOp,
    LayerViewOp,
    MemsetOp,
    ProgramOp,
    RecomputeSegmentOp,
    StreamOp,
    SyncOp,
)
from modeldsl.ir import make_context, print_ir, verify_module


def test_buffer_type_round_trips_and_knows_its_size():
    t = Parser(make_context(), "!mdsl.sched.buffer<[2, 16, 64], bf16>").parse_type()
    assert isinstance(t, BufferType)
    assert t.shape == (2, 16, 64) and t.numel == 2048 and t.nbytes == 4096
    assert str(t) == "!mdsl.sched.buffer<[2, 16, 64], bf16>"
    assert BufferType([3], "fp4_e2m1").nbytes == 2


def test_buffer_type_rejects_unknown_dtype():
    with pytest.raises(ParseError, match="unknown element type 'f32'"):
        Parser(make_context(), "!mdsl.sched.buffer<[2], f32>").parse_type()


def build_program() -> tuple[ModuleOp, ProgramOp]:
    """A small program built with the Python builders: buffers, an alias, a GEMM,
    a layer loop over a stacked weight, an in-place launch, streams and a sync."""
    x_t, w_t, y_t = BufferType([2, 8, 64], "bf16"), BufferType([32, 64], "bf16"), BufferType([2, 8, 32], "bf16")
    program = ProgramOp("step", {"params": 65536, "activations": 4096, "external": 2048})
    x = BufferOp("external", x_t, offset=0)
    w = BufferOp("params", w_t, offset=0)
    stacked = BufferOp("params", BufferType([4, 32, 64], "bf16"), offset=4096)
    y = BufferOp("activations", y_t, offset=0)
    y_flat = BufferOp("activations", BufferType([16, 32], "bf16"), offset=0, alias_of=y.result)
    transb = {"transb": IntegerAttr.from_bool(True)}
    gemm = GemmOp(x.result, w.result, y.result, attributes=dict(transb))
    loop = LayerLoopOp(0, 4)
    view = LayerViewOp(stacked.result, loop.index)
    loop.body.block.add_ops([view, GemmOp(x.result, view.result, y.result, attributes=dict(transb))])
    launch = LaunchOp("silu_fwd", [y.result], [y.result], {"inplace": UnitAttr()})
    copy = CopyOp.create(operands=[y_flat.result, y.result])
    program.body.block.add_ops(
        [StreamOp("compute"), StreamOp("comm", -1), x, w, stacked, y, y_flat, gemm, loop, launch, copy,
         SyncOp("compute", "comm")]
    )
    return ModuleOp([program]), program


def test_builders_make_verifying_ir_that_round_trips():
    module, program = build_program()
    assert verify_module(module) == []
    assert program.arenas == {"params": 65536, "activations": 4096, "workspace": 0, "grads": 0, "optimizer": 0,
                              "external": 2048}
    text = print_ir(module)
    assert re.search(r"mdsl.sched.layer_loop %\d+ = 0 to 4 {", text)
    assert "alias_of %" in text
    assert print_ir(Parser(make_context(), text).parse_module()) == text


def test_arena_names():
    assert ARENAS == ("params", "activations", "workspace", "grads", "optimizer", "external")


def test_gemm_checks_shapes_per_transpose():
    module, program = build_program()
    gemm = next(op for op in program.body.walk() if isinstance(op, GemmOp))
    gemm.attributes["transb"] = IntegerAttr.from_bool(False)
    (diag,) = [d for d in verify_module(module) if d.op_name == "mdsl.sched.gemm"]
    assert "inner dimensions differ" in diag.message


def test_launch_rejects_in_place_without_flag():
    module, program = build_program()
    launch = next(op for op in program.body.walk() if isinstance(op, LaunchOp))
    del launch.attributes["inplace"]
    (diag,) = verify_module(module)
    assert "mark the launch 'inplace'" in diag.message


def test_program_checks_arena_bounds():
    module, program = build_program()
    program.arena_sizes = program.arena_sizes.from_list(program.arena_sizes.elt_type, [1024, 4096, 0, 0, 0, 2048])
    messages = [d.message for d in verify_module(module)]
    assert any("overflows arena params (1024 bytes)" in m for m in messages)


def test_launch_kernel_name_must_not_be_empty():
    module, program = build_program()
    launch = next(op for op in program.body.walk() if isinstance(op, LaunchOp))
    launch.kernel = StringAttr("")
    assert any("kernel name" in d.message for d in verify_module(module))


class Placer:
    """Places buffers one after another in their arenas, as a test stand-in for the planner."""

    def __init__(self, program: ProgramOp):
        self.program = program
        self.ends: dict[str, int] = {}

    def __call__(self, arena: str, shape: list[int], dtype: str = "bf16") -> BufferOp:
        t = BufferType(shape, dtype)
        op = BufferOp(arena, t, offset=self.ends.get(arena, 0))
        self.ends[arena] = self.ends.get(arena, 0) + t.nbytes
        self.program.body.block.add_op(op)
        return op


def build_work_program() -> tuple[ModuleOp, dict[str, object]]:
    """Every work op made by its Python builder from plain Python values."""
    program = ProgramOp("train", {a: 1 << 20 for a in ARENAS})
    program.body.block.add_ops([StreamOp("compute"), StreamOp("comm", priority=-1)])
    place = Placer(program)
    q, k, v = (place("activations", s).result for s in ([1, 4, 8, 16], [1, 2, 8, 16], [1, 2, 8, 16]))
    o, d_o, lse = place("activations", [1, 4, 8, 16]).result, place("grads", [1, 4, 8, 16]).result, place(
        "activations", [1, 4, 8], "fp32"
    ).result
    dq, dk, dv = (place("grads", s).result for s in ([1, 4, 8, 16], [1, 2, 8, 16], [1, 2, 8, 16]))
    x, w, b = place("activations", [8, 64]).result, place("params", [32, 64]).result, place("params", [32]).result
    y, pre, g = (place("activations", [8, 32]).result, place("activations", [8, 32]).result,
                 place("grads", [32, 64]).result)
    loop = LayerLoopOp(0, 2, reverse=True)
    segment = RecomputeSegmentOp("mlp", layer=loop.index)
    segment.body.block.add_op(
        GemmOp(x, w, y, b, aux=pre, transb=True, epilogue="gelu_aux_bias", stream="compute")
    )
    loop.body.block.add_op(segment)
    ops = {
        "attention": AttentionOp(q, k, v, o, lse, window=4, scale=0.25),
        "attention_backward": AttentionBackwardOp(q, k, v, o, d_o, lse, dq, dk, dv, causal=False),
        "launch": LaunchOp("silu_fwd", [y], [y], grid=[4], block=[128], inplace=True, stream="compute"),
        "memset": MemsetOp(g, 1.0),
        "copy": CopyOp(y, pre, nbytes=256),
        "loop": loop,
        "all_reduce": CollectiveOp("all_reduce", g, g, "dp", op="sum", stream="comm"),
        "send": CollectiveOp("send", x, x, "pp", peer=1),
        "broadcast": CollectiveOp("broadcast", w, w, "dp", root=0),
        "sync": SyncOp("compute", "comm"),
    }
    program.body.block.add_ops(ops.values())
    return ModuleOp([program]), ops


def test_work_op_builders_verify_and_round_trip():
    module, _ = build_work_program()
    assert verify_module(module) == []
    text = print_ir(module)
    for expected in (
        "{window = 4 : i64, scale = 2.500000e-01 : f64}",
        "{causal = false}",
        "{grid = array<i64: 4>, block = array<i64: 128>, inplace, stream = @compute}",
        "{value = 1.000000e+00 : f64}",
        "{bytes = 256 : i64}",
        'epilogue = "gelu_aux_bias", stream = @compute}',
        'collective "all_reduce" %',
        'group "dp" {op = "sum", stream = @comm}',
        "{peer = 1 : i64}",
        "{root = 0 : i64}",
    ):
        assert expected in text, expected
    assert re.search(r'layer_loop (%\d+) = 0 to 2 reverse {\n *mdsl.sched.recompute_segment "mlp" layer\(\1\) {', text)
    assert print_ir(Parser(make_context(), text).parse_module()) == text
    assert print_ir(Parser(make_context(), print_ir(module, generic=True)).parse_module()) == text


@pytest.mark.parametrize(
    ("name", "change", "message"),
    [
        ("attention", lambda op: op.attributes.update(layout=StringAttr("tbhd")), "layout must be one of"),
        ("attention", lambda op: op.attributes.update(window=IntegerAttr(-1, 64)), "window must be >= 0"),
        ("attention_backward", lambda op: op.operands.__setitem__(8, op.operands[6]), "d_v must have the shape"),
        ("copy", lambda op: op.attributes.update(bytes=IntegerAttr(1 << 20, 64)), "copy of 1048576 bytes"),
        ("all_reduce", lambda op: op.attributes.pop("op"), "all_reduce needs a reduction 'op'"),
        ("send", lambda op: op.attributes.pop("peer"), "send needs a 'peer' rank"),
        ("broadcast", lambda op: op.attributes.update(root=IntegerAttr(-2, 64)), "root rank must be non-negative"),
        ("memset", lambda op: op.attributes.update(stream=StringAttr("comm")), "stream must be a symbol reference"),
        ("launch", lambda op: op.attributes.update(
            block=op.attributes["grid"].from_list(op.attributes["grid"].elt_type, [1, 1, 1, 1])),
         "block must have 1 to 3 positive dimensions"),
    ],
)
def test_verifiers_raise(name, change, message):
    _, ops = build_work_program()
    op = ops[name]
    op.verify()
    change(op)
    with pytest.raises(VerifyException, match=re.escape(message)):
        op.verify()


def test_gemm_epilogue_operands_are_checked():
    module, _ = build_work_program()
    gemm = next(op for op in module.walk() if isinstance(op, GemmOp))
    gemm.attributes["epilogue"] = StringAttr("gelu_bias")
    with pytest.raises(VerifyException, match="epilogue 'gelu_bias' takes no aux operand"):
        gemm.verify()
    gemm.attributes["epilogue"] = StringAttr("dgelu_bgrad")
    gemm.verify()
    gemm.attributes["epilogue"] = StringAttr("bgrada")
    with pytest.raises(VerifyException, match="takes no aux operand"):
        gemm.verify()


def test_layer_view_result_must_drop_the_leading_dim():
    module, _ = build_program()
    view = next(op for op in module.walk() if isinstance(op, LayerViewOp))
    assert view.result.type == BufferType([32, 64], "bf16")
    wrong = LayerViewOp.create(operands=view.operands, result_types=[BufferType([4, 32], "bf16")])
    view.parent_block().insert_op_after(wrong, view)
    with pytest.raises(VerifyException, match=re.escape("a layer view of [4, 32, 64] bf16 is [32, 64] bf16")):
        wrong.verify()


def test_empty_program_round_trips():
    module = ModuleOp([ProgramOp("empty")])
    text = print_ir(module)
    reparsed = Parser(make_context(), text).parse_module()
    assert verify_module(reparsed) == [] and print_ir(reparsed) == text
