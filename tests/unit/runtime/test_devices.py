"""Where the schedule runs: modeldsl.load(device=...) and mdsl-run --device."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

import modeldsl
from modeldsl.diagnostics import DiagnosticError
from modeldsl.resolve.imports import STD_ROOT
from modeldsl.tools.run import main

# the devices run the references: bitwise on its numpy kernels
pytestmark = pytest.mark.usefixtures("numpy_cpu_kernels")

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "tiny_llama"
LLAMA = STD_ROOT / "models" / "llama.module"
HAS_CUDA_PYTHON = importlib.util.find_spec("cuda") is not None


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # decoding's kv_cache_attention runs on the host
def test_the_emulated_cuda_executor_generates_what_the_cpu_schedule_does():
    cpu = modeldsl.load(LLAMA, hf=EXAMPLE)
    emulated = modeldsl.load(LLAMA, hf=EXAMPLE, device="emulated")
    ids = np.array([[5, 9, 2, 7, 1, 3]])
    np.testing.assert_array_equal(emulated.forward(ids), cpu.forward(ids))
    assert emulated.generate([5, 9, 2], 6) == cpu.generate([5, 9, 2], 6)


def test_an_unknown_device_is_e029():
    with pytest.raises(DiagnosticError, match=r"E029.*device 'tpu' is not cpu, cuda or emulated"):
        modeldsl.load(LLAMA, hf=EXAMPLE, device="tpu")


@pytest.mark.skipif(HAS_CUDA_PYTHON, reason="cuda-python is installed here")
@pytest.mark.parametrize("flags", [
    ["--prompt", "Hi", "--max-new-tokens", "2"],
    ["--train", str(Path(__file__).resolve().parents[3] / "examples" / "tiny_corpus.txt"), "--steps", "1",
     "--batch", "1", "--seq", "8", "--lr", "1e-3"],
])
def test_device_cuda_without_cuda_python_is_a_coded_error(flags, capsys):
    assert main([str(LLAMA), "--hf", str(EXAMPLE), "--device", "cuda", *flags]) == 1
    err = capsys.readouterr().err
    assert "error[E029]: --device cuda: cuda-python is not installed" in err and "Traceback" not in err


def test_the_graph_engine_on_a_gpu_is_e029(capsys):
    assert main([str(LLAMA), "--hf", str(EXAMPLE), "--prompt", "Hi", "--engine", "graph", "--device", "cuda"]) == 1
    assert "error[E029]: mdsl-run: --engine graph runs on the CPU, not --device cuda" in capsys.readouterr().err
