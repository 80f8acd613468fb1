"""Running inside a scheduler's allocation: where the hosts come from and how they are reached.

Pure: `plan_allocation` takes the detected allocation (dtlaunch.cluster.allocation.detect reads the
environment and the files it names) and the user's request, and returns the request to plan
plus one line saying where the hosts came from.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from dtlaunch.cluster.allocation import SLURM, Allocation, check_hosts_in_allocation
from dtlaunch.core.errors import UsageError
from dtlaunch.plan.plan import RunRequest

VIAS = ("auto", "ssh", "slurm")  # --launcher's choices: how the hosts are reached


@dataclass(frozen=True)
class Placement:
    request: RunRequest  # hosts, -np and how they are reached (via) resolved
    source: str  # where the hosts came from, for --dry-run and --verbose
    allocation: Allocation | None


def choose_via(choice: str, alloc: Allocation | None) -> str:
    """auto: slurm inside a Slurm job, else ssh."""
    if choice not in VIAS:
        raise UsageError(f"--launcher: expected one of {', '.join(VIAS)}, got {choice!r}")
    in_slurm = alloc is not None and alloc.scheduler == SLURM
    if choice == "slurm" and not in_slurm:
        where = f"inside a {alloc.scheduler} job" if alloc is not None else "outside any Slurm job"
        raise UsageError(f"--launcher slurm: this runs {where} (no SLURM_JOB_ID); run it under "
                         "salloc or sbatch, or use --launcher ssh")
    if choice == "auto":
        return "slurm" if in_slurm else "ssh"
    return choice


def plan_allocation(request: RunRequest, alloc: Allocation | None, choice: str) -> Placement:
    """Hosts and -np from the allocation when none were given; given ones must be in it."""
    via = choose_via(choice, alloc)
    if alloc is None:
        source = "hosts from --hosts/--hostfile" if request.hosts else "hosts: this machine"
        return Placement(dataclasses.replace(request, via=via), source, None)
    if request.hosts:
        check_hosts_in_allocation(request.hosts, alloc)
        resolved = dataclasses.replace(request, via=via)
        source = (f"hosts from --hosts/--hostfile, inside {alloc.scheduler} job {alloc.job_id}"
                  .rstrip())
    else:
        num_proc = request.num_proc
        if num_proc is None and all(h.slots_given for h in alloc.hosts):
            num_proc = alloc.total_tasks  # else all slots, which the GPUs may still decide
        resolved = dataclasses.replace(request, hosts=alloc.hosts, num_proc=num_proc,
                                       via=via)
        source = alloc.describe()
    # Said as the option that sets it: --launcher.
    return Placement(resolved, f"{source}; launcher {via}", alloc)
