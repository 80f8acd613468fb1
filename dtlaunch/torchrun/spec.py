"""What a torch.distributed job (`dtlaunch run --torch`) is asked for: its options, read
strictly. Pure."""

from __future__ import annotations

import re
from dataclasses import dataclass

from dtlaunch.core.errors import UsageError

GPU = "gpu"  # --nproc-per-node gpu: one worker per GPU the pre-flight finds on each host
# An option name as torch.distributed.launch appended it (--local_rank, --local-rank).
_OPTION = re.compile(r"-{1,2}[A-Za-z][A-Za-z0-9_-]*")


@dataclass(frozen=True)
class TorchSpec:
    nproc_per_node: int | str | None = None  # workers on every host; GPU; None: the host's slots
    local_rank_arg: str | None = None  # appended as OPTION=<local rank> to each worker's argv
    master_port: int | None = None  # None: a port host 0's system gives its agent


def parse_nproc_per_node(text: str | None) -> int | str | None:
    if text is None:
        return None
    if text.strip().lower() == GPU:
        return GPU
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= 4096:
        raise UsageError(f"--nproc-per-node: expected a number from 1 to 4096 or 'gpu', got "
                         f"{text!r}")
    return int(text)


def parse_local_rank_arg(text: str | None) -> str | None:
    if text is None:
        return None
    if not _OPTION.fullmatch(text):
        raise UsageError(f"--local-rank-arg: expected an option name such as --local-rank or "
                         f"--local_rank, got {text!r}")
    return text


def parse_master_port(port: int | None) -> int | None:
    if port is not None and not 1 <= port <= 65535:
        raise UsageError(f"--master-port: expected a port from 1 to 65535, got {port}")
    return port
