"""The JSON form of modeldsl's IR (``mdsl-opt --emit=json``, ``mdsl-opt FILE.json``).

A module is written as nested JSON (format ``modeldsl-ir``, :data:`VERSION`; the JSON Schema is
``docs/json-ir.schema.json``, the documentation ``docs/json-ir.md``): each operation is an object
with its name, its operand values (numbered in order of definition), its results with their
types, its properties and attributes, its location and its regions of blocks. Types and
attribute values are written in their MLIR text form (``!mdsl.tensor<[B, T, 64], f32>``), which
the IR's own printer and parser already round-trip exactly, so every op of every dialect goes
through unchanged. :func:`read_json` rebuilds the ``builtin.module`` and verifies it; a file
that is not this format is a :class:`JsonIRError` naming the JSON path of the problem.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

from xdsl.context import Context
from xdsl.dialects.builtin import FileLineColLoc, IntAttr, ModuleOp, StringAttr
from xdsl.ir import Attribute, Block, BlockArgument, Operation, Region, SSAValue
from xdsl.parser import Parser
from xdsl.printer import Printer
from xdsl.utils.exceptions import ParseError

FORMAT = "modeldsl-ir"
VERSION = 1


class JsonIRError(Exception):
    """A JSON IR file that cannot be read: ``path`` is where in the JSON (``$.module.regions[0]...``)."""

    def __init__(self, path: str, problem: str):
        super().__init__(f"{path}: {problem}")
        self.path, self.problem = path, problem


# ------------------------------------------------------------------ writing
def to_json(module: ModuleOp) -> dict[str, Any]:
    """The JSON document of ``module``."""
    numbers: dict[SSAValue, int] = {}
    return {"format": FORMAT, "version": VERSION, "module": _op(module, numbers)}


def dumps(module: ModuleOp) -> str:
    return json.dumps(to_json(module), indent=1) + "\n"


def _text(attribute: Attribute) -> str:
    stream = io.StringIO()
    Printer(stream=stream).print_attribute(attribute)
    return stream.getvalue()


def _define(value: SSAValue, numbers: dict[SSAValue, int]) -> dict[str, Any]:
    numbers[value] = len(numbers)
    entry: dict[str, Any] = {"id": numbers[value], "type": _text(value.type)}
    if value.name_hint:
        entry["name"] = value.name_hint
    return entry


def _location_entry(location: FileLineColLoc) -> dict[str, Any]:
    return {"file": location.filename.data, "line": location.line.data, "column": location.column.data}


def _argument(arg: BlockArgument, numbers: dict[SSAValue, int]) -> dict[str, Any]:
    """A block argument: a value, with the DSL location of the input or parameter it stands for."""
    entry = _define(arg, numbers)
    if isinstance(arg.location, FileLineColLoc):
        entry["location"] = _location_entry(arg.location)
    return entry


def _op(op: Operation, numbers: dict[SSAValue, int]) -> dict[str, Any]:
    entry: dict[str, Any] = {"op": op.name, "operands": [numbers[v] for v in op.operands]}
    if op.successors:
        raise ValueError(f"{op.name}: operations with successors have no JSON form")
    entry["results"] = [_define(r, numbers) for r in op.results]
    if op.properties:
        entry["properties"] = {k: _text(v) for k, v in op.properties.items()}
    if op.attributes:
        entry["attributes"] = {k: _text(v) for k, v in op.attributes.items()}
    if isinstance(op.location, FileLineColLoc):
        entry["location"] = _location_entry(op.location)
    if op.regions:
        entry["regions"] = [[{"arguments": [_argument(a, numbers) for a in block.args],
                              "ops": [_op(o, numbers) for o in block.ops]} for block in region.blocks]
                            for region in op.regions]
    return entry


def compile_model(model: str | Path, config: dict[str, Any] | None = None, top: str | None = None) -> dict[str, Any]:
    """The JSON IR of a model's ``mdsl.graph``: ``model`` a std model's registry name (``"Llama"``),
    a ``.module`` or Python DSL file (``top`` its declaration) or a Python DSL class, lowered with its
    defaults or the values of ``config`` (its parameters by name, as ``mdsl-opt --param``)."""
    from modeldsl.diagnostics import DiagnosticSink
    from modeldsl.frontend.read import read_model
    from modeldsl.lower import lower_program
    from modeldsl.registry import get_model

    if isinstance(model, str) and not model.endswith((".module", ".py")):
        entry = get_model(model)
        model, top = entry.path, top or entry.name
    program, top = read_model(model, top)
    return to_json(lower_program(program, top, config, DiagnosticSink()))


# ------------------------------------------------------------------ reading
def read_json(ctx: Context, text: str) -> ModuleOp:
    """The module of a JSON IR document (not verified: the caller verifies it as any IR)."""
    try:
        document = json.loads(text)
    except (ValueError, RecursionError) as err:
        raise JsonIRError("$", f"not JSON ({err})") from None
    if not isinstance(document, dict):
        raise JsonIRError("$", "not a JSON object")
    if document.get("format") != FORMAT:
        raise JsonIRError("$.format", f"is {document.get('format')!r}, not {FORMAT!r}")
    if document.get("version") != VERSION:
        raise JsonIRError("$.version", f"is {document.get('version')!r}; this modeldsl reads version {VERSION}")
    module = _Reader(ctx).op(document.get("module"), "$.module")
    if not isinstance(module, ModuleOp):
        raise JsonIRError("$.module.op", f"is {module.name}, not builtin.module")
    return module


class _Reader:
    def __init__(self, ctx: Context):
        self.ctx = ctx
        self.values: dict[int, SSAValue] = {}

    def op(self, entry: Any, path: str) -> Operation:
        entry = _object(entry, path)
        name = _string(entry.get("op"), f"{path}.op")
        op_type = self.ctx.get_optional_op(name)
        if op_type is None:
            raise JsonIRError(f"{path}.op", f"'{name}' is no operation of the loaded dialects")
        operands = [self.value(v, f"{path}.operands[{k}]") for k, v in enumerate(_list(entry.get("operands", []),
                                                                                       f"{path}.operands"))]
        results = _list(entry.get("results", []), f"{path}.results")
        result_types = [self.attribute(_object(r, f"{path}.results[{k}]").get("type"), f"{path}.results[{k}].type")
                        for k, r in enumerate(results)]
        properties = self.attributes(entry.get("properties", {}), f"{path}.properties")
        attributes = self.attributes(entry.get("attributes", {}), f"{path}.attributes")
        regions = [self.region(r, f"{path}.regions[{k}]")
                   for k, r in enumerate(_list(entry.get("regions", []), f"{path}.regions"))]
        try:
            op = op_type.create(operands=operands, result_types=result_types, properties=properties,
                                attributes=attributes, regions=regions, location=_location(entry.get("location")))
        except Exception as err:  # noqa: BLE001 - an op's constructor checks its own operands
            raise JsonIRError(path, f"cannot build {name}: {err}") from None
        for k, (result, given) in enumerate(zip(op.results, results)):
            self.define(given, result, f"{path}.results[{k}]")
        return op

    def region(self, blocks: Any, path: str) -> Region:
        region = Region()
        for k, entry in enumerate(_list(blocks, path)):
            entry = _object(entry, f"{path}[{k}]")
            arguments = _list(entry.get("arguments", []), f"{path}[{k}].arguments")
            block = Block(arg_types=[self.attribute(_object(a, f"{path}[{k}].arguments[{n}]").get("type"),
                                                    f"{path}[{k}].arguments[{n}].type")
                                     for n, a in enumerate(arguments)])
            for n, (argument, given) in enumerate(zip(block.args, arguments)):
                self.define(given, argument, f"{path}[{k}].arguments[{n}]")
                location = _location(given.get("location"))
                if location is not None:
                    argument.location = location
            region.add_block(block)
            for n, op in enumerate(_list(entry.get("ops", []), f"{path}[{k}].ops")):
                block.add_op(self.op(op, f"{path}[{k}].ops[{n}]"))
        return region

    def define(self, given: dict[str, Any], value: SSAValue, path: str) -> None:
        number = given.get("id")
        if not isinstance(number, int) or isinstance(number, bool) or number in self.values:
            raise JsonIRError(f"{path}.id", f"{number!r} is not a new value number")
        self.values[number] = value
        name = given.get("name")
        if isinstance(name, str) and SSAValue.is_valid_name(name):
            value.name_hint = name

    def value(self, number: Any, path: str) -> SSAValue:
        if not isinstance(number, int) or number not in self.values:
            raise JsonIRError(path, f"{number!r} is no value defined before its use")
        return self.values[number]

    def attributes(self, entries: Any, path: str) -> dict[str, Attribute]:
        return {k: self.attribute(v, f"{path}.{k}") for k, v in _object(entries, path).items()}

    def attribute(self, text: Any, path: str) -> Attribute:
        text = _string(text, path)
        try:
            parser = Parser(self.ctx, text)
            attribute = parser.parse_attribute()
            trailing = parser.pos < len(text.rstrip())
        except ParseError as err:
            raise JsonIRError(path, f"'{text}' is no attribute or type: {err.msg}") from None
        if trailing:
            raise JsonIRError(path, f"'{text}' has text after its attribute")
        return attribute


def _location(entry: Any) -> FileLineColLoc | None:
    if not isinstance(entry, dict):
        return None
    file, line, column = entry.get("file"), entry.get("line"), entry.get("column")
    if isinstance(file, str) and isinstance(line, int) and isinstance(column, int):
        return FileLineColLoc(StringAttr(file), IntAttr(line), IntAttr(column))
    return None


def _object(value: Any, path: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise JsonIRError(path, "is not a JSON object")
    return value


def _list(value: Any, path: str) -> list[Any]:
    if not isinstance(value, list):
        raise JsonIRError(path, "is not a JSON array")
    return value


def _string(value: Any, path: str) -> str:
    if not isinstance(value, str):
        raise JsonIRError(path, "is not a string")
    return value
