"""The mdsl.sched dialect: the buffer type, Python builders, verifiers."""

import re

import pytest
from xdsl.dialects.builtin import IntegerAttr, ModuleOp, StringAttr, UnitAttr
from xdsl.parser import Parser
from xdsl.utils.exceptions import ParseError

from modeldsl.dialects.sched import (
    ARENAS,
    BufferOp,
    BufferType,
    CopyOp,
    GemmOp,
    LaunchOp,
    LayerLoopOp,
    LayerViewOp,
    ProgramOp,
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
    assert program.arenas == {"params": 65536, "activations": 4096, "workspace": 0, "grads": 0, "external": 2048}
    text = print_ir(module)
    assert re.search(r"mdsl.sched.layer_loop %\d+ = 0 to 4 {", text)
    assert "alias_of %" in text
    assert print_ir(Parser(make_context(), text).parse_module()) == text


def test_arena_names():
    assert ARENAS == ("params", "activations", "workspace", "grads", "external")


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
    program.arena_sizes = program.arena_sizes.from_list(program.arena_sizes.elt_type, [1024, 4096, 0, 0, 2048])
    messages = [d.message for d in verify_module(module)]
    assert any("overflows arena params (1024 bytes)" in m for m in messages)


def test_launch_kernel_name_must_not_be_empty():
    module, program = build_program()
    launch = next(op for op in program.body.walk() if isinstance(op, LaunchOp))
    launch.kernel = StringAttr("")
    assert any("kernel name" in d.message for d in verify_module(module))
