"""User primitives (modeldsl.register_primitive, modeldsl/prims/user.py): a numpy function with its
VJP registered as a primitive is called from the text and the Python DSL (by name, through
``g.custom`` and through a ``primitive`` declaration whose ``impl:`` names it), runs forward on the
CPU executor as numpy computes it, differentiates as float64 finite differences say, trains, and
runs on the emulated CUDA device through the host fallback (warned). Without a VJP a gradient that
reaches it is E005 at the call; an ``impl:`` naming nothing registered is E014 with the closest
name; a call whose shapes its rule refuses is E004 at the call."""

from __future__ import annotations

import textwrap
import warnings

import numpy as np
import pytest

import modeldsl
from modeldsl.diagnostics import DiagnosticError
from modeldsl.dialects.graph import CustomOp, ModelOp
from modeldsl.flops import graph_op_flops
from modeldsl.ir import make_context, parse_module, print_ir
from modeldsl.primitives import lookup_primitive
from modeldsl.prims import by_name
from modeldsl.runtime import cuda_commands
from modeldsl.runtime.cuda_commands import FallbackWarning
from modeldsl.runtime.optim import AdamWConfig
from modeldsl.runtime.train import Trainer
from modeldsl.verify_backward import random_inputs, random_weights, report, verify_backward

BETA = 2.0


def softplus(x, *, beta: float = 1.0):
    return np.logaddexp(0.0, beta * x) / beta


def softplus_vjp(d_out, x, out, *, beta: float = 1.0):
    return d_out / (1.0 + np.exp(-beta * x))


def swish_beta(x, *, beta: float = 1.0):
    return x / (1.0 + np.exp(-beta * x))


def gated(x, gate):
    """x * sigmoid(gate): two inputs of one shape."""
    return x / (1.0 + np.exp(-gate))


def gated_vjp(d_out, x, gate, out):
    s = 1.0 / (1.0 + np.exp(-gate))
    return d_out * s, d_out * x * s * (1.0 - s)


def gated_shape(x, gate):
    if x.shape != gate.shape:
        raise ValueError(f"x [{', '.join(map(str, x.shape))}] and gate [{', '.join(map(str, gate.shape))}] differ")
    return x


@pytest.fixture(autouse=True)
def registered():
    modeldsl.register_primitive("softplus", softplus, vjp=softplus_vjp, flops=4)
    modeldsl.register_primitive("swish_beta", swish_beta)
    modeldsl.register_primitive("gated", gated, vjp=gated_vjp, shape=gated_shape)
    yield
    for name in ("softplus", "swish_beta", "gated"):
        modeldsl.unregister_primitive(name)


TEXT = """\
model M(vocab: int = 16, d: int = 8):
  params:
    embedding: [vocab, d]
    head: [vocab, d]
  forward:
    in: tokens: [B, T, int32]
    out: [B, T, vocab]
    graph:
      (tokens, embedding) -> embedding() -> x
      x -> {step} -> h
      h -> matmul(head, transpose=NT) -> out
"""

DECLARED = """\
primitive smooth:
  \"\"\"softplus, the registered Python function\"\"\"
  params:
    beta: float = 1.0
  forward:
    in: x: [*]
    out: [*]
  backward:
    in: (d_out, x, out)
    out: d_x
  impl:
    forward: {impl}

"""

PYTHON = '''\
from modeldsl.dsl import Param, Tensor, forward, graph, model, primitive


@primitive(impl="softplus")
def smooth(x: Tensor["*"], *, beta: float = 1.0) -> Tensor["*"]:
    """softplus, the registered Python function."""


@model
class M:
    def __init__(self, vocab: int = 16, d: int = 8):
        pass

    embedding = Param(Tensor["vocab", "d"])
    head = Param(Tensor["vocab", "d"])

    @forward
    def forward(self, tokens: Tensor["B", "T", "int32"]) -> Tensor["B", "T", "vocab"]:
        with graph() as g:
            x = g.embedding(tokens, "embedding")
            h = g.custom("softplus", x, beta=2.0)
            s = g.smooth(h, beta=0.5)
            out = g.matmul(s, "head", transpose="NT")
            return out
'''

TOKENS = np.array([[3, 1, 4, 1, 5], [9, 2, 6, 5, 3]])


def load_text(tmp_path, text: str, name: str = "m.module", **options):
    (tmp_path / name).write_text(text)
    return modeldsl.load(tmp_path / name, **options)


def numpy_logits(model, hidden) -> np.ndarray:
    x = model.weights["embedding"].astype(np.float64)[TOKENS]
    return hidden(x) @ model.weights["head"].astype(np.float64).T


def test_a_text_model_calls_the_registered_primitive_and_the_cpu_executor_runs_its_reference(tmp_path):
    model = load_text(tmp_path, TEXT.format(step=f"softplus(beta={BETA})"))
    ir = print_ir(model.module)
    assert 'mdsl.graph.custom "softplus"(%x) {beta = 2.000000e+00 : f64}' in ir
    np.testing.assert_allclose(model.forward(TOKENS), numpy_logits(model, lambda x: softplus(x, beta=BETA)),
                               rtol=1e-5, atol=1e-6)


def test_a_declaration_with_impl_binds_its_name_to_the_registration(tmp_path):
    model = load_text(tmp_path, DECLARED.format(impl="softplus") + TEXT.format(step="smooth(beta=3.0)"))
    assert 'mdsl.graph.custom "softplus"(%x) {beta = 3.000000e+00 : f64}' in print_ir(model.module)
    np.testing.assert_allclose(model.forward(TOKENS), numpy_logits(model, lambda x: softplus(x, beta=3.0)),
                               rtol=1e-5, atol=1e-6)
    # impl: may name the reference as module.function too
    qualified = f"{softplus.__module__}.softplus"
    model = load_text(tmp_path, DECLARED.format(impl=qualified) + TEXT.format(step="smooth()"), "q.module")
    assert 'mdsl.graph.custom "softplus"' in print_ir(model.module)


def test_a_python_dsl_model_emits_it_through_g_custom_and_a_primitive_declaration(tmp_path):
    (tmp_path / "m.py").write_text(PYTHON)
    model = modeldsl.load(tmp_path / "m.py")
    calls = [op for op in model.module.walk() if isinstance(op, CustomOp)]
    assert [(op.primitive, op.attributes["beta"].value.data) for op in calls] == [("softplus", 2.0), ("softplus", 0.5)]
    np.testing.assert_allclose(
        model.forward(TOKENS), numpy_logits(model, lambda x: softplus(softplus(x, beta=2.0), beta=0.5)),
        rtol=1e-5, atol=1e-6)


def test_the_vjp_agrees_with_float64_finite_differences(tmp_path):
    source = textwrap.dedent("""\
        model G(d: int = 6):
          params:
            w: [d, d]
            v: [d, d]
          forward:
            in: x: [B, d]
            out: [B, d]
            graph:
              x -> matmul(w, transpose=NT) -> a
              x -> matmul(v, transpose=NT) -> g
              a -> softplus(beta=2.0) -> s
              (s, g) -> gated() -> out
        """)
    model = load_text(tmp_path, source, "g.module").model
    checks = verify_backward(model, random_weights(model), random_inputs(model, sizes={"B": 3}))
    text, ok = report(checks, 1e-6)
    assert ok and {c.name for c in checks} == {"w", "v", "input x"}, text


def test_a_wrong_vjp_is_caught_by_the_finite_differences():
    modeldsl.register_primitive("softplus", softplus, vjp=lambda d_out, x, out, beta=1.0: 2 * d_out)
    t = "!mdsl.graph.tensor<[3, 4], fp32>"
    module, _ = parse_module(make_context(), f"""mdsl.graph.model @m config {{}} {{
  mdsl.graph.func @forward(%x: {t}) -> ({t}) attributes {{kind = "forward"}} {{
    %y = mdsl.graph.custom "softplus"(%x) {{beta = 1.0 : f64}} : ({t}) -> {t}
    mdsl.graph.return %y : {t}
  }}
}}""")
    model = next(op for op in module.walk() if isinstance(op, ModelOp))
    _, ok = report(verify_backward(model, {}, [np.random.default_rng(0).standard_normal((3, 4))]), 1e-6)
    assert not ok


def test_a_training_step_moves_the_parameters_and_lowers_the_loss(tmp_path):
    model = load_text(tmp_path, TEXT.format(step=f"softplus(beta={BETA})"))
    before = {k: np.array(v) for k, v in model.weights.items()}
    trainer = Trainer(model, AdamWConfig(lr=3e-2))
    labels = np.full_like(TOKENS, -100)
    labels[:, :-1] = TOKENS[:, 1:]
    losses = [trainer.train_step([(TOKENS, labels)]) for _ in range(4)]
    assert losses[-1] < losses[0]
    assert all(np.abs(model.weights[k] - before[k]).max() > 1e-3 for k in before)


def test_a_primitive_without_vjp_in_training_is_e005_at_the_call(tmp_path):
    text = TEXT.format(step="swish_beta()")
    model = load_text(tmp_path, text)
    assert model.forward(TOKENS).shape[-1] == 16  # inference needs no gradient
    trainer = Trainer(model, AdamWConfig(lr=1e-2))
    with pytest.raises(DiagnosticError) as err:
        trainer.train_step([(TOKENS, TOKENS)])
    (diagnostic,) = err.value.diagnostics
    line = next(i for i, t in enumerate(text.splitlines(), 1) if "swish_beta" in t)
    assert diagnostic.code == "E005" and "swish_beta was registered without vjp=" in diagnostic.message
    assert (diagnostic.span.line, diagnostic.span.column) == (line, text.splitlines()[line - 1].index("swish") + 1)


def test_an_impl_naming_nothing_registered_is_e014_with_the_closest_name(tmp_path):
    text = DECLARED.format(impl="sofplus") + TEXT.format(step="smooth()")
    with pytest.raises(DiagnosticError) as err:
        load_text(tmp_path, text)
    (diagnostic,) = err.value.diagnostics
    assert diagnostic.code == "E014" and "'sofplus'" in diagnostic.message
    assert "did you mean 'softplus'?" in diagnostic.hint
    assert diagnostic.span.line == next(i for i, t in enumerate(text.splitlines(), 1) if "sofplus" in t)


def test_a_declaration_disagreeing_with_the_registration_is_e003(tmp_path):
    text = DECLARED.format(impl="softplus").replace("beta: float = 1.0", "beta: float = 3.0") + \
        TEXT.format(step="smooth()")
    with pytest.raises(DiagnosticError) as err:
        load_text(tmp_path, text)
    assert [d.code for d in err.value.diagnostics] == ["E003"]
    assert "defaults to 3.0 here but to 1.0" in err.value.diagnostics[0].message


def test_shapes_the_rule_refuses_are_e004_at_the_call(tmp_path):
    text = TEXT.format(step="gated(head)")  # x: [B, T, 8] and head: [16, 8]
    with pytest.raises(DiagnosticError) as err:
        load_text(tmp_path, text)
    (diagnostic,) = err.value.diagnostics
    assert diagnostic.code == "E004" and "x [B, T, d] and gate [vocab, d] differ" in diagnostic.message
    assert diagnostic.span.line == next(i for i, t in enumerate(text.splitlines(), 1) if "gated" in t)


def test_a_reference_that_breaks_its_shape_rule_is_e004_when_it_runs(tmp_path):
    modeldsl.register_primitive("swish_beta", lambda x, *, beta=1.0: x[..., :-1])
    model = load_text(tmp_path, TEXT.format(step="swish_beta()"))
    with pytest.raises(DiagnosticError, match=r"returned output 0 of shape \(2, (\d+), 7\); its shape rule gives "
                                              r"\(2, \1, 8\)") as err:
        model.forward(TOKENS)
    assert err.value.diagnostics[0].code == "E004"


def test_every_table_sees_the_registration():
    sig, backward = lookup_primitive("softplus"), lookup_primitive("softplus_backward")
    assert [s.name for s in sig.inputs] == ["x"] and [(p.name, p.kind, p.default) for p in sig.params] == [
        ("beta", "float", 1.0)]
    assert [s.name for s in backward.inputs] == ["d_out", "x", "out"] and [s.name for s in backward.outputs] == ["d_x"]
    record = by_name()["softplus"]
    assert record.vjp is not None and record.cuda == "host" and by_name()["swish_beta"].no_vjp
    from modeldsl.kernels.registry import entry

    np.testing.assert_allclose(entry("softplus").reference(np.array([0.0, 1.0]), beta=2.0),
                               softplus(np.array([0.0, 1.0]), beta=2.0))
    t = "!mdsl.graph.tensor<[3, 4], fp32>"
    module, _ = parse_module(make_context(), f"""mdsl.graph.model @m {{
  mdsl.graph.func @f(%x: {t}) -> {t} {{
    %y = mdsl.graph.custom "softplus"(%x) {{beta = 1.0 : f64}} : ({t}) -> {t}
    %z = mdsl.graph.custom "swish_beta"(%y) {{beta = 1.0 : f64}} : ({t}) -> {t}
    mdsl.graph.return %z : {t}
  }}
}}""")
    y, z = [op for op in module.walk() if isinstance(op, CustomOp)]
    assert (graph_op_flops(y), graph_op_flops(z)) == (4 * 12, 0)
    modeldsl.unregister_primitive("softplus")
    assert lookup_primitive("softplus") is None and lookup_primitive("softplus_backward") is None
    assert "softplus" not in by_name()


def test_registrations_that_cannot_work_are_refused():
    with pytest.raises(ValueError, match="'matmul' is a built-in primitive"):
        modeldsl.register_primitive("matmul", softplus)
    with pytest.raises(ValueError, match="'adamw' is a built-in primitive or kernel"):
        modeldsl.register_primitive("adamw", softplus)
    with pytest.raises(TypeError, match="parameter 'mode' needs a kind"):
        modeldsl.register_primitive("odd", lambda x, *, mode: x)
    with pytest.raises(TypeError, match=r"no \*xs"):
        modeldsl.register_primitive("odd", lambda *xs: xs[0])
    with pytest.raises(ValueError, match="not a primitive name"):
        modeldsl.register_primitive("two words", softplus)


def test_the_emulated_cuda_device_runs_the_reference_on_host_copies_and_warns(tmp_path, monkeypatch):
    monkeypatch.setenv("MDSL_CPU_JIT", "0")
    monkeypatch.setattr(cuda_commands, "_WARNED", set())
    text = TEXT.format(step=f"softplus(beta={BETA})")
    cpu = load_text(tmp_path, text)
    emulated = load_text(tmp_path, text, device="emulated")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        logits = emulated.forward(TOKENS)
    fallbacks = [str(w.message) for w in caught if issubclass(w.category, FallbackWarning)]
    assert fallbacks == ["'softplus' runs through its numpy reference on host copies: 'softplus' is a user "
                         "primitive without a CUDA kernel"]
    np.testing.assert_array_equal(logits, cpu.forward(TOKENS))
