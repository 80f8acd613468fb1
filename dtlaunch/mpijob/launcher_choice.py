"""The MPI job kind: the MPI first on PATH starts every rank (Open MPI's mpirun, Hydra's
mpiexec for MPICH and Intel MPI, each given dtlaunch's ssh wrapper), its daemons over
dtlaunch's ssh or, inside a Slurm allocation, through srun. The plan's launch argv is what
runs; the family reads its output and failures."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from dtlaunch import agents
from dtlaunch.core.errors import DtlaunchError
from dtlaunch.jobkind import JobContext, JobKind, StartedJob
from dtlaunch.mpi import (
    HYDRA_FAMILY,
    MPI_KINDS,
    OPEN_MPI_FAMILY,
    PREFERRED_MPI,
    MpiFamily,
    MpiImpl,
    local_mpi,
)
from dtlaunch.openmpi.family import OPEN_MPI

if TYPE_CHECKING:
    from dtlaunch.hydra.family import Hydra  # imported only for an MPICH or Intel MPI job


def launcher_family(environ: Mapping[str, str] | None = None,
                    ) -> tuple[MpiFamily, str | None, MpiImpl | None]:
    """The MPI this job will start with: `mpirun` (or else `mpiexec`) first on PATH, asked
    for its version. Open MPI runs through its mpirun, MPICH and Intel MPI through Hydra's
    mpiexec (from the same directory). None found: Open MPI's family, no program."""
    env = dict(os.environ) if environ is None else environ
    path = env.get("PATH", os.defpath)
    program = shutil.which("mpirun", path=path) or shutil.which("mpiexec", path=path)
    if program is None:
        return OPEN_MPI, None, None
    impl = local_mpi(OPEN_MPI, program, refuse=False)
    # An MPI no family starts gets the preferred MPI's family, which refuses it with its
    # install hint.
    family = FAMILIES[impl.family or MPI_KINDS[PREFERRED_MPI].family](env, impl.name)
    own = os.path.join(os.path.dirname(program), family.launcher)  # Hydra's mpiexec
    return family, own if os.access(own, os.X_OK) else program, impl


def family_to_check(environ: Mapping[str, str] | None = None) -> MpiFamily:
    """The family whose rules a command line is checked against on a machine that may not run
    the job (`dtlaunch submit`): the local launcher's, else Open MPI's."""
    try:
        family, _, _ = launcher_family(environ)
    except DtlaunchError:  # the local launcher cannot tell what it is
        return OPEN_MPI
    return family


def job_launcher(environ: Mapping[str, str] | None = None) -> str:
    """The launcher doctor asks every host about, as the job will start it: Hydra's mpiexec
    beside a Hydra mpirun, else the PATH's mpirun; absolute, links kept. Intel MPI's mpirun is
    a script that looks for mpiexec.hydra on PATH, which a remote login's PATH lacks."""
    try:
        _, program, _ = launcher_family(environ)
    except DtlaunchError:  # its --version failed: doctor reports that host by host
        env = os.environ if environ is None else environ
        program = shutil.which("mpirun", path=env.get("PATH", os.defpath))
    return os.path.abspath(program) if program else ""


def hydra_family(environ: Mapping[str, str], name: str = "MPICH") -> Hydra:
    """Hydra (for MPICH or Intel MPI) with dtlaunch's ssh agent in the user's cache directory."""
    from dtlaunch.hydra.family import Hydra

    home = environ.get("HOME") or os.path.expanduser("~")
    base = environ.get("XDG_CACHE_HOME") or os.path.join(home, ".cache")
    wrapper = agents.ship("rsh.py").file
    if not wrapper.endswith(".py") or any(c.isspace() for c in sys.executable):
        return Hydra(name=name)  # a shebang cannot carry whitespace: plain ssh
    return Hydra(os.path.join(base, "dtlaunch", "bin"), sys.executable, wrapper, name)


# The one registry of families: a classified MPI's family (mpi.MPI_KINDS) -> its object.
FAMILIES: dict[str, Callable[[Mapping[str, str], str], MpiFamily]] = {
    OPEN_MPI_FAMILY: lambda environ, name: OPEN_MPI,
    HYDRA_FAMILY: hydra_family,
}


def rsh_agent_command() -> str | None:
    """dtlaunch's ssh wrapper, which reports a lost host (Open MPI splits this on spaces).

    It runs once per host, so it starts as a bare file with -I -S (no site, no environment):
    it needs only the standard library, and this saves ~30 ms of CPU per host."""
    from dtlaunch.reach.ssh_options import rsh_safe

    wrapper = agents.ship("rsh.py").file
    # The agent's command reaches each daemon's command line (and a remote shell) too.
    if not wrapper.endswith(".py") or not (rsh_safe(sys.executable) and rsh_safe(wrapper)):
        return None
    return f"{sys.executable} -I -S {wrapper}"


class MpiJobKind(JobKind):
    name = "mpi"

    def family(self, environ: Mapping[str, str]) -> tuple[MpiFamily, str | None, MpiImpl | None]:
        return launcher_family(environ)

    def start(self, context: JobContext) -> StartedJob:
        plan = context.plan
        return StartedJob((context.program or plan.family.launcher, *plan.launch_argv[1:]),
                          plan.launcher_env, plan.family)


MPI_JOB = MpiJobKind()
