"""Data and tensor parallelism on several processes (mpiexec, mpi4py over MPICH's wheels: the
``distributed`` extra; skipped where it is not installed).

The bundled tiny Llama trained on two ranks, each on two of the four rows of every batch, gives the
single process's first-step gradient of every parameter, its 10-step loss and gradient-norm
trajectory, and its trained weights, within fp32 rounding (the two halves' GEMMs sum in another
order: 1e-5 relative). ZeRO-1 (the moments shared out over the ranks) gives plain data
parallelism's run bit for bit, saves every moment, and resumes on the same layout as if it had not
stopped. Tensor parallelism (tp=2, and tp=2 x dp=2 on four processes: each rank holding half of
the heads and of the MLP) gives them too, its shares put together, and saves the whole checkpoint.
A rank that dies ends the job with E049 within the collective timeout, and ``mpiexec -n 2 mdsl-run
... --dp 2`` (or ``--tp 2``) prints the single process's losses.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
WORKER = HERE / "data_parallel_worker.py"
MPIEXEC = Path(sys.executable).parent / "mpiexec"

pytestmark = pytest.mark.skipif(importlib.util.find_spec("mpi4py") is None or not MPIEXEC.exists(),
                                reason="the distributed extra (mpi4py, mpich) is not installed")


# (processes, data-parallel ranks, the worker's other flags) of the runs the fixture makes
LAYOUTS = ((1, 1, ()), (2, 2, ()), (2, 2, ("--zero",)), (2, 2, ("--accum", "2")), (2, 1, ("--tp", "2")),
           (4, 2, ("--tp", "2")))
TENSOR_PARALLEL = (4, 5)  # the fixture's tensor-parallel runs
LABELS = [f"dp{ranks}{''.join(extra)}" for ranks, _, extra in LAYOUTS]


def environment(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "OMPI_", "PMIX_"))}
    return {**env, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MDSL_THREADS": "1", **extra}


def run_ranks(ranks: int, *arguments: str, flags: tuple[str, ...] = (), timeout: float = 240, cwd: Path = ROOT,
              **env: str) -> subprocess.CompletedProcess:
    """The command on ``ranks`` processes (mpiexec), or alone for one, in ``cwd`` (where a run
    without --save or --loss-plot draws its loss.png: give a temporary folder)."""
    command = [str(MPIEXEC), *flags, "-n", str(ranks), *arguments] if ranks > 1 else list(arguments)
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=environment(**env),
                          cwd=cwd)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(one process's results, two data-parallel ranks', two ranks' with ZeRO-1, two ranks' of two
    micro-batches a step, two tensor-parallel ranks', tp=2 x dp=2): each the worker's json,
    gradients and (on several data-parallel ranks) saved training state."""
    folder = tmp_path_factory.mktemp("dp")
    found = []
    for (ranks, dp, extra), label in zip(LAYOUTS, LABELS):
        out = str(folder / label)
        done = run_ranks(ranks, sys.executable, str(WORKER), out, str(dp), *extra)
        assert done.returncode == 0, done.stderr[-3000:]
        saved = Path(out + ".save/training_state.npz")
        state = dict(np.load(saved)) if saved.is_file() else {}
        found.append((json.loads(Path(out + ".json").read_text()), dict(np.load(out + ".npz")), state, folder))
    return found


def relative(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


@pytest.mark.parametrize("which", [1, *TENSOR_PARALLEL], ids=["dp=2", "tp=2", "tp=2 x dp=2"])
def test_every_parameters_first_gradient_is_the_single_process_one(trained, which):
    """Under tensor parallelism each rank's shares of the sharded gradients, put together."""
    (_, single, *_), (_, parallel, *_) = trained[0], trained[which]
    assert set(single) == set(parallel) and len(single) == 9
    for name in single:
        assert parallel[name].shape == single[name].shape, name
        assert relative(parallel[name], single[name]) < 1e-5, name


@pytest.mark.parametrize("which", [1, 3, *TENSOR_PARALLEL],
                         ids=["one micro-batch", "two micro-batches", "tp=2", "tp=2 x dp=2"])
def test_the_loss_trajectory_and_the_trained_weights_are_the_single_process_ones(trained, which):
    """Also with two micro-batches a step, where each rank accumulates its own and the second sums
    the accumulated gradients over the ranks, and on tensor-parallel ranks (the trained shares put
    together: the gradient norm sums the sharded gradients' squares over the ranks)."""
    single, parallel = trained[0][0], trained[which][0]
    assert len(single["losses"]) == 10
    assert relative(parallel["losses"], single["losses"]) < 1e-5
    assert relative(parallel["norms"], single["norms"]) < 1e-5
    for name, total in single["weights"].items():
        assert abs(parallel["weights"][name] - total) <= 1e-5 * max(abs(total), 1.0), name


@pytest.mark.parametrize("which", TENSOR_PARALLEL, ids=["tp=2", "tp=2 x dp=2"])
def test_tensor_parallel_ranks_give_the_logits_and_save_the_whole_checkpoint(trained, which):
    """Every rank's logits are the whole model's, and the save gathers the shares into the ordinary
    checkpoint (the single process's tensors, names and shapes) with the whole moments: loaded in one
    process it gives the logits the ranks computed with the trained shares."""
    import modeldsl
    from modeldsl.hf.safetensors_io import SafetensorsFile

    folder, label = trained[0][3], LABELS[which]
    single, parallel = np.load(folder / "dp1.logits.npy"), np.load(folder / f"{label}.logits.npy")
    assert single.shape == (1, 16, 384) and relative(parallel, single) < 1e-5
    reloaded = modeldsl.load(hf=folder / f"{label}.save").forward(np.arange(16, dtype=np.int32)[None, :] % 300)
    assert relative(reloaded, np.load(folder / f"{label}.final_logits.npy")) < 1e-5
    files = [SafetensorsFile(folder / f"{name}.save" / "model.safetensors") for name in ("dp1", label)]
    assert sorted(files[0].keys()) == sorted(files[1].keys()) and len(files[0].keys()) == 2 * 9 + 3
    assert all(files[1].shape(name) == files[0].shape(name) for name in files[0].keys())
    single_state, state = trained[0][2], trained[which][2]
    moments = sorted(k for k in single_state if k.startswith("exp_avg"))
    assert len(moments) == 18 and all(state[name].shape == single_state[name].shape for name in moments)


def test_zero_1_is_plain_data_parallelism_bit_for_bit_and_saves_every_moment(trained):
    (plain, _, plain_state, _), (zero, _, zero_state, _) = trained[1], trained[2]
    assert zero == plain  # losses, gradient norms, weights
    moments = sorted(k for k in plain_state if k.startswith("exp_avg"))
    assert len(moments) == 18 and sorted(k for k in zero_state if k.startswith("exp_avg")) == moments
    for name in moments:
        np.testing.assert_array_equal(zero_state[name], plain_state[name], err_msg=name)


def test_zero_1_keeps_a_share_of_the_moments_on_each_rank():
    import modeldsl
    from modeldsl.passes.optimizer_step import zero_owners
    from modeldsl.runtime.optim import AdamWConfig
    from modeldsl.runtime.train import compile_optimizer_step

    model = modeldsl.load(hf=ROOT / "examples" / "tiny_llama", dtype="fp32")
    full = compile_optimizer_step(model.model, AdamWConfig()).arenas["optimizer"]
    shares = [compile_optimizer_step(model.model, AdamWConfig(), zero=(2, r)).arenas["optimizer"]
              for r in range(2)]
    assert sum(shares) <= full + 2 * 256 * 18 and max(shares) < 0.6 * full  # balanced, 256-byte aligned
    owners = zero_owners({"a": 10, "b": 7, "c": 5, "d": 4}, 2)
    assert owners == {"a": 0, "b": 1, "c": 1, "d": 0}


def test_zero_1_resumes_on_the_same_layout_as_if_it_had_not_stopped(tmp_path):
    data = str(ROOT / "examples" / "tiny_corpus.txt")
    flags = ["--hf", str(ROOT / "examples" / "tiny_llama"), "--train", data, "--steps", "4", "--batch", "4",
             "--seq", "16", "--lr", "1e-3"]
    run = (sys.executable, "-m", "modeldsl.tools.run")
    whole = run_ranks(1, *run, *flags, cwd=tmp_path)
    first = run_ranks(2, *run, *flags, "--dp", "2", "--zero", "--stop-after", "2", "--save", str(tmp_path / "out"),
                      cwd=tmp_path)
    rest = run_ranks(2, *run, "--train", data, "--resume", str(tmp_path / "out"), "--save", str(tmp_path / "out"),
                     cwd=tmp_path)
    for done in (whole, first, rest):
        assert done.returncode == 0, done.stderr[-3000:]
    losses = [[float(x) for x in re.findall(r"^step \d+ loss (\S+)", d.stdout, re.M)] for d in (whole, first, rest)]
    assert len(losses[1]) == 2 and len(losses[2]) == 2
    assert relative(losses[1] + losses[2], losses[0]) < 1e-5
    assert "data-parallel over 2 ranks" in rest.stdout  # the layout came from the saved run


def test_a_rank_that_dies_ends_the_job_with_e049_within_the_timeout(tmp_path):
    """Rank 1 ends itself before step 2; rank 0 waits at the step's first gradient all-reduce for
    MDSL_COMM_TIMEOUT seconds, reports E049 and aborts the job (mpiexec's own cleanup, on by
    default, ends it at once; -disable-auto-cleanup leaves the waiting to the timeout)."""
    started = time.monotonic()
    done = run_ranks(2, sys.executable, str(WORKER), str(tmp_path / "dead"), "2", "--die-at", "2",
                     flags=("-disable-auto-cleanup",), timeout=120, MDSL_COMM_TIMEOUT="3")
    assert done.returncode != 0
    assert "error[E049]: rank 0: all_reduce over group 'dp' (ranks 0, 1) did not complete within 3 s" in done.stderr
    assert time.monotonic() - started < 60


def test_mdsl_run_trains_on_two_ranks_as_on_one(tmp_path):
    flags = ["--hf", "examples/tiny_llama", "--train", "examples/tiny_corpus.txt", "--steps", "3", "--batch", "4",
             "--seq", "16", "--lr", "1e-3"]
    single = run_ranks(1, sys.executable, "-m", "modeldsl.tools.run", *flags, "--loss-plot", str(tmp_path / "a.png"))
    parallel = run_ranks(2, sys.executable, "-m", "modeldsl.tools.run", *flags, "--dp", "2", "--save",
                         str(tmp_path / "out"), "--loss-plot", str(tmp_path / "b.png"))
    assert single.returncode == 0 and parallel.returncode == 0, parallel.stderr[-3000:]
    losses = [[float(x) for x in re.findall(r"^step \d+ loss (\S+)", out.stdout, re.M)] for out in (single, parallel)]
    assert len(losses[0]) == 3 and relative(losses[1], losses[0]) < 1e-5
    assert "data-parallel over 2 ranks (2 sequences each)" in parallel.stdout
    assert parallel.stdout.count("training on") == 1  # rank 0 alone prints
    assert (tmp_path / "out" / "model.safetensors").is_file() and (tmp_path / "b.png").is_file()


def test_mdsl_run_trains_tensor_parallel_ranks_as_one_process(tmp_path):
    from modeldsl.hf.safetensors_io import SafetensorsFile

    flags = ["--hf", "examples/tiny_llama", "--train", "examples/tiny_corpus.txt", "--steps", "3", "--batch", "4",
             "--seq", "16", "--lr", "1e-3"]
    single = run_ranks(1, sys.executable, "-m", "modeldsl.tools.run", *flags, "--loss-plot", str(tmp_path / "a.png"))
    parallel = run_ranks(2, sys.executable, "-m", "modeldsl.tools.run", *flags, "--tp", "2", "--stop-after", "2",
                         "--save", str(tmp_path / "out"), "--loss-plot", str(tmp_path / "b.png"))
    assert single.returncode == 0 and parallel.returncode == 0, parallel.stderr[-3000:]
    losses = [[float(x) for x in re.findall(r"^step \d+ loss (\S+)", out.stdout, re.M)] for out in (single, parallel)]
    assert len(losses[0]) == 3 and relative(losses[1], losses[0][:2]) < 1e-5
    assert "tensor-parallel over 2 ranks" in parallel.stdout and parallel.stdout.count("training on") == 1
    saved = SafetensorsFile(tmp_path / "out" / "model.safetensors")  # the whole model, not rank 0's share
    assert saved.shape("model.layers.0.self_attn.q_proj.weight") == (64, 64)
    assert saved.shape("model.layers.0.mlp.down_proj.weight") == (64, 172)
    resumed = run_ranks(2, sys.executable, "-m", "modeldsl.tools.run", "--train", "examples/tiny_corpus.txt",
                        "--resume", str(tmp_path / "out"))
    assert resumed.returncode != 0 and "error[E029]: resuming a tensor-parallel run is not implemented" in \
        resumed.stderr
