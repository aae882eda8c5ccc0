"""Running one model on several processes: the parallel layout, the ranks, and the collectives over MPI.

**The layout.** :class:`Layout` (``tp``, ``dp``, ``pp``, ``ep``, ``sp``) places ``tp * dp * pp``
ranks as Megatron-LM does, tensor-parallel ranks innermost: rank ``r`` is at
``tp_rank = r % tp``, ``dp_rank = (r // tp) % dp``, ``pp_rank = r // (tp * dp)``. Its named
process groups are the ranks that differ in one coordinate only: ``tp``, ``dp``, ``pp`` (and
``ep``, the expert-parallel ranks, within a data-parallel group), and ``world``.

**The launcher.** :func:`launch_environment` reads the rank, the world size and the local rank
from the launcher's environment: MPI's (``mpiexec``: MPICH's ``PMI_RANK``/``PMI_SIZE``, Open MPI's
``OMPI_COMM_WORLD_*``, PMIx's ``PMIX_RANK``) or torchrun's (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``); one process without them.

**The communicator.** :func:`start` makes the process's communicator for a layout (E048 when the
world is not the layout's, or torchrun started the ranks: the CPU's transport is MPI): over one
process :class:`SingleProcess` (every group has one rank), else :class:`MpiCommunicator`
(``mpi4py``, the ``distributed`` extra, one MPI sub-communicator per named
group). :func:`communicator` is the one started (a single process's until one is). Each collective
is a non-blocking MPI call polled until it completes or ``timeout`` seconds pass (``MDSL_COMM_TIMEOUT``,
default 300): then E049, naming the rank, the collective and its group, goes to stderr and ``MPI_Abort``
ends every rank, so a rank that died or never arrives ends the job instead of hanging it (a rank's
own error does too: ``mdsl-run`` calls :func:`abort` after reporting it).
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from modeldsl.diagnostics import Diagnostic, DiagnosticError

GROUPS = ("world", "tp", "dp", "pp", "ep")
DEFAULT_TIMEOUT = 300.0  # seconds a collective may wait for the other ranks
ABORT_GRACE = 0.5  # seconds between a rank's last report and its MPI_Abort
RANK_VARIABLES = (  # (rank, world size, local rank) of each launcher, in the order they are looked for
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "mpi"),
    ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "mpi"),
    ("PMIX_RANK", "PMIX_SIZE", "PMIX_LOCAL_RANK", "mpi"),
    ("RANK", "WORLD_SIZE", "LOCAL_RANK", "torchrun"),
)


def layout_error(message: str, hint: str) -> DiagnosticError:
    return DiagnosticError([Diagnostic("E048", message, None, hint=hint)])


# ----------------------------------------------------------------------------- the layout


@dataclass(frozen=True)
class Layout:
    """A parallel layout: tensor-, data-, pipeline- and expert-parallel sizes, and sequence parallelism."""

    tp: int = 1
    dp: int = 1
    pp: int = 1
    ep: int = 1
    sp: bool = False

    def __post_init__(self) -> None:
        for name in ("tp", "dp", "pp", "ep"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise layout_error(f"{name}={value!r}: a parallel size is a positive integer", f"give {name}=1 or more")
        if self.dp % self.ep:
            raise layout_error(f"ep={self.ep} does not divide dp={self.dp}: the expert-parallel ranks are data-"
                               "parallel ranks", "choose ep dividing dp")
        if self.sp and self.tp == 1:
            raise layout_error("sp=true shards the sequence over the tensor-parallel ranks: it needs tp > 1",
                               "give tp=2 or more, or leave sp off")

    @property
    def world(self) -> int:
        return self.tp * self.dp * self.pp

    def coordinates(self, rank: int) -> dict[str, int]:
        """The rank's place in each dimension (``tp``, ``dp``, ``pp``, and ``ep`` within its dp group)."""
        tp, rest = rank % self.tp, rank // self.tp
        dp, pp = rest % self.dp, rest // self.dp
        return {"tp": tp, "dp": dp, "pp": pp, "ep": dp % self.ep, "world": rank}

    def group_ranks(self, group: str, rank: int) -> list[int]:
        """The ranks of ``rank``'s group ``group``, in order (the group's rank numbering)."""
        if group not in GROUPS:
            raise layout_error(f"no process group '{group}'", f"the groups are {', '.join(GROUPS)}")
        if group == "world":
            return list(range(self.world))
        mine = self.coordinates(rank)
        if group == "ep":  # the ep consecutive dp ranks around this one
            first = mine["dp"] - mine["ep"]
            return [self.rank_of(mine["tp"], first + e, mine["pp"]) for e in range(self.ep)]
        sizes = {"tp": self.tp, "dp": self.dp, "pp": self.pp}
        return [self.rank_of(**{**{k: mine[k] for k in sizes}, group: i}) for i in range(sizes[group])]

    def rank_of(self, tp: int, dp: int, pp: int) -> int:
        return (pp * self.dp + dp) * self.tp + tp

    def group_size(self, group: str) -> int:
        return len(self.group_ranks(group, 0))

    def describe(self) -> str:
        parts = [f"{name}={getattr(self, name)}" for name in ("tp", "dp", "pp", "ep") if getattr(self, name) > 1]
        return " ".join(parts + (["sp"] if self.sp else [])) or "one process"


# ----------------------------------------------------------------------------- the launcher


@dataclass(frozen=True)
class LaunchEnvironment:
    """What the launcher says of this process: its rank, the world size, its rank on the host."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    launcher: str = "none"  # "mpi", "torchrun" or "none" (one process)


def launch_environment(environ: dict[str, str] | None = None) -> LaunchEnvironment:
    """The rank and world of this process from its launcher's variables (one process without them);
    E048 for values that are no ranks."""
    env = os.environ if environ is None else environ
    for rank_name, size_name, local_name, launcher in RANK_VARIABLES:
        if rank_name in env and size_name in env:
            try:
                rank, world, local = int(env[rank_name]), int(env[size_name]), int(env.get(local_name, "0") or 0)
            except ValueError:
                raise layout_error(f"{rank_name}={env[rank_name]!r}, {size_name}={env[size_name]!r}: the launcher's "
                                   "rank and world size are no integers", "start the ranks with mpiexec or "
                                   "torchrun") from None
            if not 0 <= rank < world:
                raise layout_error(f"{rank_name}={rank} is not a rank of a world of {world}",
                                   "start the ranks with mpiexec or torchrun")
            return LaunchEnvironment(rank, world, local, launcher)
    return LaunchEnvironment()


# ----------------------------------------------------------------------------- communicators


class SingleProcess:
    """The communicator of one process: every group is this rank alone."""

    rank, world = 0, 1

    def __init__(self, layout: Layout | None = None):
        self.layout = layout or Layout()

    def run(self, kind: str, group: str, source: np.ndarray, target: np.ndarray, op: str | None = None,
            root: int | None = None) -> None:
        if source is not target:
            np.copyto(target, source.reshape(target.shape))

    def all_reduce_scalar(self, value: float, group: str = "world", op: str = "sum") -> float:
        return value

    def barrier(self) -> None:
        pass


class MpiCommunicator:
    """Collectives over MPI (mpi4py): one sub-communicator per named group of the layout."""

    def __init__(self, layout: Layout, timeout: float = DEFAULT_TIMEOUT):
        from mpi4py import MPI

        self.mpi, self.layout, self.timeout = MPI, layout, timeout
        world = MPI.COMM_WORLD
        self.rank, self.world = world.Get_rank(), world.Get_size()
        if self.world != layout.world:
            raise layout_error(f"the layout {layout.describe()} takes {layout.world} ranks; the launcher started "
                               f"{self.world}", f"start {layout.world} ranks (mpiexec -n {layout.world}), or change "
                               "the layout")
        self.groups: dict[str, Any] = {"world": world}
        for group in GROUPS[1:]:  # every rank splits every group, in the same order
            members = layout.group_ranks(group, self.rank)
            self.groups[group] = world.Split(color=members[0], key=members.index(self.rank))
        self.ops = {"sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN, "avg": MPI.SUM}

    def run(self, kind: str, group: str, source: np.ndarray, target: np.ndarray, op: str | None = None,
            root: int | None = None) -> None:
        """One collective of ``group`` from ``source`` into ``target`` (contiguous host arrays)."""
        comm = self.groups[group]
        send, receive = np.ascontiguousarray(source).reshape(-1), target.reshape(-1)
        mpi_op = self.ops.get(op or "sum")
        if kind == "all_reduce":  # in place (a gradient in its grads buffer): MPI_IN_PLACE, MPI's aliasing rule
            request = comm.Iallreduce(self.mpi.IN_PLACE if np.shares_memory(send, receive) else send, receive, mpi_op)
        elif kind == "all_gather":
            request = comm.Iallgather(send, receive)
        elif kind == "reduce_scatter":
            request = comm.Ireduce_scatter_block(send, receive, mpi_op)
        elif kind == "broadcast":
            if comm.Get_rank() == root:
                np.copyto(receive, send)
            request = comm.Ibcast(receive, root=root)
        else:
            raise ValueError(f"the CPU executor runs no '{kind}' collective yet")
        self.wait(request, kind, group)
        if op == "avg":
            receive /= comm.Get_size()

    def wait(self, request: Any, kind: str, group: str) -> None:
        """Poll ``request`` until it completes. After ``timeout`` seconds E049 goes to stderr and the
        job ends (every rank: the one that stopped may never come back to be told)."""
        deadline, pause = time.monotonic() + self.timeout, 0.0
        while not request.Test():
            if time.monotonic() > deadline:
                ranks = self.layout.group_ranks(group, self.rank)
                diagnostic = Diagnostic(
                    "E049", f"rank {self.rank}: {kind} over group '{group}' (ranks {', '.join(map(str, ranks))}) "
                    f"did not complete within {self.timeout:g} s", None,
                    hint="a rank of the group stopped or died; MDSL_COMM_TIMEOUT sets the seconds to wait")
                sys.stderr.write(diagnostic.render() + "\n")
                sys.stderr.flush()
                self.abort(1)
                raise DiagnosticError([diagnostic])
            time.sleep(pause)
            pause = min(pause * 2 or 1e-5, 1e-3)

    def all_reduce_scalar(self, value: float, group: str = "world", op: str = "sum") -> float:
        result = np.zeros(1)
        self.run("all_reduce", group, np.array([value], dtype=np.float64), result, op)
        return float(result[0])

    def barrier(self) -> None:
        self.wait(self.groups["world"].Ibarrier(), "barrier", "world")

    def abort(self, code: int = 1) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        time.sleep(ABORT_GRACE)  # the launcher forwards what this rank wrote before it ends the job
        self.groups["world"].Abort(code)


_CURRENT: list[SingleProcess | MpiCommunicator] = []


def communicator() -> SingleProcess | MpiCommunicator:
    """The process's communicator: the one :func:`start` made, else a single process's."""
    return _CURRENT[-1] if _CURRENT else SingleProcess()


def rank_in(group: str) -> int:
    """This process's rank in its group ``group`` of the started layout (0 for one process)."""
    current = communicator()
    return current.layout.coordinates(current.rank)[group]


def start(layout: Layout, environment: LaunchEnvironment | None = None,
          timeout: float | None = None) -> SingleProcess | MpiCommunicator:
    """The communicator of this process for ``layout``: a single process's where the launcher started
    one and the layout needs one, else MPI's (E048 when the world sizes differ or mpi4py is missing)."""
    if _CURRENT and _CURRENT[-1].layout == layout:
        return _CURRENT[-1]
    environment = environment or launch_environment()
    if environment.world == 1 and layout.world == 1:
        made: SingleProcess | MpiCommunicator = SingleProcess(layout)
    else:
        if environment.world != layout.world:
            raise layout_error(f"the layout {layout.describe()} takes {layout.world} ranks; the launcher started "
                               f"{environment.world}", f"start {layout.world} ranks: mpiexec -n {layout.world} ...")
        if environment.launcher == "torchrun":
            raise layout_error(f"torchrun started rank {environment.rank} of {environment.world}; the ranks on the CPU "
                               "talk over MPI, which torchrun does not start", f"launch with mpiexec -n {layout.world} "
                               "(the distributed extra installs it)")
        try:
            import mpi4py  # noqa: F401
        except ImportError:
            raise layout_error("running on several processes needs mpi4py and an MPI",
                               "pip install -e '.[distributed]' (mpi4py and MPICH's wheels)") from None
        made = MpiCommunicator(layout, timeout if timeout is not None else comm_timeout())
    _CURRENT[:] = [made]
    return made


def comm_timeout() -> float:
    """``MDSL_COMM_TIMEOUT`` seconds (default 300); E048 for what is no positive number."""
    text = os.environ.get("MDSL_COMM_TIMEOUT", "")
    if not text:
        return DEFAULT_TIMEOUT
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if value <= 0:
        raise layout_error(f"MDSL_COMM_TIMEOUT={text!r} is no positive number of seconds", "give e.g. 300")
    return value


def abort(code: int = 1) -> None:
    """End every rank of the job (after a rank's error, so the others do not wait for it)."""
    current = communicator()
    if isinstance(current, MpiCommunicator) and current.world > 1:
        current.abort(code)
