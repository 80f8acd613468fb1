"""How hosts are reached for checks: the Prober seam (prober.py) and its implementations, over
SSH (ssh_prober.py) or through srun inside a Slurm allocation (srun_prober.py).

`reach_for` is the one place a request's `via` (ssh or slurm) becomes a way to reach the hosts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dtlaunch.probe.prober import Reach
    from dtlaunch.reach.ssh_options import SshOptions


def reach_for(via: str, ssh: SshOptions) -> Reach:
    """How the checks reach the hosts for a job started `via` ssh or slurm: through srun inside
    a Slurm allocation (its nodes may not be reachable over SSH at all), else over SSH with
    `ssh`."""
    if via == "slurm":
        from dtlaunch.probe.srun_prober import srun_reach

        return srun_reach()
    from dtlaunch.probe.ssh_prober import ssh_reach

    return ssh_reach(ssh)
