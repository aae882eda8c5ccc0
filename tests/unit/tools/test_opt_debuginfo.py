"""``mdsl-opt --print-debuginfo`` on lowered Module DSL: model parameters and the arguments of every
function (the forward's inputs, a stack's block body, a called module's helpers, a written backward's
gradients, saved tensors and parameters) carry the DSL location they stand for, never ``loc(unknown)``;
passes and the JSON IR keep them. And ``--split-input-file`` is for IR only (E029 on other inputs)."""

from __future__ import annotations

import json
import re

import pytest
from xdsl.dialects.builtin import FileLineColLoc

from modeldsl.diagnostics import DiagnosticSink
from modeldsl.dialects.graph import FuncOp, ModelOp, ParamOp
from modeldsl.frontend.text.parser import parse_source
from modeldsl.ir import make_context, print_ir
from modeldsl.json_ir import read_json, to_json
from modeldsl.lower import lower_program
from modeldsl.passes.specialize import specialize_model
from modeldsl.tools.opt import main

SOURCE = '''\
block Layer(d: int):
  params:
    w: [d]
  forward:
    in: x: [B, d]
    out: [B, d]
    graph:
      (x, w) -> mul() -> out

module Scale(d: int = 4):
  params:
    s: [d]
  forward:
    in: [B, d]
    out: [B, d]
    graph:
      (in, s) -> mul() -> out
    save: [in]
  backward:
    d_out: [B, d]
    graph:
      (d_out, s) -> mul() -> d_in
      (d_out, saved.in) -> mul() -> g
      g -> reduce_sum(dims=[0]) -> d_s

model M(d: int = 4, n: int = 2):
  params:
    blocks: [n] x Layer(d)
    scale: Scale(d)
  forward:
    in: x: [B, d]
    out: [B, d]
    graph:
      x -> blocks -> h
      h -> scale -> out
'''


def lowered():
    return lower_program(parse_source(SOURCE, "m.module"), "M", None, DiagnosticSink())


def location(value) -> tuple[int, int]:
    loc = value.location
    assert isinstance(loc, FileLineColLoc) and loc.filename.data == "m.module", loc
    return loc.line.data, loc.column.data


def funcs(module) -> dict[str, FuncOp]:
    return {op.sym_name.data: op for op in module.walk() if isinstance(op, FuncOp)}


def arg_locations(module) -> dict[str, list[tuple[str, tuple[int, int]]]]:
    return {name: [(a.name_hint, location(a)) for a in f.body.block.args] for name, f in funcs(module).items()}


def test_parameters_are_located_at_their_names():
    params = {op.sym_name.data: op for op in lowered().walk() if isinstance(op, ParamOp)}
    assert location(params["blocks.w"]) == (3, 5) and location(params["scale.s"]) == (12, 5)


def test_every_function_argument_is_located_at_the_input_or_parameter_it_stands_for():
    assert arg_locations(lowered()) == {
        "forward": [("x", (31, 9))],  # in: x: [B, d]
        "blocks": [("x", (5, 9)), ("w", (3, 5))],  # the block body: its input, then its parameter
        "scale_forward": [("in", (14, 5)), ("s", (12, 5))],  # a module with a written backward
        "scale_backward": [("d_out", (15, 5)), ("saved_in", (14, 5)), ("s", (12, 5))],  # out:, save: [in], s
    }


def test_printed_debuginfo_has_no_unknown_location_but_returns():
    text = print_ir(lowered(), debuginfo=True)
    inner = text.split("\n", 1)[1].rsplit("\n", 3)[0]  # the builtin.module's own location is unknown
    unknown = [line for line in inner.splitlines() if "loc(unknown)" in line and "mdsl.graph.return" not in line]
    assert not unknown, unknown


def test_specialize_and_the_json_ir_keep_argument_locations():
    module = lowered()
    before = arg_locations(module)
    for model in [op for op in module.walk() if isinstance(op, ModelOp)]:
        specialize_model(model, {"B": 2})
    assert "[2, 4]" in print_ir(module) and arg_locations(module) == before
    again = read_json(make_context(), json.dumps(to_json(module)))
    assert arg_locations(again) == before
    assert print_ir(again, debuginfo=True) == print_ir(module, debuginfo=True)


@pytest.mark.parametrize("name, kind", [("m.module", "Module DSL text"), ("m.py", "a Python DSL file"),
                                        ("m.json", "JSON IR")])
def test_split_input_file_on_input_that_is_not_ir_is_e029(tmp_path, capsys, name, kind):
    path = tmp_path / name
    path.write_text(SOURCE if name.endswith(".module") else "{}")
    assert main([str(path), "--split-input-file"]) == 1
    err = capsys.readouterr().err
    assert re.search(rf"error\[E029\]: --split-input-file cuts IR text at '// -----'; '.*{name}' is {kind}", err)
    assert "hint: drop --split-input-file" in err and "Traceback" not in err
