"""`dtlaunch doctor`'s parsed options to a DoctorRequest and the way its hosts are reached.

The CLI (the only module with click) hands over plain values; the only I/O here is reading a
`--hostfile`, asking the environment for a Slurm allocation and the local launcher's path.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from dtlaunch.check.host_checks import Expectations
from dtlaunch.cluster.allocation import detect, plan_allocation
from dtlaunch.console.hostfile import HostArgs
from dtlaunch.core.errors import UsageError
from dtlaunch.doctor.doctor import COMMAND_TIMEOUT, DoctorRequest
from dtlaunch.mpi import HostNeeds, parse_iface
from dtlaunch.mpijob.launcher_choice import job_launcher
from dtlaunch.plan.plan import RunRequest, check_module_name
from dtlaunch.probe import reach_for
from dtlaunch.probe.prober import Reach


@dataclass(frozen=True)
class DoctorArgs(HostArgs):
    """What `dtlaunch doctor` was asked, as the CLI read it."""

    timeout: float | None = None
    module: str | None = None
    pairwise: bool = False
    script: str | None = None
    kinds: tuple[str, ...] = ()  # the job kinds whose doctor flag was given (--gloo, --torch)


@dataclass(frozen=True)
class DoctorSetup:
    request: DoctorRequest
    reach: Reach  # over SSH, or through srun inside a Slurm job
    source: str  # where the hosts came from ("" when given with -H or --hostfile)


def kind_needs(kinds: Sequence[str]) -> HostNeeds:
    """What the hosts need for the job kind whose doctor flag was given (at most one): its
    family's needs; an MPI job's without one."""
    from dtlaunch.jobkind import kind_named, kind_options

    if len(kinds) > 1:
        flags = [doctor.names[0] for name in kinds
                 if (doctor := kind_options()[name].doctor) is not None]
        raise UsageError(f"doctor: {' and '.join(flags)} check for different kinds of job: "
                         "give one")
    if not kinds:
        return HostNeeds()
    family, _, _ = kind_named(kinds[0]).family(os.environ)
    return family.needs


def read_doctor(args: DoctorArgs) -> DoctorSetup:
    ssh = args.ssh_options()
    # Inside a Slurm job with no -H: exactly the allocated nodes, through srun.
    placement = plan_allocation(RunRequest(hosts=args.read_hosts(),
                                           python=sys.executable, via=args.via),
                                detect(dict(os.environ)), args.via)
    host_names = tuple(h.name for h in placement.request.hosts)
    needs = kind_needs(args.kinds)
    if args.script is not None and args.module is not None:
        raise UsageError("doctor: give either SCRIPT or -m MODULE, not both")
    if args.module is not None:
        check_module_name(args.module)
    iface = parse_iface(args.iface) if args.iface is not None else None
    request = DoctorRequest(
        hosts=host_names,
        expect=Expectations(python=args.python or sys.executable, module=args.module,
                            script=os.path.abspath(args.script) if args.script else None,
                            iface=iface, pairwise=args.pairwise, needs=needs),
        ssh=ssh,
        cwd=os.getcwd(),
        command_timeout=args.timeout if args.timeout is not None else COMMAND_TIMEOUT,
        mpi_launcher=job_launcher() if needs.mpi else "",
        job_path=os.environ.get("PATH", ""),  # what run exports to the ranks
    )
    return DoctorSetup(request, reach_for(placement.request.via, ssh),
                       placement.source if placement.allocation is not None else "")
