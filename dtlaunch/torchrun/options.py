"""`--torch`'s options: declared by the console in their own section of `dtlaunch run --help`,
read here into the request (`refine`). Light: the CLI imports this module to declare them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from dtlaunch.jobkind import KindOption, KindOptions

if TYPE_CHECKING:
    from dtlaunch.plan.plan import RunRequest

SELECT = "--torch"


def refine(request: RunRequest, values: Mapping[str, Any]) -> RunRequest:
    """`--torch`: torch.distributed with torchrun's contract; its own options go with it only."""
    from dtlaunch.core.errors import UsageError
    from dtlaunch.job.hosts import Host
    from dtlaunch.torchrun.spec import (
        TorchSpec,
        parse_local_rank_arg,
        parse_master_port,
        parse_nproc_per_node,
    )

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
    hosts = request.hosts
    if isinstance(spec.nproc_per_node, int):  # every host takes exactly that many
        hosts = tuple(Host(h.name, spec.nproc_per_node) for h in hosts) or \
            (Host("localhost", spec.nproc_per_node),)
    elif spec.nproc_per_node is not None:  # gpu: slots the pre-flight fills from each host's GPUs
        hosts = tuple(Host(h.name, 1, slots_given=False) for h in hosts) or \
            (Host("localhost", 1, slots_given=False),)
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
