"""The MPI job kind: the MPI first on PATH starts every rank (Open MPI's mpirun, Hydra's
mpiexec), its daemons over dtlaunch's ssh or, inside a Slurm allocation, through srun. The
plan's launch argv is what runs; the family reads its output and failures."""

from __future__ import annotations

from collections.abc import Mapping

from dtlaunch.jobkind import JobContext, Say, StartedJob
from dtlaunch.mpi import MpiFamily, MpiImpl
from dtlaunch.mpijob.launcher_choice import launcher_family
from dtlaunch.plan.plan import RunRequest


class MpiJobKind:
    name = "mpi"

    def family(self, environ: Mapping[str, str]) -> tuple[MpiFamily, str | None, MpiImpl | None]:
        return launcher_family(environ)

    def first_request(self, request: RunRequest, say: Say) -> RunRequest:
        return request

    def start(self, context: JobContext) -> StartedJob:
        plan = context.plan
        return StartedJob((context.program or plan.family.launcher, *plan.launch_argv[1:]),
                          plan.launcher_env, plan.family)


MPI_JOB = MpiJobKind()
