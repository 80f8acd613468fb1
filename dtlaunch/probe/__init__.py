"""How hosts are reached for checks: the Prober seam (prober.py) and its implementations, over
SSH (ssh_prober.py) or through srun inside a Slurm allocation (srun_prober.py).

`reach_for` is the one place a request's `via` (ssh or slurm) becomes a way to reach the hosts.
"""

from __future__ import annotations

import shutil
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dtlaunch.check.facts import HostFacts
    from dtlaunch.core.tracker import Tracker
    from dtlaunch.probe.command import ProbeArgs
    from dtlaunch.probe.prober import Prober, Reach
    from dtlaunch.reach.ssh_options import SshOptions


def reach_for(via: str, ssh: SshOptions) -> Reach:
    """How the checks reach the hosts for a job started `via` ssh or slurm: through srun inside
    a Slurm allocation (its nodes may not be reachable over SSH at all), else over SSH with
    `ssh`; this machine through a local shell either way."""
    from dtlaunch.probe.prober import Reach

    if via == "slurm":
        srun = shutil.which("srun") or "srun"
        return Reach(prober=lambda: _over_srun(srun), here=_probe_here)
    return Reach(prober=lambda: _over_ssh(ssh), here=_probe_here)


# Each prober is imported when a host is reached (a run on a cached pre-flight may reach none).
def _over_srun(srun: str) -> Prober:
    from dtlaunch.probe.srun_prober import SrunProber

    return SrunProber(srun)


def _over_ssh(ssh: SshOptions) -> Prober:
    from dtlaunch.probe.ssh_prober import SshProber

    return SshProber(ssh)


def _probe_here(args: ProbeArgs, timeout: float, tracker: Tracker) -> HostFacts:
    """This machine's probe (dtlaunch.probe.command), imported only when a check runs: a
    run whose pre-flight is a cache hit never needs it."""
    from dtlaunch.probe.command import probe_local

    return probe_local(args, timeout, tracker)
