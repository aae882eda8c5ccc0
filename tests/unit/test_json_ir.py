"""The JSON IR (modeldsl.json_ir): every std declaration's mdsl.graph and a planned mdsl.sched
program round-trip through it exactly, documents validate against docs/json-ir.schema.json, and
what is not JSON IR is a JsonIRError at its JSON path (E001 through mdsl-opt)."""

import json
from pathlib import Path

import jsonschema
import pytest
from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp

from modeldsl import registry
from modeldsl.diagnostics import DiagnosticSink
from modeldsl.frontend.read import read_model
from modeldsl.ir import make_context, print_ir, verify_module
from modeldsl.json_ir import JsonIRError, compile_model, dumps, read_json, to_json
from modeldsl.lower import lower_program
from modeldsl.passes.specialize import SpecializePass
from modeldsl.runtime.profiles import compile_profile
from modeldsl.tools.opt import main as opt_main

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((ROOT / "docs" / "json-ir.schema.json").read_text())
DECLARATIONS = [(e.path, e.name) for kind in ("model", "block", "module") for e in registry.entries(kind)
                if not e.abstract and e.frontend == "text"]


def lowered(path, name):
    return lower_program(read_model(path)[0], name, None, DiagnosticSink())


def round_trip(module):
    text = dumps(module)
    jsonschema.validate(json.loads(text), SCHEMA)
    back = read_json(make_context(), text)
    assert not verify_module(back)
    return back


@pytest.mark.parametrize("path, name", DECLARATIONS, ids=[n for _, n in DECLARATIONS])
def test_every_std_declaration_round_trips_with_its_locations(path, name):
    module = lowered(path, name)
    assert print_ir(round_trip(module), debuginfo=True) == print_ir(module, debuginfo=True)


def test_a_planned_schedule_round_trips():
    small = lower_program(read_model(registry.get_model("Llama").path)[0], "Llama",
                          dict(vocab_size=64, d_model=32, n_layers=2, num_heads=4, num_kv_heads=2, d_ff=48,
                               max_seq=64), DiagnosticSink())
    SpecializePass().apply(Context(), small)
    module = ModuleOp([compile_profile(next(iter(small.body.block.ops)), 1, 8, "fp32")])
    assert "mdsl.sched.gemm" in print_ir(module)
    assert print_ir(round_trip(module)) == print_ir(module)


def test_compile_model_takes_a_registry_name_or_a_file_and_config_values():
    llama = registry.get_model("Llama")
    assert compile_model("Llama") == to_json(lowered(llama.path, "Llama"))
    document = compile_model(str(llama.path), {"d_model": 64})
    jsonschema.validate(document, SCHEMA)
    assert "d_model = 64" in document["module"]["regions"][0][0]["ops"][0]["properties"]["config"]


def document(ops):
    return {"format": "modeldsl-ir", "version": 1,
            "module": {"op": "builtin.module", "operands": [], "results": [], "regions": [[
                {"arguments": [], "ops": ops}]]}}


CAST = "builtin.unrealized_conversion_cast"


@pytest.mark.parametrize("text, path", [
    ("{", "$"),
    ("[]", "$"),
    (json.dumps({"format": "other", "version": 1}), "$.format"),
    (json.dumps({"format": "modeldsl-ir", "version": 2}), "$.version"),
    (json.dumps(document([{"op": "mdsl.graph.nope", "operands": [], "results": []}])),
     "$.module.regions[0][0].ops[0].op"),
    (json.dumps(document([{"op": CAST, "operands": [7], "results": []}])),
     "$.module.regions[0][0].ops[0].operands[0]"),
    (json.dumps(document([{"op": CAST, "operands": [], "results": [{"id": 0, "type": "!nope<"}]}])),
     "$.module.regions[0][0].ops[0].results[0].type"),
    (json.dumps(document([{"op": CAST, "operands": [], "results": [{"id": 0, "type": "i32 i32"}]}])),
     "$.module.regions[0][0].ops[0].results[0].type"),
    (json.dumps(document([{"op": CAST, "operands": [], "results": [{"id": 0, "type": "i32"},
                                                                       {"id": 0, "type": "i32"}]}])),
     "$.module.regions[0][0].ops[0].results[1].id"),
])
def test_what_is_not_json_ir_is_an_error_at_its_json_path(text, path):
    with pytest.raises(JsonIRError) as err:
        read_json(make_context(), text)
    assert err.value.path == path


def test_mdsl_opt_writes_json_and_reads_it_back(tmp_path, capsys):
    source = ROOT / "modeldsl" / "std" / "modules" / "linear.module"
    assert opt_main([str(source)]) == 0
    direct = capsys.readouterr().out
    assert opt_main([str(source), "--emit=json", "-o", str(tmp_path / "linear.json")]) == 0
    assert opt_main([str(tmp_path / "linear.json")]) == 0
    assert capsys.readouterr().out == direct
    (tmp_path / "bad.json").write_text(json.dumps(document([{"op": "mdsl.graph.nope", "operands": [],
                                                             "results": []}])))
    assert opt_main([str(tmp_path / "bad.json")]) == 1
    assert "error[E001]:" in capsys.readouterr().err
