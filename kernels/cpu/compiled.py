"""The compiled CPU kernels: C loops that fuse what numpy runs as many passes, built at first use.

Some kernels are a handful of numpy passes over small arrays (SiLU, RoPE,
RMSNorm, the softmax of an attention strip, the cross-entropy of a row): there
a pass costs more in dispatch and memory traffic than in arithmetic, and numpy
cannot fuse them. Their compiled twins are the C functions of ``compiled.c``
(float32), one loop over the data with a vectorizable ``exp``. They are built
at the first use on a machine by the C compiler that the ``ziglang`` wheel
ships (clang: ``-O3 -march=native``, each operation rounded as written but
the sums it may reassociate, IEEE inf and NaN kept), into ``$MDSL_CACHE_DIR``
(default ``~/.cache/modeldsl``) under a name
that hashes the source, the flags and the CPU, so a later process only loads
the library (ctypes, a few hundred KB of memory). The build says so on stderr,
a line before it and one with its time after it; processes that start at once
build it one at a time (a lock file beside it), and each build lands by an
atomic rename, so a reader never sees a partial library. The runtime loads the
library before it starts a timer (:func:`prepare`), so no reported speed holds
the build. Nothing is compiled at install
time: ``ziglang`` installs from the package registry as a wheel. ctypes releases
the GIL during a call, so the pool's threads run them truly at once.

The compiled path is on when the library builds or is cached and
``MDSL_CPU_JIT`` is not ``0`` (:func:`enabled`); the family modules (activation
here, attention, loss, norm, rope) take a launch on it first and hand what it
declines (float64, non-contiguous rows) to their numpy kernels. Both paths are
tested against the numpy references, the oracle: a compiled kernel rounds
differently (its ``exp``, the order of its sums) within a few float32 ulps, and
gives the same bits on every run and on any number of threads (each output row
is computed by one thread, in a fixed order), except the column sums of the
RMSNorm weight gradient, which are added per thread as on the numpy path.

``fast_exp`` (in C): ``exp(x) = 2^k p(r)``, ``k = round(x log2 e)``, ``r = x - k
ln 2`` (Cody-Waite, two parts of ln 2), ``p`` a degree-7 polynomial on ``|r| <=
ln(2) / 2`` and ``2^k`` two powers of two built from their bits: within 1 ulp of
the correctly rounded result (checked in the tests), ``inf`` above 88.72 and
``0`` below -103.97 as numpy's, with no branch and no call, so the loops around
it vectorize.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import cache
from pathlib import Path

import numpy as np

from modeldsl.kernels.cpu.pool import BEFORE_RUN, Pool
from modeldsl.kernels.cpu.tiles import Step, as_rows

ENV_VAR = "MDSL_CPU_JIT"
CACHE_ENV_VAR = "MDSL_CACHE_DIR"
SOURCE = Path(__file__).with_name("compiled.c")
# Each operation rounds as written (no contraction into FMAs, no reassociation but in the sums that
# compiled.c marks: a fused kernel and its unfused parts keep the same bits); inf and NaN keep their
# meaning.
FLAGS = ("-O3", "-march=native", "-fno-math-errno", "-ffp-contract=off", "-fno-signed-zeros", "-fno-trapping-math",
         "-shared", "-fPIC", "-lm")
F32 = np.dtype(np.float32)

I64, PTR, FLOAT, INT = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float, ctypes.c_int
SIGNATURES: dict[str, tuple] = {
    "exp_rows": (I64, PTR, PTR),
    "silu_rows": (I64, I64, PTR, I64, PTR, I64),
    "swiglu_rows": (I64, I64, PTR, I64, PTR, I64, PTR, I64),
    "silu_backward_rows": (I64, I64, PTR, I64, PTR, I64, PTR, I64),
    "swiglu_backward_rows": (I64, I64, PTR, I64, PTR, I64, PTR, I64, PTR, I64, PTR, I64),
    "softmax_strip": (I64, I64, PTR, PTR, FLOAT, FLOAT, PTR, I64, I64, I64, I64, INT, I64, PTR, PTR),
    "probabilities_strip": (I64, I64, PTR, PTR, FLOAT, FLOAT, PTR, PTR, I64, I64, I64, I64, INT, I64, PTR, PTR),
    "score_grads_strip": (I64, I64, PTR, PTR, PTR, PTR, I64, I64, PTR, I64, I64, I64, I64, FLOAT),
    "cross_entropy_rows": (I64, I64, PTR, I64, I64, PTR, PTR, PTR, PTR, PTR, INT, INT),
    "rope_rows": (I64, I64, PTR, PTR, PTR, I64, I64, I64, INT, INT, INT, I64),
    "rmsnorm_rows": (I64, I64, I64, PTR, PTR, PTR, PTR, FLOAT, PTR, PTR, INT),
    "rmsnorm_backward_rows": (I64, I64, I64, PTR, PTR, PTR, PTR, PTR, PTR, INT, PTR),
    "gemm_threads": (PTR, INT),
    "run_gemms": (PTR, I64, I64),
    "gemm_rest": (),
}
RESTYPES = {"gemm_threads": INT}


class GemmJob(ctypes.Structure):
    """One product ``C = alpha op(A) op(B) + beta C`` of row-major operands (``gemm_job`` in compiled.c)."""
    _fields_ = [("trans_a", I64), ("trans_b", I64), ("m", I64), ("n", I64), ("k", I64), ("a", PTR), ("lda", I64),
                ("b", PTR), ("ldb", I64), ("c", PTR), ("ldc", I64), ("alpha", FLOAT), ("beta", FLOAT)]


# ---------------------------------------------------------------------------------------- building
def cache_dir() -> Path:
    """Where built libraries go: ``$MDSL_CACHE_DIR``, else ``~/.cache/modeldsl``."""
    given = os.environ.get(CACHE_ENV_VAR)
    return Path(given) if given else Path.home() / ".cache" / "modeldsl"


def _cpu_flags() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor()
    return next((line for line in text.splitlines() if line.startswith("flags")), "")


def library_path() -> Path:
    """The library of this source, these flags and this CPU (built or not)."""
    digest = hashlib.sha256()
    for part in (SOURCE.read_bytes(), " ".join(FLAGS).encode(), platform.machine().encode(), _cpu_flags().encode()):
        digest.update(part)
    return cache_dir() / f"cpu-kernels-{digest.hexdigest()[:16]}.so"


def build(target: Path) -> None:
    """Compile ``compiled.c`` into ``target`` with the ``ziglang`` wheel's C compiler (raises on failure)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        built = Path(scratch) / target.name
        subprocess.run([sys.executable, "-m", "ziglang", "cc", *FLAGS, str(SOURCE), "-o", str(built)],
                       check=True, capture_output=True, timeout=600)
        os.replace(built, target)


BUILDING = "building the CPU kernels for this machine (once)..."


def _say(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def build_once(target: Path) -> None:
    """Build ``target`` unless it exists, announced on stderr; one process at a time builds (an
    exclusive lock on ``target.lock``), and one that waited finds the library built."""
    if target.exists():
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.with_name(target.name + ".lock"), "a") as lock:
        _lock(lock)
        if target.exists():  # another process built it while this one waited
            return
        _say(BUILDING)
        started = time.perf_counter()
        try:
            build(target)
        except (OSError, subprocess.SubprocessError) as err:
            _say(f"the CPU kernels did not build ({type(err).__name__}); the numpy kernels run instead")
            raise
        _say(f"built the CPU kernels in {time.perf_counter() - started:.1f} s (cached in {target.parent})")


def _lock(handle) -> None:
    """Hold an exclusive lock on the open file ``handle`` until it closes (none where the platform
    has no ``fcntl``: the atomic rename of :func:`build` still keeps readers safe)."""
    try:
        import fcntl
    except ImportError:
        return
    fcntl.flock(handle, fcntl.LOCK_EX)


@cache
def library() -> ctypes.CDLL | None:
    """The compiled kernels (built on the first call on this machine), or None where they cannot be
    built (no ``ziglang``, no writable cache): the numpy kernels then run everything."""
    try:
        target = library_path()
        build_once(target)
        lib = ctypes.CDLL(str(target))
    except (OSError, subprocess.SubprocessError):
        return None
    for name, argtypes in SIGNATURES.items():
        function = getattr(lib, name)
        function.argtypes, function.restype = argtypes, RESTYPES.get(name)
    return lib


def enabled() -> bool:
    """Whether the compiled kernels run: ``MDSL_CPU_JIT`` is not ``0`` and the library loads."""
    return os.environ.get(ENV_VAR, "1").strip() != "0" and library() is not None


def prepare() -> None:
    """Build (once per machine, announced) and load the library now where the compiled kernels are
    on: callers do it before they start a timer, so no measured time holds the build."""
    enabled()


def kernel(name: str) -> Callable:
    return getattr(library(), name)


# ---------------------------------------------------------------------------------------- operands
def address(a: np.ndarray) -> int:
    """The address of ``a``'s first element. A step that binds it must hold ``a`` as long as it lives."""
    return a.__array_interface__["data"][0]


def row_stride(a: np.ndarray) -> int:
    """The elements from one row of a 2-d float32 view to the next."""
    return a.strides[0] // a.itemsize


def takes(*arrays: np.ndarray | None) -> bool:
    """Whether the compiled kernels take these operands: float32, each last dimension contiguous."""
    return all(a.dtype == F32 and (a.ndim == 0 or a.shape[-1] <= 1 or a.strides[-1] == a.itemsize)
               for a in arrays if a is not None)


def split_rows(pool: Pool, run: Callable[[int, int], None], total: int, work: int) -> Step:
    """The step running ``run(start, stop)`` over ``[0, total)`` split over the pool."""
    ranges = pool.split(total, work)
    if len(ranges) == 1:
        return lambda: run(0, total)
    return lambda: pool.run(lambda start, stop, thread: run(start, stop), ranges)


def over_rows(pool: Pool, name: str, outputs, inputs, cost: int = 1) -> Step | None:
    """The step running kernel ``name(rows, width, out0, stride0, ..., in0, stride0, ...)`` over the
    rows of same-shaped ``outputs`` and ``inputs`` viewed as ``[rows, C]``, each thread over its
    block of rows (None: not float32 rows with a contiguous last dimension)."""
    rows = [as_rows(a) for a in (*outputs, *inputs)]
    if any(r is None for r in rows) or len({r.shape for r in rows}) != 1 or not takes(*rows):
        return None
    total, width = rows[0].shape
    bases = [(address(r), row_stride(r)) for r in rows]
    function = kernel(name)

    def run(start: int, stop: int, arrays=rows) -> None:  # the arrays stay alive while the step does
        operands = []
        for base, stride in bases:
            operands += (base + 4 * start * stride, stride)
        function(stop - start, width, *operands)

    return split_rows(pool, run, total, total * width * cost)


def fast_exp(x: np.ndarray) -> np.ndarray:
    """The kernels' float32 ``exp`` of a contiguous array (for tests: they check it against numpy's)."""
    x = np.ascontiguousarray(x, np.float32)
    out = np.empty_like(x)
    kernel("exp_rows")(x.size, address(out), address(x))
    return out


# ---------------------------------------------------------------------------------------- attention strips
def _slopes(slopes: np.ndarray) -> tuple[int, int, int]:
    """(address, heads, group) of an ALiBi ``[kv heads, query heads]`` view (``[0, 0]``: none)."""
    if slopes.size == 0:
        return 0, 1, 1
    return address(slopes), slopes.shape[1], row_stride(slopes)


def _segments(segments: tuple[np.ndarray, np.ndarray] | None, rows: int, span: int) -> tuple[int | None, int | None]:
    """The addresses of a strip's query ids (``[rows]``) and key ids (``[span]``), contiguous int32
    (None, None: no segments)."""
    if segments is None:
        return None, None
    ids_q, ids_k = segments
    if ids_q.dtype != np.int32 or ids_k.dtype != np.int32 or ids_q.shape != (rows,) or ids_k.shape != (span,) \
            or not (ids_q.flags.c_contiguous and ids_k.flags.c_contiguous):
        raise ValueError("a strip's segment ids are contiguous int32 [rows] and [span]")
    return address(ids_q), address(ids_k)


def softmax_strip(s, lse, scale, slopes, rows: int, shift: int, causal: bool, window: int,
                  softcap: float = 0.0, segments: tuple[np.ndarray, np.ndarray] | None = None) -> None:
    """``s [R, span] = softmax(cap(scale s) - slope |d|)`` over the keys each row sees (the others 0),
    ``lse`` its log-sum-exp (the layout of a strip: ``compiled.c``); ``cap(x) = c tanh(x / c)`` with
    ``softcap`` c > 0 (0: none); ``segments``: the ids of the block's queries and of the strip's keys
    (packed rows: a key of another example is not seen)."""
    kernel("softmax_strip")(s.shape[0], s.shape[1], address(s), address(lse), scale, softcap, *_slopes(slopes), rows,
                            shift, causal, window, *_segments(segments, rows, s.shape[1]))


def probabilities_strip(s, lse, scale, slopes, rows: int, shift: int, causal: bool, window: int,
                        softcap: float = 0.0, factors: np.ndarray | None = None,
                        segments: tuple[np.ndarray, np.ndarray] | None = None) -> None:
    """``s = exp(cap(scale s) - slope |d| - lse)`` over the keys each row sees (the others 0); with
    ``softcap`` c > 0, ``factors`` (shaped as ``s``) gets the cap's derivatives ``1 - tanh^2`` there
    (0 elsewhere); ``segments`` as :func:`softmax_strip`'s."""
    if softcap and (factors is None or factors.shape != s.shape):
        raise ValueError("a softcapped probabilities_strip takes factors shaped as its strip")
    kernel("probabilities_strip")(s.shape[0], s.shape[1], address(s), address(lse), scale, softcap,
                                  address(factors) if softcap else None, *_slopes(slopes), rows, shift, causal, window,
                                  *_segments(segments, rows, s.shape[1]))


def score_grads_strip(d_s, p, d_out, out, scale, factors: np.ndarray | None = None) -> None:
    """``d_s = scale p (d_s - sum(d_out out))`` row by row (``d_out``, ``out``: ``[heads, rows, Dv]``),
    times ``factors`` (probabilities_strip's softcap derivatives) where given."""
    elements = [stride // 4 for stride in (*d_out.strides[:2], *out.strides[:2])]
    kernel("score_grads_strip")(d_s.shape[0], d_s.shape[1], address(d_s), address(p),
                                None if factors is None else address(factors), address(d_out), *elements[:2],
                                address(out), *elements[2:], d_out.shape[2], d_out.shape[1], scale)


# ---------------------------------------------------------------------------------------- the other row kernels
def cross_entropy_rows(logits, first: int, column, valid, scale, lse, per_row, losses: bool, grads: bool) -> None:
    """Rows ``first + r`` of a cross-entropy for each row ``r`` of ``logits`` (``compiled.c``)."""
    kernel("cross_entropy_rows")(logits.shape[0], logits.shape[1], address(logits), row_stride(logits), first,
                                 address(column), address(valid), address(scale), address(lse), address(per_row),
                                 losses, grads)


def bind_rope(x, out, freqs, bthd: bool, interleaved: bool, inverse: bool) -> Callable[[int, int], None]:
    """``run(start, stop)``: tokens ``start .. stop - 1`` of ``out = rope(x)`` for every head (``x``,
    ``out``: C-contiguous in their layout; ``freqs``: ``[T, D/2, 2]``, or ``[B, T, D/2, 2]`` a table per
    row)."""
    tokens, heads = (x.shape[1], x.shape[2]) if bthd else (x.shape[2], x.shape[1])
    table_rows = tokens * (x.shape[0] if freqs.ndim == 4 else 1)
    function, operands = kernel("rope_rows"), (address(x), address(out), address(freqs), tokens, heads, x.shape[3],
                                               bthd, interleaved, inverse, table_rows)
    return lambda start, stop, arrays=(x, out, freqs): function(start, stop, *operands)


def bind_rmsnorm(y, rstd, x, weight, eps: float, residual, value) -> Callable[[int, int], None]:
    """``run(start, stop)``: rows ``start .. stop - 1`` of ``y = x rstd w`` (``residual``: x is
    first written as ``residual + value``)."""
    fused = residual is not None
    function = kernel("rmsnorm_rows")
    operands = (x.shape[1], address(y), address(rstd), address(x), address(weight), eps,
                address(residual if fused else x), address(value if fused else x), fused)
    return lambda start, stop, arrays=(y, rstd, x, weight, residual, value): function(start, stop, *operands)


def bind_rmsnorm_backward(d_x, d_y, x, weight, rstd, d_next) -> Callable[[int, int, np.ndarray], None]:
    """``run(start, stop, column_sums)``: rows ``start .. stop - 1`` of RMSNorm's ``d_x`` (plus
    ``d_next`` where given), their weight gradient added into ``column_sums``."""
    fused = d_next is not None
    function = kernel("rmsnorm_backward_rows")
    operands = (x.shape[1], address(d_x), address(d_y), address(x), address(weight), address(rstd),
                address(d_next if fused else d_y), fused)
    arrays = (d_x, d_y, x, weight, rstd, d_next)  # alive while the step is
    return lambda start, stop, column_sums, arrays=arrays: function(start, stop, *operands, address(column_sums))


# ---------------------------------------------------------------------------------------- GEMMs
BLAS_SYMBOL = "scipy_cblas_sgemm64_"  # numpy's bundled OpenBLAS (64-bit integers)


@cache
def blas_sgemm() -> int | None:
    """The address of numpy's ``cblas_sgemm`` (None where numpy's BLAS is not scipy-openblas64)."""
    from threadpoolctl import threadpool_info

    for info in threadpool_info():
        if info.get("internal_api") == "openblas" and "scipy_openblas64" in info.get("filepath", ""):
            try:
                return ctypes.cast(getattr(ctypes.CDLL(info["filepath"]), BLAS_SYMBOL), ctypes.c_void_p).value
            except (OSError, AttributeError):
                return None
    return None


def blas_operand(x: np.ndarray) -> tuple[bool, int] | None:
    """``(transposed, leading dimension)`` of a 2-d float32 view as BLAS reads it, row-major (None:
    neither its rows nor its columns are contiguous)."""
    rows, columns = x.shape
    inner, outer = (s // x.itemsize for s in x.strides[::-1])
    if inner == 1 or columns == 1:
        lead = outer if rows > 1 else max(columns, 1)
        return (False, lead) if lead >= max(columns, 1) else None
    if outer == 1 or rows == 1:
        lead = inner if columns > 1 else max(rows, 1)
        return (True, lead) if lead >= max(rows, 1) else None
    return None


def gemm_jobs(products, alpha: float, beta: float) -> ctypes.Array | None:
    """The :class:`GemmJob` array of ``(op(A), op(B), C)`` 2-d float32 views (None: one is not a
    BLAS operand, or C's rows are not contiguous)."""
    jobs = []
    for x, y, z in products:
        a, b, c = blas_operand(x), blas_operand(y), blas_operand(z)
        if a is None or b is None or c is None or c[0] or any(v.dtype != F32 for v in (x, y, z)):
            return None
        jobs.append(GemmJob(a[0], b[0], z.shape[0], z.shape[1], x.shape[1], address(x), a[1], address(y), b[1],
                            address(z), c[1], alpha, beta))
    return (GemmJob * len(jobs))(*jobs)


def gemm_step(products, alpha: float, beta: float, threads: int) -> Step | None:
    """The step running the products on the library's threads, ``threads`` shares (None: not BLAS
    operands, or no numpy BLAS to call)."""
    blas = blas_sgemm()
    jobs = gemm_jobs(products, alpha, beta)
    if blas is None or jobs is None:
        return None
    lib = library()
    shares = min(lib.gemm_threads(blas, threads - 1) + 1, threads, len(jobs))
    if lib.gemm_rest not in BEFORE_RUN:
        BEFORE_RUN.append(lib.gemm_rest)
    operands = [array for product in products for array in product]  # alive while the step is

    def step(operands=operands) -> None:
        lib.run_gemms(jobs, len(jobs), shares)

    return step
