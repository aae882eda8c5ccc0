"""mdsl-recompute changes memory, never results: the gradients of a training step on the CPU
schedule executor are bitwise those of recompute off, for the std Llama, Qwen3 and Mistral models
on tiny transformers checkpoints, in every mode (annotated, full, auto at two budgets); and the
saved activations shrink as the mode says."""

from pathlib import Path

import numpy as np
import pytest
from hf_checkpoints import cached_checkpoint
from training_steps import BATCH, FAMILIES, TOKENS, step_gradients

import modeldsl
from modeldsl.diagnostics import DiagnosticError
from modeldsl.dialects.sched import LayerLoopOp, RecomputeSegmentOp
from modeldsl.resolve.imports import STD_ROOT
from modeldsl.runtime.executor import ExecutionError
from modeldsl.runtime.train import compile_training_step, recompute_options

pytest.importorskip("transformers")

MODES = ["annotated", "full", "auto:2000", "auto:6000"]


def step(model, mode: str) -> tuple[float, np.ndarray, object]:
    """(loss, the grads arena, the program) of one fp32 training step in recompute ``mode``."""
    program = compile_training_step(model.model, BATCH, TOKENS, recompute=mode)
    return (*step_gradients(model, program), program)


def saved_bytes(program) -> int:
    return sum(op.result.type.nbytes for op in program.body.block.ops if "saved" in op.attributes)


def segments(program) -> int:
    return sum(isinstance(op, RecomputeSegmentOp) for op in program.walk())


@pytest.mark.parametrize("arch, module, config", FAMILIES, ids=[f[0] for f in FAMILIES])
def test_gradients_with_recompute_are_bitwise_those_without(arch, module, config, capsys):
    model = modeldsl.load(STD_ROOT / "models" / module, hf=cached_checkpoint(arch, **config), dtype="fp32")
    loss, grads, none = step(model, "none")
    assert np.abs(grads.view(np.float32)).max() > 0
    saved = {"none": saved_bytes(none)}
    for mode in MODES:
        mode_loss, mode_grads, program = step(model, mode)
        assert mode_loss == loss, mode
        assert np.array_equal(mode_grads, grads), f"{arch}: gradients differ with recompute={mode}"
        assert segments(program) > 0, mode
        saved[mode] = saved_bytes(program)
    assert saved["full"] < saved["annotated"] < saved["none"]
    assert saved["auto:2000"] <= saved["auto:6000"] <= saved["none"]
    assert "automatic mode, 1.95 KiB for saved activations" in capsys.readouterr().err
    assert segments(none) == 0 or all(  # none keeps only a written backward's own recompute: section
        op.segment.data in ("gate_up", "gate", "hidden") for op in none.walk() if isinstance(op, RecomputeSegmentOp))


def test_the_training_step_is_one_loop_each_way_whatever_the_depth():
    shallow = modeldsl.load(STD_ROOT / "models" / "llama.module", hf=cached_checkpoint("llama"), dtype="fp32")
    deep = modeldsl.load(STD_ROOT / "models" / "llama.module",
                         hf=cached_checkpoint("llama", num_hidden_layers=6), dtype="fp32")
    programs = [compile_training_step(m.model, BATCH, TOKENS) for m in (shallow, deep)]
    ops = [sum(1 for _ in p.walk()) for p in programs]
    assert ops[0] == ops[1]  # the IR does not grow with depth
    loops = [op for op in programs[1].body.block.ops if isinstance(op, LayerLoopOp)]
    assert [(op.upper.value.data, op.reverse is not None) for op in loops] == [(6, False), (6, True)]


def test_recompute_spellings():
    assert recompute_options("full") == {"mode": "full"}
    assert recompute_options("auto") == {"budget": "auto"}
    assert recompute_options("auto:2GiB") == {"budget": "2GiB"}
    with pytest.raises(ExecutionError, match="only auto takes a budget"):
        recompute_options("full:2GiB")
    model = modeldsl.load(STD_ROOT / "models" / "llama.module", hf=cached_checkpoint("llama"), dtype="fp32")
    with pytest.raises(DiagnosticError, match="mode=sometimes is not one of none, annotated, full, auto"):
        compile_training_step(model.model, 1, 4, recompute="sometimes")
    with pytest.raises(DiagnosticError, match="budget=lots is no byte count"):
        compile_training_step(model.model, 1, 4, recompute="auto:lots")


def test_the_automatic_mode_needs_concrete_shapes(capsys):
    from modeldsl.tools.opt import main

    assert main([str(STD_ROOT / "models" / "llama.module"), "-p", "mdsl-autodiff,mdsl-recompute{budget=1GiB}"]) == 1
    err = capsys.readouterr().err
    assert "error[E029]: mdsl-recompute: the automatic mode weighs bytes and FLOPs of concrete shapes" in err
    assert "internal error" not in err
    # the annotated and full modes need none: they read no sizes
    assert main([str(STD_ROOT / "models" / "llama.module"), "-p", "mdsl-autodiff,mdsl-recompute{mode=full}"]) == 0


LORA = dict(r=4, lora_alpha=8, target_modules="all-linear")


def adapted(model) -> None:
    """Nonzero lora_B (they start at zero), so that the adapters' path changes the gradients."""
    rng = np.random.default_rng(1)
    for param in model.model.params():
        if param.is_adapter and param.attributes["adapter"].data["role"].data == "B":
            name = param.sym_name.data
            np.copyto(model.weights[name], rng.standard_normal(model.weights[name].shape) * 0.1, casting="unsafe")


def adapter_gradients(grads: np.ndarray, model, program) -> int:
    """How many gradient elements are nonzero: only the adapters have a gradient slot."""
    from modeldsl.runtime.sched_executor import tagged_layout

    layout = tagged_layout(program, "grad")
    assert layout and all(".lora_" in name for name in layout), sorted(layout)[:3]
    return int(np.count_nonzero(grads))


@pytest.mark.parametrize("arch, module, config", FAMILIES[:2], ids=[f[0] for f in FAMILIES[:2]])
def test_gradients_of_adapters_with_recompute_are_bitwise_those_without(arch, module, config, capsys):
    model = modeldsl.load(STD_ROOT / "models" / module, hf=cached_checkpoint(arch, **config), dtype="fp32",
                          lora=LORA)
    adapted(model)
    loss, grads, none = step(model, "none")
    assert adapter_gradients(grads, model, none) > 0
    for mode in MODES:
        mode_loss, mode_grads, program = step(model, mode)
        assert mode_loss == loss, mode
        assert np.array_equal(mode_grads, grads), f"{arch}: adapter gradients differ with recompute={mode}"
        assert segments(program) > 0, mode


def lora_only_llama(folder: Path) -> Path:
    """The std Llama whose MLP marks its gate/up projection ``@memory(recompute, policy=lora_only)``
    (its written backward left out): local copies of the model, its block and its MLP."""
    std = STD_ROOT
    mlp = (std / "modules" / "mlp.module").read_text()
    plain = "        in -> matmul(up_weight, transpose=NT) -> gate_up\n"
    assert mlp.count(plain) == 1
    mlp = mlp.replace(plain, plain.rstrip("\n") + " @memory(recompute, policy=lora_only)\n")
    start = mlp.index("  backward:\n")
    mlp = mlp[:start] + mlp[mlp.index("\nmodule ", start) + 1:]  # the gradient derived, not written
    block = (std / "blocks" / "dense.module").read_text().replace("from std.modules.mlp import", "from mlp import")
    model = (std / "models" / "llama.module").read_text().replace("from std.blocks.dense import",
                                                                  "from lora_block import")
    for name, text in (("mlp", mlp), ("lora_block", block), ("llama", model)):
        (folder / f"{name}.module").write_text(text)
    return folder / "llama.module"


def replayed_gemms(program) -> dict[str, int]:
    """The GEMMs each recompute segment replays, by segment."""
    from modeldsl.dialects.sched import GemmOp

    return {op.segment.data: sum(isinstance(inner, GemmOp) for inner in op.body.block.ops)
            for op in program.walk() if isinstance(op, RecomputeSegmentOp)}


def test_lora_only_recomputes_the_adapted_projection_and_reapplies_its_adapters(tmp_path):
    """``policy=lora_only``: while adapters train, the gate/up projection is recomputed, its base GEMM
    and its two adapter GEMMs (bitwise the gradients of saving it); in a full fine-tune it stays saved
    (the MLP's segment replays the SwiGLU alone)."""
    source = lora_only_llama(tmp_path)
    path = cached_checkpoint("llama")
    full = modeldsl.load(source, hf=path, dtype="fp32")
    assert replayed_gemms(compile_training_step(full.model, BATCH, TOKENS))["hidden"] == 0
    model = modeldsl.load(source, hf=path, dtype="fp32", lora=LORA)
    adapted(model)
    loss, grads, _ = step(model, "none")
    lora_loss, lora_grads, program = step(model, "annotated")
    assert replayed_gemms(program)["hidden"] == 3, replayed_gemms(program)
    assert lora_loss == loss
    assert np.array_equal(lora_grads, grads)
