"""The compiled kernels' library: built once per source, flags and CPU into the cache folder, and a
machine where it cannot be built runs the numpy kernels instead (no error)."""

import subprocess

import numpy as np

from modeldsl.kernels.cpu import compiled, cpu_kernel
from modeldsl.kernels.cpu.pool import Pool


def test_the_library_is_named_by_its_source_flags_and_cpu(monkeypatch, tmp_path):
    monkeypatch.setenv(compiled.CACHE_ENV_VAR, str(tmp_path))
    first = compiled.library_path()
    assert first.parent == tmp_path and first.name.startswith("cpu-kernels-") and first.suffix == ".so"
    monkeypatch.setattr(compiled, "FLAGS", (*compiled.FLAGS, "-DOTHER"))
    assert compiled.library_path() != first


def test_where_the_library_cannot_be_built_the_numpy_kernels_run(monkeypatch, tmp_path):
    def no_compiler(target):
        raise subprocess.CalledProcessError(1, ["python", "-m", "ziglang", "cc"])

    monkeypatch.setenv(compiled.CACHE_ENV_VAR, str(tmp_path))
    monkeypatch.setattr(compiled, "build", no_compiler)
    compiled.library.cache_clear()
    try:
        assert compiled.library() is None and not compiled.enabled()
        gate = np.linspace(-3, 3, 64, dtype=np.float32).reshape(4, 16)
        out = np.empty_like(gate)
        pool = Pool(1)
        step = cpu_kernel("silu")(pool, [out], [gate], {})
        pool.workspace.prepare()
        step()
        np.testing.assert_array_equal(out, gate * (1 / (1 + np.exp(-gate))))  # the numpy kernel's bits
        assert cpu_kernel("qk_norm") is None  # compiled only: the reference runs it
    finally:
        compiled.library.cache_clear()
