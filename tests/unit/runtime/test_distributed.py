"""The parallel layout, the launcher's environment and the single process's communicator
(modeldsl.runtime.distributed); the runs on several processes are test_data_parallel.py's."""

from __future__ import annotations

import numpy as np
import pytest

from modeldsl.diagnostics import DiagnosticError
from modeldsl.runtime import distributed
from modeldsl.runtime.distributed import LaunchEnvironment, Layout, SingleProcess, launch_environment


def test_ranks_are_placed_tensor_parallel_innermost():
    layout = Layout(tp=2, dp=2, pp=2)
    assert layout.world == 8
    assert layout.coordinates(5) == {"tp": 1, "dp": 0, "pp": 1, "ep": 0, "world": 5}
    assert [layout.rank_of(**{k: v for k, v in layout.coordinates(r).items() if k in ("tp", "dp", "pp")})
            for r in range(8)] == list(range(8))
    assert layout.group_ranks("tp", 5) == [4, 5]
    assert layout.group_ranks("dp", 5) == [5, 7]
    assert layout.group_ranks("pp", 5) == [1, 5]
    assert layout.group_ranks("world", 5) == list(range(8))


def test_expert_parallel_groups_are_consecutive_data_parallel_ranks():
    layout = Layout(dp=4, ep=2)
    assert [layout.group_ranks("ep", r) for r in range(4)] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    assert layout.group_size("ep") == 2 and layout.group_size("dp") == 4


@pytest.mark.parametrize("options, words", [
    ({"tp": 0}, "tp=0: a parallel size is a positive integer"),
    ({"dp": True}, "dp=True: a parallel size"),
    ({"dp": 3, "ep": 2}, "ep=2 does not divide dp=3"),
    ({"sp": True}, "sp=true shards the sequence over the tensor-parallel ranks"),
])
def test_a_layout_that_cannot_be_is_e048(options, words):
    with pytest.raises(DiagnosticError, match="E048") as err:
        Layout(**options)
    assert words in err.value.diagnostics[0].message


def test_an_unknown_group_is_e048():
    with pytest.raises(DiagnosticError, match=r"E048.*no process group 'rows'"):
        Layout(dp=2).group_ranks("rows", 0)


@pytest.mark.parametrize("environ, want", [
    ({}, LaunchEnvironment()),
    ({"PMI_RANK": "1", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1"}, LaunchEnvironment(1, 4, 1, "mpi")),
    ({"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "3", "OMPI_COMM_WORLD_LOCAL_RANK": "0"},
     LaunchEnvironment(2, 3, 0, "mpi")),
    ({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "3"}, LaunchEnvironment(3, 8, 3, "torchrun")),
    ({"RANK": "0", "WORLD_SIZE": "2"}, LaunchEnvironment(0, 2, 0, "torchrun")),
])
def test_the_launchers_say_the_rank_and_world(environ, want):
    assert launch_environment(environ) == want


@pytest.mark.parametrize("environ, words", [
    ({"RANK": "x", "WORLD_SIZE": "2"}, "no integers"),
    ({"PMI_RANK": "4", "PMI_SIZE": "4"}, "PMI_RANK=4 is not a rank of a world of 4"),
])
def test_a_launcher_environment_that_is_no_ranks_is_e048(environ, words):
    with pytest.raises(DiagnosticError, match="E048") as err:
        launch_environment(environ)
    assert words in err.value.diagnostics[0].message


def test_a_layout_unlike_the_launch_is_e048():
    with pytest.raises(DiagnosticError, match=r"E048.*dp=2 takes 2 ranks; the launcher started 1") as err:
        distributed.start(Layout(dp=2), LaunchEnvironment())
    assert "mpiexec -n 2" in err.value.diagnostics[0].hint
    with pytest.raises(DiagnosticError, match=r"E048.*one process takes 1 ranks; the launcher started 4"):
        distributed.start(Layout(), LaunchEnvironment(0, 4, 0, "mpi"))


def test_ranks_torchrun_started_are_told_to_use_mpiexec():
    with pytest.raises(DiagnosticError, match=r"E048.*torchrun started rank 1 of 2; the ranks on the CPU talk over "
                                              r"MPI") as err:
        distributed.start(Layout(dp=2), LaunchEnvironment(1, 2, 1, "torchrun"))
    assert "mpiexec -n 2" in err.value.diagnostics[0].hint


def test_one_process_is_every_group_alone():
    comm = distributed.start(Layout(), LaunchEnvironment())
    assert isinstance(comm, SingleProcess) and distributed.communicator() is comm
    x, out = np.arange(6.0).reshape(2, 3), np.zeros((2, 3))
    comm.run("all_reduce", "dp", x, out, "sum")
    np.testing.assert_array_equal(out, x)
    assert comm.all_reduce_scalar(2.5, "dp", "avg") == 2.5
    assert distributed.start(Layout(), LaunchEnvironment()) is comm  # the same layout: the same communicator


@pytest.mark.parametrize("text, value", [("", distributed.DEFAULT_TIMEOUT), ("7.5", 7.5)])
def test_the_collectives_wait_mdsl_comm_timeout_seconds(monkeypatch, text, value):
    monkeypatch.setenv("MDSL_COMM_TIMEOUT", text)
    assert distributed.comm_timeout() == value


def test_a_timeout_that_is_no_seconds_is_e048(monkeypatch):
    monkeypatch.setenv("MDSL_COMM_TIMEOUT", "soon")
    with pytest.raises(DiagnosticError, match=r"E048.*MDSL_COMM_TIMEOUT='soon'"):
        distributed.comm_timeout()
