"""The CPU schedule executor runs every ``mdsl.sched.gemm`` epilogue and alpha/beta: each against the
numpy formula (PyTorch's tanh GELU and its derivative), on a [2, 4, 6] x [5, 6]^T GEMM with a
batch, and the emulated CUDA executor runs the same program to the same numbers."""

import numpy as np
import pytest

from modeldsl.dialects.sched import EPILOGUES, ProgramOp
from modeldsl.ir import make_context, parse_module
from modeldsl.runtime.cuda_device import EmulatedDevice
from modeldsl.runtime.cuda_executor import CudaExecutor
from modeldsl.runtime.sched_executor import ScheduleExecutor

torch = pytest.importorskip("torch")

SHAPES = {"x": [2, 4, 6], "w": [5, 6], "c": [2, 4, 5], "bias": [5], "aux": [2, 4, 5]}


def buffer_type(shape: list[int]) -> str:
    return f"!mdsl.sched.buffer<[{', '.join(map(str, shape))}], fp32>"


def program_text(epilogue: str, alpha: float, beta: float, transa: bool) -> tuple[str, list[str], list[str]]:
    """One GEMM program: its text, its input buffers and its output buffers, in order."""
    rule = EPILOGUES[epilogue]
    shapes = dict(SHAPES, x=[6, 8] if transa else [2, 4, 6], c=[8, 5] if transa else [2, 4, 5],
                  aux=[8, 5] if transa else [2, 4, 5])
    if rule.bias == "write_m":
        shapes["bias"] = [8] if transa else [4]
    inputs = ["x", "w"] + (["bias"] if rule.bias == "read" else []) + (["aux"] if rule.aux == "read" else []) \
        + (["c"] if beta else [])
    outputs = ["c"] + (["bias"] if rule.bias in ("write_m", "write_n") else []) \
        + (["aux"] if rule.aux == "write" else [])
    lines, offset = [], 0
    for name in ("x", "w", "bias", "aux", "c"):
        roles = [f"input = {inputs.index(name)} : i64"] if name in inputs else []
        roles += [f"output = {outputs.index(name)} : i64"] if name in outputs else []
        nbytes = 4 * int(np.prod(shapes[name]))
        lines.append(f"  %{name} = mdsl.sched.buffer external offset {offset} bytes {nbytes} "
                     f"{{{', '.join(roles)}}} : {buffer_type(shapes[name])}")
        offset += -(-nbytes // 256) * 256
    operands = "%x, %w" + (" bias %bias" if rule.bias else "") + (" aux %aux" if rule.aux else "")
    types = f"{buffer_type(shapes['x'])}, {buffer_type(shapes['w'])}" \
        + (f" bias {buffer_type(shapes['bias'])}" if rule.bias else "") \
        + (f" aux {buffer_type(shapes['aux'])}" if rule.aux else "")
    attrs = [f'epilogue = "{epilogue}"', "transb = true", f"alpha = {alpha} : f64", f"beta = {beta} : f64"]
    attrs += ["transa = true"] if transa else []
    lines.append(f"  mdsl.sched.gemm {operands} -> %c {{{', '.join(attrs)}}} : {types} -> {buffer_type(shapes['c'])}")
    text = (f"mdsl.sched.program @gemm arenas(params = 0, activations = 0, workspace = 0, grads = 0, "
            f"optimizer = 0, external = {offset}) {{\n" + "\n".join(lines) + "\n}\n")
    return text, inputs, outputs


def parsed(text: str) -> ProgramOp:
    module, _ = parse_module(make_context(), text)
    return next(op for op in module.body.block.ops if isinstance(op, ProgramOp))


def gelu_and_grad(pre: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    t = torch.tensor(pre, dtype=torch.float64, requires_grad=True)
    y = torch.nn.functional.gelu(t, approximate="tanh")
    (grad,) = torch.autograd.grad(y.sum(), t)
    return y.detach().numpy(), grad.numpy()


def expected(epilogue: str, values: dict[str, np.ndarray], alpha: float, beta: float, transa: bool) -> dict:
    """What the epilogue leaves in C, the bias and aux: the numpy formula in float64."""
    x, w = values["x"].astype(np.float64), values["w"].astype(np.float64)
    opa = x.T if transa else x
    pre = alpha * opa @ w.T + beta * values.get("c", 0.0)
    if epilogue == "bias" or epilogue.endswith("_bias"):
        pre = pre + values["bias"]
    result = {"aux": pre} if "_aux" in epilogue else {}
    if epilogue.startswith("relu"):
        result["c"] = np.maximum(pre, 0)
    elif epilogue.startswith("gelu"):
        result["c"] = gelu_and_grad(pre)[0]
    elif epilogue.startswith("dgelu"):
        result["c"] = pre * gelu_and_grad(values["aux"])[1]
        if epilogue == "dgelu_bgrad":
            result["bias"] = result["c"].reshape(-1, 5).sum(axis=0)
    else:
        result["c"] = pre
    if epilogue == "bgrada":
        result["bias"] = opa.sum(axis=-1).reshape(-1, opa.shape[-2]).sum(axis=0)
    if epilogue == "bgradb":
        result["bias"] = w.T.sum(axis=0)
    return result


CASES = [(name, 1.0, 0.0, False) for name in EPILOGUES] + [
    ("none", 0.5, 1.0, False), ("gelu_aux_bias", 2.0, 0.5, False), ("bgrada", 1.0, 1.0, True),
    ("bgradb", 1.0, 0.0, True), ("relu_bias", -1.5, 0.0, False)]


@pytest.mark.parametrize("epilogue, alpha, beta, transa", CASES,
                         ids=[f"{c[0]}-a{c[1]}-b{c[2]}{'-TN' if c[3] else ''}" for c in CASES])
def test_cpu_executor_runs_the_epilogue_as_the_formula_says(epilogue, alpha, beta, transa):
    text, inputs, outputs = program_text(epilogue, alpha, beta, transa)
    program = parsed(text)
    rng = np.random.default_rng(7)
    executor = ScheduleExecutor(program)
    values = {name: rng.standard_normal(view.shape).astype(np.float32) for name, view in zip(inputs, executor.inputs)}
    got = dict(zip(outputs, (o.copy() for o in executor.execute(*(values[n] for n in inputs)))))
    want = expected(epilogue, values, alpha, beta, transa)
    assert set(want) == set(got)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-5, err_msg=name)
    emulated = CudaExecutor(parsed(text), device=EmulatedDevice())
    for name, value in zip(outputs, emulated.execute(*(values[n] for n in inputs))):
        np.testing.assert_array_equal(value, got[name], err_msg=f"emulated CUDA: {name}")
