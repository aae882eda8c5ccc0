"""The CUDA kernels of the primitives: where each lives, what it is called, how it is launched.

Two tables, both declarative:

- :data:`KERNELS`: every exported CUDA kernel (``extern "C" __global__``) by a
  short name: the ``kernels/<family>.cu`` file it lives in, its exported symbol
  per variant, and its parameters in order, each a pointer (``ptr``) or a
  scalar (``i32``, ``i64``, ``f32``, ``f64``).
- :data:`PRIMITIVES`: every primitive (as named by the kernel registry and the
  numpy references) that has CUDA kernels: its buffers by name (the graph op's
  inputs and outputs, in operand order) with the dtype each has in each
  variant, and a *plan* rule from the concrete shapes and attributes of one
  launch to a :class:`Plan`.

A :class:`Plan` is what a CUDA executor runs for one ``mdsl.sched.launch``: its
``steps`` in order — :class:`Launch` (symbol, grid, block, dynamic shared
memory, and the arguments in the kernel's parameter order) and :class:`Memset`
(zero a buffer that a kernel accumulates into) — plus the ``scratch`` segments
the steps share (fp32 work memory, laid out by :meth:`Plan.scratch_offsets`)
and the device ``tables`` the executor packs once its buffers have addresses
(:func:`tensor_table`, :func:`adamw_table`). A pointer argument names its
buffer as ``in:NAME``, ``out:NAME``, ``scratch:NAME`` or ``table:NAME``
(``None``: a null pointer).

Variants: ``bf16`` (bf16 storage, fp32 arithmetic) and ``fp32``; statistics
(rstd, lse, norms) and the embedding gradient are always fp32; casts name the
pair (``f32_to_bf16``, ...); gradient accumulation adds bf16 into fp32
(``f32_bf16``). Index tensors are int32 or int64 (``index_dtype``).

Shapes or attributes a kernel does not handle raise :class:`NotCovered`; the
executor then falls back or reports it. Not covered: softmax over a dim other
than the last; reductions over non-adjacent dims; ``add``/``mul`` where both
operands broadcast, or the broadcast one repeats in more than one run of dims
(``[4, 1, 8]`` against ``[4, 5, 8]``); ``add3`` with broadcasting; rope of
other than rank-4 q/k; fp16 storage (only casts); ``reduce_max_backward``; attention with
ALiBi or a head dim over 256 (see ``attention_geometry``); for MoE (moe.cu), int64 index tensors,
empty tensors, ``grouped_gemm_weight_grad`` with more than 65535 groups, and more than 65535 column
tiles (``grouped_gemm``: N, ``moe_router_backward``: C over 1048560); for Mamba (mamba.cu), a conv
``kernel_size`` over 8 (``MAMBA_MAX_CONV``), a scan state size over 256 (``MAMBA_MAX_STATE``),
activations other than silu/none, and empty tensors; the decoding steps (``mamba_conv1d_step``,
``mamba_selective_scan_step``) read their start position and count of real steps from device
memory and, where the count is outside [1, T] (the reference raises), write NaN into y and the
state. The MoE kernels take expert indices in
[0, E) (the router's): one outside is skipped, not an error, and ``moe_unpermute_backward`` takes
a scatter that is a permutation (``moe_permute``'s).
Where the reference raises (an embedding index out of range), the kernel
writes NaN rows instead. Compiling the sources:
:mod:`modeldsl.tools.build_kernels`.

Usage::

    plan = cuda.plan("rmsnorm", inputs=[(8, 1024, 2048), (2048,)], outputs=[(8, 1024, 2048), (8, 1024)],
                     attrs={"eps": 1e-5}, variant="bf16")
    for step in plan.steps: ...   # Launch(symbol='mdsl_rmsnorm_fwd_bf16', grid=(2048, 1, 1), block=(64, 4, 1), ...)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from modeldsl.kernels import dropout_mask

Shape = tuple[int, ...]

SOURCE_DIR = Path(__file__).resolve().parent
VARIANTS = ("bf16", "fp32")
SUFFIX = {"bf16": "bf16", "fp32": "f32"}
ITEMSIZE = {"bf16": 2, "fp32": 4, "fp16": 2}
SCALAR_KINDS = ("i32", "i64", "f32", "f64")

# Launch-configuration constants (the kernels' comments say the same).
ROW_THREADS = 256  # threads of a row-kernel block: G threads per row x R rows
MAX_GROUP = 512  # most threads one row gets (the row kernels' __launch_bounds__)
FWD_ITEMS = 4  # vectors per thread a forward row kernel keeps in registers (norm.cuh: kFwdItems)
BWD_ITEMS = 2  # the same for backward row kernels (kBwdItems)
GRID_CAP = 65536  # grid-stride kernels never launch more blocks than this
PARTIALS_CAP = 512  # most blocks of a kernel that writes per-block partial sums
ELEMENTWISE_THREADS = 256
SCRATCH_ALIGN = 256


class NotCovered(ValueError):
    """The CUDA kernels do not handle these shapes or attributes (the reference does)."""


# ----------------------------------------------------------------------------
# Kernels
# ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Kernel:
    """One exported kernel: the same parameters for every variant."""

    name: str
    family: str  # kernels/<family>.cu
    params: tuple[tuple[str, str], ...]  # (name, kind) in order; kind: ptr, i32, i64, f32, f64
    symbols: Mapping[str, str]  # variant -> exported symbol

    @property
    def source(self) -> Path:
        return SOURCE_DIR / f"{self.family}.cu"

    def symbol(self, variant: str) -> str:
        try:
            return self.symbols[variant]
        except KeyError:
            raise NotCovered(f"kernel {self.name} has no {variant} variant "
                             f"(it has {', '.join(self.symbols)})") from None


def _params(text: str) -> tuple[tuple[str, str], ...]:
    """``"ptr x, ptr y, i64 n"`` -> ``(("x", "ptr"), ("y", "ptr"), ("n", "i64"))``."""
    out = []
    for item in text.split(","):
        kind, name = item.split()
        assert kind == "ptr" or kind in SCALAR_KINDS, kind
        out.append((name, kind))
    return tuple(out)


KERNELS: dict[str, Kernel] = {}


def _kernel(family: str, name: str, params: str, variants: Sequence[str] = VARIANTS) -> Kernel:
    kernel = Kernel(name, family, _params(params), {v: f"mdsl_{name}_{SUFFIX.get(v, v)}" for v in variants})
    KERNELS[name] = kernel
    return kernel


_ROWS = "i64 rows, i64 D"
_kernel("embedding", "embedding_fwd", "ptr indices, ptr weight, ptr out, i64 rows, i64 D, i64 vocab, i32 idx64")
_kernel("embedding", "embedding_bwd", "ptr d_out, ptr indices, ptr d_weight, i64 rows, i64 D, i64 vocab, i32 idx64")
_kernel("rmsnorm", "rmsnorm_fwd", f"ptr x, ptr weight, ptr y, ptr rstd, {_ROWS}, f32 eps")
_kernel("rmsnorm", "fused_residual_rmsnorm_fwd",
        f"ptr residual, ptr input, ptr weight, ptr residual_out, ptr y, ptr rstd, {_ROWS}, f32 eps")
_kernel("rmsnorm", "rmsnorm_bwd", f"ptr d_y, ptr x, ptr weight, ptr rstd, ptr d_x, ptr dw_partial, {_ROWS}")
_kernel("rmsnorm", "fused_residual_rmsnorm_bwd",
        f"ptr d_y, ptr d_residual_next, ptr residual_out, ptr weight, ptr rstd, ptr d_residual, ptr d_input, "
        f"ptr dw_partial, {_ROWS}")
_kernel("rmsnorm", "rmsnorm_dw_reduce", "ptr dw_partial, ptr d_weight, i64 parts, i64 D")
_kernel("activation", "swiglu_fwd", "ptr gate, ptr up, ptr out, i64 n")
_kernel("activation", "swiglu_bwd", "ptr d_out, ptr gate, ptr up, ptr d_gate, ptr d_up, i64 n")
_kernel("activation", "geglu_fwd", "ptr gate, ptr up, ptr out, i64 n, i32 approximate")
_kernel("activation", "geglu_bwd", "ptr d_out, ptr gate, ptr up, ptr d_gate, ptr d_up, i64 n, i32 approximate")
for _name in ("split_swiglu", "split_geglu"):
    _kernel("activation", f"{_name}_fwd", "ptr gate_up, ptr out, i64 rows, i64 width")
    _kernel("activation", f"{_name}_bwd", "ptr d_out, ptr gate_up, ptr d_gate_up, i64 rows, i64 width")
for _name in ("silu", "relu", "relu2"):
    _kernel("activation", f"{_name}_fwd", "ptr x, ptr out, i64 n")
    _kernel("activation", f"{_name}_bwd", "ptr d_out, ptr x, ptr d_x, i64 n")
for _name in ("exp", "log", "tanh", "sigmoid", "rsqrt"):
    _kernel("activation", f"{_name}_fwd", "ptr x, ptr out, i64 n")
_kernel("activation", "gelu_fwd", "ptr x, ptr out, i64 n, i32 approximate")
_kernel("activation", "gelu_bwd", "ptr d_out, ptr x, ptr d_x, i64 n, i32 approximate")
_ROPE = "i64 rows_q, i64 rows_k, i64 T, i64 D, i32 interleaved, i64 heads_q, i64 heads_k"
_kernel("rope", "rope_fwd", f"ptr q, ptr k, ptr freqs, ptr q_rot, ptr k_rot, {_ROPE}")
_kernel("rope", "rope_bwd", f"ptr d_q_rot, ptr d_k_rot, ptr freqs, ptr d_q, ptr d_k, {_ROPE}")
_kernel("rope", "qk_norm_fwd", "ptr q, ptr k, ptr q_weight, ptr k_weight, ptr q_norm, ptr k_norm, ptr q_rstd, "
                               "ptr k_rstd, i64 rows_q, i64 rows_k, i64 D, f32 eps")
_kernel("rope", "qk_norm_bwd", "ptr d_q_norm, ptr d_k_norm, ptr q, ptr k, ptr q_weight, ptr k_weight, ptr q_rstd, "
                               "ptr k_rstd, ptr d_q, ptr d_k, ptr dw_partial_q, ptr dw_partial_k, i64 rows_q, "
                               "i64 rows_k, i64 D")
_kernel("rope", "qk_norm_dw_reduce", "ptr dw_partial_q, ptr dw_partial_k, ptr d_q_weight, ptr d_k_weight, "
                                     "i64 parts, i64 D")
_kernel("rope", "qk_norm_rope_fwd", "ptr q, ptr k, ptr q_weight, ptr k_weight, ptr freqs, ptr q_rot, ptr k_rot, "
                                    f"ptr q_rstd, ptr k_rstd, {_ROPE}, f32 eps")
_kernel("rope", "qk_norm_rope_bwd", "ptr d_q_rot, ptr d_k_rot, ptr q, ptr k, ptr q_weight, ptr k_weight, ptr q_rstd, "
                                    "ptr k_rstd, ptr freqs, ptr d_q, ptr d_k, ptr dw_partial_q, ptr dw_partial_k, "
                                    f"{_ROPE}")
_kernel("softmax", "softmax_fwd", "ptr x, ptr out, i64 rows, i64 C")
_kernel("softmax", "softmax_bwd", "ptr d_out, ptr out, ptr d_x, i64 rows, i64 C")
_CE = "i64 rows, i64 vocab, i64 ignore_index, i32 idx64"
_kernel("cross_entropy", "cross_entropy_fwd", f"ptr logits, ptr labels, ptr loss_rows, ptr lse, {_CE}")
_kernel("cross_entropy", "cross_entropy_reduce",
        "ptr loss_rows, ptr labels, ptr loss, i64 rows, i64 ignore_index, i32 idx64, i32 mean", ("fp32",))
_kernel("cross_entropy", "cross_entropy_mean_scale",
        "ptr d_loss, ptr labels, ptr d_scale, i64 rows, i64 ignore_index, i32 idx64", ("fp32",))
_kernel("cross_entropy", "cross_entropy_bwd", f"ptr d_scale, ptr logits, ptr labels, ptr lse, ptr d_logits, {_CE}, "
                                              "i32 per_row")
_kernel("elementwise", "add", "ptr a, ptr b, ptr out, i64 n, i64 b_n, i64 b_inner")
_kernel("elementwise", "mul", "ptr a, ptr b, ptr out, i64 n, i64 b_n, i64 b_inner")
_kernel("elementwise", "bias_add", "ptr x, ptr bias, ptr out, i64 n, i64 N")
_kernel("elementwise", "scale", "ptr x, ptr out, i64 n, f32 factor")
_kernel("elementwise", "sub", "ptr a, ptr b, ptr out, i64 n, i64 b_n, i64 b_inner")
_kernel("elementwise", "div", "ptr a, ptr b, ptr out, i64 n, i64 b_n, i64 b_inner")
_kernel("elementwise", "add_scalar", "ptr x, ptr out, i64 n, f32 value")
_kernel("elementwise", "causal_mask", "ptr x, ptr out, i64 n, i64 Tq, i64 Tk, i64 offset, i64 window, f32 fill")
_kernel("elementwise", "add3", "ptr a, ptr b, ptr c, ptr out, i64 n")
_kernel("elementwise", "dropout", "ptr x, ptr step, ptr out, i64 n, i32 key, i32 threshold, f32 scale")
_kernel("elementwise", "add_inplace", "ptr acc, ptr x, i64 n", ("bf16", "fp32", "f32_bf16"))
_kernel("reduction", "reduce_sum_rows", "ptr x, ptr out, i64 rows, i64 R, f32 divisor")
_kernel("reduction", "reduce_sum_cols", "ptr x, ptr out, i64 outer, i64 R, i64 inner, f32 divisor")
_kernel("reduction", "reduce_max_rows", "ptr x, ptr values, ptr indices, i64 rows, i64 R, i32 idx64")
_kernel("reduction", "reduce_max_cols", "ptr x, ptr values, ptr indices, i64 outer, i64 R, i64 inner, i32 idx64")
_kernel("reduction", "global_norm_partial", "ptr tensors, i64 count, ptr partial")
_kernel("reduction", "global_norm_finish", "ptr partial, i64 parts, ptr norm", ("fp32",))
_kernel("reduction", "clip_factor", "ptr norm, ptr factor, f32 max_norm", ("fp32",))
CAST_VARIANTS = ("f32_to_bf16", "bf16_to_f32", "f32_to_f16", "f16_to_f32", "bf16_to_f16", "f16_to_bf16")
_kernel("cast", "cast", "ptr x, ptr out, i64 n", CAST_VARIANTS)
DEQUANTIZE_VARIANTS = ("e4m3_to_f32", "e4m3_to_bf16", "e5m2_to_f32", "e5m2_to_bf16")
_kernel("cast", "dequantize", "ptr q, ptr scale, ptr out, i64 n, i64 cols", DEQUANTIZE_VARIANTS)
_ADAMW = "f64 beta1, f64 beta2, f64 eps"
_kernel("adamw", "adamw", "ptr param, ptr grad, ptr exp_avg, ptr exp_avg_sq, ptr param_copy, ptr lr, ptr step, "
                          f"ptr grad_scale, i64 n, {_ADAMW}, f64 weight_decay, f64 lr_scale")
_kernel("adamw", "adamw_multi", f"ptr tensors, i64 count, ptr lr, ptr step, ptr grad_scale, {_ADAMW}")
_ATTN = ("i64 B, i64 H, i64 Hkv, i64 T, i64 S, i64 D, i64 q_sb, i64 q_sh, i64 q_st, i64 k_sb, i64 k_sh, i64 k_st, "
         "f32 scale, i32 causal, i64 window, f32 softcap")
_ATTN_FWD = f"ptr q, ptr k, ptr v, ptr out, ptr lse, {_ATTN}"
_ATTN_DKDV = f"ptr d_out, ptr q, ptr k, ptr v, ptr lse, ptr delta, ptr d_k, ptr d_v, {_ATTN}"
_ATTN_DQ = f"ptr d_out, ptr q, ptr k, ptr v, ptr lse, ptr delta, ptr d_q, {_ATTN}"
_kernel("attention", "attention_fwd", _ATTN_FWD)
_kernel("attention", "attention_bwd_pre",
        "ptr d_out, ptr out, ptr delta, i64 B, i64 H, i64 T, i64 D, i64 q_sb, i64 q_sh, i64 q_st")
_kernel("attention", "attention_bwd_dkdv", _ATTN_DKDV)
_kernel("attention", "attention_bwd_dq", _ATTN_DQ)
_kernel("attention", "attention_fwd_d256", _ATTN_FWD)  # head dims over 128 (ATTENTION_WIDE_D): the same parameters
_kernel("attention", "attention_bwd_dkdv_d256", _ATTN_DKDV)
_kernel("attention", "attention_bwd_dq_d256", _ATTN_DQ)
_SEG = ", ptr segments"  # packed rows: the *_seg kernels take the example ids [B, S] (int32)
_kernel("attention", "attention_fwd_seg", _ATTN_FWD + _SEG)
_kernel("attention", "attention_bwd_dkdv_seg", _ATTN_DKDV + _SEG)
_kernel("attention", "attention_bwd_dq_seg", _ATTN_DQ + _SEG)
_kernel("attention", "attention_fwd_d256_seg", _ATTN_FWD + _SEG)
_kernel("attention", "attention_bwd_dkdv_d256_seg", _ATTN_DKDV + _SEG)
_kernel("attention", "attention_bwd_dq_d256_seg", _ATTN_DQ + _SEG)
_F32 = ("fp32",)  # kernels of int32 buffers or fp32 scratch alone: one variant
_kernel("moe", "moe_offsets", "ptr indices, ptr offsets, i64 assignments, i64 experts", _F32)
_kernel("moe", "moe_permute_scatter", "ptr indices, ptr offsets, ptr scatter, i64 assignments, i64 experts", _F32)
_kernel("moe", "moe_permute_gather", "ptr x, ptr scatter, ptr permuted, i64 assignments, i64 C, i64 top_k")
_kernel("moe", "moe_unpermute", "ptr expert_outputs, ptr weights, ptr scatter, ptr combined, i64 tokens, i64 C, "
                                "i64 top_k")
_kernel("moe", "moe_unpermute_bwd", "ptr d_combined, ptr expert_outputs, ptr weights, ptr scatter, "
                                    "ptr d_expert_outputs, ptr d_weights, i64 assignments, i64 C, i64 top_k")
_kernel("moe", "grouped_gemm_tiles", "ptr offsets, ptr tiles, i64 groups, i64 tokens, i64 max_tiles", _F32)
_kernel("moe", "grouped_gemm", "ptr input, ptr weights, ptr tiles, ptr output, i64 K, i64 N, i64 x_st, "
                               "i64 x_sk, i64 w_sk, i64 w_sn")
_kernel("moe", "grouped_gemm_wgrad", "ptr input, ptr d_output, ptr offsets, ptr d_weights, i64 tokens, i64 K, i64 N")
_ROUTER = "i64 N, i64 E, i64 C, i64 top_k, i32 normalize, i32 use_sigmoid"
_kernel("moe", "moe_router_fwd", f"ptr x, ptr gate, ptr weights, ptr indices, ptr probs, {_ROUTER}")
_kernel("moe", "moe_router_aux", "ptr indices, ptr probs, ptr aux_loss, i64 N, i64 E, i64 top_k, f32 coef", _F32)
_kernel("moe", "moe_router_bwd_counts", "ptr indices, ptr d_probs, i64 N, i64 E, i64 top_k, f32 coef", _F32)
_kernel("moe", "moe_router_bwd_logits", "ptr d_weights, ptr x, ptr gate, ptr indices, ptr d_probs, ptr scores, "
                                        f"ptr d_logits, {_ROUTER}")
_kernel("moe", "moe_router_bwd_gemm", "ptr a, ptr b, ptr out, i64 M, i64 cols, i64 R, i64 sai, i64 sar, i64 sbr, "
                                      "i64 sbj")
_CONV = "i64 B, i64 D, i64 T, i64 K, i32 silu"
_kernel("mamba", "mamba_conv1d_fwd", f"ptr x, ptr weight, ptr bias, ptr conv_state, ptr y, ptr conv_state_out, {_CONV}")
_kernel("mamba", "mamba_conv1d_bwd",
        f"ptr d_y, ptr x, ptr weight, ptr bias, ptr d_x, ptr d_weight, ptr d_bias, {_CONV}")
_SCAN_IN = "ptr u, ptr delta, ptr a_log, ptr b_proj, ptr c_proj, ptr d_skip, ptr dt_bias, ptr ssm_state"
_SCAN = "i64 B, i64 D, i64 G, i64 N, i64 T"
_kernel("mamba", "mamba_scan_fwd", f"{_SCAN_IN}, ptr y, ptr ssm_state_out, {_SCAN}")
_kernel("mamba", "mamba_scan_bwd", f"ptr d_y, {_SCAN_IN}, ptr d_u, ptr d_delta, ptr states, ptr part_bc, ptr part_a, "
                                   f"ptr part_d, {_SCAN}, i64 P, i64 cpp")
_kernel("mamba", "mamba_scan_bwd_reduce", "ptr part_bc, ptr part_a, ptr part_d, ptr a_log, ptr d_a_log, ptr d_b_proj, "
                                          f"ptr d_c_proj, ptr d_d_skip, ptr d_dt_bias, {_SCAN}, i64 P")
_kernel("mamba", "mamba_conv1d_step",
        f"ptr x, ptr weight, ptr bias, ptr conv_state, ptr position, ptr valid, ptr y, {_CONV}, i32 idx64")
_kernel("mamba", "mamba_scan_step", f"{_SCAN_IN}, ptr position, ptr valid, ptr y, {_SCAN}, i32 idx64")


# ----------------------------------------------------------------------------
# Plans
# ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Arg:
    """One kernel argument: a pointer to a named buffer (``None``: null) or a scalar."""

    kind: str  # ptr, i32, i64, f32, f64
    value: Any  # ptr: "in:NAME" | "out:NAME" | "scratch:NAME" | "table:NAME" | None


def ptr(ref: str | None) -> Arg:
    return Arg("ptr", ref)


def i32(value: int) -> Arg:
    return Arg("i32", int(value))


def i64(value: int) -> Arg:
    return Arg("i64", int(value))


def f32(value: float) -> Arg:
    return Arg("f32", float(value))


def f64(value: float) -> Arg:
    return Arg("f64", float(value))


Dim3 = tuple[int, int, int]


@dataclass(frozen=True)
class Launch:
    """One kernel launch of a plan."""

    kernel: Kernel
    symbol: str
    grid: Dim3
    block: Dim3
    args: tuple[Arg, ...]
    shared: int = 0  # bytes of dynamic shared memory

    @property
    def family(self) -> str:
        return self.kernel.family

    @property
    def threads(self) -> int:
        return math.prod(self.block)


@dataclass(frozen=True)
class Memset:
    """Zero every byte of a buffer (``out:NAME`` or ``scratch:NAME``) before the next launch."""

    buffer: str


@dataclass(frozen=True)
class Plan:
    steps: tuple[Launch | Memset, ...]
    scratch: Mapping[str, int] = field(default_factory=dict)  # segment -> bytes
    tables: Mapping[str, str] = field(default_factory=dict)  # table -> "tensors" | "adamw" (the packer)

    def scratch_offsets(self) -> dict[str, int]:
        """Byte offset of each scratch segment: in order, each aligned to 256 bytes."""
        offsets, at = {}, 0
        for name, size in self.scratch.items():
            offsets[name] = at
            at += -(-size // SCRATCH_ALIGN) * SCRATCH_ALIGN
        return offsets

    @property
    def scratch_bytes(self) -> int:
        return sum(-(-size // SCRATCH_ALIGN) * SCRATCH_ALIGN for size in self.scratch.values())

    @property
    def launches(self) -> list[Launch]:
        return [s for s in self.steps if isinstance(s, Launch)]


@dataclass(frozen=True)
class Problem:
    """The concrete shapes and attributes of one launch of a primitive."""

    inputs: tuple[Shape | None, ...]
    outputs: tuple[Shape | None, ...]
    attrs: Mapping[str, Any]
    variant: str
    index_dtype: str = "int32"

    @property
    def itemsize(self) -> int:
        return ITEMSIZE.get(self.variant, 4)

    @property
    def idx64(self) -> int:
        return 1 if self.index_dtype == "int64" else 0

    def attr(self, name: str, default: Any = None) -> Any:
        value = self.attrs.get(name, default)
        if value is None:
            raise NotCovered(f"attribute '{name}' is required")
        return value


@dataclass(frozen=True)
class CudaPrimitive:
    """What a CUDA executor needs to run one primitive."""

    name: str
    family: str  # the .cu file of its main kernel
    inputs: tuple[str, ...]  # buffer names in operand order (a variadic group: one name)
    outputs: tuple[str, ...]
    kernels: tuple[str, ...]  # every KERNELS entry its plans may launch
    rule: Callable[[Problem], Plan]
    variants: tuple[str, ...] = VARIANTS
    # buffer -> dtype token: "T" (the variant's storage type), "fp32", "int64", "index" (index_dtype),
    # "src"/"dst" (a cast's pair), "bf16"
    dtypes: Mapping[str, str] = field(default_factory=dict)
    variadic: bool = False  # the inputs are one variadic group

    def dtype(self, buffer: str, variant: str, index_dtype: str = "int32") -> str:
        """The dtype (``bf16``, ``fp16``, ``fp32``, ``int32``, ``int64``) of a buffer in a variant."""
        token = self.dtypes.get(buffer, "T")
        if token == "index":
            return index_dtype
        if token in ("src", "dst"):
            pair = variant.split("_to_")
            return _DTYPE[pair[0] if token == "src" else pair[1]]
        if token == "T":
            if variant == "f32_bf16":  # gradient accumulation: fp32 accumulator, bf16 addend
                return "fp32" if buffer == "acc" else "bf16"
            return variant
        return token


_DTYPE = {"f32": "fp32", "bf16": "bf16", "f16": "fp16", "e4m3": "fp8_e4m3", "e5m2": "fp8_e5m2"}


def _launch(name: str, variant: str, grid: Dim3, block: Dim3, *args: Arg, shared: int = 0) -> Launch:
    kernel = KERNELS[name]
    kinds = [kind for _, kind in kernel.params]
    assert [a.kind for a in args] == kinds, f"{name}: arguments {[a.kind for a in args]} != parameters {kinds}"
    return Launch(kernel, kernel.symbol(variant), grid, block, tuple(args), shared)


# ----------------------------------------------------------------------------
# Launch configurations
# ----------------------------------------------------------------------------


def _next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def vector_width(itemsize: int) -> int:
    """Elements in one 16-byte vector."""
    return 16 // itemsize


def row_block(cols: int, itemsize: int, items: int) -> Dim3:
    """Block (G, R, 1) of a row kernel: G threads per row, the smallest power of two with
    ceil(vectors / G) <= items (at most MAX_GROUP), and R = max(1, 256 / G) rows per block."""
    vec = vector_width(itemsize)
    vectors = cols // vec if cols % vec == 0 else cols  # ragged rows run the scalar path
    g = min(MAX_GROUP, _next_pow2(_cdiv(max(vectors, 1), items)))
    return (g, max(1, ROW_THREADS // g), 1)


def row_config(rows: int, cols: int, itemsize: int, items: int = FWD_ITEMS, cap: int = GRID_CAP,
               ys: int = 1) -> tuple[Dim3, Dim3]:
    """(grid, block) of a row kernel over ``rows`` rows of ``cols`` (grid-stride over rows)."""
    block = row_block(cols, itemsize, items)
    return (max(1, min(_cdiv(rows, block[1]), cap)), ys, 1), block


def elementwise_config(n: int, per_thread: int) -> tuple[Dim3, Dim3]:
    """(grid, block) of a grid-stride kernel doing ``per_thread`` elements per thread per step."""
    return (max(1, min(_cdiv(n, ELEMENTWISE_THREADS * per_thread), GRID_CAP)), 1, 1), (ELEMENTWISE_THREADS, 1, 1)


def column_config(outer: int, inner: int, zs: int = 1) -> tuple[Dim3, Dim3]:
    """(grid, block) of a column reduction over [outer, R, inner]: block (32, 8), grid (ceil(inner / 32), outer)."""
    return (max(1, _cdiv(inner, 32)), max(1, min(outer, 65535)), zs), (32, 8, 1)


def row_threads(cols: int, itemsize: int, cap: int = 512) -> int:
    """Threads of a one-block-per-row kernel (cross-entropy): a multiple of 32 covering the row's vectors."""
    vec = vector_width(itemsize)
    vectors = cols // vec if cols % vec == 0 else cols
    return max(32, min(cap, _cdiv(vectors, 32) * 32))


SINGLE: tuple[Dim3, Dim3] = ((1, 1, 1), (1024, 1, 1))  # one block of 1024 threads


def _numel(shape: Shape | None) -> int:
    return math.prod(shape) if shape is not None else 0


def _rows(shape: Shape) -> tuple[int, int]:
    """(rows, last dim) of a tensor."""
    if not shape:
        raise NotCovered("a row kernel needs at least one dim")
    return math.prod(shape[:-1]), shape[-1]


# ----------------------------------------------------------------------------
# Plan rules, one per primitive
# ----------------------------------------------------------------------------

PRIMITIVES: dict[str, CudaPrimitive] = {}


def _primitive(name: str, family: str, inputs: str, outputs: str, kernels: str, **kw) -> Callable:
    def register(rule: Callable[[Problem], Plan]) -> Callable[[Problem], Plan]:
        PRIMITIVES[name] = CudaPrimitive(name, family, tuple(inputs.split()), tuple(outputs.split()),
                                         tuple(kernels.split()), rule, **kw)
        return rule
    return register


@_primitive("embedding", "embedding", "indices weight", "out", "embedding_fwd", dtypes={"indices": "index"})
def _embedding(p: Problem) -> Plan:
    rows, (vocab, d) = _numel(p.inputs[0]), p.inputs[1]
    grid, block = row_config(rows, d, p.itemsize)
    return Plan((_launch("embedding_fwd", p.variant, grid, block, ptr("in:indices"), ptr("in:weight"), ptr("out:out"),
                         i64(rows), i64(d), i64(vocab), i32(p.idx64)),))


@_primitive("embedding_backward", "embedding", "d_out indices", "d_weight", "embedding_bwd",
            dtypes={"indices": "index", "d_weight": "fp32"})
def _embedding_backward(p: Problem) -> Plan:
    """Scatter-adds into a zeroed d_weight; with ``accumulate`` into d_weight as it is."""
    rows, (vocab, d) = _numel(p.inputs[1]), p.outputs[0]
    grid, block = row_config(rows, d, p.itemsize)
    zero = () if p.attr("accumulate", False) else (Memset("out:d_weight"),)
    return Plan((*zero, _launch("embedding_bwd", p.variant, grid, block, ptr("in:d_out"), ptr("in:indices"),
                                ptr("out:d_weight"), i64(rows), i64(d), i64(vocab), i32(p.idx64))))


_STATS = {"rstd": "fp32"}


@_primitive("rmsnorm", "rmsnorm", "x weight", "y rstd", "rmsnorm_fwd", dtypes=_STATS)
def _rmsnorm(p: Problem) -> Plan:
    rows, d = _rows(p.inputs[0])
    grid, block = row_config(rows, d, p.itemsize)
    return Plan((_launch("rmsnorm_fwd", p.variant, grid, block, ptr("in:x"), ptr("in:weight"), ptr("out:y"),
                         ptr("out:rstd"), i64(rows), i64(d), f32(p.attr("eps", 1e-6))),))


@_primitive("fused_residual_rmsnorm", "rmsnorm", "residual input weight", "residual_out y rstd",
            "fused_residual_rmsnorm_fwd", dtypes=_STATS)
def _fused_residual_rmsnorm(p: Problem) -> Plan:
    rows, d = _rows(p.inputs[0])
    grid, block = row_config(rows, d, p.itemsize)
    return Plan((_launch("fused_residual_rmsnorm_fwd", p.variant, grid, block, ptr("in:residual"), ptr("in:input"),
                         ptr("in:weight"), ptr("out:residual_out"), ptr("out:y"), ptr("out:rstd"), i64(rows), i64(d),
                         f32(p.attr("eps", 1e-6))),))


def _dw_reduce(variant: str, parts: int, d: int) -> Launch:
    grid, block = column_config(1, d)
    return _launch("rmsnorm_dw_reduce", variant, grid, block, ptr("scratch:dw_partial"), ptr("out:d_weight"),
                   i64(parts), i64(d))


@_primitive("rmsnorm_backward", "rmsnorm", "d_y x weight rstd", "d_x d_weight", "rmsnorm_bwd rmsnorm_dw_reduce",
            dtypes=_STATS)
def _rmsnorm_backward(p: Problem) -> Plan:
    rows, d = _rows(p.inputs[1])
    grid, block = row_config(rows, d, p.itemsize, BWD_ITEMS, PARTIALS_CAP)
    parts = grid[0]
    return Plan((_launch("rmsnorm_bwd", p.variant, grid, block, ptr("in:d_y"), ptr("in:x"), ptr("in:weight"),
                         ptr("in:rstd"), ptr("out:d_x"), ptr("scratch:dw_partial"), i64(rows), i64(d)),
                 _dw_reduce(p.variant, parts, d)),
                scratch={"dw_partial": 4 * parts * d})


@_primitive("fused_residual_rmsnorm_backward", "rmsnorm", "d_y d_residual_next residual_out weight rstd",
            "d_residual d_input d_weight", "fused_residual_rmsnorm_bwd rmsnorm_dw_reduce", dtypes=_STATS)
def _fused_residual_rmsnorm_backward(p: Problem) -> Plan:
    rows, d = _rows(p.inputs[2])
    grid, block = row_config(rows, d, p.itemsize, BWD_ITEMS, PARTIALS_CAP)
    parts = grid[0]
    return Plan((_launch("fused_residual_rmsnorm_bwd", p.variant, grid, block, ptr("in:d_y"),
                         ptr("in:d_residual_next"), ptr("in:residual_out"), ptr("in:weight"), ptr("in:rstd"),
                         ptr("out:d_residual"), ptr("out:d_input"), ptr("scratch:dw_partial"), i64(rows), i64(d)),
                 _dw_reduce(p.variant, parts, d)),
                scratch={"dw_partial": 4 * parts * d})


# Activations: elementwise over the elements of the first input.
def _elementwise(kernel: str, ins: Sequence[str], outs: Sequence[str], with_approximate: bool | None = False):
    """``with_approximate``: pass the op's ``approximate`` (True), or 0, the exact erf GELU (None: geglu)."""
    def rule(p: Problem) -> Plan:
        n = _numel(p.inputs[0])
        grid, block = elementwise_config(n, vector_width(p.itemsize))
        args = [ptr(f"in:{b}") for b in ins] + [ptr(f"out:{b}") for b in outs] + [i64(n)]
        if with_approximate is None:
            args.append(i32(0))
        elif with_approximate:
            args.append(i32(bool(p.attr("approximate", True))))
        return Plan((_launch(kernel, p.variant, grid, block, *args),))
    return rule


for _name, _ins, _outs, _approx in (
    ("swiglu", "gate up", "out", False), ("swiglu_backward", "d_out gate up", "d_gate d_up", False),
    ("geglu", "gate up", "out", None), ("geglu_backward", "d_out gate up", "d_gate d_up", None),
    ("silu", "x", "out", False), ("silu_backward", "d_out x", "d_x", False),
    ("relu", "x", "out", False), ("relu_backward", "d_out x", "d_x", False),
    ("relu2", "x", "out", False), ("relu2_backward", "d_out x", "d_x", False),
    ("gelu", "x", "out", True), ("gelu_backward", "d_out x", "d_x", True),
    ("exp", "x", "out", False), ("tanh", "x", "out", False), ("sigmoid", "x", "out", False),
    ("rsqrt", "x", "out", False), ("log", "x", "out", False),
):
    _kname = _name.replace("_backward", "_bwd") if _name.endswith("_backward") else f"{_name}_fwd"
    _primitive(_name, "activation", _ins, _outs, _kname)(_elementwise(_kname, _ins.split(), _outs.split(), _approx))


def _packed_gated(kernel: str, ins: Sequence[str], outs: Sequence[str]):
    """fused_split_*: elementwise over the [rows, F] halves of the packed [rows, 2F] gate_up (vectors
    when F is a multiple of the vector width)."""
    def rule(p: Problem) -> Plan:
        rows, packed = _rows(p.inputs[ins.index("gate_up")])
        if packed % 2:
            raise NotCovered(f"gate_up's last dim {packed} is odd: no two halves")
        width = packed // 2
        vec = vector_width(p.itemsize) if width % vector_width(p.itemsize) == 0 else 1
        grid, block = elementwise_config(rows * width, vec)
        return Plan((_launch(kernel, p.variant, grid, block, *(ptr(f"in:{b}") for b in ins),
                             *(ptr(f"out:{b}") for b in outs), i64(rows), i64(width)),))
    return rule


for _name in ("swiglu", "geglu"):
    _primitive(f"fused_split_{_name}", "activation", "gate_up", "out", f"split_{_name}_fwd")(
        _packed_gated(f"split_{_name}_fwd", ("gate_up",), ("out",)))
    _primitive(f"fused_split_{_name}_backward", "activation", "d_out gate_up", "d_gate_up", f"split_{_name}_bwd")(
        _packed_gated(f"split_{_name}_bwd", ("d_out", "gate_up"), ("d_gate_up",)))


def _table_positions(freqs: Shape | None, batch: int, tokens: int, bthd: bool) -> int:
    """The rows of a RoPE table the kernels index by ``(row / heads) % T``: ``T`` for one table of every
    row (``[T, D/2, 2]``), ``B T`` for a table per row (``[B, T, D/2, 2]``, packed rows), which the
    layout ``bthd`` rows (``(b T + t) H + h``) reach so; NotCovered for one per row in ``bhtd``."""
    if freqs is None or len(freqs) != 4:
        return tokens
    if not bthd:
        raise NotCovered("a RoPE table per row in the bhtd layout (the kernels index it by position only)")
    if tuple(freqs[:2]) != (batch, tokens):
        raise NotCovered(f"a RoPE table per row {freqs} for {batch} rows of {tokens} tokens")
    return batch * tokens


def _rope_rule(kernel: str, ins: Sequence[str], outs: Sequence[str]):
    def rule(p: Problem) -> Plan:
        q, k = p.inputs[0], p.inputs[1]
        if len(q) != 4 or len(k) != 4:
            raise NotCovered("rope takes q and k of rank 4 ([B, H, T, D] or, layout bthd, [B, T, H, D])")
        bthd = p.attr("layout", "bhtd") == "bthd"
        rows_q, rows_k, t, d = math.prod(q[:3]), math.prod(k[:3]), q[1 if bthd else 2], q[3]
        t = _table_positions(p.inputs[2], q[0], t, bthd)
        heads_q, heads_k = (q[2], k[2]) if bthd else (1, 1)  # rows of one position (rope.cu)
        interleaved = bool(p.attr("interleaved", False))
        vec = vector_width(p.itemsize)
        if interleaved:
            pairs = vec // 2 if d % vec == 0 else 1
        else:
            pairs = vec if (d // 2) % vec == 0 else 1
        units = (rows_q + rows_k) * (d // 2) // pairs
        grid, block = elementwise_config(units, 1)
        return Plan((_launch(kernel, p.variant, grid, block, *(ptr(f"in:{b}") for b in ins),
                             *(ptr(f"out:{b}") for b in outs), i64(rows_q), i64(rows_k), i64(t), i64(d),
                             i32(interleaved), i64(heads_q), i64(heads_k)),))
    return rule


_primitive("rope", "rope", "q k freqs", "q_rot k_rot", "rope_fwd", dtypes={"freqs": "fp32"})(
    _rope_rule("rope_fwd", ("q", "k", "freqs"), ("q_rot", "k_rot")))
_primitive("rope_backward", "rope", "d_q_rot d_k_rot freqs", "d_q d_k", "rope_bwd", dtypes={"freqs": "fp32"})(
    _rope_rule("rope_bwd", ("d_q_rot", "d_k_rot", "freqs"), ("d_q", "d_k")))


def _qk_rows(p: Problem, q_at: int, k_at: int) -> tuple[int, int, int]:
    q, k = p.inputs[q_at], p.inputs[k_at]
    return math.prod(q[:-1]), math.prod(k[:-1]), q[-1]


@_primitive("qk_norm", "rope", "q k q_weight k_weight", "q_norm k_norm q_rstd k_rstd", "qk_norm_fwd",
            dtypes={"q_rstd": "fp32", "k_rstd": "fp32"})
def _qk_norm(p: Problem) -> Plan:
    rows_q, rows_k, d = _qk_rows(p, 0, 1)
    grid, block = row_config(max(rows_q, rows_k), d, p.itemsize, ys=2)
    return Plan((_launch("qk_norm_fwd", p.variant, grid, block, ptr("in:q"), ptr("in:k"), ptr("in:q_weight"),
                         ptr("in:k_weight"), ptr("out:q_norm"), ptr("out:k_norm"), ptr("out:q_rstd"),
                         ptr("out:k_rstd"), i64(rows_q), i64(rows_k), i64(d), f32(p.attr("eps", 1e-6))),))


@_primitive("qk_norm_backward", "rope", "d_q_norm d_k_norm q k q_weight k_weight q_rstd k_rstd",
            "d_q d_k d_q_weight d_k_weight", "qk_norm_bwd qk_norm_dw_reduce",
            dtypes={"q_rstd": "fp32", "k_rstd": "fp32"})
def _qk_norm_backward(p: Problem) -> Plan:
    rows_q, rows_k, d = _qk_rows(p, 2, 3)
    grid, block = row_config(max(rows_q, rows_k), d, p.itemsize, BWD_ITEMS, PARTIALS_CAP, ys=2)
    parts = grid[0]
    rgrid, rblock = column_config(1, d, zs=2)
    return Plan((_launch("qk_norm_bwd", p.variant, grid, block, ptr("in:d_q_norm"), ptr("in:d_k_norm"), ptr("in:q"),
                         ptr("in:k"), ptr("in:q_weight"), ptr("in:k_weight"), ptr("in:q_rstd"), ptr("in:k_rstd"),
                         ptr("out:d_q"), ptr("out:d_k"), ptr("scratch:dw_partial_q"), ptr("scratch:dw_partial_k"),
                         i64(rows_q), i64(rows_k), i64(d)),
                 _launch("qk_norm_dw_reduce", p.variant, rgrid, rblock, ptr("scratch:dw_partial_q"),
                         ptr("scratch:dw_partial_k"), ptr("out:d_q_weight"), ptr("out:d_k_weight"), i64(parts),
                         i64(d))),
                scratch={"dw_partial_q": 4 * parts * d, "dw_partial_k": 4 * parts * d})


ROPE_PAIRS = 4  # pairs of a row one thread of the fused qk_norm + rope kernels holds (rope.cu: kRopePairs)


def _qk_norm_rope_geometry(p: Problem, q_at: int, freqs_at: int) -> tuple[Dim3, tuple[Arg, ...], int]:
    """(block, the launch's size arguments, rows) of fused_qk_norm_rope(_backward) (rope.cu)."""
    q, k = p.inputs[q_at], p.inputs[q_at + 1]
    if len(q) != 4 or len(k) != 4:
        raise NotCovered("fused_qk_norm_rope takes q and k of rank 4 ([B, H, T, D] or, layout bthd, [B, T, H, D])")
    bthd = p.attr("layout", "bhtd") == "bthd"
    rows_q, rows_k, t, d = math.prod(q[:3]), math.prod(k[:3]), q[1 if bthd else 2], q[3]
    t = _table_positions(p.inputs[freqs_at], q[0], t, bthd)
    g = _next_pow2(_cdiv(max(d // 2, 1), ROPE_PAIRS))
    if g > MAX_GROUP:
        raise NotCovered(f"fused_qk_norm_rope: head dim {d} over {2 * ROPE_PAIRS * MAX_GROUP}")
    heads_q, heads_k = (q[2], k[2]) if bthd else (1, 1)
    sizes = (i64(rows_q), i64(rows_k), i64(t), i64(d), i32(bool(p.attr("interleaved", False))), i64(heads_q),
             i64(heads_k))
    return (g, max(1, ROW_THREADS // g), 1), sizes, max(rows_q, rows_k)


@_primitive("fused_qk_norm_rope", "rope", "q k q_weight k_weight freqs", "q_rot k_rot q_rstd k_rstd",
            "qk_norm_rope_fwd", dtypes={"freqs": "fp32", "q_rstd": "fp32", "k_rstd": "fp32"})
def _fused_qk_norm_rope(p: Problem) -> Plan:
    block, sizes, rows = _qk_norm_rope_geometry(p, 0, 4)
    grid = (max(1, min(_cdiv(rows, block[1]), GRID_CAP)), 2, 1)
    return Plan((_launch("qk_norm_rope_fwd", p.variant, grid, block, ptr("in:q"), ptr("in:k"), ptr("in:q_weight"),
                         ptr("in:k_weight"), ptr("in:freqs"), ptr("out:q_rot"), ptr("out:k_rot"), ptr("out:q_rstd"),
                         ptr("out:k_rstd"), *sizes, f32(p.attr("eps", 1e-6))),))


@_primitive("fused_qk_norm_rope_backward", "rope", "d_q_rot d_k_rot q k q_weight k_weight q_rstd k_rstd freqs",
            "d_q d_k d_q_weight d_k_weight", "qk_norm_rope_bwd qk_norm_dw_reduce",
            dtypes={"freqs": "fp32", "q_rstd": "fp32", "k_rstd": "fp32"})
def _fused_qk_norm_rope_backward(p: Problem) -> Plan:
    block, sizes, rows = _qk_norm_rope_geometry(p, 2, 8)
    d = p.inputs[2][3]
    parts = max(1, min(_cdiv(rows, block[1]), PARTIALS_CAP))
    rgrid, rblock = column_config(1, d, zs=2)
    return Plan((_launch("qk_norm_rope_bwd", p.variant, (parts, 2, 1), block, ptr("in:d_q_rot"), ptr("in:d_k_rot"),
                         ptr("in:q"), ptr("in:k"), ptr("in:q_weight"), ptr("in:k_weight"), ptr("in:q_rstd"),
                         ptr("in:k_rstd"), ptr("in:freqs"), ptr("out:d_q"), ptr("out:d_k"),
                         ptr("scratch:dw_partial_q"), ptr("scratch:dw_partial_k"), *sizes),
                 _launch("qk_norm_dw_reduce", p.variant, rgrid, rblock, ptr("scratch:dw_partial_q"),
                         ptr("scratch:dw_partial_k"), ptr("out:d_q_weight"), ptr("out:d_k_weight"), i64(parts),
                         i64(d))),
                scratch={"dw_partial_q": 4 * parts * d, "dw_partial_k": 4 * parts * d})


def _last_dim(p: Problem, shape: Shape) -> None:
    dim = int(p.attr("dim", -1))
    if dim not in (-1, len(shape) - 1):
        raise NotCovered(f"softmax over dim {dim}: the CUDA kernel covers the last dim only")


@_primitive("softmax", "softmax", "x", "out", "softmax_fwd")
def _softmax(p: Problem) -> Plan:
    _last_dim(p, p.inputs[0])
    rows, c = _rows(p.inputs[0])
    grid, block = row_config(rows, c, p.itemsize)
    return Plan((_launch("softmax_fwd", p.variant, grid, block, ptr("in:x"), ptr("out:out"), i64(rows), i64(c)),))


@_primitive("softmax_backward", "softmax", "d_out out", "d_x", "softmax_bwd")
def _softmax_backward(p: Problem) -> Plan:
    _last_dim(p, p.inputs[0])
    rows, c = _rows(p.inputs[0])
    grid, block = row_config(rows, c, p.itemsize, BWD_ITEMS)
    return Plan((_launch("softmax_bwd", p.variant, grid, block, ptr("in:d_out"), ptr("in:out"), ptr("out:d_x"),
                         i64(rows), i64(c)),))


_REDUCTIONS = ("none", "sum", "mean")


def _reduction(p: Problem) -> str:
    reduction = str(p.attr("reduction", "mean"))
    if reduction not in _REDUCTIONS:
        raise NotCovered(f"reduction '{reduction}'")
    return reduction


@_primitive("cross_entropy", "cross_entropy", "logits labels", "loss lse",
            "cross_entropy_fwd cross_entropy_reduce", dtypes={"labels": "index", "loss": "fp32", "lse": "fp32"})
def _cross_entropy(p: Problem) -> Plan:
    rows, vocab = p.inputs[0]
    reduction, ignore = _reduction(p), int(p.attr("ignore_index", -100))
    per_row = "out:loss" if reduction == "none" else "scratch:loss_rows"
    grid = (max(1, min(rows, GRID_CAP)), 1, 1)
    block = (row_threads(vocab, p.itemsize), 1, 1)
    steps = [_launch("cross_entropy_fwd", p.variant, grid, block, ptr("in:logits"), ptr("in:labels"), ptr(per_row),
                     ptr("out:lse"), i64(rows), i64(vocab), i64(ignore), i32(p.idx64))]
    if reduction == "none":
        return Plan(tuple(steps))
    steps.append(cross_entropy_reduce_launch(rows, ignore, p.idx64, reduction == "mean"))
    return Plan(tuple(steps), scratch={"loss_rows": 4 * rows})


def cross_entropy_reduce_launch(rows: int, ignore_index: int, idx64: int, mean: bool,
                                loss_rows: str = "scratch:loss_rows") -> Launch:
    """``out:loss`` = the sum of ``rows`` fp32 per-row losses (``mean``: over the rows whose
    ``in:labels`` are not ``ignore_index``); one block, a fixed summation order."""
    return _launch("cross_entropy_reduce", "fp32", *SINGLE, ptr(loss_rows), ptr("in:labels"), ptr("out:loss"),
                   i64(rows), i64(ignore_index), i32(idx64), i32(mean))


def cross_entropy_mean_scale_launch(rows: int, ignore_index: int, idx64: int,
                                    d_scale: str = "scratch:d_scale") -> Launch:
    """``d_scale`` = ``in:d_loss`` over the number of counted rows of ``in:labels`` (fp32, one value)."""
    return _launch("cross_entropy_mean_scale", "fp32", *SINGLE, ptr("in:d_loss"), ptr("in:labels"), ptr(d_scale),
                   i64(rows), i64(ignore_index), i32(idx64))


@_primitive("cross_entropy_backward", "cross_entropy", "d_loss logits labels lse", "d_logits",
            "cross_entropy_mean_scale cross_entropy_bwd", dtypes={"d_loss": "fp32", "labels": "index", "lse": "fp32"})
def _cross_entropy_backward(p: Problem) -> Plan:
    rows, vocab = p.inputs[1]
    reduction, ignore = _reduction(p), int(p.attr("ignore_index", -100))
    steps, scratch, scale = [], {}, "in:d_loss"
    if reduction == "mean":
        steps.append(cross_entropy_mean_scale_launch(rows, ignore, p.idx64))
        scratch, scale = {"d_scale": 4}, "scratch:d_scale"
    grid = (max(1, min(rows, GRID_CAP)), 1, 1)
    block = (row_threads(vocab, p.itemsize), 1, 1)
    steps.append(_launch("cross_entropy_bwd", p.variant, grid, block, ptr(scale), ptr("in:logits"), ptr("in:labels"),
                         ptr("in:lse"), ptr("out:d_logits"), i64(rows), i64(vocab), i64(ignore), i32(p.idx64),
                         i32(reduction == "none")))
    return Plan(tuple(steps), scratch=scratch)


def broadcast_pattern(big: Shape, small: Shape) -> tuple[int, int]:
    """(b_n, b_inner) with small[(i / b_inner) % b_n] the element of ``small`` that numpy broadcasting
    pairs with element i of ``big``; NotCovered unless small's non-broadcast dims are one run of big's."""
    if len(small) > len(big):
        raise NotCovered(f"cannot broadcast {small} to {big}")
    padded = (1,) * (len(big) - len(small)) + tuple(small)
    matched = [i for i, (s, g) in enumerate(zip(padded, big)) if g != 1 and s == g]
    for s, g in zip(padded, big):
        if s != g and s != 1:
            raise NotCovered(f"cannot broadcast {small} to {big}")
    if not matched:
        return 1, 1
    first, last = matched[0], matched[-1]
    if any(padded[i] != big[i] for i in range(first, last + 1)):
        raise NotCovered(f"broadcasting {small} to {big} repeats it in more than one place")
    return math.prod(big[first:last + 1]), math.prod(big[last + 1:])


def _binary(kernel: str, commutes: bool = True):
    """``commutes``: the operands may swap so the broadcast one is second (add, mul; not sub, div)."""
    def rule(p: Problem) -> Plan:
        a, b = p.inputs
        out = p.outputs[0] if p.outputs and p.outputs[0] is not None else tuple(np.broadcast_shapes(a, b))
        first, second = ("in:a", "in:b")
        if tuple(a) != tuple(out):
            if tuple(b) != tuple(out):
                raise NotCovered(f"{kernel}: both operands ({a}, {b}) are broadcast")
            if not commutes:
                raise NotCovered(f"{kernel}: the first operand ({a}) is broadcast: "
                                 "the kernel broadcasts the second only")
            first, second, a, b = "in:b", "in:a", b, a  # add and mul commute
        n = _numel(out)
        b_n, b_inner = broadcast_pattern(tuple(out), tuple(b))
        grid, block = elementwise_config(n, vector_width(p.itemsize))
        return Plan((_launch(kernel, p.variant, grid, block, ptr(first), ptr(second), ptr("out:out"), i64(n),
                             i64(b_n), i64(b_inner)),))
    return rule


_primitive("add", "elementwise", "a b", "out", "add")(_binary("add"))
_primitive("mul", "elementwise", "a b", "out", "mul")(_binary("mul"))
_primitive("sub", "elementwise", "a b", "out", "sub")(_binary("sub", commutes=False))
_primitive("div", "elementwise", "a b", "out", "div")(_binary("div", commutes=False))


@_primitive("bias_add", "elementwise", "x bias", "out", "bias_add")
def _bias_add(p: Problem) -> Plan:
    n, width = _numel(p.inputs[0]), _numel(p.inputs[1])
    grid, block = elementwise_config(n, vector_width(p.itemsize))
    return Plan((_launch("bias_add", p.variant, grid, block, ptr("in:x"), ptr("in:bias"), ptr("out:out"), i64(n),
                         i64(width)),))


@_primitive("scale", "elementwise", "x", "out", "scale")
def _scale(p: Problem) -> Plan:
    n = _numel(p.inputs[0])
    grid, block = elementwise_config(n, vector_width(p.itemsize))
    return Plan((_launch("scale", p.variant, grid, block, ptr("in:x"), ptr("out:out"), i64(n),
                         f32(p.attr("factor"))),))


@_primitive("add_scalar", "elementwise", "x", "out", "add_scalar")
def _add_scalar(p: Problem) -> Plan:
    n = _numel(p.inputs[0])
    grid, block = elementwise_config(n, vector_width(p.itemsize))
    return Plan((_launch("add_scalar", p.variant, grid, block, ptr("in:x"), ptr("out:out"), i64(n),
                         f32(p.attr("value"))),))


@_primitive("dropout", "elementwise", "x step", "out", "dropout", dtypes={"step": "int64"})
def _dropout(p: Problem) -> Plan:
    """One thread per element, scalar loads (the mask decides per element). The key of the seed, the
    offset and the launch's ``layers`` is folded here; the kernel folds in the step counter it reads
    from ``step`` (none: 0), so a replayed graph draws each step's mask. Outside training, or with
    p = 0, threshold 0 and scale 1 keep every element as it is."""
    n, rate = _numel(p.inputs[0]), float(p.attr("p", 0.5))
    grid, block = elementwise_config(n, 1)
    if dropout_mask.active(rate, bool(p.attr("training", False))):
        key = dropout_mask.launch_key(int(p.attr("seed", 0)), int(p.attr("offset", 0)), tuple(p.attr("layers", ())))
        threshold, scale = dropout_mask.threshold(rate), 1.0 / (1.0 - rate)
    else:
        key, threshold, scale = 0, 0, 1.0
    signed_key = key - (1 << 32) if key >= 1 << 31 else key  # the kernel's int, bit for bit
    step = "in:step" if len(p.inputs) > 1 and p.inputs[1] is not None else None
    return Plan((_launch("dropout", p.variant, grid, block, ptr("in:x"), ptr(step), ptr("out:out"), i64(n),
                         i32(signed_key), i32(threshold), f32(scale)),))


@_primitive("causal_mask", "elementwise", "x", "out", "causal_mask")
def _causal_mask(p: Problem) -> Plan:
    """One thread per score, scalar loads (the mask decides per element); window 0: none."""
    shape = p.inputs[0]
    if len(shape) < 2:
        raise NotCovered("causal_mask of a tensor without query and key dims")
    n = _numel(shape)
    grid, block = elementwise_config(n, 1)
    window = p.attrs.get("window_size") or 0
    fill = -math.inf if p.attr("fill", "neg_inf") == "neg_inf" else 0.0
    return Plan((_launch("causal_mask", p.variant, grid, block, ptr("in:x"), ptr("out:out"), i64(n),
                         i64(shape[-2]), i64(shape[-1]), i64(p.attr("offset", 0)), i64(window), f32(fill)),))


@_primitive("add3", "elementwise", "a b c", "out", "add3")
def _add3(p: Problem) -> Plan:
    if len({tuple(s) for s in p.inputs}) != 1:
        raise NotCovered("add3 with broadcasting: the CUDA kernel takes three tensors of one shape")
    n = _numel(p.inputs[0])
    grid, block = elementwise_config(n, vector_width(p.itemsize))
    return Plan((_launch("add3", p.variant, grid, block, ptr("in:a"), ptr("in:b"), ptr("in:c"), ptr("out:out"),
                         i64(n)),))


# ``add`` launched in place for gradient accumulation (``acc += x``); variant f32_bf16 adds bf16 into fp32.
@_primitive("add_inplace", "elementwise", "acc x", "acc", "add_inplace", variants=("bf16", "fp32", "f32_bf16"))
def _add_inplace(p: Problem) -> Plan:
    n = _numel(p.inputs[0])
    grid, block = elementwise_config(n, 4)
    return Plan((_launch("add_inplace", p.variant, grid, block, ptr("in:acc"), ptr("in:x"), i64(n)),))


def _split(shape: Shape, dims: Sequence[int]) -> tuple[int, int, int]:
    """[outer, R, inner] of ``shape`` reduced over ``dims`` (which must be adjacent)."""
    rank = len(shape)
    axes = sorted({int(d) % rank for d in dims}) if rank else []
    if not axes:
        raise NotCovered("a reduction needs at least one dim")
    if axes != list(range(axes[0], axes[-1] + 1)):
        raise NotCovered(f"reducing over the non-adjacent dims {axes}")
    return math.prod(shape[:axes[0]]), math.prod(shape[axes[0]:axes[-1] + 1]), math.prod(shape[axes[-1] + 1:])


def _sum_rule(mean: bool):
    def rule(p: Problem) -> Plan:
        outer, r, inner = _split(p.inputs[0], p.attr("dims"))
        divisor = float(r) if mean else 1.0
        if inner == 1:
            grid, block = row_config(outer, r, p.itemsize)
            step = _launch("reduce_sum_rows", p.variant, grid, block, ptr("in:x"), ptr("out:out"), i64(outer), i64(r),
                           f32(divisor))
        else:
            grid, block = column_config(outer, inner)
            step = _launch("reduce_sum_cols", p.variant, grid, block, ptr("in:x"), ptr("out:out"), i64(outer), i64(r),
                           i64(inner), f32(divisor))
        return Plan((step,))
    return rule


_primitive("reduce_sum", "reduction", "x", "out", "reduce_sum_rows reduce_sum_cols")(_sum_rule(False))
_primitive("reduce_mean", "reduction", "x", "out", "reduce_sum_rows reduce_sum_cols")(_sum_rule(True))


@_primitive("reduce_max", "reduction", "x", "values indices", "reduce_max_rows reduce_max_cols",
            dtypes={"indices": "index"})
def _reduce_max(p: Problem) -> Plan:
    outer, r, inner = _split(p.inputs[0], [p.attr("dim")])
    if inner == 1:
        grid, block = row_config(outer, r, p.itemsize)
        step = _launch("reduce_max_rows", p.variant, grid, block, ptr("in:x"), ptr("out:values"), ptr("out:indices"),
                       i64(outer), i64(r), i32(p.idx64))
    else:
        grid, block = column_config(outer, inner)
        step = _launch("reduce_max_cols", p.variant, grid, block, ptr("in:x"), ptr("out:values"), ptr("out:indices"),
                       i64(outer), i64(r), i64(inner), i32(p.idx64))
    return Plan((step,))


GLOBAL_NORM_MAX_PARTS = 1024


@_primitive("global_norm", "reduction", "grads", "norm", "global_norm_partial global_norm_finish",
            dtypes={"norm": "fp32"}, variadic=True)
def _global_norm(p: Problem) -> Plan:
    """Table ``grads``: :func:`tensor_table` of every input (pointer, numel), in order."""
    total = sum(_numel(s) for s in p.inputs)
    parts = max(1, min(_cdiv(total, ELEMENTWISE_THREADS * vector_width(p.itemsize) * 4), GLOBAL_NORM_MAX_PARTS))
    return Plan((_launch("global_norm_partial", p.variant, (parts, 1, 1), (ELEMENTWISE_THREADS, 1, 1),
                         ptr("table:grads"), i64(len(p.inputs)), ptr("scratch:partial")),
                 _launch("global_norm_finish", "fp32", *SINGLE, ptr("scratch:partial"), i64(parts), ptr("out:norm"))),
                scratch={"partial": 4 * parts}, tables={"grads": "tensors"})


@_primitive("clip_factor", "reduction", "norm", "factor", "clip_factor", variants=("fp32",))
def _clip_factor(p: Problem) -> Plan:
    return Plan((_launch("clip_factor", "fp32", (1, 1, 1), (32, 1, 1), ptr("in:norm"), ptr("out:factor"),
                         f32(p.attr("max_norm"))),))


@_primitive("cast", "cast", "x", "out", "cast", variants=CAST_VARIANTS, dtypes={"x": "src", "out": "dst"})
def _cast(p: Problem) -> Plan:
    n = _numel(p.inputs[0])
    grid, block = elementwise_config(n, 8)
    return Plan((_launch("cast", p.variant, grid, block, ptr("in:x"), ptr("out:out"), i64(n)),))


@_primitive("dequantize", "cast", "q scale", "out", "dequantize", variants=DEQUANTIZE_VARIANTS,
            dtypes={"q": "src", "scale": "fp32", "out": "dst"})
def _dequantize(p: Problem) -> Plan:
    n, cols = _numel(p.inputs[0]), p.inputs[0][-1]
    grid, block = elementwise_config(n, 1)
    return Plan((_launch("dequantize", p.variant, grid, block, ptr("in:q"), ptr("in:scale"), ptr("out:out"), i64(n),
                         i64(cols)),))


_ADAMW_DTYPES = {"param": "fp32", "exp_avg": "fp32", "exp_avg_sq": "fp32", "lr": "fp32", "step": "int64",
                 "grad_scale": "fp32", "param_copy": "bf16"}


# The reference's in-place update; the optional 4th output param_copy receives the updated weights in bf16.
@_primitive("adamw", "adamw", "param grad exp_avg exp_avg_sq lr step grad_scale",
            "param exp_avg exp_avg_sq param_copy", "adamw", dtypes=_ADAMW_DTYPES)
def _adamw(p: Problem) -> Plan:
    n = _numel(p.inputs[0])
    grad_scale = "in:grad_scale" if len(p.inputs) > 6 and p.inputs[6] is not None else None
    copy = "out:param_copy" if len(p.outputs) > 3 and p.outputs[3] is not None else None
    grid, block = elementwise_config(n, 4)
    return Plan((_launch("adamw", p.variant, grid, block, ptr("in:param"), ptr("in:grad"), ptr("in:exp_avg"),
                         ptr("in:exp_avg_sq"), ptr(copy), ptr("in:lr"), ptr("in:step"), ptr(grad_scale), i64(n),
                         f64(p.attr("beta1", 0.9)), f64(p.attr("beta2", 0.999)), f64(p.attr("eps", 1e-8)),
                         f64(p.attr("weight_decay", 0.01)), f64(p.attr("lr_scale", 1.0))),))


ADAMW_MULTI_MAX_BLOCKS = 4096


# Many adamw launches of one step in one: attribute ``sizes`` (the numel of each tensor, in table order);
# table ``tensors``: adamw_table of the tensors (pointers, sizes, lr_scale, weight_decay).
@_primitive("adamw_multi", "adamw", "lr step grad_scale", "", "adamw_multi", dtypes=_ADAMW_DTYPES)
def _adamw_multi(p: Problem) -> Plan:
    sizes = list(p.attr("sizes"))
    grid = (max(1, min(_cdiv(sum(sizes), ELEMENTWISE_THREADS * 4), ADAMW_MULTI_MAX_BLOCKS)), 1, 1)
    grad_scale = "in:grad_scale" if len(p.inputs) > 2 and p.inputs[2] is not None else None
    return Plan((_launch("adamw_multi", p.variant, grid, (ELEMENTWISE_THREADS, 1, 1), ptr("table:tensors"),
                         i64(len(sizes)), ptr("in:lr"), ptr("in:step"), ptr(grad_scale), f64(p.attr("beta1", 0.9)),
                         f64(p.attr("beta2", 0.999)), f64(p.attr("eps", 1e-8))),),
                tables={"tensors": "adamw"})


# Attention (attention.cu): flash_attention without ALiBi and flash_attention_backward, in the
# layouts of mdsl.sched.attention (attribute ``layout``: "bhtd", the default, or "bthd"; lse is
# [B, H, T] in both), with attention-logit softcapping (attribute ``softcap`` c > 0: the scaled
# scores become c * tanh(s / c) before the mask; 0 or absent: none) and the segment ids of packed
# rows (``segments`` [B, S] int32, the ``_seg`` kernels: a key of another example is masked; the key
# tiles visited stay the causal and window masks'; int64 ids are not covered). Every block has
# ATTENTION_THREADS threads; the tiles by head dim are attention.cu's constants. Head dims up to
# ATTENTION_WIDE_D run attention_fwd, attention_bwd_dkdv and attention_bwd_dq; wider ones, up to
# ATTENTION_MAX_D, their "_d256" twins (the same code on smaller tiles, with registers and static
# shared memory of their own; attention_bwd_pre takes any D). Not covered: ALiBi, D > 256, a
# negative window_size, a softcap outside ATTENTION_SOFTCAP, empty tensors, grids past 65535 heads
# or batches, and the backward where a query sees no key (causal or windowed with T > S: the
# reference's gradients are NaN there).
ATTENTION_THREADS = 128
ATTENTION_WIDE_D = 128  # the widest head dim of the D <= 128 kernels; wider ones run the "_d256" kernels
ATTENTION_MAX_D = 256
ATTENTION_LAYOUTS = ("bhtd", "bthd")
ATTENTION_SOFTCAP = (1e-30, 1e30)  # the softcaps c taken: c log2(e) and its inverse stay normal fp32 numbers


def attention_tiles(d: int) -> dict[str, int]:
    """Rows per block along the grid's x of each attention kernel (attention.cu: fwd_bq, dkdv_bk, dq_bq):
    query rows of the forward and of d_q, keys of d_k/d_v."""
    if d > ATTENTION_WIDE_D:
        return {"fwd": 16, "dkdv": 16, "dq": 16}
    return {"fwd": 64 if d <= 64 else 32, "dkdv": 32, "dq": 32}


def attention_kernel(name: str, d: int, segments: bool = False) -> str:
    """The kernel of ``name`` (attention_fwd, attention_bwd_dkdv, attention_bwd_dq) for head dim ``d`` (and
    packed rows' segment ids: the ``_seg`` kernels)."""
    return (f"{name}_d256" if d > ATTENTION_WIDE_D else name) + ("_seg" if segments else "")


@dataclass(frozen=True)
class AttentionGeometry:
    b: int
    h: int
    hkv: int
    t: int
    s: int
    d: int
    q_strides: tuple[int, int, int]  # (batch, head, token) in elements: q, out, d_out, d_q
    k_strides: tuple[int, int, int]  # k, v, d_k, d_v
    scale: float
    causal: bool
    window: int  # 0: none
    softcap: float = 0.0  # c > 0: scores c * tanh(s / c); 0: none
    segments: bool = False  # packed rows: the example ids [B, S] (in:segments, int32)

    def args(self) -> tuple[Arg, ...]:
        """The geometry parameters of attention.cu's kernels (all but the delta kernel), in order (the ``_seg``
        kernels': then the segment ids)."""
        ids = (ptr("in:segments"),) if self.segments else ()
        return (i64(self.b), i64(self.h), i64(self.hkv), i64(self.t), i64(self.s), i64(self.d),
                *(i64(x) for x in self.q_strides), *(i64(x) for x in self.k_strides), f32(self.scale),
                i32(self.causal), i64(self.window), f32(self.softcap), *ids)

    def kernel(self, name: str) -> str:
        return attention_kernel(name, self.d, self.segments)

    def with_segments(self, p: Problem, segments: Shape | None) -> AttentionGeometry:
        """The geometry with the packed rows' ids (``segments`` ``[B, S]``; None: none)."""
        if segments is None:
            return self
        if tuple(segments) != (self.b, self.s):
            raise NotCovered(f"attention segment ids {segments}: one per key of each row is [{self.b}, {self.s}]")
        if p.idx64:
            raise NotCovered("int64 attention segment ids (the kernels take int32 ones, as mdsl-pack-sequences gives)")
        return replace(self, segments=True)


def attention_geometry(p: Problem, q: Shape, k: Shape, v: Shape) -> AttentionGeometry:
    """Sizes, strides and mask of one attention launch; NotCovered where attention.cu does not apply."""
    layout = str(p.attrs.get("layout") or "bhtd")
    if layout not in ATTENTION_LAYOUTS:
        raise NotCovered(f"attention layout '{layout}' (the kernels take {', '.join(ATTENTION_LAYOUTS)})")
    if len(q) != 4 or len(k) != 4 or tuple(v) != tuple(k):
        raise NotCovered(f"attention takes rank-4 q and k/v of one shape, got {q}, {k}, {v}")
    if layout == "bhtd":
        (b, h, t, d), (bk, hkv, s, dk) = q, k
        q_strides, k_strides = (h * t * d, t * d, d), (hkv * s * d, s * d, d)
    else:
        (b, t, h, d), (bk, s, hkv, dk) = q, k
        q_strides, k_strides = (t * h * d, d, h * d), (s * hkv * d, d, hkv * d)
    if b != bk or d != dk or hkv < 1 or h % hkv:
        raise NotCovered(f"attention q {q} and k {k} do not pair (batch, head dim, GQA groups)")
    if min(b, h, t, s, d) < 1:
        raise NotCovered(f"empty attention {q}, {k}")
    if d > ATTENTION_MAX_D:
        raise NotCovered(f"attention head dim {d}: the CUDA kernel takes at most {ATTENTION_MAX_D}")
    if b > 65535 or h > 65535:
        raise NotCovered(f"attention with {b} batches of {h} heads: the grid takes at most 65535 of each")
    scale = p.attrs.get("softmax_scale")
    window = int(p.attrs.get("window_size") or 0)
    if window < 0:
        raise NotCovered(f"attention window_size {window}")
    softcap = float(p.attrs.get("softcap") or 0.0)
    if softcap and not ATTENTION_SOFTCAP[0] <= softcap <= ATTENTION_SOFTCAP[1]:
        raise NotCovered(f"attention softcap {softcap}: the CUDA kernel takes c in {ATTENTION_SOFTCAP} (or 0: none)")
    causal = p.attrs.get("causal", True)
    return AttentionGeometry(b, h, hkv, t, s, d, q_strides, k_strides,
                             1.0 / math.sqrt(d) if scale is None else float(scale),
                             True if causal is None else bool(causal), window, softcap)


_ATTENTION_BLOCK: Dim3 = (ATTENTION_THREADS, 1, 1)


@_primitive("flash_attention", "attention", "q k v alibi_slopes segments", "out lse",
            "attention_fwd attention_fwd_d256 attention_fwd_seg attention_fwd_d256_seg",
            dtypes={"alibi_slopes": "fp32", "segments": "index", "lse": "fp32"})
def _flash_attention(p: Problem) -> Plan:
    if len(p.inputs) > 3 and p.inputs[3] is not None:
        raise NotCovered("attention with ALiBi: the CUDA kernel has no ALiBi bias")
    g = attention_geometry(p, *p.inputs[:3]).with_segments(p, p.inputs[4] if len(p.inputs) > 4 else None)
    grid = (_cdiv(g.t, attention_tiles(g.d)["fwd"]), g.h, g.b)
    return Plan((_launch(g.kernel("attention_fwd"), p.variant, grid, _ATTENTION_BLOCK, ptr("in:q"),
                         ptr("in:k"), ptr("in:v"), ptr("out:out"), ptr("out:lse"), *g.args()),))


@_primitive("flash_attention_backward", "attention", "d_out q k v out lse alibi_slopes segments", "d_q d_k d_v",
            "attention_bwd_pre attention_bwd_dkdv attention_bwd_dq attention_bwd_dkdv_d256 attention_bwd_dq_d256 "
            "attention_bwd_dkdv_seg attention_bwd_dq_seg attention_bwd_dkdv_d256_seg attention_bwd_dq_d256_seg",
            dtypes={"alibi_slopes": "fp32", "segments": "index", "lse": "fp32"})
def _flash_attention_backward(p: Problem) -> Plan:
    if len(p.inputs) > 6 and p.inputs[6] is not None:
        raise NotCovered("attention backward with ALiBi: the CUDA kernel has no ALiBi bias")
    g = attention_geometry(p, *p.inputs[1:4]).with_segments(p, p.inputs[7] if len(p.inputs) > 7 else None)
    if g.t > g.s and (g.causal or g.window):
        raise NotCovered(f"attention backward with {g.t} queries over {g.s} keys: the first queries see no key")
    tiles, rows = attention_tiles(g.d), g.b * g.h * g.t
    pre_grid = (max(1, min(_cdiv(rows, ATTENTION_THREADS // 32), GRID_CAP)), 1, 1)
    return Plan((_launch("attention_bwd_pre", p.variant, pre_grid, _ATTENTION_BLOCK, ptr("in:d_out"), ptr("in:out"),
                         ptr("scratch:delta"), i64(g.b), i64(g.h), i64(g.t), i64(g.d),
                         *(i64(x) for x in g.q_strides)),
                 _launch(g.kernel("attention_bwd_dkdv"), p.variant,
                         (_cdiv(g.s, tiles["dkdv"]), g.hkv, g.b), _ATTENTION_BLOCK, ptr("in:d_out"), ptr("in:q"),
                         ptr("in:k"), ptr("in:v"), ptr("in:lse"), ptr("scratch:delta"), ptr("out:d_k"),
                         ptr("out:d_v"), *g.args()),
                 _launch(g.kernel("attention_bwd_dq"), p.variant,
                         (_cdiv(g.t, tiles["dq"]), g.h, g.b), _ATTENTION_BLOCK, ptr("in:d_out"), ptr("in:q"),
                         ptr("in:k"), ptr("in:v"), ptr("in:lse"), ptr("scratch:delta"), ptr("out:d_q"), *g.args())),
                scratch={"delta": 4 * rows})


# Mixture of Experts (moe.cu). Index tensors are int32 (indices [N, top_k], offsets [E + 1],
# scatter indices [N * top_k]); every expert index must be in [0, E). Counting and ranking run one
# block per expert (or offset), in assignment order (no atomics); the GEMMs are 16 x 16 tiles with
# fp32 accumulation. Not covered: int64 index tensors, empty tensors, more than 65535 groups
# (grouped_gemm_weight_grad) or tiles in a grid's y.
MOE_SCAN_THREADS = 256  # threads of a counting / ranking block (moe.cu: kScanThreads)
GEMM_TILE = 16  # output rows and columns of one GEMM block (moe.cu: kTile)
_WARP_ROWS: Dim3 = (32, 8, 1)  # one warp per row, 8 rows per block
_GEMM_BLOCK: Dim3 = (GEMM_TILE, GEMM_TILE, 1)
_MOE_INDEX = {"indices": "int32", "offsets": "int32", "expert_offsets": "int32", "scatter_indices": "int32"}


def _nonempty(name: str, *shapes: Shape | None) -> None:
    for shape in shapes:
        if shape is not None and _numel(shape) == 0:
            raise NotCovered(f"{name} of an empty tensor {shape}")


def _warp_rows(rows: int) -> Dim3:
    return (max(1, min(_cdiv(rows, _WARP_ROWS[1]), GRID_CAP)), 1, 1)


def _grid_y(name: str, n: int) -> int:
    if n > 65535:
        raise NotCovered(f"{name}: {n} blocks along the grid's y (at most 65535)")
    return max(1, n)


@_primitive("moe_compute_offsets", "moe", "indices", "offsets", "moe_offsets", variants=("fp32",),
            dtypes=_MOE_INDEX)
def _moe_compute_offsets(p: Problem) -> Plan:
    """One block per offset e counts the assignments to experts below e."""
    assignments, experts = _numel(p.inputs[0]), int(p.attr("num_experts"))
    _nonempty("moe_compute_offsets", p.inputs[0])
    return Plan((_launch("moe_offsets", "fp32", (min(experts + 1, GRID_CAP), 1, 1), (MOE_SCAN_THREADS, 1, 1),
                         ptr("in:indices"), ptr("out:offsets"), i64(assignments), i64(experts)),))


@_primitive("moe_permute", "moe", "x indices expert_offsets", "permuted scatter_indices",
            "moe_permute_scatter moe_permute_gather", dtypes=_MOE_INDEX)
def _moe_permute(p: Problem) -> Plan:
    """Ranks (one block per expert, in assignment order), then one warp per assignment copies its row."""
    (_, c), (n, top_k), (e1,) = p.inputs[0], p.inputs[1], p.inputs[2]
    _nonempty("moe_permute", *p.inputs)
    assignments, experts = n * top_k, e1 - 1
    if experts < 1:
        raise NotCovered("moe_permute without experts")
    return Plan((_launch("moe_permute_scatter", "fp32", (min(experts, GRID_CAP), 1, 1), (MOE_SCAN_THREADS, 1, 1),
                         ptr("in:indices"), ptr("in:expert_offsets"), ptr("out:scatter_indices"), i64(assignments),
                         i64(experts)),
                 _launch("moe_permute_gather", p.variant, _warp_rows(assignments), _WARP_ROWS, ptr("in:x"),
                         ptr("out:scatter_indices"), ptr("out:permuted"), i64(assignments), i64(c), i64(top_k))))


@_primitive("moe_unpermute", "moe", "expert_outputs weights scatter_indices", "combined", "moe_unpermute",
            dtypes=_MOE_INDEX)
def _moe_unpermute(p: Problem) -> Plan:
    (_, c), (n, top_k) = p.inputs[0], p.inputs[1]
    _nonempty("moe_unpermute", *p.inputs)
    grid, block = elementwise_config(n * c, 1)
    return Plan((_launch("moe_unpermute", p.variant, grid, block, ptr("in:expert_outputs"), ptr("in:weights"),
                         ptr("in:scatter_indices"), ptr("out:combined"), i64(n), i64(c), i64(top_k)),))


@_primitive("moe_unpermute_backward", "moe", "d_combined expert_outputs weights scatter_indices",
            "d_expert_outputs d_weights", "moe_unpermute_bwd", dtypes=_MOE_INDEX)
def _moe_unpermute_backward(p: Problem) -> Plan:
    """One warp per assignment; scatter_indices must be a permutation (moe_permute's)."""
    (_, c), (n, top_k) = p.inputs[1], p.inputs[2]
    _nonempty("moe_unpermute_backward", *p.inputs)
    return Plan((_launch("moe_unpermute_bwd", p.variant, _warp_rows(n * top_k), _WARP_ROWS, ptr("in:d_combined"),
                         ptr("in:expert_outputs"), ptr("in:weights"), ptr("in:scatter_indices"),
                         ptr("out:d_expert_outputs"), ptr("out:d_weights"), i64(n * top_k), i64(c), i64(top_k)),))


GROUPED_GEMM_MODES = ("TN", "NN", "NT", "TT")


@_primitive("grouped_gemm", "moe", "input weights offsets", "output", "grouped_gemm_tiles grouped_gemm",
            dtypes=_MOE_INDEX)
def _grouped_gemm(p: Problem) -> Plan:
    """Zero the output (rows of no group), list the groups' row tiles (scratch ``tiles``, int32:
    the count, then (group, first row, end row) per tile), then one 16 x 16 tile per block."""
    mode = str(p.attr("transpose", "TN"))
    if mode not in GROUPED_GEMM_MODES:
        raise NotCovered(f"grouped_gemm transpose '{mode}'")
    x, w, off = p.inputs
    _nonempty("grouped_gemm", x, w)
    groups = w[0]
    n, k = (w[1], w[2]) if mode[0] == "T" else (w[2], w[1])
    w_sk, w_sn = (1, k) if mode[0] == "T" else (n, 1)
    tokens = x[1] if mode[1] == "T" else x[0]
    x_st, x_sk = (1, tokens) if mode[1] == "T" else (k, 1)
    max_tiles = _cdiv(tokens, GEMM_TILE) + groups
    return Plan((Memset("out:output"),
                 _launch("grouped_gemm_tiles", "fp32", (1, 1, 1), (32, 1, 1), ptr("in:offsets"), ptr("scratch:tiles"),
                         i64(groups), i64(tokens), i64(max_tiles)),
                 _launch("grouped_gemm", p.variant, (max_tiles, _grid_y("grouped_gemm", _cdiv(n, GEMM_TILE)), 1),
                         _GEMM_BLOCK, ptr("in:input"), ptr("in:weights"), ptr("scratch:tiles"), ptr("out:output"),
                         i64(k), i64(n), i64(x_st), i64(x_sk), i64(w_sk), i64(w_sn))),
                scratch={"tiles": 4 * (1 + 3 * max_tiles)})


@_primitive("grouped_gemm_weight_grad", "moe", "input d_output offsets", "d_weights", "grouped_gemm_wgrad",
            dtypes=_MOE_INDEX)
def _grouped_gemm_weight_grad(p: Problem) -> Plan:
    """One block per 16 x 16 tile of each group's [N, K] gradient, over the group's rows in order."""
    (tokens, k), (_, n), (g1,) = p.inputs
    _nonempty("grouped_gemm_weight_grad", *p.inputs)
    groups = g1 - 1
    if not 1 <= groups <= 65535:
        raise NotCovered(f"grouped_gemm_weight_grad with {groups} groups (1 to 65535)")
    grid = (_cdiv(n, GEMM_TILE), _grid_y("grouped_gemm_weight_grad", _cdiv(k, GEMM_TILE)), groups)
    return Plan((_launch("grouped_gemm_wgrad", p.variant, grid, _GEMM_BLOCK, ptr("in:input"), ptr("in:d_output"),
                         ptr("in:offsets"), ptr("out:d_weights"), i64(tokens), i64(k), i64(n)),))


_ROUTER_DTYPES = {"indices": "int32", "aux_loss": "fp32"}


def _router_flags(p: Problem) -> tuple[Arg, Arg]:
    return i32(bool(p.attr("normalize", True))), i32(bool(p.attr("use_sigmoid", False)))


@_primitive("moe_router", "moe", "x gate", "weights indices aux_loss", "moe_router_fwd moe_router_aux",
            dtypes=_ROUTER_DTYPES)
def _moe_router(p: Problem) -> Plan:
    """One warp per token (scores, top-k, weights; the routing distribution into scratch ``probs``),
    then one block for the aux loss."""
    (n, c), (e, _) = p.inputs
    _nonempty("moe_router", *p.inputs)
    top_k = int(p.attr("top_k"))
    if not 1 <= top_k <= e:
        raise NotCovered(f"moe_router top_k {top_k} of {e} experts")
    return Plan((_launch("moe_router_fwd", p.variant, _warp_rows(n), _WARP_ROWS, ptr("in:x"), ptr("in:gate"),
                         ptr("out:weights"), ptr("out:indices"), ptr("scratch:probs"), i64(n), i64(e), i64(c),
                         i64(top_k), *_router_flags(p)),
                 _launch("moe_router_aux", "fp32", (1, 1, 1), (ELEMENTWISE_THREADS, 1, 1), ptr("out:indices"),
                         ptr("scratch:probs"), ptr("out:aux_loss"), i64(n), i64(e), i64(top_k),
                         f32(p.attr("aux_loss_coef", 0.01)))),
                scratch={"probs": 4 * n * e})


@_primitive("moe_router_backward", "moe", "d_weights x gate indices", "d_x d_gate",
            "moe_router_bwd_counts moe_router_bwd_logits moe_router_bwd_gemm", dtypes=_ROUTER_DTYPES)
def _moe_router_backward(p: Problem) -> Plan:
    """The aux loss's gradient per expert (one block), the logits' gradient (a warp per token,
    fp32 scratch), then d_x = d_logits gate and d_gate = d_logits^T x (16 x 16 tiles)."""
    (_, top_k), (n, c), (e, _) = p.inputs[0], p.inputs[1], p.inputs[2]
    _nonempty("moe_router_backward", *p.inputs)
    return Plan((_launch("moe_router_bwd_counts", "fp32", (1, 1, 1), (ELEMENTWISE_THREADS, 1, 1), ptr("in:indices"),
                         ptr("scratch:d_probs"), i64(n), i64(e), i64(top_k), f32(p.attr("aux_loss_coef", 0.01))),
                 _launch("moe_router_bwd_logits", p.variant, _warp_rows(n), _WARP_ROWS, ptr("in:d_weights"),
                         ptr("in:x"), ptr("in:gate"), ptr("in:indices"), ptr("scratch:d_probs"), ptr("scratch:scores"),
                         ptr("scratch:d_logits"), i64(n), i64(e), i64(c), i64(top_k), *_router_flags(p)),
                 _launch("moe_router_bwd_gemm", p.variant,
                         (_cdiv(n, GEMM_TILE), _grid_y("moe_router_backward", _cdiv(c, GEMM_TILE)), 1), _GEMM_BLOCK,
                         ptr("scratch:d_logits"), ptr("in:gate"), ptr("out:d_x"), i64(n), i64(c), i64(e), i64(e),
                         i64(1), i64(c), i64(1)),
                 _launch("moe_router_bwd_gemm", p.variant,
                         (_cdiv(e, GEMM_TILE), _grid_y("moe_router_backward", _cdiv(c, GEMM_TILE)), 1), _GEMM_BLOCK,
                         ptr("scratch:d_logits"), ptr("in:x"), ptr("out:d_gate"), i64(e), i64(c), i64(n), i64(1),
                         i64(e), i64(c), i64(1))),
                scratch={"d_probs": 4 * e, "scores": 4 * n * e, "d_logits": 4 * n * e})


# Mamba (mamba.cu). The conv: one thread per output (forward), one block per channel (backward,
# kernel_size <= MAMBA_MAX_CONV). The scan: one warp per (batch, channel), N <= MAMBA_MAX_STATE
# states over its lanes, sequential over time; the backward recomputes each channel's states into
# scratch and sums the b_proj / c_proj gradients of a partition of each group's channels in fp32
# scratch (at most MAMBA_SCAN_SCRATCH bytes), then adds the partitions. Not covered: empty tensors,
# kernel_size over 8, more than 256 states, an activation other than silu / none.
MAMBA_MAX_CONV = 8  # mamba.cu: kMaxConv
MAMBA_MAX_STATE = 256  # mamba.cu: 32 * kMaxStates
MAMBA_SCAN_WARPS = 2048  # warps the scan backward aims at (partitions of each group's channels)
MAMBA_SCAN_SCRATCH = 1 << 30  # most bytes of the scan backward's per-partition scratch


def _conv_geometry(p: Problem, x: Shape, weight: Shape, bias: Shape | None) -> tuple[int, int, int, int, int]:
    """(B, D, T, kernel_size, silu) of a conv launch; NotCovered where mamba.cu does not apply."""
    if len(x) != 3:
        raise NotCovered(f"mamba_conv1d of x {x} (not [B, D, T])")
    b, d, t = x
    ks = int(p.attr("kernel_size", 4))
    if tuple(weight) != (d, 1, ks) or (bias is not None and tuple(bias) != (d,)):
        raise NotCovered(f"mamba_conv1d weight {weight} / bias {bias} for x {x} and kernel_size {ks}")
    if not 1 <= ks <= MAMBA_MAX_CONV:
        raise NotCovered(f"mamba_conv1d kernel_size {ks} (the CUDA kernel takes 1 to {MAMBA_MAX_CONV})")
    activation = str(p.attr("activation", "silu"))
    if activation not in ("silu", "none"):
        raise NotCovered(f"mamba_conv1d activation '{activation}'")
    _nonempty("mamba_conv1d", x)
    return b, d, t, ks, int(activation == "silu")


@_primitive("mamba_conv1d", "mamba", "x weight bias conv_state", "y conv_state_out", "mamba_conv1d_fwd")
def _mamba_conv1d(p: Problem) -> Plan:
    x, weight = p.inputs[0], p.inputs[1]
    bias = p.inputs[2] if len(p.inputs) > 2 else None
    state = p.inputs[3] if len(p.inputs) > 3 else None
    b, d, t, ks, silu = _conv_geometry(p, x, weight, bias)
    has_out = len(p.outputs) > 1 and p.outputs[1] is not None
    if (state is not None) != has_out:
        raise NotCovered("mamba_conv1d returns conv_state_out exactly when a conv_state is given")
    if state is not None and tuple(state) != (b, d, ks - 1):
        raise NotCovered(f"mamba_conv1d conv_state {state} for x {x} and kernel_size {ks}")
    total = b * d * t + (b * d * (ks - 1) if state is not None else 0)
    grid, block = elementwise_config(total, 1)
    has_state = state is not None
    return Plan((_launch("mamba_conv1d_fwd", p.variant, grid, block, ptr("in:x"), ptr("in:weight"),
                         ptr("in:bias" if bias is not None else None), ptr("in:conv_state" if has_state else None),
                         ptr("out:y"), ptr("out:conv_state_out" if has_state else None), i64(b), i64(d), i64(t),
                         i64(ks), i32(silu)),))


@_primitive("mamba_conv1d_backward", "mamba", "d_y x weight bias", "d_x d_weight d_bias", "mamba_conv1d_bwd")
def _mamba_conv1d_backward(p: Problem) -> Plan:
    x, weight = p.inputs[1], p.inputs[2]
    bias = p.inputs[3] if len(p.inputs) > 3 else None
    b, d, t, ks, silu = _conv_geometry(p, x, weight, bias)
    has_d_bias = len(p.outputs) > 2 and p.outputs[2] is not None
    if (bias is not None) != has_d_bias:
        raise NotCovered("mamba_conv1d_backward returns d_bias exactly when a bias is given")
    return Plan((_launch("mamba_conv1d_bwd", p.variant, (min(d, GRID_CAP), 1, 1), (ELEMENTWISE_THREADS, 1, 1),
                         ptr("in:d_y"), ptr("in:x"), ptr("in:weight"), ptr("in:bias" if bias is not None else None),
                         ptr("out:d_x"), ptr("out:d_weight"), ptr("out:d_bias" if has_d_bias else None), i64(b),
                         i64(d), i64(t), i64(ks), i32(silu)),))


def _scan_geometry(p: Problem, at: int) -> tuple[int, int, int, int, int, bool]:
    """(B, D, G, N, T, has a state) of a scan launch whose u is input ``at``."""
    u, delta, a_log, b_proj, c_proj, d_skip, dt_bias = p.inputs[at:at + 7]
    state = p.inputs[at + 7] if len(p.inputs) > at + 7 else None
    if len(u) != 3 or len(a_log) != 2 or len(b_proj) != 4:
        raise NotCovered(f"mamba_selective_scan of u {u}, a_log {a_log}, b_proj {b_proj}")
    b, d, t = u
    n, g = a_log[1], b_proj[1]
    if (tuple(delta) != tuple(u) or tuple(a_log) != (d, n) or tuple(b_proj) != (b, g, n, t)
            or tuple(c_proj) != tuple(b_proj) or tuple(d_skip) != (d,) or tuple(dt_bias) != (d,)
            or (state is not None and tuple(state) != (b, d, n)) or g < 1 or d % g):
        raise NotCovered(f"mamba_selective_scan operands that do not pair: {p.inputs[at:at + 8]}")
    if n > MAMBA_MAX_STATE:
        raise NotCovered(f"mamba_selective_scan with {n} states (the CUDA kernel takes at most {MAMBA_MAX_STATE})")
    _nonempty("mamba_selective_scan", u, a_log)
    return b, d, g, n, t, state is not None


@_primitive("mamba_selective_scan", "mamba", "u delta a_log b_proj c_proj d_skip dt_bias ssm_state",
            "y ssm_state_out", "mamba_scan_fwd")
def _mamba_selective_scan(p: Problem) -> Plan:
    b, d, g, n, t, state = _scan_geometry(p, 0)
    return Plan((_launch("mamba_scan_fwd", p.variant, _warp_rows(b * d), _WARP_ROWS,
                         *(ptr(f"in:{x}") for x in ("u", "delta", "a_log", "b_proj", "c_proj", "d_skip", "dt_bias")),
                         ptr("in:ssm_state" if state else None), ptr("out:y"), ptr("out:ssm_state_out"), i64(b),
                         i64(d), i64(g), i64(n), i64(t)),))


def scan_partitions(b: int, d: int, g: int, n: int, t: int) -> tuple[int, int]:
    """(partitions P of each group's channels, channels per partition) of the scan backward: about
    MAMBA_SCAN_WARPS warps, fewer where the per-partition scratch would pass MAMBA_SCAN_SCRATCH."""
    per_group = d // g
    parts = min(per_group, max(1, _cdiv(MAMBA_SCAN_WARPS, b * g)))
    while parts > 1 and 3 * 4 * b * g * parts * n * t > MAMBA_SCAN_SCRATCH:
        parts //= 2
    cpp = _cdiv(per_group, parts)
    return _cdiv(per_group, cpp), cpp


@_primitive("mamba_selective_scan_backward", "mamba", "d_y u delta a_log b_proj c_proj d_skip dt_bias ssm_state y",
            "d_u d_delta d_a_log d_b_proj d_c_proj d_d_skip d_dt_bias", "mamba_scan_bwd mamba_scan_bwd_reduce")
def _mamba_selective_scan_backward(p: Problem) -> Plan:
    b, d, g, n, t, state = _scan_geometry(p, 1)
    parts, cpp = scan_partitions(b, d, g, n, t)
    warps = b * g * parts
    grid, block = elementwise_config(2 * b * g * n * t + d * n + 2 * d, 1)
    return Plan((_launch("mamba_scan_bwd", p.variant, _warp_rows(warps), _WARP_ROWS, ptr("in:d_y"),
                         *(ptr(f"in:{x}") for x in ("u", "delta", "a_log", "b_proj", "c_proj", "d_skip", "dt_bias")),
                         ptr("in:ssm_state" if state else None), ptr("out:d_u"), ptr("out:d_delta"),
                         ptr("scratch:states"), ptr("scratch:part_bc"), ptr("scratch:part_a"), ptr("scratch:part_d"),
                         i64(b), i64(d), i64(g), i64(n), i64(t), i64(parts), i64(cpp)),
                 _launch("mamba_scan_bwd_reduce", p.variant, grid, block, ptr("scratch:part_bc"), ptr("scratch:part_a"),
                         ptr("scratch:part_d"), ptr("in:a_log"), ptr("out:d_a_log"), ptr("out:d_b_proj"),
                         ptr("out:d_c_proj"), ptr("out:d_d_skip"), ptr("out:d_dt_bias"), i64(b), i64(d), i64(g),
                         i64(n), i64(t), i64(parts))),
                scratch={"states": 4 * warps * t * n, "part_bc": 4 * 2 * warps * n * t, "part_a": 4 * b * d * n,
                         "part_d": 4 * 2 * b * d})


# The decoding steps (lower_to_sched's mamba_conv1d_step / mamba_selective_scan_step): the state
# buffer is an input and the output of the same name, updated in place; position and valid are
# index tensors ([1]: element 0 is read on the device) with the run's start (<= 0: a new sequence,
# the state read as zeros) and its count of real steps (the rest pad a shape bucket). The conv
# step: a warp per channel, its lanes over the steps; the scan step: the scan forward's warp per
# row. Not covered: as the conv and the scan, a missing state, position or valid, or an empty one.
def _decode_indices(name: str, position: Shape | None, valid: Shape | None) -> None:
    for what, shape in (("position", position), ("valid", valid)):
        if shape is None or _numel(shape) == 0:
            raise NotCovered(f"{name} without a {what} element (it reads element 0 on the device)")


def _step_outputs(name: str, p: Problem, y: Shape, state: Shape) -> None:
    outs = tuple(tuple(s) if s is not None else None for s in p.outputs)
    if outs != (tuple(y), tuple(state)):
        raise NotCovered(f"{name} outputs {list(p.outputs)}: y {y} and the state {state} (updated in place)")


@_primitive("mamba_conv1d_step", "mamba", "x weight conv_state position valid bias", "y conv_state",
            "mamba_conv1d_step", dtypes={"position": "index", "valid": "index"})
def _mamba_conv1d_step(p: Problem) -> Plan:
    x, weight, state = p.inputs[0], p.inputs[1], p.inputs[2]
    position, valid = (p.inputs[3], p.inputs[4]) if len(p.inputs) > 4 else (None, None)
    bias = p.inputs[5] if len(p.inputs) > 5 else None
    if x is None or weight is None or state is None:
        raise NotCovered("mamba_conv1d_step needs x, weight and a conv_state")
    b, d, t, ks, silu = _conv_geometry(p, x, weight, bias)
    if tuple(state) != (b, d, ks - 1):
        raise NotCovered(f"mamba_conv1d_step conv_state {state} for x {x} and kernel_size {ks}")
    _decode_indices("mamba_conv1d_step", position, valid)
    _step_outputs("mamba_conv1d_step", p, x, state)
    grid = (max(1, min(_cdiv(d, _WARP_ROWS[1]), GRID_CAP)), min(b, 65535), 1)
    return Plan((_launch("mamba_conv1d_step", p.variant, grid, _WARP_ROWS, ptr("in:x"), ptr("in:weight"),
                         ptr("in:bias" if bias is not None else None), ptr("in:conv_state"), ptr("in:position"),
                         ptr("in:valid"), ptr("out:y"), i64(b), i64(d), i64(t), i64(ks), i32(silu),
                         i32(p.idx64)),))


@_primitive("mamba_selective_scan_step", "mamba",
            "u delta a_log b_proj c_proj d_skip dt_bias ssm_state position valid", "y ssm_state", "mamba_scan_step",
            dtypes={"position": "index", "valid": "index"})
def _mamba_selective_scan_step(p: Problem) -> Plan:
    if len(p.inputs) != 10 or any(s is None for s in p.inputs[:7]):
        raise NotCovered(f"mamba_selective_scan_step of {len(p.inputs)} operands {list(p.inputs)}")
    b, d, g, n, t, state = _scan_geometry(p, 0)
    if not state:
        raise NotCovered("mamba_selective_scan_step without an ssm_state")
    _decode_indices("mamba_selective_scan_step", p.inputs[8], p.inputs[9])
    _step_outputs("mamba_selective_scan_step", p, p.inputs[0], p.inputs[7])
    return Plan((_launch("mamba_scan_step", p.variant, _warp_rows(b * d), _WARP_ROWS,
                         *(ptr(f"in:{x}") for x in ("u", "delta", "a_log", "b_proj", "c_proj", "d_skip", "dt_bias",
                                                    "ssm_state", "position", "valid")),
                         ptr("out:y"), i64(b), i64(d), i64(g), i64(n), i64(t), i32(p.idx64)),))


# ----------------------------------------------------------------------------
# Entry points
# ----------------------------------------------------------------------------


def primitive(name: str) -> CudaPrimitive:
    """The CUDA description of primitive ``name``; KeyError naming the covered ones otherwise."""
    try:
        return PRIMITIVES[name]
    except KeyError:
        from modeldsl.prims import USER_REFERENCES

        if name in USER_REFERENCES:  # modeldsl.register_primitive gives a reference, no CUDA kernel
            raise KeyError(f"'{name}' is a user primitive without a CUDA kernel") from None
        raise KeyError(f"no CUDA kernel for '{name}' (covered: {', '.join(sorted(PRIMITIVES))})") from None


def plan(name: str, inputs: Sequence[Shape | None], outputs: Sequence[Shape | None] = (),
         attrs: Mapping[str, Any] | None = None, variant: str = "bf16", index_dtype: str = "int32") -> Plan:
    """The launches of primitive ``name`` on these shapes (``None``: an absent optional buffer)."""
    prim = primitive(name)
    if variant not in prim.variants:
        raise NotCovered(f"{name} has no {variant} variant (it has {', '.join(prim.variants)})")
    if index_dtype not in ("int32", "int64"):
        raise NotCovered(f"index dtype {index_dtype}")
    shapes = lambda group: tuple(tuple(int(d) for d in s) if s is not None else None for s in group)  # noqa: E731
    return prim.rule(Problem(shapes(inputs), shapes(outputs), dict(attrs or {}), variant, index_dtype))


def variant_of(dtype: Any) -> str:
    """``bf16`` or ``fp32`` for a storage dtype (a numpy/ml_dtypes dtype or a name such as ``bf16``)."""
    name = np.dtype(dtype).name if not isinstance(dtype, str) else dtype
    if name in ("bfloat16", "bf16"):
        return "bf16"
    if name in ("float32", "fp32", "f32"):
        return "fp32"
    raise NotCovered(f"no CUDA kernel variant for dtype {name}")


def families() -> list[str]:
    """Every kernels/*.cu file, by stem."""
    return sorted(p.stem for p in SOURCE_DIR.glob("*.cu"))


# ----------------------------------------------------------------------------
# Device tables
# ----------------------------------------------------------------------------

# reduction.cu: struct TensorRef { const void* ptr; long long n; }
TENSOR_TABLE = np.dtype([("ptr", "<u8"), ("n", "<i8")])
# adamw.cu: struct AdamWTensor (64 bytes)
ADAMW_TABLE = np.dtype([("param", "<u8"), ("grad", "<u8"), ("exp_avg", "<u8"), ("exp_avg_sq", "<u8"),
                        ("param_copy", "<u8"), ("n", "<i8"), ("lr_scale", "<f8"), ("weight_decay", "<f8")])


def tensor_table(entries: Sequence[tuple[int, int]]) -> np.ndarray:
    """The ``tensors`` table: one (device pointer, numel) per tensor; upload ``.tobytes()``."""
    table = np.zeros(len(entries), TENSOR_TABLE)
    for i, (address, n) in enumerate(entries):
        table[i] = (address, n)
    return table


@dataclass(frozen=True)
class AdamWEntry:
    """One tensor of an adamw_multi launch (device pointers; param_copy 0 for none)."""

    param: int
    grad: int
    exp_avg: int
    exp_avg_sq: int
    n: int
    lr_scale: float = 1.0
    weight_decay: float = 0.01
    param_copy: int = 0


def adamw_table(entries: Sequence[AdamWEntry]) -> np.ndarray:
    """The ``adamw`` table; upload ``.tobytes()``."""
    table = np.zeros(len(entries), ADAMW_TABLE)
    for i, e in enumerate(entries):
        table[i] = (e.param, e.grad, e.exp_avg, e.exp_avg_sq, e.param_copy, e.n, e.lr_scale, e.weight_decay)
    return table
