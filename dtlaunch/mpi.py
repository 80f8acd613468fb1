"""What every way of starting a job shares: the job's spec, `--iface`, versions, and the
`MpiFamily` interface that each MPI implementation's launcher fills in (dtlaunch.openmpi.family,
dtlaunch.hydra.family). Pure, but for `local_mpi`, the one place a launcher is asked what it
is."""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from dtlaunch.core.errors import DtlaunchError, UsageError

# The MPI's identity is part of this face (defined lower, where reading facts needs it).
from dtlaunch.core.mpi_kinds import HYDRA_FAMILY as HYDRA_FAMILY
from dtlaunch.core.mpi_kinds import INSTALL_OMPI_HINT as INSTALL_OMPI_HINT
from dtlaunch.core.mpi_kinds import MIN_OMPI as MIN_OMPI
from dtlaunch.core.mpi_kinds import MPI_KINDS as MPI_KINDS
from dtlaunch.core.mpi_kinds import OPEN_MPI_FAMILY as OPEN_MPI_FAMILY
from dtlaunch.core.mpi_kinds import PREFERRED_MPI as PREFERRED_MPI
from dtlaunch.core.mpi_kinds import HostNeeds as HostNeeds
from dtlaunch.core.mpi_kinds import MpiImpl as MpiImpl
from dtlaunch.core.mpi_kinds import parse_mpirun_version as parse_mpirun_version
from dtlaunch.job.env import EnvPlan
from dtlaunch.job.hosts import Host
from dtlaunch.job.iface import Interfaces as Interfaces
from dtlaunch.job.iface import parse_iface as parse_iface
from dtlaunch.reach.ssh_options import SshOptions

if TYPE_CHECKING:
    from dtlaunch.core.failure import Failure
    from dtlaunch.core.records import Event

SSH, SLURM = "ssh", "slurm"  # JobSpec.via: the ways the hosts are reached to start the job


@dataclass(frozen=True)
class JobSpec:
    hosts: tuple[Host, ...]
    num_proc: int
    program: tuple[str, ...]  # interpreter, script or -m module, and its arguments
    env: EnvPlan = field(default_factory=lambda: EnvPlan(()))
    iface: Interfaces | None = None
    ssh: SshOptions = field(default_factory=SshOptions)
    as_root: bool = False
    oversubscribe: bool = False
    tree_spawn: bool = False
    mpi_version: tuple[int, ...] = ()  # the local launcher's release; (): unknown
    mpi_args: tuple[str, ...] = ()
    # Command the launcher uses instead of plain ssh (dtlaunch's link watcher); None: plain ssh.
    rsh_agent: str | None = None
    # How the launcher reaches the hosts to start its daemons (proxies), decided once by
    # cluster.allocation: "ssh" (dtlaunch's ssh) or "slurm" (srun inside a Slurm job, no ssh).
    via: str = SSH
    # --binding-args (checked by dtlaunch.job.binding); None: dtlaunch's default binding.
    binding: tuple[str, ...] | None = None
    # "FILE: plm = VALUE" for each parameter file the launcher reads that chooses a plm other
    # than ssh's (MpiFamily.stray_launcher_files, read by the caller): the command line then
    # names ssh's, which wins over any file.
    launcher_set_in: tuple[str, ...] = ()


def split_mpi_args(text: str) -> tuple[str, ...]:
    """`--mpi-args "..."`: split like a POSIX shell would, never run by one."""
    try:
        return tuple(shlex.split(text))
    except ValueError as exc:
        raise UsageError(f"--mpi-args: cannot split {text!r}: {exc}") from None


def format_command(argv: Sequence[str], env_prefix: Sequence[tuple[str, str]] = ()) -> str:
    """A shell-quoted line that can be pasted into a shell."""
    prefix = [f"{k}={shlex.quote(v)}" for k, v in env_prefix]
    return " ".join(prefix + [shlex.quote(a) for a in argv])


class OutputDemux(Protocol):
    """Turns one of the launcher's streams back into what each rank's shim sent
    (dtlaunch.core.records: bytes in, any cut; events out)."""

    def feed(self, data: bytes) -> list[Event]: ...

    def flush(self) -> list[Event]: ...


class MpiFamily(Protocol):
    """One way to start a job (Open MPI's mpirun; Hydra's mpiexec for MPICH and Intel MPI).

    Everything is pure: the argv comes from a JobSpec, and output, failures and versions are
    read from text. Running it is run.execute's business. A family derives from this class and
    writes only what differs from the defaults here: its launcher's `--version` read by
    parse_mpirun_version, no variables, settings or files of its own, no ssh setting read from
    a file, the network dtlaunch chose given as it is, and hosts that need its MPI and Horovod
    built with MPI."""

    name: str  # "Open MPI"
    launcher: str  # the program that starts a job: "mpirun"
    install_hint: str
    # The rank shim's largest record: PIPE_BUF (one atomic write), unless the launcher tags each
    # rank's output so that its pieces can be joined exactly (see dtlaunch.agents.rank_shim).
    record_limit: int
    # True: the launcher ends the job when a rank fails and its report and exit status stand
    # (Open MPI). False: it waits for the other ranks, so dtlaunch ends the job on the failed
    # rank's exit record, the rank's status is the job's, and what the launcher reports about
    # ranks dtlaunch stopped is not the job's fault (Hydra).
    ends_job_on_rank_failure: bool
    needs: HostNeeds = HostNeeds()  # what the checks ask of every host

    def parse_version(self, text: str) -> MpiImpl:
        return parse_mpirun_version(text)

    def unsupported(self, impl: MpiImpl, program: str) -> str | None:
        """Why this launcher cannot be used, or None."""
        return None

    def build_argv(self, spec: JobSpec, launcher: str) -> tuple[str, ...]: ...

    def new_demux(self, stream: str, release: tuple[int, ...] = ()) -> OutputDemux:
        """A reader for the launcher's "stdout" or "stderr"."""

    def parse_failure(self, lines: Sequence[str], rank_hosts: Sequence[str]) -> Failure | None: ...

    def launcher_env(self, spec: JobSpec) -> dict[str, str]:
        """Variables the launcher's own environment needs for this job (beyond the plan's)."""
        return {}

    def launcher_defaults(self, spec: JobSpec) -> dict[str, str]:
        """Variables the launcher needs for this job unless its environment already sets them
        (the user's value wins; they are not shown with the command)."""
        return {}

    def stray_launcher_env(self, spec: JobSpec, env: Mapping[str, str]) -> tuple[str, ...]:
        """Names in the launcher's planned environment that would defeat this job's way of
        starting (a single-machine plm chosen for a job across hosts): left out of it."""
        return ()

    def stray_launcher_files(self, launcher: str) -> tuple[str, ...]:
        """"FILE: NAME = VALUE" for each parameter file that `launcher` reads by default and
        that chooses a plm other than ssh's (reads files: called at the edge)."""
        return ()

    def overrides_launcher_files(self, spec: JobSpec) -> bool:
        """The command line names ssh's plm over `spec.launcher_set_in`'s choice."""
        return False

    def refuse_insecure(self, extra_args: Sequence[str], environ: Mapping[str, str]) -> None:
        """Raise UsageError when the user's extra launcher arguments or the launcher's
        environment make its ssh accept any host key."""
        return None

    def ssh_left_to_dtlaunch(self, extra_args: Sequence[str], environ: Mapping[str, str]) -> bool:
        """False when the user's extra launcher arguments or the launcher's environment may
        change how ssh is run."""

    def refuse_insecure_files(self, launcher: str, extra_args: Sequence[str],
                              environ: Mapping[str, str]) -> None:
        """Raise UsageError when a file `launcher` will read (by default, or named by the
        extra arguments or the environment) makes its ssh accept any host key, or is one the
        launcher cannot use (reads files: called at the edge)."""
        return None

    def support_files(self, spec: JobSpec) -> tuple[tuple[str, str], ...]:
        """Files (path, text) the launcher needs written before it starts (mode 0700)."""
        return ()

    def ssh_setting_files(self, launcher: str) -> list[str]:
        """`file: setting` for each setting that changes how `launcher` runs ssh in a file it
        reads by default (the one method here that reads files)."""
        return []

    def job_iface(self, chosen: Interfaces, common_name: str | None) -> Interfaces | None:
        """What the launcher is given for the network dtlaunch chose (`common_name`: that
        network's interface name where every host calls it the same)."""
        return chosen


def local_mpi(family: MpiFamily, program: str, refuse: bool = True) -> MpiImpl:
    """Ask the local launcher what it is; refuse one that this family cannot drive."""
    import subprocess

    from dtlaunch.core.version_cache import version_output

    try:
        _, out = version_output([program, "--version"], timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise DtlaunchError(f"cannot run {program} --version: {exc}") from None
    impl = family.parse_version(out)
    why = family.unsupported(impl, program) if refuse else None
    if why is not None:
        raise UsageError(f"{why}; {family.install_hint}")
    return impl
