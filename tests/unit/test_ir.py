"""modeldsl.ir: located verifier diagnostics, use before definition, DSL locations on ops."""

from __future__ import annotations

from xdsl.dialects.builtin import FileLineColLoc, UnknownLoc
from xdsl.pattern_rewriter import PatternRewriter, PatternRewriteWalker, RewritePattern, op_type_rewrite_pattern

from modeldsl.diagnostics import Source, Span
from modeldsl.dialects.graph_primitives import ReluOp
from modeldsl.ir import located, make_context, parse_module, remember_source, span_of_location, verify_module

IR = """!x = !mdsl.graph.tensor<[B, 64], fp32>
mdsl.graph.model @m {
  mdsl.graph.func @f(%x: !x) -> !x {
    %a = mdsl.graph.relu %x : (!x) -> !x
    %b = mdsl.graph.relu %a : (!x) -> !x
    mdsl.graph.return %b : !x
  }
}
"""


def relus(module):
    return [op for op in module.walk() if op.name == "mdsl.graph.relu"]


def test_valid_ir_has_no_diagnostics():
    module, spans = parse_module(make_context(), IR, "ok.mlir")
    assert verify_module(module, spans) == []


def test_an_op_moved_before_its_operand_is_e017_at_its_line():
    module, spans = parse_module(make_context(), IR, "moved.mlir")
    a, b = relus(module)
    b.detach()
    a.parent_block().insert_op_before(b, a)
    (diag,) = verify_module(module, spans)
    rendered = diag.render()
    assert diag.code == "E017" and "%a is used before its definition" in diag.message
    assert rendered.startswith("moved.mlir:5:5: error[E017]: 'mdsl.graph.relu' op %a is used before its definition")


def test_a_value_used_outside_its_region_is_e017():
    module, _ = parse_module(make_context(), IR + IR.replace("@m", "@n").split("\n", 1)[1], "two.mlir")
    first, _, second, _ = relus(module)
    second.operands[0] = first.results[0]
    diags = verify_module(module)
    assert [d.code for d in diags if "outside the region that defines it" in d.message] == ["E017"]


def test_a_verifier_failure_without_a_parse_span_points_at_the_dsl_location():
    source = "module M():\n  forward:\n    graph:\n      x -> relu() -> y\n"
    remember_source("model.module", source)
    wrong = IR.replace("%a = mdsl.graph.relu %x : (!x) -> !x", "%a = mdsl.graph.relu %x : (!x) -> !y")
    wrong = wrong.replace("%b = mdsl.graph.relu %a : (!x) -> !x", "%b = mdsl.graph.relu %x : (!x) -> !x")
    module, _ = parse_module(make_context(), "!y = !mdsl.graph.tensor<[B, 32], fp32>\n" + wrong, "ir.mlir")
    a, _ = relus(module)
    a.location = UnknownLoc()  # as lowering builds it
    located(a, Span(Source("model.module", source), 4, 12, 4, 16))
    diags = verify_module(module)  # no parse spans: the op's location is used
    assert diags and diags[0].diagnostic().render().startswith("model.module:4:12: error[E041]: 'mdsl.graph.relu' op")
    assert "      x -> relu() -> y\n" in diags[0].render() and "|            ^^^^\n" in diags[0].render()


def test_parsed_ops_are_located_at_their_text_unless_they_say_otherwise():
    text = IR.replace("%b = mdsl.graph.relu %a : (!x) -> !x",
                      '%b = mdsl.graph.relu %a : (!x) -> !x loc("m.module":7:3)')
    module, _ = parse_module(make_context(), text, "ir.mlir")
    a, b = relus(module)
    assert (a.location.filename.data, a.location.line.data, a.location.column.data) == ("ir.mlir", 4, 5)
    assert (b.location.filename.data, b.location.line.data, b.location.column.data) == ("m.module", 7, 3)


def test_located_keeps_an_existing_location():
    module, _ = parse_module(make_context(), IR, "ir.mlir")
    a, _ = relus(module)
    a.location = UnknownLoc()
    source = Source("m.module", "a\nb\n")
    located(a, Span(source, 2, 1, 2, 2))
    located(a, Span(source, 1, 1, 1, 2))
    assert isinstance(a.location, FileLineColLoc) and a.location.line.data == 2
    assert span_of_location(UnknownLoc()) is None


def test_a_rewrite_passes_the_location_on():
    module, _ = parse_module(make_context(), IR, "ir.mlir")
    a, b = relus(module)
    b.location = UnknownLoc()
    a.location = UnknownLoc()
    located(a, Span(Source("m.module", "x\n"), 1, 1, 1, 2))

    class Rebuild(RewritePattern):
        @op_type_rewrite_pattern
        def match_and_rewrite(self, op: ReluOp, rewriter: PatternRewriter) -> None:
            if "rebuilt" not in op.attributes:
                new = op.clone()
                new.location = UnknownLoc()
                new.attributes["rebuilt"] = op.operands[0].type
                rewriter.replace(op, new)

    PatternRewriteWalker(Rebuild(), apply_recursively=False).rewrite_module(module)
    first, second = relus(module)
    assert isinstance(first.location, FileLineColLoc) and first.location.filename.data == "m.module"
    assert isinstance(second.location, UnknownLoc)
