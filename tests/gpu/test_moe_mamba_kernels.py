"""The Mixture-of-Experts and Mamba CUDA kernels (kernels/moe.cu, kernels/mamba.cu) against their
numpy references (kernels/reference.py), on a GPU or the CPU emulator.

Random inputs on several shapes: uneven expert loads and an expert with no token, top_k 1 and 2,
softmax and sigmoid routers, every grouped-GEMM layout with empty groups and rows outside every
group, convs with and without bias and initial state, scans with one group and several, with and
without an initial state, state sizes past one warp's lanes; the decoding steps at position 0 over
a NaN state (which they must not read), over a carried state, with padding steps after the real
ones (which must leave no trace in the state), one step, int32 and int64 runs, several runs chained
through the state the kernels leave, and runs the reference refuses (NaN). Every output starts as NaN
(poisoned), so an element a kernel forgets to write fails. The reference runs in float64 on the
values the kernel reads (inputs rounded to the variant's storage type); index outputs must be
equal, float outputs within the tolerances of test_kernels.py (1e-5 fp32, 1e-2 bf16, relative,
or relative to the tensor's largest value for elements near zero).

``MDSL_KERNEL_RUNNER=emulator python -m pytest tests/gpu/test_moe_mamba_kernels.py`` runs them
on the CPU.
"""

from __future__ import annotations

import numpy as np
import pytest
from harness import GPU, close, ids, make_runner, rounded, run_plan, skip_without_runner

from modeldsl.kernels import cuda
from modeldsl.kernels.reference import REFERENCES

pytestmark = pytest.mark.gpu

skip_without_runner()
TOL = {"fp32": 1e-5, "bf16": 1e-2}
VARIANTS = ("fp32", "bf16")


@pytest.fixture(scope="module")
def runner():
    return make_runner()


def check(runner, name, inputs, attrs=None, variant="fp32", tol=None, index_dtype="int32"):
    """Run primitive ``name`` through its CUDA plan and compare every output with the reference
    (``None`` in ``inputs``: an absent optional operand)."""
    prim = cuda.primitive(name)
    attrs = dict(attrs or {})
    ref_inputs = []
    for buffer, array in zip(prim.inputs, inputs):
        dtype = prim.dtype(buffer, variant, index_dtype)
        is_float = array is not None and dtype in ("fp32", "bf16")
        ref_inputs.append(rounded(array, dtype) if is_float else array)
    want = REFERENCES[name](*[a.copy() if isinstance(a, np.ndarray) else a for a in ref_inputs], **attrs)
    want = want if isinstance(want, tuple) else (want,)
    result = run_plan(runner, name, inputs, [np.shape(w) for w in want], attrs, variant, index_dtype)
    for buffer, expected in zip(prim.outputs, want):
        got = result.outputs[buffer]
        dtype = prim.dtype(buffer, variant, index_dtype)
        what = f"{name} {variant} output {buffer} (inputs {[np.shape(a) for a in inputs]}, attrs {attrs})"
        if dtype.startswith("int"):
            np.testing.assert_array_equal(got, expected, err_msg=what)
        else:
            close(got, expected, (tol or TOL)[dtype], what)
    return result


# ----------------------------------------------------------------------------
# MoE: offsets, permutation, unpermutation
# ----------------------------------------------------------------------------


def routing(rng, tokens, top_k, experts, skip=()):
    """indices [tokens, top_k] int32: distinct experts per token, uneven loads (a skewed choice),
    the experts in ``skip`` never chosen."""
    p = np.array([0.0 if e in skip else 1.0 + 3.0 * (e % 3) for e in range(experts)])
    p /= p.sum()
    return np.stack([rng.choice(experts, size=top_k, replace=False, p=p) for _ in range(tokens)]).astype(np.int32)


# (tokens, top_k, experts, channels, experts with no token)
ROUTING = [(1, 1, 1, 1, ()), (7, 1, 4, 5, (2,)), (9, 2, 5, 33, (0, 3)), (40, 2, 8, 64, (7,)), (300, 2, 6, 20, (1,)),
           (513, 1, 3, 7, ())]
if GPU:
    ROUTING += [(4096, 2, 64, 1024, (5,)), (2048, 8, 128, 256, ())]


@pytest.mark.parametrize("case", ROUTING, ids=ids(ROUTING))
def test_moe_compute_offsets(runner, case):
    tokens, top_k, experts, _, skip = case
    indices = routing(np.random.default_rng(10), tokens, top_k, experts, skip)
    result = check(runner, "moe_compute_offsets", [indices], {"num_experts": experts})
    offsets = result.outputs["offsets"]
    for e in skip:
        assert offsets[e] == offsets[e + 1]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("case", ROUTING, ids=ids(ROUTING))
def test_moe_permute_and_unpermute(runner, case, variant):
    tokens, top_k, experts, channels, skip = case
    rng = np.random.default_rng(11)
    indices = routing(rng, tokens, top_k, experts, skip)
    offsets = REFERENCES["moe_compute_offsets"](indices, num_experts=experts)
    x = rng.standard_normal((tokens, channels))
    result = check(runner, "moe_permute", [x, indices, offsets], {}, variant)
    scatter = result.outputs["scatter_indices"]
    eo = rng.standard_normal((tokens * top_k, channels))
    weights = rng.uniform(0.1, 1.0, (tokens, top_k))
    check(runner, "moe_unpermute", [eo, weights, scatter], {}, variant)
    d_combined = rng.standard_normal((tokens, channels))
    check(runner, "moe_unpermute_backward", [d_combined, eo, weights, scatter], {}, variant)


def test_moe_permute_keeps_the_assignment_order_within_an_expert(runner):
    """Every assignment to one expert: the rows follow the assignments (a stable rank)."""
    indices = np.zeros((600, 1), np.int32)  # more than one 256-thread block scan
    indices[::7] = 1
    offsets = REFERENCES["moe_compute_offsets"](indices, num_experts=2)
    x = np.arange(600, dtype=np.float64)[:, None] * np.ones((1, 3))
    result = check(runner, "moe_permute", [x, indices, offsets])
    scatter = result.outputs["scatter_indices"]
    zero = np.flatnonzero(indices[:, 0] == 0)
    assert np.array_equal(scatter[zero], np.arange(zero.size))
    assert np.array_equal(result.outputs["permuted"][: zero.size, 0], zero.astype(np.float32))


# ----------------------------------------------------------------------------
# MoE: grouped GEMM
# ----------------------------------------------------------------------------

# (tokens, K, N, offsets): groups with no rows, rows before the first and after the last group
GROUPED = [(1, 1, 1, [0, 1]), (20, 8, 12, [0, 20]), (40, 17, 24, [2, 5, 5, 20, 37]), (35, 33, 5, [0, 0, 16, 35]),
           (64, 16, 16, [0, 16, 32, 48, 64]), (50, 40, 20, [0, 3, 3, 3, 30, 31, 50])]
if GPU:
    GROUPED += [(4096, 512, 1024, list(np.linspace(0, 4096, 17).astype(int))), (3000, 256, 384, [0, 7, 1500, 2999])]
MODES = ("TN", "NN", "NT", "TT")


def grouped_inputs(rng, case, mode):
    tokens, k, n, offsets = case
    groups = len(offsets) - 1
    x = rng.standard_normal((k, tokens) if mode[1] == "T" else (tokens, k))
    w = rng.standard_normal((groups, n, k) if mode[0] == "T" else (groups, k, n)) / np.sqrt(k)
    return x, w, np.array(offsets, np.int32)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", GROUPED, ids=ids(GROUPED))
def test_grouped_gemm(runner, case, mode, variant):
    rng = np.random.default_rng(12)
    x, w, offsets = grouped_inputs(rng, case, mode)
    check(runner, "grouped_gemm", [x, w, offsets], {"transpose": mode}, variant)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("case", GROUPED, ids=ids(GROUPED))
def test_grouped_gemm_weight_grad(runner, case, variant):
    tokens, k, n, offsets = case
    rng = np.random.default_rng(13)
    x, d_out = rng.standard_normal((tokens, k)), rng.standard_normal((tokens, n))
    check(runner, "grouped_gemm_weight_grad", [x, d_out, np.array(offsets, np.int32)], {}, variant)


# ----------------------------------------------------------------------------
# MoE: router
# ----------------------------------------------------------------------------

# (tokens, channels, experts, top_k)
ROUTER = [(1, 1, 1, 1), (5, 8, 4, 1), (9, 33, 6, 2), (40, 64, 8, 2), (17, 100, 3, 3)]
if GPU:
    ROUTER += [(4096, 1024, 64, 8), (1000, 2048, 128, 2)]
ROUTER_MODES = [(True, False, 0.01), (False, False, 0.1), (True, True, 0.01), (False, True, 0.0)]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("normalize, use_sigmoid, coef", ROUTER_MODES, ids=ids(ROUTER_MODES))
@pytest.mark.parametrize("case", ROUTER, ids=ids(ROUTER))
def test_moe_router(runner, case, normalize, use_sigmoid, coef, variant):
    tokens, channels, experts, top_k = case
    rng = np.random.default_rng(14)
    x = rng.standard_normal((tokens, channels))
    gate = rng.standard_normal((experts, channels)) / np.sqrt(channels)
    attrs = {"normalize": normalize, "aux_loss_coef": coef, "use_sigmoid": use_sigmoid}
    result = check(runner, "moe_router", [x, gate], {"top_k": top_k, **attrs}, variant)
    if experts == 1:  # one expert: every gradient cancels to rounding residue (0 in exact arithmetic)
        return
    indices = result.outputs["indices"]
    d_weights = rng.standard_normal((tokens, top_k))
    check(runner, "moe_router_backward", [d_weights, x, gate, indices], attrs, variant)


def test_moe_router_breaks_ties_by_the_lower_index(runner):
    """Equal scores (a zero gate): the experts in index order, as a stable descending sort."""
    x = np.ones((3, 4))
    gate = np.zeros((5, 4))
    result = check(runner, "moe_router", [x, gate], {"top_k": 3, "normalize": True})
    assert np.array_equal(result.outputs["indices"], np.tile(np.arange(3, dtype=np.int32), (3, 1)))


# ----------------------------------------------------------------------------
# Mamba: causal depthwise conv
# ----------------------------------------------------------------------------

# (B, D, T, kernel_size): fewer steps than the state holds, kernel sizes 2..8
CONV = [(1, 1, 1, 4), (2, 3, 10, 4), (1, 5, 2, 4), (2, 4, 17, 2), (1, 2, 7, 8), (3, 6, 33, 3)]
if GPU:
    CONV += [(8, 1024, 512, 4), (2, 2048, 1000, 4)]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("activation", ["silu", "none"])
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("case", CONV, ids=ids(CONV))
def test_mamba_conv1d(runner, case, with_bias, activation, variant):
    b, d, t, ks = case
    rng = np.random.default_rng(15)
    x = rng.standard_normal((b, d, t))
    weight = rng.standard_normal((d, 1, ks)) / np.sqrt(ks)
    bias = rng.standard_normal(d) if with_bias else None
    attrs = {"kernel_size": ks, "activation": activation}
    check(runner, "mamba_conv1d", [x, weight, bias, None], attrs, variant)
    state = rng.standard_normal((b, d, ks - 1))
    check(runner, "mamba_conv1d", [x, weight, bias, state], attrs, variant)
    d_y = rng.standard_normal((b, d, t))
    check(runner, "mamba_conv1d_backward", [d_y, x, weight, bias], attrs, variant)


# ----------------------------------------------------------------------------
# Mamba: selective scan
# ----------------------------------------------------------------------------

# (B, D, T, N, G): one group and several (G = D too), states past one warp (N > 32)
SCAN = [(1, 1, 1, 1, 1), (2, 8, 13, 16, 1), (2, 8, 37, 16, 2), (1, 6, 20, 40, 3), (2, 4, 9, 5, 4), (1, 4, 6, 70, 1)]
if GPU:
    SCAN += [(4, 512, 512, 16, 1), (2, 256, 300, 128, 8)]


def scan_inputs(rng, case, with_state):
    b, d, t, n, g = case
    u = rng.standard_normal((b, d, t))
    delta = 0.5 * rng.standard_normal((b, d, t))
    a_log = np.log(rng.uniform(1.0, 8.0, (d, n)))
    b_proj, c_proj = rng.standard_normal((b, g, n, t)), rng.standard_normal((b, g, n, t))
    d_skip, dt_bias = rng.standard_normal(d), rng.uniform(-3.0, -1.0, d)
    state = rng.standard_normal((b, d, n)) if with_state else None
    return [u, delta, a_log, b_proj, c_proj, d_skip, dt_bias, state]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("with_state", [False, True])
@pytest.mark.parametrize("case", SCAN, ids=ids(SCAN))
def test_mamba_selective_scan(runner, case, with_state, variant):
    rng = np.random.default_rng(16)
    inputs = scan_inputs(rng, case, with_state)
    attrs = {"chunk_size": 8}
    result = check(runner, "mamba_selective_scan", inputs, attrs, variant)
    d_y = rng.standard_normal(inputs[0].shape)
    check(runner, "mamba_selective_scan_backward", [d_y, *inputs, result.outputs["y"]], attrs, variant)


# ----------------------------------------------------------------------------
# Mamba: the decoding steps (the state updated in place, the run read from device memory)
# ----------------------------------------------------------------------------

# (position, valid as a function of T): a new sequence over a junk (NaN) state, a carried state,
# a carried state with padding steps after the real ones, a new sequence with padding
RUNS = [(0, lambda t: t), (7, lambda t: t), (3, lambda t: max(1, t - 2)), (0, lambda t: 1)]
RUN_IDS = ["new", "carried", "carried-padded", "new-padded"]


def run_tensors(position, valid, index_dtype="int32"):
    return np.array([position], index_dtype), np.array([valid], index_dtype)


def carried_state(rng, shape, position):
    """A random state to carry on from, or at position 0 one of NaN (the kernel must not read it)."""
    return rng.standard_normal(shape) if position > 0 else np.full(shape, np.nan)


# (B, D, T, kernel_size): one step (decoding), fewer steps than the state holds, a prompt's run
CONV_STEP = [(1, 1, 1, 4), (2, 5, 1, 4), (1, 3, 2, 4), (2, 4, 9, 4), (1, 6, 5, 2), (2, 3, 11, 8), (1, 2, 3, 1)]
if GPU:
    CONV_STEP += [(1, 5120, 1, 4), (4, 2048, 256, 4)]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("activation", ["silu", "none"])
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("run", RUNS, ids=RUN_IDS)
@pytest.mark.parametrize("case", CONV_STEP, ids=ids(CONV_STEP))
def test_mamba_conv1d_step(runner, case, run, with_bias, activation, variant):
    b, d, t, ks = case
    position, valid = run[0], run[1](t)
    rng = np.random.default_rng(17)
    x = rng.standard_normal((b, d, t))
    weight = rng.standard_normal((d, 1, ks)) / np.sqrt(ks)
    bias = [rng.standard_normal(d)] if with_bias else []
    state = carried_state(rng, (b, d, ks - 1), position)
    attrs = {"kernel_size": ks, "activation": activation}
    check(runner, "mamba_conv1d_step", [x, weight, state, *run_tensors(position, valid), *bias], attrs, variant)


# (B, D, T, N, G): one step (decoding), one group and several (G = D too), states past one warp
SCAN_STEP = [(1, 1, 1, 1, 1), (2, 8, 1, 16, 2), (1, 6, 1, 40, 3), (2, 8, 7, 16, 1), (1, 4, 5, 70, 4),
             (2, 6, 12, 33, 2)]
if GPU:
    SCAN_STEP += [(1, 5120, 1, 16, 1), (2, 1024, 128, 128, 8)]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("run", RUNS, ids=RUN_IDS)
@pytest.mark.parametrize("case", SCAN_STEP, ids=ids(SCAN_STEP))
def test_mamba_selective_scan_step(runner, case, run, variant):
    b, d, t, n, _ = case
    position, valid = run[0], run[1](t)
    rng = np.random.default_rng(18)
    inputs = scan_inputs(rng, case, False)[:7]
    state = carried_state(rng, (b, d, n), position)
    check(runner, "mamba_selective_scan_step", [*inputs, state, *run_tensors(position, valid)], {}, variant)


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_decoding_steps_take_int64_runs(runner, variant):
    rng = np.random.default_rng(19)
    x, weight = rng.standard_normal((2, 3, 6)), rng.standard_normal((3, 1, 4))
    runs = run_tensors(2**32, 4, "int64")  # a position whose low 32 bits are 0: read as int32, a new sequence
    check(runner, "mamba_conv1d_step", [x, weight, rng.standard_normal((2, 3, 3)), *runs], {}, variant,
          index_dtype="int64")
    inputs = scan_inputs(rng, (2, 4, 6, 20, 2), True)
    check(runner, "mamba_selective_scan_step", [*inputs, *runs], {}, variant, index_dtype="int64")


def test_decoding_in_padded_pieces_equals_one_run_over_the_whole_sequence(runner):
    """A prompt of 5 steps in a bucket of 8 (3 padding steps of junk), then two single steps, each
    run on the state the kernel left: the outputs of the real steps and the last state are those of
    one mamba_conv1d / mamba_selective_scan over the 7 steps from a zero state."""
    rng = np.random.default_rng(20)
    b, d, n, g, ks = 2, 6, 20, 2, 4
    steps = 7
    x = rng.standard_normal((b, d, steps))
    weight, bias = rng.standard_normal((d, 1, ks)) / 2, rng.standard_normal(d)
    u, delta, a_log, b_proj, c_proj, d_skip, dt_bias, _ = scan_inputs(rng, (b, d, steps, n, g), False)
    pieces = [(0, 5, 8), (5, 6, 1), (6, 7, 1)]  # (start, end, bucket)

    def bucket(a, start, end, size):  # a's steps start..end along the last axis, padded with junk
        piece = a[..., start:end]
        junk = rng.standard_normal((*piece.shape[:-1], size - (end - start)))
        return np.concatenate([piece, junk], axis=-1)

    conv_state, ssm_state = np.full((b, d, ks - 1), np.nan), np.full((b, d, n), np.nan)
    ys, scan_ys = [], []
    for start, end, size in pieces:
        runs = run_tensors(start, end - start)
        out = run_plan(runner, "mamba_conv1d_step", [bucket(x, start, end, size), weight, conv_state, *runs, bias],
                       [(b, d, size), conv_state.shape], {"kernel_size": ks})
        ys.append(out.outputs["y"][..., : end - start])
        conv_state = out.outputs["conv_state"].copy()
        scan = [bucket(a, start, end, size) for a in (u, delta)] + [a_log] + \
               [bucket(a, start, end, size) for a in (b_proj, c_proj)] + [d_skip, dt_bias, ssm_state, *runs]
        out = run_plan(runner, "mamba_selective_scan_step", scan, [(b, d, size), ssm_state.shape])
        scan_ys.append(out.outputs["y"][..., : end - start])
        ssm_state = out.outputs["ssm_state"].copy()
    want_y, want_state = REFERENCES["mamba_conv1d"](x, weight, bias, np.zeros((b, d, ks - 1)), kernel_size=ks)
    close(np.concatenate(ys, axis=-1), want_y, TOL["fp32"], "conv y")
    close(conv_state, want_state, TOL["fp32"], "conv state")
    want_y, want_state = REFERENCES["mamba_selective_scan"](u, delta, a_log, b_proj, c_proj, d_skip, dt_bias)
    close(np.concatenate(scan_ys, axis=-1), want_y, TOL["fp32"], "scan y")
    close(ssm_state, want_state, TOL["fp32"], "scan state")


@pytest.mark.parametrize("valid", [0, 5, -1])
def test_a_run_the_reference_refuses_leaves_nan(runner, valid):
    """valid outside [1, T]: the reference raises; the kernels write NaN into y and the state."""
    rng = np.random.default_rng(21)
    runs = run_tensors(3, valid)
    out = run_plan(runner, "mamba_conv1d_step", [rng.standard_normal((1, 2, 4)), rng.standard_normal((2, 1, 4)),
                                                 rng.standard_normal((1, 2, 3)), *runs], [(1, 2, 4), (1, 2, 3)],
                   poison=0)
    assert np.isnan(out.outputs["y"]).all() and np.isnan(out.outputs["conv_state"]).all()
    inputs = scan_inputs(rng, (1, 2, 4, 3, 1), True)
    out = run_plan(runner, "mamba_selective_scan_step", [*inputs, *runs], [(1, 2, 4), (1, 2, 3)], poison=0)
    assert np.isnan(out.outputs["y"]).all() and np.isnan(out.outputs["ssm_state"]).all()
    with pytest.raises(ValueError):
        REFERENCES["mamba_conv1d_step"](np.zeros((1, 2, 4)), np.zeros((2, 1, 4)), np.zeros((1, 2, 3)), *runs)


# ----------------------------------------------------------------------------
# What the kernels do not cover
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("name, inputs, outputs, attrs", [
    ("mamba_conv1d", [(1, 2, 8), (2, 1, 9), None, None], [(1, 2, 8)], {"kernel_size": 9}),
    ("mamba_conv1d", [(1, 2, 8), (2, 1, 4), None, (1, 2, 3)], [(1, 2, 8)], {"kernel_size": 4}),
    ("mamba_selective_scan", [(1, 2, 8), (1, 2, 8), (2, 300), (1, 1, 300, 8), (1, 1, 300, 8), (2,), (2,), None],
     [(1, 2, 8), (1, 2, 300)], {}),
    ("grouped_gemm", [(4, 8), (2, 8, 8), (3,)], [(4, 8)], {"transpose": "XY"}),
    ("moe_router", [(4, 8), (3, 8)], [(4, 4), (4, 4), ()], {"top_k": 4}),
    ("moe_permute", [(0, 8), (0, 2), (5,)], [(0, 8), (0,)], {}),
    ("mamba_conv1d_step", [(1, 2, 8), (2, 1, 4), (1, 2, 4), (1,), (1,)], [(1, 2, 8), (1, 2, 4)], {}),  # state K
    ("mamba_conv1d_step", [(1, 2, 8), (2, 1, 4), (1, 2, 3), (1,), (0,)], [(1, 2, 8), (1, 2, 3)], {}),  # no valid
    ("mamba_conv1d_step", [(1, 2, 8), (2, 1, 4), (1, 2, 3), (1,), (1,)], [(1, 2, 8)], {}),  # no state out
    ("mamba_conv1d_step", [(1, 2, 8), (2, 1, 9), (1, 2, 8), (1,), (1,)], [(1, 2, 8), (1, 2, 8)],
     {"kernel_size": 9}),
    ("mamba_selective_scan_step", [(1, 2, 8), (1, 2, 8), (2, 4), (1, 1, 4, 8), (1, 1, 4, 8), (2,), (2,), None, (1,),
                                   (1,)], [(1, 2, 8), (1, 2, 4)], {}),  # no state
    ("mamba_selective_scan_step", [(1, 2, 8), (1, 2, 8), (2, 300), (1, 1, 300, 8), (1, 1, 300, 8), (2,), (2,),
                                   (1, 2, 300), (1,), (1,)], [(1, 2, 8), (1, 2, 300)], {}),  # N > 256
    ("mamba_selective_scan_step", [(1, 2, 8), (1, 2, 8), (2, 4), (1, 1, 4, 8), (1, 1, 4, 8), (2,), (2,), (1, 2, 4),
                                   None, (1,)], [(1, 2, 8), (1, 2, 4)], {}),  # no position
])
def test_what_the_kernels_do_not_cover_is_reported(name, inputs, outputs, attrs):
    with pytest.raises(cuda.NotCovered):
        cuda.plan(name, inputs, outputs, attrs, "fp32")
