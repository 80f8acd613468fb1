"""Horovod when importable, else a size-1 stand-in so the example runs as one plain process."""

from __future__ import annotations

import contextlib
import os
from collections.abc import MutableMapping
from typing import Any

import torch


def unchanged(self: Any, value: Any, *args: Any, **kwargs: Any) -> Any:
    return value


class SingleProcess:
    """The few ``horovod.torch`` calls the example uses, for a world of one process: every
    collective, and the optimizer's wrapper, hands back what it was given."""

    Sum = "sum"
    label = "single process"
    broadcast_parameters = broadcast_optimizer_state = broadcast_object = unchanged
    broadcast_ = allreduce = allgather = DistributedOptimizer = unchanged

    def init(self) -> None:
        pass

    def rank(self) -> int:
        return 0

    def size(self) -> int:
        return 1

    local_rank, local_size = rank, size


COMM_NICE = 19

# What the example asks of the MPIs and Horovod, each only where the environment has no value:
# a launcher's setting (mpirun -x, mpiexec -genv) or the user's wins.
DEFAULTS = {
    # Horovod's background thread waits inside MPI, and the MPIs busy-poll while waiting unless
    # told otherwise. On CPU training the compute threads fill every core, so polling steals
    # their time; yielding costs microseconds. Measured on 2 cores, 2 ranks x 1 thread:
    # 3,060 -> 4,488 words/s (MPICH 5.0.2) and 2,923 -> 4,077 (Intel MPI 2021.18), before the
    # threads were lowered to nice 19; since, within the noise (see the README).
    "OMPI_MCA_mpi_yield_when_idle": "1",
    "MPIR_CVAR_CH4_PROGRESS_THROTTLE": "1",
    "I_MPI_WAIT_MODE": "1",
    # The sparse embedding gradient is gathered (MPI_Allgatherv, about 0.6 MB per rank at batch
    # 20). MPICH gathers anything from 32 KB up with its pipelined ring: 2.5-4 ms for 2 ranks
    # on one machine, against 1.3 ms under Open MPI and Intel MPI. With the pipeline from 4 MB
    # up, MPICH takes 1.3 ms as well (bench/ptb_exchange.py).
    "MPIR_CVAR_ALLGATHERV_PIPELINE_MSG_SIZE": str(4 << 20),
    # The model has a dozen gradient tensors, one of them 8 MB: copying them through a fusion
    # buffer costs more CPU time than the few extra small allreduces it saves.
    "HOROVOD_FUSION_THRESHOLD": "0",
}

_lowered: list[int] = []  # the threads get_comm lowered, for the start report


def get_comm(nice: int = COMM_NICE, comm: Any = None) -> Any:
    """``comm`` initialised; by default ``horovod.torch``, or the single-process stand-in where
    Horovod is not installed. The threads that the init starts (Horovod's background loop, the
    MPI library's; Gloo's and NCCL's under ``--backend ddp``) run at ``nice``."""
    if comm is None:
        apply_defaults(os.environ)
        try:
            import horovod.torch as hvd
        except ImportError:
            comm = SingleProcess()
        else:
            comm = hvd
    before = thread_ids()
    comm.init()
    # On CPU training the ranks' compute threads fill every core. Horovod's background thread
    # wakes every cycle (1 ms) for a rendezvous with the other ranks and spins in MPI while it
    # waits, taking its core from a compute thread. At nice 19 it runs when the compute
    # threads leave the core (the wait for the gradients sleeps), so the exchange no longer
    # slows the step it overlaps; with idle cores a nice value changes nothing. Measured on 2
    # cores, 2 ranks x 1 thread under MPICH: 3,406 -> 4,870 words/s.
    _lowered[:] = lower_priority(thread_ids() - before, nice)
    return comm


def allreduce_sum(comm: Any, values: list[float]) -> list[float]:
    """The sums over the ranks, in float64 (loss sums and token counts)."""
    total = comm.allreduce(torch.tensor(values, dtype=torch.float64), op=comm.Sum)
    return [float(v) for v in total]


def apply_defaults(environ: MutableMapping[str, str]) -> None:
    """Set each of ``DEFAULTS`` that ``environ`` lacks (before ``hvd.init()``: the MPIs read
    them at MPI_Init)."""
    for name, value in DEFAULTS.items():
        environ.setdefault(name, value)


def thread_ids() -> set[int]:
    """This process's threads (Linux; empty elsewhere)."""
    try:
        return {int(t) for t in os.listdir("/proc/self/task")}
    except OSError:
        return set()


def lower_priority(threads: set[int], nice: int) -> list[int]:
    """Set each thread's nice value to ``nice`` (0 leaves them); the threads it could set."""
    if nice <= 0:
        return []
    done = []
    for tid in sorted(threads):
        try:
            os.setpriority(os.PRIO_PROCESS, tid, nice)
        except OSError:
            continue  # gone already, or not ours to change
        done.append(tid)
    return done


def communication_nice() -> list[int]:
    """The nice values the lowered threads still alive have now."""
    values = set()
    for tid in _lowered:
        with contextlib.suppress(OSError):  # gone already
            values.add(os.getpriority(os.PRIO_PROCESS, tid))
    return sorted(values)
