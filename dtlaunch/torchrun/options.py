"""`--torch`'s options: declared by the console in their own section of `dtlaunch run --help`,
read here strictly into the request (`refine`). Light: the CLI imports this module to declare
them."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from dtlaunch.core.errors import UsageError
from dtlaunch.jobkind import KindOption, KindOptions

if TYPE_CHECKING:
    from dtlaunch.plan.plan import RunRequest

SELECT = "--torch"
GPU = "gpu"  # --nproc-per-node gpu: one worker per GPU the pre-flight finds on each host
# An option name as torch.distributed.launch appended it (--local_rank, --local-rank).
_OPTION = r"-{1,2}[A-Za-z][A-Za-z0-9_-]*"  # compiled by its option (re's cache)


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
    if text is not None and not re.fullmatch(_OPTION, text):
        raise UsageError(f"--local-rank-arg: expected an option name such as --local-rank or "
                         f"--local_rank, got {text!r}")
    return text


def parse_master_port(port: int | None) -> int | None:
    if port is not None and not 1 <= port <= 65535:
        raise UsageError(f"--master-port: expected a port from 1 to 65535, got {port}")
    return port


def refine(request: RunRequest, values: Mapping[str, Any]) -> RunRequest:
    """`--torch`: torch.distributed with torchrun's contract; its own options go with it only."""
    from dtlaunch.job.hosts import Host

    given = [option.names[0] for option in OPTIONS.run[1:]
             if values.get(option.param) is not None]
    if not values.get("torch"):
        if given:
            raise UsageError(f"{given[0]} goes with {SELECT}")
        return request
    if request.controller == "gloo" or request.elastic is not None:
        raise UsageError(f"{SELECT} runs torch.distributed, not Horovod: drop --gloo and the "
                         "elastic options (--min-np, --max-np, --host-discovery-script)")
    spec = TorchSpec(parse_nproc_per_node(values.get("nproc_per_node")),
                     parse_local_rank_arg(values.get("local_rank_arg")),
                     parse_master_port(values.get("master_port")))
    hosts, n = request.hosts, spec.nproc_per_node
    if n is not None:  # every host takes exactly n; gpu: slots the pre-flight fills from its GPUs
        hosts = tuple(Host(h.name, n if isinstance(n, int) else 1, slots_given=n != GPU)
                      for h in hosts or (Host("localhost", 1),))
    return replace(request, controller="torch", spec=spec, hosts=hosts)


OPTIONS = KindOptions(
    section="torch.distributed (--torch, no Horovod; docs/torch.md)",
    run=(
        KindOption((SELECT,), "torch", type=None,
                   help="Run a torch.distributed script with torchrun's worker environment "
                        "(RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, ...; docs/torch.md)."),
        KindOption(("--nproc-per-node", "--nproc_per_node"), "nproc_per_node", metavar="N|gpu",
                   help="With --torch: workers on every host (gpu: one per GPU the pre-flight "
                        "finds)."),
        KindOption(("--local-rank-arg",), "local_rank_arg", metavar="OPTION",
                   help="With --torch: append OPTION=<local rank> to the script's arguments "
                        "(torch.distributed.launch's --local-rank)."),
        KindOption(("--master-port", "--master_port"), "master_port", type=int, metavar="PORT",
                   help="With --torch: the port host 0 holds for the job's store (default: any "
                        "free one)."),
    ),
    doctor=KindOption((SELECT,), "torch", type=None,
                      help="Check for a --torch job: no MPI or Horovod checks; the same PyTorch "
                           "everywhere."),
    refine=refine,
)
