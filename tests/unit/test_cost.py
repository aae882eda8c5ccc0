"""modeldsl.cost: bytes, FLOPs and roofline times of hand-written mdsl.sched programs,
checked against numbers worked out by hand (fp32 buffers: 4 bytes an element)."""

from __future__ import annotations

import math

import pytest

from modeldsl.cost import (
    H100_SXM,
    Cost,
    NoSchedProgram,
    Roofline,
    cost_report,
    format_cost_report,
    module_costs,
    op_bytes,
    program_cost,
)
from modeldsl.dialects.sched import ProgramOp
from modeldsl.ir import make_context, parse_module, verify_module

TYPES = """
!a = !mdsl.sched.buffer<[64, 128], fp32>
!w = !mdsl.sched.buffer<[256, 128], fp32>
!c = !mdsl.sched.buffer<[64, 256], fp32>
!bias = !mdsl.sched.buffer<[256], fp32>
!x = !mdsl.sched.buffer<[1024], fp32>
!sx = !mdsl.sched.buffer<[3, 1024], fp32>
!ws = !mdsl.sched.buffer<[100], int8>
!q = !mdsl.sched.buffer<[1, 2, 16, 8], fp32>
!lse = !mdsl.sched.buffer<[1, 2, 16], fp32>
!a16 = !mdsl.sched.buffer<[64, 128], bf16>
!w16 = !mdsl.sched.buffer<[256, 128], bf16>
!labels = !mdsl.sched.buffer<[64], int64>
!loss = !mdsl.sched.buffer<[], fp32>
!rows = !mdsl.sched.buffer<[64], fp32>
"""

BUFFERS = """
  %a = mdsl.sched.buffer activations bytes 32768 : !a
  %w = mdsl.sched.buffer params bytes 131072 : !w
  %c = mdsl.sched.buffer activations bytes 65536 : !c
  %bias = mdsl.sched.buffer params bytes 1024 : !bias
  %x = mdsl.sched.buffer activations bytes 4096 : !x
  %y = mdsl.sched.buffer activations bytes 4096 : !x
  %z = mdsl.sched.buffer activations bytes 4096 : !x
  %x_out = mdsl.sched.buffer activations offset 0 bytes 4096 alias_of %x : !x
  %sx = mdsl.sched.buffer params bytes 12288 : !sx
  %ws = mdsl.sched.buffer workspace bytes 100 : !ws
  %q = mdsl.sched.buffer activations bytes 1024 : !q
  %k = mdsl.sched.buffer activations bytes 1024 : !q
  %v = mdsl.sched.buffer activations bytes 1024 : !q
  %o = mdsl.sched.buffer activations bytes 1024 : !q
  %lse = mdsl.sched.buffer activations bytes 128 : !lse
  %a16 = mdsl.sched.buffer activations bytes 16384 : !a16
  %w16 = mdsl.sched.buffer params bytes 65536 : !w16
  %labels = mdsl.sched.buffer activations bytes 512 : !labels
  %loss = mdsl.sched.buffer activations bytes 4 : !loss
  %rows = mdsl.sched.buffer activations bytes 256 : !rows
  %dx16 = mdsl.sched.buffer activations bytes 16384 : !a16
  %dw16 = mdsl.sched.buffer grads bytes 65536 : !w16
"""

X = 4096  # bytes of one !x buffer
GEMM_FLOPS = 2 * 64 * 256 * 128  # [64, 128] @ [256, 128]^T
GEMM_READ = 64 * 128 * 4 + 256 * 128 * 4
GEMM_WRITE = 64 * 256 * 4


def program(body: str) -> ProgramOp:
    arenas = "params = 0, activations = 0, workspace = 0, grads = 0, optimizer = 0, external = 0"
    module, _ = parse_module(make_context(), TYPES + f"mdsl.sched.program @p arenas({arenas}) {{\n{BUFFERS}{body}}}\n")
    assert verify_module(module) == []
    (found,) = [op for op in module.walk() if isinstance(op, ProgramOp)]
    return found


def only_op(body: str):
    (op,) = [op for op in program(body).body.block.ops if not op.name.endswith(".buffer")]
    return op


def test_gemm_reads_a_and_b_and_writes_c():
    cost = program_cost(program("  mdsl.sched.gemm %a, %w -> %c {transb = true} : !a, !w -> !c\n"))
    assert cost.kinds["gemm"] == cost.total
    assert (cost.total.launches, cost.total.bytes_read, cost.total.bytes_written, cost.total.flops) == (
        1, GEMM_READ, GEMM_WRITE, GEMM_FLOPS)


def test_gemm_with_beta_reads_c_and_a_bias_epilogue_reads_the_bias():
    beta = only_op("  mdsl.sched.gemm %a, %w -> %c {transb = true, beta = 1.0 : f64} : !a, !w -> !c\n")
    assert op_bytes(beta) == (GEMM_READ + GEMM_WRITE, GEMM_WRITE)
    bias = only_op('  mdsl.sched.gemm %a, %w bias %bias -> %c {transb = true, epilogue = "bias"} '
                   ": !a, !w bias !bias -> !c\n")
    assert op_bytes(bias) == (GEMM_READ + 256 * 4, GEMM_WRITE)


def test_a_launchs_scratch_output_is_not_counted():
    launch = only_op('  mdsl.sched.launch "silu"(%x) -> (%y, %ws) {scratch} : (!x) -> (!x, !ws)\n')
    assert op_bytes(launch) == (X, X)
    cost = program_cost(program('  mdsl.sched.launch "silu"(%x) -> (%y, %ws) {scratch} : (!x) -> (!x, !ws)\n'))
    assert cost.kinds["silu"].flops == 4 * 1024


def test_the_chunked_lm_head_loss_counts_the_logits_it_moves_through_its_scratch():
    """Every chunk's logits (in x's dtype) are written and read in the scratch (forward); the
    backward writes them, rewrites them as gradients in place and reads those in two GEMMs; the
    merged loss and gradient reads them once more, for the loss."""
    logits = 4 * 64 * 256
    forward = only_op('  mdsl.sched.launch "fused_lm_head_loss"(%a, %w, %labels) -> (%loss, %rows, %ws) '
                      '{chunk = 16 : i64, scratch} : (!a, !w, !labels) -> (!loss, !rows, !ws)\n')
    buffers = 64 * 128 * 4 + 256 * 128 * 4 + 64 * 8
    assert op_bytes(forward) == (buffers + logits, 4 + 64 * 4 + logits)
    backward = only_op('  mdsl.sched.launch "fused_lm_head_loss_backward"(%loss, %a16, %w16, %labels, %rows) -> '
                       '(%dx16, %dw16, %ws) {scratch} : (!loss, !a16, !w16, !labels, !rows) -> (!a16, !w16, !ws)\n')
    inputs, outputs = 4 + 64 * 128 * 2 + 256 * 128 * 2 + 64 * 8 + 64 * 4, 64 * 128 * 2 + 256 * 128 * 2
    bf16_logits = logits // 2
    assert op_bytes(backward) == (inputs + 3 * bf16_logits, outputs + 2 * bf16_logits)
    merged = only_op('  %seed = mdsl.sched.buffer activations bytes 4 : !loss\n'
                     '  mdsl.sched.launch "fused_lm_head_loss_grad"(%seed, %a16, %w16, %labels) -> '
                     '(%loss, %dx16, %dw16, %ws) {scratch} : (!loss, !a16, !w16, !labels) '
                     '-> (!loss, !a16, !w16, !ws)\n')
    inputs, outputs = 4 + 64 * 128 * 2 + 256 * 128 * 2 + 64 * 8, 4 + 64 * 128 * 2 + 256 * 128 * 2
    assert op_bytes(merged) == (inputs + 4 * bf16_logits, outputs + 2 * bf16_logits)


def test_an_in_place_launch_writes_its_output_although_it_aliases_an_input():
    launch = only_op('  mdsl.sched.launch "add"(%x, %y) -> (%x_out) {inplace} : (!x, !x) -> (!x)\n')
    assert op_bytes(launch) == (2 * X, X)


def test_an_accumulating_launch_reads_its_output_too():
    launch = only_op('  mdsl.sched.launch "add"(%x, %y) -> (%z) {accumulate} : (!x, !x) -> (!x)\n')
    assert op_bytes(launch) == (3 * X, X)


def test_copy_moves_its_bytes_or_the_whole_buffer():
    assert op_bytes(only_op("  mdsl.sched.copy %x -> %y {bytes = 512 : i64} : !x -> !x\n")) == (512, 512)
    assert op_bytes(only_op("  mdsl.sched.copy %x -> %y : !x -> !x\n")) == (X, X)
    assert op_bytes(only_op("  mdsl.sched.memset %x : !x\n")) == (0, X)


def test_attention_reads_q_k_v_and_writes_out_and_lse():
    attention = only_op("  mdsl.sched.attention %q, %k, %v -> %o, %lse : !q, !q, !q -> !q, !lse\n")
    assert op_bytes(attention) == (3 * 1024, 1024 + 128)


def test_a_loop_of_three_trips_counts_its_body_three_times_and_nested_loops_multiply():
    body = """
  mdsl.sched.layer_loop %l = 0 to 3 {
    %xl = mdsl.sched.layer_view %sx[%l] : !sx -> !x
    mdsl.sched.launch "add"(%xl, %y) -> (%z) : (!x, !x) -> (!x)
    mdsl.sched.layer_loop %m = 1 to 3 {
      mdsl.sched.copy %z -> %y : !x -> !x
    }
  }
"""
    cost = program_cost(program(body))
    assert cost.kinds["add"] == Cost(3, 3 * 2 * X, 3 * X, 3 * 1024, 3 * H100_SXM.seconds(3 * X, 1024))
    assert cost.kinds["copy"].launches == 6 and cost.kinds["copy"].bytes == 6 * 2 * X
    assert cost.total.launches == 9
    assert cost.recompute == Cost()


def test_a_recompute_segment_counts_in_the_total_and_in_recompute():
    body = """
  mdsl.sched.launch "silu"(%x) -> (%y) : (!x) -> (!x)
  mdsl.sched.layer_loop %l = 0 to 3 {
    mdsl.sched.recompute_segment "mlp" layer(%l) {
      mdsl.sched.launch "silu"(%x) -> (%z) : (!x) -> (!x)
    }
  }
"""
    cost = program_cost(program(body))
    assert cost.kinds["silu"].launches == 4
    assert cost.total.flops == 4 * 4 * 1024
    assert (cost.recompute.launches, cost.recompute.flops, cost.recompute.bytes) == (3, 3 * 4 * 1024, 3 * 2 * X)
    assert cost.share(cost.recompute) == pytest.approx(0.75)


def test_the_roofline_takes_the_larger_of_memory_and_compute_time():
    device = Roofline(bandwidth=1e9, peak_flops=1e12)
    assert device.seconds(2e9, 1e12) == 2.0  # memory-bound
    assert device.seconds(1e9, 3e12) == 3.0  # compute-bound
    gemm = program_cost(program("  mdsl.sched.gemm %a, %w -> %c {transb = true} : !a, !w -> !c\n"), device)
    assert gemm.total.seconds == pytest.approx(max((GEMM_READ + GEMM_WRITE) / 1e9, GEMM_FLOPS / 1e12))
    assert gemm.total.seconds == pytest.approx((GEMM_READ + GEMM_WRITE) / 1e9)  # memory-bound at these peaks
    compute_bound = Roofline(bandwidth=1e15, peak_flops=1e9)
    gemm = program_cost(program("  mdsl.sched.gemm %a, %w -> %c {transb = true} : !a, !w -> !c\n"), compute_bound)
    assert gemm.total.seconds == pytest.approx(GEMM_FLOPS / 1e9)


def test_times_are_summed_per_op_not_over_the_totals():
    device = Roofline(bandwidth=1e9, peak_flops=1e9)
    body = ("  mdsl.sched.gemm %a, %w -> %c {transb = true} : !a, !w -> !c\n"
            "  mdsl.sched.copy %x -> %y : !x -> !x\n")
    cost = program_cost(program(body), device)
    per_op = max((GEMM_READ + GEMM_WRITE) / 1e9, GEMM_FLOPS / 1e9) + 2 * X / 1e9
    assert cost.total.seconds == pytest.approx(per_op)
    assert cost.share(cost.kinds["gemm"]) + cost.share(cost.kinds["copy"]) == pytest.approx(1.0)


@pytest.mark.parametrize("bandwidth, flops", [(0, 1e12), (-1.0, 1e12), (1e9, math.inf), (1e9, math.nan)])
def test_a_roofline_needs_positive_finite_peaks(bandwidth, flops):
    with pytest.raises(ValueError, match="finite number above 0"):
        Roofline(bandwidth, flops)


def test_a_kernel_without_a_flop_rule_is_priced_by_its_bytes_and_named():
    cost = program_cost(program('  mdsl.sched.launch "no_such_kernel"(%x) -> (%y) : (!x) -> (!x)\n'))
    assert cost.unpriced == ("no_such_kernel",)
    assert cost.total.flops == 0 and cost.total.seconds == pytest.approx(2 * X / H100_SXM.bandwidth)
    assert "no FLOP rule for no_such_kernel" in format_cost_report([cost])


def test_the_report_says_it_is_an_estimate_and_has_a_row_per_kind_and_a_total():
    body = """
  mdsl.sched.gemm %a, %w -> %c {transb = true} : !a, !w -> !c
  mdsl.sched.layer_loop %l = 0 to 3 {
    mdsl.sched.recompute_segment "act" {
      mdsl.sched.launch "silu"(%x) -> (%y) : (!x) -> (!x)
    }
  }
"""
    lines = format_cost_report([program_cost(program(body))]).splitlines()
    assert lines[0].startswith("cost estimate: roofline at 3350 GB/s and 989 TFLOP/s (H100 SXM, dense bf16)")
    assert "no overlap, no caches" in lines[0]
    assert lines[1].startswith("@p: ") and lines[1].endswith("4 launches")
    assert lines[2].split() == ["op", "kind", "launches", "GB", "read", "GB", "written", "GFLOPs", "roofline",
                                "ms", "share"]
    rows = {line.split()[0]: line.split() for line in lines[3:]}
    assert rows["gemm"][1:5] == ["1", f"{GEMM_READ / 1e9:.4g}", f"{GEMM_WRITE / 1e9:.4g}", f"{GEMM_FLOPS / 1e9:.4g}"]
    assert rows["silu"][1] == "3" and rows["recompute"][1] == "3"
    assert rows["total"][1] == "4" and rows["total"][-1] == "100.0%"


def test_a_module_without_a_sched_program_has_no_cost():
    module, _ = parse_module(make_context(), "builtin.module {}")
    with pytest.raises(NoSchedProgram):
        module_costs(module)
    with pytest.raises(NoSchedProgram):
        cost_report(module)
