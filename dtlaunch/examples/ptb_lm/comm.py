"""Horovod when importable, else a size-1 stand-in so the example runs as one plain process."""

from __future__ import annotations

import os
from typing import Any


class SingleProcess:
    """The few ``horovod.torch`` calls the example uses, for a world of one process."""

    Sum = "sum"

    def init(self) -> None:
        pass

    def rank(self) -> int:
        return 0

    def size(self) -> int:
        return 1

    def local_rank(self) -> int:
        return 0

    def local_size(self) -> int:
        return 1

    def broadcast_parameters(self, params: Any, root_rank: int) -> None:
        pass

    def broadcast_optimizer_state(self, optimizer: Any, root_rank: int) -> None:
        pass

    def broadcast_object(self, obj: Any, root_rank: int = 0, name: Any = None) -> Any:
        return obj

    def broadcast_(self, tensor: Any, root_rank: int, name: Any = None) -> Any:
        return tensor

    def allreduce(self, tensor: Any, op: Any = None, name: Any = None) -> Any:
        return tensor

    def allgather(self, tensor: Any, name: Any = None) -> Any:
        return tensor

    def DistributedOptimizer(self, optimizer: Any, named_parameters: Any = None) -> Any:
        return optimizer


def get_comm() -> Any:
    """``horovod.torch`` (initialised) or the single-process stand-in."""
    # Horovod's background thread waits inside MPI, and Open MPI busy-polls while waiting
    # unless told to yield. On CPU training the compute threads fill every core, so polling
    # steals their time; yielding costs microseconds. A value set by the launcher (mpirun
    # -mca mpi_yield_when_idle ...) arrives in this variable and wins.
    os.environ.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")
    # MPICH and Intel MPI poll as well, unless told otherwise. Measured on 2 cores, 2 ranks x
    # 1 thread: 3,060 -> 4,488 words/s (MPICH 5.0.2) and 2,923 -> 4,077 (Intel MPI 2021.18).
    os.environ.setdefault("MPIR_CVAR_CH4_PROGRESS_THROTTLE", "1")
    os.environ.setdefault("I_MPI_WAIT_MODE", "1")
    # The model has a dozen gradient tensors, one of them 8 MB: copying them through a fusion
    # buffer costs more CPU time than the few extra small allreduces it saves.
    os.environ.setdefault("HOROVOD_FUSION_THRESHOLD", "0")
    try:
        import horovod.torch as hvd
    except ImportError:
        comm: Any = SingleProcess()
    else:
        comm = hvd
    comm.init()
    return comm
