"""``--backend ddp``: the Horovod calls the example makes, over torch.distributed.

The ranks come from torchrun's worker environment (``init_process_group`` with env://:
``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``; ``LOCAL_RANK`` picks the GPU), so
the example runs under ``torchrun`` and ``dtlaunch run --torch`` alike. Training wraps the model
in ``DistributedDataParallel``, which AVERAGES the gradients during the backward pass; the
rest (the corpus from rank 0, metric sums, the checkpoint's gathered LSTM state, the start's
broadcast of rank 0's weights) goes through this class, which answers to the names of
``horovod.torch`` so that train.py and checkpoint.py serve both backends unchanged.

Which device a rank trains on (``--device``, for both backends) and where torchrun placed it
are pure functions here (the callers pass what torch and the environment say), so the choice is
tested without GPUs.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist

from .comm import unchanged

# init_process_group waits this long for every rank (env:// rendezvous) and each collective
# this long for the others, then fails instead of hanging.
TIMEOUT = datetime.timedelta(minutes=10)


class SetupError(Exception):
    """A device or launcher problem the user must fix; the message is one line and says how."""


# What torchrun (and ``dtlaunch run --torch``) gives every worker, and init_process_group's
# env:// rendezvous reads.
TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                      "MASTER_PORT")


def torchrun_placement(environ: Mapping[str, str]) -> tuple[int, int, int, int]:
    """(rank, world size, local rank, local world size) from torchrun's worker environment."""
    missing = [name for name in TORCHRUN_VARIABLES if not environ.get(name)]
    if missing:
        raise SetupError(
            f"--backend ddp: {', '.join(missing)} not set; start the ranks with torchrun "
            "(torchrun --nproc-per-node N -m dtlaunch.examples.ptb_lm --backend ddp ...) or "
            "dtlaunch run --torch")
    values = []
    for name in TORCHRUN_VARIABLES[:4]:
        try:
            values.append(int(environ[name]))
        except ValueError:
            raise SetupError(f"--backend ddp: {name}={environ[name]!r} is not a number") from None
    rank, size, local_rank, local_size = values
    if not (0 <= rank < size and 0 <= local_rank < local_size <= size):
        raise SetupError(f"--backend ddp: inconsistent placement RANK={rank} WORLD_SIZE={size} "
                         f"LOCAL_RANK={local_rank} LOCAL_WORLD_SIZE={local_size}")
    return rank, size, local_rank, local_size


def choose_device(requested: str, cuda_available: bool, gpu_count: int, local_rank: int,
                  local_size: int) -> str:
    """``cpu`` or ``cuda:<local rank>``: one GPU per local rank. ``auto`` is ``cuda`` when CUDA
    is available, else ``cpu``. Too few GPUs for the ranks of this host is an error rather
    than two ranks sharing a GPU (or some ranks silently on the CPU, training at another
    speed and, under NCCL, hanging the others)."""
    if requested == "cpu":
        return "cpu"
    if requested not in ("auto", "cuda"):
        raise SetupError(f"--device {requested}: choose auto, cpu or cuda")
    if not cuda_available or gpu_count < 1:
        if requested == "auto":
            return "cpu"
        raise SetupError("--device cuda: this PyTorch sees no CUDA GPU (a CPU-only build, no "
                         "driver, or CUDA_VISIBLE_DEVICES empty); use --device cpu")
    if local_size > gpu_count:
        raise SetupError(
            f"--device {requested}: {local_size} ranks on this host but {gpu_count} GPU(s) "
            "visible (one GPU per local rank); start at most "
            f"{gpu_count} rank(s) per host or use --device cpu")
    return f"cuda:{local_rank}"


def ddp_backend(device: str) -> str:
    """The process group's backend: Gloo on CPU; on GPUs NCCL for CUDA tensors and Gloo for
    the few CPU ones (metrics sums, the corpus, checkpoint bookkeeping)."""
    return "cpu:gloo,cuda:nccl" if device.startswith("cuda") else "gloo"


class TorchDistributed:
    """A torch.distributed process group behind the few ``horovod.torch`` calls used."""

    Sum = "sum"
    label = "ddp"
    averages_gradients = True  # DDP divides the summed gradients by the world size
    DistributedOptimizer = unchanged  # DDP reduces the gradients in backward()

    def __init__(self, device: str, local_rank: int, local_size: int) -> None:
        self.device, self._local_rank, self._local_size = device, local_rank, local_size

    def init(self) -> None:
        if self.device.startswith("cuda"):
            torch.cuda.set_device(torch.device(self.device))
        dist.init_process_group(backend=ddp_backend(self.device), init_method="env://",
                                timeout=TIMEOUT)

    def shutdown(self, finished: bool) -> None:
        if dist.is_initialized():
            if finished:
                # Every rank reaches the end before any closes its connections: a rank still
                # busy (writing its metrics) when a peer's Gloo pairs close can abort in Gloo.
                dist.barrier()
            dist.destroy_process_group()

    def rank(self) -> int:
        return dist.get_rank()

    def size(self) -> int:
        return dist.get_world_size()

    def local_rank(self) -> int:
        return self._local_rank

    def local_size(self) -> int:
        return self._local_size

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """The model as DDP trains it (parameters broadcast from rank 0 here too)."""
        from torch.nn.parallel import DistributedDataParallel

        ids = [torch.device(self.device).index] if self.device.startswith("cuda") else None
        return DistributedDataParallel(model, device_ids=ids)

    def broadcast_parameters(self, params: dict[str, torch.Tensor], root_rank: int) -> None:
        for tensor in params.values():  # state_dict tensors share the parameters' storage
            dist.broadcast(tensor, src=root_rank)

    def broadcast_optimizer_state(self, optimizer: torch.optim.Optimizer, root_rank: int) -> None:
        state = self.broadcast_object(optimizer.state_dict(), root_rank=root_rank)
        if self.rank() != root_rank:
            optimizer.load_state_dict(state)

    def broadcast_object(self, obj: Any, root_rank: int = 0, name: Any = None) -> Any:
        box = [obj]
        dist.broadcast_object_list(box, src=root_rank)
        return box[0]

    def broadcast_(self, tensor: torch.Tensor, root_rank: int, name: Any = None) -> torch.Tensor:
        dist.broadcast(tensor, src=root_rank)
        return tensor

    def allreduce(self, tensor: torch.Tensor, op: Any = None, name: Any = None) -> torch.Tensor:
        """The SUM over the ranks (the only reduction the example asks for), as a new tensor."""
        if op is not None and op != self.Sum:
            raise ValueError(f"allreduce: only Sum is supported, not {op!r}")
        total = tensor.clone()
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
        return total

    def allgather(self, tensor: torch.Tensor, name: Any = None) -> torch.Tensor:
        """The ranks' tensors concatenated along dim 0 in rank order, as Horovod's allgather;
        their first dimensions may differ (unequal shares of streams)."""
        rows = torch.tensor([tensor.shape[0]], dtype=torch.int64, device=tensor.device)
        counts = [torch.zeros_like(rows) for _ in range(self.size())]
        dist.all_gather(counts, rows)
        sizes = [int(c) for c in counts]
        padded = tensor.new_zeros((max(sizes), *tensor.shape[1:]))
        padded[: tensor.shape[0]] = tensor
        parts = [torch.empty_like(padded) for _ in sizes]
        dist.all_gather(parts, padded.contiguous())
        return torch.cat([part[:n] for part, n in zip(parts, sizes)])
