"""The training section of the memory report: params, grads, the computed AdamW
state, saved and transient activations, workspace, total and recompute FLOPs,
on a hand-written planned step and on the compiled training step of the tiny
Llama."""

from __future__ import annotations

import re

import pytest

from modeldsl.dialects.sched import ProgramOp, RecomputeSegmentOp
from modeldsl.flops import ProgramFlops, program_flops
from modeldsl.ir import make_context, parse_module, verify_module
from modeldsl.memory_report import (
    GIB,
    NotPlanned,
    format_report,
    memory_report,
    program_memory,
    program_report,
    training_memory,
)

# params: a trainable bf16 stack (moments and an fp32 master), a trainable fp32 norm
# (moments only) and a frozen bf16 table (nothing); the saved stack is also seen through
# a saved alias (counted once); a saved input in `external` is no activation.
STEP = """
!x = !mdsl.sched.buffer<[2, 16], bf16>
!h = !mdsl.sched.buffer<[2, 32], bf16>
!w = !mdsl.sched.buffer<[32, 16], bf16>
!sw = !mdsl.sched.buffer<[3, 32, 16], bf16>
!sh = !mdsl.sched.buffer<[3, 2, 32], bf16>
mdsl.sched.program @step arenas(params = 5312, activations = ACTIVATIONS, workspace = 64, grads = 6336,
    optimizer = 0, external = 64) {
  %w = mdsl.sched.buffer params offset 0 bytes 3072 {param = "w"} : !sw
  %norm = mdsl.sched.buffer params offset 3072 bytes 192 {param = "norm"} : !mdsl.sched.buffer<[3, 16], fp32>
  %frozen = mdsl.sched.buffer params offset 3264 bytes 2048 {param = "frozen"} : !mdsl.sched.buffer<[64, 16], bf16>
  %dw = mdsl.sched.buffer grads offset 0 bytes 6144 {grad = "w"} : !mdsl.sched.buffer<[3, 32, 16], fp32>
  %dnorm = mdsl.sched.buffer grads offset 6144 bytes 192 {grad = "norm"} : !mdsl.sched.buffer<[3, 16], fp32>
  %in = mdsl.sched.buffer external offset 0 bytes 64 {saved} : !x
  %x = mdsl.sched.buffer activations offset 0 bytes 64 : !x
  %hs = mdsl.sched.buffer activations offset 64 bytes 384 {saved} : !sh
  %last = mdsl.sched.buffer activations offset 256 bytes 128 alias_of %hs {saved} : !h from !sh
  %h = mdsl.sched.buffer activations offset 448 bytes 128 : !h
  %t = mdsl.sched.buffer activations offset 576 bytes 128 : !h
  %ws = mdsl.sched.buffer workspace offset 0 bytes 64 : !mdsl.sched.buffer<[64], int8>
  mdsl.sched.copy %in -> %x : !x -> !x
  mdsl.sched.layer_loop %l = 0 to 3 {
    %wl = mdsl.sched.layer_view %w[%l] : !sw -> !w
    %hl = mdsl.sched.layer_view %hs[%l] : !sh -> !h
    mdsl.sched.gemm %x, %wl -> %hl {transb = true} : !x, !w -> !h
  }
  mdsl.sched.layer_loop %l = 0 to 3 reverse {
    %wl = mdsl.sched.layer_view %w[%l] : !sw -> !w
    mdsl.sched.recompute_segment "h" layer(%l) {
      mdsl.sched.gemm %x, %wl -> %h {transb = true} : !x, !w -> !h
    }
    mdsl.sched.launch "silu"(%h) -> (%t) : (!h) -> (!h)
  }
}
"""

GEMM = 2 * 2 * 32 * 16  # [2, 16] @ [32, 16]^T
SILU = 4 * 2 * 32
EXPECTED = {
    "params": 5312,
    "grads": 6336,
    # 2 fp32 moments of 3*32*16 + 3*16 trainable values, an fp32 master of the bf16 w
    "optimizer": 2 * 4 * (1536 + 48) + 4 * 1536,
    "saved": 384,
    "transient": 704 - 384,
    "workspace": 64,
}


def parse_step(activations: int = 704, verify: bool = True) -> ProgramOp:
    module, _ = parse_module(make_context(), STEP.replace("ACTIVATIONS", str(activations)))
    if verify:
        assert verify_module(module) == []
    (program,) = [op for op in module.walk() if isinstance(op, ProgramOp)]
    return program


def test_breakdown_of_a_hand_written_step():
    memory = training_memory(parse_step())
    assert {name: getattr(memory, name) for name in EXPECTED} == EXPECTED
    assert memory.trainable_parameters == 1536 + 48
    assert memory.total == sum(EXPECTED.values())
    assert memory.optimizer_arena == 0
    assert memory.flops == ProgramFlops(total=3 * GEMM + 3 * (GEMM + SILU), recompute=3 * GEMM)


def size_line(text: str, label: str) -> tuple[float, int]:
    match = re.search(rf"^  {re.escape(label)}\s+(\d+\.\d{{3}}) GiB\s+(\d+) bytes", text, re.MULTILINE)
    assert match, f"no line for {label} in\n{text}"
    return float(match.group(1)), int(match.group(2))


def test_report_of_a_hand_written_step():
    program = parse_step()
    text = program_report(program)
    assert text.startswith(format_report(program_memory(program)))
    memory = training_memory(program)
    labels = {"params": "params", "grads": "grads", "optimizer (AdamW)": "optimizer", "saved activations": "saved",
              "transient activations": "transient", "workspace": "workspace", "total": "total"}
    for label, field in labels.items():
        nbytes = getattr(memory, field)
        assert size_line(text, label) == (round(nbytes / GIB, 3), nbytes)
    assert "training step @step: 1584 trainable parameters" in text
    assert "computed" in text and "the step program holds no optimizer arena" in text
    total = 3 * GEMM + 3 * (GEMM + SILU)
    assert f"recompute: {3 * GEMM} FLOPs of {total} ({100 * 3 * GEMM / total:.1f}% of the step)" in text
    assert text == memory_report(program.parent_op())


def test_transient_activations_floor_at_zero():
    memory = training_memory(parse_step(activations=256, verify=False))
    assert memory.saved == 384 and memory.transient == 0


def test_programs_without_grads_keep_the_plain_report():
    program = parse_step()
    program.arena_sizes = type(program.arena_sizes).from_list(
        program.arena_sizes.elt_type, [5312, 704, 64, 0, 0, 64])
    assert program_report(program) == format_report(program_memory(program))


def test_unpriced_work_leaves_the_flops_unknown():
    text = STEP.replace('launch "silu"', 'launch "mystery"').replace("ACTIVATIONS", "704")
    module, _ = parse_module(make_context(), text)
    (program,) = [op for op in module.walk() if isinstance(op, ProgramOp)]
    memory = training_memory(program)
    assert memory.flops is None and "mystery" in memory.flops_unknown
    assert "recompute: FLOPs unknown (no FLOP rule for 'mystery')" in program_report(program)


def test_an_unplanned_step_is_refused():
    module, _ = parse_module(make_context(), STEP.replace("ACTIVATIONS", "704").replace(
        "%h = mdsl.sched.buffer activations offset 448 bytes", "%h = mdsl.sched.buffer activations bytes"))
    (program,) = [op for op in module.walk() if isinstance(op, ProgramOp)]
    with pytest.raises(NotPlanned, match="%h of @step has no offset"):
        training_memory(program)


def test_cli_prints_the_training_section(tmp_path, capsys):
    from modeldsl.tools.opt import main

    src = tmp_path / "step.mlir"
    src.write_text(STEP.replace("ACTIVATIONS", "704"))
    assert main([str(src), "--emit=memory-report"]) == 0
    out = capsys.readouterr().out
    assert "training step @step" in out and size_line(out, "total")[1] == sum(EXPECTED.values())


@pytest.fixture(scope="module")
def tiny_llama_step() -> ProgramOp:
    import modeldsl
    from modeldsl.runtime.train import compile_training_step

    model = modeldsl.load("modeldsl/std/models/llama.module", hf="examples/tiny_llama", dtype="fp32")
    return compile_training_step(model.model, 1, 8)


def test_tiny_llama_training_step(tiny_llama_step):
    program = tiny_llama_step
    memory = training_memory(program)
    arenas = program.arenas
    assert memory.params == arenas["params"] > 0
    # fp32, untied, all trainable: one parameter per 4 bytes of params
    assert memory.trainable_parameters == arenas["params"] // 4
    assert memory.grads == 4 * memory.trainable_parameters
    assert memory.optimizer == 2 * 4 * memory.trainable_parameters  # fp32 parameters need no master copy
    assert 0 <= memory.saved and memory.saved + memory.transient >= arenas["activations"]
    assert memory.workspace == arenas["workspace"]
    assert memory.total == sum(
        (memory.params, memory.grads, memory.optimizer, memory.saved, memory.transient, memory.workspace))
    assert memory.flops == program_flops(program) and memory.flops.total > 0
    if any(isinstance(op, RecomputeSegmentOp) for op in program.walk()):
        assert 0 < memory.flops.recompute < memory.flops.total
    else:
        assert memory.flops.recompute == 0
    assert "recompute: " in program_report(program)
