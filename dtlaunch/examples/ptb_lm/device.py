"""``--device`` and ``--backend``: which device a rank trains on, and how torchrun's ranks find
their place. Pure functions (the callers pass what torch and the environment say), so the
choice is tested without GPUs."""

from __future__ import annotations

from collections.abc import Mapping


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
