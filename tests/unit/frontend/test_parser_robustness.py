"""Parser: the inline conditional, annotation declarations, and inputs no later stage could take."""

import os

import pytest

from modeldsl.diagnostics import DiagnosticError
from modeldsl.frontend.text import ast
from modeldsl.frontend.text.parser import MAX_DEPTH, decode_source, parse_source, read_source

LET = ("module M(d: int = 8, use_bias: bool = true):\n  let:\n    a = {}\n"
       "  forward:\n    in: [d]\n    graph:\n      in -> out\n")


def error_of(text: str) -> tuple[str, int, int, str]:
    with pytest.raises(DiagnosticError) as info:
        parse_source(text, "m.module")
    (diag,) = info.value.diagnostics
    return diag.code, diag.span.line, diag.span.column, diag.message


def let_value(text: str) -> ast.Expr:
    (decl,) = parse_source(LET.format(text)).declarations
    return decl.sections("let")[0].body[0].value


def test_inline_conditional_in_bindings_and_arguments_but_a_section_guard_stays_a_guard():
    cond = let_value("1 if use_bias else (2 if d > 4 else 3)")
    assert isinstance(cond, ast.Conditional) and isinstance(cond.orelse, ast.Conditional)
    assert cond.condition == ast.Name(None, "use_bias")
    text = ("module M(use_bias: bool = true):\n  params:\n    b: [4] if use_bias\n  forward:\n    in: [4]\n"
            "    graph:\n      in -> Linear(w, bias=b if use_bias else None) -> out\n")
    (decl,) = parse_source(text).declarations
    entry = decl.sections("params")[0].body[0]
    assert entry.value.guard == ast.Name(None, "use_bias")
    flow = decl.sections("forward")[0].body[-1].body[0]
    (arg,) = [a for a in flow.chain[1].args if a.name == "bias"]
    assert isinstance(arg.value, ast.Conditional) and isinstance(arg.value.orelse, ast.NoneLit)


def test_annotation_declarations_parse_with_prose_behaviour_and_keep_line_numbers():
    text = ('annotation @tag:\n  """Doc."""\n  params:\n    level: enum(low, high)\n'
            "  applies_to: [operation, block, layer]\n  compiler_behavior:\n    save: Include in it, or not\n"
            "    - Check if (the pattern is supported\n  runtime_behavior:\n    just words\n"
            "module M:\n  forward:\n    in: [4]\n    graph:\n      in -> -> out\n")
    with pytest.raises(DiagnosticError) as info:
        parse_source(text, "m.module")
    assert info.value.diagnostics[0].span.line == 15  # the prose bodies did not shift the lines
    (decl, _) = parse_source(text.replace("in -> -> out", "in -> out")).declarations
    assert (decl.kind, decl.name) == ("annotation", "tag")
    assert [s.name for s in decl.body[1:]] == ["params", "applies_to", "compiler_behavior", "runtime_behavior"]
    assert "Include in it" in decl.body[3].value.expr.value


@pytest.mark.parametrize("expr", ["+".join(["1"] * 5000), "-" * 5000 + "1", "2 * (" * 3000 + "1" + ")" * 3000,
                                  "not " * 3000 + "true", "x" + ".a" * 3000])
def test_deep_expressions_are_a_located_e001_not_a_recursion_error(expr):
    assert error_of(LET.format(expr)) == ("E001", 3, 9, f"expression nested too deeply (more than {MAX_DEPTH} levels)")


def test_expressions_below_the_depth_limit_parse():
    assert isinstance(let_value("+".join(["d"] * 120)), ast.Binary)
    assert isinstance(let_value("(" * 2000 + "d" + ")" * 2000), ast.Name)  # parentheses add no depth


@pytest.mark.parametrize("digits", ["9" * 4301, "9223372036854775808", "1" + "0" * 30])
def test_integer_literals_past_i64_are_e001_at_the_literal(digits):
    code, line, column, message = error_of(LET.format(digits))
    assert (code, line, column) == ("E001", 3, 9) and "out of range" in message


def test_the_largest_i64_literal_parses():
    assert let_value("9_223_372_036_854_775_807") == ast.Int(None, 2**63 - 1)


def test_non_utf8_bytes_are_e001_at_their_line_and_column():
    with pytest.raises(DiagnosticError) as info:
        decode_source(b"module M:\n  \xc3\xa9\xff\n", "m.module")  # the column counts the character before
    (diag,) = info.value.diagnostics
    assert (diag.code, diag.span.line, diag.span.column) == ("E001", 2, 4) and "0xff" in diag.message


def test_a_folder_or_fifo_is_e028_without_reading(tmp_path):
    fifo = tmp_path / "pipe.module"
    os.mkfifo(fifo)
    for path in (tmp_path, fifo):
        with pytest.raises(DiagnosticError) as info:
            read_source(path)
        assert info.value.diagnostics[0].code == "E028"


def test_float_literals_past_float64_are_e001():
    code, line, column, message = error_of(LET.format("1e999"))
    assert (code, line, column) == ("E001", 3, 9) and "float literal 1e999 is out of range" in message


def test_statements_nested_too_deeply_are_e001():
    lines = ["module M(c: bool = true):", "  forward:", "    in: [4]", "    graph:"]
    lines += [" " * (6 + 2 * i) + "if c:" for i in range(200)] + [" " * 406 + "in -> out"]
    code, _, _, message = error_of("\n".join(lines) + "\n")
    assert code == "E001" and message.startswith("blocks nested too deeply")


def test_every_annotation_declaration_of_spec_section_7_parses():
    from spec_blocks import spec_code_blocks

    decls = [d for line, text in spec_code_blocks() if text.lstrip().startswith("annotation @")
             for d in parse_source(text, f"spec{line}").declarations]
    assert len(decls) >= 20 and all(d.kind == "annotation" for d in decls)
    assert {"memory", "checkpoint", "fuse", "shard"} <= {d.name for d in decls}
