"""An unknown word in a Python DSL class is an error with its code, its file:line:col, a caret and the
closest known word, never dropped: a class or method decorator, a method or member the DSL does not
take, an ``@hf_mapping`` form, a builder call (tests/unit/frontend/python/test_builder_calls.py)."""

from __future__ import annotations

import pytest

from modeldsl.diagnostics import DiagnosticError
from modeldsl.frontend.python import parse_python_source
from tests.unit.frontend.python.twins import at

HEADER = "from modeldsl.dsl import Param, Tensor, forward, graph, model, module, save\n\n\n"

CLASS = '''
{decorators}
class M:
    def __init__(self, d: int = 4):
        pass

    w = Param(Tensor["d"])
    {member}

    {method_decorators}
    def forward(self, x: Tensor["B", "d"]) -> Tensor["B", "d"]:
        with graph() as g:
            out = g.mul(x, "w")
'''


def problem(decorators: str = "@model", member: str = "", method_decorators: str = "@forward"):
    source = HEADER + CLASS.format(decorators=decorators, member=member, method_decorators=method_decorators)
    with pytest.raises(DiagnosticError) as err:
        parse_python_source(source, "bad.py")
    return err.value.diagnostics[0], source


@pytest.mark.parametrize("decorators, word, close", [
    ("@model\n@chekpoint", "@chekpoint", "@checkpoint"),
    ("@modle", "@modle", "@module"),
    ("@model\n@hf_mapping.indexd(\"blocks\", w=\"x\")", "@hf_mapping.indexd", "@hf_mapping.indexed"),
    ("@model\n@hf_mappings({})", "@hf_mappings", "@hf_mapping"),
    ("@model\n@extend(\"Base\")", "@extend", "@extends"),
])
def test_an_unknown_class_decorator_is_e008_with_the_closest(decorators, word, close):
    diagnostic, source = problem(decorators)
    assert diagnostic.code == "E008" and f"unknown decorator {word}" in diagnostic.message, diagnostic.render()
    assert at(diagnostic, source, word[1:]) and f"did you mean {close}?" in diagnostic.hint


@pytest.mark.parametrize("method_decorators, word, close", [
    ("@forwad", "forwad", "@forward"),
    ("@save(\"x\")\n    @froward", "froward", "@forward"),
    ("@forward\n    @checkpoint", "checkpoint", None),
])
def test_an_unknown_method_decorator_is_e008_with_the_closest(method_decorators, word, close):
    diagnostic, source = problem(method_decorators=method_decorators)
    assert diagnostic.code == "E008" and f"unknown decorator @{word} on a method" in diagnostic.message
    assert at(diagnostic, source, word)
    if close:
        assert f"did you mean {close}?" in diagnostic.hint


def test_a_class_of_python_decorators_is_pythons_own_but_one_of_dsl_words_needs_a_kind():
    plain = HEADER + "import dataclasses\n\n\n@dataclasses.dataclass\nclass Point:\n    x: int = 0\n"
    assert parse_python_source(plain, "ok.py").declarations == []
    source = HEADER + "@save(\"x\")\nclass Lost:\n    pass\n"
    with pytest.raises(DiagnosticError) as err:
        parse_python_source(source, "bad.py")
    (diagnostic,) = err.value.diagnostics
    assert diagnostic.code == "E008" and "no module, block or model" in diagnostic.message and \
        at(diagnostic, source, "save(")


def test_an_undecorated_method_is_e001():
    diagnostic, source = problem(method_decorators="")
    assert diagnostic.code == "E001" and "method 'forward' is none of the DSL's" in diagnostic.message
    assert at(diagnostic, source, "def forward")


@pytest.mark.parametrize("member, place", [
    ("scale = 2.0", "scale ="),
    ("w2 = Parm(Tensor[\"d\"])", "w2 ="),
    ("print(\"hi\")", "print("),
])
def test_a_member_the_dsl_does_not_take_is_e001(member, place):
    diagnostic, source = problem(member=member)
    assert diagnostic.code == "E001" and "a DSL class holds" in diagnostic.message and at(diagnostic, source, place)
