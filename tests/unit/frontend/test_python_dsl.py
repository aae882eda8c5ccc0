"""The Python decorator DSL (modeldsl.frontend.python): the std library in its spelling lowers to
the text versions' IR and computes the same bits; its mistakes are the text DSL's coded
diagnostics at the Python file's line:col; the file is read, never run."""

import json
import re
import textwrap

import numpy as np
import pytest
from hf_checkpoints import cached_checkpoint

import modeldsl
from modeldsl import registry
from modeldsl.diagnostics import DiagnosticError, DiagnosticSink
from modeldsl.frontend.python import parse_python_source
from modeldsl.frontend.read import read_model
from modeldsl.frontend.text.parser import parse_source
from modeldsl.ir import print_ir
from modeldsl.lower import lower_program
from modeldsl.tools.opt import main as opt_main

PYTHON = [e for kind in ("model", "block", "module") for e in registry.entries(kind) if e.frontend == "python"]
CHECKPOINTS = {"Llama": ("llama", {}), "Qwen3": ("qwen3", {"head_dim": 16}),
               "Mistral": ("mistral", {"sliding_window": 5}),
               "Mixtral": ("mixtral", {"num_local_experts": 4, "num_experts_per_tok": 2}),
               "Qwen3Moe": ("qwen3_moe", {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 24,
                                          "head_dim": 16}),
               "Mamba": ("mamba", {"state_size": 4, "expand": 2, "conv_kernel": 4, "time_step_rank": 2}),
               "Phi3": ("phi3", {"pad_token_id": None, "eos_token_id": None, "partial_rotary_factor": 0.75})}
HEADER = "from modeldsl.dsl import Param, Tensor, backward, forward, graph, module, save\n\n\n"


def without_locations(ir: str) -> str:
    """The IR without the places it was written at (``*_at`` attributes, ``"file:line:col"``)."""
    return re.sub(r'"[^"]*\.(module|py):\d+:\d+"', '"LOC"', ir)


def lowered(entry, config=None):
    program, _ = read_model(entry.path)
    return print_ir(lower_program(program, entry.name, config, DiagnosticSink()))


@pytest.mark.parametrize("entry", PYTHON, ids=[e.name for e in PYTHON])
def test_every_python_std_declaration_lowers_to_the_ir_of_its_text_twin(entry):
    twin = registry.get(entry.kind, entry.name, "text")
    assert twin.frontend == "text" and twin.path.suffix == ".module"
    assert without_locations(lowered(entry)) == without_locations(lowered(twin))


def test_the_python_std_library_has_every_std_model_block_and_module():
    for kind in ("model", "block", "module"):
        spelled = {e.name for e in registry.entries(kind) if e.frontend == "python"}
        assert spelled == {e.name for e in registry.entries(kind) if e.frontend == "text"}, kind


@pytest.mark.parametrize("name", CHECKPOINTS)
def test_logits_and_gradients_equal_the_text_versions_bitwise(name):
    from modeldsl.runtime.optim import AdamWConfig
    from modeldsl.runtime.train import Trainer

    arch, config = CHECKPOINTS[name]
    path = cached_checkpoint(arch, **config)
    tokens = np.random.default_rng(0).integers(0, 64, (2, 9))
    results = []
    for frontend in ("text", "python"):
        model = modeldsl.load(registry.get_model(name, frontend).path, hf=path)
        trainer = Trainer(model, AdamWConfig(lr=1e-3))
        loss = trainer.accumulate(tokens[:, :-1], tokens[:, 1:])
        grads = {k: v.copy() for k, v in trainer.optimizer.grads.items()}
        results.append((model.forward(tokens[0].tolist()), loss, grads))
    (logits, loss, grads), (py_logits, py_loss, py_grads) = results
    np.testing.assert_array_equal(py_logits, logits)
    assert py_loss == loss and grads.keys() == py_grads.keys()
    for key in grads:
        np.testing.assert_array_equal(py_grads[key], grads[key], err_msg=key)


MODULE = '''
    @module
    class Bad:
        def __init__(self, d: int):
            pass

        weight = Param(Tensor["d"])

        @forward
        def forward(self, in_: Tensor["*", "d"]) -> Tensor["*", "d"]:
            with graph() as g:
                {step}
'''


def test_a_class_loads_from_its_file_and_the_file_is_read_not_run(tmp_path):
    from modeldsl.std.python.models.llama import Llama

    path = cached_checkpoint("llama")
    text = modeldsl.load(registry.get_model("Llama").path, hf=path).forward([1, 2, 3])
    np.testing.assert_array_equal(modeldsl.load(Llama, hf=path).forward([1, 2, 3]), text)
    step = 'out = g.mul(in_, "weight")'
    source = HEADER + 'raise SystemExit("never run")\n' + textwrap.dedent(MODULE.format(step=step))
    (tmp_path / "scale.py").write_text(source)
    model = modeldsl.load(tmp_path / "scale.py", config={"d": 3})
    assert model.model.sym_name.data == "Bad" and "mdsl.graph.mul" in print_ir(model.module)


def python_error(body: str, top: str = "Bad") -> tuple:
    """The first diagnostic of lowering ``top`` of a Python DSL source, and the source."""
    source = HEADER + textwrap.dedent(body)
    with pytest.raises(DiagnosticError) as err:
        lower_program(parse_python_source(source, "bad.py"), top, None, DiagnosticSink())
    return err.value.diagnostics[0], source


def where(source: str, text: str, occurrence: int = 1) -> tuple[int, int]:
    """The line and column (1-based) of the ``occurrence``-th ``text`` in ``source``."""
    at = -1
    for _ in range(occurrence):
        at = source.index(text, at + 1)
    line = source.count("\n", 0, at) + 1
    return line, at - (source.rfind("\n", 0, at) + 1) + 1




TEXT_TWIN = "module Bad(d: int):\n  params:\n    weight: [d]\n  forward:\n    in: [*, d]\n    out: [*, d]\n" \
    "    graph:\n      {step}\n"


@pytest.mark.parametrize("step, twin, at", [
    ('out = g.mul(in_, nope)', "(in, nope) -> mul() -> out", "nope"),  # undefined name
    ('out = g.mul(in_, "weight", no_such=1)', "(in, weight) -> mul(no_such=1) -> out", "no_such"),  # bad argument
    ('out = g.matmul(in_, "weight", transpose="NT")', "(in, weight) -> matmul(transpose=NT) -> out",
     "g.matmul"),  # shapes that do not fit
    ('out = g.mul(in_, "weight", memory="sometimes")', "(in, weight) -> mul() -> out @memory(sometimes)",
     "memory"),  # bad annotation
    ('out = g.nosuchprim(in_)', "in -> nosuchprim() -> out", "g.nosuchprim"),  # unknown primitive
])
def test_a_mistake_is_its_text_twins_diagnostic_at_the_python_line_and_column(step, twin, at):
    diagnostic, source = python_error(MODULE.format(step=step))
    with pytest.raises(DiagnosticError) as err:
        lower_program(parse_source(TEXT_TWIN.format(step=twin), "bad.module"), "Bad", None, DiagnosticSink())
    expected = err.value.diagnostics[0]
    assert (diagnostic.code, diagnostic.message) == (expected.code, expected.message), diagnostic.render()
    assert (diagnostic.span.line, diagnostic.span.column) == where(source, at), diagnostic.render()
    assert diagnostic.span.source.name == "bad.py"


def test_python_the_dsl_does_not_take_is_e001_at_its_place():
    diagnostic, source = python_error(MODULE.format(step="for i in range(2):\n                    out = in_"))
    assert diagnostic.code == "E001" and (diagnostic.span.line, diagnostic.span.column) == where(source, "for i")
    assert "a graph takes" in diagnostic.message


TWO_OUTPUTS = '''
    @module
    class Two:
        def __init__(self, d: int):
            pass

        @forward
        def forward(self, in_: Tensor["*", "d"]) -> tuple[Tensor["*", "d"], Tensor["d", "fp32"]]:
            with graph() as g:
                total = g.zeros(shape=["d"], dtype="fp32")
                wide = g.cast(in_, dtype="fp32")
                {ending}
'''


def test_a_forward_of_several_outputs_returns_one_name_per_tensor_of_its_tuple():
    """``-> tuple[...]`` with ``return a, b`` is the text DSL's ``outputs:`` section; a step with no
    input tensor (a constant) and the dtype= of cast/zeros are the primitives' own (not @dtype)."""
    source = HEADER + textwrap.dedent(TWO_OUTPUTS.format(ending="return wide, total"))
    ir = print_ir(lower_program(parse_python_source(source, "two.py"), "Two", {"d": 3}, DiagnosticSink()))
    assert "mdsl.graph.zeros" in ir and "mdsl.graph.cast" in ir and "-> (!mdsl.graph.tensor<[" in ir
    diagnostic, source = python_error(TWO_OUTPUTS.format(ending="return wide"), top="Two")
    assert diagnostic.code == "E001" and "gives 2 outputs" in diagnostic.message, diagnostic.render()
    assert (diagnostic.span.line, diagnostic.span.column) == where(source, "tuple["), diagnostic.render()


def test_a_backward_that_reads_a_tensor_the_forward_does_not_save_is_reported_at_the_read():
    diagnostic, source = python_error('''
        @module
        class Bad:
            def __init__(self, d: int):
                pass

            weight = Param(Tensor["d"])

            @save("in_")
            @forward
            def forward(self, in_: Tensor["*", "d"]) -> Tensor["*", "d"]:
                with graph() as g:
                    out = g.mul(in_, "weight")

            @backward
            def backward(self, d_out: Tensor["*", "d"]) -> Tensor["*", "d"]:
                with graph() as g:
                    d_in = g.mul(d_out, g.saved("nope"))
    ''')
    assert diagnostic.code.startswith("E") and (diagnostic.span.line, diagnostic.span.column) \
        == where(source, 'g.saved("nope")'), diagnostic.render()


def test_python_syntax_errors_are_e001_at_their_place():
    with pytest.raises(DiagnosticError) as err:
        parse_python_source("class A(:\n  pass\n", "bad.py")
    (diagnostic,) = err.value.diagnostics
    assert diagnostic.code == "E001" and diagnostic.span.line == 1 and "Python syntax error" in diagnostic.message


def test_mdsl_opt_reads_python_files_and_gives_json_diagnostics(tmp_path, capsys):
    path = registry.get_model("Llama", "python").path
    assert opt_main([str(path)]) == 0
    assert without_locations(capsys.readouterr().out).strip() == \
        without_locations(lowered(registry.get_model("Llama"))).strip()
    bad = tmp_path / "bad.py"
    bad.write_text(HEADER + textwrap.dedent(MODULE.format(step="out = g.mul(in_, nope)")))
    assert opt_main([str(bad), "--diagnostics-format=json"]) == 1
    (reported,) = json.loads(capsys.readouterr().out)  # JSON diagnostics go to stdout
    assert reported["code"] == "E002" and reported["location"]["file"] == str(bad)
    assert (reported["location"]["line"], reported["location"]["column"]) == where(bad.read_text(), "nope")


def assert_twins(tmp_path, python: str, text: str, top: str, imports: dict[str, str] | None = None):
    """The Python source and the text source lower ``top`` to the same IR (but for locations)."""
    for name, content in (imports or {}).items():
        (tmp_path / name).write_text(content)
    (tmp_path / "twin.py").write_text(textwrap.dedent(python))
    (tmp_path / "twin.module").write_text(textwrap.dedent(text))
    irs = [without_locations(print_ir(lower_program(read_model(tmp_path / f)[0], top, None, DiagnosticSink())))
           for f in ("twin.py", "twin.module")]
    assert irs[0] == irs[1]


def test_abstract_extends_and_annotated_parameters_are_their_text_twins(tmp_path):
    assert_twins(tmp_path, '''
        from modeldsl.dsl import Param, Tensor, abstract, extends, forward, graph, module


        @abstract
        @module
        class Base:
            def __init__(self, d: int, h: int):
                pass

            w = Param(Tensor["d", "d"])

            @forward
            def forward(self, in_: Tensor["B", "d"]) -> Tensor["B", "d"]:
                ...


        @extends("Base")
        @module
        class Child:
            def __init__(self, d: int = 8, h: int = 2):
                pass

            extra = Param(Tensor["h"], shard=("column", {"tp_size": 2}))

            @forward
            def forward(self, in_: Tensor["B", "d"]) -> Tensor["B", "d"]:
                with graph() as g:
                    out = g.matmul(in_, "w", transpose="NT")
    ''', '''
        abstract module Base(d: int, h: int):
          params:
            w: [d, d]
          forward:
            in: [B, d]
            out: [B, d]

        module Child(d: int = 8, h: int = 2) extends Base:
          params:
            +extra: [h] @shard(column, tp_size=2)
          forward:
            graph:
              in -> matmul(w, transpose=NT) -> out
    ''', "Child")


def test_class_decorators_are_the_declarations_annotations_and_relative_imports_resolve(tmp_path):
    recipes = "recipe Hybrid:\n  forward_activation_dtype: fp8_e4m3\n  amax_history_len: 16\n"
    assert_twins(tmp_path, '''
        from modeldsl.dsl import Param, Tensor, forward, frozen, graph, model, recipe
        from .recipes import Hybrid


        @model
        @recipe("Hybrid")
        class M:
            def __init__(self, d: int = 8):
                pass

            w = Param(Tensor["d", "d"], frozen=True)

            @forward
            def forward(self, x: Tensor["B", "d"]) -> Tensor["B", "d"]:
                with graph() as g:
                    out = g.matmul(x, "w", transpose="NT", hook="AfterProjection")
    ''', '''
        from recipes import Hybrid

        model M(d: int = 8):
          @recipe(Hybrid)
          params:
            w: [d, d] @frozen
          forward:
            inputs:
              x: [B, d]
            out: [B, d]
            graph:
              (x, w) -> matmul(transpose=NT) -> out @hook(AfterProjection)
    ''', "M", {"recipes.module": recipes})


PRIMITIVES = '''
    from typing import Literal

    from modeldsl.dsl import Tensor, primitive, save


    @primitive(impl="kernels.matmul")
    def matmul(A: Tensor["M", "K"], B: Tensor["K", "N"], *, transpose: Literal["NN", "NT", "TN", "TT"] = "NN",
               accumulate: bool = False, alpha: float = 1.0, beta: float = 0.0) -> Tensor["M", "N"]:
        """C = alpha * op(A) @ op(B) + beta * C."""


    @primitive(impl={"forward": "kernels.silu_mul_forward", "backward": "kernels.silu_mul_backward"})
    def swiglu(gate: Tensor["*", "D"], up: Tensor["*", "D"]) -> Tensor["*", "D"]:
        """silu(gate) * up."""


    @swiglu.backward
    @save("gate", "up")
    def swiglu_backward(d_out: Tensor["*", "D"], gate: Tensor["*", "D"], up: Tensor["*", "D"]
                        ) -> tuple[Tensor["*", "D"], Tensor["*", "D"]]:
        ...
'''


def primitive_problems(source: str, name: str) -> list:
    """The diagnostics of lowering a file of primitive declarations (Python or text, by ``name``)."""
    parse = parse_python_source if name.endswith(".py") else parse_source
    with pytest.raises(DiagnosticError) as err:
        lower_program(parse(source, name), None, None, DiagnosticSink())
    return err.value.diagnostics


def test_primitives_declared_in_python_are_checked_against_the_op_registry_like_their_text_twins():
    program = parse_python_source(textwrap.dedent(PRIMITIVES), "prims.py")
    assert [d.name for d in program.declarations] == ["matmul", "swiglu"]
    from modeldsl.resolve.primitive_decls import declared_params

    params, _ = declared_params(program.declarations[0])
    assert [(p.name, p.kind, p.default) for p in params] == [
        ("transpose", "enum", "NN"), ("accumulate", "bool", False), ("alpha", "float", 1.0), ("beta", "float", 0.0)]
    module = lower_program(program, None, None, DiagnosticSink())  # declarations only: checked, nothing to lower
    assert not list(module.body.block.ops)
    wrong = textwrap.dedent(PRIMITIVES).replace("alpha: float = 1.0", "alpha: float = 2.0")
    twin = "primitive matmul:\n  params:\n    transpose: enum(NN, NT, TN, TT) = NN\n    accumulate: bool = false\n" \
           "    alpha: float = 2.0\n    beta: float = 0.0\n" \
           "  forward:\n    in: (A: [M, K], B: [K, N])\n    out: [M, N]\n"
    (python,), (text,) = primitive_problems(wrong, "prims.py"), primitive_problems(twin, "prims.module")
    assert (python.code, python.message) == (text.code, text.message)
    assert python.code == "E003" and (python.span.line, python.span.column) == where(wrong, "2.0")


SLOTS = '''
    from modeldsl.dsl import Activation, Param, Tensor, forward, graph, module


    @module
    class Norm2:
        def __init__(self, d: int, eps: float = 1e-6):
            pass

        weight = Param(Tensor["d"])
        {slots}

        @forward
        def forward(self, x: Tensor["B", "T", "d"]) -> Tensor["B", "T", "d"]:
            with graph() as g:
                h, rstd = g.rmsnorm(x, "weight", eps=self.eps)
                y = g.silu(h)
                out = g.mul(y, "weight")
'''


def test_activation_slots_are_the_memory_hints_of_their_text_twin(tmp_path):
    slots = ('rstd = Activation(Tensor["B", "T"], dtype="fp32", save=True, recompute_group="norm")\n'
             '        h = Activation(Tensor["B", "T", "d"], recompute=True, recompute_policy="lora_only")\n'
             '        y = Activation(Tensor["B", "T", "d"], save=True)')
    assert_twins(tmp_path, SLOTS.replace("{slots}", slots), '''
        module Norm2(d: int, eps: float = 1e-6):
          params:
            weight: [d]
          forward:
            inputs:
              x: [B, T, d]
            out: [B, T, d]
            graph:
              (x, weight) -> rmsnorm(eps=eps) -> (h, rstd) @memory(recompute, policy=lora_only)
              h -> silu() -> [B, T, d] -> y
              (y, weight) -> mul() -> out
            save: [rstd, y]
            recompute: [h]
    ''', "Norm2")


@pytest.mark.parametrize("slot, code, message, at", [
    ('y = Activation(Tensor["B", "T", "2 * d"], save=True)', "E004", "not the stated", 'Tensor["B", "T", "2 * d"]'),
    ('y = Activation(Tensor["B", "T", "d"], recompute_from=["x"])', "E001", "takes no 'recompute_from'",
     "recompute_from"),
    ('z = Activation(Tensor["B", "T", "d"], save=True)', "E001", "names no tensor", "z ="),
    ('h = Activation(Tensor["B", "T", "d"], recompute_group="g")\n'
     '        y = Activation(Tensor["B", "T", "d"], recompute_group="g")', "E001", "two steps",
     'y = Activation(Tensor["B", "T", "d"], recompute_group'),
])
def test_a_wrong_activation_slot_is_reported_at_its_declaration(slot, code, message, at):
    source = textwrap.dedent(SLOTS.replace("{slots}", slot))
    with pytest.raises(DiagnosticError) as err:
        lower_program(parse_python_source(source, "slots.py"), "Norm2", None, DiagnosticSink())
    diagnostic = err.value.diagnostics[0]
    assert diagnostic.code == code and message in diagnostic.message, diagnostic.render()
    assert diagnostic.span.line == where(source, at)[0], diagnostic.render()


def test_in_graph_save_and_mark_recompute_join_the_decorators_lists(tmp_path):
    assert_twins(tmp_path, '''
        from modeldsl.dsl import Param, Tensor, forward, graph, module, save


        @module
        class Norm2:
            def __init__(self, d: int, eps: float = 1e-6):
                pass

            weight = Param(Tensor["d"])

            @save("x")
            @forward
            def forward(self, x: Tensor["B", "T", "d"]) -> Tensor["B", "T", "d"]:
                with graph() as g:
                    h, rstd = g.rmsnorm(x, "weight", eps=self.eps)
                    g.save("rstd")
                    g.mark_recompute("h")
                    out = g.silu(h)
    ''', '''
        module Norm2(d: int, eps: float = 1e-6):
          params:
            weight: [d]
          forward:
            inputs:
              x: [B, T, d]
            out: [B, T, d]
            graph:
              (x, weight) -> rmsnorm(eps=eps) -> (h, rstd)
              h -> silu() -> out
            save: [x, rstd]
            recompute: [h]
    ''', "Norm2")
