"""``@gradient(mode, scale=S, clip=C)`` (spec 7.8.3) in the derived backward: each derived gradient
(float64, the graph interpreter) equals a torch twin in float64 whose hooks do what the annotation
says: ``scale`` multiplies the gradient flowing back through the value, ``clip`` rescales it to an
L2 norm of at most C (torch's ``clip_grad_norm_`` rule on that tensor alone: a factor
``min(1, C / (norm + 1e-6))``), ``skip`` makes the value a constant of the backward, and
``accumulate`` applies scale and clip to each contribution (each use) before they are summed."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import modeldsl
from modeldsl.passes.autodiff import gradient_function
from modeldsl.runtime.executor import GraphExecutor

D = 4


def clip(g: torch.Tensor, c: float) -> torch.Tensor:
    return g * min(1.0, c / (float(g.norm()) + 1e-6))


def derived(tmp_path, source: str, x: np.ndarray, seed: np.ndarray, weights: dict[str, np.ndarray]):
    """{name: gradient} of ``@forward_grad`` of the module (parameters by name, ``input x``)."""
    (tmp_path / "m.module").write_text(source)
    model = modeldsl.load(tmp_path / "m.module").model
    grad = gradient_function(model)
    executor = GraphExecutor(model, weights, float_dtype=np.float64)
    results = executor.run(grad.sym_name.data, x, seed)
    names = [a.data for a in grad.attributes["grads"].data] + [f"input {a.data}" for a in
                                                                grad.attributes["input_grads"].data]
    return dict(zip(names, results[1:])), grad


def data(*names: str, layers: int | None = None):
    rng = np.random.default_rng(3)
    shape = (D, D) if layers is None else (layers, D, D)
    weights = {n: rng.standard_normal(shape) for n in names}
    return weights, rng.standard_normal((2, D)), rng.standard_normal((2, D))


def twin(weights: dict[str, np.ndarray], x: np.ndarray):
    ws = {k: torch.tensor(v, requires_grad=True) for k, v in weights.items()}
    return ws, torch.tensor(x, requires_grad=True)


def check(got: dict[str, np.ndarray], ws: dict[str, torch.Tensor], xt: torch.Tensor) -> None:
    for name, w in ws.items():
        np.testing.assert_allclose(got[name], w.grad.numpy(), rtol=1e-12, atol=1e-12, err_msg=name)
    np.testing.assert_allclose(got["input x"], xt.grad.numpy(), rtol=1e-12, atol=1e-12)


TWO_LAYERS = """module M(d: int = 4):
  params:
    w: [d, d]
    v: [d, d]{v}
  forward:
    in: x: [2, d, fp32]
    out: [2, d, fp32]
    graph:
      x -> matmul(w, transpose=NT) -> h{h}
      h -> tanh() -> t
      t -> matmul(v, transpose=NT) -> out
"""


@pytest.mark.parametrize("annotation, hook", [
    ("@gradient(scale=0.5)", lambda g: 0.5 * g),
    ("@gradient(scale=-2.0)", lambda g: -2.0 * g),
    ("@gradient(clip=0.05)", lambda g: clip(g, 0.05)),
    ("@gradient(clip=1000.0)", lambda g: g),  # the norm is below C: unchanged
    ("@gradient(scale=3.0, clip=0.1)", lambda g: clip(3.0 * g, 0.1)),
])
def test_scale_and_clip_on_a_flow_value_transform_the_gradient_flowing_back_through_it(tmp_path, annotation, hook):
    weights, x, seed = data("w", "v")
    got, _ = derived(tmp_path, TWO_LAYERS.format(v="", h=f" {annotation}"), x, seed, weights)
    ws, xt = twin(weights, x)
    h = xt @ ws["w"].T
    h.register_hook(hook)
    (torch.tanh(h) @ ws["v"].T).backward(torch.tensor(seed))
    check(got, ws, xt)
    plain, _ = derived(tmp_path, TWO_LAYERS.format(v="", h=""), x, seed, weights)
    np.testing.assert_allclose(got["v"], plain["v"], rtol=1e-12)  # what lies after h is unchanged
    if annotation == "@gradient(scale=0.5)":  # ... and what lies before it halved
        np.testing.assert_allclose(got["w"], 0.5 * plain["w"], rtol=1e-12)


def test_skip_on_a_value_makes_it_a_constant_of_the_backward(tmp_path):
    weights, x, seed = data("w", "v")
    got, grad = derived(tmp_path, TWO_LAYERS.format(v="", h=" @gradient(skip)"), x, seed, weights)
    ws, xt = twin(weights, x)
    (torch.tanh((xt @ ws["w"].T).detach()) @ ws["v"].T).backward(torch.tensor(seed))
    assert ws["w"].grad is None and xt.grad is None  # torch: no gradient reaches w nor x
    assert not np.abs(got["w"]).any() and "input x" not in got  # here: w's is zero, x gets none
    np.testing.assert_allclose(got["v"], ws["v"].grad.numpy(), rtol=1e-12)
    names = {op.name for op in grad.walk()}
    assert "mdsl.graph.tanh_backward" not in names  # nothing of the backward reaches through h


@pytest.mark.parametrize("annotation, hook", [
    ("@gradient(scale=0.5)", lambda g: 0.5 * g),
    ("@gradient(clip=0.2)", lambda g: clip(g, 0.2)),
])
def test_a_parameter_annotation_transforms_that_parameter_gradient(tmp_path, annotation, hook):
    weights, x, seed = data("w", "v")
    got, _ = derived(tmp_path, TWO_LAYERS.format(v=f" {annotation}", h=""), x, seed, weights)
    ws, xt = twin(weights, x)
    ws["v"].register_hook(hook)
    (torch.tanh(xt @ ws["w"].T) @ ws["v"].T).backward(torch.tensor(seed))
    check(got, ws, xt)


def test_skip_on_a_parameter_gives_it_no_gradient(tmp_path):
    weights, x, seed = data("w", "v")
    got, grad = derived(tmp_path, TWO_LAYERS.format(v=" @gradient(skip)", h=""), x, seed, weights)
    assert [a.data for a in grad.attributes["grads"].data] == ["w"]


TIED = """module M(d: int = 4):
  params:
    w: [d, d] {w}
  forward:
    in: x: [2, d, fp32]
    out: [2, d, fp32]
    graph:
      x -> matmul(w, transpose=NT) -> h
      h -> tanh() -> t
      t -> matmul(w, transpose=NT) -> out
"""


@pytest.mark.parametrize("mode", ["compute", "accumulate"])
def test_accumulate_clips_each_use_of_a_parameter_compute_its_total(tmp_path, mode):
    weights, x, seed = data("w")
    got, _ = derived(tmp_path, TIED.format(w=f"@gradient({mode}, clip=0.3)"), x, seed, weights)
    ws, xt = twin(weights, x)
    first, second = ws["w"] * 1.0, ws["w"] * 1.0  # one tensor per use
    if mode == "accumulate":
        first.register_hook(lambda g: clip(g, 0.3))
        second.register_hook(lambda g: clip(g, 0.3))
    else:
        ws["w"].register_hook(lambda g: clip(g, 0.3))
    (torch.tanh(xt @ first.T) @ second.T).backward(torch.tensor(seed))
    check(got, ws, xt)


FAN_OUT = """module M(d: int = 4):
  params:
    w: [d, d]
  forward:
    in: x: [2, d, fp32]
    out: [2, d, fp32]
    graph:
      x -> matmul(w, transpose=NT) -> h @gradient({mode}, clip=0.2)
      h -> tanh() -> t
      (h, t) -> mul() -> out
"""


@pytest.mark.parametrize("mode", ["compute", "accumulate"])
def test_accumulate_on_a_value_clips_the_gradient_of_each_use(tmp_path, mode):
    weights, x, seed = data("w")
    got, _ = derived(tmp_path, FAN_OUT.format(mode=mode), x, seed, weights)
    ws, xt = twin(weights, x)
    h = xt @ ws["w"].T
    if mode == "accumulate":
        a, b = h * 1.0, h * 1.0
        a.register_hook(lambda g: clip(g, 0.2))
        b.register_hook(lambda g: clip(g, 0.2))
    else:
        h.register_hook(lambda g: clip(g, 0.2))
        a = b = h
    (a * torch.tanh(b)).backward(torch.tensor(seed))
    check(got, ws, xt)


def test_one_result_of_a_tuple_skips_as_the_spec_aux_loss_example(tmp_path):
    """Spec 7.8.3: ``in -> router() -> (weights, indices, aux_loss @gradient(skip))``: the aux loss
    is part of the total loss, but no gradient reaches the router through it."""
    source = """module Router(d: int = 4):
  params:
    gate: [d, d]
  forward:
    in: x: [2, d, fp32]
    out: (weights: [2, d, fp32], aux_loss: scalar)
    graph:
      x -> matmul(gate, transpose=NT) -> logits
      logits -> softmax() -> weights
      (logits, logits) -> mul() -> sq
      sq -> reduce_sum(dims=[0, 1]) -> aux_loss

model M(d: int = 4):
  params:
    router: Router(d)
  forward:
    in: x: [2, d, fp32]
    out: (out: [2, d, fp32], aux: scalar)
    graph:
      x -> router() -> (weights, aux_loss @gradient(skip))
      (x, weights) -> mul() -> out
      aux_loss -> scale(factor=0.01) -> aux
"""
    rng = np.random.default_rng(5)
    gate, x, seed = rng.standard_normal((D, D)), rng.standard_normal((2, D)), rng.standard_normal((2, D))
    (tmp_path / "m.module").write_text(source)
    model = modeldsl.load(tmp_path / "m.module").model
    grad = gradient_function(model)
    executor = GraphExecutor(model, {"router.gate": gate}, float_dtype=np.float64)
    results = executor.run(grad.sym_name.data, x, seed, np.array(1.0))
    g, xt = torch.tensor(gate, requires_grad=True), torch.tensor(x, requires_grad=True)
    logits = xt @ g.T
    aux = 0.01 * (logits.detach() * logits.detach()).sum()
    ((xt * torch.softmax(logits, -1)) * torch.tensor(seed)).sum().add(aux).backward()
    np.testing.assert_allclose(results[0], (xt * torch.softmax(logits, -1)).detach().numpy(), rtol=1e-12)
    np.testing.assert_allclose(results[2], g.grad.numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(results[3], xt.grad.numpy(), rtol=1e-12, atol=1e-12)


STACKED = """block Blk(d: int = 4):
  params:
    w: [d, d] @gradient(clip=0.3)
  forward:
    in: x: [2, d, fp32]
    out: [2, d, fp32]
    graph:
      x -> matmul(w, transpose=NT) -> h @gradient(scale=0.5)
      h -> tanh() -> t
      (x, t) -> add() -> out

model M(d: int = 4, n: int = 3):
  params:
    blocks: [n] x Blk(d)
  forward:
    in: x: [2, d, fp32]
    out: [2, d, fp32]
    graph:
      x -> blocks -> out
"""


@pytest.mark.parametrize("loop", [True, False])
def test_in_a_stack_each_layer_has_its_own_scale_and_clip(tmp_path, loop):
    """A stacked block's parameter is one tensor per layer: ``@gradient(clip)`` clips each layer's
    gradient, in the looped backward (inside ``@blocks_bwd``) and unrolled."""
    weights, x, seed = data("blocks.w", layers=3)
    (tmp_path / "m.module").write_text(STACKED)
    model = modeldsl.load(tmp_path / "m.module").model
    grad = gradient_function(model, loop=loop)
    assert any(op.name == "mdsl.graph.clip_norm" for op in model.walk())
    executor = GraphExecutor(model, weights, float_dtype=np.float64)
    results = executor.run(grad.sym_name.data, x, seed)
    layers = [torch.tensor(w, requires_grad=True) for w in weights["blocks.w"]]
    xt = torch.tensor(x, requires_grad=True)
    h = xt
    for w in layers:
        w.register_hook(lambda g: clip(g, 0.3))
        pre = h @ w.T
        pre.register_hook(lambda g: 0.5 * g)
        h = h + torch.tanh(pre)
    h.backward(torch.tensor(seed))
    np.testing.assert_allclose(results[1], np.stack([w.grad.numpy() for w in layers]), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(results[2], xt.grad.numpy(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("device", ["cpu", "emulated"])
def test_the_schedule_runs_the_clipped_gradient_as_the_graph_interpreter(tmp_path, device):
    """Lowered (global_norm, clip_factor, mul inside the reverse layer loop), the CPU executor and
    the CUDA executor on the emulated device give the graph interpreter's gradients (fp32)."""
    from xdsl.context import Context

    from modeldsl.passes.lower_to_sched import lower_function
    from modeldsl.passes.plan_memory import PlanMemoryPass
    from modeldsl.runtime.sched_executor import run_program

    weights, x, seed = data("blocks.w", layers=3)
    weights = {k: v.astype(np.float32) for k, v in weights.items()}
    x, seed = x.astype(np.float32), seed.astype(np.float32)
    (tmp_path / "m.module").write_text(STACKED)
    model = modeldsl.load(tmp_path / "m.module").model
    grad = gradient_function(model)
    expected = GraphExecutor(model, weights, float_dtype=np.float32).run(grad.sym_name.data, x, seed)
    program = lower_function(model, grad.sym_name.data, "fp32")
    model.parent_op().body.block.add_op(program)
    PlanMemoryPass().apply(Context(), model.parent_op())
    kernels = [op.kernel.data for op in program.walk() if op.name == "mdsl.sched.launch"]
    assert kernels.count("global_norm") == kernels.count("clip_factor") == 1  # once, in the loop body
    if device == "cpu":
        got = run_program(program, weights, [x, seed])
    else:
        from modeldsl.runtime.cuda_device import EmulatedDevice
        from modeldsl.runtime.cuda_executor import CudaExecutor

        executor = CudaExecutor(program, weights, device=EmulatedDevice())
        assert executor.fallbacks == []
        got = [np.array(o) for o in executor.execute(x, seed)]
    for name, a, b in zip(["out", "d_blocks.w", "d_x"], got, expected):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=name)


INPUTS = """block Blk(d: int = 4):
  params:
    w: [d, d]
  forward:
    in: x: [2, d, fp32] @gradient(scale=0.5)
    out: [2, d, fp32]
    graph:
      x -> matmul(w, transpose=NT) -> h
      h -> tanh() -> out

model M(d: int = 4, n: int = 2):
  params:
    blocks: [n] x Blk(d)
  forward:
    in: (x: [2, d, fp32], m: [2, d, fp32] @gradient(skip))
    out: [2, d, fp32]
    graph:
      x -> blocks -> y
      (y, m) -> mul() -> out
"""


@pytest.mark.parametrize("loop", [True, False])
def test_an_input_annotation_applies_to_its_gradient_in_each_layer(tmp_path, loop):
    """``in: mask @gradient(skip)`` (spec 5.12.2): no gradient for that input; a block's ``in: x
    @gradient(scale=0.5)``: the gradient reaching each layer's input is halved."""
    weights, x, seed = data("blocks.w", layers=2)
    m = np.random.default_rng(9).standard_normal((2, D))
    (tmp_path / "m.module").write_text(INPUTS)
    model = modeldsl.load(tmp_path / "m.module").model
    grad = gradient_function(model, loop=loop)
    assert [a.data for a in grad.attributes["input_grads"].data] == ["x"]
    results = GraphExecutor(model, weights, float_dtype=np.float64).run(grad.sym_name.data, x, m, seed)
    layers = [torch.tensor(w, requires_grad=True) for w in weights["blocks.w"]]
    xt = torch.tensor(x, requires_grad=True)
    h = xt
    for w in layers:
        h = h * 1.0
        h.register_hook(lambda g: 0.5 * g)
        h = torch.tanh(h @ w.T)
    (h * torch.tensor(m)).backward(torch.tensor(seed))
    np.testing.assert_allclose(results[1], np.stack([w.grad.numpy() for w in layers]), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(results[2], xt.grad.numpy(), rtol=1e-12, atol=1e-12)


WRITTEN = """module ScaledLinear(i: int = 4, o: int = 3):
  params:
    weight: [o, i]
  forward:
    in: [2, i, fp32]
    out: [2, o, fp32]
    graph:
      in -> matmul(weight, transpose=NT) -> out
    save: [in]
  backward:
    d_out: [2, o, fp32]
    d_in: [2, i, fp32]
    graph:
      d_out -> matmul(weight, transpose=NN) -> d_in{annotation}
      (d_out, saved.in) -> matmul(transpose=TN, accumulate=true) -> d_weight
"""


def test_the_spec_scaled_gradient_of_a_written_backward(tmp_path):
    """Spec 7.8.3's ``d_out -> Linear_backward() -> d_in @gradient(scale=0.1)``: in a written backward
    the gradient the flow names is scaled (and clipped), the others are as written."""
    rng = np.random.default_rng(2)
    weight, d_out, x = rng.standard_normal((3, 4)), rng.standard_normal((2, 3)), rng.standard_normal((2, 4))
    grads = {}
    for name, annotation in (("plain", ""), ("scaled", " @gradient(scale=0.1)"),
                             ("clipped", " @gradient(scale=0.1, clip=0.01)")):
        (tmp_path / f"{name}.module").write_text(WRITTEN.format(annotation=annotation))
        model = modeldsl.load(tmp_path / f"{name}.module").model
        grads[name] = GraphExecutor(model, {"weight": weight}, float_dtype=np.float64).run("backward", d_out, x)
    np.testing.assert_allclose(grads["scaled"][0], 0.1 * grads["plain"][0], rtol=1e-12)
    np.testing.assert_allclose(grads["scaled"][1], grads["plain"][1], rtol=1e-12)
    expected = torch.tensor(0.1 * grads["plain"][0])
    np.testing.assert_allclose(grads["clipped"][0], clip(expected, 0.01).numpy(), rtol=1e-12)
