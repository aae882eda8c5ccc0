"""mdsl-build-kernels: every kernels/*.cu compiles for sm_80 and sm_90a, the cubin cache is hit and
invalidated as it should be, and compile errors and a missing nvcc are coded diagnostics.

CPU only (nvcc compiles; nothing runs); skipped where nvcc is absent. The whole kernel set is
compiled once per test session, two nvcc processes at a time, into a session cache.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from modeldsl.diagnostics import DiagnosticError
from modeldsl.kernels import cuda
from modeldsl.tools import build_kernels

try:
    NVCC = build_kernels.find_nvcc()
except DiagnosticError:
    NVCC = None

needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc (the CUDA toolkit) is not installed: kernels cannot be "
                                                      "compiled here")

BROKEN = """#include "common.cuh"
extern "C" __global__ void mdsl_broken(float* p) {
  p[0] = undefined_thing + 1.f;
}
"""


@pytest.fixture(scope="session")
def kernel_cache(tmp_path_factory):
    """Every family compiled for both archs once (2 parallel nvcc), with the build time."""
    if NVCC is None:
        pytest.skip("nvcc is not installed")
    cache = tmp_path_factory.mktemp("kernel-cache")
    start = time.perf_counter()
    results = build_kernels.build(None, build_kernels.ARCHS, cache, jobs=2)
    return cache, results, time.perf_counter() - start


@needs_nvcc
def test_every_kernel_file_compiles_for_both_archs(kernel_cache):
    _, results, seconds = kernel_cache
    failed = [d.render() for r in results for d in r.diagnostics]
    assert not failed, "\n".join(failed)
    built = {(r.source.stem, r.arch) for r in results}
    assert built == {(f, a) for f in cuda.families() for a in build_kernels.ARCHS}
    assert all(r.cubin.is_file() and r.cubin.stat().st_size > 0 for r in results)
    print(f"compiled {len(results)} cubins in {seconds:.1f} s")


@needs_nvcc
def test_every_table_symbol_is_in_its_cubin(kernel_cache):
    _, results, _ = kernel_cache
    cubins = {(r.source.stem, r.arch): r.cubin.read_bytes() for r in results}
    for kernel in cuda.KERNELS.values():
        for arch in build_kernels.ARCHS:
            data = cubins[(kernel.family, arch)]
            for symbol in kernel.symbols.values():
                assert b"\0" + symbol.encode() + b"\0" in data, f"{symbol} is not in {kernel.family}.{arch}.cubin"


@needs_nvcc
def test_every_launch_of_the_table_fits_the_kernel_resources(kernel_cache):
    """What a GPU would refuse at launch time: more registers or shared memory per block than an
    SM has (sm_80/sm_90: 64K registers, 48 KiB of static shared memory), for every plan of the
    table tests; and no kernel spills registers to local memory."""
    from .test_cuda_table import CASES

    cache, _, _ = kernel_cache
    usage = {arch: {} for arch in build_kernels.ARCHS}
    for arch in build_kernels.ARCHS:
        for family in cuda.families():
            usage[arch].update(build_kernels.resource_usage(family, arch, cache))
    for arch, kernels in usage.items():
        spilling = {k: u for k, u in kernels.items() if u["spill_stores"] or u["spill_loads"] or u["stack"]}
        assert not spilling, f"{arch}: kernels that spill: {spilling}"
    for name, inputs, outputs, attrs, variant, index_dtype in CASES:
        for launch in cuda.plan(name, inputs, outputs, attrs, variant, index_dtype).launches:
            for arch in build_kernels.ARCHS:
                u = usage[arch][launch.symbol]
                warps = -(-launch.threads // 32)
                registers = warps * -(-u["registers"] * 32 // 256) * 256  # allocated per warp, 256 at a time
                assert registers <= 65536, f"{launch.symbol} ({arch}): {u['registers']} registers x {launch.block}"
                assert u["smem"] + launch.shared <= 48 * 1024, f"{launch.symbol} ({arch}): shared memory"


def test_resource_usage_is_read_from_ptxas():
    report = """ptxas info    : Compiling entry function 'mdsl_k_f32' for 'sm_90a'
ptxas info    : Function properties for mdsl_k_f32
    8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 72 registers, used 1 barriers, 1056 bytes smem, 400 bytes cmem[0]
ptxas info    : Compiling entry function 'mdsl_j_f32' for 'sm_90a'
ptxas info    : Used 12 registers, used 0 barriers, 380 bytes cmem[0]
ptxas info    : Compiling entry function 'mdsl_s_f32' for 'sm_90a'
ptxas info    : Function properties for mdsl_s_f32
    24 bytes stack frame, 12 bytes spill stores, 24 bytes spill loads
ptxas info    : Used 96 registers, used 1 barriers, 24 bytes cumulative stack size, 43264 bytes smem, 480 bytes cmem[0]
"""
    usage = build_kernels.parse_resource_usage(report)
    assert usage["mdsl_k_f32"] == {"registers": 72, "smem": 1056, "stack": 8, "spill_stores": 4, "spill_loads": 4}
    assert usage["mdsl_j_f32"]["registers"] == 12 and usage["mdsl_j_f32"]["smem"] == 0
    assert usage["mdsl_s_f32"] == {"registers": 96, "smem": 43264, "stack": 24, "spill_stores": 12,
                                   "spill_loads": 24}  # a spilling kernel's line also gives its stack size


@needs_nvcc
def test_a_second_build_hits_the_cache_without_calling_nvcc(kernel_cache, monkeypatch):
    cache, first, _ = kernel_cache

    def no_nvcc(*args, **kwargs):
        raise AssertionError(f"nvcc was called: {args}")

    monkeypatch.setattr(build_kernels.subprocess, "run", no_nvcc)
    again = build_kernels.build(None, build_kernels.ARCHS, cache, jobs=2)
    assert all(r.cached for r in again)
    assert [r.cubin for r in again] == [r.cubin for r in first]
    assert build_kernels.cubin_path("rmsnorm", "sm_90a", cache) in {r.cubin for r in first}


@needs_nvcc
def test_an_edited_source_is_compiled_again(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for header in cuda.SOURCE_DIR.glob("*.cuh"):
        shutil.copy(header, src)
    kernel = src / "cast.cu"
    shutil.copy(cuda.SOURCE_DIR / "cast.cu", kernel)
    cache = tmp_path / "cache"
    (first,) = build_kernels.build([kernel], ["sm_80"], cache)
    assert first.ok and not first.cached
    (same,) = build_kernels.build([kernel], ["sm_80"], cache)
    assert same.cached and same.cubin == first.cubin
    kernel.write_text(kernel.read_text() + "\n// edited\n")
    (edited,) = build_kernels.build([kernel], ["sm_80"], cache)
    assert edited.ok and not edited.cached and edited.cubin != first.cubin
    (src / "common.cuh").write_text((src / "common.cuh").read_text() + "\n// a header edit counts too\n")
    (header_edit,) = build_kernels.build([kernel], ["sm_80"], cache)
    assert not header_edit.cached and header_edit.cubin != edited.cubin
    (forced,) = build_kernels.build([kernel], ["sm_80"], cache, force=True)
    assert not forced.cached and forced.cubin == header_edit.cubin


@needs_nvcc
def test_a_compile_error_is_a_coded_diagnostic_at_the_source_line(tmp_path):
    shutil.copy(cuda.SOURCE_DIR / "common.cuh", tmp_path)
    broken = tmp_path / "broken.cu"
    broken.write_text(BROKEN)
    done = subprocess.run([sys.executable, "-m", "modeldsl.tools.build_kernels", str(broken), "--arch", "sm_80",
                           "--cache-dir", str(tmp_path / "cache")], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert "broken.cu:3:10: error[E035]: CUDA compile error: identifier \"undefined_thing\" is undefined" \
        in done.stderr, done.stderr
    assert "    3 |   p[0] = undefined_thing + 1.f;" in done.stderr
    assert "^^^^^^^^^^^^^^^" in done.stderr and "hint:" in done.stderr
    with pytest.raises(DiagnosticError) as err:
        build_kernels.cubin_path(str(broken), "sm_80", tmp_path / "cache")
    (diagnostic,) = err.value.diagnostics
    assert diagnostic.code == "E035" and diagnostic.span.line == 3


@needs_nvcc
def test_the_command_line_reports_cached_cubins(kernel_cache, capsys):
    cache, _, _ = kernel_cache
    assert build_kernels.main(["cast", "rope", "--arch", "sm_80", "--cache-dir", str(cache), "--jobs", "2"]) == 0
    out = capsys.readouterr().out
    assert "cast" in out and "cached" in out and "2 cubins: 0 built, 2 cached, 0 failed" in out


def test_missing_nvcc_is_a_coded_error_with_a_hint(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", "")
    for var in ("MDSL_NVCC", "CUDA_HOME", "CUDA_PATH"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(build_kernels, "CUDA_HOMES", ())
    assert build_kernels.main(["cast", "--cache-dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "error[E028]: nvcc not found" in err and "hint:" in err and "Traceback" not in err
    with pytest.raises(DiagnosticError):
        build_kernels.cubin_path("cast", "sm_80", tmp_path)


@pytest.mark.parametrize("argv, message", [
    (["no_such_family"], "no kernel source 'no_such_family'"),
    (["cast", "--arch", "ampere"], "--arch 'ampere'"),
    (["cast", "--jobs", "0"], "--jobs must be at least 1"),
    (["--no-such-flag"], "unrecognized arguments"),
])
def test_bad_arguments_are_coded_errors(argv, message, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MDSL_KERNEL_CACHE", str(tmp_path))
    assert build_kernels.main(argv) == 1
    err = capsys.readouterr().err
    assert message in err and ("E028" in err or "E029" in err) and "Traceback" not in err


def test_the_cache_folder_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("MDSL_KERNEL_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert build_kernels.default_cache_dir() == tmp_path / "xdg" / "modeldsl" / "kernels"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert build_kernels.default_cache_dir() == tmp_path / "home" / ".cache" / "modeldsl" / "kernels"
    monkeypatch.setenv("MDSL_KERNEL_CACHE", str(tmp_path / "mine"))
    assert build_kernels.default_cache_dir() == tmp_path / "mine"


def test_nvcc_output_without_a_location_still_names_the_file(tmp_path):
    src = tmp_path / "k.cu"
    src.write_text("// nothing\n")
    (diagnostic,) = build_kernels.parse_nvcc_errors("ptxas fatal   : Unresolved extern function 'f'\n", src)
    assert diagnostic.code == "E035" and "k.cu" in diagnostic.message and "ptxas fatal" in diagnostic.message


def test_flags_do_not_use_fast_math():
    assert "--use_fast_math" not in build_kernels.FLAGS and "-O3" in build_kernels.FLAGS
    assert set(build_kernels.ARCHS) == {"sm_80", "sm_90a"}


def test_families_are_the_kernel_sources():
    assert build_kernels.families() == cuda.families()
    assert all((Path(cuda.SOURCE_DIR) / f"{f}.cu").is_file() for f in build_kernels.families())
