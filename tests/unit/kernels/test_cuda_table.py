"""The CUDA kernel table (kernels/cuda.py) agrees with the .cu sources and the primitives, and its
launch configurations are valid on many shapes, ragged ones included (CPU only: nothing runs)."""

from __future__ import annotations

import inspect
import itertools
import math
import re
from pathlib import Path

import numpy as np
import pytest

from modeldsl.kernels import cuda
from modeldsl.kernels.reference import REFERENCES
from modeldsl.primitives import lookup_primitive

KERNEL_DIR = Path(cuda.__file__).resolve().parent

# extern "C" __global__ void [__launch_bounds__(N)] NAME(PARAMS) {
EXPORTED = re.compile(r'extern\s+"C"\s+__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s+)?(\w+)\s*\(([^)]*)\)\s*\{')


def exported(family: str) -> dict[str, list[str]]:
    """Every extern "C" kernel of kernels/<family>.cu with the kinds of its parameters."""
    text = (KERNEL_DIR / f"{family}.cu").read_text()
    return {name: [param_kind(p) for p in params.split(",")] for name, params in EXPORTED.findall(text)}


def param_kind(decl: str) -> str:
    decl = " ".join(decl.split())
    if "*" in decl:
        return "ptr"
    words = decl.rsplit(" ", 1)[0].replace("const ", "")
    return {"i64": "i64", "long long": "i64", "int": "i32", "float": "f32", "double": "f64"}[words]


# ----------------------------------------------------------------------------
# Kernels against the sources
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(cuda.KERNELS))
def test_kernel_symbols_exist_in_their_source_with_the_listed_parameters(name):
    kernel = cuda.KERNELS[name]
    assert kernel.source.is_file(), kernel.source
    symbols = exported(kernel.family)
    for variant, symbol in kernel.symbols.items():
        assert symbol in symbols, \
            f"{symbol} ({variant}) is not an extern \"C\" __global__ kernel of {kernel.source.name}"
        assert symbols[symbol] == [kind for _, kind in kernel.params], \
            f"{symbol}: the source's parameters {symbols[symbol]} differ from the table's {kernel.params}"


def test_every_exported_kernel_is_in_the_table():
    listed = {s for k in cuda.KERNELS.values() for s in k.symbols.values()}
    for family in cuda.families():
        stray = sorted(set(exported(family)) - listed)
        assert not stray, f"{family}.cu exports kernels the table does not list: {stray}"


def test_every_family_has_kernels_and_the_issue_families_exist():
    assert set(cuda.families()) >= {"embedding", "rmsnorm", "activation", "rope", "softmax", "cross_entropy",
                                    "elementwise", "reduction", "cast", "adamw", "attention"}
    for family in cuda.families():
        assert exported(family), f"{family}.cu exports no kernel"


def test_device_tables_match_the_structs_of_the_sources():
    assert cuda.TENSOR_TABLE.itemsize == 16
    assert cuda.ADAMW_TABLE.itemsize == 64
    adamw = (KERNEL_DIR / "adamw.cu").read_text()
    struct = re.search(r"struct AdamWTensor \{(.*?)\};", adamw, re.S).group(1)
    fields = [line.split("//")[0].strip().rstrip(";").split()[-1].lstrip("*") for line in struct.strip().splitlines()]
    assert fields == list(cuda.ADAMW_TABLE.names)
    entry = cuda.AdamWEntry(param=16, grad=32, exp_avg=48, exp_avg_sq=64, n=5, lr_scale=0.5, weight_decay=0.1)
    table = cuda.adamw_table([entry])
    assert table.tobytes()[:8] == (16).to_bytes(8, "little") and table["weight_decay"][0] == 0.1
    assert cuda.tensor_table([(4096, 7)]).tobytes() == (4096).to_bytes(8, "little") + (7).to_bytes(8, "little")


# ----------------------------------------------------------------------------
# Primitives against the ops and the references
# ----------------------------------------------------------------------------

# schedule kernels: no graph op, a reference (the Mamba decoding steps: lower_to_sched's, over state buffers)
SCHEDULE_LEVEL = {"adamw", "global_norm", "clip_factor", "mamba_conv1d_step", "mamba_selective_scan_step"}
EXTRA = {"add_inplace", "adamw_multi"}  # launches the executor forms itself (in-place add, fused adamw)


@pytest.mark.parametrize("name", sorted(cuda.PRIMITIVES))
def test_primitive_buffers_are_the_ops_inputs_and_outputs(name):
    prim = cuda.PRIMITIVES[name]
    assert set(prim.kernels) <= set(cuda.KERNELS)
    assert prim.family in cuda.families()
    if name in EXTRA:
        return
    assert name in REFERENCES, f"{name} has no numpy reference"
    params = [p.name for p in inspect.signature(REFERENCES[name]).parameters.values()
              if p.kind in (p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)]
    if name in SCHEDULE_LEVEL:
        assert list(prim.inputs) == params
        return
    sig = lookup_primitive(name)
    assert [s.name for s in sig.inputs] == list(prim.inputs)
    assert [s.name for s in sig.outputs] == list(prim.outputs)


def test_the_kernels_without_a_graph_op_are_covered():
    """(The primitives' plans: tests/unit/test_primitive_registry.py, against each record's ``cuda``.)"""
    wanted = "adamw global_norm clip_factor add_inplace adamw_multi mamba_conv1d_step mamba_selective_scan_step"
    assert sorted(set(wanted.split()) - set(cuda.PRIMITIVES)) == []


def test_buffer_dtypes():
    assert cuda.primitive("rmsnorm").dtype("rstd", "bf16") == "fp32"
    assert cuda.primitive("rmsnorm").dtype("y", "bf16") == "bf16"
    assert cuda.primitive("embedding").dtype("indices", "bf16", "int64") == "int64"
    assert cuda.primitive("embedding_backward").dtype("d_weight", "bf16") == "fp32"
    assert cuda.primitive("cast").dtype("x", "bf16_to_f16") == "bf16"
    assert cuda.primitive("cast").dtype("out", "bf16_to_f16") == "fp16"
    assert cuda.primitive("add_inplace").dtype("acc", "f32_bf16") == "fp32"
    assert cuda.primitive("add_inplace").dtype("x", "f32_bf16") == "bf16"
    assert cuda.primitive("adamw").dtype("step", "bf16") == "int64"
    assert cuda.variant_of(np.float32) == "fp32" and cuda.variant_of("bf16") == "bf16"
    with pytest.raises(cuda.NotCovered):
        cuda.variant_of(np.int8)


# ----------------------------------------------------------------------------
# Launch configurations on many shapes
# ----------------------------------------------------------------------------

# (rows-like leading shape, last dim): ragged last dims, a single element, LLM-sized rows
ROWS = [((1,), 1), ((3,), 5), ((2, 7), 33), ((4,), 64), ((5, 3), 100), ((2, 9), 127), ((8, 1024), 2048),
        ((16,), 4099), ((3,), 8192), ((1,), 40000), ((2,), 151936)]
ELEMENTS = [(1,), (7,), (8,), (9, 31), (1000, 1001), (8, 1024, 2048), (3, 5, 7, 11)]
HEADS = [(1, 1, 1, 2), (2, 4, 7, 64), (1, 3, 5, 6), (2, 16, 33, 128), (8, 16, 1024, 128), (1, 2, 3, 10)]
# (B, H, Hkv, T, S, D): attention (head dims over 128 on the "_d256" kernels: Gemma 2's 256)
ATTENTION = [(1, 1, 1, 1, 1, 2), (2, 4, 2, 37, 37, 64), (1, 4, 1, 70, 70, 128), (1, 2, 2, 33, 50, 10),
             (2, 3, 3, 5, 40, 100), (8, 16, 8, 1024, 1024, 128), (8, 32, 8, 1024, 1024, 64),
             (1, 1, 1, 1, 1, 129), (2, 4, 2, 37, 37, 160), (1, 2, 1, 33, 50, 192), (2, 3, 3, 5, 40, 250),
             (8, 16, 8, 1024, 1024, 256)]


def cases():
    """(primitive, inputs, outputs, attrs, variant, index dtype) covering every primitive."""
    for (lead, d), variant in itertools.product(ROWS, cuda.VARIANTS):
        x, w, rows = lead + (d,), (d,), lead
        yield "rmsnorm", [x, w], [x, rows], {"eps": 1e-5}, variant, "int32"
        yield "rmsnorm_backward", [x, x, w, rows], [x, w], {}, variant, "int32"
        yield "fused_residual_rmsnorm", [x, x, w], [x, x, rows], {}, variant, "int32"
        yield "fused_residual_rmsnorm_backward", [x, x, x, w, rows], [x, x, w], {}, variant, "int32"
        yield "softmax", [x], [x], {"dim": -1}, variant, "int32"
        yield "softmax_backward", [x, x], [x], {"dim": len(x) - 1}, variant, "int32"
        yield "embedding", [lead, (1000, d)], [x], {}, variant, "int64"
        yield "embedding_backward", [x, lead], [(1000, d)], {}, variant, "int32"
        n = math.prod(lead)
        for reduction in ("mean", "sum", "none"):
            loss = (n,) if reduction == "none" else ()
            attrs = {"reduction": reduction, "ignore_index": -100}
            yield "cross_entropy", [(n, d), (n,)], [loss, (n,)], attrs, variant, "int32"
            yield "cross_entropy_backward", [loss, (n, d), (n,), (n,)], [(n, d)], attrs, variant, "int64"
        yield "reduce_sum", [x], [rows], {"dims": [-1]}, variant, "int32"
        yield "reduce_mean", [x], [(d,)], {"dims": list(range(len(lead)))}, variant, "int32"
        yield "reduce_max", [x], [rows, rows], {"dim": -1}, variant, "int32"
        yield "reduce_max", [x], [(d,), (d,)], {"dim": 0}, variant, "int64"
        yield "bias_add", [x, w], [x], {}, variant, "int32"
        yield "add", [x, w], [x], {}, variant, "int32"
        yield "mul", [lead + (1,), x], [x], {}, variant, "int32"
        yield "global_norm", [x, w, (3,)], [()], {}, variant, "int32"
    for shape, variant in itertools.product(ELEMENTS, cuda.VARIANTS):
        for name in ("swiglu", "geglu"):
            yield name, [shape, shape], [shape], {}, variant, "int32"
            yield f"{name}_backward", [shape] * 3, [shape, shape], {}, variant, "int32"
            packed = (*shape[:-1], 2 * shape[-1])
            yield f"fused_split_{name}", [packed], [shape], {}, variant, "int32"
            yield f"fused_split_{name}_backward", [shape, packed], [packed], {}, variant, "int32"
        for name in ("silu", "relu", "relu2", "gelu"):
            yield name, [shape], [shape], {}, variant, "int32"
            yield f"{name}_backward", [shape, shape], [shape], {}, variant, "int32"
        yield "add", [shape, shape], [shape], {}, variant, "int32"
        yield "mul", [(1,), shape], [shape], {}, variant, "int32"
        yield "scale", [shape], [shape], {"factor": 0.5}, variant, "int32"
        yield "add_scalar", [shape], [shape], {"value": 1e-6}, variant, "int32"
        yield "dropout", [shape], [shape], {"p": 0.1, "seed": 3, "training": True}, variant, "int32"
        yield "dropout", [shape, (1,)], [shape], {"p": 0.1, "seed": 3, "training": True, "layers": [1]}, variant, \
            "int32"
        if len(shape) >= 2:
            yield "causal_mask", [shape], [shape], {"offset": 1, "window_size": 2, "fill": "zero"}, variant, "int32"
        for name in ("sub", "div"):
            yield name, [shape, shape], [shape], {}, variant, "int32"
            yield name, [shape, shape[:-1] + (1,)], [shape], {}, variant, "int32"
        for name in ("exp", "log", "tanh", "sigmoid", "rsqrt"):
            yield name, [shape], [shape], {}, variant, "int32"
        yield "add3", [shape] * 3, [shape], {}, variant, "int32"
        yield "add_inplace", [shape, shape], [shape], {}, variant, "int32"
        yield "adamw", [shape, shape, shape, shape, (1,), (1,), None], [shape, shape, shape, None], \
            {"lr_scale": 2.0, "weight_decay": 0.1}, variant, "int32"
        yield "adamw", [shape, shape, shape, shape, (1,), (1,), ()], [shape, shape, shape, shape], {}, variant, "int32"
        yield "adamw_multi", [(1,), (1,), None], [], {"sizes": [math.prod(shape), 3, 1000]}, variant, "int32"
    for shape, variant in itertools.product(ELEMENTS, cuda.CAST_VARIANTS):
        yield "cast", [shape], [shape], {}, variant, "int32"
    for shape, variant in itertools.product(ELEMENTS, cuda.DEQUANTIZE_VARIANTS):
        yield "dequantize", [shape, shape[:-1]], [shape], {}, variant, "int32"
    for (b, h, t, d), variant, interleaved in itertools.product(HEADS, cuda.VARIANTS, (False, True)):
        hk = max(1, h // 2) if h % 2 == 0 else h
        q, k, freqs = (b, h, t, d), (b, hk, t, d), (t, d // 2, 2)
        attrs = {"interleaved": interleaved}
        yield "rope", [q, k, freqs], [q, k], attrs, variant, "int32"
        yield "rope_backward", [q, k, freqs], [q, k], attrs, variant, "int32"
        yield "qk_norm", [q, k, (d,), (d,)], [q, k, q[:-1], k[:-1]], {}, variant, "int32"
        yield "qk_norm_backward", [q, k, q, k, (d,), (d,), q[:-1], k[:-1]], [q, k, (d,), (d,)], {}, variant, "int32"
        for layout in ("bhtd", "bthd"):
            qt, kt = (q, k) if layout == "bhtd" else ((b, t, h, d), (b, t, hk, d))
            fused_attrs = {**attrs, "layout": layout}
            yield "fused_qk_norm_rope", [qt, kt, (d,), (d,), freqs], [qt, kt, qt[:-1], kt[:-1]], fused_attrs, \
                variant, "int32"
            yield "fused_qk_norm_rope_backward", [qt, kt, qt, kt, (d,), (d,), qt[:-1], kt[:-1], freqs], \
                [qt, kt, (d,), (d,)], fused_attrs, variant, "int32"
    for (b, h, hkv, t, s, d), variant, layout, (causal, window) in itertools.product(
            ATTENTION, cuda.VARIANTS, cuda.ATTENTION_LAYOUTS, ((True, None), (False, 8), (True, 16))):
        q, k = ((b, h, t, d), (b, hkv, s, d)) if layout == "bhtd" else ((b, t, h, d), (b, s, hkv, d))
        attrs = {"causal": causal, "window_size": window, "layout": layout}
        yield "flash_attention", [q, k, k, None], [q, (b, h, t)], attrs, variant, "int32"
        yield "flash_attention_backward", [q, q, k, k, q, (b, h, t)], [q, k, k], attrs, variant, "int32"
        if causal and window is None:  # softcapped (Gemma 2's attn_logit_softcapping)
            capped = {**attrs, "softcap": 50.0}
            yield "flash_attention", [q, k, k, None], [q, (b, h, t)], capped, variant, "int32"
            yield "flash_attention_backward", [q, q, k, k, q, (b, h, t)], [q, k, k], capped, variant, "int32"
    for variant in cuda.VARIANTS:  # MoE (moe.cu): (tokens, top_k, experts, channels)
        for n, k, e, c in ((1, 1, 1, 1), (9, 2, 5, 33), (4096, 8, 128, 4096)):
            a = n * k
            yield "moe_compute_offsets", [(n, k)], [(e + 1,)], {"num_experts": e}, "fp32", "int32"
            yield "moe_permute", [(n, c), (n, k), (e + 1,)], [(a, c), (a,)], {}, variant, "int32"
            yield "moe_unpermute", [(a, c), (n, k), (a,)], [(n, c)], {}, variant, "int32"
            yield "moe_unpermute_backward", [(n, c), (a, c), (n, k), (a,)], [(a, c), (n, k)], {}, variant, "int32"
            yield "moe_router", [(n, c), (e, c)], [(n, k), (n, k), ()], {"top_k": k}, variant, "int32"
            yield "moe_router_backward", [(n, k), (n, c), (e, c), (n, k)], [(n, c), (e, c)], {}, variant, "int32"
            for mode in ("TN", "NN", "NT", "TT"):
                x = (c, a) if mode[1] == "T" else (a, c)
                w = (e, 64, c) if mode[0] == "T" else (e, c, 64)
                yield "grouped_gemm", [x, w, (e + 1,)], [(a, 64)], {"transpose": mode}, variant, "int32"
            yield "grouped_gemm_weight_grad", [(a, c), (a, 64), (e + 1,)], [(e, 64, c)], {}, variant, "int32"
        # Mamba (mamba.cu): (B, D, T, kernel_size, N, G)
        for b, d, t, ks, n, g in ((1, 1, 1, 4, 1, 1), (2, 6, 33, 3, 40, 3), (8, 4096, 1024, 4, 128, 8)):
            x, w, state = (b, d, t), (d, 1, ks), (b, d, ks - 1)
            conv = {"kernel_size": ks}
            yield "mamba_conv1d", [x, w, (d,), None], [x], conv, variant, "int32"
            yield "mamba_conv1d", [x, w, None, state], [x, state], conv, variant, "int32"
            yield "mamba_conv1d_backward", [x, x, w, (d,)], [x, w, (d,)], conv, variant, "int32"
            scan = [x, x, (d, n), (b, g, n, t), (b, g, n, t), (d,), (d,)]
            yield "mamba_selective_scan", [*scan, (b, d, n)], [x, (b, d, n)], {}, variant, "int32"
            yield "mamba_selective_scan_backward", [x, *scan, None, x], scan, {}, variant, "int32"
            # the decoding steps: the state updated in place, position and valid int32 or int64 [1]
            for index in ("int32", "int64"):
                yield "mamba_conv1d_step", [x, w, state, (1,), (1,), (d,)], [x, state], conv, variant, index
                yield "mamba_conv1d_step", [x, w, state, (1,), (1,)], [x, state], \
                    {**conv, "activation": "none"}, variant, index
                yield "mamba_selective_scan_step", [*scan, (b, d, n), (1,), (1,)], [x, (b, d, n)], {}, variant, index
    yield "clip_factor", [()], [()], {"max_norm": 1.0}, "fp32", "int32"


CASES = list(cases())


def test_cases_cover_every_primitive():
    assert {c[0] for c in CASES} == set(cuda.PRIMITIVES)


def check_plan(name, plan, inputs, outputs):
    prim = cuda.primitive(name)
    buffers = {"in": set(prim.inputs), "out": set(prim.outputs), "scratch": set(plan.scratch),
               "table": set(plan.tables)}
    assert plan.launches, f"{name}: no launch"
    for step in plan.steps:
        if isinstance(step, cuda.Memset):
            space, buffer = step.buffer.split(":")
            assert space in ("out", "scratch") and buffer in buffers[space], step
            continue
        assert step.kernel.name in prim.kernels, f"{name} launches {step.kernel.name}, not listed in its kernels"
        assert step.symbol in step.kernel.symbols.values()
        gx, gy, gz = step.grid
        bx, by, bz = step.block
        assert 0 < gx < 2**31 and 0 < gy <= 65535 and 0 < gz <= 65535, f"{step.symbol}: grid {step.grid}"
        assert 0 < bx <= 1024 and 0 < by <= 1024 and 0 < bz <= 64, f"{step.symbol}: block {step.block}"
        assert step.threads <= 1024 and step.threads % 32 == 0, f"{step.symbol}: {step.threads} threads per block"
        if "__launch_bounds__(512)" in _signature_text(step.kernel):
            assert step.threads <= 512, f"{step.symbol} is compiled for at most 512 threads, launched with {step.block}"
        assert 0 <= step.shared <= 48 * 1024
        if by > 1 or bx < 32:  # a row kernel: a power-of-two group of threads per row
            assert bx & (bx - 1) == 0, f"{step.symbol}: {bx} threads per row"
        assert [a.kind for a in step.args] == [kind for _, kind in step.kernel.params]
        for arg, (param, kind) in zip(step.args, step.kernel.params):
            if kind == "ptr" and arg.value is not None:
                space, buffer = arg.value.split(":")
                assert buffer in buffers[space], f"{step.symbol}: argument {param} names unknown {arg.value}"
            elif kind in ("i32", "i64"):
                assert isinstance(arg.value, int) and (kind == "i64" or -2**31 <= arg.value < 2**31)
            elif kind in ("f32", "f64"):
                assert math.isfinite(arg.value)
    for size in plan.scratch.values():
        assert size > 0
    offsets = plan.scratch_offsets()
    assert all(o % cuda.SCRATCH_ALIGN == 0 for o in offsets.values())
    assert plan.scratch_bytes >= sum(plan.scratch.values())


def _signature_text(kernel: cuda.Kernel) -> str:
    text = kernel.source.read_text()
    symbol = next(iter(kernel.symbols.values()))
    at = text.index(f"{symbol}(")
    return text[text.rindex("extern", 0, at):at]


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_launch_configurations_are_valid(case):
    name, inputs, outputs, attrs, variant, index_dtype = case
    plan = cuda.plan(name, inputs, outputs, attrs, variant, index_dtype)
    check_plan(name, plan, inputs, outputs)


def test_partial_sums_are_sized_by_the_grid_that_writes_them():
    x, w = (8, 1024, 2048), (2048,)
    plan = cuda.plan("rmsnorm_backward", [x, x, w, x[:-1]], [x, w], variant="bf16")
    bwd, reduce = plan.launches
    assert bwd.grid[0] <= cuda.PARTIALS_CAP
    assert dict(zip((p for p, _ in reduce.kernel.params), (a.value for a in reduce.args)))["parts"] == bwd.grid[0]
    assert plan.scratch["dw_partial"] == 4 * bwd.grid[0] * 2048
    norm = cuda.plan("global_norm", [(1000, 1000), (5,)], [()], variant="fp32")
    partial, finish = norm.launches
    assert finish.args[1].value == partial.grid[0] and norm.scratch["partial"] == 4 * partial.grid[0]


def test_row_blocks_hold_a_row_in_registers_up_to_the_cap():
    for cols, itemsize in [(2048, 2), (128, 2), (4096, 4), (100, 2), (1, 4)]:
        g, r, _ = cuda.row_block(cols, itemsize, cuda.FWD_ITEMS)
        vec = 16 // itemsize
        vectors = cols // vec if cols % vec == 0 else cols
        assert math.ceil(vectors / g) <= cuda.FWD_ITEMS and g * r >= 32
    assert cuda.row_block(2048, 2, cuda.FWD_ITEMS) == (64, 4, 1)  # 256 vectors of 8 bf16: 4 per thread
    assert cuda.row_block(10**6, 4, cuda.FWD_ITEMS)[0] == cuda.MAX_GROUP


def test_cross_entropy_plans_follow_the_reduction():
    n, v = 64, 1000
    none = cuda.plan("cross_entropy", [(n, v), (n,)], [(n,), (n,)], {"reduction": "none"}, "bf16")
    assert [s.kernel.name for s in none.launches] == ["cross_entropy_fwd"] and not none.scratch
    assert none.launches[0].args[2].value == "out:loss"
    mean = cuda.plan("cross_entropy", [(n, v), (n,)], [(), (n,)], {"reduction": "mean"}, "bf16")
    assert [s.kernel.name for s in mean.launches] == ["cross_entropy_fwd", "cross_entropy_reduce"]
    assert mean.launches[1].args[-1].value == 1
    back = cuda.plan("cross_entropy_backward", [(), (n, v), (n,), (n,)], [(n, v)], {"reduction": "mean"}, "fp32")
    assert [s.kernel.name for s in back.launches] == ["cross_entropy_mean_scale", "cross_entropy_bwd"]
    assert back.launches[1].args[0].value == "scratch:d_scale"
    summed = cuda.plan("cross_entropy_backward", [(), (n, v), (n,), (n,)], [(n, v)], {"reduction": "sum"}, "fp32")
    assert [s.kernel.name for s in summed.launches] == ["cross_entropy_bwd"]
    assert summed.launches[0].args[0].value == "in:d_loss" and summed.launches[0].args[-1].value == 0


def test_embedding_backward_zeroes_its_gradient_first():
    plan = cuda.plan("embedding_backward", [(4, 8, 64), (4, 8)], [(100, 64)], variant="bf16")
    assert plan.steps[0] == cuda.Memset("out:d_weight")


@pytest.mark.parametrize("name, inputs, attrs", [
    ("softmax", [(4, 8)], {"dim": 0}),
    ("reduce_sum", [(2, 3, 4)], {"dims": [0, 2]}),
    ("add", [(4, 1, 8), (1, 5, 8)], {}),
    ("add", [(4, 1, 8), (4, 5, 8)], {}),
    ("add3", [(4, 8), (4, 8), (8,)], {}),
    ("rope", [(2, 8, 16), (2, 8, 16), (8, 8, 2)], {}),
    ("scale", [(4,)], {}),
    ("add_scalar", [(4,)], {}),
    ("causal_mask", [(4,)], {}),  # scores have a query and a key dim
    ("sub", [(1, 8), (4, 8)], {}),  # the first operand broadcast: sub and div do not commute
    ("div", [(8,), (4, 8)], {}),
    ("flash_attention", [(1, 2, 8, 64), (1, 2, 8, 64), (1, 2, 8, 64), (2,)], {}),  # ALiBi
    ("flash_attention", [(1, 2, 8, 257), (1, 2, 8, 257), (1, 2, 8, 257)], {}),  # D > 256
    ("flash_attention", [(1, 8, 2, 264), (1, 8, 2, 264), (1, 8, 2, 264)], {"layout": "bthd"}),
    ("flash_attention_backward", [(1, 2, 8, 264)] * 5 + [(1, 2, 8)], {}),
    ("flash_attention", [(1, 3, 8, 64), (1, 2, 8, 64), (1, 2, 8, 64)], {}),  # H not a multiple of Hkv
    ("flash_attention", [(1, 2, 8, 64), (1, 2, 8, 64), (1, 2, 8, 64)], {"layout": "bhdt"}),
    ("flash_attention", [(1, 2, 8, 64), (1, 2, 8, 64), (1, 2, 8, 64)], {"window_size": -1}),
    ("flash_attention", [(1, 2, 0, 64), (1, 2, 8, 64), (1, 2, 8, 64)], {}),
    ("flash_attention", [(1, 2, 8, 64), (1, 2, 8, 64), (1, 2, 8, 64)], {"softcap": -1.0}),
    ("flash_attention", [(1, 2, 8, 64), (1, 2, 8, 64), (1, 2, 8, 64)], {"softcap": math.inf}),
    ("flash_attention", [(1, 2, 8, 64), (1, 2, 8, 64), (1, 2, 8, 64)], {"softcap": math.nan}),
    ("flash_attention_backward", [(1, 2, 8, 64)] * 5 + [(1, 2, 8)], {"softcap": 1e-40}),  # 0 in fp32
    ("flash_attention_backward", [(1, 2, 9, 64), (1, 2, 9, 64), (1, 2, 8, 64), (1, 2, 8, 64), (1, 2, 9, 64),
                                  (1, 2, 9)], {"causal": True}),  # the first query sees no key
    ("flash_attention_backward", [(1, 2, 9, 64), (1, 2, 9, 64), (1, 2, 8, 64), (1, 2, 8, 64), (1, 2, 9, 64),
                                  (1, 2, 9)], {"causal": False, "window_size": 4}),
])
def test_what_the_kernels_do_not_cover_is_reported(name, inputs, attrs):
    with pytest.raises(cuda.NotCovered):
        cuda.plan(name, inputs, [], attrs, "fp32")


@pytest.mark.parametrize("layout", cuda.ATTENTION_LAYOUTS)
@pytest.mark.parametrize("variant", cuda.VARIANTS)
def test_softcapped_attention_is_covered_and_every_launch_takes_the_cap(variant, layout):
    """Attention-logit softcapping (Gemma 2) runs on attention.cu: the forward, d_k/d_v and d_q
    launches get the cap as their ``softcap`` argument (0 without one); the delta launch has none."""
    q, k, lse = ((2, 8, 37, 64), (2, 4, 37, 64), (2, 8, 37)) if layout == "bhtd" else \
        ((2, 37, 8, 64), (2, 37, 4, 64), (2, 8, 37))
    for softcap, want in ((30.0, 30.0), (0.0, 0.0), (None, 0.0)):
        attrs = {"causal": True, "window_size": 16, "layout": layout}
        if softcap is not None:
            attrs["softcap"] = softcap
        forward = cuda.plan("flash_attention", [q, k, k, None], [q, lse], attrs, variant)
        backward = cuda.plan("flash_attention_backward", [q, q, k, k, q, lse], [q, k, k], attrs, variant)
        launches = [*forward.launches, *backward.launches]
        assert [s.kernel.name for s in launches] == ["attention_fwd", "attention_bwd_pre", "attention_bwd_dkdv",
                                                     "attention_bwd_dq"]
        for step in launches:
            params = dict(zip((name for name, _ in step.kernel.params), step.args))
            if step.kernel.name == "attention_bwd_pre":
                assert "softcap" not in params
                continue
            assert step.kernel.params[-1] == ("softcap", "f32") and params["softcap"].kind == "f32"
            assert params["softcap"].value == want and params["window"].value == 16
        check_plan("flash_attention", forward, [q, k, k, None], [q, lse])
        check_plan("flash_attention_backward", backward, [q, q, k, k, q, lse], [q, k, k])


@pytest.mark.parametrize("d, tiles", [
    (2, {"fwd": 64, "dkdv": 32, "dq": 32}), (64, {"fwd": 64, "dkdv": 32, "dq": 32}),
    (65, {"fwd": 32, "dkdv": 32, "dq": 32}), (128, {"fwd": 32, "dkdv": 32, "dq": 32}),
    (129, {"fwd": 16, "dkdv": 16, "dq": 16}), (160, {"fwd": 16, "dkdv": 16, "dq": 16}),
    (192, {"fwd": 16, "dkdv": 16, "dq": 16}), (256, {"fwd": 16, "dkdv": 16, "dq": 16}),
])
@pytest.mark.parametrize("variant", cuda.VARIANTS)
def test_attention_kernels_and_grids_by_head_dim(d, tiles, variant):
    """Head dims up to 128 run attention.cu's first kernels, wider ones (up to 256) the "_d256" ones,
    on smaller tiles: the grids divide T (forward, d_q) and S (d_k/d_v) by attention_tiles."""
    b, h, hkv, t, s = 2, 8, 4, 37, 45
    q, k, lse = (b, h, t, d), (b, hkv, s, d), (b, h, t)
    assert cuda.attention_tiles(d) == tiles
    wide = "_d256" if d > 128 else ""
    (forward,) = cuda.plan("flash_attention", [q, k, k, None], [q, lse], {"causal": False}, variant).launches
    pre, dkdv, dq = cuda.plan("flash_attention_backward", [q, q, k, k, q, lse], [q, k, k], {"causal": False},
                              variant).launches
    assert [forward.kernel.name, pre.kernel.name, dkdv.kernel.name, dq.kernel.name] == [
        f"attention_fwd{wide}", "attention_bwd_pre", f"attention_bwd_dkdv{wide}", f"attention_bwd_dq{wide}"]
    assert forward.grid == (-(-t // tiles["fwd"]), h, b) and dq.grid == (-(-t // tiles["dq"]), h, b)
    assert dkdv.grid == (-(-s // tiles["dkdv"]), hkv, b)
    assert all(step.block == (cuda.ATTENTION_THREADS, 1, 1) and step.shared == 0
               for step in (forward, pre, dkdv, dq))
    for step in (forward, dkdv, dq):
        assert dict(zip((name for name, _ in step.kernel.params), (a.value for a in step.args)))["D"] == d


def test_unknown_primitive_and_variant():
    with pytest.raises(KeyError, match="covered:"):
        cuda.plan("kv_cache_attention", [], [])
    with pytest.raises(cuda.NotCovered, match="variant"):
        cuda.plan("clip_factor", [()], [()], {"max_norm": 1.0}, "bf16")


@pytest.mark.parametrize("big, small", [
    ((4, 5, 8), (8,)), ((4, 5, 8), (5, 8)), ((4, 5, 8), (5, 1)), ((4, 5, 8), (4, 1, 1)), ((4, 5, 8), (1,)),
    ((4, 5, 8), ()), ((4, 5, 8), (4, 5, 8)), ((1, 5, 1), (5, 1)), ((3, 1, 6), (1, 6)), ((2, 3, 4, 5), (3, 4, 1)),
])
def test_broadcast_pattern_pairs_elements_as_numpy(big, small):
    b_n, b_inner = cuda.broadcast_pattern(big, small)
    index = np.arange(math.prod(small)).reshape(small) if small else np.array(0)
    paired = np.broadcast_to(index, big).reshape(-1)
    i = np.arange(math.prod(big))
    assert np.array_equal(paired, (i // b_inner) % b_n)


@pytest.mark.parametrize("index_dtype", ["int32", "int64"])
def test_the_mamba_decoding_steps_update_their_state_in_place_and_read_the_run_on_the_device(index_dtype):
    """The state is an input and the output of the same name, passed once (the kernel updates it);
    position and valid are device pointers of the index dtype (idx64), not scalars."""
    conv = cuda.plan("mamba_conv1d_step", [(2, 6, 1), (6, 1, 4), (2, 6, 3), (1,), (1,), (6,)], [(2, 6, 1), (2, 6, 3)],
                     {"kernel_size": 4}, "bf16", index_dtype)
    scan = cuda.plan("mamba_selective_scan_step", [(2, 6, 1), (2, 6, 1), (6, 16), (2, 2, 16, 1), (2, 2, 16, 1), (6,),
                                                   (6,), (2, 6, 16), (1,), (1,)], [(2, 6, 1), (2, 6, 16)], {}, "fp32",
                     index_dtype)
    for name, plan, state in (("mamba_conv1d_step", conv, "conv_state"), ("mamba_selective_scan_step", scan,
                                                                          "ssm_state")):
        prim = cuda.primitive(name)
        assert state in prim.inputs and state in prim.outputs and prim.outputs[0] == "y"
        assert prim.dtype("position", "bf16", index_dtype) == prim.dtype("valid", "fp32", index_dtype) == index_dtype
        (launch,) = plan.steps
        args = dict(zip((n for n, _ in launch.kernel.params), launch.args))
        assert args[state].value == f"in:{state}" and args["y"].value == "out:y"
        assert args["position"].value == "in:position" and args["valid"].value == "in:valid"
        assert args["idx64"].value == (index_dtype == "int64")
    assert dict(zip((n for n, _ in conv.steps[0].kernel.params), conv.steps[0].args))["bias"].value == "in:bias"


@pytest.mark.parametrize("variant", ["bf16", "fp32"])
def test_an_accumulating_embedding_gradient_keeps_what_its_output_holds(variant):
    """The scatter-add zeroes d_weight first, unless the launch accumulates into it (a gradient
    straight into its grads buffer)."""
    shapes = dict(inputs=[(2, 5, 8), (2, 5)], outputs=[(16, 8)], variant=variant)
    plain = cuda.plan("embedding_backward", attrs={}, **shapes)
    accumulating = cuda.plan("embedding_backward", attrs={"accumulate": True}, **shapes)
    assert [type(s).__name__ for s in plain.steps] == ["Memset", "Launch"]
    assert [type(s).__name__ for s in accumulating.steps] == ["Launch"]
    assert accumulating.steps[0] == plain.steps[1]
