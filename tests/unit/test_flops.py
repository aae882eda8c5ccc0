"""modeldsl.flops: each FLOP rule against hand-computed numbers, on graph ops and on
sched ops parsed from IR text, and program totals through layer loops and
recompute segments."""

from __future__ import annotations

import pytest

from modeldsl.dialects.sched import ProgramOp
from modeldsl.flops import (
    FlopsUnknown,
    ProgramFlops,
    flop_rule,
    graph_op_flops,
    program_flops,
    sched_op_flops,
)
from modeldsl.ir import make_context, parse_module, verify_module
from modeldsl.kernels.registry import registry

# B=2, T=8, C=16, F=24 (ffn), H=4, Hkv=2, D=8, V=32
GRAPH_TYPES = """
!x = !mdsl.graph.tensor<[2, 8, 16], fp32>
!f = !mdsl.graph.tensor<[2, 8, 24], fp32>
!wf = !mdsl.graph.tensor<[24, 16], fp32>
!vec = !mdsl.graph.tensor<[16], fp32>
!rows = !mdsl.graph.tensor<[2, 8], fp32>
!m1 = !mdsl.graph.tensor<[16, 24], fp32>
!m2 = !mdsl.graph.tensor<[24, 32], fp32>
!m3 = !mdsl.graph.tensor<[16, 32], fp32>
!m4 = !mdsl.graph.tensor<[32, 16], fp32>
!mo = !mdsl.graph.tensor<[24, 32], fp32>
!q = !mdsl.graph.tensor<[2, 4, 8, 8], fp32>
!qt = !mdsl.graph.tensor<[2, 4, 8, 16], fp32>
!qto = !mdsl.graph.tensor<[2, 4, 16, 8], fp32>
!kv = !mdsl.graph.tensor<[2, 2, 8, 8], fp32>
!qs = !mdsl.graph.tensor<[2, 4, 8], fp32>
!freqs = !mdsl.graph.tensor<[8, 4, 2], fp32>
!logits = !mdsl.graph.tensor<[16, 32], fp32>
!labels = !mdsl.graph.tensor<[16], int64>
!tok = !mdsl.graph.tensor<[16], fp32>
!scalar = !mdsl.graph.tensor<[], fp32>
!flat = !mdsl.graph.tensor<[16, 16], fp32>
!xT = !mdsl.graph.tensor<[2, 16, 8], fp32>
!cat = !mdsl.graph.tensor<[2, 8, 32], fp32>
!half = !mdsl.graph.tensor<[2, 8, 16], bf16>
!wq = !mdsl.graph.tensor<[24, 16], fp8_e4m3>
!ws = !mdsl.graph.tensor<[24], fp32>
"""

GRAPH_BODY = """
    %lin = mdsl.graph.matmul %x, %wf {transpose = "NT"} : (!x, !wf) -> !f
    %nn = mdsl.graph.matmul %m1, %m2 : (!m1, !m2) -> !m3
    %dw = mdsl.graph.matmul %d_f, %x {transpose = "TN"} : (!f, !x) -> !wf
    %tn = mdsl.graph.matmul %m3_in, %m3_in2 {transpose = "TN"} : (!m1, !m3) -> !mo
    %tt = mdsl.graph.matmul %m3_in, %m4 {transpose = "TT"} : (!m1, !m4) -> !mo
    %lba, %lbp = mdsl.graph.linear_bias_act %m3_in2, %m4, %g {transpose = "NN", activation = "gelu"}
        : (!m3, !m4, !vec) -> (!flat, !flat)
    %scores = mdsl.graph.batched_matmul %q, %q {transpose = "NT"} : (!q, !q) -> !q
    %bt = mdsl.graph.batched_matmul %qt, %q {transpose = "TN"} : (!qt, !q) -> !qto
    %o, %lse = mdsl.graph.flash_attention %q, %k, %v : (!q, !kv, !kv) -> (!q, !qs)
    %o2, %lse2 = mdsl.graph.flash_attention %q, %k, %v {causal = false} : (!q, !kv, !kv) -> (!q, !qs)
    %dq, %dk, %dv = mdsl.graph.flash_attention_backward %o, %q, %k, %v, %o, %lse
        : (!q, !q, !kv, !kv, !q, !qs) -> (!q, !kv, !kv)
    %n, %rstd = mdsl.graph.rmsnorm %x, %g : (!x, !vec) -> (!x, !rows)
    %dn, %dg = mdsl.graph.rmsnorm_backward %x, %x, %g, %rstd : (!x, !x, !vec, !rows) -> (!x, !vec)
    %ln, %mean, %lrstd = mdsl.graph.layernorm %x, %g : (!x, !vec) -> (!x, !rows, !rows)
    %qr, %kr = mdsl.graph.rope %q, %k, %freqs : (!q, !kv, !freqs) -> (!q, !kv)
    %sm = mdsl.graph.softmax %q : (!q) -> !q
    %loss, %clse = mdsl.graph.cross_entropy %logits, %labels : (!logits, !labels) -> (!scalar, !tok)
    %sum = mdsl.graph.add %x, %x : (!x, !x) -> !x
    %act = mdsl.graph.swiglu %d_f, %d_f : (!f, !f) -> !f
    %dgate, %dup = mdsl.graph.swiglu_backward %d_f, %d_f, %d_f : (!f, !f, !f) -> (!f, !f)
    %si = mdsl.graph.silu %d_f : (!f) -> !f
    %view = mdsl.graph.view %x : (!x) -> !flat
    %tr = mdsl.graph.transpose %x {dim0 = 1 : i64, dim1 = 2 : i64} : (!x) -> !xT
    %cc = mdsl.graph.concat %x, %x : (!x, !x) -> !cat
    %cast = mdsl.graph.cast %x : (!x) -> !half
    %cp = mdsl.graph.copy %x : (!x) -> !x
    %z = mdsl.graph.zeros : !x
    %deq = mdsl.graph.dequantize %wq, %ws : (!wq, !ws) -> !wf
"""


def graph_ops() -> dict[str, object]:
    args = ("%x: !x, %wf: !wf, %m1: !m1, %m2: !m2, %d_f: !f, %m3_in: !m1, %m3_in2: !m3, %m4: !m4, "
            "%q: !q, %qt: !qt, %k: !kv, %v: !kv, %g: !vec, %freqs: !freqs, %logits: !logits, %labels: !labels, "
            "%wq: !wq, %ws: !ws")
    text = (GRAPH_TYPES + "mdsl.graph.model @m {\n  mdsl.graph.func @f(" + args + ") -> !x {\n"
            + GRAPH_BODY + "    mdsl.graph.return %sum : !x\n  }\n}\n")
    module, _ = parse_module(make_context(), text)
    assert verify_module(module) == []
    return {op.results[0].name_hint: op for op in module.walk() if op.name.startswith("mdsl.graph.")
            and op.results and op.name not in ("mdsl.graph.func", "mdsl.graph.model")}


GRAPH_EXPECTED = {
    # 2 * batch * M * N * K
    "lin": 2 * 2 * 8 * 24 * 16,  # x [2, 8, 16] @ W[24, 16]^T
    "nn": 2 * 16 * 32 * 24,  # [16, 24] @ [24, 32]
    "dw": 2 * 24 * 16 * (2 * 8),  # dY^T X over all 16 tokens: [24, 16]
    "tn": 2 * 24 * 32 * 16,  # [16, 24]^T @ [16, 32]
    "tt": 2 * 24 * 32 * 16,  # [16, 24]^T @ [32, 16]^T
    "lba": 2 * 16 * 16 * 32 + 9 * 256,  # [16, 32] @ [32, 16], then the bias and the tanh GELU
    "scores": 2 * (2 * 4) * 8 * 8 * 8,
    "bt": 2 * (2 * 4) * 16 * 8 * 8,  # A[b]^T [16, 8] @ B[b] [8, 8]
    # 4 * B * H * Tq * Tk * D, halved when causal; the backward 2.5x
    "o": 4 * 2 * 4 * 8 * 8 * 8 // 2,
    "o2": 4 * 2 * 4 * 8 * 8 * 8,
    "dq": int(2.5 * (4 * 2 * 4 * 8 * 8 * 8 // 2)),
    "n": 5 * 256,
    "dn": 5 * 256,
    "ln": 5 * 256,
    "qr": 6 * (512 + 256),
    "sm": 5 * 512,
    "loss": 5 * 16 * 32,
    "sum": 256,
    "act": 5 * 384,
    "dgate": 6 * 2 * 384,
    "si": 4 * 384,
    "view": 0,
    "tr": 0,
    "cc": 0,
    "cast": 0,
    "cp": 0,
    "z": 0,
    "deq": 24 * 16,  # one multiply per element (the fp8 values widen by a table lookup)
}


@pytest.mark.parametrize("name", sorted(GRAPH_EXPECTED))
def test_graph_op_flops(name):
    assert graph_op_flops(graph_ops()[name]) == GRAPH_EXPECTED[name]


def test_every_kernel_has_a_rule():
    """(Every primitive has one: tests/unit/test_primitive_registry.py.)"""
    assert [name for name in registry() if flop_rule(name) is None] == []


def test_symbolic_shapes_are_refused():
    text = """
!x = !mdsl.graph.tensor<[B, 16], fp32>
mdsl.graph.model @m {
  mdsl.graph.func @f(%x: !x) -> !x {
    %y = mdsl.graph.add %x, %x : (!x, !x) -> !x
    mdsl.graph.return %y : !x
  }
}
"""
    module, _ = parse_module(make_context(), text)
    (add,) = [op for op in module.walk() if op.name == "mdsl.graph.add"]
    with pytest.raises(FlopsUnknown, match="unbound symbol.*specialize"):
        graph_op_flops(add)


# ----------------------------------------------------------------------------
# mdsl.sched
# ----------------------------------------------------------------------------

SCHED_TYPES = """
!x = !mdsl.sched.buffer<[2, 16, 64], fp32>
!w = !mdsl.sched.buffer<[128, 64], fp32>
!y = !mdsl.sched.buffer<[2, 16, 128], fp32>
!r = !mdsl.sched.buffer<[2, 16], fp32>
!v = !mdsl.sched.buffer<[64], fp32>
!b = !mdsl.sched.buffer<[128], fp32>
!q = !mdsl.sched.buffer<[2, 4, 16, 8], fp32>
!kv = !mdsl.sched.buffer<[2, 2, 16, 8], fp32>
!qt = !mdsl.sched.buffer<[2, 16, 4, 8], fp32>
!kvt = !mdsl.sched.buffer<[2, 16, 2, 8], fp32>
!lse = !mdsl.sched.buffer<[2, 4, 16], fp32>
!sw = !mdsl.sched.buffer<[3, 128, 64], fp32>
!ws = !mdsl.sched.buffer<[64], int8>
"""

SCHED_BUFFERS = """
  %x = mdsl.sched.buffer external offset 0 bytes 8192 : !x
  %w = mdsl.sched.buffer params offset 0 bytes 32768 : !w
  %sw = mdsl.sched.buffer params offset 32768 bytes 98304 : !sw
  %g = mdsl.sched.buffer params offset 131072 bytes 256 : !v
  %gb = mdsl.sched.buffer params offset 131328 bytes 512 : !b
  %y = mdsl.sched.buffer activations offset 0 bytes 16384 : !y
  %pre = mdsl.sched.buffer activations offset 16384 bytes 16384 : !y
  %n = mdsl.sched.buffer activations offset 32768 bytes 8192 : !x
  %n2 = mdsl.sched.buffer activations offset 40960 bytes 8192 : !x
  %rstd = mdsl.sched.buffer activations offset 49152 bytes 128 : !r
  %y2d = mdsl.sched.buffer activations offset 0 bytes 16384 alias_of %y : !mdsl.sched.buffer<[32, 128], fp32> from !y
  %n2d = mdsl.sched.buffer activations offset 0 bytes 8192 alias_of %n : !mdsl.sched.buffer<[32, 64], fp32> from !x
  %q = mdsl.sched.buffer activations offset 49408 bytes 4096 : !q
  %k = mdsl.sched.buffer activations offset 53504 bytes 2048 : !kv
  %v = mdsl.sched.buffer activations offset 55552 bytes 2048 : !kv
  %o = mdsl.sched.buffer activations offset 57600 bytes 4096 : !q
  %lse = mdsl.sched.buffer activations offset 61696 bytes 512 : !lse
  %qt = mdsl.sched.buffer activations offset 0 bytes 4096 alias_of %q : !qt from !q
  %kt = mdsl.sched.buffer activations offset 0 bytes 2048 alias_of %k : !kvt from !kv
  %vt = mdsl.sched.buffer activations offset 0 bytes 2048 alias_of %v : !kvt from !kv
  %ot = mdsl.sched.buffer activations offset 0 bytes 4096 alias_of %o : !qt from !q
  %dq = mdsl.sched.buffer grads offset 0 bytes 4096 : !q
  %dk = mdsl.sched.buffer grads offset 4096 bytes 2048 : !kv
  %dv = mdsl.sched.buffer grads offset 6144 bytes 2048 : !kv
  %gw = mdsl.sched.buffer grads offset 8192 bytes 32768 : !w
  %ws = mdsl.sched.buffer workspace offset 0 bytes 64 : !ws
"""

SCHED_WORK = """
  mdsl.sched.gemm %n, %w -> %y {transb = true} : !x, !w -> !y
  mdsl.sched.gemm %y2d, %n2d -> %gw {transa = true, beta = 1.0 : f64} : !mdsl.sched.buffer<[32, 128], fp32>,
      !mdsl.sched.buffer<[32, 64], fp32> -> !w
  mdsl.sched.gemm %n, %w bias %gb -> %y {transb = true, epilogue = "gelu_bias"} : !x, !w bias !b -> !y
  mdsl.sched.gemm %y2d, %n2d bias %gb -> %gw {transa = true, epilogue = "bgrada"}
      : !mdsl.sched.buffer<[32, 128], fp32>, !mdsl.sched.buffer<[32, 64], fp32> bias !b -> !w
  mdsl.sched.attention %q, %k, %v -> %o, %lse : !q, !kv, !kv -> !q, !lse
  mdsl.sched.attention %q, %k, %v -> %o, %lse {causal = false} : !q, !kv, !kv -> !q, !lse
  mdsl.sched.attention %qt, %kt, %vt -> %ot, %lse {layout = "bthd"} : !qt, !kvt, !kvt -> !qt, !lse
  mdsl.sched.attention_backward %q, %k, %v, %o, %o, %lse -> %dq, %dk, %dv : !q, !kv, !kv, !q, !q, !lse -> !q, !kv, !kv
  mdsl.sched.launch "rmsnorm"(%x, %g) -> (%n, %rstd) : (!x, !v) -> (!x, !r)
  mdsl.sched.launch "silu"(%n) -> (%n2, %ws) {scratch} : (!x) -> (!x, !ws)
  mdsl.sched.launch "flash_attention"(%q, %k, %v) -> (%o, %lse) {causal = true} : (!q, !kv, !kv) -> (!q, !lse)
  mdsl.sched.launch "transpose"(%n) -> (%n2) {dim0 = 0 : i64, dim1 = 1 : i64} : (!x) -> (!x)
  mdsl.sched.copy %n -> %n2 : !x -> !x
  mdsl.sched.memset %n2 : !x
"""

ATTENTION_CAUSAL = 4 * 2 * 4 * 16 * 16 * 8 // 2
SCHED_EXPECTED = [
    2 * 2 * 16 * 128 * 64,  # [2, 16, 64] @ [128, 64]^T
    2 * 128 * 64 * 32,  # [32, 128]^T @ [32, 64]
    2 * 2 * 16 * 128 * 64 + 9 * 2 * 16 * 128,  # + bias and GELU per element of C
    2 * 128 * 64 * 32 + 32 * 128,  # + the row sums of A^T
    ATTENTION_CAUSAL,
    2 * ATTENTION_CAUSAL,
    ATTENTION_CAUSAL,  # the same attention in [B, T, H, D]
    int(2.5 * ATTENTION_CAUSAL),
    5 * 2 * 16 * 64,
    4 * 2 * 16 * 64,  # the scratch output is no output
    ATTENTION_CAUSAL,
    0,
    0,
    0,
]


def sched_program(body: str, arenas: str = "params = 131840, activations = 62208, workspace = 64, grads = 40960, "
                  "optimizer = 0, external = 8192") -> ProgramOp:
    text = SCHED_TYPES + f"mdsl.sched.program @p arenas({arenas}) {{\n{SCHED_BUFFERS}{body}}}\n"
    module, _ = parse_module(make_context(), text)
    assert verify_module(module) == []
    (program,) = [op for op in module.walk() if isinstance(op, ProgramOp)]
    return program


def work_ops(program: ProgramOp) -> list:
    return [op for op in program.body.block.ops if not op.name.endswith((".buffer", ".layer_view"))]


def test_sched_op_flops():
    program = sched_program(SCHED_WORK)
    assert [sched_op_flops(op) for op in work_ops(program)] == SCHED_EXPECTED
    assert all(sched_op_flops(op) == 0 for op in program.body.block.ops if op.name == "mdsl.sched.buffer")


def test_program_flops_in_loops_and_recompute_segments():
    gemm = 2 * 16 * 128 * 64  # one [16, 64] @ [64, 128]^T per layer
    rmsnorm = 5 * 2 * 16 * 64
    body = """
  mdsl.sched.launch "rmsnorm"(%x, %g) -> (%n, %rstd) : (!x, !v) -> (!x, !r)
  mdsl.sched.layer_loop %l = 0 to 3 {
    %wl = mdsl.sched.layer_view %sw[%l] : !sw -> !w
    mdsl.sched.gemm %n, %wl -> %y {transb = true} : !x, !w -> !y
  }
  mdsl.sched.layer_loop %l = 1 to 3 reverse {
    mdsl.sched.recompute_segment "norm" layer(%l) {
      mdsl.sched.launch "rmsnorm"(%x, %g) -> (%n, %rstd) : (!x, !v) -> (!x, !r)
    }
    mdsl.sched.layer_loop %m = 0 to 2 {
      mdsl.sched.recompute_segment "mlp" {
        %wm = mdsl.sched.layer_view %sw[%m] : !sw -> !w
        mdsl.sched.gemm %n, %wm -> %y {transb = true} : !x, !w -> !y
      }
      mdsl.sched.copy %n -> %n2 : !x -> !x
    }
  }
"""
    program = sched_program(body)
    gemm_batch = 2 * gemm
    recompute = 2 * rmsnorm + 2 * 2 * gemm_batch
    expected = ProgramFlops(total=rmsnorm + 3 * gemm_batch + recompute, recompute=recompute)
    assert program_flops(program) == expected
    loops = [op for op in program.body.block.ops if op.name == "mdsl.sched.layer_loop"]
    assert [sched_op_flops(op) for op in loops] == [3 * gemm_batch, recompute]
    assert expected.recompute_fraction == pytest.approx(recompute / expected.total)


def test_unknown_kernels_and_misfit_shapes_are_flops_unknown():
    unknown = sched_program('  mdsl.sched.launch "zero_init"() -> (%n) : () -> (!x)\n')
    with pytest.raises(FlopsUnknown, match="no FLOP rule for 'zero_init'"):
        program_flops(unknown)
    misfit = sched_program('  mdsl.sched.launch "flash_attention"(%g) -> (%n) : (!v) -> (!x)\n')
    with pytest.raises(FlopsUnknown, match="does not fit its FLOP rule"):
        program_flops(misfit)
